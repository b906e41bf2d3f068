#!/bin/sh
# The kernel benchmark, in one guest. Under QEMU TCG every figure is emulated time: only ratios
# between mechanisms measured in the same guest mean anything.
#
#  1. Hit cost, on one point, the first instruction past __x64_sys_getppid's entry (+5 on 6.1,
#     +9 on 6.12: `push rbx; call ...`), timed by `sysbench`
#     (getppid() in a loop, ns per call; the fastest of three runs in each of three rounds that
#     go over every configuration in turn): nothing spliced; a trap splice that only counts (a
#     dispatch entry without a handler); a trap splice calling an empty
#     handler (run by the dispatcher, like a kprobe pre-handler); a jmp splice calling the same
#     handler through a register-saving trampoline; a kprobe from kprobe_events (int3, jump
#     optimization off) with its trace event enabled and tracing off (its handler runs, the ring
#     buffer takes no record). The hit cost is the time per call minus the unspliced time.
#  1a. Predicates (issue 12): the same count by trap and empty call by jmp, with a predicate
#     no task matches (--tgid 999999): what every other task pays for a splice made for one
#     (the dispatcher's test and the replay; the jmp guard's test and the replay).
#  1b. Return points (issue 12), on the same function: a trap return point that only counts
#     returns, a timer (wall clock), and a kretprobe from kprobe_events with its trace event
#     enabled and tracing off, each timed the same way in rounds of their own (with their own
#     unspliced time); the cost per call is the entry and the return together.
#  2. Batch: 1000 trap splices applied by one `trapctl apply` next to 1000 kprobes defined and
#     enabled through kprobe_events, on the same 1000 points (functions spread over the kernel
#     text that both accept).
#
#   cargo run --release -p vmtest -- run --scenario vmtest/scenarios/bench.sh
#
# Output: BENCH_* lines (KEY=value ...).
set -eu
. /lib/scenario.sh

calls=${BENCH_CALLS:-100000}
rounds=${BENCH_ROUNDS:-3}
point=$(past_entry __x64_sys_getppid 0)
tracing=/sys/kernel/tracing

# Fastest of three sysbench runs: interference from the host only ever adds time.
best() {
	for _ in 1 2 3; do sysbench -n "$calls"; done | sort -n | head -n 1
}

now_ms() {
	awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime
}

# One measurement of configuration $1, in ns per call.
measure() {
	case $1 in
	base) best ;;
	trap_count)
		trapctl splice "$point" --count > /dev/null
		best
		trapctl unsplice "$point" > /dev/null
		;;
	trap_empty)
		trapctl splice "$point" --call empty_handler > /dev/null
		best
		trapctl unsplice "$point" > /dev/null
		;;
	jmp_empty)
		trapctl splice "$point" --call empty_handler --mechanism jmp > /dev/null
		best
		trapctl unsplice "$point" > /dev/null
		;;
	trap_skip)
		trapctl splice "$point" --count --tgid 999999 > /dev/null
		best
		trapctl unsplice "$point" > /dev/null
		;;
	jmp_skip)
		trapctl splice "$point" --call empty_handler --mechanism jmp --tgid 999999 > /dev/null
		best
		trapctl unsplice "$point" > /dev/null
		;;
	ret_count)
		trapctl splice __x64_sys_getppid --return --count > /dev/null
		best
		trapctl unsplice __x64_sys_getppid > /dev/null
		;;
	ret_time)
		trapctl apply /tmp/timer.toml > /dev/null
		best
		trapctl unsplice __x64_sys_getppid > /dev/null
		;;
	kretprobe)
		echo "r:tvbench/getppid_ret __x64_sys_getppid" >> $tracing/kprobe_events
		echo 1 > $tracing/events/tvbench/enable
		best
		echo 0 > $tracing/events/tvbench/enable
		echo "-:tvbench/getppid_ret" >> $tracing/kprobe_events
		;;
	kprobe)
		# Defined only for its own measurement: trapvec.ko refuses to splice a window on
		# which a kprobe is registered, even a disabled one.
		echo "p:tvbench/getppid $point" >> $tracing/kprobe_events
		echo 1 > $tracing/events/tvbench/enable
		best
		echo 0 > $tracing/events/tvbench/enable
		grep getppid /sys/kernel/debug/kprobes/list >&2 || true
		echo "-:tvbench/getppid" >> $tracing/kprobe_events
		;;
	esac
}

trapctl load /components/empty.o > /dev/null
echo 0 > /proc/sys/debug/kprobes-optimization
echo 0 > $tracing/tracing_on

# Rounds over every configuration in turn, so that a slow phase of the host hits them all; the
# figure of a configuration is its fastest round.
fastest_rounds BENCH_ROUND "base trap_count trap_empty jmp_empty kprobe trap_skip jmp_skip"
echo > $tracing/kprobe_events
base=$min_base
trap_count=$min_trap_count
trap_empty=$min_trap_empty
jmp_empty=$min_jmp_empty
kprobe=$min_kprobe
echo "BENCH_BASE_NS=$base"
echo "BENCH_TRAP_COUNT_NS=$trap_count"
echo "BENCH_TRAP_EMPTY_NS=$trap_empty"
echo "BENCH_JMP_EMPTY_NS=$jmp_empty"
echo "BENCH_KPROBE_NS=$kprobe"
echo "BENCH_TRAP_SKIP_NS=$min_trap_skip"
echo "BENCH_JMP_SKIP_NS=$min_jmp_skip"
awk -v b="$base" -v c="$trap_count" -v j="$jmp_empty" -v ts="$min_trap_skip" -v js="$min_jmp_skip" 'BEGIN {
	printf "BENCH_SKIP_HIT_NS trap_skip=%d jmp_skip=%d\n", ts - b, js - b
	printf "BENCH_RATIO_TRAP_SKIP_TO_TRAP_COUNT=%.2f\n", (ts - b) / (c - b)
}'

awk -v b="$base" -v c="$trap_count" -v t="$trap_empty" -v j="$jmp_empty" -v k="$kprobe" 'BEGIN {
	printf "BENCH_HIT_NS trap_count=%d trap_empty=%d jmp_empty=%d kprobe=%d\n", c - b, t - b, j - b, k - b
	printf "BENCH_RATIO_TRAP_TO_KPROBE=%.2f (target <= 0.8)\n", (t - b) / (k - b)
	printf "BENCH_RATIO_TRAP_COUNT_TO_KPROBE=%.2f\n", (c - b) / (k - b)
	printf "BENCH_RATIO_JMP_TO_KPROBE=%.2f\n", (j - b) / (k - b)
}'

# 1b. Return points beside a kretprobe.
printf '[[splice]]\nat = "__x64_sys_getppid"\naction = "time"\nclock = "wall"\n' > /tmp/timer.toml
fastest_rounds BENCH_RET_ROUND "base ret_count ret_time kretprobe"
echo > $tracing/kprobe_events
echo "BENCH_RET_BASE_NS=$min_base"
echo "BENCH_RET_COUNT_NS=$min_ret_count"
echo "BENCH_RET_TIME_NS=$min_ret_time"
echo "BENCH_KRETPROBE_NS=$min_kretprobe"
awk -v b="$min_base" -v c="$min_ret_count" -v t="$min_ret_time" -v k="$min_kretprobe" 'BEGIN {
	printf "BENCH_RET_HIT_NS ret_count=%d ret_time=%d kretprobe=%d\n", c - b, t - b, k - b
	printf "BENCH_RATIO_RET_COUNT_TO_KRETPROBE=%.2f\n", (c - b) / (k - b)
	printf "BENCH_RATIO_RET_TIME_TO_KRETPROBE=%.2f\n", (t - b) / (k - b)
}'

# Batch. Candidates: every n-th core kernel function (about 2500), planned by trapctl; of those
# it accepts, the first 1000 that kprobes accept too. 6.12's call padding symbols (__pfx_f, one
# per function) are no functions.
awk '$2 ~ /^[tT]$/ && NF == 3 && $3 !~ /^__pfx_/ { print $3 }' /proc/kallsyms > /tmp/funcs
step=$(( $(wc -l < /tmp/funcs) / 2500 + 1 ))
awk -v s="$step" 'NR % s == 0 { printf "[[splice]]\nat = \"%s\"\naction = \"call\"\nhandler = \"empty_handler\"\n", $1 }' \
	/tmp/funcs > /tmp/candidates.toml
trapctl apply --check /tmp/candidates.toml > /tmp/check.out 2> /dev/null || true
echo "BENCH_CANDIDATES=$(grep -c '^at = ' /tmp/candidates.toml) planned=$(grep -c '^ok ' /tmp/check.out)"
: > /tmp/points
n=0
# `ok NAME at 0xSITE by trap: ...`
while read -r _ok name _at site _rest; do
	[ "$n" -lt 1000 ] || break
	if echo "p:tvcheck/k $site" > $tracing/kprobe_events 2> /dev/null; then
		echo "$name $site" >> /tmp/points
		n=$((n + 1))
	fi
	echo > $tracing/kprobe_events
done < /tmp/check.out
echo "BENCH_BATCH_POINTS=$n"

awk '{ printf "[[splice]]\nat = \"%s\"\naction = \"call\"\nhandler = \"empty_handler\"\n", $1 }' /tmp/points > /tmp/batch.toml
t0=$(now_ms)
trapctl apply --timings /tmp/batch.toml > /dev/null 2> /tmp/timings.out
t1=$(now_ms)
cat /tmp/timings.out
commit_ms=$(sed -n 's/.*commit \([0-9.]*\) ms.*/\1/p' /tmp/timings.out)
plan_ms=$(sed -n 's/.*plan \([0-9.]*\) ms.*/\1/p' /tmp/timings.out)
build_ms=$(sed -n 's/.*build \([0-9.]*\) ms.*/\1/p' /tmp/timings.out)
trapctl_ms=$((t1 - t0))
echo "BENCH_BATCH_TRAPVEC_MS commit=$commit_ms plan=$plan_ms build=$build_ms trapctl_total=$trapctl_ms"
trapctl unsplice --all > /dev/null

awk '{ printf "p:tvbatch/k%d %s\n", NR, $2 }' /tmp/points > /tmp/kprobes.txt
t0=$(now_ms)
while read -r line; do echo "$line" >> $tracing/kprobe_events; done < /tmp/kprobes.txt
t1=$(now_ms)
echo 1 > $tracing/events/tvbatch/enable
t2=$(now_ms)
define_ms=$((t1 - t0))
enable_ms=$((t2 - t1))
echo "BENCH_BATCH_KPROBES_MS define=$define_ms enable=$enable_ms total=$((t2 - t0))"
echo 0 > $tracing/events/tvbatch/enable
echo > $tracing/kprobe_events
echo 1 > /proc/sys/debug/kprobes-optimization
echo 1 > $tracing/tracing_on

awk -v c="$commit_ms" -v p="$plan_ms" -v b="$build_ms" -v w="$trapctl_ms" -v d="$define_ms" -v e="$enable_ms" 'BEGIN {
	printf "BENCH_RATIO_KPROBES_ENABLE_TO_BATCH_COMMIT=%.1f (target >= 10)\n", e / c
	printf "BENCH_RATIO_KPROBES_TOTAL_TO_BATCH_APPLY=%.1f (define+enable / plan+build+commit)\n", (d + e) / (p + b + c)
	printf "BENCH_RATIO_KPROBES_TOTAL_TO_TRAPCTL=%.1f (define+enable / the whole trapctl command)\n", (d + e) / w
}'
