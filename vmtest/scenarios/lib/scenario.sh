# What the scenarios share, in the guest as /lib/scenario.sh (`. /lib/scenario.sh`): busybox sh
# functions, each the one copy of a step more than one scenario takes.

# `refuse KEY CMD...`: CMD must fail; its message is printed as KEY=...
refuse() {
	key=$1
	shift
	if "$@" > /tmp/out 2> /tmp/err; then
		echo "$key=UNEXPECTEDLY ACCEPTED"
	else
		echo "$key=$(head -n 1 /tmp/err)"
	fi
}

# `addr SYMBOL`: SYMBOL's address in /proc/kallsyms, hex without 0x.
addr() {
	awk -v n="$1" '$3 == n { print $1; exit }' /proc/kallsyms
}

# `fastest_rounds PREFIX CONFIGS`: $rounds rounds over every configuration of CONFIGS in turn
# (so that a slow phase of the host hits them all), each measured by the scenario's own
# `measure CONFIG`; prints `PREFIX N: config=value ...` per round and leaves each
# configuration's fastest value in `min_CONFIG` (and CONFIGS in `configs`).
fastest_rounds() {
	prefix=$1
	configs=$2
	for c in $configs; do eval "min_$c=999999999"; done
	round=1
	while [ "$round" -le "$rounds" ]; do
		line="$prefix $round:"
		for c in $configs; do
			v=$(measure "$c")
			line="$line $c=$v"
			eval "[ \"$v\" -lt \"\$min_$c\" ] && min_$c=$v" || true
		done
		echo "$line"
		round=$((round + 1))
	done
}

# `start_trapd [CONFIG]`: trapd (the test's /files/trapd) with the configuration CONFIG (a
# TOML text; empty without it, or /tmp/trapd.toml as it is with `-`) and its journal in
# /var/lib/trapd, its log in /tmp/trapd.log; returns once it answers, its pid in $tdp. Prints
# `TRAPD=did not come up: LOG` and exits 21 when it does not within 10 s.
start_trapd() {
	cp /files/trapd /bin/trapd && chmod 755 /bin/trapd
	mkdir -p /run /var/lib/trapd
	[ "${1:-}" = - ] || printf '%s' "${1:-}" > /tmp/trapd.toml
	trapd --config /tmp/trapd.toml --journal /var/lib/trapd/journal > /tmp/trapd.log 2>&1 &
	tdp=$!
	i=0
	until trapd send '{"op":"status"}' > /dev/null 2>&1; do
		i=$((i + 1))
		[ $i -gt 100 ] && { echo "TRAPD=did not come up: $(cat /tmp/trapd.log)"; exit 21; }
		usleep 100000
	done
}

# `entry_len SYMBOL`: how many bytes at SYMBOL's start the kernel owns, read from its live text:
# an endbr64 (or 6.12's sealed 4-byte NOP over one) and then the 5-byte ftrace site (its NOP or
# its call), as the planner's point resolution skips them: 5 on 6.1, 9 on 6.12 where IBT puts
# endbr64 first. Offsets in the scenarios are written past it (`past_entry`), so that the same
# instruction is named on both kernels.
entry_len() {
	b=$(trapctl read "$1" 9 | awk '{ for (i = 2; i <= NF; i++) printf "%s", $i }')
	n=0
	case $b in
	f30f1efa* | 660f1f00*) n=4 b=${b#????????} ;;
	esac
	case $b in
	0f1f440000* | e8*) n=$((n + 5)) ;;
	esac
	echo "$n"
}

# `past_entry SYMBOL DELTA`: the point `SYMBOL+N`, N being DELTA bytes past its entry_len
# (`past_entry __x64_sys_getppid 0` is `__x64_sys_getppid+5` on 6.1, `+9` on 6.12).
past_entry() {
	echo "$1+$(($(entry_len "$1") + $2))"
}
