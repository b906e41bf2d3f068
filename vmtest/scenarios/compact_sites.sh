#!/bin/sh
# Compact count sites at scale (issue 26, items 1 and 2): one batch of count splices by trap at
# the entry of every function ftrace can trace (COMPACT_N of them at most), applied with
# --best-effort (the planner drops what it refuses), then exact hit counts on a sample
# (__x64_sys_getppid and __x64_sys_getsid, whose calls ppidloop makes and counts, each beside a
# kprobe on the same function), `trapctl list --stats` (bytes per site), then everything removed,
# the module's allocations read again (after one more removal, whose QUIESCE reclaims the freed
# blocks) and the module unloaded (its last line says what is still allocated). Prints KEY=value lines that
# vmtest/tests/kernel_compact_sites.rs checks.
set -u

. /lib/scenario.sh

echo "COMPACT_ALLOCS_start=$(allocs)"

# Unique core-kernel names ftrace can trace, in kallsyms order; the sample first.
traceable_names
head -n "${COMPACT_N:-200000}" /tmp/names > /tmp/asked
echo "COMPACT_ASKED=$(wc -l < /tmp/asked)"
count_spec /tmp/asked > /tmp/spec.toml

t0=$(ms)
trapctl apply --best-effort /tmp/spec.toml > /tmp/apply.out 2>&1
rc=$?
t1=$(ms)
# 0: all applied; 3: some refused by the planner, the rest applied.
[ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] ||
	{ echo "COMPACT_APPLY_FAILED rc=$rc: $(tail -n 5 /tmp/apply.out)"; exit 12; }
echo "COMPACT_APPLY_MS=$((t1 - t0))"
grep -i 'refused' /tmp/apply.out | head -n 5 | sed 's/^/COMPACT_REFUSALS: /'
echo "COMPACT_FULL=$(grep -c 'arena of trapvec.ko is full' /tmp/apply.out)"
trapctl list > /tmp/list.out 2>&1 || { echo "COMPACT_LIST_FAILED: $(tail -n 3 /tmp/list.out)"; exit 13; }
echo "COMPACT_LIVE=$(awk '$3 == "trap" && $4 == "count"' /tmp/list.out | wc -l)"
echo "COMPACT_ALLOCS_live=$(allocs)"
trapctl list --stats > /tmp/stats.out 2>&1 || echo "COMPACT_STATS_FAILED: $(tail -n 3 /tmp/stats.out)"
sed 's/^/COMPACT_STATS: /' /tmp/stats.out

count_sample COMPACT

t0=$(ms)
trapctl unsplice --all > /tmp/unsplice.out 2>&1 ||
	{ echo "COMPACT_UNSPLICE_FAILED: $(tail -n 5 /tmp/unsplice.out)"; exit 16; }
t1=$(ms)
echo "COMPACT_REMOVE_MS=$((t1 - t0))"
echo "COMPACT_LEFT=$(trapctl list | awk '$3 == "trap" && $4 == "count"' | wc -l)"
echo "COMPACT_ALLOCS_end=$(allocs)"
# Freed blocks are reclaimed at the next QUIESCE (that splice's own code block is left: a
# count trap has no data block).
reclaimed COMPACT
unload COMPACT
echo "COMPACT_DONE"
