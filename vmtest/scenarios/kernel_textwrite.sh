#!/bin/sh
# Text writes under NMI (issue 24 item 1): tv_nmi_victim.ko (vmtest/kmods/nmi_victim) sends
# chains of NMIs between the two CPUs that cross stop_machine(), each NMI calling tv_victim(),
# while trapctl applies and removes a trap and a jmp splice on tv_victim() (a window of one
# 10-byte instruction each) again and again. The splice's handler (components/tv_nmi_mark.c)
# marks each call it sees, so the module counts exactly the calls a splice ran in.
# Files (vmtest --file): tv_nmi_victim.ko; optionally another trapvec.ko to test instead of the
# packed one (the test's way to show what the old writer did).
# Knobs on the kernel command line (vmtest --append):
#   tv_textwrite.cycles=N      apply/remove cycles (default 200)
#   tv_textwrite.module=NAME   rmmod trapvec, insmod /files/NAME first
# Prints KEY=value lines that vmtest/tests/kernel_textwrite.rs checks; vmtest fails the run on
# any oops, BUG or WARNING.
set -eu

knob() { sed -n "s/.*tv_textwrite\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
cycles=$(knob cycles)
cycles=${cycles:-200}
module=$(knob module)
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module"
fi
redirects() { cat /sys/module/trapvec/parameters/int3_redirects 2>/dev/null || echo 0; }

echo "CPUS=$(grep -c ^processor /proc/cpuinfo)"
insmod /files/tv_nmi_victim.ko
P=/sys/module/tv_nmi_victim/parameters
trapctl load /components/tv_nmi_mark.o
trapctl read tv_victim > /tmp/before.hex

r0=$(redirects)
echo 1 > $P/run
# NMIs flow before the first write.
sleep 1
start=$(date +%s)
trapctl cycle tv_victim --call tv_nmi_mark --mechanism both --times "$cycles" | tee /tmp/cycle.out
end=$(date +%s)
echo 0 > $P/run
# Let the last chain end.
sleep 1
echo "CYCLES_DONE=$(sed -n 's/^\([0-9]*\) cycles.*/\1/p' /tmp/cycle.out)"
echo "CYCLE_SECONDS=$((end - start))"
echo "SPLICE_HITS=$(sed -n 's/.*; \([0-9]*\) hits;.*/\1/p' /tmp/cycle.out)"
for c in nmis calls wrong marks spliced chains; do
	echo "VICTIM_$c=$(cat $P/$c)"
done
echo "REDIRECTS=$(( $(redirects) - r0 ))"
trapctl read tv_victim > /tmp/after.hex
cmp -s /tmp/before.hex /tmp/after.hex && echo "RESTORED=yes" || echo "RESTORED=no"
# Any NMI the kernel could not place, any interrupt it found spurious (the gate's line names
# the handler it replaced, spurious_entries_start: not a complaint).
dmesg | grep -iE 'unknown reason|dazed and confused|spurious' | grep -v spurious_entries_start > /tmp/complaints || true
echo "NMI_COMPLAINTS=$(wc -l < /tmp/complaints)"
head -5 /tmp/complaints
# Under TCG an NMI handler that meets an int3 can take more than a millisecond of emulated
# time: the kernel says so, which is not a failure.
echo "NMI_SLOW=$(dmesg | grep -c 'took too long to run' || true)"
rmmod tv_nmi_victim
echo "TEXTWRITE_DONE"
