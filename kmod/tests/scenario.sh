#!/bin/sh
# The kmod VM scenario: runs as root inside the guest, with /trapvec.ko, the C test program
# at /files/trapvec_test and, optionally, the Rust test at /files/kernel_target (vmtest's
# layout). See run.sh.
set -u
test_prog=/files/trapvec_test
state=/tmp/trapvec_state

grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10
# Module text to patch (the test skips that part when the module is missing).
modprobe sch_netem 2>/dev/null || echo "kmod scenario: no sch_netem, module text untested"
"$test_prog" --leave-live "$state" || exit 11
# Unload with a splice live: the module must revert it and restore the gate...
rmmod trapvec || exit 12
dmesg | grep 'trapvec: reverted' | tail -n 1
# ...so that it loads again (it refuses a vector whose gate is not the spurious entry).
insmod /trapvec.ko || exit 13
"$test_prog" --after-reload "$state" || exit 14
# trapvec::kernel::KernelTarget against the real module (when run.sh built it).
if [ -x /files/kernel_target ]; then
	/files/kernel_target --test-threads=1 || exit 17
fi
rmmod trapvec || exit 15
if dmesg | grep -E 'WARNING:|BUG:|Oops|\[#[0-9]+\]|Spurious interrupt'; then
	echo "kmod scenario: the kernel log has a warning"
	exit 16
fi
echo "kmod scenario: passed"
