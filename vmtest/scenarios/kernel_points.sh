#!/bin/sh
# `trapctl points` against the running kernel (issue 28, item 1), with the splicer as its oracle:
# for a sample of the functions the listing says take a trap (or a jmp) and of those it says do
# not, `trapctl splice` must agree, one by one. Also: a glob's functions are the kallsyms names
# it matches, --blocks lists more sites than functions, a noinstr function is refused as such,
# nothing is changed by listing (no dispatch entry after), and the whole kernel's listing is
# timed. Prints KEY=value lines that vmtest/tests/kernel_points.rs checks.
set -eu
. /lib/scenario.sh

# A glob: every tcp_* text symbol of vmlinux and the loaded modules, each address once.
trapctl points 'tcp_*' > /tmp/tcp.txt
echo "TCP_ROWS=$(awk 'NR > 1 && $1 != "kernel:" && substr($0, 1, 1) != " "' /tmp/tcp.txt | wc -l)"
echo "TCP_KALLSYMS=$(awk '$2 ~ /^[tTwW]$/ && $3 ~ /^tcp_/ { print $1 }' /proc/kallsyms | sort -u | wc -l)"
echo "TCP_SUMMARY=$(grep '^kernel: ' /tmp/tcp.txt)"
echo "MSS_ROW=$(awk '$1 == "tcp_sync_mss"' /tmp/tcp.txt)"
echo "NOINSTR_ROW=$(trapctl points exc_int3 | awk '$1 == "exc_int3"')"
trapctl points --blocks tcp_sync_mss > /tmp/blocks.txt
echo "MSS_BLOCK_SITES=$(grep -c '^tcp_sync_mss' /tmp/blocks.txt)"
echo "ENTRIES_AFTER_LISTING=$(trapctl list --json | grep -c '"site"' || true)"

# The oracle: `trapctl splice` at the point of each sampled row, for trap and for jmp.
# `oracle MECH COLUMN`: up to 12 rows the listing says yes (every 7th) and 12 it says no (the
# first 12: there are few).
oracle() {
	mech=$1
	col=$2
	agree=0
	disagree=0
	for want in yes no; do
		awk -v c="$col" -v w="$want" 'NR > 1 && NF >= 4 && $1 != "kernel:" {
			v = $c; if (v == "springboard") v = "yes"; if (v == w) print $1 }' /tmp/tcp.txt |
			awk -v w="$want" 'w == "no" || NR % 7 == 1' | head -n 12 > /tmp/sample
		while read -r point; do
			if trapctl splice --count --mechanism "$mech" "$point" > /dev/null 2> /tmp/err; then
				got=yes
				trapctl unsplice "$point" > /dev/null
			else
				got=no
			fi
			if [ "$got" = "$want" ]; then
				agree=$((agree + 1))
			else
				disagree=$((disagree + 1))
				echo "ORACLE_DISAGREES=$mech $point listed $want, splice says $got: $(head -n 1 /tmp/err)"
			fi
		done < /tmp/sample
	done
	echo "ORACLE_${mech}_AGREE=$agree"
	echo "ORACLE_${mech}_DISAGREE=$disagree"
}
oracle trap 3
oracle jmp 4

# The whole kernel, summary only, timed (TCG: emulated time, for the notes only).
start=$(date +%s)
trapctl points --summary > /tmp/all.txt
echo "ALL_SECONDS=$(($(date +%s) - start))"
echo "ALL_SUMMARY=$(grep '^kernel: ' /tmp/all.txt)"
echo "ALL_REFUSALS=$(grep -c 'refused at' /tmp/all.txt)"
echo "POINTS_DONE"
