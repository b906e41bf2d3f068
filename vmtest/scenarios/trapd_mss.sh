# trapd in the guest: live TCP MSS adaptation driven by the retransmission rate, kill -9 and
# restart, a non-root client, 10,000 malformed request lines, and two scrapes of the Prometheus
# endpoint (`listen`) beside `trapctl list --prometheus`, and trapd under trapd.service's
# capability bounding set (capbound). Needs --file trapd (the daemon)
# and --file trapd_fuzz.txt (the lines); run by vmtest/tests/trapd_mss.rs.
set -e
# 6.12's tc asks the kernel for the module alias net-sch-netem, which the guest's modprobe
# cannot resolve (no modules.alias): load netem by name first (6.1 asks for sch_netem itself).
modprobe sch_netem
cp /files/trapd /bin/trapd
chmod 755 /bin/trapd
mkdir -p /run /var/lib/trapd
export TRAPD_SOCKET=/run/trapd.sock
cat > /tmp/trapd.toml <<'EOF'
interval_ms = 500
listen = "127.0.0.1:9464"
min_dwell_s = 1
initial_profile = "clean"

[[metric]]
name = "retrans"
source = "snmp"
counter = "Tcp:RetransSegs"
per = "Tcp:OutSegs"

[[rule]]
metric = "retrans"
above = 5.0
activate = "lossy"

[[rule]]
metric = "retrans"
below = 0.5
for_s = 2
activate = "clean"

[profile.lossy]
components = ["/components/mss_clamp.o"]
splice = [{ at = "tcp_sync_mss", action = "replace", handler = "mss_clamp_tcp_sync_mss" }]
set = [{ symbol = "mss_clamp_mtu", value = 1000, size = 4 }]

[profile.clean]
EOF

start_trapd() {
	trapd --config /tmp/trapd.toml --journal /var/lib/trapd/journal >>/tmp/trapd.log 2>&1 &
	TRAPD_PID=$!
	i=0
	until trapd send '{"op":"status"}' >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 100 ]; then echo "trapd did not come up"; cat /tmp/trapd.log; exit 1; fi
		usleep 100000
	done
}

# print_prom NAME FILE: the exposition in FILE, each line prefixed `NAME|`, and its size.
print_prom() {
	echo "$1_BYTES=$(wc -c <"$2")"
	sed "s/^/$1|/" "$2"
}

# scrape NAME: GET /metrics from trapd's endpoint with busybox wget.
scrape() {
	timeout 30 wget -q -O "/tmp/$1.prom" http://127.0.0.1:9464/metrics
	print_prom "$1" "/tmp/$1.prom"
}

profile() {
	trapd send '{"op":"status"}' | grep -o '"profile":"[a-z]*"' | cut -d'"' -f4
}

# wait_profile NAME SECONDS
wait_profile() {
	i=0
	while [ "$(profile)" != "$1" ]; do
		i=$((i + 1))
		if [ $i -gt $(($2 * 5)) ]; then echo "profile is $(profile), not $1 after $2 s"; cat /tmp/trapd.log; exit 1; fi
		usleep 200000
	done
	echo "PROFILE=$1"
}

# An MSS measured while netem may drop the handshake: retried.
mss() {
	for _ in 1 2 3 4 5; do
		if m=$(tcpmss); then echo "$m"; return 0; fi
	done
	return 1
}

before=$(tcpmss)
echo "MSS_BEFORE=$before"
start_trapd
wait_profile clean 5

tcpmss --traffic 300 >/dev/null 2>&1 &
TRAFFIC=$!

echo "--- loss on: expect lossy"
tc qdisc add dev lo root netem loss 20%
wait_profile lossy 60
echo "MSS_LOSSY=$(mss)"
echo "--- loss off: expect clean"
tc qdisc del dev lo root
wait_profile clean 60
echo "MSS_CLEAN=$(tcpmss)"

echo "--- loss on, then kill -9 the daemon while lossy"
tc qdisc add dev lo root netem loss 20%
wait_profile lossy 60
kill -9 "$TRAPD_PID"
wait "$TRAPD_PID" 2>/dev/null || true
# The loss stays on until the restarted daemon has been read: with it off, the daemon's first
# rule tick may switch to clean before the reads (a loaded host made that race visible).
echo "MSS_ORPHANED=$(mss)"
start_trapd
echo "RESTART_PROFILE=$(profile)"
list=$(trapd send '{"op":"list"}')
echo "LIST_AFTER_RESTART=$list"
echo "LIVE_SPLICES=$(echo "$list" | grep -o '"at":"[a-z_]*"' | tr '\n' ' ')"
echo "UNRECORDED=$(echo "$list" | grep -o '"unrecorded":\[[^]]*\]')"
tc qdisc del dev lo root
echo "--- switching still works after the restart"
wait_profile clean 60
echo "MSS_AFTER_RESTART=$(tcpmss)"

echo "--- trapctl while trapd holds /dev/trapvec: it goes through the daemon"
# The traffic stream ends here: the count below is of the two connections it makes (once, on
# 6.12, a count with the stream still running was 14 where they make 10). Without traffic the
# rules keep `clean` (below).
kill "$TRAFFIC" 2>/dev/null || true
wait "$TRAFFIC" 2>/dev/null || true
# Every command is bounded: one that waited for the device's lock instead would hang here.
timeout 120 trapctl count tcp_sync_mss --seconds 6 >/tmp/count.out &
COUNT=$!
i=0
until grep -q '^counting' /tmp/count.out; do
	i=$((i + 1))
	if [ $i -gt 600 ]; then echo "trapctl count did not start"; break; fi
	usleep 100000
done
tcpmss >/dev/null
tcpmss >/dev/null
wait "$COUNT"
echo "TRAPCTL_COUNT=$(tail -n 1 /tmp/count.out)"
timeout 120 trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss
timeout 120 trapctl set mss_clamp_mtu 1400
echo "TRAPCTL_GET=$(timeout 120 trapctl get mss_clamp_mtu)"
echo "MSS_TRAPCTL=$(tcpmss)"
echo "--- Prometheus: trapd's endpoint, then trapctl list --prometheus (through the daemon)"
scrape PROM_SPLICED
timeout 120 trapctl list --prometheus >/tmp/textfile.prom
print_prom PROM_TEXTFILE /tmp/textfile.prom
timeout 120 trapctl list >/tmp/list.out
cat /tmp/list.out
echo "TRAPCTL_LIST_PROFILE=$(grep '^trapd profile:' /tmp/list.out | cut -d' ' -f3)"
echo "TRAPCTL_LIST_SPLICES=$(grep -c '^tcp_sync_mss ' /tmp/list.out)"
echo "IN_PROFILE=$(trapd send '{"op":"list"}' | grep -o '"in_profile":[a-z]*')"
echo "TRAPCTL_UNSPLICE=$(timeout 120 trapctl unsplice tcp_sync_mss | cut -d: -f1)"
echo "MSS_AFTER_TRAPCTL=$(tcpmss)"
timeout 120 trapctl set mss_clamp_mtu 1000

echo "--- a non-root client"
set +e
su nobody -c "TRAPD_SOCKET=/run/trapd.sock /bin/trapd send '{\"op\":\"activate\",\"profile\":\"lossy\"}'" >/tmp/nobody.out 2>&1
echo "NOBODY_STATUS=$?"
set -e
echo "NOBODY_REPLY=$(cat /tmp/nobody.out)"
echo "PROFILE_AFTER_NOBODY=$(profile)"

echo "--- 10,000 malformed lines, and requests cut off by the client leaving"
# No TCP traffic from here on: the rules keep `clean`, so any change would be the lines' doing.
kill "$TRAFFIC" 2>/dev/null || true
wait "$TRAFFIC" 2>/dev/null || true
gen_before=$(trapd send '{"op":"status"}' | grep -o '"generation":[0-9]*')
list_before=$(trapd send '{"op":"list"}' | sed 's/"hits":[0-9]*//g')
set +e
trapd send </files/trapd_fuzz.txt >/tmp/fuzz.out
echo "FUZZ_STATUS=$?"
set -e
echo "FUZZ_REPLIES=$(wc -l </tmp/fuzz.out)"
echo "FUZZ_OK_REPLIES=$(grep -c '"ok":true' /tmp/fuzz.out || true)"
for _ in 1 2 3 4 5 6 7 8 9 10; do
	printf '{"op":"activate","profile":"lossy"' | trapd send >/dev/null 2>&1 || true
	printf '{"op":"load","path":"/components/mss_clamp.o"}' | trapd send >/dev/null 2>&1 || true
done
gen_after=$(trapd send '{"op":"status"}' | grep -o '"generation":[0-9]*')
list_after=$(trapd send '{"op":"list"}' | sed 's/"hits":[0-9]*//g')
echo "GEN_BEFORE=$gen_before GEN_AFTER=$gen_after"
[ "$gen_before" = "$gen_after" ] && [ "$list_before" = "$list_after" ] && echo "FUZZ_KERNEL_UNCHANGED=yes"
echo "PROFILE_AFTER_FUZZ=$(profile)"
scrape PROM_AFTER_FUZZ

echo "--- trapd with only trapd.service's CapabilityBoundingSet, then with one of it missing"
kill "$TRAPD_PID"
wait "$TRAPD_PID" 2>/dev/null || true
# caps_trapd CAPS KEY: trapd with only CAPS (capbound, vmtest/helpers); KEY=up and how many of a
# splice and an unsplice through the module succeeded, or KEY=down and trapd's last words.
caps_trapd() {
	capbound "$1" trapd --config /tmp/trapd.toml --journal /var/lib/trapd/journal >/tmp/caps.log 2>&1 &
	pid=$!
	i=0
	until trapd send '{"op":"status"}' >/dev/null 2>&1; do
		i=$((i + 1))
		if ! kill -0 "$pid" 2>/dev/null || [ $i -gt 150 ]; then
			echo "$2=down: $(tail -n 1 /tmp/caps.log)"
			kill "$pid" 2>/dev/null || true
			wait "$pid" 2>/dev/null || true
			return 0
		fi
		usleep 100000
	done
	n=$(trapd send '{"op":"splice","at":"tcp_sync_mss","action":"count"}' '{"op":"unsplice","at":"tcp_sync_mss"}' | grep -c '"ok":true' || true)
	echo "$2=up ok=$n"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}
caps_trapd sys_module,syslog CAPS_SERVICE
caps_trapd sys_module CAPS_NO_SYSLOG
caps_trapd syslog CAPS_NO_SYS_MODULE

echo "--- trapd log"
cat /tmp/trapd.log
echo "SCENARIO_DONE=yes"
