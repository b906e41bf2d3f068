# trapd.service under systemd as PID 1: the unit, trapd, trapctl and trapd.toml exactly as the
# trapvec-tools package installs them (an extracted .deb), the module where trapvec-dkms's DKMS
# puts it. `systemctl enable` and `start` (ExecStartPre's modprobe loads the module), the
# hardening systemd reports and what the running trapd is actually under (its capabilities,
# seccomp, no_new_privs, its mount namespace: what it can and cannot write, its private /tmp,
# its device cgroup), then work through the daemon with trapctl (load, count, splice, set,
# hits), its journal in /var/lib/trapd, `systemctl restart`, a `kill -9` that Restart=on-failure
# undoes, `systemctl stop`, and the way back to a clean kernel.
# Needs `vmtest run --systemd --tree <dpkg-deb -x of trapvec-tools>`; run by
# vmtest/tests/trapd_systemd.rs.
set -e
# The packaged programs (/usr/bin) before vmtest's own trapctl (/bin). kmod's depmod, modinfo
# and rmmod are called by path: a bare name would run busybox's applet (README, "The guest").
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SYSTEMD_COLORS=0 SYSTEMD_PAGER= SYSTEMD_LESS=

on_exit() {
	status=$?
	if [ "$status" -ne 0 ]; then
		echo "--- failed (status $status): trapd's unit and journal"
		systemctl status trapd --no-pager -l || true
		journalctl -u trapd --no-pager -o short-monotonic | tail -n 40 || true
	fi
}
trap on_exit EXIT

# wait_for SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
	n=$(($1 * 10))
	shift
	until "$@"; do
		n=$((n - 1))
		if [ "$n" -le 0 ]; then echo "timed out waiting for: $*"; return 1; fi
		usleep 100000
	done
}

main_pid() {
	systemctl show -P MainPID trapd
}

# hits POINT: the HITS column of `trapctl list` (ACTION may hold a space: counted from the end).
hits() {
	trapctl list | awk -v p="$1" '$1 == p { print $(NF - 1) }'
}

# live: the points the daemon lists as spliced, and what it does not know.
live() {
	list=$(trapd send '{"op":"list"}')
	echo "$list" | grep -o '"at":"[a-z_]*"' | tr '\n' ' '
	echo "$list" | grep -o '"unrecorded":\[[^]]*\]'
}

echo "PID1=$(cat /proc/1/comm)"
echo "UNIT_FILE=$(systemctl show -P FragmentPath trapd)"
# Not started at boot: the unit is installed, not enabled (trapvec-tools's postinst).
echo "ACTIVE_BEFORE=$(systemctl is-active trapd || true)"
echo "--- no module for modprobe yet (not in modules.dep): the start fails with modprobe's message"
systemctl start --no-block trapd
wait_for 60 sh -c 'journalctl -u trapd -o cat | grep -q "^modprobe: FATAL"'
echo "NO_MODULE=$(journalctl -u trapd -o cat | grep -m 1 '^modprobe: FATAL')"
echo "NO_MODULE_MAIN_PID=$(main_pid)"
systemctl stop trapd
echo "--- what installing trapvec-dkms leaves: trapvec.ko in updates/dkms, then depmod"
/sbin/depmod -a "$(uname -r)" 2>/dev/null
echo "MODULE_FILE=$(/sbin/modinfo -F filename trapvec)"
echo "LOADED_BEFORE=$(grep -c '^trapvec ' /proc/modules || true)"

echo "--- systemctl enable --now trapd"
systemctl enable trapd
echo "ENABLED=$(systemctl is-enabled trapd)"
echo "WANTED_BY=$(readlink /etc/systemd/system/multi-user.target.wants/trapd.service)"
echo "MSS_BEFORE=$(tcpmss)"
systemctl start trapd
echo "ACTIVE=$(systemctl is-active trapd)"
echo "LOADED_BY_UNIT=$(grep -c '^trapvec ' /proc/modules || true)"
wait_for 30 test -S /run/trapd/trapd.sock
pid=$(main_pid)
echo "MAIN_EXE=$(readlink "/proc/$pid/exe")"
echo "SOCKET_LINK=$(readlink /run/trapd.sock)"
echo "SOCKET_MODE=$(stat -c %a /run/trapd/trapd.sock)"

echo "--- the hardening as systemd reports it"
for p in ProtectSystem ReadWritePaths StateDirectory StateDirectoryMode RuntimeDirectory \
	ProtectHome PrivateTmp DevicePolicy DeviceAllow CapabilityBoundingSet AmbientCapabilities \
	NoNewPrivileges ProtectKernelTunables ProtectKernelModules ProtectKernelLogs \
	ReadOnlyPaths InaccessiblePaths ProtectControlGroups ProtectClock ProtectHostname RestrictAddressFamilies RestrictNamespaces \
	RestrictRealtime RestrictSUIDSGID LockPersonality MemoryDenyWriteExecute \
	SystemCallArchitectures SystemCallErrorNumber UMask Restart; do
	echo "PROP_$p=$(systemctl show -P "$p" trapd)"
done
filter=" $(systemctl show -P SystemCallFilter trapd) "
for call in ioctl flock finit_module socket mount pivot_root kexec_load; do
	case "$filter" in
	*" $call "*) echo "FILTER_$call=allowed" ;;
	*) echo "FILTER_$call=denied" ;;
	esac
done

echo "--- what the running trapd is under (/proc/$pid)"
for f in CapBnd CapEff CapPrm CapAmb NoNewPrivs Seccomp; do
	echo "STATUS_$f=$(awk -v f="$f:" '$1 == f { print $2 }' "/proc/$pid/status")"
done
[ "$(readlink "/proc/$pid/ns/mnt")" != "$(readlink /proc/1/ns/mnt)" ] && echo "OWN_MOUNT_NS=yes"
# mount_opt PATH: whether the mount at PATH in trapd's namespace is ro or rw.
mount_opt() {
	awk -v p="$1" '$5 == p { split($6, o, ","); print o[1] }' "/proc/$pid/mountinfo" | tail -n 1
}
echo "ROOT_MOUNT=$(mount_opt /)"
echo "STATE_MOUNT=$(mount_opt /var/lib/trapd)"
echo "RUN_MOUNT=$(mount_opt /run) $(mount_opt /run/trapd)"
# write DIR: a file created and removed in DIR from trapd's mount namespace (as root with every
# capability: only the mounts can refuse), `ok` or the error.
write() {
	if nsenter -t "$pid" -m sh -c "echo x >'$1/.vmtest' && rm '$1/.vmtest'" 2>/tmp/write.err; then
		echo ok
	else
		sed -n '1s/.*: //p' /tmp/write.err
	fi
}
for d in /usr /etc /var/lib /var/lib/trapd /run /run/trapd /root /home /tmp; do
	echo "WRITE_$d=$(write "$d")"
done
# A sysctl written back with its own value: refused only if /proc/sys is read-only.
echo "WRITE_/proc/sys=$(nsenter -t "$pid" -m sh -c 'cat /proc/sys/kernel/kptr_restrict >/proc/sys/kernel/kptr_restrict' 2>&1 | sed -n '1s/.*: //p')"
# What trapd itself may read: as root with only the unit's capabilities (capbound), since an
# inaccessible path is a mode 000 node that CAP_DAC_OVERRIDE would still open.
as_trapd() {
	nsenter -t "$pid" -m capbound sys_module,syslog "$@"
}
echo "READ_/proc/kcore=$(as_trapd head -c 1 /proc/kcore 2>&1 >/dev/null | sed -n '1s/.*: //p')"
echo "READ_/proc/kallsyms=$(as_trapd grep ' T tcp_sync_mss$' /proc/kallsyms | cut -c1-16)"
echo host >/tmp/host-marker
echo "SEES_HOST_TMP=$(nsenter -t "$pid" -m sh -c 'test -e /tmp/host-marker && echo yes || echo no')"
# open DEV: opened by a shell moved into trapd's cgroup (DevicePolicy=, DeviceAllow=).
cgroup=/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
open() {
	if sh -c "echo \$\$ >'$cgroup/cgroup.procs' && exec head -c 0 '$1'" 2>/tmp/open.err; then
		echo ok
	else
		sed -n '1s/.*: //p' /tmp/open.err
	fi
}
echo "OPEN_/dev/trapvec=$(open /dev/trapvec)"
echo "OPEN_/dev/kmsg=$(open /dev/kmsg)"
echo "OPEN_/dev/kmsg_OUTSIDE=$(head -c 0 /dev/kmsg && echo ok)"

echo "--- work through the daemon with the packaged trapctl"
trapctl list
# via_daemon: 1 when trapctl's listing came from trapd (only trapd's has `unrecorded`), 0 when
# trapctl read /dev/trapvec itself.
via_daemon() {
	trapctl list --json | grep -c '"unrecorded"' || true
}
echo "LIST_VIA_DAEMON=$(via_daemon)"
cp /components/mss_clamp.o /tmp/mss_clamp.o
set +e
trapctl load /tmp/mss_clamp.o >/tmp/load.out 2>&1
echo "LOAD_FROM_TMP_STATUS=$?"
set -e
echo "LOAD_FROM_TMP=$(head -n 1 /tmp/load.out)"
mkdir -p /root/components
cp /components/mss_clamp.o /root/components/mss_clamp.o
echo "LOAD_FROM_HOME=$(trapctl load /root/components/mss_clamp.o | head -n 1 | cut -d' ' -f1-2)"
timeout 120 trapctl count tcp_sync_mss --seconds 6 >/tmp/count.out &
count=$!
wait_for 60 grep -q '^counting' /tmp/count.out
tcpmss >/dev/null
tcpmss >/dev/null
wait "$count"
echo "COUNT=$(tail -n 1 /tmp/count.out)"
trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss
trapctl set mss_clamp_mtu 1000
echo "MSS_SPLICED=$(tcpmss)"
tcpmss -n 2 >/dev/null
echo "HITS=$(hits tcp_sync_mss)"
echo "STATE_DIR=$(stat -c '%a %U' /var/lib/trapd)"
echo "JOURNAL=$(stat -c '%a %U' /var/lib/trapd/journal)"
echo "JOURNAL_DONE=$(grep -c '"event":"done"' /var/lib/trapd/journal)"
echo "JOURNAL_SET=$(grep -c '"op":"set","symbol":"mss_clamp_mtu"' /var/lib/trapd/journal)"

echo "--- systemctl restart trapd, with the Prometheus endpoint on (scraped below)"
# As an administrator turns it on: the conffile's commented `listen` line.
sed -i 's/^# listen = /listen = /' /etc/trapvec/trapd.toml
echo "LISTEN=$(grep '^listen' /etc/trapvec/trapd.toml)"
systemctl restart trapd
wait_for 30 test -S /run/trapd/trapd.sock
pid2=$(main_pid)
[ "$pid2" != "$pid" ] && echo "RESTART_NEW_PID=yes"
echo "JOURNAL_AFTER_RESTART=$(wc -l </var/lib/trapd/journal) $(grep -c '"event":"checkpoint"' /var/lib/trapd/journal)"
echo "LIVE_AFTER_RESTART=$(live)"
echo "MSS_AFTER_RESTART=$(tcpmss)"
echo "GET_AFTER_RESTART=$(trapctl get mss_clamp_mtu)"
echo "HITS_AFTER_RESTART=$(hits tcp_sync_mss)"

echo "--- kill -9: Restart=on-failure brings trapd back after RestartSec=5s"
restarts=$(systemctl show -P NRestarts trapd)
echo "NRESTARTS_BEFORE_KILL=$restarts"
systemctl kill -s KILL trapd
wait_for 60 sh -c "[ \"\$(systemctl show -P NRestarts trapd)\" = $((restarts + 1)) ] && systemctl is-active -q trapd"
wait_for 30 test -S /run/trapd/trapd.sock
pid3=$(main_pid)
[ "$pid3" != "$pid2" ] && echo "KILLED_NEW_PID=yes"
echo "NRESTARTS=$(systemctl show -P NRestarts trapd)"
echo "LIVE_AFTER_KILL=$(live)"
echo "MSS_AFTER_KILL=$(tcpmss)"

echo "--- systemctl stop trapd: the kernel stays as it is, trapctl goes to /dev/trapvec itself"
systemctl stop trapd
echo "STOPPED=$(systemctl is-active trapd || true)"
echo "RESULT=$(systemctl show -P Result trapd)"
echo "SOCKET_AFTER_STOP=$([ -e /run/trapd.sock ] || [ -L /run/trapd.sock ] && echo present || echo gone)"
echo "RUNTIME_DIR_AFTER_STOP=$([ -d /run/trapd ] && echo present || echo gone)"
echo "MSS_AFTER_STOP=$(tcpmss)"
echo "DIRECT_LIST=$(via_daemon) $(hits tcp_sync_mss)"

echo "--- back to a clean kernel: through the daemon, stop, rmmod"
systemctl start trapd
wait_for 30 test -S /run/trapd/trapd.sock
# The endpoint over AF_INET (RestrictAddressFamilies=): one connection, once trapd listens (port
# 9464 is 24F8 in /proc/net/tcp, state 0A), so that the hits it adds are known.
wait_for 30 grep -q ':24F8 00000000:0000 0A' /proc/net/tcp
wget -q -O /tmp/metrics.prom http://127.0.0.1:9464/metrics
echo "PROM_HITS=$(awk '/^trapvec_splice_hits_total\{/ && /point="tcp_sync_mss"/ { print $NF }' /tmp/metrics.prom)"
echo "PROM_SPLICES=$(awk '$1 == "trapvec_splices" { print $2 }' /tmp/metrics.prom)"
trapctl unsplice tcp_sync_mss
trapctl unload mss_clamp
systemctl stop trapd
echo "CLEAN_LIST=$(trapctl list | tr '\n' '|')"
/sbin/rmmod trapvec
echo "LOADED_AFTER=$(grep -c '^trapvec ' /proc/modules || true)"
echo "MSS_CLEAN=$(tcpmss)"
echo "FAILED_UNITS=$(systemctl list-units --failed --no-legend --plain | wc -l)"
echo "--- trapd's journal (journalctl -u trapd)"
journalctl -u trapd --no-pager -o short-monotonic
echo "SCENARIO_DONE=yes"
