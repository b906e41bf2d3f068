#!/bin/sh
# Batches of trap and jmp splices on functions that the tick and its softirqs run all the time
# (issue 24). Each apply and revert of a window over two instructions leaves our CC there for an
# RCU-tasks grace period (ARM) while CPUs keep running the sites from interrupts, and FINISH's
# stop_machine() then waits for both CPUs with interrupts still on (PREPARE), where a tick's
# softirq meets the CC: the die notifier must send every such CPU on. A jmp rel8 onto a
# springboard that the same batch writes in the padding before the function is the case that
# stalled 6.12 guests: sent to the springboard before FINISH had written it, a CPU slid through
# the padding into the function and met the same CC again, for ever. Files (vmtest --file):
# optionally another trapvec.ko to test instead of the packed one (tv_hot_int3.module=NAME on
# the kernel command line). Prints KEY=value lines that vmtest/tests/kernel_hot_int3.rs checks.
set -u

. /lib/scenario.sh

module=$(sed -n 's/.*tv_hot_int3\.module=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi

rounds=${HOT_ROUNDS:-6}
redirects() {
	cat /sys/module/trapvec/parameters/int3_redirects
}

# Hot functions of the tick and its softirqs, by the names either kernel has, each at the first
# instruction past its entry.
: > /tmp/points
for f in sched_balance_softirq run_rebalance_domains run_timer_softirq rcu_core \
	update_process_times sched_tick scheduler_tick __run_timers tick_sched_timer \
	account_process_tick; do
	[ -n "$(addr "$f")" ] && past_entry "$f" 0 >> /tmp/points
done
# And in functions every interrupt or tick runs, the first block a jmp reaches only by a
# springboard (one shorter than a jmp rel32 before a branch target or the function's end), so a
# batch writes springboards while CPUs run their sites (6.12's entries above all take jmp rel32).
for f in irq_exit_rcu ktime_get_update_offsets_now task_tick_fair __irq_exit_rcu; do
	[ -n "$(addr "$f")" ] || continue
	trapctl points --blocks "$f" 2> /dev/null | awk '$4 == "springboard" { print $1; exit }' >> /tmp/points
done
# `spec MECHANISM`: count splices on every point the planner takes for MECHANISM.
spec() {
	awk -v m="$1" '{ printf "[[splice]]\nat = \"%s\"\naction = \"count\"\nmechanism = \"%s\"\n", $1, m }' \
		/tmp/points > /tmp/cand.toml
	trapctl apply --check /tmp/cand.toml > /tmp/check.out 2>&1 || true
	awk '$1 == "ok" { print $2 }' /tmp/check.out > /tmp/ok_$1
	awk -v m="$1" '{ printf "[[splice]]\nat = \"%s\"\naction = \"count\"\nmechanism = \"%s\"\n", $1, m }' \
		/tmp/ok_$1 > /tmp/hot_$1.toml
	echo "HOT_POINTS_$(echo "$1" | tr a-z A-Z)=$(wc -l < /tmp/ok_$1) $(tr '\n' ' ' < /tmp/ok_$1)"
}
spec trap
spec jmp

before=$(redirects)
rel8=0
r=1
while [ "$r" -le "$rounds" ]; do
	for m in trap jmp; do
		[ -s /tmp/ok_$m ] || continue
		trapctl apply /tmp/hot_$m.toml > /tmp/apply.out 2>&1 ||
			{ echo "HOT_APPLY_FAILED round=$r mechanism=$m: $(cat /tmp/apply.out)"; exit 11; }
		if [ "$m" = jmp ] && [ "$r" = 1 ]; then
			# A jmp rel8 (EB) goes by a springboard.
			while read -r p; do
				b=$(trapctl read "$p" 2 | awk '{ print $2 $3 }')
				echo "HOT_JMP $p: $b"
				case $b in eb*) rel8=$((rel8 + 1)) ;; esac
			done < /tmp/ok_jmp
		fi
		trapctl unsplice --all > /tmp/unsplice.out 2>&1 ||
			{ echo "HOT_UNSPLICE_FAILED round=$r mechanism=$m: $(cat /tmp/unsplice.out)"; exit 12; }
	done
	echo "HOT_ROUND $r redirects=$(($(redirects) - before))"
	r=$((r + 1))
done
echo "HOT_JMP_REL8=$rel8"
echo "HOT_ROUNDS=$rounds"
echo "HOT_REDIRECTS=$(($(redirects) - before))"
echo "HOT_LIVE=$(trapctl list --json | grep -c '"mechanism"')"
echo "HOT_DONE"
