#!/bin/sh
# Branch targets no decoder sees (issue 24, item 3): the target of a jump label (the kernel
# writes a jmp to it when the static key flips) and an exception fix-up (a fault elsewhere
# resumes there). A window may start at one, never cover one past its first byte.
#
# hiddentargets lists the core kernel's from its tables (through READ); trapctl apply --check
# plans a jmp splice 1 to 4 bytes before each (a jmp rel32 window is 5 bytes: it covers the
# target, and only the module knows that it is one). Then: one refusal of a jump target whose
# key is a scheduler feature, named with its key and place; the key flipped both ways through
# /sys/kernel/debug/sched/features while processes start and the scheduler runs the function
# (a kprobe at its entry counts the calls); one refusal of a fix-up, named with its faulting
# instruction; a window that starts at a target is not refused for it. Prints KEY=value lines
# that vmtest/tests/kernel_hidden_targets.rs checks.
set -u
TV=/files/tvraw
FEATURES=/sys/kernel/debug/sched/features

. /lib/scenario.sh

# `points FILE MECHANISM MAXD`: a [[splice]] per target of FILE (hiddentargets lines) at 1 to
# MAXD bytes before it, in the same function.
points() {
	awk -v mech="$2" -v maxd="$3" '
	function hex(s,  i, v) {
		v = 0
		s = tolower(substr(s, 3))
		for (i = 1; i <= length(s); i++)
			v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
		return v
	}
	{
		if (split($2, p, "+") != 2)
			next
		off = hex(p[2])
		for (d = 1; d <= maxd && d < off; d++)
			printf "[[splice]]\nat = \"%s+%d\"\naction = \"count\"\nmechanism = \"%s\"\n\n", p[1], off - d, mech
	}' "$1"
}

# `checked KIND FILE MECHANISM MAXD`: plan and check them; KIND_POINTS, KIND_REFUSED (by the
# module for this reason, `what`) and the refusals in /tmp/KIND.err.
checked() {
	points "$2" "$3" "$4" > "/tmp/$1.toml"
	trapctl apply --check "/tmp/$1.toml" > "/tmp/$1.ok" 2> "/tmp/$1.err"
	echo "${1}_POINTS=$(grep -c '^at = ' "/tmp/$1.toml")"
}

# The point of a `refused: POINT: why` line.
point_of() {
	sed 's/^refused: \([^:]*\): .*/\1/'
}

# --- jump-label targets.
hiddentargets -j > /tmp/jump
echo "JUMP_TARGETS=$(wc -l < /tmp/jump)"
checked JUMP /tmp/jump jmp 4
echo "JUMP_REFUSED=$(grep -c 'jump-label target of static key' /tmp/JUMP.err)"
grep 'jump-label target of static key' /tmp/JUMP.err | head -n 5
# A function every new process runs, if one of them has such a window; else the first.
grep 'jump-label target of static key sched_feat_keys' /tmp/JUMP.err > /tmp/sched.err
line=
for f in enqueue_task_fair place_entity select_task_rq_fair task_tick_fair; do
	line=$(grep "^refused: $f+" /tmp/sched.err | head -n 1)
	[ -n "$line" ] && break
done
[ -n "$line" ] || line=$(head -n 1 /tmp/sched.err)
if [ -n "$line" ]; then
	point=$(echo "$line" | point_of)
	echo "JUMP_POINT=$point"
	refuse ERR_JUMP_TARGET trapctl splice "$point" --count --mechanism jmp
	# An ftrace kprobe at the function's entry counts its calls while the key is flipped.
	echo "p:hot ${point%%+*}" >> /sys/kernel/tracing/kprobe_events
	echo 1 > /sys/kernel/tracing/events/kprobes/hot/enable
	# sched_feat_keys[i] (a struct static_key: 16 bytes) is feature i of the features file.
	off=$(echo "$line" | sed -n 's/.*static key sched_feat_keys+\(0x[0-9a-f]*\) at .*/\1/p')
	index=$((${off:-0} / 16 + 1))
	word=$(tr ' ' '\n' < $FEATURES | grep . | sed -n "${index}p")
	name=${word#NO_}
	echo "FEATURE=$name (was $word)"
	if [ "$word" = "$name" ]; then flip="NO_$name"; else flip=$name; fi
	echo "$flip" > $FEATURES
	tr ' ' '\n' < $FEATURES | grep -qx "$flip" && echo "FLIPPED=yes" || echo "FLIPPED=no"
	# New processes: fork, wake-up, enqueue and ticks all run the fair scheduler's code.
	i=0
	while [ $i -lt 200 ]; do /bin/true; i=$((i + 1)); done
	ppidloop -t 2 -n 20000 > /dev/null
	echo "CALLED=$(awk '$1 == "hot" { print $2 }' /sys/kernel/tracing/kprobe_profile)"
	echo 0 > /sys/kernel/tracing/events/kprobes/hot/enable
	echo '-:hot' >> /sys/kernel/tracing/kprobe_events
	echo "$word" > $FEATURES
	tr ' ' '\n' < $FEATURES | grep -qx "$word" && echo "RESTORED=yes" || echo "RESTORED=no"
	i=0
	while [ $i -lt 200 ]; do /bin/true; i=$((i + 1)); done
	# A window that starts at the target is not refused for it.
	target=$(echo "$line" | sed -n 's/.* at \([^ ]*\) inside the window$/\1/p')
	tfun=${target%%+*}
	toff=${target#*+}
	$TV check "$(printf '%x' $((0x$(addr "$tfun") + toff)))" 1 > /tmp/tv
	echo "AT_TARGET=$(cat /tmp/tv)"
else
	echo "JUMP_POINT=none"
fi

# --- exception fix-ups.
hiddentargets -x > /tmp/fixup
echo "FIXUP_TARGETS=$(wc -l < /tmp/fixup)"
# A fix-up is the next instruction after the faulting one, which is refused for its own
# exception-table entry: a window over the fix-up starts 1 to 4 bytes before it, at an
# instruction before the faulting one, so it is a jmp window (5 bytes). On 6.12 no 2-byte trap
# window 1 byte before a fix-up starts at an instruction boundary of its own.
checked FIXUP /tmp/fixup jmp 4
echo "FIXUP_REFUSED=$(grep -c 'exception fixup of ' /tmp/FIXUP.err)"
line=$(grep 'exception fixup of ' /tmp/FIXUP.err | head -n 1)
if [ -n "$line" ]; then
	point=$(echo "$line" | point_of)
	echo "FIXUP_POINT=$point"
	refuse ERR_FIXUP trapctl splice "$point" --count --mechanism jmp
else
	echo "FIXUP_POINT=none"
fi

# --- an endbr64 (6.12 has IBT): a 2-byte window over tcp_sync_mss's entry is refused by the
# module itself, not only by the planner (on 6.1 the entry is the ftrace nop, refused for that).
$TV check "$(addr tcp_sync_mss)" 2 > /tmp/tv
echo "ENTRY_CHECK=$(cat /tmp/tv)"

$TV info > /tmp/tv
echo "LIVE_PATCHES=$(sed -n 's/.* live=\([0-9]*\).*/\1/p' /tmp/tv)"
dmesg | grep -q -e 'BUG:' -e 'Oops' -e 'WARNING:' -e 'Call Trace' && { echo "DMESG_CLEAN=no"; dmesg | tail -n 40; } || echo "DMESG_CLEAN=yes"
exit 0
