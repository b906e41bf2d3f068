#!/bin/sh
# bench cost's kernel rows (run in the VM by `bench cost --vm` / `bench report` through vmtest).
# Under QEMU TCG every figure is emulated time: only ratios between rows of the same guest mean
# anything. One point, __x64_sys_getppid+5 (`push rbx; call ...`, past the ftrace NOP), hit by
# `sysbench` (getppid() in a loop, ns per call, median of three runs):
#   unpatched; jmp splice calling an empty handler; trap splice calling it (run by the module's
#   dispatcher); a kprobe from kprobe_events with its trace event on (int3; jump optimisation off),
#   once with tracing_on=1 (a ring-buffer write per hit) and once with tracing_on=0 (the kprobe and
#   its event handler, which finds the buffer off and writes nothing: the nearest to trapvec's
#   empty handler a kprobe_events probe gets); the same kprobe jump-optimised (the kernel's own
#   jmp-based probe, tracing on), when the kernel allows it.
# Output: `BENCH-VM-ROW KEY NS` lines, `BENCH-VM-NOTE TEXT` for what could not be measured.
set -eu

calls=${BENCH_CALLS:-20000}
point=__x64_sys_getppid+5
tracing=/sys/kernel/tracing

ns_per_call() {
	for _ in 1 2 3; do sysbench -n "$calls"; done | sort -n | sed -n 2p
}

row() {
	echo "BENCH-VM-ROW $1 $2"
}

trapctl load /components/empty.o > /dev/null
row unpatched "$(ns_per_call)"

trapctl splice "$point" --call empty_handler --mechanism jmp > /dev/null
row jmp_rel32 "$(ns_per_call)"
trapctl unsplice "$point"

trapctl splice "$point" --call empty_handler > /dev/null
row trap "$(ns_per_call)"
trapctl unsplice "$point"

opt=/proc/sys/debug/kprobes-optimization
[ -w "$opt" ] && echo 0 > "$opt"
echo "p:trapvec_bench/getppid $point" > $tracing/kprobe_events
echo 1 > $tracing/events/trapvec_bench/enable
echo 1 > $tracing/tracing_on
row kprobe "$(ns_per_call)"
echo 0 > $tracing/tracing_on
row kprobe_quiet "$(ns_per_call)"
echo 1 > $tracing/tracing_on
if [ -w "$opt" ]; then
	echo 1 > "$opt"
	sleep 1
	if grep -q 'getppid.*OPTIMIZED' /sys/kernel/debug/kprobes/list 2> /dev/null; then
		row kprobe_optimized "$(ns_per_call)"
	else
		echo "BENCH-VM-NOTE the kprobe at $point was not jump-optimised"
	fi
else
	echo "BENCH-VM-NOTE no $opt: kprobe jump optimisation cannot be switched"
fi
echo 0 > $tracing/events/trapvec_bench/enable
echo > $tracing/kprobe_events
