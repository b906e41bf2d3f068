#!/bin/sh
# A claimed int3 always moves the CPU on (issue 24, item 1). While a batch is written, the die
# notifier sends a CPU that meets one of our CCs where the patch leads; a jmp that leads back
# into its own window (jmp $: EB FE), or a chain of jmps that closes into a cycle, would send it
# from CC to CC for ever, with interrupts off where they were off (the idle task in
# __schedule()), and no IPI answered. The module refuses both. The site is the first instruction
# past tcp_sync_mss's entry (tcp_sync_mss+5 on 6.1, +9 on 6.12: push rbp; mov rdx,rdi), which nothing in this guest calls (no TCP connection is made): a jmp that
# the old module let through does no harm before it is reverted.
# Files (vmtest --file): tvraw; optionally another trapvec.ko to test instead of the packed one
# (tv_int3_progress.module=NAME on the kernel command line).
# Prints KEY=value lines that vmtest/tests/kernel_int3_progress.rs checks.
set -u
TV=/files/tvraw

. /lib/scenario.sh

module=$(sed -n 's/.*tv_int3_progress\.module=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$module" ]; then
	rmmod trapvec
	insmod "/files/$module" || exit 10
fi

at() {
	printf '%x' $((0x$(addr "$1") + $2))
}
# `hexbytes ADDR N`: the N bytes at ADDR as one hex word.
hexbytes() {
	trapctl read "$1" "$2" | awk '{ for (i = 2; i <= NF; i++) printf "%s", $i }'
}
reason() {
	sed -n 's/.*reason=\([0-9]*\).*/\1/p' /tmp/tv
}

entry=$(entry_len tcp_sync_mss)
a=$(at tcp_sync_mss "$entry")
orig=$(hexbytes "0x$a" 2)
text_before=$(hexbytes "0x$(addr tcp_sync_mss)" 128)
$TV check "$a" 2 > /tmp/tv
echo "CHECK_A=$(reason)"

# 1. A jmp into its own window.
$TV apply "$a" ebfe > /tmp/tv
echo "SELF=$(cat /tmp/tv)"
grep -q 'ret=0 ' /tmp/tv && $TV apply "$a" "$orig" > /dev/null
$TV apply "$a" ebff > /tmp/tv
echo "INSIDE=$(cat /tmp/tv)"
grep -q 'ret=0 ' /tmp/tv && $TV apply "$a" "$orig" > /dev/null

# 2. A cycle: A lands on B (ordinary code), then B would land on A. B is the first 2-byte window
# behind A's that the module accepts.
b=
off=$((entry + 2))
while [ "$off" -lt 100 ]; do
	$TV check "$(at tcp_sync_mss $off)" 2 > /tmp/tv
	if [ "$(reason)" = 0 ]; then
		b=$(at tcp_sync_mss $off)
		break
	fi
	off=$((off + 1))
done
echo "B_OFFSET=$off"
[ -n "$b" ] || exit 11
borig=$(hexbytes "0x$b" 2)
fwd=$(printf 'eb%02x' $(( (0x$b - 0x$a - 2) & 0xff )))
back=$(printf 'eb%02x' $(( (0x$a - 0x$b - 2) & 0xff )))
$TV apply "$a" "$fwd" > /tmp/tv
echo "A_TO_B=$(cat /tmp/tv)"
$TV apply "$b" "$back" > /tmp/tv
echo "B_TO_A=$(cat /tmp/tv)"
# Undo in the order the module allows: the jmp that lands on the other first.
grep -q 'ret=0 ' /tmp/tv && $TV apply "$b" "$borig" > /dev/null
$TV apply "$a" "$orig" > /tmp/tv
echo "A_REVERT=$(cat /tmp/tv)"
# And the other way round: B's jmp first (onto A's site, not a patch yet), then A's onto B.
$TV apply "$b" "$back" > /tmp/tv
echo "B_FIRST=$(cat /tmp/tv)"
$TV apply "$a" "$fwd" > /tmp/tv
echo "A_SECOND=$(cat /tmp/tv)"
grep -q 'ret=0 ' /tmp/tv && $TV apply "$a" "$orig" > /dev/null
$TV apply "$b" "$borig" > /dev/null

text_after=$(hexbytes "0x$(addr tcp_sync_mss)" 128)
[ -n "$text_after" ] || exit 13
[ "$text_before" = "$text_after" ] && echo "TEXT_UNCHANGED=yes" || echo "TEXT_UNCHANGED=no"
$TV info > /tmp/tv
echo "INFO=$(cat /tmp/tv)"
# The module still writes ordinary splices on that function, and unloads.
trapctl load /components/empty.o > /dev/null || exit 12
trapctl splice "$(past_entry tcp_sync_mss 0)" --call empty_handler > /dev/null && echo "SPLICE=yes"
trapctl unsplice --all > /dev/null && echo "UNSPLICE=yes"
rmmod trapvec && echo "RMMOD=yes"
echo "INT3_PROGRESS_DONE"
