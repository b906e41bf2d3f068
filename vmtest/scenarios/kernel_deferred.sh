#!/bin/sh
# Points in a module loaded later (issue 31, items 3 and 4): trapd holds pending points in
# tv_modcalls (vmtest/kmods/modcalls), whose init calls tv_modcalls_work() and
# tv_modcalls_timed() N times each and whose exit calls tv_modcalls_work() twice more.
#  1. Without trapd, trapctl refuses a point in a module that is not loaded, naming it and trapd.
#  2. Through trapd: a pending count on tv_modcalls_work and a pending timer on
#     tv_modcalls_timed, listed as pending; then insmod/rmmod cycles: each load is armed before
#     init (the module notifier holds the load for trapd), each removal after exit; the counts
#     add up to exactly (N + 2) and N per load; afterwards the module's counters (live patches,
#     dispatch entries, arena bytes, allocations) are back at their baseline.
#  3. A pending point that names no function: reported (trapctl list, trapd's journal, dmesg),
#     and the module loads all the same; with `require`, the load is refused (insmod fails) and
#     nothing of ours stays in its text.
#  4. trapd killed while the module is armed: rmmod still leaves nothing behind (the notifier
#     removes the sites itself and says so in dmesg).
# Files (vmtest --file): trapd, tv_modcalls.ko, tvraw. Knob: tv_deferred.cycles=N (default 1000).
# Prints KEY=value lines that vmtest/tests/kernel_deferred.rs checks (JSON squashed to one line).
set -u

. /lib/scenario.sh

knob() { sed -n "s/.*tv_deferred\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
cycles=$(knob cycles)
cycles=${cycles:-1000}
calls=5
echo "CYCLES=$cycles"
echo "CALLS=$calls"

squash() { tr -d '\n '; }
# What must come back to its baseline: INFO's counts and the allocations but the state blob
# (trapd stores its state) and one-ioctl scratch.
# One line: INFO's counts, " | ", the allocations (after a QUIESCE: freed blocks reclaimed).
counters() {
	/files/tvraw quiesce > /dev/null
	printf '%s | %s\n' "$(/files/tvraw info | sed 's/ unknown=.*//')" \
		"$(grep -v -e '^state ' -e '^scratch ' /sys/module/trapvec/parameters/allocations | tr '\n' ';')"
}
# `hits AT`: the pending point AT's hits over every load, from trapd's list.
hits() {
	trapd send '{"op":"list"}' | squash | sed 's/},{/}\n{/g' | grep "\"at\":\"$1\"" |
		sed -n 's/.*"hits":\([0-9]*\).*/\1/p' | head -n 1
}
work=tv_modcalls:tv_modcalls_work
timed=tv_modcalls:tv_modcalls_timed

# 1. The direct path.
refuse DIRECT trapctl splice "$work" --count

# 2. Pending points through trapd.
start_trapd
echo "PEND_COUNT=$(trapd send '{"op":"splice","at":"'$work'","action":"count"}' | squash)"
echo "PEND_TIME=$(trapd send '{"op":"splice","at":"'$timed'","action":"time"}' | squash)"
echo "LIST_BEFORE=$(TRAPD_SOCKET=/run/trapd.sock trapctl list | grep 'pending point' | tr '\n' '|')"
echo "BASELINE=$(counters)"

start=$(date +%s)
i=1
while [ "$i" -le "$cycles" ]; do
	t0=$(cut -d' ' -f1 /proc/uptime)
	insmod /files/tv_modcalls.ko calls=$calls || { echo "INSMOD_FAILED=$i"; exit 31; }
	t1=$(cut -d' ' -f1 /proc/uptime)
	if [ "$i" = 1 ]; then
		echo "LIST_LOADED=$(TRAPD_SOCKET=/run/trapd.sock trapctl list | grep 'pending point' | tr '\n' '|')"
	fi
	t2=$(cut -d' ' -f1 /proc/uptime)
	rmmod tv_modcalls || { echo "RMMOD_FAILED=$i"; exit 32; }
	t3=$(cut -d' ' -f1 /proc/uptime)
	if [ "$i" -le 3 ]; then
		echo "TIMES_$i=insmod $t0..$t1 rmmod $t2..$t3"
		[ "$i" = 1 ] && echo "FIRST=$(counters)"

		echo "CYCLE_$i=$(hits "$work") $(hits "$timed")"
	fi
	i=$((i + 1))
done
echo "CYCLE_SECONDS=$(($(date +%s) - start))"
echo "WORK_HITS=$(hits "$work")"
echo "TIMED_HITS=$(hits "$timed")"
echo "AFTER=$(counters)"

# 3. An invalid pending point: reported, the module loads; required, the load is refused.
nothere=tv_modcalls:tv_modcalls_nothere
echo "PEND_BAD=$(trapd send '{"op":"splice","at":"'$nothere'","action":"count"}' | squash)"
dmesg -c > /dev/null
if insmod /files/tv_modcalls.ko calls=$calls; then echo "BAD_LOAD=loaded"; else echo "BAD_LOAD=refused"; fi
echo "LIST_BAD=$(TRAPD_SOCKET=/run/trapd.sock trapctl list | grep "$nothere" | tr '\n' '|')"
echo "JOURNAL_BAD=$(grep -c 'pending point: .*tv_modcalls_nothere' /var/lib/trapd/journal)"
echo "DMESG_BAD=$(dmesg | grep -c 'pending point tv_modcalls:tv_modcalls_nothere cannot be made')"
rmmod tv_modcalls
echo "WORK_HITS_BAD=$(hits "$work")"
echo "REQUIRE=$(trapd send '{"op":"require","module":"tv_modcalls"}' | squash)"
dmesg -c > /dev/null
if insmod /files/tv_modcalls.ko calls=$calls 2> /tmp/insmod.err; then
	echo "REQUIRED_LOAD=loaded"
	rmmod tv_modcalls
else
	echo "REQUIRED_LOAD=refused: $(head -n 1 /tmp/insmod.err)"
fi
echo "REQUIRED_DMESG=$(dmesg | grep -c 'module tv_modcalls refused')"
echo "REQUIRED_LSMOD=$(grep -c '^tv_modcalls ' /proc/modules)"
echo "AFTER_REFUSED=$(counters)"
echo "WORK_HITS_REFUSED=$(hits "$work")"

# 4. trapd gone while the module is armed: the kernel cleans up at rmmod.
trapd send '{"op":"unsplice","at":"'$nothere'"}' > /dev/null
insmod /files/tv_modcalls.ko calls=$calls || exit 33
echo "ARMED=$(/files/tvraw info | sed 's/ unknown=.*//')"
kill -9 "$tdp"
wait "$tdp" 2> /dev/null
dmesg -c > /dev/null
rmmod tv_modcalls || exit 34
echo "ORPHAN_DMESG=$(dmesg | grep 'module tv_modcalls is going' | head -n 1)"
echo "ORPHAN_INFO=$(/files/tvraw info | sed 's/ unknown=.*//')"
grep -e 'module tv_modcalls' /tmp/trapd.log | head -n 6
echo "DEFERRED_DONE=1"
