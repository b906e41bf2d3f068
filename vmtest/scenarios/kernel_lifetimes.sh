#!/bin/sh
# Lifetimes (issue 9, item 6): nothing is freed while a task may still run in it or return
# into it.
#  1. module init text: a module whose init is still running (/files/slowinit.ko, released
#     through its parameter) has its init text refused as such and its core text refused until
#     init returns;
#  2. module references: a patch of module text (sch_netem) keeps the module loaded while it is
#     live, and after its revert until a QUIESCE; `trapctl unsplice` lets it go;
#  3. a replacement that sleeps 2 s (components/sleepy.c, sleepy_decl.c, replacing
#     __x64_sys_getppid; the call made by /bin/slowcall): `trapctl unsplice`, `trapctl unload`
#     of its component and `rmmod trapvec` during the sleep each wait for the task to leave; the
#     call returns the replacement's result and the original bytes come back;
#  3d. a removal that gives up waiting (`--wait 0.5` against a 5 s sleep) leaves the splice
#     retiring, and the same unsplice, or an unload of its component, finishes it later.
# /files/tvraw makes raw requests (vmtest/tests/fixtures/tvraw.c). Prints KEY=value lines that
# vmtest/tests/kernel_lifetimes.rs checks; vmtest fails the run on any oops or warning.
set -u
TV=/files/tvraw

. /lib/scenario.sh

# `at SYMBOL OFFSET`: hex address of SYMBOL+OFFSET.
at() {
	printf '%x' $((0x$(addr "$1") + $2))
}

reason() {
	sed -n 's/.*reason=\([0-9]*\).*/\1/p'
}

# `wait_for CMD...`: up to 10 s until CMD succeeds.
wait_for() {
	n=0
	until "$@"; do
		n=$((n + 1))
		[ $n -ge 100 ] && return 1
		usleep 100000
	done
}

grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10
trapctl read __x64_sys_getppid 16 > /tmp/orig || exit 11

# --- 1. Module init text, while insmod waits in the module's init (until we release it).
insmod /files/slowinit.ko &
insmod_pid=$!
slowsyms() {
	grep '\[slowinit\]' /proc/kallsyms > /tmp/slowsyms && grep -q ' slowinit_init	' /tmp/slowsyms
}
wait_for slowsyms || echo "INIT_SYMBOL=missing"
sym() {
	awk -v n="$1" '$3 == n { print $1; exit }' /tmp/slowsyms
}
# The first instruction past the entry (+5, or +9 behind 6.12's endbr64).
core=$(printf "%x" $((0x$(sym slowinit_core) + $(entry_len "0x$(sym slowinit_core)"))))
echo "STATE_COMING=$(cat /sys/module/slowinit/initstate 2> /dev/null)"
echo "R_INIT=$($TV check "$(sym slowinit_init)" 1 | reason)"
echo "R_CORE_COMING=$($TV check "$core" 1 | reason)"
echo "STATE_STILL=$(cat /sys/module/slowinit/initstate 2> /dev/null)"
echo 1 > /sys/module/slowinit/parameters/release
wait $insmod_pid
echo "INSMOD_RC=$?"
echo "STATE_LIVE=$(cat /sys/module/slowinit/initstate)"
echo "R_CORE_LIVE=$($TV check "$core" 1 | reason)"
grep -q ' slowinit_init	\[slowinit\]' /proc/kallsyms && echo "INIT_AFTER=listed" || echo "INIT_AFTER=gone"
rmmod slowinit

# --- 2. Module references of patches of module text.
modprobe sch_netem || exit 12
site=
# Its own functions (netem_*): helpers it shares a name with vmlinux (6.12's qdisc_peek_dequeued)
# would resolve to the core kernel's copy.
for sym in $(awk '$4 == "[sch_netem]" && ($2 == "t" || $2 == "T") && $3 ~ /^netem_/ { print $3 }' /proc/kallsyms); do
	e=$(entry_len "$sym")
	s=$(at "$sym" "$e")
	if [ "$($TV check "$s" 1 | reason)" = 0 ]; then
		site=$s
		netem_sym=$sym
		netem_point=$sym+$e
		break
	fi
done
[ -n "$site" ] || exit 13
echo "NETEM_SITE=$netem_point"
refcnt() {
	cat /sys/module/sch_netem/refcnt
}
# `rmmod_try NAME`: removed or refused.
rmmod_try() {
	if rmmod "$1" 2> /dev/null; then echo removed; else echo refused; fi
}
echo "REF_BEFORE=$(refcnt)"
echo "TOUCH_APPLY=$($TV touch "$site" 1)"
echo "REF_LIVE=$(refcnt)"
echo "RMMOD_LIVE=$(rmmod_try sch_netem)"
echo "TOUCH_REVERT=$($TV touch "$site" 1)"
echo "REF_REVERTED=$(refcnt)"
echo "RMMOD_REVERTED=$(rmmod_try sch_netem)"
echo "QUIESCE=$($TV quiesce)"
echo "REF_QUIESCED=$(refcnt)"
echo "RMMOD_QUIESCED=$(rmmod_try sch_netem)"
# The same through trapctl: unsplice quiesces.
modprobe sch_netem || exit 14
trapctl splice "$netem_point" --count > /dev/null || exit 15
echo "RMMOD_SPLICED=$(rmmod_try sch_netem)"
trapctl unsplice "$netem_point" > /dev/null || exit 16
echo "RMMOD_UNSPLICED=$(rmmod_try sch_netem)"

# --- 3. A replacement that sleeps 2 s.
same_bytes() {
	trapctl read __x64_sys_getppid 16 > /tmp/now && cmp -s /tmp/orig /tmp/now && echo same || echo changed
}
entered() {
	[ "$(trapctl get sleepy_entered --size 8)" = 1 ]
}

# 3a. trapctl unsplice during the sleep: waits for the task to leave.
trapctl load /components/sleepy.o > /dev/null || exit 20
trapctl splice __x64_sys_getppid --replace sleepy_getppid > /dev/null || exit 21
slowcall > /tmp/call1 &
call_pid=$!
wait_for entered || echo "ENTERED=no"
t0=$(ms)
trapctl unsplice __x64_sys_getppid > /tmp/unsplice 2>&1
echo "UNSPLICE_RC=$?"
t1=$(ms)
echo "UNSPLICE_MS=$((t1 - t0))"
cat /tmp/unsplice
echo "LEFT_AT_UNSPLICE=$(trapctl get sleepy_left --size 8)"
wait $call_pid
echo "CALL_UNSPLICE=$(cat /tmp/call1)"
echo "BYTES_UNSPLICE=$(same_bytes)"
echo "CALL_AFTER=$(slowcall)"
trapctl unload sleepy > /dev/null || exit 22

# 3d. A removal that gives up and is finished later. The replacement sleeps 5 s; `trapctl
# unsplice --wait 0.5` during the sleep restores the bytes, fails naming the trampoline block, and
# leaves the splice retiring (listed as such, its code kept); after the call has returned, the same
# unsplice finishes the job. Then once more, finished by `trapctl unload` of the component.
retry_round() {
	trapctl splice __x64_sys_getppid --replace sleepy_getppid > /dev/null || exit 27
	trapctl set sleepy_ms 5000 > /dev/null || exit 28
	slowcall > /tmp/call_retry &
	call_pid=$!
	wait_for entered || echo "RETRY_ENTERED=no"
	trapctl unsplice __x64_sys_getppid --wait 0.5 > /tmp/retry 2>&1
	echo "RETRY_$1_FIRST_RC=$?"
	echo "RETRY_$1_FIRST=$(head -n 1 /tmp/retry)"
	echo "RETRY_$1_BYTES_RETIRING=$(same_bytes)"
	trapctl list > /tmp/list 2>&1
	echo "RETRY_$1_LISTED=$(grep -c '^retiring: __x64_sys_getppid at ' /tmp/list)"
	wait $call_pid
	echo "RETRY_$1_CALL=$(cat /tmp/call_retry)"
}
trapctl load /components/sleepy.o > /dev/null || exit 26
retry_round UNSPLICE
trapctl unsplice __x64_sys_getppid > /tmp/retry 2>&1
echo "RETRY_UNSPLICE_SECOND_RC=$?"
echo "RETRY_UNSPLICE_SECOND=$(head -n 1 /tmp/retry)"
echo "RETRY_UNSPLICE_BYTES=$(same_bytes)"
trapctl list > /tmp/list 2>&1
echo "RETRY_UNSPLICE_LEFT=$(grep -c '^retiring:' /tmp/list)"
echo "RETRY_UNSPLICE_CALL_AFTER=$(slowcall)"
trapctl set sleepy_entered 0 > /dev/null
retry_round UNLOAD
trapctl unload sleepy > /tmp/retry 2>&1
echo "RETRY_UNLOAD_SECOND_RC=$?"
echo "RETRY_UNLOAD_SECOND=$(head -n 1 /tmp/retry)"
echo "RETRY_UNLOAD_BYTES=$(same_bytes)"
echo "RETRY_UNLOAD_LIST=$(trapctl list | tr '\n' ' ')"

# 3b. trapctl unload of the component (its declared splice goes with it) during the sleep.
trapctl load /components/sleepy_decl.o > /dev/null || exit 23
slowcall > /tmp/call2 &
call_pid=$!
sleep 1
t0=$(ms)
trapctl unload sleepy_decl > /tmp/unload 2>&1
echo "UNLOAD_RC=$?"
t1=$(ms)
echo "UNLOAD_MS=$((t1 - t0))"
cat /tmp/unload
wait $call_pid
echo "CALL_UNLOAD=$(cat /tmp/call2)"
echo "BYTES_UNLOAD=$(same_bytes)"

# 3c. rmmod trapvec during the sleep: the module's exit waits (the arena is its own text).
trapctl load /components/sleepy_decl.o > /dev/null || exit 24
slowcall > /tmp/call3 &
call_pid=$!
sleep 1
t0=$(ms)
rmmod trapvec
echo "RMMOD_RC=$?"
t1=$(ms)
echo "RMMOD_MS=$((t1 - t0))"
wait $call_pid
echo "CALL_RMMOD=$(cat /tmp/call3)"
insmod /trapvec.ko || exit 25
echo "BYTES_RMMOD=$(same_bytes)"
echo "CALL_RELOADED=$(slowcall)"

dmesg | grep -q -e 'BUG:' -e 'Oops' -e 'Call Trace' -e 'WARNING:' && echo "OOPS=yes" || echo "OOPS=no"
dmesg | grep trapvec | tail -n 20
echo "LIFETIMES=done"
