#!/bin/sh
# 200,000 live count sites (issue 26, item 2): one batch of count splices by trap at the entry of
# every function ftrace can trace plus the first instruction of basic blocks of the first of them
# (`trapctl points --blocks`, the rows it says take a trap) up to K200_WANT sites, applied with
# --best-effort while loopback TCP streams run (tcpmss --traffic, every byte checked) and
# connections are opened (tcpmss -n); exact hit counts on a sample (__x64_sys_getppid and
# __x64_sys_getsid, called a known number of times by ppidloop, each beside a kprobe on the same
# function); everything removed in one batch, the module's allocations read again (and after
# one more removal, whose QUIESCE reclaims the freed blocks); dmesg searched for a soft lockup,
# an oops, a warning or an RCU stall; the module unloaded. Prints KEY=value lines that
# vmtest/tests/kernel_200k.rs checks.
set -u

. /lib/scenario.sh

want=${K200_WANT:-212000}
echo "K200_ALLOCS_start=$(allocs)"

# Unique core-kernel names ftrace can trace, in kallsyms order; the sample first.
traceable_names
entries=$(wc -l < /tmp/names)

# Blocks past each function's entry block (rows whose point has an offset) that take a trap,
# from the first functions of the list until there are enough; each site once.
t0=$(ms)
: > /tmp/blocks
from=1
while [ $((entries + $(wc -l < /tmp/blocks))) -lt "$want" ] && [ "$from" -le "$entries" ]; do
	sed -n "$((from + 2)),$((from + 2 + 1999))p" /tmp/names > /tmp/chunk
	from=$((from + 2000))
	[ -s /tmp/chunk ] || break
	# shellcheck disable=SC2046
	trapctl points --blocks $(cat /tmp/chunk) > /tmp/points.out 2>&1 ||
		{ echo "K200_POINTS_FAILED: $(tail -n 3 /tmp/points.out)"; exit 11; }
	awk 'NF >= 4 && $1 ~ /\+0x/ && $3 == "yes" { print $1, $2 }' /tmp/points.out >> /tmp/blocks
done
awk '!seen[$2]++ { print $1 }' /tmp/blocks | head -n $((want - entries)) > /tmp/block_points
echo "K200_SELECT_MS=$(($(ms) - t0))"
echo "K200_ENTRIES=$entries"
echo "K200_BLOCKS=$(wc -l < /tmp/block_points)"
cat /tmp/names /tmp/block_points > /tmp/points
echo "K200_ASKED=$(wc -l < /tmp/points)"
count_spec /tmp/points > /tmp/spec.toml

# Traffic for the whole apply, sampling and removal: streams one after another (each checks
# every byte) and connections, until /tmp/stop exists; failures are counted.
rm -f /tmp/stop
(
	n=0
	bad=0
	while [ ! -e /tmp/stop ]; do
		tcpmss --traffic 5 > /dev/null 2>&1 || bad=$((bad + 1))
		tcpmss -n 3 > /dev/null 2>&1 || bad=$((bad + 1))
		n=$((n + 1))
	done
	echo "rounds=$n failed=$bad" > /tmp/traffic.out
) &
traffic=$!

t0=$(ms)
trapctl apply --best-effort /tmp/spec.toml > /tmp/apply.out 2>&1
rc=$?
t1=$(ms)
# 0: all applied; 3: some refused by the planner, the rest applied.
[ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] ||
	{ echo "K200_APPLY_FAILED rc=$rc: $(tail -n 5 /tmp/apply.out)"; touch /tmp/stop; exit 12; }
echo "K200_APPLY_MS=$((t1 - t0))"
grep -i 'refused' /tmp/apply.out | head -n 5 | sed 's/^/K200_REFUSALS: /'
echo "K200_FULL=$(grep -c 'arena of trapvec.ko is full' /tmp/apply.out)"
trapctl list > /tmp/list.out 2>&1 || { echo "K200_LIST_FAILED: $(tail -n 3 /tmp/list.out)"; exit 13; }
echo "K200_LIVE=$(awk '$3 == "trap" && $4 == "count"' /tmp/list.out | wc -l)"
echo "K200_DISPATCH=$(awk '$1 == "entry" { print $2 }' /sys/module/trapvec/parameters/allocations)"
echo "K200_ALLOCS_live=$(allocs)"
trapctl list --stats > /tmp/stats.out 2>&1 || echo "K200_STATS_FAILED: $(tail -n 3 /tmp/stats.out)"
sed 's/^/K200_STATS: /' /tmp/stats.out

count_sample K200
# Hits summed over every live site: the blocks were taken while the traffic ran.
echo "K200_HIT_SITES=$(trapctl list | awk '$3 == "trap" && $4 == "count" && $5 > 0' | wc -l)"

t0=$(ms)
trapctl unsplice --all > /tmp/unsplice.out 2>&1 ||
	{ echo "K200_UNSPLICE_FAILED: $(tail -n 5 /tmp/unsplice.out)"; touch /tmp/stop; exit 16; }
t1=$(ms)
echo "K200_REMOVE_MS=$((t1 - t0))"
touch /tmp/stop
wait "$traffic"
echo "K200_TRAFFIC=$(cat /tmp/traffic.out)"
echo "K200_LEFT=$(trapctl list | awk '$3 == "trap" && $4 == "count"' | wc -l)"
echo "K200_ALLOCS_end=$(allocs)"
# Freed blocks are reclaimed at the next QUIESCE (that splice's own blocks are left).
reclaimed K200
# Case-sensitive: a boot line about lOOPS_per_jiffy (calibrate_delay) is no oops.
echo "K200_DMESG_BAD=$(dmesg | grep -c 'soft lockup\|Oops\|BUG:\|WARNING:\|rcu.*stall\|hung task')"
dmesg | grep 'soft lockup\|Oops\|BUG:\|WARNING:\|rcu.*stall\|hung task' | head -n 5 | sed 's/^/K200_DMESG: /'
dmesg | grep 'trapvec: ' | tail -n 5 | sed 's/^/K200_KLOG: /'
unload K200
echo "K200_DONE"
