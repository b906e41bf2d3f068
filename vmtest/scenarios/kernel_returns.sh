#!/bin/sh
# Return points and timers in the kernel (issue 12):
#  1. a return point on __x64_sys_getppid whose handler (components/rpret.c) records what the
#     function returned: a call's result as the caller prints it, and exact counts of the
#     returns of two processes calling it together (trap), then a counting return point of the
#     jmp mechanism;
#  2. a return point on __x64_sys_exit_group, which never returns: the calls' instances are
#     reclaimed once their tasks are gone, counted as missed; also with one on do_group_exit,
#     which it calls: two instances a task;
#  3. timers on hrtimer_nanosleep: sleeps of 1 ms and 20 ms (/bin/naps) land in their log2
#     buckets by the wall clock, and far below 1 ms by the CPU clock;
#  6. the same through trapd: `trapctl time` by requests, a return point of a splice request;
#  7. a tail-calling function (__x64_sys_lseek: `jmp ksys_lseek`, shown by its bytes and by
#     `trapctl inspect`): every return of the tail-called function reaches the handler with its
#     result, exactly;
#  8. a recursive function (ep_loop_check_proc, its self-call shown by `trapctl inspect`) driven
#     at a known depth an exact number of times (/bin/epnest): entries, returns and self-calls
#     counted exactly (trap and jmp), each return checked against its own call's depth,
#     maxactive below the depth, a timer timing every nested call;
#  5. maxactive 1 and two calls at once: one returns through the return point, one is missed;
#  4. a return point removed while a task sleeps inside the function: the task returns fine,
#     the module refuses to unload until it has, and unloads clean after.
# Prints KEY=value lines that vmtest/tests/kernel_returns.rs checks (JSON squashed to one
# line); vmtest fails the run on any oops or warning.
set -u

. /lib/scenario.sh

squash() {
	tr -d '\n '
}

# `settle FILE`: until FILE has a line (a busy wait: a nanosleep would be timed too).
settle() {
	until [ -s "$1" ]; do :; done
}

# `insns FILE`: the instruction lines of a `trapctl inspect` listing, "ADDRESS  BYTES  ASM"
# each, joined by '|' (runs of spaces made two).
insns() {
	grep '^  0x' "$1" | sed 's/   */  /g' | tr '\n' '|'
}

grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10

# --- 1. The return value and exact counts.
trapctl load /components/rpret.o || exit 11
trapctl set rpret_want $$ || exit 12
echo "SHELL_PID=$$"
echo "SPLICE_RET=$(trapctl splice __x64_sys_getppid --return --call rpret_getppid 2>&1)"
echo "ONE=$(/bin/slowcall)"
echo "LAST=$(trapctl get rpret_last)"
echo "CALLS0=$(trapctl get rpret_calls)"
echo "MATCH0=$(trapctl get rpret_match)"
/bin/ppidloop -n 3000 > /tmp/p1 &
p1=$!
/bin/ppidloop -n 2000 > /tmp/p2 &
p2=$!
wait $p1
echo "P1_RC=$?"
wait $p2
echo "P2_RC=$?"
echo "P1=$(cat /tmp/p1)"
echo "P2=$(cat /tmp/p2)"
echo "CALLS1=$(trapctl get rpret_calls)"
echo "MATCH1=$(trapctl get rpret_match)"
echo "LIST_TRAP=$(trapctl list --json | squash)"
echo "LIST_TEXT=$(trapctl list | grep '  returns')"
trapctl unsplice __x64_sys_getppid > /dev/null || exit 13
trapctl unload rpret || exit 14

echo "SPLICE_JMP=$(trapctl splice __x64_sys_getppid --return --count --mechanism jmp --maxactive 8 2>&1)"
/bin/ppidloop -t 2 -n 2000 > /tmp/p3
echo "P3=$(cat /tmp/p3)"
echo "LIST_JMP=$(trapctl list --json | squash)"
trapctl unsplice __x64_sys_getppid > /dev/null || exit 15

# --- 2. A function that never returns: its tasks exit inside it.
trapctl splice __x64_sys_exit_group --return --count > /dev/null || exit 16
/bin/slowcall > /dev/null
/bin/slowcall > /dev/null
echo "LIST_EXIT=$(trapctl list --json | squash)"
# Nested: with do_group_exit's return point too, each exiting task holds two instances (two
# references on itself), reclaimed all the same.
trapctl splice do_group_exit --return --count > /dev/null || exit 40
/bin/slowcall > /dev/null
/bin/slowcall > /dev/null
echo "LIST_EXIT2=$(trapctl list --json | squash)"
trapctl unsplice do_group_exit > /dev/null || exit 41
trapctl unsplice __x64_sys_exit_group > /dev/null || exit 17

# --- 3. Timers. trapctl waits in poll() on its signalfd, not in nanosleep: only the workload's sleeps are timed.
trapctl time hrtimer_nanosleep --seconds 6 --json > /tmp/wall &
tp=$!
settle /tmp/wall
echo "NAPS_1MS=$(/bin/naps 1 10)"
echo "NAPS_20MS=$(/bin/naps 20 5)"
wait $tp
echo "TIME_WALL_RC=$?"
echo "TIME_WALL=$(sed 1d /tmp/wall | squash)"

trapctl time hrtimer_nanosleep --seconds 4 --clock cpu --mechanism jmp --json > /tmp/cpu &
tp=$!
settle /tmp/cpu
echo "NAPS_CPU=$(/bin/naps 20 5)"
wait $tp
echo "TIME_CPU_RC=$?"
echo "TIME_CPU=$(sed 1d /tmp/cpu | squash)"
echo "TIME_TEXT=$(trapctl time hrtimer_nanosleep --seconds 0 | tail -n 1)"

# --- 5. maxactive: two calls at once, with room for one.
trapctl splice hrtimer_nanosleep --return --count --maxactive 1 > /dev/null || exit 19
/bin/naps 500 1 > /dev/null &
na=$!
/bin/naps 500 1 > /dev/null &
nb=$!
wait $na
wait $nb
echo "LIST_MAXACTIVE=$(trapctl list --json | squash)"
trapctl unsplice hrtimer_nanosleep > /dev/null || exit 20

# --- 6. Through trapd: a timer made, read (trapd's list rows carry the figures) and removed by
# requests, and a return point of the protocol's splice request.
start_trapd
trapctl time hrtimer_nanosleep --seconds 3 --json > /tmp/td &
tp=$!
settle /tmp/td
echo "NAPS_TRAPD=$(/bin/naps 20 3)"
wait $tp
echo "TIME_TRAPD_RC=$?"
echo "TIME_TRAPD=$(sed 1d /tmp/td | squash)"
echo "TRAPD_SPLICE=$(trapd send '{"op":"splice","at":"__x64_sys_getppid","action":"count","when":"return","maxactive":4}' | squash)"
/bin/slowcall > /dev/null
echo "TRAPD_LIST=$(trapd send '{"op":"list"}' | squash)"
trapd send '{"op":"unsplice","at":"__x64_sys_getppid"}' > /dev/null
kill $tdp
wait $tdp

# --- 7. A tail call: __x64_sys_lseek ends with `jmp ksys_lseek`, which returns to the caller
# through the return address the entry half replaced.
echo "LSEEK_FN=$(addr __x64_sys_lseek)"
echo "LSEEK_TARGET=$(addr ksys_lseek)"
echo "LSEEK_BYTES=$(trapctl read __x64_sys_lseek 24 | cut -d: -f2 | tr -d '\n')"
# ... and as `trapctl inspect` lists it (its live bytes, wrapped in an ELF by /bin/kfnelf).
trapctl read __x64_sys_lseek | kfnelf __x64_sys_lseek /tmp/vmlinux-lseek || exit 27
trapctl inspect --mode kernel /tmp/vmlinux-lseek __x64_sys_lseek > /tmp/lseek.txt || exit 28
echo "LSEEK_INSNS=$(insns /tmp/lseek.txt)"
trapctl load /components/rpret.o > /dev/null || exit 22
trapctl set rpret_want 777777 > /dev/null || exit 23
trapctl splice __x64_sys_lseek --return --call rpret_getppid > /dev/null || exit 24
echo "LSEEK_MATCH0=$(trapctl get rpret_match)"
echo "LSEEKS=$(/bin/lseeks 777777 3000)"
echo "LSEEK_MATCH1=$(trapctl get rpret_match)"
echo "LSEEK_LAST=$(trapctl get rpret_last)"
echo "LIST_LSEEK=$(trapctl list --json | squash)"
trapctl unsplice __x64_sys_lseek > /dev/null || exit 25
trapctl unload rpret > /dev/null || exit 26

# --- 8. Recursion: ep_loop_check_proc (fs/eventpoll.c) calls itself once per level of a chain
# of nested epoll instances. /bin/epnest builds a chain of 4, waits for SIGUSR1 (so that only
# the adds below are seen), then adds it 500 times to one more instance: each add makes 4 calls,
# at depths 0 to 3, the inner 3 from the self-call, which `trapctl inspect` shows.
ep_depth=4
ep_adds=500
trapctl read ep_loop_check_proc > /tmp/eplc.hex || exit 29
kfnelf ep_loop_check_proc /tmp/vmlinux-eplc < /tmp/eplc.hex || exit 29
trapctl inspect --mode kernel /tmp/vmlinux-eplc ep_loop_check_proc > /tmp/eplc.txt || exit 30
echo "EPLC_FN=$(addr ep_loop_check_proc)"
echo "EPLC_HEAD=$(sed -n 2p /tmp/eplc.txt)"
echo "EPLC_INSNS=$(insns /tmp/eplc.txt)"
# The self-call's site, and the function's extent for the handler.
self=$(grep -m1 "  call 0x$(addr ep_loop_check_proc)\$" /tmp/eplc.txt | awk '{ print $1 }')
echo "EPLC_SELF_SITE=$self"
set -- $(sed -n '2s/^function `[^`]*` \[\(0x[0-9a-f]*\), \(0x[0-9a-f]*\)).*/\1 \2/p' /tmp/eplc.txt)
trapctl load /components/rprec.o > /dev/null || exit 31
trapctl set rprec_top $((ep_depth - 1)) > /dev/null || exit 32
trapctl set rprec_self "$1" > /dev/null || exit 33
trapctl set rprec_self_end "$2" > /dev/null || exit 34

# `epnest_run FILE`: start epnest, its output to FILE, and wait until its chain is built.
epnest_run() {
	/bin/epnest $ep_depth $ep_adds > "$1" &
	ep=$!
	settle "$1"
}

# A return handler (trap) checking each return's depth, and a count of the self-calls.
epnest_run /tmp/ep1
echo "EP_SPLICE=$(trapctl splice ep_loop_check_proc --return --call rprec_ret 2>&1)"
echo "EP_SPLICE_SELF=$(trapctl splice "$self" --count 2>&1)"
kill -USR1 $ep
wait $ep
echo "EP_RC=$?"
echo "EP=$(sed 1d /tmp/ep1)"
echo "EP_LIST=$(trapctl list --json | squash)"
for v in calls match inner depth_sum; do
	echo "EP_$v=$(trapctl get rprec_$v)"
done
trapctl unsplice "$self" > /dev/null || exit 35
trapctl unsplice ep_loop_check_proc > /dev/null || exit 36
trapctl unload rprec > /dev/null || exit 37

# A counting return point and the self-call count, both by jmp. The self-call's first: a
# function is decoded from its current text, and the entry's jmp (over `push r14` and 3 bytes
# of the next mov) leaves bytes behind it that do not decode, so a later splice past it is
# refused ("could not be decoded"); the call's jmp covers the call exactly.
epnest_run /tmp/ep2
echo "EP_SPLICE_SELF_JMP=$(trapctl splice "$self" --count --mechanism jmp 2>&1)"
echo "EP_SPLICE_JMP=$(trapctl splice ep_loop_check_proc --return --count --mechanism jmp 2>&1)"
kill -USR1 $ep
wait $ep
echo "EP_JMP_RC=$?"
echo "EP_JMP_LIST=$(trapctl list --json | squash)"
trapctl unsplice "$self" > /dev/null || exit 38
trapctl unsplice ep_loop_check_proc > /dev/null || exit 39

# maxactive 2 under a recursion 4 deep: the two outer calls of each add take instances, the two
# inner ones are missed (and return as usual).
epnest_run /tmp/ep4
trapctl splice ep_loop_check_proc --return --count --maxactive 2 > /dev/null || exit 42
kill -USR1 $ep
wait $ep
echo "EP_MAX_RC=$?"
echo "EP_MAX_LIST=$(trapctl list --json | squash)"
trapctl unsplice ep_loop_check_proc > /dev/null || exit 43

# A timer: every nested call is timed on its own.
epnest_run /tmp/ep3
trapctl time ep_loop_check_proc --seconds 3 --json > /tmp/eptime &
tp=$!
settle /tmp/eptime
kill -USR1 $ep
wait $ep
echo "EP_TIME_EP_RC=$?"
wait $tp
echo "EP_TIME_RC=$?"
echo "EP_TIME=$(sed 1d /tmp/eptime | squash)"
trapctl read ep_loop_check_proc > /tmp/eplc.after
cmp -s /tmp/eplc.after /tmp/eplc.hex && echo "EPLC_RESTORED=yes" || echo "EPLC_RESTORED=no"

# --- 4. Removal while a task sleeps inside the function.
trapctl splice hrtimer_nanosleep --return --count > /dev/null || exit 18
/bin/naps 8000 1 > /tmp/nap &
np=$!
# A sleep of our own (1 s) inside the function too; it returns before the removal.
sleep 1
echo "LIST_SLEEPING=$(trapctl list --json | squash)"
# Its kernel stack: the unwinder meets the stub as hrtimer_nanosleep's return address and stops.
echo "STACK_SLEEPING=$(cut -d' ' -f2 /proc/$np/stack | cut -d+ -f1 | tr '\n' ' ')"
trapctl unsplice hrtimer_nanosleep > /dev/null
echo "UNSPLICE_RC=$?"
if rmmod trapvec 2> /tmp/rmmod; then
	echo "RMMOD_DURING=removed"
else
	echo "RMMOD_DURING=refused $(cat /tmp/rmmod)"
fi
# The test's premise: the nap was still inside when rmmod ran (TCG on a loaded host is slow).
kill -0 $np 2> /dev/null && echo "NAP_INSIDE_AT_RMMOD=yes" || echo "NAP_INSIDE_AT_RMMOD=no"
echo "RMMOD_DURING_REFCNT=$(cat /sys/module/trapvec/refcnt 2> /dev/null)"
wait $np
echo "NAP_RC=$?"
echo "NAP=$(cat /tmp/nap)"
# The module lets itself go within a fifth of a second once nothing can return into it.
n=0
until rmmod trapvec 2> /dev/null; do
	n=$((n + 1))
	[ $n -ge 50 ] && break
	usleep 100000
done
grep -q '^trapvec ' /proc/modules && echo "RMMOD_AFTER=refused" || echo "RMMOD_AFTER=removed"
echo "RETURNS=done"
