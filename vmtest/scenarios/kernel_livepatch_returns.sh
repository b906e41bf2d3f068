#!/bin/sh
# Return points keep livepatch's consistency (issue 24 item 4). With a return point on
# do_nanosleep(), a task sleeping in clock_nanosleep() has its return address replaced by a
# trapvec stub: a stack walk stops there, and common_nsleep() and hrtimer_nanosleep() above it
# are hidden. tv_lp_nsleep.ko (vmtest/kmods/lp_nsleep) livepatches common_nsleep(): its
# transition must not switch the sleeper (the walk is unreliable), so it stays 1 while the
# sleeper sleeps, and reaches 0 once the sleeper is killed. Then the new function runs, the
# patch is disabled and removed, and the return point comes off.
# Files (vmtest --file): tv_lp_nsleep.ko; optionally another trapvec.ko to test instead of the
# packed one (tv_lp_returns.module=NAME on the kernel command line).
# Prints KEY=value lines that vmtest/tests/kernel_livepatch_returns.rs checks; vmtest fails the
# run on any oops, BUG or WARNING.
set -u

module=$(sed -n 's/.*tv_lp_returns\.module=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi
lp=/sys/kernel/livepatch/tv_lp_nsleep

trapctl splice do_nanosleep --return --count > /dev/null || exit 11
sleep 1000 &
sleeper=$!
usleep 300000
echo "STACK_TOP=$(head -n 1 /proc/$sleeper/stack)"

insmod /files/tv_lp_nsleep.ko || exit 12
seen=""
for i in 1 2 3 4; do
	sleep 1
	seen="$seen$(cat $lp/transition)"
done
echo "TRANSITION_WHILE_SLEEPING=$seen"
echo "SLEEPER_ALIVE=$(kill -0 $sleeper 2>/dev/null && echo yes || echo no)"

kill $sleeper
wait $sleeper 2>/dev/null
waited=0
while [ "$(cat $lp/transition)" != 0 ] && [ "$waited" -lt 20 ]; do
	usleep 250000
	waited=$((waited + 1))
done
echo "TRANSITION_AFTER=$(cat $lp/transition)"
echo "ENABLED=$(cat $lp/enabled)"
# Sleeps from now on go through the new common_nsleep().
calls0=$(cat /sys/module/tv_lp_nsleep/parameters/calls)
usleep 10000
echo "LP_CALLS=$(( $(cat /sys/module/tv_lp_nsleep/parameters/calls) - calls0 ))"

echo 0 > $lp/enabled
waited=0
while [ -d $lp ] && [ "$waited" -lt 40 ]; do
	usleep 250000
	waited=$((waited + 1))
done
rmmod tv_lp_nsleep && echo "LP_RMMOD=yes"
echo "RETURNS=$(trapctl list | awk '$1 == "do_nanosleep" { print $(NF-1) }')"
trapctl unsplice --all > /dev/null && echo "UNSPLICED=yes"
echo "LP_RETURNS_DONE"
