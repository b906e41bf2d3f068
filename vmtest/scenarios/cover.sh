#!/bin/sh
# `trapctl cover` on the running kernel (issue 27, item 1): a count trap at every basic block of
# a few syscall functions while a command calls getsid() and getppid() a known number of times;
# then the same command again under kprobes at the same sites (the oracle: equal counts); a
# SIGTERM that ends a coverage still removes every site; the same through trapd; once mode,
# direct and through trapd; a glob of over 1,000 functions, timed; a program's blocks counted by
# `trapctl cover --process`, then by uprobes at the same blocks (the process oracle).
# Prints KEY=value lines that vmtest/tests/kernel_cover.rs checks.
set -eu
. /lib/scenario.sh
T=/sys/kernel/tracing
N=300
FUNCS="__x64_sys_getsid __x64_sys_getppid __x64_sys_pivot_root exc_int3"
# getsid(0) N+1 times (ppidloop's first call learns the answer), then getppid N+1 times (and
# once more by the shell, for $PPID).
WORK="ppidloop -s -n $N > /tmp/sid.out && ppidloop -n $N > /tmp/ppid.out"

# `armed ERRFILE TENTHS`: wait (at most TENTHS tenths of a second) until a background `trapctl
# cover` has written its announcing line (`covering N block(s) ...`) to ERRFILE: armed.
armed() {
	tries=0
	while ! grep -q '^covering ' "$1" && [ "$tries" -lt "$2" ]; do
		sleep 0.1
		tries=$((tries + 1))
	done
}

# `trapd_sites`: the sites trapd lists (its reply is one line: the sites are counted, not lines).
trapd_sites() {
	trapd send '{"op":"list"}' | grep -o '"site"' | wc -l
}

trapctl read __x64_sys_getsid > /tmp/before.hex

# --- Coverage of the command.
start=$(date +%s)
status=0
# shellcheck disable=SC2086 # the function list is split on purpose
trapctl cover $FUNCS --json -o /tmp/cover.json --lcov /tmp/cover.info -- sh -c "$WORK" 2> /tmp/cover.err || status=$?
echo "COVER_STATUS=$status"
echo "COVER_SECONDS=$(($(date +%s) - start))"
echo "COVER_STDERR=$(tr '\n' '|' < /tmp/cover.err)"
echo "SID_LOOP=$(cat /tmp/sid.out)"
echo "PPID_LOOP=$(cat /tmp/ppid.out)"
echo "COVER_JSON=$(tr -d '\n' < /tmp/cover.json)"
# No debug file for vmlinux in the guest: symbol+offset records, and why.
echo "LCOV_WHY=$(head -n 1 /tmp/cover.info)"
echo "LCOV_ENTRY=$(grep '^# BLOCK __x64_sys_getsid+0x0 ' /tmp/cover.info)"
echo "LIST_AFTER=$(trapctl list --json | grep -c '"site"' || true)"
trapctl read __x64_sys_getsid > /tmp/after.hex
cmp -s /tmp/before.hex /tmp/after.hex && echo "TEXT_SAME=yes" || echo "TEXT_SAME=no"

# --- The oracle: kprobes at every armed site (the `site` of each block that had one), the same
# command again, the kprobes' hits.
awk -F'"' '/"site": / { print $4 }' /tmp/cover.json > /tmp/sites
i=0
while read -r site; do
	echo "p:cv/s$i $site" >> $T/kprobe_events
	i=$((i + 1))
done < /tmp/sites
echo "KPROBES=$i"
echo 1 > $T/events/cv/enable
sh -c "$WORK"
echo 0 > $T/events/cv/enable
i=0
while read -r site; do
	echo "KPROBE_HITS=$site $(awk -v n="s$i" '$1 == n { print $2 }' $T/kprobe_profile)"
	i=$((i + 1))
done < /tmp/sites
echo > $T/kprobe_events

# --- Once mode (issue 27, item 1): a site is disarmed in the batch after its first hit, so the
# command's second round, a second after the first, is not counted; the same blocks are hit.
status=0
# shellcheck disable=SC2086 # the function list is split on purpose
trapctl cover $FUNCS --mode once --json -o /tmp/once.json -- sh -c "$WORK && sleep 1 && $WORK" 2> /tmp/once.err || status=$?
echo "ONCE_STATUS=$status"
echo "ONCE_STDERR=$(tr '\n' '|' < /tmp/once.err)"
echo "ONCE_SID_LOOP=$(cat /tmp/sid.out)"
echo "ONCE_JSON=$(tr -d '\n' < /tmp/once.json)"
echo "ONCE_LIST_AFTER=$(trapctl list --json | grep -c '"site"' || true)"
trapctl read __x64_sys_getsid > /tmp/once.hex
cmp -s /tmp/before.hex /tmp/once.hex && echo "ONCE_TEXT_SAME=yes" || echo "ONCE_TEXT_SAME=no"

# --- Text report, ended by SIGTERM (a background job's SIGINT is ignored: see DESIGN.md).
trapctl cover __x64_sys_getsid > /tmp/text.out 2> /tmp/text.err &
pid=$!
armed /tmp/text.err 300
ppidloop -s -n 5 > /dev/null
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
echo "TERM_STATUS=$status"
echo "TERM_TOTAL=$(grep '^total: ' /tmp/text.out)"
echo "TERM_ROW=$(awk '$1 == "__x64_sys_getsid"' /tmp/text.out)"
echo "TERM_LIST_AFTER=$(trapctl list --json | grep -c '"site"' || true)"

# --- Without trapd the module is locked only while sites are armed or removed: the covered
# command runs trapctl itself, a listing and a count splice made and removed (a change of the
# state, which the coverage's removal reads again first).
cat > /tmp/inner.sh << 'INNER'
trapctl list --json > /tmp/inner_list.json
trapctl count __x64_sys_getppid -- ppidloop -n 50 > /tmp/inner_count.out 2>&1
INNER
status=0
timeout 300 trapctl cover __x64_sys_getsid -- sh /tmp/inner.sh > /dev/null 2> /tmp/inner.err || status=$?
echo "INNER_STATUS=$status"
echo "INNER_STDERR=$(tr '\n' '|' < /tmp/inner.err)"
echo "INNER_ARMED=$(sed -n 's/^covering \([0-9]*\) block.*/\1/p' /tmp/inner.err)"
echo "INNER_LISTED=$(grep -c '"site"' /tmp/inner_list.json || true)"
echo "INNER_COUNT=$(tail -n 1 /tmp/inner_count.out)"
echo "INNER_LEFT=$(trapctl list --json | grep -c '"site"' || true)"
trapctl read __x64_sys_getsid > /tmp/inner.hex
cmp -s /tmp/before.hex /tmp/inner.hex && echo "INNER_TEXT_SAME=yes" || echo "INNER_TEXT_SAME=no"

# --- Through trapd: armed by one apply request, removed by one remove request.
start_trapd
status=0
trapctl cover __x64_sys_getsid --json -o /tmp/trapd.json -- ppidloop -s -n $N > /tmp/tsid.out 2> /tmp/trapd.err || status=$?
echo "TRAPD_STATUS=$status"
echo "TRAPD_STDERR=$(tr '\n' '|' < /tmp/trapd.err)"
echo "TRAPD_SID_LOOP=$(cat /tmp/tsid.out)"
echo "TRAPD_JSON=$(tr -d '\n' < /tmp/trapd.json)"
echo "TRAPD_LEFT=$(trapd_sites)"
# Once mode through trapd: each look one `hits` request (trapd answers the hit sites only), the
# hit sites removed by `remove` requests while the command runs. Between its two rounds the
# command waits (up to 120 s) until trapd answers no hit site: every site the first round hit
# has been disarmed while it runs; it then says how many sites were still live (the `read` of
# that answer), and the second round runs over no armed site it hits.
cat > /tmp/tonce_mid.sh << 'EOF'
i=0
until trapd send '{"op":"hits","min_hits":1}' > /tmp/tonce_hits.json && grep -q '"splices":\[\]' /tmp/tonce_hits.json; do
	if [ "$i" -ge 1200 ]; then
		echo "TRAPD_ONCE_MID_TIMEOUT=$(cat /tmp/tonce_hits.json)"
		exit 0
	fi
	sleep 0.1
	i=$((i + 1))
done
echo "TRAPD_ONCE_MID_READ=$(grep -o '"read":[0-9]*' /tmp/tonce_hits.json | cut -d: -f2)"
EOF
status=0
trapctl cover __x64_sys_getsid --mode once --json -o /tmp/tonce.json -- sh -c "ppidloop -s -n $N > /tmp/tonce1.out && sh /tmp/tonce_mid.sh > /tmp/tonce_mid.out && ppidloop -s -n $N" > /dev/null 2> /tmp/tonce.err || status=$?
echo "TRAPD_ONCE_STATUS=$status"
echo "TRAPD_ONCE_STDERR=$(tr '\n' '|' < /tmp/tonce.err)"
echo "TRAPD_ONCE_SID_LOOP=$(cat /tmp/tonce1.out)"
cat /tmp/tonce_mid.out
echo "TRAPD_ONCE_JSON=$(tr -d '\n' < /tmp/tonce.json)"
echo "TRAPD_ONCE_LEFT=$(trapd_sites)"
# A coverage killed through trapd (SIGKILL: no report, no removal) leaves its sites orphaned;
# `trapctl unsplice --orphans` removes them all in one `remove` request (trapd's journal says
# which requests came), and getsid's text is as before.
trapctl cover __x64_sys_getsid __x64_sys_getppid --seconds 600 > /dev/null 2> /tmp/orph.err &
pid=$!
armed /tmp/orph.err 600
kill -KILL "$pid"
wait "$pid" || true
echo "ORPHAN_ARMED=$(sed -n 's/^covering \([0-9]*\) block.*/\1/p' /tmp/orph.err)"
echo "ORPHAN_LIVE=$(trapd_sites)"
echo "ORPHAN_MARKED=$(trapctl list --json | grep -c '"orphaned": *true' || true)"
jl=$(wc -l < /var/lib/trapd/journal)
status=0
trapctl unsplice --orphans > /tmp/orph.out 2>&1 || status=$?
echo "ORPHAN_UNSPLICE_STATUS=$status"
echo "ORPHAN_UNSPLICED=$(tail -n 1 /tmp/orph.out)"
echo "ORPHAN_REQUESTS=$(tail -n +$((jl + 1)) /var/lib/trapd/journal | grep '"event":"intent"' | grep -o '"op":"[a-z_]*"' | cut -d'"' -f4 | tr '\n' ' ')"
echo "ORPHAN_LEFT=$(trapd_sites)"
trapctl read __x64_sys_getsid > /tmp/orph.hex
cmp -s /tmp/before.hex /tmp/orph.hex && echo "ORPHAN_TEXT_SAME=yes" || echo "ORPHAN_TEXT_SAME=no"
kill $tdp
wait $tdp || true

# --- Scale (issue 27, item 3): over 1,000 functions in one batch, armed and disarmed.
echo "SCALE_FUNCS=$(awk '$2 ~ /^[tTwW]$/ && ($3 ~ /^tcp_/ || $3 ~ /^inet_/ || $3 ~ /^ip_/ || $3 ~ /^sock_/ || $3 ~ /^udp_/ || $3 ~ /^skb_/ || $3 ~ /^neigh_/) { print $1 }' /proc/kallsyms | sort -u | wc -l)"
start=$(date +%s)
trapctl cover 'tcp_*' 'inet_*' 'ip_*' 'sock_*' 'udp_*' 'skb_*' 'neigh_*' --seconds 1 > /tmp/scale.out 2> /tmp/scale.err || echo "SCALE_FAILED=$(tail -n 1 /tmp/scale.err)"
echo "SCALE_SECONDS=$(($(date +%s) - start))"
echo "SCALE_TOTAL=$(grep '^total: ' /tmp/scale.out)"
echo "SCALE_REFUSALS=$(grep '^  refused at ' /tmp/scale.out | tr '\n' '|')"
echo "SCALE_LIST_AFTER=$(trapctl list --json | grep -c '"site"' || true)"
# --- A process against uprobes (issue 27, the process oracle): `trapctl cover --process` counts
# every block of /files/coverloop (a deterministic loop, built -O0 -g on the host); then a uprobe
# at each block with a site counts a second, identical, uncovered run. A uprobe takes a file
# offset: a block's address less its load segment's address plus the segment's file offset, from
# the segments the host read (/files/coverloop.segments: ADDRESS SIZE OFFSET a line, in hex).
P=/files/coverloop
status=0
TRAPVEC_AGENT=/files/libtrapvec_agent.so trapctl cover --process '*' --json -o /tmp/pcover.json -- $P > /tmp/pcover.out 2> /tmp/pcover.err || status=$?
echo "PCOVER_STATUS=$status"
echo "PCOVER_STDERR=$(tr '\n' '|' < /tmp/pcover.err)"
echo "PCOVER_OUT=$(cat /tmp/pcover.out)"
echo "PCOVER_JSON=$(tr -d '\n' < /tmp/pcover.json)"
# The address of each block that had a site (a `hits` field follows its `address`).
awk -F'"' '/"address": / { a = $4 } /"hits": / { print a }' /tmp/pcover.json > /tmp/paddrs
i=0
while read -r addr; do
	off=
	while read -r base size segoff; do
		if [ $((addr >= base && addr < base + size)) = 1 ]; then
			off=$(printf '0x%x' $((addr - base + segoff)))
			break
		fi
	done < $P.segments
	if [ -z "$off" ]; then
		echo "UPROBE_FAILED=$addr lies in no load segment"
	elif ! echo "p:cvp/b$i $P:$off" >> $T/uprobe_events; then
		echo "UPROBE_FAILED=p:cvp/b$i $P:$off refused"
	fi
	echo "UPROBE_AT=$addr ${off:-none}"
	i=$((i + 1))
done < /tmp/paddrs
echo "UPROBES=$i"
echo 1 > $T/events/cvp/enable
$P > /tmp/puprobe.out
echo 0 > $T/events/cvp/enable
echo "UPROBE_OUT=$(cat /tmp/puprobe.out)"
i=0
while read -r addr; do
	# `  FILE EVENT HITS`, the event without its group.
	echo "UPROBE_HITS=$addr $(awk -v n="b$i" '$2 == n { print $3 }' $T/uprobe_profile)"
	i=$((i + 1))
done < /tmp/paddrs
echo > $T/uprobe_events
# --- yama refuses an attach (issue 30, item 3): as uid 65534 (busybox's `su` drops every
# capability), against a process of the same user (busybox's sleep) that is not trapctl's
# descendant. Each scope's refusal is yama's: at 0 the same attach gets past yama and is refused
# for the next reason (the sleep is static). 3 cannot be lowered again, so it comes last.
Y=/proc/sys/kernel/yama/ptrace_scope
if [ -w $Y ]; then
	grep -qs '^tvuser:' /etc/passwd || echo 'tvuser:x:65534:65534:trapvec test:/:/bin/sh' >> /etc/passwd
	su -s /bin/sh tvuser -c 'exec sleep 300' &
	victim=$!
	i=0
	until [ "$(awk '/^Uid:/ { print $2 }' /proc/$victim/status 2> /dev/null)" = 65534 ] || [ $i -ge 100 ]; do
		usleep 50000
		i=$((i + 1))
	done
	tv=$(command -v trapctl)
	for scope in 1 2 0 3; do
		echo $scope > $Y
		status=0
		su -s /bin/sh tvuser -c "TRAPVEC_AGENT=/files/libtrapvec_agent.so $tv -p $victim attach" > /tmp/yama.out 2> /tmp/yama.err || status=$?
		echo "YAMA_$scope=$status $(tr '\n' '|' < /tmp/yama.err)"
	done
	echo "YAMA_TRACER=$(awk '/^TracerPid:/ { print $2 }' /proc/$victim/status)"
	kill $victim || true
else
	echo "YAMA_MISSING=$Y"
fi
echo "COVER_DONE"
