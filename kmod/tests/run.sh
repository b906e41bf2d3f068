#!/bin/sh
# Prove trapvec.ko in a VM running the real Debian kernel: builds the static C test program
# and the static trapvec::kernel test (trapvec/tests/kernel_target.rs), then lets vmtest build
# the module, boot the kernel under QEMU and run scenario.sh (the C suite with a splice left
# live, rmmod, insmod, the after-reload checks, the Rust KernelTarget tests, a clean dmesg).
# Exit status: the scenario's (0 = passed). Extra arguments go to `vmtest run`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cc -static -O2 -Wall -Wextra -Werror -I "$repo/kmod" -o "$out/trapvec_test" "$here"/*.c

cd "$repo"
# A static test binary runs in the busybox guest as it is (glibc, crt-static).
target=x86_64-unknown-linux-gnu
exe=$(RUSTFLAGS="-C target-feature=+crt-static" cargo test --quiet --release -p trapvec \
	--test kernel_target --no-run --target $target --message-format=json |
	sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
[ -x "$exe" ] || { echo "run.sh: building the kernel_target test failed" >&2; exit 1; }
cp "$exe" "$out/kernel_target"

cargo run --quiet --release -p vmtest -- run --scenario "$here/scenario.sh" \
	--file "$out/trapvec_test" --file "$out/kernel_target" "$@"
