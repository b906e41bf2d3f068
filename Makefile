# trapvec top-level targets. `make test` is what CI runs (.ci/run).

CARGO ?= cargo

.PHONY: test deps build

## Everything CI checks: dependencies, the release build, then every test.
test: build
	$(CARGO) test --release --workspace

## Install missing system packages (QEMU, the Debian cloud kernel and headers, busybox-static, ...).
deps:
	.ci/install-deps

## Release build of the whole workspace (the VM tests boot the release trapctl).
build: deps
	$(CARGO) build --release --workspace
