#!/bin/sh
# Live coverage at scale (issue 27's goals), one boot, run by `bench cover --vm`
# (bench/src/livecover.rs, which puts LIVECOVER_GLOBS, the bench's TCP group, on the line after
# this one). Under QEMU TCG every figure is emulated time: only ratios within the run mean
# anything.
#  1. TCP group through trapd under TCP traffic: `trapctl cover` of every basic block of the
#     group's functions, armed in one batch while loopback TCP streams run (tcpmss --traffic,
#     every byte checked), timed whole (stopwatch) and by stage (the report's `stages`);
#     oopses in dmesg and sites left after.
#  2. Arm rate vs kprobes: LIVECOVER_SAMPLE (500) of the sites just armed, spread over them,
#     registered as kprobes through kprobe_events (one write each), then enabled, timed; the
#     count registered read back.
#  3. Once mode: a fixed loopback TCP workload (tcpmss -n LIVECOVER_CONNS) timed unspliced
#     (LIVECOVER_ROUNDS rounds before and as many after), then under `trapctl cover --mode once`
#     of the same group after two warm-up runs and a second for the disarm batches, through
#     trapd and direct.
#  4. With LIVECOVER_WHOLE=1: every function of available_filter_functions (unique core-kernel
#     names) covered at once; blocks, armed, refused by kind, time, memory while armed.
# Output: LIVECOVER_* KEY=value lines; LIVECOVER_DONE at the end.
set -u
set -f
. /lib/scenario.sh
T=/sys/kernel/tracing
[ -e $T/kprobe_events ] || mount -t tracefs nodev $T
SAMPLE=${LIVECOVER_SAMPLE:-500}
ROUNDS=${LIVECOVER_ROUNDS:-5}
CONNS=${LIVECOVER_CONNS:-60}
GLOBS=${LIVECOVER_GLOBS:?the scenario needs the TCP group in LIVECOVER_GLOBS}

# Lines of the kernel log that say it went wrong.
oopses() {
	dmesg | grep -c -E 'Oops|BUG:|WARNING:|general protection|soft lockup|rcu.*stall' || true
}

# Sites live (through trapd when it runs, else the module).
sites_left() {
	trapctl list --json | grep -c '"site"' || true
}

# `stopwatch_ns CMD...`: CMD's wall time in ns (its output discarded); `fail` when it failed.
stopwatch_ns() {
	if stopwatch "$@" > /dev/null 2> /tmp/sw.err; then
		sed -n 's/^STOPWATCH_NS=//p' /tmp/sw.err
	else
		echo fail
	fi
}

# `summary FILE PREFIX`: a `trapctl cover --json` report's top-level figures, its `total` and
# `stages` objects and its refusals by kind, as PREFIX_KEY=value lines.
summary() {
	awk -v p="$2" '
	function kv(line, o,   i, k, v) {
		sub(/^ *"/, "", line)
		i = index(line, "\": ")
		k = substr(line, 1, i - 1)
		v = substr(line, i + 3)
		sub(/,$/, "", v)
		gsub(/"/, "", v)
		if (o == "refusals") print p "_REFUSED_BY=" v " " k
		else print p "_" toupper(o k) "=" v
	}
	/^  "(arm_ms|disarm_ms|seconds|disarm_batches|ended)": / { kv($0, ""); next }
	/^  "(total|stages)": \{/ { o = substr($1, 2, length($1) - 3) "_"; next }
	/^    "refusals": \{\}/ { next }
	/^    "refusals": \{/ { r = 1; next }
	r && /^    }/ { r = 0; next }
	/^  }/ { o = ""; next }
	r && /^      "/ { kv($0, "refusals"); next }
	o != "" && /^    "[a-z_]+": [^{]/ { kv($0, o) }
	' "$1"
}

# `median`: the median of the numbers on stdin, one a line.
median() {
	sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "none"; else print v[int((NR + 1) / 2)] }'
}

# `work_rounds FILE`: ROUNDS timed runs of the workload, one ns figure a line into FILE.
work_rounds() {
	: > "$1"
	i=0
	while [ $i -lt "$ROUNDS" ]; do
		stopwatch_ns tcpmss -n "$CONNS" >> "$1"
		i=$((i + 1))
	done
}

echo "LIVECOVER_KERNEL=$(uname -r)"
echo "LIVECOVER_GLOBS=$GLOBS"
echo "LIVECOVER_CPUS=$(grep -c ^processor /proc/cpuinfo)"
oops0=$(oopses)

# --- 1. The TCP group through trapd, under TCP traffic.
rm -f /tmp/stop
(
	n=0
	bad=0
	while [ ! -e /tmp/stop ]; do
		tcpmss --traffic 2 > /dev/null 2>&1 || bad=$((bad + 1))
		n=$((n + 1))
	done
	echo "rounds=$n failed=$bad" > /tmp/traffic.out
) &
traffic=$!
start_trapd
status=0
# shellcheck disable=SC2086 # the globs are split on purpose (set -f: not expanded)
stopwatch trapctl cover $GLOBS --seconds 0 --json -o /tmp/tcp.json > /dev/null 2> /tmp/tcp.err || status=$?
echo "LIVECOVER_TCP_STATUS=$status"
echo "LIVECOVER_TCP_WHOLE_NS=$(sed -n 's/^STOPWATCH_NS=//p' /tmp/tcp.err)"
echo "LIVECOVER_TCP_STDERR=$(grep -v '^STOPWATCH_NS=' /tmp/tcp.err | tr '\n' '|')"
summary /tmp/tcp.json LIVECOVER_TCP
echo "LIVECOVER_TCP_SITES=$(grep -c '"site": ' /tmp/tcp.json)"
echo "LIVECOVER_TCP_LEFT=$(sites_left)"
touch /tmp/stop
wait $traffic || true
echo "LIVECOVER_TRAFFIC $(cat /tmp/traffic.out)"
echo "LIVECOVER_TCP_OOPS=$(($(oopses) - oops0))"

# --- 2. kprobes at a sample of the same sites.
awk -F'"' '/"site": / { print $4 }' /tmp/tcp.json > /tmp/sites
total=$(wc -l < /tmp/sites)
step=$((total / SAMPLE))
[ "$step" -ge 1 ] || step=1
awk -v s="$step" -v n="$SAMPLE" '(NR - 1) % s == 0 && k < n { printf "p:tvc/s%d %s\n", k, $1; k++ }' /tmp/sites > /tmp/kprobes
echo "LIVECOVER_KPROBE_SAMPLE=$(wc -l < /tmp/kprobes)"
# One write(2) per probe, as a tool registering them one by one does; a refused one is said.
cat > /tmp/register.sh << EOF
#!/bin/sh
while read -r l; do
	echo "\$l" 2> /dev/null || echo "LIVECOVER_KPROBE_REFUSED=\$l" >&2
done < /tmp/kprobes >> $T/kprobe_events
EOF
chmod +x /tmp/register.sh
stopwatch /tmp/register.sh > /dev/null 2> /tmp/reg.err || true
grep '^LIVECOVER_KPROBE_REFUSED=' /tmp/reg.err | head -n 5
echo "LIVECOVER_KPROBE_REGISTER_NS=$(sed -n 's/^STOPWATCH_NS=//p' /tmp/reg.err)"
echo "LIVECOVER_KPROBE_REGISTERED=$(grep -c '^p:tvc/' $T/kprobe_events || true)"
if [ -d $T/events/tvc ]; then
	echo "LIVECOVER_KPROBE_ENABLE_NS=$(stopwatch_ns sh -c "echo 1 > $T/events/tvc/enable")"
	echo "LIVECOVER_KPROBE_DISABLE_NS=$(stopwatch_ns sh -c "echo 0 > $T/events/tvc/enable")"
fi
echo "LIVECOVER_KPROBE_REMOVE_NS=$(stopwatch_ns sh -c "echo > $T/kprobe_events")"
echo "LIVECOVER_KPROBE_LEFT=$(grep -c . $T/kprobe_events || true)"

# --- 3. Once mode: the workload unspliced, then after warm-up under once-mode coverage.
cat > /tmp/covered_work.sh << EOF
#!/bin/sh
# Two warm-up runs, a second for the disarm batches, then $ROUNDS timed runs into \$1.
tcpmss -n $CONNS > /dev/null
tcpmss -n $CONNS > /dev/null
sleep 1
: > "\$1"
i=0
while [ \$i -lt $ROUNDS ]; do
	if stopwatch tcpmss -n $CONNS > /dev/null 2> /tmp/sw.err; then
		sed -n 's/^STOPWATCH_NS=//p' /tmp/sw.err >> "\$1"
	else
		echo fail >> "\$1"
	fi
	i=\$((i + 1))
done
EOF
chmod +x /tmp/covered_work.sh
work_rounds /tmp/base1.ns
for route in trapd direct; do
	if [ $route = direct ]; then
		kill $tdp
		wait $tdp || true
	fi
	status=0
	# shellcheck disable=SC2086
	trapctl cover $GLOBS --mode once --json -o /tmp/once.json -- /tmp/covered_work.sh /tmp/once_$route.ns > /dev/null 2> /tmp/once.err || status=$?
	echo "LIVECOVER_ONCE_${route}_STATUS=$status"
	echo "LIVECOVER_ONCE_${route}_STDERR=$(tr '\n' '|' < /tmp/once.err)"
	summary /tmp/once.json "LIVECOVER_ONCE_$route" | grep -v REFUSED_BY
	echo "LIVECOVER_ONCE_${route}_ROUNDS=$(tr '\n' ' ' < /tmp/once_$route.ns)"
	echo "LIVECOVER_ONCE_${route}_MEDIAN_NS=$(median < /tmp/once_$route.ns)"
	echo "LIVECOVER_ONCE_${route}_LEFT=$(sites_left)"
done
work_rounds /tmp/base2.ns
echo "LIVECOVER_BASE_ROUNDS=$(cat /tmp/base1.ns /tmp/base2.ns | tr '\n' ' ')"
echo "LIVECOVER_BASE_MEDIAN_NS=$(cat /tmp/base1.ns /tmp/base2.ns | median)"

# --- 4. The whole of vmlinux's traceable text (opt-in).
if [ "${LIVECOVER_WHOLE:-0}" = 1 ]; then
	traceable_names
	echo "LIVECOVER_ALL_FUNCS=$(wc -l < /tmp/names)"
	echo "LIVECOVER_ALL_MEM_BEFORE_KB=$(awk '/^MemAvailable/ { print $2 }' /proc/meminfo)"
	echo "LIVECOVER_ALL_ALLOCS_BEFORE=$(allocs)"
	cat > /tmp/all_stats.sh << EOF
#!/bin/sh
. /lib/scenario.sh
allocs > /tmp/all.allocs
trapctl list --stats > /tmp/all.stats 2>&1
awk '/^MemAvailable/ { print \$2 }' /proc/meminfo > /tmp/all.mem
EOF
	chmod +x /tmp/all_stats.sh
	status=0
	# Direct (trapd is stopped): `list --stats` reads the module's counters meanwhile.
	# shellcheck disable=SC2046
	stopwatch trapctl cover $(cat /tmp/names) --json -o /tmp/all.json -- /tmp/all_stats.sh > /dev/null 2> /tmp/all.err || status=$?
	echo "LIVECOVER_ALL_STATUS=$status"
	echo "LIVECOVER_ALL_WHOLE_NS=$(sed -n 's/^STOPWATCH_NS=//p' /tmp/all.err)"
	echo "LIVECOVER_ALL_STDERR=$(grep -v '^STOPWATCH_NS=' /tmp/all.err | tail -n 5 | tr '\n' '|')"
	[ -s /tmp/all.json ] && summary /tmp/all.json LIVECOVER_ALL
	echo "LIVECOVER_ALL_ALLOCS_ARMED=$(cat /tmp/all.allocs 2> /dev/null | tr '\n' ' ')"
	echo "LIVECOVER_ALL_STATS=$(tr '\n' '|' < /tmp/all.stats 2> /dev/null)"
	echo "LIVECOVER_ALL_MEM_ARMED_KB=$(cat /tmp/all.mem 2> /dev/null)"
	echo "LIVECOVER_ALL_LEFT=$(sites_left)"
	echo "LIVECOVER_ALL_OOPS=$(($(oopses) - oops0))"
fi
echo "LIVECOVER_OOPS=$(($(oopses) - oops0))"
echo "LIVECOVER_DONE"
