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
# Files (vmtest --file): tv_idle_poll.ko; optionally another trapvec.ko to test instead of the
# packed one (tv_rcu_idle.module=NAME on the kernel command line).
# Knobs: tv_rcu_idle.cycles=N removal cycles (default 30).
# Prints KEY=value lines that vmtest/tests/kernel_rcu_idle.rs checks.
set -u

knob() { sed -n "s/.*tv_rcu_idle\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
module=$(knob module)
cycles=$(knob cycles)
cycles=${cycles:-30}
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi
traps() { awk -v k="$1" '$1 == k { print $2 }' /sys/module/trapvec/parameters/traps 2>/dev/null; }
# Only the poll state (1) or every state (0) on both CPUs.
poll_only() { for d in /sys/devices/system/cpu/cpu*/cpuidle/state1/disable; do echo "$1" > "$d"; done; }

insmod /files/tv_idle_poll.ko || exit 11
echo "DRIVER=$(cat /sys/devices/system/cpu/cpuidle/current_driver)"
trapctl load /components/tv_rcu_watch.o > /dev/null || exit 12
idle0=$(traps rcu_idle)
trapctl splice cpuidle_poll_time --call tv_rcu_watch || exit 13
poll_only 1
sleep 2
poll_only 0
echo "HITS=$(trapctl list | awk '$1 == "cpuidle_poll_time" { print $(NF-1) }')"
echo "WATCHED=$(trapctl get tv_rcu_watched)"
echo "UNWATCHED=$(trapctl get tv_rcu_unwatched)"
echo "RCU_IDLE=$(( $(traps rcu_idle) - ${idle0:-0} ))"

# Remove and make the splice again while the CPUs poll through it.
poll_only 1
start=$(date +%s)
done=0
while [ "$done" -lt "$cycles" ]; do
	trapctl unsplice cpuidle_poll_time > /dev/null || break
	trapctl splice cpuidle_poll_time --call tv_rcu_watch > /dev/null || break
	done=$((done + 1))
done
poll_only 0
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
