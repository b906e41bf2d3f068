#!/bin/sh
# The kernel module in the field (issue 9): kprobes and splices kept apart in both orders, text
# the module refuses with a reason of its own, the invariants between text and dispatch table,
# a dispatch table of more than TRAPVEC_BATCH_MAX entries, and, last because neither can be
# undone, kernel.modules_disabled and kernel lockdown. /files/tvraw makes raw requests
# (vmtest/tests/fixtures/tvraw.c). Every refusal is checked to change nothing.
# Prints KEY=value lines that vmtest/tests/kernel_field.rs checks.
set -u
T=/sys/kernel/tracing
TV=/files/tvraw

. /lib/scenario.sh

# `at SYMBOL OFFSET`: hex address of SYMBOL+OFFSET.
at() {
	printf '%x' $((0x$(addr "$1") + $2))
}

# `kprobe SPEC`: append SPEC to kprobe_events; prints ok or refused.
kprobe() {
	if echo "$1" >> $T/kprobe_events 2> /dev/null; then echo ok; else echo refused; fi
}

reason() {
	sed -n 's/.*reason=\([0-9a-z]*\).*/\1/p' /tmp/tv
}

snapshot() {
	{
		trapctl read __x64_sys_getppid 32
		trapctl read tcp_sync_mss 32
		trapctl list
		$TV info
	} > "$1"
}

# Splice hits of the one live splice, from trapctl list --json.
splice_hits() {
	trapctl list --json | sed -n 's/.*"hits": \([0-9]*\).*/\1/p' | head -n 1
}

# Hits of the kprobe event $1 from kprobe_profile.
probe_hits() {
	awk -v n="$1" '$1 == n { print $2 }' $T/kprobe_profile
}

trapctl load /components/empty.o || exit 10
# Points are written past each function's entry (5 bytes on 6.1; 9 on 6.12, endbr64 first):
# G0 is __x64_sys_getppid's `push rbx`, G1 the call after it; M0, M1 tcp_sync_mss's `push rbp`
# and `mov rdx, rdi`; the entry lengths GE and ME are printed for the test.
GE=$(entry_len __x64_sys_getppid)
ME=$(entry_len tcp_sync_mss)
echo "ENTRY_GETPPID=$GE"
echo "ENTRY_MSS=$ME"
G0=__x64_sys_getppid+$GE
G1=__x64_sys_getppid+$((GE + 1))
M0=tcp_sync_mss+$ME
M1=tcp_sync_mss+$((ME + 1))
getppid_site=$(at __x64_sys_getppid "$GE")

# --- 1b: a splice first; kprobes on its window are refused, one at the entry works beside it.
trapctl splice $G0 --call empty_handler || exit 11
grep -q "^0x0*$getppid_site-" /sys/kernel/debug/kprobes/blacklist && echo "BL_LIVE=yes" || echo "BL_LIVE=no"
echo "KP_ON_SPLICE=$(kprobe "p:myp $G0")"
echo "KP_IN_SPLICE=$(kprobe "p:myp6 $G1")"
dmesg | grep -q -e 'BUG:' -e 'Oops' -e 'Call Trace' && echo "OOPS=yes" || echo "OOPS=no"
echo "KP_ENTRY=$(kprobe 'p:e __x64_sys_getppid')"
echo 1 > $T/events/kprobes/e/enable
grep __x64_sys_getppid /sys/kernel/debug/kprobes/list
# The ftrace-based kprobe runs through an ftrace trampoline of its own ops (kallsyms names it).
tramp=$(awk '$3 == "ftrace_trampoline" { print $1; exit }' /proc/kallsyms)
if [ -n "$tramp" ]; then $TV check "$tramp" 2 > /tmp/tv; echo "R_FTRACE_TRAMP=$(reason)"; else echo "R_FTRACE_TRAMP=none"; fi
s0=$(splice_hits)
p0=$(probe_hits e)
sysbench -n 300 > /dev/null
s1=$(splice_hits)
p1=$(probe_hits e)
echo "SPLICE_DELTA=$((s1 - s0))"
echo "PROBE_DELTA=$((p1 - p0))"
echo 0 > $T/events/kprobes/e/enable
echo '-:e' >> $T/kprobe_events
trapctl unsplice $G0
grep -q "^0x0*$getppid_site-" /sys/kernel/debug/kprobes/blacklist && echo "BL_AFTER=present" || echo "BL_AFTER=gone"
echo "KP_AFTER_UNSPLICE=$(kprobe "p:myp $G0")"

# --- 1a: a kprobe first; a splice over it is refused and names it.
snapshot /tmp/before
refuse ERR_KPROBE trapctl splice $G0 --call empty_handler
$TV check "$getppid_site" 2 > /tmp/tv
echo "CHECK_KPROBE=$(cat /tmp/tv)"
echo '-:myp' >> $T/kprobe_events
# A probe inside a function, then points behind it: the module decodes through the probe
# (armed int3 or optimized jmp) and answers as it did before the probe, past the probe's reach.
verdicts() {
	off=32
	while [ "$off" -lt 64 ]; do
		$TV check "$(at tcp_sync_mss $((off + ME - 5)))" 2 > /tmp/tv
		printf '%s ' "$(reason)"
		off=$((off + 1))
	done
}
before_probe=$(verdicts)
echo "KP_MSS=$(kprobe "p:mss $M1")"
echo 1 > $T/events/kprobes/mss/enable
sleep 1
grep tcp_sync_mss /sys/kernel/debug/kprobes/list
trapctl read tcp_sync_mss 16
refuse ERR_KPROBE_MSS trapctl splice $M1 --call empty_handler
with_probe=$(verdicts)
echo "VERDICTS_BEFORE=$before_probe"
echo "VERDICTS_WITH_PROBE=$with_probe"
[ "$before_probe" = "$with_probe" ] && echo "THROUGH_PROBE=same" || echo "THROUGH_PROBE=differs"
$TV check "$(at tcp_sync_mss $((ME + 4)))" 2 > /tmp/tv
echo "UNDER_OPTPROBE=$(cat /tmp/tv)"
# Kprobe slots exist now (the mss probe's copy of its instruction).
slot=$(awk '$3 == "kprobe_insn_page" { print $1; exit }' /proc/kallsyms)
if [ -n "$slot" ]; then $TV check "$slot" 2 > /tmp/tv; echo "R_KPROBE_SLOT=$(reason)"; else echo "R_KPROBE_SLOT=none"; fi
echo 0 > $T/events/kprobes/mss/enable
echo '-:mss' >> $T/kprobe_events
snapshot /tmp/after
cmp -s /tmp/before /tmp/after && echo "KPROBE_UNCHANGED=yes" || { echo "KPROBE_UNCHANGED=no"; diff /tmp/before /tmp/after; }

# --- 1c: an armed kprobe that is not optimized (issue 24, item 8): its int3 is in the text.
# Planning decodes the function as it is without the probe (READ_ORIGINAL puts back the byte
# the probe saved), so the splice over it is refused by the module's kprobe check, naming the
# probe, and not for a block that seems to end at the int3. Behind it, +6 (the call) is still
# an instruction boundary: spliced, it counts every call the probe counts.
echo 0 > /proc/sys/debug/kprobes-optimization
echo "p:armed $G0" >> $T/kprobe_events
echo 1 > $T/events/kprobes/armed/enable
echo "ARMED_BYTE=$(trapctl read $G0 1 | awk '{ print $2 }')"
grep __x64_sys_getppid /sys/kernel/debug/kprobes/list
refuse ERR_ARMED_KPROBE trapctl splice $G0 --call empty_handler
a0=$(probe_hits armed)
trapctl splice $G1 --count > /tmp/out 2>&1
echo "ARMED_NEIGHBOUR=$(cat /tmp/out)"
echo "ARMED_$(ppidloop -n 500)"
echo "ARMED_HITS=$(splice_hits)"
echo "ARMED_PROBE_DELTA=$(($(probe_hits armed) - a0))"
trapctl unsplice $G1 > /dev/null
echo 0 > $T/events/kprobes/armed/enable
echo '-:armed' >> $T/kprobe_events
echo 1 > /proc/sys/debug/kprobes-optimization

# --- 2: text the module refuses, each with its own reason.
snapshot /tmp/before
rcheck() {
	a=$(addr "$2")
	if [ -z "$a" ]; then
		echo "$1=nosym"
		return
	fi
	$TV check "$a" 2 > /tmp/tv
	echo "$1=$(reason)"
}
rcheck R_CPUIDLE default_idle
# From 6.3 on the linker script puts .cpuidle.text inside the noinstr text: the module then
# names that (its first rule) for default_idle.
cs=$(addr __cpuidle_text_start)
ns=$(addr __noinstr_text_start)
ne=$(addr __noinstr_text_end)
if [ -n "$cs" ] && [ -n "$ns" ] && [ -n "$ne" ] && [ $((0x$cs >= 0x$ns && 0x$cs < 0x$ne)) = 1 ]; then
	echo "CPUIDLE_IN_NOINSTR=yes"
else
	echo "CPUIDLE_IN_NOINSTR=no"
fi
rcheck R_SCT __SCT__cond_resched
rcheck R_RETURN_THUNK __x86_return_thunk
for s in srso_alias_safe_ret srso_safe_ret srso_alias_untrain_ret srso_untrain_ret; do
	[ -n "$(addr $s)" ] && { rcheck R_SRSO $s; break; }
done
$TV bpfcheck > /tmp/tv
echo "R_BPF=$(reason)"
idle_point=$(past_entry default_idle 0)
echo "CPUIDLE_POINT=$idle_point"
refuse ERR_CPUIDLE trapctl splice "$idle_point" --call empty_handler
# The ftrace site: the function's first bytes on 6.1, after its endbr64 on 6.12.
$TV check "$(at tcp_sync_mss $((ME - 5)))" 2 > /tmp/tv
echo "R_FTRACE=$(reason)"

# --- 4: invariants between text and dispatch table.
$TV apply "$(at tcp_sync_mss "$ME")" cdf5 > /tmp/tv
echo "APPLY_NO_ENTRY=$(cat /tmp/tv)"
$TV apply "$(at tcp_sync_mss "$ME")" cdf6 > /tmp/tv
echo "APPLY_FOREIGN=$(cat /tmp/tv)"
snapshot /tmp/after
cmp -s /tmp/before /tmp/after && echo "TEXT_UNCHANGED=yes" || { echo "TEXT_UNCHANGED=no"; diff /tmp/before /tmp/after; }
trapctl splice $G0 --call empty_handler || exit 12
$TV remove "$getppid_site" > /tmp/tv
echo "REMOVE_LIVE=$(cat /tmp/tv)"
sysbench -n 50 > /dev/null
echo "HITS_AFTER_REMOVE=$(splice_hits)"
trapctl unsplice $G0
$TV info > /tmp/tv
echo "UNKNOWN_TRAPS=$(sed -n 's/.*unknown=\([0-9]*\).*/\1/p' /tmp/tv)"

# --- 7: a springboard. At __x64_sys_getsid+16 (`test ebx, ebx`, then the `jne` that ends the
# block) a 5-byte jmp does not fit: the jmp splice is a 2-byte jmp rel8 to a jmp rel32 written
# into padding nearby. getsid(0) runs the site on every call. The text around the site is read
# before, while and after: exactly the site and the springboard change, and both come back; the
# module's revert of the springboard (an RCU-tasks grace period after the jmp) is logged by its
# dynamic debug. Hits are exact against an ftrace kprobe at the function's entry.
# `bytes_at FILE`: the hex bytes of a `trapctl read` dump, one per line.
bytes_at() {
	awk '{ for (i = 2; i <= NF; i++) print $i }' "$1"
}
# `text_diff A B`: `offset:old>new` (offset from the site) for every byte that differs.
text_diff() {
	bytes_at "$1" > /tmp/a.bytes
	bytes_at "$2" > /tmp/b.bytes
	awk 'NR == FNR { a[NR] = $1; next } a[FNR] != $1 { printf "%d:%s>%s ", FNR - 129, a[FNR], $1 }' \
		/tmp/a.bytes /tmp/b.bytes
}
# 11 bytes past the entry: __x64_sys_getsid+16 on 6.1, +20 on 6.12.
SID=$(past_entry __x64_sys_getsid 11)
echo "SB_POINT=$SID"
sid_site=$(at __x64_sys_getsid "${SID#*+}")
around=$(printf '0x%x' $((0x$sid_site - 128)))
# The kprobe first: enabling it turns the function's ftrace NOP into a call, which is not ours.
echo 'p:sid __x64_sys_getsid' >> $T/kprobe_events
echo 1 > $T/events/kprobes/sid/enable
trapctl read "$around" 272 > /tmp/sid_before
echo 'module trapvec +p' > /sys/kernel/debug/dynamic_debug/control
k0=$(probe_hits sid)
trapctl splice $SID --count --mechanism jmp > /tmp/out 2>&1 || { cat /tmp/out; exit 15; }
echo "SB_SPLICE=$(cat /tmp/out)"
trapctl read "$around" 272 > /tmp/sid_live
echo "SB_LIVE_DIFF=$(text_diff /tmp/sid_before /tmp/sid_live)"
echo "SB_$(ppidloop -s -t 2 -n 3000)"
trapctl unsplice $SID > /tmp/out 2>&1
echo "SB_UNSPLICE=$(cat /tmp/out)"
k1=$(probe_hits sid)
echo "SB_KPROBE=$((k1 - k0))"
trapctl read "$around" 272 > /tmp/sid_after
echo "SB_AFTER_DIFF=$(text_diff /tmp/sid_before /tmp/sid_after)"
echo 'module trapvec -p' > /sys/kernel/debug/dynamic_debug/control
echo "SB_DEFERRED=$(dmesg | grep -c "springboard at .* reverted an RCU-tasks grace period after its jumpers")"
echo 0 > $T/events/kprobes/sid/enable
echo '-:sid' >> $T/kprobe_events

# --- 6: more entries than one batch, listed page by page; no soft lockup.
lockups=$(dmesg | grep -c 'soft lockup')
$TV scale 70000 > /tmp/tv
echo "SCALE=$(cat /tmp/tv)"
[ "$(dmesg | grep -c 'soft lockup')" -gt "$lockups" ] && echo "SOFT_LOCKUP=yes" || echo "SOFT_LOCKUP=no"

# --- 5: another vector. User space reads the module's vector from INFO and writes int <vector>;
# an int of any other vector is refused (FOREIGN_TRAP) rather than run.
rmmod trapvec
vec=none
for v in 0xf3 0xee 0xed; do
	insmod /trapvec.ko vector=$v 2> /dev/null && { vec=$v; break; }
done
echo "OTHER_VECTOR=$vec"
$TV info > /tmp/tv
echo "OTHER_INFO=$(cat /tmp/tv)"
$TV apply "$(at tcp_sync_mss "$ME")" "cd$(printf '%02x' $((vec)))" > /tmp/tv
echo "OTHER_NO_ENTRY=$(cat /tmp/tv)"
$TV apply "$(at tcp_sync_mss "$ME")" cdf5 > /tmp/tv
echo "OTHER_F5=$(cat /tmp/tv)"
trapctl load /components/empty.o > /dev/null
trapctl splice tcp_sync_mss --call empty_handler > /dev/null 2> /tmp/err || echo "ERR_OTHER_VECTOR=$(head -n 1 /tmp/err)"
echo "OTHER_SITE_BYTES=$(trapctl read $M0 2 | tr -d ' \n' | tail -c 4)"
tcpmss > /dev/null
tcpmss > /dev/null
echo "OTHER_HITS=$(trapctl list | awk '$1 == "tcp_sync_mss" { print $(NF-1) }')"
trapctl unsplice tcp_sync_mss > /dev/null && echo "OTHER_UNSPLICED=yes"
rmmod trapvec
insmod /trapvec.ko || exit 13
trapctl load /components/empty.o > /dev/null || exit 14

# --- 8: the die chain. A batch writes a CC at each site first (int3-first); here one site is in
# uprobes' die notifier, arch_uprobe_exception_notify(), which the kernel calls on every int3.
# While ppidloop takes the CC at __x64_sys_getppid, trapvec's notifier must run before uprobes'
# (it is first on the chain): otherwise every int3 runs into the CC in uprobes' notifier again,
# without end, and the guest freezes. Five rounds of apply and unsplice, calls checked.
printf '[[splice]]\nat = "__x64_sys_getppid"\naction = "count"\nmechanism = "jmp"\n\n[[splice]]\nat = "arch_uprobe_exception_notify"\naction = "count"\nmechanism = "jmp"\n' > /tmp/die.toml
rm -f /tmp/stopdie
ppidloop -t 2 -f /tmp/stopdie > /tmp/die.out &
dpid=$!
rounds=0
for i in 1 2 3 4 5; do
	trapctl apply /tmp/die.toml > /dev/null && trapctl unsplice --all > /dev/null && rounds=$((rounds + 1))
done
touch /tmp/stopdie
wait $dpid
echo "DIE_CHAIN_ROUNDS=$rounds"
echo "DIE_CHAIN_$(cat /tmp/die.out)"

# --- 3: kernel.modules_disabled, then lockdown (integrity); neither can be undone.
snapshot /tmp/before
echo 1 > /proc/sys/kernel/modules_disabled
refuse ERR_MODULES_DISABLED trapctl splice tcp_sync_mss --call empty_handler
$TV apply "$(at tcp_sync_mss "$ME")" cdf5 > /tmp/tv
echo "APPLY_MODULES_DISABLED=$(cat /tmp/tv)"
mount -t securityfs securityfs /sys/kernel/security 2> /dev/null
echo "LOCKDOWN_MODES=$(cat /sys/kernel/security/lockdown)"
echo integrity > /sys/kernel/security/lockdown
echo "LOCKDOWN_NOW=$(cat /sys/kernel/security/lockdown)"
refuse ERR_LOCKDOWN trapctl splice tcp_sync_mss --call empty_handler
$TV apply "$(at tcp_sync_mss "$ME")" cdf5 > /tmp/tv
echo "APPLY_LOCKDOWN=$(cat /tmp/tv)"
snapshot /tmp/after
cmp -s /tmp/before /tmp/after && echo "LOCKDOWN_UNCHANGED=yes" || { echo "LOCKDOWN_UNCHANGED=no"; diff /tmp/before /tmp/after; }
dmesg | grep -q -e 'BUG:' -e 'Oops' -e 'WARNING:' -e 'Call Trace' && { echo "DMESG_CLEAN=no"; dmesg | tail -n 40; } || echo "DMESG_CLEAN=yes"
exit 0
