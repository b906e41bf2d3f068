# What the scenarios share, in the guest as /lib/scenario.sh (`. /lib/scenario.sh`): busybox sh
# functions, each the one copy of a step more than one scenario takes.

# `refuse KEY CMD...`: CMD must fail; its message is printed as KEY=...
refuse() {
	key=$1
	shift
	if "$@" > /tmp/out 2> /tmp/err; then
		echo "$key=UNEXPECTEDLY ACCEPTED"
	else
		echo "$key=$(head -n 1 /tmp/err)"
	fi
}

# `addr SYMBOL`: SYMBOL's address in /proc/kallsyms, hex without 0x.
addr() {
	awk -v n="$1" '$3 == n { print $1; exit }' /proc/kallsyms
}

# `fastest_rounds PREFIX CONFIGS`: $rounds rounds over every configuration of CONFIGS in turn
# (so that a slow phase of the host hits them all), each measured by the scenario's own
# `measure CONFIG`; prints `PREFIX N: config=value ...` per round and leaves each
# configuration's fastest value in `min_CONFIG` (and CONFIGS in `configs`).
fastest_rounds() {
	prefix=$1
	configs=$2
	for c in $configs; do eval "min_$c=999999999"; done
	round=1
	while [ "$round" -le "$rounds" ]; do
		line="$prefix $round:"
		for c in $configs; do
			v=$(measure "$c")
			line="$line $c=$v"
			eval "[ \"$v\" -lt \"\$min_$c\" ] && min_$c=$v" || true
		done
		echo "$line"
		round=$((round + 1))
	done
}

# `start_trapd [CONFIG]`: trapd (the test's /files/trapd) with the configuration CONFIG (a
# TOML text; empty without it, or /tmp/trapd.toml as it is with `-`) and its journal in
# /var/lib/trapd, its log in /tmp/trapd.log; returns once it answers, its pid in $tdp. Prints
# `TRAPD=did not come up: LOG` and exits 21 when it does not within 10 s.
start_trapd() {
	cp /files/trapd /bin/trapd && chmod 755 /bin/trapd
	mkdir -p /run /var/lib/trapd
	[ "${1:-}" = - ] || printf '%s' "${1:-}" > /tmp/trapd.toml
	trapd --config /tmp/trapd.toml --journal /var/lib/trapd/journal > /tmp/trapd.log 2>&1 &
	tdp=$!
	i=0
	until trapd send '{"op":"status"}' > /dev/null 2>&1; do
		i=$((i + 1))
		[ $i -gt 100 ] && { echo "TRAPD=did not come up: $(cat /tmp/trapd.log)"; exit 21; }
		usleep 100000
	done
}

# `entry_len SYMBOL`: how many bytes at SYMBOL's start the kernel owns, read from its live text:
# an endbr64 (or 6.12's sealed 4-byte NOP over one) and then the 5-byte ftrace site (its NOP or
# its call), as the planner's point resolution skips them: 5 on 6.1, 9 on 6.12 where IBT puts
# endbr64 first. Offsets in the scenarios are written past it (`past_entry`), so that the same
# instruction is named on both kernels.
entry_len() {
	b=$(trapctl read "$1" 9 | awk '{ for (i = 2; i <= NF; i++) printf "%s", $i }')
	n=0
	case $b in
	f30f1efa* | 660f1f00*) n=4 b=${b#????????} ;;
	esac
	case $b in
	0f1f440000* | e8*) n=$((n + 5)) ;;
	esac
	echo "$n"
}

# `past_entry SYMBOL DELTA`: the point `SYMBOL+N`, N being DELTA bytes past its entry_len
# (`past_entry __x64_sys_getppid 0` is `__x64_sys_getppid+5` on 6.1, `+9` on 6.12).
past_entry() {
	echo "$1+$(($(entry_len "$1") + $2))"
}

# `allocs`: the module's allocation counters (mem.c's lines "<kind> <objects> <bytes>"), one
# line.
allocs() {
	tr '\n' ' ' < /sys/module/trapvec/parameters/allocations
}

# `ms`: milliseconds since boot (busybox date has no %N).
ms() {
	awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime
}

# `count_spec FILE`: a spec of one count splice by trap at each point of FILE (one a line).
count_spec() {
	awk '{ printf "[[splice]]\nat = \"%s\"\naction = \"count\"\nmechanism = \"trap\"\n", $1 }' "$1"
}

# `traceable FILE`: the unique core-kernel functions ftrace can trace, in kallsyms order, into
# FILE (tracefs mounted where it is not).
traceable() {
	tfs=/sys/kernel/tracing
	[ -e $tfs/available_filter_functions ] || mount -t tracefs nodev $tfs
	grep -v '\[' $tfs/available_filter_functions | sort | uniq -u > /tmp/ftrace_names
	awk '$2 ~ /^[tT]$/ && NF == 3 { print $3 }' /proc/kallsyms > /tmp/ksyms
	awk 'NR == FNR { ok[$1] = 1; next } ok[$1]' /tmp/ftrace_names /tmp/ksyms > "$1"
}

# `traceable_names`: the unique core-kernel functions ftrace can trace, in kallsyms order, into
# /tmp/names, the two `count_sample` calls first (tracefs mounted where it is not).
traceable_names() {
	tfs=/sys/kernel/tracing
	[ -e $tfs/available_filter_functions ] || mount -t tracefs nodev $tfs
	grep -v '\[' $tfs/available_filter_functions | sort | uniq -u > /tmp/ftrace_names
	awk '$2 ~ /^[tT]$/ && NF == 3 { print $3 }' /proc/kallsyms > /tmp/ksyms
	awk 'NR == FNR { ok[$1] = 1; next } ok[$1]' /tmp/ftrace_names /tmp/ksyms |
		grep -vx '__x64_sys_getppid\|__x64_sys_getsid' > /tmp/rest
	{ echo __x64_sys_getppid; echo __x64_sys_getsid; cat /tmp/rest; } > /tmp/names
}

# `count_sample PREFIX`: with a count splice live at __x64_sys_getppid and __x64_sys_getsid, a
# kprobe beside each, ppidloop calls each a known number of times; prints
# `PREFIX_SAMPLE_getppid=calls=C hits=H kprobe=K` (H the splice's hits from `trapctl list`, K
# the kprobe's) and the same for getsid, as vmtest's Run::assert_count_sample checks them.
# Exits 15 when a kprobe cannot be made.
count_sample() {
	tfs=/sys/kernel/tracing
	echo 'p:smp __x64_sys_getppid' >> $tfs/kprobe_events || exit 15
	echo 'p:sms __x64_sys_getsid' >> $tfs/kprobe_events || exit 15
	echo 1 > $tfs/events/kprobes/smp/enable || exit 15
	echo 1 > $tfs/events/kprobes/sms/enable || exit 15
	echo 0 > $tfs/tracing_on
	p0=$(splice_hits __x64_sys_getppid); s0=$(splice_hits __x64_sys_getsid)
	kp0=$(kprobe_hits smp); ks0=$(kprobe_hits sms)
	calls_p=$(ppidloop -t 2 -n 3000 | sed -n 's/^CALLS=\([0-9]*\) .*/\1/p')
	calls_s=$(ppidloop -t 2 -n 2000 -s | sed -n 's/^CALLS=\([0-9]*\) .*/\1/p')
	p1=$(splice_hits __x64_sys_getppid); s1=$(splice_hits __x64_sys_getsid)
	kp1=$(kprobe_hits smp); ks1=$(kprobe_hits sms)
	echo 0 > $tfs/events/kprobes/smp/enable
	echo 0 > $tfs/events/kprobes/sms/enable
	echo > $tfs/kprobe_events
	echo "$1_SAMPLE_getppid=calls=$calls_p hits=$((p1 - p0)) kprobe=$((kp1 - kp0))"
	echo "$1_SAMPLE_getsid=calls=$calls_s hits=$((s1 - s0)) kprobe=$((ks1 - ks0))"
}

# `splice_hits POINT`: the hits of POINT's splice, from `trapctl list`'s table (POINT SITE MECH
# ACTION HITS MISSED).
splice_hits() {
	trapctl list | awk -v p="$1" '$1 == p { print $5 }'
}

# `kprobe_hits EVENT`: the hits of kprobe EVENT, from kprobe_profile.
kprobe_hits() {
	awk -v n="$1" '$1 == n { print $2 }' /sys/kernel/tracing/kprobe_profile
}

# `reclaimed PREFIX`: the splices removed, one more splice applied and removed, whose QUIESCE
# reclaims the blocks the removal freed (and leaves that splice's own freed, waiting for the
# next): prints `PREFIX_ALLOCS_reclaimed=` the module's allocations then. Exits 17 when that
# splice fails, saying why as `PREFIX_ONE_FAILED`.
reclaimed() {
	trapctl splice __x64_sys_getppid --count > /tmp/one.out 2>&1 && trapctl unsplice --all >> /tmp/one.out 2>&1 ||
		{ echo "$1_ONE_FAILED: $(tail -n 3 /tmp/one.out)"; exit 17; }
	echo "$1_ALLOCS_reclaimed=$(allocs)"
}

# `unload PREFIX`: rmmod trapvec; prints `PREFIX_RMMOD=yes` (or `no`) and `PREFIX_UNLOAD_LINE=`
# its last words in dmesg (what it still had allocated).
unload() {
	rmmod trapvec && echo "$1_RMMOD=yes" || echo "$1_RMMOD=no"
	echo "$1_UNLOAD_LINE=$(dmesg | grep 'trapvec: unloaded' | tail -n 1 | sed 's/^\[[^]]*\] //')"
}

# The cpuidle states of vmtest/kmods/idle_poll (0 the kernel's poll_idle(), 1 halt, 2 its own
# poll loop, tv_idle_spin(), registered disabled). `idle_only S`: state S alone in use on every
# CPU; `idle_usual`: states 0 and 1, as tv_idle_poll registers them.
idle_states() {
	for c in /sys/devices/system/cpu/cpu[0-9]*/cpuidle; do
		echo "$1" > "$c/state0/disable"
		echo "$2" > "$c/state1/disable"
		echo "$3" > "$c/state2/disable"
	done
}
idle_only() {
	case $1 in
	0) idle_states 0 1 1 ;;
	2) idle_states 1 1 0 ;;
	esac
}
idle_usual() { idle_states 0 0 1; }
