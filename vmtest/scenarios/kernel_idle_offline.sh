#!/bin/sh
# The last gaps of issue 24, in one boot (vmtest/tests/kernel_idle_offline.rs):
#
#  A. A jmp splice's handler in RCU-idle text. tv_idle_poll.ko (vmtest/kmods/idle_poll) gives
#     the guest a poll+halt cpuidle driver; cpuidle_enter_state() enters RCU-idle before
#     poll_idle(), which calls cpuidle_poll_time(). A jmp splice there calls tv_rcu_watch
#     (components/tv_rcu_watch.c), which counts whether RCU was watching: the trampoline must
#     have made it watch (kmod/jmp_rcu.c; counted in parameters/jmp_rcu_idle). Then the splice
#     is removed and made again in a loop while both CPUs poll through it.
#  B. The CPU-offline path after rcu_report_dead(): sites in its functions are refused by name
#     (trap and jmp); then CPU1 goes offline and online in a loop while trap and jmp splices
#     on hotplug- and idle-path functions that are allowed come and go.
#  C. Hidden branch targets in a module (tv_hidden.ko, vmtest/kmods/hidden_mod): jmp windows 1
#     to 4 bytes before its jump-label target and its exception fix-up are refused by name;
#     the key is flipped both ways and both functions are called.
#
# Files (vmtest --file): tv_idle_poll.ko, tv_hidden.ko; optionally another trapvec.ko to test
# instead of the packed one (tv_idle_offline.module=NAME on the kernel command line).
# Knobs: tv_idle_offline.cycles=N removal cycles (default 6), .hotplug=N offline/online
# rounds (default 4). Prints KEY=value lines.
set -u
. /lib/scenario.sh

knob() { sed -n "s/.*tv_idle_offline\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
module=$(knob module)
cycles=$(knob cycles)
cycles=${cycles:-6}
rounds=$(knob hotplug)
rounds=${rounds:-4}
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi
param() { cat "/sys/module/trapvec/parameters/$1" 2>/dev/null || echo 0; }
hits() { trapctl list | awk -v f="$1" '$1 == f { print $(NF-1) }'; }

# --- A. jmp in RCU-idle text.
insmod /files/tv_idle_poll.ko || exit 11
echo "DRIVER=$(cat /sys/devices/system/cpu/cpuidle/current_driver)"
trapctl load /components/tv_rcu_watch.o > /dev/null || exit 12
j0=$(param jmp_rcu_idle)
# From 6.3 on the kernel's poll loop is noinstr text, refused: the jmp goes into tv_idle_spin(),
# which tv_idle_poll's own poll state (2) calls with RCU not watching all the same (as in
# kernel_rcu_idle.sh).
idle_fn=cpuidle_poll_time
poll_state=0
if ! trapctl splice $idle_fn --call tv_rcu_watch --mechanism jmp > /tmp/a.out 2>&1; then
	grep -q 'in noinstr text' /tmp/a.out || { echo "A_SPLICE=$(cat /tmp/a.out)"; exit 13; }
	echo "A_NOINSTR=$(cat /tmp/a.out)"
	idle_fn=tv_idle_spin
	poll_state=2
	trapctl splice $idle_fn --call tv_rcu_watch --mechanism jmp > /tmp/a.out 2>&1 ||
		{ echo "A_SPLICE=$(cat /tmp/a.out)"; exit 13; }
fi
echo "A_POINT=$idle_fn"
echo "A_LISTED=$(trapctl list | grep $idle_fn)"
idle_only $poll_state
sleep 2
idle_usual
echo "A_HITS=$(hits $idle_fn)"
echo "A_WATCHED=$(trapctl get tv_rcu_watched)"
echo "A_UNWATCHED=$(trapctl get tv_rcu_unwatched)"
echo "A_JMP_RCU_IDLE=$(( $(param jmp_rcu_idle) - j0 ))"
idle_only $poll_state
start=$(date +%s)
done=0
while [ "$done" -lt "$cycles" ]; do
	trapctl unsplice $idle_fn > /dev/null || break
	trapctl splice $idle_fn --call tv_rcu_watch --mechanism jmp > /dev/null || break
	done=$((done + 1))
done
idle_usual
echo "A_CYCLES_DONE=$done"
echo "A_CYCLE_SECONDS=$(( $(date +%s) - start ))"
echo "A_UNWATCHED_END=$(trapctl get tv_rcu_unwatched)"
echo "A_JMP_RCU_IDLE_END=$(( $(param jmp_rcu_idle) - j0 ))"
trapctl unsplice --all > /dev/null

# --- B. The CPU-offline path after rcu_report_dead(). Every byte offset of the first 48 of each
# function, by trap and by jmp, planned and checked in one `apply --check`: the points the
# planner takes (instruction boundaries with relocatable windows) reach the module, which must
# refuse each naming the function; none may be accepted.
: > /tmp/dead.toml
fns=
for f in rcu_report_dead rcutree_report_cpu_dead cpuhp_report_idle_dead native_play_dead \
	play_dead_common hlt_play_dead cpuidle_play_dead; do
	grep -q " $f\$" /proc/kallsyms || continue
	fns="$fns $f"
	o=0
	while [ $o -lt 48 ]; do
		for m in trap jmp; do
			printf '[[splice]]\nat = "%s+%d"\naction = "count"\nmechanism = "%s"\n\n' "$f" $o $m >> /tmp/dead.toml
		done
		o=$((o + 1))
	done
done
trapctl apply --check /tmp/dead.toml > /tmp/dead.ok 2> /tmp/dead.err
echo "B_FUNCTIONS=$fns"
echo "B_ACCEPTED_COUNT=$(grep -c '^ok ' /tmp/dead.ok)"
grep '^ok ' /tmp/dead.ok | head -n 3 | sed 's/^/B_ACCEPTED=/'
for f in $fns; do
	echo "B_NAMED_$f=$(grep -c "^refused: $f+[0-9]*: .*in $f, which a CPU going offline runs after rcu_report_dead()" /tmp/dead.err)"
done
hlt=$(grep "^refused: hlt_play_dead+[0-9]*: .*which a CPU going offline" /tmp/dead.err | head -n 1 | sed 's/^refused: \([^:]*\): .*/\1/')
echo "B_HLT_POINT=$hlt"
refuse() { if "$@" > /tmp/out 2> /tmp/err; then echo "UNEXPECTEDLY ACCEPTED"; trapctl unsplice --all > /dev/null; else head -n 1 /tmp/err; fi; }
echo "B_ERR_HLT=$(refuse trapctl splice "${hlt:-hlt_play_dead}" --count)"

# Allowed splices on the hotplug and idle paths, by trap and by jmp, made and removed while
# CPU1 goes offline and online.
trapctl splice $idle_fn --call tv_rcu_watch --mechanism jmp > /dev/null || echo "B_SPLICE_FAILED=$idle_fn"
trapctl splice cpuhp_invoke_callback --count > /dev/null || echo "B_SPLICE_FAILED=cpuhp_invoke_callback"
idle_only $poll_state
cpu1=/sys/devices/system/cpu/cpu1/online
round=0
ok=0
start=$(date +%s)
while [ "$round" -lt "$rounds" ]; do
	echo 0 > $cpu1 || break
	if [ $((round % 2)) -eq 0 ]; then
		trapctl splice smp_call_function_single --count --mechanism jmp > /dev/null &&
			trapctl splice tick_nohz_idle_stop_tick --count > /dev/null
	else
		trapctl unsplice smp_call_function_single > /dev/null &&
			trapctl unsplice tick_nohz_idle_stop_tick > /dev/null
	fi || echo "B_ROUND_FAILED=$round"
	echo 1 > $cpu1 || break
	trapctl unsplice $idle_fn > /dev/null &&
		trapctl splice $idle_fn --call tv_rcu_watch --mechanism jmp > /dev/null ||
		echo "B_IDLE_CYCLE_FAILED=$round"
	round=$((round + 1))
	ok=$round
done
idle_usual
echo "B_ROUNDS=$ok"
echo "B_SECONDS=$(( $(date +%s) - start ))"
echo "B_CPU1_ONLINE=$(cat $cpu1)"
echo "B_CALLBACK_HITS=$(hits cpuhp_invoke_callback)"
echo "B_IDLE_HITS=$(hits $idle_fn)"
echo "B_UNWATCHED=$(trapctl get tv_rcu_unwatched)"
trapctl unsplice --all > /dev/null && echo "B_UNSPLICED=yes"
trapctl unload tv_rcu_watch > /dev/null

# --- C. Hidden branch targets in a module.
insmod /files/tv_hidden.ko || exit 14
targets=$(cat /sys/module/tv_hidden/parameters/targets)
echo "C_TARGETS=$targets"
accepted=0
: > /tmp/c.err
for t in $targets; do
	fn=${t%%+*}
	off=${t#*+}
	d=1
	while [ $d -le 4 ] && [ $d -lt "$off" ]; do
		if trapctl splice "$fn+$((off - d))" --count --mechanism jmp > /dev/null 2>> /tmp/c.err; then
			accepted=$((accepted + 1))
			echo "C_ACCEPTED=$fn+$((off - d))"
			trapctl unsplice "$fn+$((off - d))" > /dev/null
		fi
		d=$((d + 1))
	done
done
echo "C_ACCEPTED_COUNT=$accepted"
echo "C_ERR_JUMP=$(grep 'jump-label target of static key' /tmp/c.err | head -n 1)"
echo "C_ERR_FIXUP=$(grep 'exception fixup of ' /tmp/c.err | head -n 1)"
P=/sys/module/tv_hidden/parameters
echo 1 > $P/run
echo "C_RESULT_ON=$(cat $P/result)"
echo 0 > $P/key
echo 1 > $P/run
echo "C_RESULT_OFF=$(cat $P/result)"
echo 1 > $P/key
echo 1 > $P/run
echo "C_RESULT_BACK=$(cat $P/result)"

echo "RCU_COMPLAINTS=$(dmesg | grep -c -e 'suspicious RCU usage' -e 'RCU used illegally' -e 'rcu_sched self-detected stall' -e 'rcu: INFO')"
dmesg | grep -q -e 'BUG:' -e 'Oops' -e 'WARNING:' -e 'Call Trace' && { echo "DMESG_CLEAN=no"; dmesg | tail -n 40; } || echo "DMESG_CLEAN=yes"
rmmod trapvec && echo "RMMOD=yes"
echo "IDLE_OFFLINE_DONE"
