#!/bin/sh
# Bad input, each refused with a clear one-line error while the kernel stays unchanged: a
# non-root user, a point that is not an instruction boundary, a window over a branch target,
# entry text, a component with an unresolved symbol (/files/unresolved.o). Also: the state kept
# in the module between trapctl commands, two trapctl commands serialized by the lock, and a
# component that declares its own splice (/files/declared.o): applied by `load`, removed by
# `unload`.
# Prints KEY=value lines (ERR_* are trapctl's messages) that vmtest/tests/kernel_bad_input.rs
# checks.
set -u

. /lib/scenario.sh

snapshot() {
	{
		trapctl read tcp_sync_mss
		trapctl read entry_SYSCALL_64 64
		trapctl list
	} > "$1"
}

trapctl load /components/empty.o || exit 10
snapshot /tmp/before

refuse ERR_NONROOT su nobody -c "trapctl splice tcp_sync_mss --call empty_handler"
refuse ERR_NONROOT_LIST su nobody -c "trapctl list"
refuse ERR_ENTRY trapctl splice entry_SYSCALL_64 --call empty_handler
refuse ERR_UNRESOLVED trapctl load /files/unresolved.o

# A window over a branch target: plan a trap at every offset of tcp_sync_mss and take the first
# refused for that reason, then splice it for real.
size=$(( $(trapctl read tcp_sync_mss | wc -l) * 16 ))
{
	off=0
	while [ "$off" -lt "$size" ]; do
		printf '[[splice]]\nat = "tcp_sync_mss+%d"\naction = "call"\nhandler = "empty_handler"\n' "$off"
		off=$((off + 1))
	done
} > /tmp/every.toml
trapctl apply --check /tmp/every.toml > /tmp/check.out 2> /tmp/check.err
echo "CHECK_OK=$(grep -c '^ok ' /tmp/check.out)"
echo "CHECK_REFUSED=$(grep -c '^refused: ' /tmp/check.err)"
target_point=$(sed -n 's/^refused: \(tcp_sync_mss+[0-9]*\): .*contains the branch target.*/\1/p' /tmp/check.err | head -n 1)
echo "BRANCH_POINT=$target_point"
refuse ERR_BRANCH trapctl splice "$target_point" --call empty_handler
# Not an instruction boundary: the first offset past the entry that falls inside an instruction
# (tcp_sync_mss+7 inside `mov rdx, rdi` on 6.1, +11 on 6.12).
entry=$(entry_len tcp_sync_mss)
inside=$(sed -n 's/^refused: tcp_sync_mss+\([0-9]*\): .*not an instruction boundary.*/\1/p' /tmp/check.err |
	awk -v e="$entry" '$1 > e { print "tcp_sync_mss+" $1; exit }')
echo "BOUNDARY_POINT=$inside"
echo "BOUNDARY_INSN=$(grep "^refused: $inside: " /tmp/check.err | sed -n 's/.*falls inside `\([^`]*\)`.*/\1/p')"
refuse ERR_BOUNDARY trapctl splice "$inside" --call empty_handler

snapshot /tmp/after
cmp -s /tmp/before /tmp/after && echo "UNCHANGED=yes" || { echo "UNCHANGED=no"; diff /tmp/before /tmp/after; }

# --best-effort: the good point is applied, each bad one reported, the exit status is 3.
cat > /tmp/mixed.toml <<'TOML'
[[splice]]
at = "tcp_sync_mss"
action = "call"
handler = "empty_handler"

[[splice]]
at = "entry_SYSCALL_64"
action = "call"
handler = "empty_handler"

[[splice]]
at = "INSIDE"
action = "call"
handler = "empty_handler"
TOML
sed -i "s/INSIDE/$inside/" /tmp/mixed.toml
refuse ERR_ALL_OR_NOTHING trapctl apply /tmp/mixed.toml
echo "AFTER_ALL_OR_NOTHING=$(trapctl list --json | grep -c '"point"')"
trapctl apply --best-effort /tmp/mixed.toml > /tmp/be.out 2> /tmp/be.err
echo "BEST_EFFORT_STATUS=$?"
echo "BEST_EFFORT_APPLIED=$(grep -c '^spliced ' /tmp/be.out)"
echo "BEST_EFFORT_REFUSED=$(grep -c '^refused: ' /tmp/be.err)"
cat /tmp/be.out /tmp/be.err

# State across commands: a new trapctl sees the splice the last one made, with its hits.
tcpmss -n 2 > /dev/null
trapctl list
echo "STATE_HITS=$(trapctl list --json | sed -n 's/.*"hits": \([0-9]*\).*/\1/p' | head -n 1)"
# The lock: a trapctl waits for another holder of /dev/trapvec's lock (devlock holds it as a
# command changing the kernel does).
devlock 3 > /tmp/lock.out &
until grep -q '^held' /tmp/lock.out 2>/dev/null; do sleep 0.1; done
trapctl list > /tmp/list.out
grep -q '^released' /tmp/lock.out && echo "LIST_WAITED=yes" || echo "LIST_WAITED=no"
wait
# A held count locks only while it changes the kernel: a list meanwhile runs at once and shows
# the count's splice.
trapctl count __x64_sys_getppid --seconds 4 > /tmp/count.out &
until grep -q '^counting' /tmp/count.out 2>/dev/null; do sleep 0.1; done
trapctl list > /tmp/list2.out
grep -q 'calls in' /tmp/count.out && echo "LIST_DURING_COUNT=no" || echo "LIST_DURING_COUNT=yes"
echo "LIST_SHOWS_COUNT=$(grep -c '__x64_sys_getppid' /tmp/list2.out)"
wait
trapctl unsplice tcp_sync_mss
trapctl unload empty

trapctl load /files/declared.o
sysbench -n 25 > /dev/null
trapctl list
echo "DECLARED_HITS=$(trapctl list --json | sed -n 's/.*"hits": \([0-9]*\).*/\1/p' | head -n 1)"
trapctl unload declared
echo "END_LIST=$(trapctl list | tr '\n' ' ')"
