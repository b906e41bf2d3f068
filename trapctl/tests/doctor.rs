//! `trapctl doctor` against machines described as file trees (`--root`): each verdict, its fix, the
//! exit status and the JSON schema; and once against this machine's own /proc and /sys.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// A machine where everything the kernel commands need is there.
fn good(root: &Path) {
    let files: &[(&str, &[u8])] = &[
        ("proc/sys/kernel/osrelease", b"6.1.0-56-cloud-amd64\n"),
        ("proc/sys/kernel/arch", b"x86_64\n"),
        ("proc/sys/kernel/modules_disabled", b"0\n"),
        (
            "proc/kallsyms",
            b"ffffffff81000000 T _stext\nffffffff81234560 T register_kprobe\n",
        ),
        (
            "sys/kernel/security/lockdown",
            b"[none] integrity confidentiality\n",
        ),
        (
            "sys/kernel/tracing/available_filter_functions",
            b"tcp_sync_mss\n",
        ),
        ("dev/trapvec", b""),
    ];
    for (rel, body) in files {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, body).unwrap();
    }
    fs::create_dir_all(root.join("sys/module/trapvec")).unwrap();
}

fn doctor(root: &Path, json: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trapctl"));
    cmd.args(["doctor", "--root"]).arg(root);
    if json {
        cmd.arg("--json");
    }
    // An agent that exists, and a trapd socket that does not: both deterministic.
    cmd.env("TRAPVEC_AGENT", env!("CARGO_BIN_EXE_trapctl"))
        .env("TRAPD_SOCKET", root.join("no-trapd.sock"))
        .output()
        .unwrap()
}

fn checks(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

fn check<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {v}"))
}

#[test]
fn a_ready_machine_exits_0_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    good(dir.path());
    let out = doctor(dir.path(), false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("missing"), "{text}");
    assert!(
        text.contains("6.1.0-56-cloud-amd64: the series of Debian 12's 6.1 cloud kernel"),
        "{text}"
    );
    assert!(
        text.ends_with("ready: the kernel commands can run here\n"),
        "{text}"
    );

    let v = checks(&doctor(dir.path(), true));
    // schema first, as every --json object of trapctl.
    assert!(
        String::from_utf8_lossy(&doctor(dir.path(), true).stdout)
            .starts_with("{\n  \"schema\": 1,"),
        "{v}"
    );
    assert_eq!(v["ready"], true);
    let names: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "kernel",
            "lockdown",
            "secure boot",
            "modules",
            "kprobes",
            "ftrace",
            "module",
            "user",
            "trapd",
            "agent"
        ]
    );
    assert_eq!(check(&v, "module")["state"], "ok");
    assert_eq!(check(&v, "trapd")["state"], "note");
    assert!(check(&v, "trapd")["detail"]
        .as_str()
        .unwrap()
        .contains("no-trapd.sock"));
}

#[test]
fn lockdown_secure_boot_and_a_missing_module_each_name_their_fix() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    good(root);
    fs::write(
        root.join("sys/kernel/security/lockdown"),
        "none [integrity] confidentiality\n",
    )
    .unwrap();
    let var = root.join("sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c");
    fs::create_dir_all(var.parent().unwrap()).unwrap();
    fs::write(&var, [6, 0, 0, 0, 1]).unwrap();
    fs::remove_dir(root.join("sys/module/trapvec")).unwrap();
    fs::write(root.join("proc/sys/kernel/osrelease"), "5.10.0-30-amd64\n").unwrap();

    let out = doctor(root, true);
    assert_eq!(out.status.code(), Some(1));
    let v = checks(&out);
    assert_eq!(v["ready"], false);
    let lockdown = check(&v, "lockdown");
    assert_eq!(lockdown["state"], "missing");
    assert!(lockdown["detail"]
        .as_str()
        .unwrap()
        .starts_with("integrity:"));
    assert!(lockdown["fix"]
        .as_str()
        .unwrap()
        .contains("Secure Boot off"));
    let sb = check(&v, "secure boot");
    assert_eq!(sb["state"], "note");
    assert!(sb["fix"].as_str().unwrap().contains("mokutil --import"));
    let module = check(&v, "module");
    assert_eq!(module["state"], "missing");
    assert!(module["fix"].as_str().unwrap().contains("modprobe trapvec"));
    let kernel = check(&v, "kernel");
    assert_eq!(kernel["state"], "note");
    assert!(kernel["detail"]
        .as_str()
        .unwrap()
        .contains("5.10.0-30-amd64 is not a kernel CI boots"));

    // The same in text: each missing line has its fix under it, and the verdict is last.
    let text = String::from_utf8(doctor(root, false).stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with("missing  lockdown"))
        .unwrap();
    assert!(
        lines[at + 1]
            .trim_start()
            .starts_with("fix: boot with Secure Boot off"),
        "{text}"
    );
    assert_eq!(
        lines.last(),
        Some(&"not ready: fix the `missing` lines above")
    );
}

#[test]
fn lockdown_unknown_without_securityfs_and_absent_without_the_lsm() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    good(root);
    fs::remove_file(root.join("sys/kernel/security/lockdown")).unwrap();
    // securityfs not mounted: an empty directory.
    let v = checks(&doctor(root, true));
    assert_eq!(check(&v, "lockdown")["state"], "note", "{v}");
    assert!(check(&v, "lockdown")["fix"]
        .as_str()
        .unwrap()
        .contains("mount -t securityfs"));
    // Mounted, without the lockdown LSM.
    fs::write(root.join("sys/kernel/security/lsm"), "capability,yama\n").unwrap();
    let v = checks(&doctor(root, true));
    assert_eq!(check(&v, "lockdown")["state"], "ok", "{v}");
    assert!(check(&v, "lockdown")["detail"]
        .as_str()
        .unwrap()
        .starts_with("no lockdown LSM"));
}

#[test]
fn modules_disabled_no_kprobes_and_no_device_are_missing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    good(root);
    fs::write(root.join("proc/sys/kernel/modules_disabled"), "1\n").unwrap();
    fs::write(root.join("proc/kallsyms"), "ffffffff81000000 T _stext\n").unwrap();
    fs::remove_file(root.join("dev/trapvec")).unwrap();
    let v = checks(&doctor(root, true));
    for name in ["modules", "kprobes", "module"] {
        assert_eq!(check(&v, name)["state"], "missing", "{name}: {v}");
        assert!(check(&v, name)["fix"].is_string(), "{name}: {v}");
    }
    assert!(check(&v, "module")["detail"]
        .as_str()
        .unwrap()
        .contains("/dev/trapvec is missing"));
}

/// This machine, read for real: the kernel line names its release, and the exit status agrees
/// with the verdict line.
#[test]
fn this_machine() {
    let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v = checks(&out);
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(check(&v, "kernel")["detail"]
        .as_str()
        .unwrap()
        .starts_with(release.trim()));
    assert_eq!(out.status.success(), v["ready"] == true, "{v}");
}
