#!/bin/sh
# How APPLY's time grows with the batch (issue 26, item 3): count splices by trap on 1,000, 5,000
# and 20,000 functions that ftrace can trace, each set in one batch (a generated spec, applied
# with --best-effort, so that the planner drops what it refuses), then all removed. After each
# apply the module's apply_stats (the last APPLY that wrote: patches and ns) and stop_stats are
# printed; after each removal, LIST and the module's allocations. Prints KEY=value lines that
# vmtest/tests/kernel_commit_scale.rs checks; optionally another trapvec.ko is tested.
set -u

. /lib/scenario.sh

# Another trapvec.ko instead of the packed one (commit_scale.module=NAME on the kernel command
# line: how the test shows what it catches on a module built without the fix).
module=$(sed -n 's/.*commit_scale\.module=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi

params=/sys/module/trapvec/parameters
sizes=${COMMIT_SIZES:-1000 5000 20000}
[ -r $params/apply_stats ] || { echo "COMMIT: the module has no apply_stats parameter"; exit 10; }
# Allocations that a splice holds while live (scenario.sh's allocs; the scratch kinds are 0
# between ioctls).
echo "COMMIT_ALLOCS_start=$(allocs)"

traceable /tmp/traceable
echo "COMMIT_TRACEABLE=$(wc -l < /tmp/traceable)"

for n in $sizes; do
	# n candidates spread over the text (all of them if there are fewer).
	total=$(wc -l < /tmp/traceable)
	step=$((total / n))
	[ "$step" -ge 1 ] || step=1
	awk -v s="$step" 'NR % s == 0' /tmp/traceable | head -n "$n" > /tmp/names
	count_spec /tmp/names > /tmp/spec.toml
	t0=$(ms)
	trapctl apply --best-effort /tmp/spec.toml > /tmp/apply.out 2>&1
	rc=$?
	t1=$(ms)
	# 0: all applied; 3: some refused by the planner, the rest applied.
	[ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] ||
		{ echo "COMMIT_APPLY_FAILED n=$n rc=$rc: $(tail -n 5 /tmp/apply.out)"; exit 12; }
	echo "COMMIT_APPLY_$n=$(cat $params/apply_stats)"
	echo "COMMIT_STOPS_$n=$(cat $params/stop_stats)"
	echo "COMMIT_COMMAND_MS_$n=$((t1 - t0))"
	echo "COMMIT_LIVE_$n=$(trapctl list --json | grep -o '"mechanism"' | wc -l)"
	trapctl unsplice --all > /tmp/unsplice.out 2>&1 ||
		{ echo "COMMIT_UNSPLICE_FAILED n=$n: $(tail -n 5 /tmp/unsplice.out)"; exit 13; }
	echo "COMMIT_REVERT_STOPS_$n=$(cat $params/stop_stats)"
	echo "COMMIT_LEFT_$n=$(trapctl list --json | grep -o '"mechanism"' | wc -l)"
	echo "COMMIT_ALLOCS_$n=$(allocs)"
done
echo "COMMIT_DONE"
