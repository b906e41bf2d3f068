#!/bin/sh
# The kernel demo (`make demo`): in the real Debian kernel under QEMU, with trapvec.ko loaded,
# count tcp_sync_mss while loopback connections are opened, hot-swap the MSS policy with
# mss_clamp.o, tune it live with `trapctl set`, remove it, and show the MSS before, during and
# after.
set -eu

say() { printf '\n=== %s\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
mss() { printf 'new loopback connection: TCP_MAXSEG = %s\n' "$(tcpmss)"; }

say "trapvec kernel demo on Linux $(uname -r) ($(nproc) CPUs, QEMU TCG)"
dmesg | grep 'trapvec: ready' | sed 's/^\[[^]]*\] /kernel: /'

say "0. What this machine allows (exit status 1 if something the kernel commands need is missing)"
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null || true  # as systemd mounts it
run trapctl doctor

say "1. Count tcp_sync_mss calls while 4 loopback connections are opened"
trapctl count tcp_sync_mss --seconds 5 > /tmp/count.out &
count=$!
until grep -q '^counting' /tmp/count.out 2>/dev/null; do sleep 0.1; done
printf '$ trapctl count tcp_sync_mss --seconds 5\n'
head -n 1 /tmp/count.out
run tcpmss -n 4 > /dev/null
wait "$count"
tail -n 1 /tmp/count.out
echo "(5 calls per connection: connect, SYN-ACK and window update on the client; child socket and window update on the server)"

say "2. The MSS policy of the running kernel"
mss
before=$(tcpmss)

say "3. Hot-swap it: load mss_clamp.o and replace tcp_sync_mss (trap at its entry, past the ftrace NOP)"
run trapctl load /components/mss_clamp.o
run trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss
printf 'mss_clamp_mtu = %s\n' "$(trapctl get mss_clamp_mtu)"
mss
during=$(tcpmss)

say "4. Tune it live: no reload, one store into the component's variable"
run trapctl set mss_clamp_mtu 1400
mss
tuned=$(tcpmss)
run trapctl list

say "5. Remove it: the kernel's own bytes and policy are back"
run trapctl unsplice tcp_sync_mss
run trapctl unload mss_clamp
mss
after=$(tcpmss)
run trapctl list

say "MSS before $before, during $during (MTU ceiling 1000) and $tuned (1400), after $after"
[ "$before" = 32741 ] && [ "$during" = 948 ] && [ "$tuned" = 1348 ] && [ "$after" = "$before" ]
