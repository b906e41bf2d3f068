#!/bin/sh
# The module's ioctl surface under random and mutated requests (vmtest/helpers/ioctl_fuzz.c) as
# root, with splices live and the spliced functions called all the while: a trap splice calling
# a handler on tcp_sync_mss (loopback connections one after another) and a jmp splice on
# __x64_sys_getppid+5 (+9 on 6.12; getppid() in a loop), with the fuzzer aiming at __x64_sys_getppid. Then
# the live splices still count and come off cleanly, the module's counters are back where they
# were, its count of its own allocations (/sys/module/trapvec/parameters/allocations, kmod/mem.c)
# is back at its baseline, rmmod logs "0 allocations outstanding", and insmod works again. The run lasts `trapvec_fuzz_seconds=N` from the kernel command
# line (default 20; the long run is opt-in, see vmtest/tests/kernel_ioctl_fuzz.rs). vmtest fails
# the run on any oops, BUG or WARNING. Prints KEY=value lines the test checks.
set -u
. /lib/scenario.sh

seconds=$(sed -n 's/.*trapvec_fuzz_seconds=\([0-9]*\).*/\1/p' /proc/cmdline)
seconds=${seconds:-20}
echo "FUZZ_SECONDS=$seconds"

# "<kind> <objects> <bytes>" lines as one "kind objects bytes,..." value.
allocations() { tr '\n' ',' < /sys/module/trapvec/parameters/allocations; }
echo "ALLOC_BASE=$(allocations)"

trapctl read tcp_sync_mss > /tmp/mss_before.hex
trapctl read __x64_sys_getppid > /tmp/getppid_before.hex
trapctl load /components/empty.o || exit 10
trapctl splice tcp_sync_mss --call empty_handler || exit 11
getppid_point=$(past_entry __x64_sys_getppid 0)
trapctl splice "$getppid_point" --call empty_handler --mechanism jmp || exit 12

echo "ALLOC_LIVE=$(allocations)"

tcpmss -n 100000000 > /tmp/conns.out 2>&1 &
conns=$!
sysbench -n 1000000000 > /dev/null 2>&1 &
calls=$!

text=$(awk '$3 == "__x64_sys_getppid" { print $1; exit }' /proc/kallsyms)
ioctl_fuzz "$seconds" 0x5eed "$text" > /tmp/fuzz.out 2> /tmp/fuzz.err
echo "FUZZ_EXIT=$?"
cat /tmp/fuzz.out
head -n 5 /tmp/fuzz.err

kill "$conns" "$calls" 2>/dev/null
wait "$conns" "$calls" 2>/dev/null
# The connections opened while the fuzzer ran all got the kernel's MSS (the handler is empty).
echo "CONNECTIONS=$(wc -l < /tmp/conns.out)"
echo "MSS_SEEN=$(sort -u /tmp/conns.out | tr '\n' ' ')"

# The live splices survived the fuzzer: listed, counting, and removable.
trapctl list > /tmp/list.out 2>&1
echo "LIST_EXIT=$?"
cat /tmp/list.out
echo "MSS_HITS=$(awk '$1 == "tcp_sync_mss" { print $(NF-1) }' /tmp/list.out)"
echo "GETPPID_LISTED=$(grep -c "^$getppid_point " /tmp/list.out)"
trapctl unsplice --all > /dev/null && echo "UNSPLICED=yes" || echo "UNSPLICED=no"
trapctl unload empty > /dev/null && echo "UNLOADED=yes" || echo "UNLOADED=no"
trapctl read tcp_sync_mss > /tmp/mss_after.hex
trapctl read __x64_sys_getppid > /tmp/getppid_after.hex
cmp -s /tmp/mss_before.hex /tmp/mss_after.hex && cmp -s /tmp/getppid_before.hex /tmp/getppid_after.hex \
	&& echo "RESTORED=yes" || echo "RESTORED=no"
# The blocks unsplice and unload freed are reclaimed at the next QUIESCE.
echo "QUIESCE_AFTER=$(/files/tvraw quiesce)"
echo "ALLOC_END=$(allocations)"

rmmod trapvec && echo "RMMOD=yes" || echo "RMMOD=no"
echo "UNLOAD_LINE=$(dmesg | grep 'trapvec: unloaded' | tail -n 1 | sed 's/^\[[^]]*\] //')"
insmod /trapvec.ko && echo "REINSMOD=yes" || echo "REINSMOD=no"
trapctl list > /dev/null && echo "LIST_AFTER_RELOAD=yes" || echo "LIST_AFTER_RELOAD=no"
