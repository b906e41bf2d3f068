#!/bin/sh
# A kprobe armed on a live patch pins trapvec.ko (issue 24 item 6). register_kprobe() reads the
# kprobes blacklist before it takes kprobe_mutex, so a registration racing an APPLY can land
# on a live patch. That race is too narrow to time, so the module is loaded with its test knob
# kprobe_blacklist=0 (live patches stay off the blacklist) and the probe is registered plainly.
# Then: the next APPLY finds it, dmesg names the site and the probe, rmmod is refused (in use);
# once the probe is removed the module lets itself go within a second or two and rmmod
# succeeds, reverting the live patches.
# Files (vmtest --file): tvraw (vmtest/tests/fixtures/tvraw.c), and the module to test if not
# the packed one.
# Prints KEY=value lines that vmtest/tests/kernel_kprobe_pin.rs checks.
set -eu
. /lib/scenario.sh
T=/sys/kernel/tracing
M=/sys/module/trapvec

# tv_kprobe_pin.module=NAME on the kernel command line tests /files/NAME instead (how the
# module without the pin was shown to fail).
module=$(sed -n 's/.*tv_kprobe_pin\.module=\([^ ]*\).*/\1/p' /proc/cmdline)
rmmod trapvec
insmod "${module:+/files/}${module:-/trapvec.ko}" kprobe_blacklist=0
echo "BLACKLIST_KNOB=$(cat $M/parameters/kprobe_blacklist)"
# The probe keeps its int3 (an optimized one would be a jmp over our trap and the next bytes).
echo 0 > /proc/sys/debug/kprobes-optimization

# tcp_sync_mss runs only with TCP traffic: nothing calls it here, so the probe never runs the
# trap it copied. The point is the first instruction past the entry's kernel-owned bytes
# (tcp_sync_mss+5 on 6.1, +9 on 6.12), printed for the test.
mss_site=$(past_entry tcp_sync_mss 0)
echo "MSS_SITE=$mss_site"
trapctl splice --count "$mss_site"
echo "REFCNT_BEFORE=$(cat $M/refcnt)"
echo "KERNEL=$(uname -r)"
# 6.12's can_probe() refuses a kprobe on an `int n` instruction (EILSEQ): there no kprobe can
# land on a live trap, only on a jmp splice's `jmp rel32`, so the pin is shown on one of those.
if echo "p:tvpin/mss $mss_site" >> $T/kprobe_events 2> /tmp/kp.err; then
	echo "KPROBE_ON_TRAP=accepted"
else
	echo "KPROBE_ON_TRAP=refused: $(cat /tmp/kp.err)"
	trapctl unsplice "$mss_site"
	trapctl splice --count --mechanism jmp "$mss_site"
	echo "p:tvpin/mss $mss_site" >> $T/kprobe_events
fi
echo 1 > $T/events/tvpin/mss/enable
echo "PROBES=$(grep -c tcp_sync_mss /sys/kernel/debug/kprobes/list)"

# trapctl itself would now refuse to start: the state it restores says the site holds our
# trap, and it holds the probe's int3. The raw helper (tvraw) makes the requests instead.
# Any APPLY looks: an identity patch of one byte elsewhere (push rbx past __x64_sys_getppid's
# entry).
ppid=$(addr __x64_sys_getppid)
echo "TOUCH=$(/files/tvraw touch "$(printf '%x' $((0x$ppid + $(entry_len __x64_sys_getppid))))" 1)"
echo "REFCNT_PINNED=$(cat $M/refcnt)"
dmesg | grep 'is armed on the live patch' | tail -n 1 | sed 's/^\[[^]]*\] */PIN_LINE=/'
# And QUIESCE, which names the probe again.
echo "QUIESCE=$(/files/tvraw quiesce)"
echo "PIN_LINES=$(dmesg | grep -c 'is armed on the live patch')"
status=0
rmmod trapvec 2> /tmp/rmmod.err || status=$?
echo "RMMOD_PINNED_STATUS=$status"
echo "RMMOD_PINNED_ERR=$(cat /tmp/rmmod.err)"
echo "LOADED_PINNED=$(grep -c '^trapvec ' /proc/modules || true)"

echo 0 > $T/events/tvpin/mss/enable
echo '-:tvpin/mss' >> $T/kprobe_events
# The module's work looks again every second.
i=0
while [ -e $M/refcnt ] && [ "$(cat $M/refcnt)" != 0 ] && [ $i -lt 30 ]; do
	sleep 1
	i=$((i + 1))
done
echo "REFCNT_AFTER=$(cat $M/refcnt 2>/dev/null || echo gone)"
dmesg | grep 'unload is allowed again' | tail -n 1 | sed 's/^\[[^]]*\] */UNPIN_LINE=/'
status=0
rmmod trapvec || status=$?
echo "RMMOD_AFTER_STATUS=$status"
echo "LOADED_AFTER=$(grep -c '^trapvec ' /proc/modules || true)"
dmesg | grep 'reverted .* live patches' | tail -n 1 | sed 's/^\[[^]]*\] */REVERT_LINE=/'
insmod /trapvec.ko
echo "KPROBE_PIN_DONE"
