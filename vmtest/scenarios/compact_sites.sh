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

params=/sys/module/trapvec/parameters
T=/sys/kernel/tracing
[ -e $T/available_filter_functions ] || mount -t tracefs nodev $T
allocs() {
	tr '\n' ' ' < $params/allocations
}
# Milliseconds since boot (busybox date has no %N).
ms() {
	awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime
}
echo "COMPACT_ALLOCS_start=$(allocs)"

# Unique core-kernel names ftrace can trace, in kallsyms order; the sample first.
grep -v '\[' $T/available_filter_functions | sort | uniq -u > /tmp/ftrace_names
awk '$2 ~ /^[tT]$/ && NF == 3 { print $3 }' /proc/kallsyms > /tmp/ksyms
awk 'NR == FNR { ok[$1] = 1; next } ok[$1]' /tmp/ftrace_names /tmp/ksyms |
	grep -vx '__x64_sys_getppid\|__x64_sys_getsid' > /tmp/rest
{ echo __x64_sys_getppid; echo __x64_sys_getsid; cat /tmp/rest; } | head -n "${COMPACT_N:-200000}" \
	> /tmp/names
echo "COMPACT_ASKED=$(wc -l < /tmp/names)"
awk '{ printf "[[splice]]\nat = \"%s\"\naction = \"count\"\nmechanism = \"trap\"\n", $1 }' \
	/tmp/names > /tmp/spec.toml

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

# The sample: hits of a splice from the table (POINT SITE MECH ACTION HITS MISSED).
hits() {
	trapctl list | awk -v p="$1" '$1 == p { print $5 }'
}
probe_hits() {
	awk -v n="$1" '$1 == n { print $2 }' $T/kprobe_profile
}
echo 'p:cgp __x64_sys_getppid' >> $T/kprobe_events || exit 15
echo 'p:cgs __x64_sys_getsid' >> $T/kprobe_events || exit 15
echo 1 > $T/events/kprobes/cgp/enable || exit 15
echo 1 > $T/events/kprobes/cgs/enable || exit 15
echo 0 > $T/tracing_on
p0=$(hits __x64_sys_getppid); s0=$(hits __x64_sys_getsid)
kp0=$(probe_hits cgp); ks0=$(probe_hits cgs)
calls_p=$(ppidloop -t 2 -n 3000 | sed -n 's/^CALLS=\([0-9]*\) .*/\1/p')
calls_s=$(ppidloop -t 2 -n 2000 -s | sed -n 's/^CALLS=\([0-9]*\) .*/\1/p')
p1=$(hits __x64_sys_getppid); s1=$(hits __x64_sys_getsid)
kp1=$(probe_hits cgp); ks1=$(probe_hits cgs)
echo 0 > $T/events/kprobes/cgp/enable
echo 0 > $T/events/kprobes/cgs/enable
echo > $T/kprobe_events
echo "COMPACT_SAMPLE_getppid=calls=$calls_p hits=$((p1 - p0)) kprobe=$((kp1 - kp0))"
echo "COMPACT_SAMPLE_getsid=calls=$calls_s hits=$((s1 - s0)) kprobe=$((ks1 - ks0))"

t0=$(ms)
trapctl unsplice --all > /tmp/unsplice.out 2>&1 ||
	{ echo "COMPACT_UNSPLICE_FAILED: $(tail -n 5 /tmp/unsplice.out)"; exit 16; }
t1=$(ms)
echo "COMPACT_REMOVE_MS=$((t1 - t0))"
echo "COMPACT_LEFT=$(trapctl list | awk '$3 == "trap" && $4 == "count"' | wc -l)"
echo "COMPACT_ALLOCS_end=$(allocs)"
# Freed blocks are reclaimed at the next QUIESCE: the removal of one more splice makes one
# (and leaves that splice's own code block freed, waiting for the next: a count trap has no
# data block).
trapctl splice __x64_sys_getppid --count > /tmp/one.out 2>&1 && trapctl unsplice --all >> /tmp/one.out 2>&1 ||
	{ echo "COMPACT_ONE_FAILED: $(tail -n 3 /tmp/one.out)"; exit 17; }
echo "COMPACT_ALLOCS_reclaimed=$(allocs)"
rmmod trapvec && echo "COMPACT_RMMOD=yes" || echo "COMPACT_RMMOD=no"
echo "COMPACT_UNLOAD_LINE=$(dmesg | grep 'trapvec: unloaded' | tail -n 1 | sed 's/^\[[^]]*\] //')"
echo "COMPACT_DONE"
