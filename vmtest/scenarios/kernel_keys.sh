#!/bin/sh
# Keyed counts in the kernel (issue 12, item 4): `trapctl count FN --by KEY`.
#  1. by comm, trap and jmp: two programs named getppid_a and getppid_b (copies of
#     /bin/ppidloop) call getppid an exact number of times each while the count runs;
#  2. by tid (trap) and by pid (jmp): two ppidloops, each thread under its own tid (the task's
#     pid), each process under its pid (the task's tgid); by cpu (trap): two threads pinned to
#     the two CPUs;
#  3. overflow: `trapctl splice --count --by tgid` (the old spelling of pid: a warning, then a
#     count by process) while 600 short-lived processes call getppid (more pids than the two
#     CPUs' tables of 256 hold), `trapctl list` shows the table as `by pid`;
#  4. through trapd: the same count by requests (trapd's list rows carry the table);
#  5. cost: a keyed count's hit beside a plain count's (fastest of 5 rounds, emulated: ratio);
#  6. every byte of __x64_sys_getppid back, and the module unloads (no slot pins it).
# First, raw requests (/files/tvraw keys): unknown keys refused, all 64 slots and one more
# (ENOSPC), the module's reference on itself while slots live, stale slots refused, all freed.
# Prints KEY=value lines that vmtest/tests/kernel_keys.rs checks (JSON squashed to one line);
# vmtest fails the run on any oops or warning.
set -u

. /lib/scenario.sh

squash() {
	tr -d '\n '
}

# `counting OUT`: wait until the count writing OUT is live.
counting() {
	until grep -q '^counting' "$1" 2> /dev/null; do usleep 50000; done
}

fn=__x64_sys_getppid
grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10
echo "RAW_KEYS=$(/files/tvraw keys)"
cp /bin/ppidloop /bin/getppid_a && cp /bin/ppidloop /bin/getppid_b || exit 11
trapctl read $fn > /tmp/before.hex || exit 12

# --- 1. By comm, trap and jmp. Each ppidloop makes -n calls and one to learn the answer.
for mech in trap jmp; do
	trapctl count $fn --by comm --mechanism $mech --seconds 6 --json > /tmp/comm_$mech &
	cp=$!
	counting /tmp/comm_$mech
	/bin/getppid_a -n 3000 > /tmp/a &
	pa=$!
	/bin/getppid_b -n 2000 > /tmp/b
	wait $pa
	echo "COMM_${mech}_A=$(cat /tmp/a)"
	echo "COMM_${mech}_B=$(cat /tmp/b)"
	wait $cp
	echo "COMM_${mech}_RC=$?"
	echo "COMM_${mech}=$(sed 1d /tmp/comm_$mech | squash)"
done
# The text form, once: the top key as bpftrace prints it, the rest summed, the totals line.
trapctl count $fn --by comm --top 1 --seconds 5 > /tmp/comm_text &
cp=$!
counting /tmp/comm_text
/bin/getppid_a -n 300 > /dev/null &
pa=$!
/bin/getppid_b -n 200 > /dev/null
wait $pa
wait $cp
cat /tmp/comm_text
echo "COMM_TEXT=$(sed 1d /tmp/comm_text | tr '\n' '|')"

# --- 2. By tid (trap), then by pid (jmp): a ppidloop's main thread makes the first call, its
# worker thread the -n others, each under its own tid but one pid (the process). By cpu (trap):
# one thread pinned to each CPU.
for by in tid pid; do
	[ $by = tid ] && mech=trap || mech=jmp
	trapctl count $fn --by $by --mechanism $mech --seconds 6 --json > /tmp/$by &
	cp=$!
	counting /tmp/$by
	/bin/ppidloop -n 1500 > /tmp/p1 &
	p1=$!
	/bin/ppidloop -n 700 > /tmp/p2 &
	p2=$!
	wait $p1
	wait $p2
	echo "${by}_P1=$p1 $(cat /tmp/p1)"
	echo "${by}_P2=$p2 $(cat /tmp/p2)"
	wait $cp
	echo "${by}_RC=$?"
	echo "${by}=$(sed 1d /tmp/$by | squash)"
done

trapctl count $fn --by cpu --seconds 6 --json > /tmp/cpu &
cp=$!
counting /tmp/cpu
echo "CPU_LOOP=$(/bin/ppidloop -t 2 -n 1000)"
wait $cp
echo "CPU_RC=$?"
echo "CPU=$(sed 1d /tmp/cpu | squash)"

# --- 3. Overflow: 600 processes, each calling getppid twice, over two CPUs' tables of 256.
# Spelled `tgid`, the old name of the process key: one warning on stderr, a count by pid.
echo "SPLICE_BY=$(trapctl splice $fn --count --by tgid 2> /tmp/tgid_err)"
echo "SPLICE_BY_WARNING=$(cat /tmp/tgid_err)"
i=0
while [ $i -lt 600 ]; do
	/bin/ppidloop -n 1 > /dev/null || echo "SHORT_FAILED=$i"
	i=$((i + 1))
done
echo "OVERFLOW_LIST=$(trapctl list --json | squash)"
echo "OVERFLOW_TEXT=$(trapctl list | grep '  by pid')"
echo "OVERFLOW_UNSPLICE=$(trapctl unsplice $fn 2>&1)"

# --- 4. Through trapd: made, read and removed by requests.
start_trapd
trapctl count $fn --by comm --seconds 5 --json > /tmp/td &
cp=$!
counting /tmp/td
/bin/getppid_b -n 1200 > /tmp/b
echo "TRAPD_B=$(cat /tmp/b)"
wait $cp
echo "TRAPD_RC=$?"
echo "TRAPD=$(sed 1d /tmp/td | squash)"
echo "TRAPD_LEFT=$(trapd send '{"op":"list"}' | squash)"
kill $tdp
wait $tdp

# --- 5. Cost: the fastest of 5 rounds of 100,000 calls, bare, with a plain count, with a count
# by comm (both trap), in microseconds.
calls=100000
rounds=5
measure() {
	case $1 in
	bare) ;;
	plain) trapctl splice $fn --count > /dev/null || exit 30 ;;
	keyed) trapctl splice $fn --count --by comm > /dev/null || exit 31 ;;
	esac
	ns=$(stopwatch /bin/ppidloop -n $calls 2>&1 > /dev/null | sed -n 's/^STOPWATCH_NS=//p')
	echo $((ns / 1000))
	[ "$1" = bare ] || trapctl unsplice $fn > /dev/null || exit 32
}
fastest_rounds COST "bare plain keyed"
echo "COST_CALLS=$calls"
echo "COST_BARE_US=$min_bare"
echo "COST_PLAIN_US=$min_plain"
echo "COST_KEYED_US=$min_keyed"

# --- 6. The text is back, nothing is left, and no slot pins the module.
trapctl read $fn > /tmp/after.hex
if cmp -s /tmp/before.hex /tmp/after.hex; then
	echo "BYTES_RESTORED=yes"
else
	echo "BYTES_RESTORED=no"
	diff /tmp/before.hex /tmp/after.hex
fi
echo "LEFT=$(trapctl list --json | squash)"
echo "REFCNT=$(cat /sys/module/trapvec/refcnt)"
rmmod trapvec 2> /tmp/rmmod && echo "RMMOD=removed" || echo "RMMOD=refused $(cat /tmp/rmmod)"
echo "KEYS=done"
