#!/bin/sh
# Task predicates in the kernel (issue 12, item 3). Two processes make an exact number of
# getppid() calls each (/bin/ppidloop -m: all in the main thread, after a go file appears, so
# the scenario knows their pids before the first call; the second runs as /tmp/otherloop, a
# copy, so its comm differs), and splices with a predicate count only the one they name:
#  1. --tgid A, a count, by trap (the dispatcher tests the task) and by jmp (a guard in the
#     trampoline reads gs:current_task);
#  2. --comm otherloop, a counting return point, trap and jmp;
#  3. --pid A, a return point with a handler (components/rpret.c), trap and jmp: the handler
#     runs once per call of A and sees each return value;
#  4. --tgid B --comm ppidloop: nobody is both, nothing is counted;
#  5. a name the kernel cannot hold is refused, nothing changes;
#  6. trapd profiles that splice getppid differently (every task; comm ppidloop only): the
#     switch, made while A calls getppid without pause, hands the site over in place (the trap
#     stays, the dispatch entry is replaced), so every call of A is counted by the old splice or
#     the new, and the kernel's own kprobe on getppid counts the same number; a switch to a jmp that is refused (a second point inside the ftrace NOP) takes
#     the site out in a batch of its own, makes the old splice again and stores it, so a daemon
#     restarted after kill -9 finds it recorded.
# Prints KEY=value lines that vmtest/tests/kernel_predicates.rs checks.
set -u

. /lib/scenario.sh

squash() {
	tr -d '\n '
}

# `start BIN CALLS`: BIN waits for /tmp/go, then makes CALLS calls (output in /tmp/out.PID);
# returns once BIN is exec'd (its comm is its name), with its pid in $started.
start() {
	"$1" -m -g /tmp/go -n "$2" > /tmp/out.tmp &
	started=$!
	until [ "$(cat /proc/$started/comm 2>/dev/null)" = "${1##*/}" ]; do :; done
}

# `both NAME_A NAME_B`: start A (3000 calls) and B (2000), pids in $a and $b.
both() {
	rm -f /tmp/go
	start /bin/ppidloop 3000
	a=$started
	mv /tmp/out.tmp /tmp/out.a
	start /tmp/otherloop 2000
	b=$started
	mv /tmp/out.tmp /tmp/out.b
}

# `run KEY`: let both go, wait, print their lines as KEY_A and KEY_B.
run() {
	touch /tmp/go
	wait $a
	wait $b
	echo "${1}_A=$(cat /tmp/out.a)"
	echo "${1}_B=$(cat /tmp/out.b)"
}

# `spliced KEY CODE ARGS...` (after `both`): splice getppid with ARGS, run both, list, unsplice
# (exit CODE if that fails); prints KEY_SPLICE, KEY_A, KEY_B and KEY_LIST.
spliced() {
	key=$1
	code=$2
	shift 2
	echo "${key}_SPLICE=$(trapctl splice __x64_sys_getppid "$@" 2>&1)"
	run "$key"
	echo "${key}_LIST=$(trapctl list --json | squash)"
	trapctl unsplice __x64_sys_getppid > /dev/null || exit "$code"
}

grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10
cp /bin/ppidloop /tmp/otherloop || exit 10

# --- 1. --tgid A: a count.
for mech in trap jmp; do
	both
	spliced "TGID_$mech" 11 --count --mechanism $mech --tgid $a
done

# --- 2. --comm otherloop: a counting return point.
for mech in trap jmp; do
	both
	spliced "COMM_$mech" 12 --return --count --mechanism $mech --comm otherloop
done

# --- 3. --pid A: a return handler.
trapctl load /components/rpret.o > /dev/null || exit 13
trapctl set rpret_want $$ > /dev/null || exit 13
echo "SHELL_PID=$$"
for mech in trap jmp; do
	both
	echo "PID_BEFORE_$mech=$(trapctl get rpret_calls) $(trapctl get rpret_match)"
	echo "PID_SPLICE_$mech=$(trapctl splice __x64_sys_getppid --return --call rpret_getppid --mechanism $mech --pid $a 2>&1)"
	run "PID_$mech"
	echo "PID_AFTER_$mech=$(trapctl get rpret_calls) $(trapctl get rpret_match)"
	echo "PID_LIST_$mech=$(trapctl list --json | squash)"
	trapctl unsplice __x64_sys_getppid > /dev/null || exit 14
done
trapctl unload rpret > /dev/null || exit 15

# --- 4. Every field must match: B is not named ppidloop.
both
spliced NONE 16 --count --mechanism jmp --tgid $b --comm ppidloop

# --- 5. Bad input changes nothing.
echo "BAD_BYTES_BEFORE=$(trapctl read __x64_sys_getppid 16 | cut -d: -f2)"
bad=$(trapctl splice __x64_sys_getppid --count --comm systemd-journald 2>&1)
echo "BAD_COMM=$bad rc=$?"
echo "BAD_BYTES_AFTER=$(trapctl read __x64_sys_getppid 16 | cut -d: -f2)"
echo "BAD_LIST=$(trapctl list --json | squash)"

# --- 6. Profiles that splice one site differently.
start_trapd '[profile.all]
splice = [{ at = "__x64_sys_getppid", action = "count" }]
[profile.only_a]
splice = [{ at = "__x64_sys_getppid", action = "count", comm = "ppidloop" }]
[profile.broken]
splice = [{ at = "__x64_sys_getppid", action = "count", mechanism = "jmp" }, { at = "__x64_sys_getppid+0x1", action = "count" }]
'
# `profile KEY NAME`: activate NAME, run both, print the reply, the calls and trapd's listing.
profile() {
	both
	echo "${1}_ACTIVATE=$(trapd send "{\"op\":\"activate\",\"profile\":\"$2\"}")"
	run "$1"
	echo "${1}_TRAPD=$(trapd send '{"op":"list"}')"
}
profile HAND_ALL all
# A calls getppid until told to stop; only_a comes in while it does. The kernel's own kprobe
# on getppid (on its ftrace NOP, beside our trap) counts the same calls.
T=/sys/kernel/tracing
echo 'p:gp __x64_sys_getppid' >> $T/kprobe_events || exit 18
echo 1 > $T/events/kprobes/gp/enable || exit 18
kprobe_hits() {
	awk '$1 == "gp" { print $2 }' $T/kprobe_profile
}
rm -f /tmp/go /tmp/stop
/bin/ppidloop -m -g /tmp/go -f /tmp/stop > /tmp/out.a &
a=$!
k0=$(kprobe_hits)
touch /tmp/go
sleep 1
echo "HAND_ONLY_ACTIVATE=$(trapd send '{"op":"activate","profile":"only_a"}')"
sleep 1
touch /tmp/stop
wait $a
echo "HAND_ONLY_KPROBE=$(($(kprobe_hits) - k0))"
echo 0 > $T/events/kprobes/gp/enable
echo '-:gp' >> $T/kprobe_events
echo "HAND_ONLY_A=$(cat /tmp/out.a)"
echo "HAND_ONLY_TRAPD=$(trapd send '{"op":"list"}')"
profile HAND_BROKEN broken
kill -9 $tdp
wait $tdp 2> /dev/null
start_trapd -
echo "HAND_RESTART=$(trapd send '{"op":"list"}')"
echo "HAND_UNSPLICE=$(trapd send '{"op":"unsplice","all":true}')"
kill $tdp
wait $tdp

rmmod trapvec || exit 17
echo "PREDICATES=done"
