#!/bin/sh
# A trap taken where RCU is not watching (issue 24 item 2). The QEMU TCG guest has no cpuidle
# driver (its idle loop only halts, in noinstr text), so tv_idle_poll.ko (vmtest/kmods/idle_poll)
# registers poll and halt states as cpuidle-haltpoll does in KVM guests. cpuidle_enter_state()
# then enters RCU-idle before poll_idle(), which calls cpuidle_poll_time(): a trap splice there
# calls tv_rcu_watch (components/tv_rcu_watch.c), which counts whether RCU was watching when
# it ran. trapvec's dispatcher must make RCU watch first (and count such traps as rcu_idle in
# /sys/module/trapvec/parameters/traps). Then the splice is removed and made again in a loop
# while both CPUs poll in idle through it (the halt state disabled): every removal's grace
# periods and QUIESCE must wait for the idle CPUs; no oops (vmtest), no RCU complaint.
# From 6.3 on the kernel's poll loop is noinstr text, refused (printed as NOINSTR): the trap
# goes into tv_idle_spin(), called by the module's own poll state with RCU not watching.
# Files (vmtest --file): tv_idle_poll.ko; optionally another trapvec.ko to test instead of the
# packed one (tv_rcu_idle.module=NAME on the kernel command line).
# Knobs: tv_rcu_idle.cycles=N removal cycles (default 30).
# Prints KEY=value lines that vmtest/tests/kernel_rcu_idle.rs checks.
set -u
. /lib/scenario.sh

knob() { sed -n "s/.*tv_rcu_idle\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
module=$(knob module)
cycles=$(knob cycles)
cycles=${cycles:-30}
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi
traps() { awk -v k="$1" '$1 == k { print $2 }' /sys/module/trapvec/parameters/traps 2>/dev/null; }

insmod /files/tv_idle_poll.ko || exit 11
echo "DRIVER=$(cat /sys/devices/system/cpu/cpuidle/current_driver)"
trapctl load /components/tv_rcu_watch.o > /dev/null || exit 12
idle0=$(traps rcu_idle)
# The kernel's poll loop is noinstr from 6.3 on, where trapvec refuses it: there the trap goes
# into tv_idle_poll's own poll loop (state 2), which runs with RCU not watching all the same.
fn=cpuidle_poll_time
poll=0
if ! trapctl splice $fn --call tv_rcu_watch 2> /tmp/err; then
	grep -q 'in noinstr text' /tmp/err || { cat /tmp/err; exit 13; }
	echo "NOINSTR=$(cat /tmp/err)"
	fn=tv_idle_spin
	poll=2
	trapctl splice $fn --call tv_rcu_watch || exit 13
fi
echo "POINT=$fn"
idle_only $poll
sleep 2
idle_usual
echo "HITS=$(trapctl list | awk -v f=$fn '$1 == f { print $(NF-1) }')"
echo "WATCHED=$(trapctl get tv_rcu_watched)"
echo "UNWATCHED=$(trapctl get tv_rcu_unwatched)"
echo "RCU_IDLE=$(( $(traps rcu_idle) - ${idle0:-0} ))"

# Remove and make the splice again while the CPUs poll through it.
idle_only $poll
start=$(date +%s)
done=0
while [ "$done" -lt "$cycles" ]; do
	trapctl unsplice $fn > /dev/null || break
	trapctl splice $fn --call tv_rcu_watch > /dev/null || break
	done=$((done + 1))
done
idle_usual
echo "CYCLES_DONE=$done"
echo "CYCLE_SECONDS=$(( $(date +%s) - start ))"
echo "UNWATCHED_END=$(trapctl get tv_rcu_unwatched)"
echo "RCU_IDLE_END=$(( $(traps rcu_idle) - ${idle0:-0} ))"
trapctl unsplice --all > /dev/null && echo "UNSPLICED=yes"
trapctl unload tv_rcu_watch > /dev/null && echo "UNLOADED=yes"
echo "QUIESCE=$(/files/tvraw quiesce)"
echo "RCU_COMPLAINTS=$(dmesg | grep -c -e 'suspicious RCU usage' -e 'RCU used illegally' -e 'rcu_sched self-detected stall' -e 'rcu: INFO')"
rmmod trapvec && echo "RMMOD=yes"
echo "RCU_IDLE_DONE"
