#!/bin/sh
# Splice/unsplice cycles (trapvec_stress.cycles=N on the kernel command line, default 500; CI
# runs 200) of the mss_clamp replacement of tcp_sync_mss, alternating trap and jmp, while
# loopback TCP connections are opened and data streams; then `rmmod trapvec` with a trap and a
# jmp splice live, and `insmod` again. Prints KEY=value lines that
# vmtest/tests/kernel_stress.rs checks (vmtest itself fails the run on any kernel warning).
set -eu

cycles=$(sed -n 's/.*trapvec_stress\.cycles=\([0-9]*\).*/\1/p' /proc/cmdline)
cycles=${cycles:-500}

trapctl read tcp_sync_mss > /tmp/mss_before.hex
trapctl read __x64_sys_getppid > /tmp/getppid_before.hex
trapctl load /components/mss_clamp.o

# Traffic: connections one after another (each calls tcp_sync_mss 5 times), and a stream whose
# every byte the receiver checks.
tcpmss -n 1000000 > /tmp/conns.out 2>&1 &
conns=$!
tcpmss --traffic 30 > /tmp/traffic.out 2>&1 &
traffic=$!

trapctl cycle tcp_sync_mss --replace mss_clamp_tcp_sync_mss --mechanism both --times "$cycles" | tee /tmp/cycle.out
echo "CYCLES_DONE=$(sed -n 's/^\([0-9]*\) cycles.*/\1/p' /tmp/cycle.out)"

kill "$conns" 2>/dev/null || true
wait "$conns" 2>/dev/null || true
# The stream ran during the first cycles; its receiver checked every byte.
if wait "$traffic"; then echo "TRAFFIC_BYTES=$(cat /tmp/traffic.out)"; else echo "TRAFFIC_FAILED=$(cat /tmp/traffic.out)"; fi
echo "CONNECTIONS=$(wc -l < /tmp/conns.out)"
# Every connection saw the kernel's MSS or the clamped one, never anything else.
echo "MSS_SEEN=$(sort -u /tmp/conns.out | tr '\n' ' ')"
trapctl read tcp_sync_mss > /tmp/mss_after.hex
cmp -s /tmp/mss_before.hex /tmp/mss_after.hex && echo "STRESS_RESTORED=yes" || echo "STRESS_RESTORED=no"

# rmmod with splices live: a trap on tcp_sync_mss, a jmp on __x64_sys_getppid.
trapctl load /components/empty.o
trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss
trapctl splice __x64_sys_getppid --call empty_handler --mechanism jmp
echo "LIVE_MSS=$(tcpmss)"
trapctl read tcp_sync_mss > /tmp/mss_live.hex
cmp -s /tmp/mss_before.hex /tmp/mss_live.hex && echo "LIVE_PATCHED=no" || echo "LIVE_PATCHED=yes"
rmmod trapvec
dmesg | grep 'trapvec: ' | tail -n 3
echo "RMMOD_MSS=$(tcpmss)"
insmod /trapvec.ko
echo "REINSMOD=yes"
# The state went with the old module; the bytes are the kernel's own again.
trapctl list
echo "STATE_AFTER_RELOAD=$(trapctl list --json | grep -c '"point"' || true)"
trapctl read tcp_sync_mss > /tmp/mss_reload.hex
trapctl read __x64_sys_getppid > /tmp/getppid_reload.hex
cmp -s /tmp/mss_before.hex /tmp/mss_reload.hex && cmp -s /tmp/getppid_before.hex /tmp/getppid_reload.hex \
	&& echo "RELOAD_RESTORED=yes" || echo "RELOAD_RESTORED=no"
# The gate is the module's again (insmod refuses a gate that is not the kernel's spurious entry).
trapctl load /components/mss_clamp.o
trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss
echo "RELOAD_MSS=$(tcpmss)"
trapctl unsplice --all
