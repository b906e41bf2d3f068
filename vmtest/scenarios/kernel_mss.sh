#!/bin/sh
# trapctl against the real kernel: count tcp_sync_mss calls while loopback connections are
# opened, then hot-swap the MSS policy with mss_clamp.o by trap and by jmp, tune it live with
# `trapctl set`, and unsplice. Prints KEY=value lines that vmtest/tests/kernel_mss.rs checks.
#
# One fresh loopback connection calls tcp_sync_mss exactly 5 times: on the client in
# tcp_connect_init (connect), in tcp_ack's window update and in tcp_rcv_synsent_state_process
# (the SYN-ACK); on the server in tcp_v4_syn_recv_sock (the child socket) and in tcp_ack's window
# update (the handshake's last ACK). Nothing else in the guest uses TCP.
set -eu

connections=7

# Count: the trap is live once `counting` is printed; drive the function only then.
trapctl count tcp_sync_mss --seconds 6 > /tmp/count.out &
count_pid=$!
until grep -q '^counting' /tmp/count.out 2>/dev/null; do sleep 0.1; done
tcpmss -n "$connections" > /dev/null
wait "$count_pid"
cat /tmp/count.out
echo "COUNT_CONNECTIONS=$connections"
echo "COUNT_CALLS=$(sed -n 's/^tcp_sync_mss: \([0-9]*\) calls.*/\1/p' /tmp/count.out)"
echo "COUNT_LEFT=$(trapctl list --json | grep -c '"point"' || true)"

trapctl read tcp_sync_mss > /tmp/before.hex
echo "MSS_BEFORE=$(tcpmss)"
trapctl load /components/mss_clamp.o
for mech in trap jmp; do
	trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss --mechanism "$mech"
	echo "MSS_${mech}_CLAMPED=$(tcpmss)"
	trapctl set mss_clamp_mtu 1400
	echo "MSS_${mech}_GET=$(trapctl get mss_clamp_mtu)"
	echo "MSS_${mech}_TUNED=$(tcpmss)"
	trapctl list
	trapctl unsplice tcp_sync_mss
	echo "MSS_${mech}_AFTER=$(tcpmss)"
	trapctl set mss_clamp_mtu 1000
	trapctl read tcp_sync_mss > /tmp/after.hex
	if cmp -s /tmp/before.hex /tmp/after.hex; then
		echo "BYTES_${mech}_RESTORED=yes"
	else
		echo "BYTES_${mech}_RESTORED=no"
		diff /tmp/before.hex /tmp/after.hex || true
	fi
done
trapctl unload mss_clamp
trapctl list
