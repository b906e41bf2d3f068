# trapvec top-level targets. `make test` is what CI runs (.ci/run).

CARGO ?= cargo

.PHONY: test deps build demo deb

## Everything CI checks: dependencies, the release build, then every test: the workspace's,
## then the packages' (packaging/test-packages: build, dkms build, lintian, install, remove).
test: build
	$(CARGO) test --release --workspace
	packaging/test-packages

## Install missing system packages (QEMU, the Debian cloud kernel and headers, busybox-static, ...).
deps:
	.ci/install-deps

## Release build of the whole workspace (the VM tests boot the release trapctl).
build: deps
	$(CARGO) build --release --workspace

## The kernel demo (README.md, "Kernel demo"): boot the Debian kernel under QEMU with trapvec.ko,
## count tcp_sync_mss, hot-swap the MSS policy with mss_clamp.o, tune it live, remove it.
demo: deps
	$(CARGO) build --release -p vmtest
	$(CARGO) run --release -q -p vmtest -- run --scenario vmtest/scenarios/demo.sh

## The Debian packages trapvec-dkms and trapvec-tools in target/deb/ (README.md, "Packaging").
deb:
	packaging/build-deb
