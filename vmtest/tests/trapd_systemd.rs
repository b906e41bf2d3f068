//! trapd.service under a real systemd (vmtest/scenarios/trapd_systemd.sh): `make deb`'s
//! trapvec-tools package, extracted with `dpkg-deb -x`, is the guest's `/usr/bin/trapd`,
//! `/usr/bin/trapctl`, `/etc/trapvec/trapd.toml` and `/lib/systemd/system/trapd.service` (the
//! repository's unit, unchanged); the module is where trapvec-dkms's DKMS installs it; systemd
//! (the host's, PID 1 in the guest) starts the unit. Checked: without the module in modules.dep
//! the start fails with modprobe's message, after `depmod` `ExecStartPre`'s modprobe loads it; systemd reports every hardening setting; the running trapd has exactly the unit's
//! capabilities, seccomp and no_new_privs, a read-only root with only /var/lib/trapd and
//! /run/trapd writable, a private /tmp, no /proc/kcore but a readable /proc/kallsyms, and a device
//! cgroup that lets /dev/trapvec through and nothing else; the packaged trapctl, through the
//! daemon, loads a component from /root (not from /tmp), counts, splices and sets with exact hit
//! counts; the journal is in /var/lib/trapd; the Prometheus endpoint, once `listen` is set,
//! serves them over AF_INET; `systemctl restart` and a `kill -9` undone by
//! Restart=on-failure keep the splice; `systemctl stop` leaves the kernel as it is and takes the
//! socket away; the kernel is clean at the end.
//!
//! Without QEMU, the kernel, busybox, systemd or dpkg-dev the test says why and skips; with
//! `CI=true` it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use vmtest::testing::{can_boot, can_boot_kernel, repo_root, Scenario, INSTALL_HINT};

/// `make deb`'s script with its output in `out`: the trapvec-tools package's path.
fn build_tools_deb(out: &Path) -> PathBuf {
    let status = Command::new(repo_root().join("packaging/build-deb"))
        .env("OUT", out)
        .current_dir(repo_root())
        .status()
        .expect("running packaging/build-deb");
    assert!(status.success(), "packaging/build-deb: {status}");
    let debs: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("trapvec-tools_")
        })
        .collect();
    assert_eq!(
        debs.len(),
        1,
        "one trapvec-tools package in {}: {debs:?}",
        out.display()
    );
    debs.into_iter().next().unwrap()
}

/// What this test needs beyond a bootable guest, missing on this machine.
fn missing_tools() -> Vec<String> {
    [
        ("dpkg-shlibdeps", "dpkg-dev"),
        ("dpkg-deb", "dpkg"),
        ("systemctl", "systemd"),
        ("kmod", "kmod"),
    ]
    .iter()
    .filter(|(program, _)| vmtest::host::find_program(program, "").is_err())
    .map(|(program, package)| format!("{program} is not installed (Debian package {package})"))
    .collect()
}

#[test]
fn trapd_service_runs_hardened_under_systemd_and_does_real_work() {
    if !can_boot("VM test") {
        return;
    }
    trapd_systemd(Scenario::named("trapd_systemd.sh"));
}

/// The same on Debian 13's kernel (the module built for it, in its `updates/dkms`).
#[test]
fn trapd_service_runs_hardened_under_systemd_on_6_12_too() {
    if !can_boot_kernel("VM test on 6.12", "6.12") {
        return;
    }
    trapd_systemd(Scenario::named("trapd_systemd.sh").kernel("6.12"));
}

fn trapd_systemd(scenario: Scenario) {
    let missing = missing_tools();
    if !missing.is_empty() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and {} ({INSTALL_HINT})",
            missing.join("; ")
        );
        eprintln!("skipping: {} ({INSTALL_HINT})", missing.join("; "));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let deb = build_tools_deb(&dir.path().join("deb"));
    let root = dir.path().join("root");
    let x = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&root)
        .status()
        .unwrap();
    assert!(x.success(), "dpkg-deb -x {}", deb.display());
    assert_eq!(
        std::fs::read(root.join("lib/systemd/system/trapd.service")).unwrap(),
        std::fs::read(repo_root().join("packaging/trapd.service")).unwrap(),
        "the package holds the repository's unit unchanged"
    );

    let run = scenario
        .arg("--systemd")
        .arg("--tree")
        .arg(&root)
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    let v = |key: &str| run.expect(key).trim().to_owned();

    // Installed as the packages install it; started by systemd, the module by ExecStartPre.
    assert_eq!(v("PID1"), "systemd");
    assert_eq!(v("UNIT_FILE"), "/lib/systemd/system/trapd.service");
    let no_module = v("NO_MODULE");
    assert!(
        no_module.starts_with("modprobe: FATAL: Module trapvec not found"),
        "without the module the start fails with modprobe's message: {no_module}"
    );
    assert_eq!(v("NO_MODULE_MAIN_PID"), "0", "trapd itself never ran");
    assert!(
        v("MODULE_FILE").ends_with("/updates/dkms/trapvec.ko"),
        "{}",
        v("MODULE_FILE")
    );
    assert_eq!(v("ACTIVE_BEFORE"), "inactive", "installed, not started");
    assert_eq!(v("LOADED_BEFORE"), "0");
    assert_eq!(v("ENABLED"), "enabled");
    assert_eq!(v("WANTED_BY"), "/lib/systemd/system/trapd.service");
    assert_eq!(v("ACTIVE"), "active");
    assert_eq!(
        v("LOADED_BY_UNIT"),
        "1",
        "ExecStartPre=/sbin/modprobe trapvec loaded it"
    );
    assert_eq!(v("MAIN_EXE"), "/usr/bin/trapd");
    assert_eq!(v("SOCKET_LINK"), "/run/trapd/trapd.sock");
    assert_eq!(v("SOCKET_MODE"), "666");

    // The hardening as systemd reads the unit.
    for (property, value) in [
        ("ProtectSystem", "strict"),
        ("ReadWritePaths", "/var/lib/trapd"),
        ("StateDirectory", "trapd"),
        ("StateDirectoryMode", "0700"),
        ("RuntimeDirectory", "trapd"),
        ("ProtectHome", "read-only"),
        ("PrivateTmp", "yes"),
        ("DevicePolicy", "closed"),
        // ProtectClock= adds the read-only real-time clock.
        ("DeviceAllow", "char-rtc r"),
        ("CapabilityBoundingSet", "cap_sys_module cap_syslog"),
        ("AmbientCapabilities", ""),
        ("NoNewPrivileges", "yes"),
        ("ProtectKernelTunables", "no"),
        ("ProtectKernelModules", "no"),
        ("ProtectKernelLogs", "no"),
        (
            "ReadOnlyPaths",
            "/proc/sys /sys -/proc/sysrq-trigger -/proc/irq -/proc/bus -/proc/acpi /run",
        ),
        ("InaccessiblePaths", "-/proc/kcore"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("RestrictNamespaces", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("SystemCallArchitectures", "native"),
        ("SystemCallErrorNumber", "1"),
        ("UMask", "0077"),
        ("Restart", "on-failure"),
    ] {
        assert_eq!(
            v(&format!("PROP_{property}")),
            value,
            "systemctl show -P {property} trapd"
        );
    }
    // `systemctl show -P DeviceAllow` prints one entry a line: the second is the unit's own.
    assert!(
        run.stdout
            .contains("PROP_DeviceAllow=char-rtc r\r\nchar-misc rw")
            || run
                .stdout
                .contains("PROP_DeviceAllow=char-rtc r\nchar-misc rw"),
        "DeviceAllow=char-misc rw"
    );
    for (call, verdict) in [
        ("ioctl", "allowed"),
        ("flock", "allowed"),
        ("finit_module", "allowed"),
        ("socket", "allowed"),
        ("mount", "denied"),
        ("pivot_root", "denied"),
        ("kexec_load", "denied"),
    ] {
        assert_eq!(
            v(&format!("FILTER_{call}")),
            verdict,
            "SystemCallFilter= and {call}"
        );
    }

    // What the running trapd is under. CAP_SYS_MODULE is bit 16, CAP_SYSLOG bit 34.
    for set in ["CapBnd", "CapEff", "CapPrm"] {
        assert_eq!(
            v(&format!("STATUS_{set}")),
            "0000000400010000",
            "{set}: CAP_SYS_MODULE and CAP_SYSLOG only"
        );
    }
    assert_eq!(v("STATUS_CapAmb"), "0000000000000000");
    assert_eq!(v("STATUS_NoNewPrivs"), "1");
    assert_eq!(
        v("STATUS_Seccomp"),
        "2",
        "a seccomp filter (SystemCallFilter=, RestrictAddressFamilies=, ...)"
    );
    assert_eq!(v("OWN_MOUNT_NS"), "yes");
    assert_eq!(v("ROOT_MOUNT"), "ro");
    assert_eq!(v("STATE_MOUNT"), "rw");
    assert_eq!(
        v("RUN_MOUNT"),
        "ro rw",
        "/run read-only, /run/trapd writable"
    );
    for dir in [
        "/usr",
        "/etc",
        "/var/lib",
        "/run",
        "/root",
        "/home",
        "/proc/sys",
    ] {
        assert_eq!(
            v(&format!("WRITE_{dir}")),
            "Read-only file system",
            "{dir} from trapd's mount namespace"
        );
    }
    for dir in ["/var/lib/trapd", "/run/trapd", "/tmp"] {
        assert_eq!(
            v(&format!("WRITE_{dir}")),
            "ok",
            "{dir} from trapd's mount namespace"
        );
    }
    assert_eq!(v("SEES_HOST_TMP"), "no", "PrivateTmp=yes");
    assert_eq!(
        v("READ_/proc/kcore"),
        "Permission denied",
        "InaccessiblePaths=-/proc/kcore"
    );
    let kallsyms = v("READ_/proc/kallsyms");
    assert!(
        kallsyms.len() == 16 && kallsyms != "0000000000000000",
        "trapd reads /proc/kallsyms with addresses: {kallsyms}"
    );
    assert_eq!(v("OPEN_/dev/trapvec"), "ok", "DeviceAllow=char-misc rw");
    assert_eq!(
        v("OPEN_/dev/kmsg"),
        "Operation not permitted",
        "DevicePolicy=closed"
    );
    assert_eq!(
        v("OPEN_/dev/kmsg_OUTSIDE"),
        "ok",
        "outside trapd's cgroup the device opens"
    );

    // Real work through the daemon with the packaged trapctl.
    assert_eq!(v("LIST_VIA_DAEMON"), "1", "trapctl list is the daemon's");
    assert_eq!(v("LOAD_FROM_TMP_STATUS"), "1");
    let from_tmp = v("LOAD_FROM_TMP");
    assert!(
        from_tmp.contains("/tmp/mss_clamp.o") && from_tmp.contains("No such file"),
        "PrivateTmp hides the caller's /tmp: {from_tmp}"
    );
    assert_eq!(
        v("LOAD_FROM_HOME"),
        "loaded mss_clamp",
        "ProtectHome=read-only still reads /root"
    );
    assert!(
        v("COUNT").starts_with("tcp_sync_mss: 10 calls in 6 s"),
        "5 calls per loopback connection, 2 connections: {}",
        v("COUNT")
    );
    assert_eq!(v("MSS_BEFORE"), "32741");
    assert_eq!(
        v("MSS_SPLICED"),
        "948",
        "mss_clamp with mss_clamp_mtu = 1000"
    );
    // With the clamp, a loopback connection calls tcp_sync_mss 7 times: 3 connections.
    assert_eq!(v("HITS"), "21");
    assert_eq!(v("STATE_DIR"), "700 root", "StateDirectoryMode=0700");
    assert_eq!(v("JOURNAL"), "600 root", "UMask=0077");
    assert_eq!(
        v("JOURNAL_DONE"),
        "5",
        "load, count's splice and unsplice, splice, set"
    );
    assert_eq!(v("JOURNAL_SET"), "1");

    // Restart, kill -9 (Restart=on-failure), stop.
    assert_eq!(v("LISTEN"), r#"listen = "127.0.0.1:9464""#);
    assert_eq!(v("RESTART_NEW_PID"), "yes");
    assert_eq!(
        v("JOURNAL_AFTER_RESTART"),
        "1 1",
        "the restarted trapd compacted its journal to one checkpoint"
    );
    assert_eq!(
        v("LIVE_AFTER_RESTART"),
        r#""at":"tcp_sync_mss" "unrecorded":[]"#
    );
    assert_eq!(v("MSS_AFTER_RESTART"), "948");
    assert_eq!(v("GET_AFTER_RESTART"), "1000");
    assert_eq!(
        v("HITS_AFTER_RESTART"),
        "28",
        "the module's counter went on: 21 + 7"
    );
    assert_eq!(v("NRESTARTS_BEFORE_KILL"), "0", "no start failed before");
    assert_eq!(v("KILLED_NEW_PID"), "yes");
    assert_eq!(
        v("NRESTARTS"),
        "1",
        "Restart=on-failure restarted trapd once"
    );
    assert_eq!(
        v("LIVE_AFTER_KILL"),
        r#""at":"tcp_sync_mss" "unrecorded":[]"#
    );
    assert_eq!(v("MSS_AFTER_KILL"), "948");
    assert_eq!(v("STOPPED"), "inactive");
    assert_eq!(v("RESULT"), "success");
    assert_eq!(
        v("SOCKET_AFTER_STOP"),
        "gone",
        "ExecStopPost removed /run/trapd.sock"
    );
    assert_eq!(
        v("RUNTIME_DIR_AFTER_STOP"),
        "gone",
        "RuntimeDirectory= went with the service"
    );
    assert_eq!(
        v("MSS_AFTER_STOP"),
        "948",
        "stopping trapd leaves the kernel as it is"
    );
    assert_eq!(
        v("DIRECT_LIST"),
        "0 42",
        "without the daemon trapctl reads /dev/trapvec itself; 6 connections clamped"
    );

    // The metrics endpoint over AF_INET: the 42 hits and the 5 of the scrape's own connection
    // before trapd read the request.
    assert_eq!(
        v("PROM_HITS"),
        "47",
        "the metrics endpoint serves the splice's hits"
    );
    assert_eq!(v("PROM_SPLICES"), "1");

    // Clean.
    assert_eq!(v("CLEAN_LIST"), "no splices|no components|");
    assert_eq!(
        v("LOADED_AFTER"),
        "0",
        "rmmod trapvec succeeded: nothing holds the module"
    );
    assert_eq!(v("MSS_CLEAN"), "32741");
    assert_eq!(v("FAILED_UNITS"), "0");
    assert_eq!(v("SCENARIO_DONE"), "yes");
}
