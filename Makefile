# trapvec top-level targets. `make test` is what CI runs (.ci/run).

CARGO ?= cargo

.PHONY: test deps build demo deb

## Everything CI checks: dependencies, the release build, rustfmt, clippy with warnings as errors
## (the workspace's lints in Cargo.toml, clippy.toml), the documentation's links and length
## (.ci/check-docs), then every test: the workspace's,
## then the packages' (packaging/test-packages: build, dkms build, lintian, install, remove).
test: build
	$(CARGO) fmt --all --check
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings
	.ci/check-docs
	$(CARGO) test --release --workspace --no-fail-fast
	packaging/test-packages

## Install missing system packages (QEMU, the Debian cloud kernels 6.1 and 6.12 with their headers,
## busybox-static, ...).
deps:
	.ci/install-deps --kernel 6.12

## Release build of the whole workspace (the VM tests boot the release trapctl).
build: deps
	$(CARGO) build --release --workspace

## The kernel demo (docs/kernel.md, "Kernel demo"): boot the Debian kernel under QEMU with trapvec.ko,
## count tcp_sync_mss, hot-swap the MSS policy with mss_clamp.o, tune it live, remove it. Installs
## only what the demo needs (.ci/install-deps --demo).
demo:
	.ci/install-deps --demo
	$(CARGO) build --release -p vmtest
	$(CARGO) run --release -q -p vmtest -- run --scenario vmtest/scenarios/demo.sh

## The Debian packages trapvec-dkms and trapvec-tools in target/deb/ (docs/deployment.md).
deb:
	packaging/build-deb
