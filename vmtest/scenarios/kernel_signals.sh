#!/bin/sh
# Commands that hold a splice for a while, ended by signals (issue 24, item 13), straight on
# /dev/trapvec and then through trapd:
#  1. `trapctl count` ended by SIGTERM, `trapctl time` by SIGINT (started through sigdfl: a
#     background job starts with SIGINT ignored), `trapctl count --by comm` by SIGHUP: each
#     prints its figures (only ppidloop's calls, --comm: exact), ends by the signal, and leaves
#     `trapctl list` empty; `trapctl cycle` (a test aid) stops between two cycles on SIGTERM;
#  2. `-- COMMAND`: the count lasts while ppidloop runs, and trapctl exits with the command's
#     status;
#  3. SIGKILL: the splice stays, `trapctl list` shows it orphaned with the killed pid, and
#     `trapctl unsplice --orphans` removes it; the same for a kernel `trapctl trace` killed
#     while live: its splice and its component trace_PID, listed orphaned, then removed;
#  4. through trapd: `trapctl time` ended by SIGTERM removes its timer by a request;
#  5. every byte of the function is back.
# Prints KEY=value lines that vmtest/tests/kernel_signals.rs checks (JSON squashed to one line).
set -u

. /lib/scenario.sh

fn=__x64_sys_getppid

squash() {
	tr -d '\n '
}

# `live OUT WORD`: wait until OUT has the line (starting with WORD) that says the splice is live.
live() {
	i=0
	until grep -q "^$2" "$1" 2> /dev/null; do
		i=$((i + 1))
		[ $i -gt 600 ] && { echo "NEVER_LIVE=$1: $(cat "$1")"; exit 20; }
		usleep 50000
	done
}

# `listing`: trapctl list on one line.
listing() {
	trapctl list | tr '\n' '|'
}

grep -q '^trapvec ' /proc/modules || insmod /trapvec.ko || exit 10
trapctl read $fn > /tmp/before.hex || exit 11

# --- 1. Ended by SIGTERM, SIGINT and SIGHUP.
sigdfl trapctl count $fn --comm ppidloop > /tmp/term.out 2> /tmp/term.err &
p=$!
live /tmp/term.out counting
/bin/ppidloop -n 100 > /dev/null
kill -TERM $p
wait $p
echo "TERM_STATUS=$?"
echo "TERM_OUT=$(cat /tmp/term.out /tmp/term.err | tr '\n' '|')"
echo "TERM_LIST=$(listing)"

sigdfl trapctl time $fn --comm ppidloop --json > /tmp/int.out 2> /tmp/int.err &
p=$!
live /tmp/int.out timing
/bin/ppidloop -n 50 > /dev/null
kill -INT $p
wait $p
echo "INT_STATUS=$?"
echo "INT_JSON=$(tail -n +2 /tmp/int.out | squash)"
echo "INT_ERR=$(cat /tmp/int.err)"
echo "INT_LIST=$(listing)"

sigdfl trapctl count $fn --by comm --comm ppidloop > /tmp/hup.out 2> /tmp/hup.err &
p=$!
live /tmp/hup.out counting
/bin/ppidloop -n 20 > /dev/null
kill -HUP $p
wait $p
echo "HUP_STATUS=$?"
echo "HUP_OUT=$(cat /tmp/hup.out /tmp/hup.err | tr '\n' '|')"
echo "HUP_LIST=$(listing)"

# The hidden stress aid `trapctl cycle`: SIGTERM between two cycles.
trapctl cycle $fn --times 1000000 > /tmp/cycle.out 2>&1 &
p=$!
sleep 3
kill -TERM $p
wait $p
echo "CYCLE_STATUS=$?"
echo "CYCLE_OUT=$(cat /tmp/cycle.out)"
echo "CYCLE_LIST=$(listing)"

# --- 2. While a command runs, with its exit status.
trapctl count $fn --comm ppidloop -- /bin/ppidloop -n 30 > /tmp/cmd.out 2>&1
echo "CMD_STATUS=$?"
echo "CMD_OUT=$(cat /tmp/cmd.out | tr '\n' '|')"
trapctl count $fn -- sh -c 'exit 3' > /tmp/cmd3.out 2>&1
echo "CMD3_STATUS=$?"
echo "CMD_LIST=$(listing)"

# --- 3. SIGKILL: an orphan.
trapctl count $fn > /tmp/kill.out 2>&1 &
p=$!
live /tmp/kill.out counting
kill -KILL $p
wait $p
echo "KILL_STATUS=$?"
echo "KILL_PID=$p"
echo "KILL_LIST=$(listing)"
echo "ORPHANS=$(trapctl unsplice --orphans 2>&1 | tr '\n' '|')"
echo "ORPHANS_LIST=$(listing)"

# --- 3b. SIGKILL of a kernel `trapctl trace` (issue 29): its splice and its component
# trace_PID stay, listed orphaned; `trapctl unsplice --orphans` removes both.
trapctl trace -e "$fn { @c = count() }" > /tmp/trace.out 2>&1 &
p=$!
live /tmp/trace.out tracing
/bin/ppidloop -n 10 > /dev/null
kill -KILL $p
wait $p
echo "TRACE_STATUS=$?"
echo "TRACE_PID=$p"
echo "TRACE_LIST=$(listing)"
echo "TRACE_ORPHANS=$(trapctl unsplice --orphans 2>&1 | tr '\n' '|')"
echo "TRACE_ORPHANS_LIST=$(listing)"
trapctl read $fn > /tmp/trace.hex || exit 13
cmp -s /tmp/before.hex /tmp/trace.hex && echo "TRACE_BYTES=restored" || echo "TRACE_BYTES=changed: $(cat /tmp/trace.hex)"

# --- 4. Through trapd: the timer made, read and removed by requests.
start_trapd
trapctl time $fn > /tmp/td.out 2> /tmp/td.err &
p=$!
live /tmp/td.out timing
/bin/ppidloop -n 10 > /dev/null
kill -TERM $p
wait $p
echo "TD_STATUS=$?"
echo "TD_OUT=$(tail -n 1 /tmp/td.out)$(cat /tmp/td.err)"
echo "TD_LIST=$(listing)"
kill $tdp
wait $tdp

# --- 5. The function as it was.
trapctl read $fn > /tmp/after.hex || exit 12
cmp -s /tmp/before.hex /tmp/after.hex && echo "BYTES=restored" || echo "BYTES=changed: $(cat /tmp/after.hex)"
echo "SIGNALS=done"
