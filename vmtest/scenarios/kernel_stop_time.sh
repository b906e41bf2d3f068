#!/bin/sh
# How long the module's stop_machine() holds every CPU (issue 26, item 3): count splices by trap
# in batches of 1, 100 and 1,000 functions, each applied and then removed, with the module's
# stop_stats (/sys/module/trapvec/parameters/stop_stats) printed before and after every step.
# Prints KEY=value lines that vmtest/tests/kernel_stop_time.rs checks; a module without
# stop_stats prints none of them.
set -u

. /lib/scenario.sh

stats=/sys/module/trapvec/parameters/stop_stats
sizes=${STOP_SIZES:-1 100 1000}
[ -r $stats ] || { echo "STOP: the module has no stop_stats parameter"; exit 10; }
# `show STEP`: the figures after STEP, one line.
show() {
	echo "STOP_STATS_$1=$(cat $stats)"
}
show start

traceable /tmp/traceable

for n in $sizes; do
	# Candidates spread over the text; the first n that trapctl plans a trap for.
	want=$((n + n / 2 + 10))
	step=$(( $(wc -l < /tmp/traceable) / want ))
	[ "$step" -ge 1 ] || step=1
	awk -v s="$step" 'NR % s == 0' /tmp/traceable > /tmp/cand
	count_spec /tmp/cand > /tmp/cand.toml
	trapctl apply --check /tmp/cand.toml > /tmp/check.out 2> /dev/null || true
	awk '$1 == "ok" { print $2 }' /tmp/check.out | head -n "$n" > /tmp/names
	got=$(wc -l < /tmp/names)
	[ "$got" -eq "$n" ] || { echo "STOP: only $got of $n functions take a trap splice"; exit 11; }
	count_spec /tmp/names > /tmp/spec.toml
	trapctl apply /tmp/spec.toml > /tmp/apply.out 2>&1 ||
		{ echo "STOP_APPLY_FAILED n=$n: $(cat /tmp/apply.out)"; exit 12; }
	echo "STOP_LIVE_$n=$(trapctl list --json | grep -o '"mechanism"' | wc -l)"
	show "apply_$n"
	trapctl unsplice --all > /tmp/unsplice.out 2>&1 ||
		{ echo "STOP_UNSPLICE_FAILED n=$n: $(cat /tmp/unsplice.out)"; exit 13; }
	show "revert_$n"
done
echo "STOP_LEFT=$(trapctl list --json | grep -o '"mechanism"' | wc -l)"
echo "STOP_DONE"
