#!/bin/sh
# Prove trapvec.ko in a VM running the real Debian kernel: builds the static test program,
# then lets vmtest build the module, boot the kernel under QEMU and run scenario.sh (the
# suite with a splice left live, rmmod, insmod, the after-reload checks, a clean dmesg).
# Exit status: the scenario's (0 = passed). Extra arguments go to `vmtest run`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cc -static -O2 -Wall -Wextra -Werror -I "$repo/kmod" -o "$out/trapvec_test" "$here/trapvec_test.c"
cd "$repo"
cargo run --quiet --release -p vmtest -- run --scenario "$here/scenario.sh" \
	--file "$out/trapvec_test" "$@"
