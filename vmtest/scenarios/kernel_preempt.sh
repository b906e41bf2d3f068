#!/bin/sh
# Full preemption: apply/remove cycles of trap and jmp splices at __x64_sys_getppid+5 (+9 on 6.12), where the
# 2-byte trap and the 5-byte jmp both cover `push rbx` (1 byte) and part of the call after it,
# while both CPUs call getppid() in a loop. Boot with preempt=full (or let the scenario switch
# the model at run time) and QEMU's -singlestep, so that an interrupt, and a preemption, can
# land between `push rbx` and the call. Knobs on the kernel command line (vmtest --append):
#   trapvec_preempt.cycles=N       apply/remove cycles (default 2000)
#   trapvec_preempt.switch=1       write `full` to /sys/kernel/debug/sched/preempt first
#   trapvec_preempt.int3_first=0   reload the module with the int3-first protocol off (a test
#                                  knob: shows what the protocol prevents)
#   trapvec_preempt.exact=0        skip the exact-count phase after the stress
# Every trapctl command reads /proc/kallsyms, which takes a minute under -singlestep: the
# scenario makes as few as it can.
# Prints KEY=value lines that vmtest/tests/kernel_preempt.rs checks; vmtest fails the run on
# any oops, BUG or WARNING.
set -eu
. /lib/scenario.sh

knob() { sed -n "s/.*trapvec_preempt\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
cycles=$(knob cycles)
cycles=${cycles:-2000}
T=/sys/kernel/tracing
D=/sys/kernel/debug

[ "$(knob switch)" = 1 ] && echo full > $D/sched/preempt
# The model in force is the one in parentheses.
echo "PREEMPT_MODEL=$(sed -n 's/.*(\([a-z]*\)).*/\1/p' $D/sched/preempt)"
if [ "$(knob int3_first)" = 0 ]; then
	rmmod trapvec
	insmod /trapvec.ko int3_first=0
fi
echo "INT3_FIRST=$(cat /sys/module/trapvec/parameters/int3_first)"

# Every getppid() the kernel runs, counted at the function's entry by an ftrace-based kprobe
# (outside the window; tracing off, only its hit counter matters).
echo 0 > $T/tracing_on
echo 'p:tvpre/ppid __x64_sys_getppid' >> $T/kprobe_events
echo 1 > $T/events/tvpre/ppid/enable
kprobe_hits() { awk '$1 == "ppid" { print $2 }' $T/kprobe_profile; }

point=$(past_entry __x64_sys_getppid 0)
trapctl read __x64_sys_getppid > /tmp/before.hex
trapctl load /components/empty.o

# --- The stress: callers on both CPUs, cycles alternating trap and jmp.
k0=$(kprobe_hits)
rm -f /tmp/stop
# At the lowest priority: trapctl and the stop_machine() threads preempt them wherever they are.
ppidloop -t 2 -l -f /tmp/stop > /tmp/loop.out &
loop=$!
start=$(date +%s)
trapctl cycle "$point" --call empty_handler --mechanism both --times "$cycles" | tee /tmp/cycle.out
end=$(date +%s)
touch /tmp/stop
wait "$loop" && echo "LOOP_OK=yes" || echo "LOOP_OK=no"
k1=$(kprobe_hits)
echo "CYCLES_DONE=$(sed -n 's/^\([0-9]*\) cycles.*/\1/p' /tmp/cycle.out)"
echo "CYCLE_SECONDS=$((end - start))"
echo "SPLICE_HITS=$(sed -n 's/.*; \([0-9]*\) hits;.*/\1/p' /tmp/cycle.out)"
echo "LOOP_$(cat /tmp/loop.out)"
echo "KPROBE_CALLS=$((k1 - k0))"
trapctl read __x64_sys_getppid > /tmp/after.hex
cmp -s /tmp/before.hex /tmp/after.hex && echo "RESTORED=yes" || echo "RESTORED=no"

# --- Exact counts: a live splice of each mechanism (applied int3-first), 3000 calls on each CPU.
# A splice starts at 0 hits and unsplice reports them; the kprobe counts the same interval.
if [ "$(knob exact)" != 0 ]; then
	for m in trap jmp; do
		k0=$(kprobe_hits)
		trapctl splice "$point" --call empty_handler --mechanism $m
		ppidloop -t 2 -n 3000 > /tmp/exact.out
		trapctl unsplice "$point" | tee /tmp/unsplice.out
		k1=$(kprobe_hits)
		echo "EXACT_$m=$(sed -n 's/.*: \([0-9]*\) hits.*/\1/p' /tmp/unsplice.out) $((k1 - k0)) $(cat /tmp/exact.out)"
	done
	trapctl read __x64_sys_getppid > /tmp/after.hex
	cmp -s /tmp/before.hex /tmp/after.hex && echo "EXACT_RESTORED=yes" || echo "EXACT_RESTORED=no"
fi
echo 0 > $T/events/tvpre/ppid/enable
echo '-:tvpre/ppid' >> $T/kprobe_events
