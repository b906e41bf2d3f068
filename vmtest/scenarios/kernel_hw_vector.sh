#!/bin/sh
# The trap vector delivered as a hardware interrupt in kernel mode (issue 24 item 7):
# tv_selfipi.ko (vmtest/kmods/selfipi) sends three self-IPIs of vector 0xf5 through the local
# APIC from its init, each taken in its own text when it turns interrupts back on. Nothing put a
# trap before the interrupted ip, so trapvec must chain each to the recorded old gate (the
# kernel's spurious entry, which acknowledges it and counts it: "SPU" in /proc/interrupts and a
# "Spurious interrupt (vector 0xf5) ... Acked" line), never send the CPU back to ip - 2. Then
# a trap splice still counts every call, and both CPUs still take interrupts (an IPI left in
# service would mask them: the sleeps below would never end).
# Files (vmtest --file): tv_selfipi.ko; optionally another trapvec.ko to test instead of the
# packed one (tv_hw_vector.module=NAME on the kernel command line: the test's way to show what
# the old dispatcher did).
# Prints KEY=value lines that vmtest/tests/kernel_hw_vector.rs checks; vmtest fails the run on
# any oops, BUG or WARNING.
set -u
. /lib/scenario.sh

module=$(sed -n 's/.*tv_hw_vector\.module=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi
traps() { awk -v k="$1" '$1 == k { print $2 }' /sys/module/trapvec/parameters/traps 2>/dev/null; }
# The spurious interrupts of every CPU (one column each).
spu() { awk '$1 == "SPU:" { s = 0; for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i; print s }' /proc/interrupts; }
acked() { dmesg | grep -c 'Spurious interrupt (vector 0xf5) on CPU#[0-9]*\. Acked'; }

echo "CPUS=$(grep -c ^processor /proc/cpuinfo)"
echo "GATE=$(dmesg | grep 'trapvec: vector 0xf5: gate' | tail -n 1 | sed 's/^\[[^]]*\] //')"
unknown0=$(traps unknown)
retried0=$(traps retried)
spu0=$(spu)
acked0=$(acked)

insmod /files/tv_selfipi.ko count=3 && echo "SELFIPI=yes" || echo "SELFIPI=no"
echo "SELFIPI_LINE=$(dmesg | grep 'tv_selfipi: sent' | tail -n 1 | sed 's/^\[[^]]*\] //')"
echo "UNKNOWN_DELTA=$(( $(traps unknown) - unknown0 ))"
echo "RETRIED_DELTA=$(( $(traps retried) - retried0 ))"
echo "SPU_DELTA=$(( $(spu) - spu0 ))"
echo "ACKED_DELTA=$(( $(acked) - acked0 ))"
rmmod tv_selfipi

# Both CPUs still take timer interrupts: a sleep on each ends.
for cpu in 0 1; do
	taskset -c "$cpu" sleep 0.2 && echo "SLEPT_ON_$cpu=yes"
done

# The trap path still works: a count splice on getppid sees every call.
trapctl load /components/empty.o > /dev/null || exit 11
site=$(past_entry __x64_sys_getppid 0)
trapctl splice "$site" --call empty_handler > /dev/null || exit 12
sysbench -n 1000 getppid > /dev/null || exit 13
echo "GETPPID_HITS=$(trapctl list | awk -v s="$site" '$1 == s { print $(NF-1) }')"
trapctl unsplice --all > /dev/null && echo "UNSPLICED=yes"
echo "UNKNOWN_END=$(( $(traps unknown) - unknown0 ))"
echo "HW_VECTOR_DONE"
