//! Boot tests: prove the runner against the real Debian cloud kernel under QEMU TCG.
//!
//! Each test runs the `vmtest` binary on a small scenario. Without QEMU, the kernel, its
//! headers or busybox the tests say why and skip; with `CI=true` that is a failure instead.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Whether the machine can boot guests; `false` (after saying why) when a test should skip.
fn can_boot() -> bool {
    let mut missing = Vec::new();
    if let Err(e) = vmtest::host::find_program("qemu-system-x86_64", "install qemu-system-x86") {
        missing.push(e.to_string());
    }
    if let Err(e) = vmtest::host::KernelInstall::newest() {
        missing.push(e.to_string());
    }
    if let Err(e) = vmtest::host::find_program("busybox", "install busybox-static") {
        missing.push(e.to_string());
    }
    if missing.is_empty() {
        return true;
    }
    let why = missing.join("; ");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and the VM tests cannot run: {why} (run .ci/install-deps)");
    }
    eprintln!("skipping VM test: {why} (run .ci/install-deps)");
    false
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Runs `vmtest run` on `scenario` with extra arguments; prints what it said.
fn vmtest(scenario: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scenario.sh");
    std::fs::write(&path, scenario).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vmtest"))
        .arg("run")
        .arg("--scenario")
        .arg(&path)
        .arg("--repo")
        .arg(repo())
        .args(args)
        .output()
        .unwrap();
    println!(
        "--- vmtest stdout ---\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    println!(
        "--- vmtest stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The value printed by the scenario as `KEY=value`.
fn value<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    stdout
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn guest_has_mounts_lo_path_helpers_files_and_mss_follows_lo_mtu() {
    if !can_boot() {
        return;
    }
    let data = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(data.path(), b"payload for the guest\n").unwrap();
    let name = data
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let scenario = format!(
        r#"set -e
echo "UID=$(id -u)"
grep -q '^Linux version' /proc/version
test -e /sys/kernel/tracing/trace
grep -q ' /sys/kernel/tracing tracefs ' /proc/mounts
grep -q ' /sys/kernel/debug debugfs ' /proc/mounts
# IFF_UP is bit 0 of lo's flags.
echo "LO_UP=$(( $(cat /sys/class/net/lo/flags) & 1 ))"
echo "TRAPCTL=$(command -v trapctl)"
echo "TCPMSS=$(command -v tcpmss)"
echo "FILE=$(cat /files/{name})"
ls /components/mss_clamp.o
echo "MSS_DEFAULT=$(tcpmss)"
echo "MSS_THREE=$(tcpmss -n 3 | tr '\n' ,)"
ip link set lo mtu 1000
echo "MSS_1000=$(tcpmss)"
ip link set lo mtu 1400
echo "MSS_1400=$(tcpmss)"
echo "TRAFFIC=$(tcpmss --traffic 1)"
tc qdisc add dev lo root netem delay 1ms
echo "NETEM=$(tc qdisc show dev lo | grep -c netem)"
modprobe veth
ip link add vmt0 type veth
echo "VETH=$(ls /sys/class/net | grep -c '^vmt0$')"
"#
    );
    let out = vmtest(
        &scenario,
        &[
            "--no-load",
            "--file",
            &data.path().to_string_lossy(),
            "--with-module",
            "veth",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(value(&stdout, "UID"), Some("0"));
    assert_eq!(value(&stdout, "LO_UP"), Some("1"));
    assert_eq!(value(&stdout, "TRAPCTL"), Some("/bin/trapctl"));
    assert_eq!(value(&stdout, "TCPMSS"), Some("/bin/tcpmss"));
    assert_eq!(value(&stdout, "FILE"), Some("payload for the guest"));
    assert_eq!(value(&stdout, "MSS_DEFAULT"), Some("32741"));
    assert_eq!(value(&stdout, "MSS_THREE"), Some("32741,32741,32741,"));
    assert_eq!(value(&stdout, "MSS_1000"), Some("948"));
    assert_eq!(value(&stdout, "MSS_1400"), Some("1348"));
    let traffic: u64 = value(&stdout, "TRAFFIC")
        .and_then(|v| v.parse().ok())
        .expect("TRAFFIC=<bytes>");
    assert!(traffic > 0);
    assert_eq!(value(&stdout, "VETH"), Some("1"), "--with-module veth");
    assert_eq!(
        value(&stdout, "NETEM"),
        Some("1"),
        "iproute2's tc with sch_netem from the guest kernel"
    );
}

#[test]
fn scenario_exit_status_becomes_vmtest_exit_status() {
    if !can_boot() {
        return;
    }
    let out = vmtest("echo about to fail\nexit 3\n", &["--no-load"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("scenario exited with status 3"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("TRAPVEC-VMTEST-EXIT=3"));
}

#[test]
fn scenario_running_past_timeout_is_killed_and_fails() {
    if !can_boot() {
        return;
    }
    let started = std::time::Instant::now();
    let out = vmtest("sleep 600\n", &["--no-load", "--timeout", "40"]);
    assert_eq!(out.status.code(), Some(vmtest::runner::EXIT_TIMEOUT));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timed out after 40 s"), "{stderr}");
    // Building may take a while before the clock starts; the guest itself gets 40 s.
    assert!(started.elapsed().as_secs() < 540, "{:?}", started.elapsed());
}

#[test]
fn trapvec_module_is_loaded_before_the_scenario() {
    if !can_boot() {
        return;
    }
    if !repo().join("kmod/Kbuild").is_file() {
        eprintln!("skipping: kmod/Kbuild does not exist yet, so there is no module to load");
        return;
    }
    let out = vmtest(
        "grep '^trapvec ' /proc/modules\ntest -c /dev/trapvec\n",
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn kernel_panic_in_the_guest_fails_the_run_and_is_reported() {
    if !can_boot() {
        return;
    }
    let out = vmtest("echo c > /proc/sysrq-trigger\nsleep 60\n", &["--no-load"]);
    assert_eq!(out.status.code(), Some(vmtest::runner::EXIT_KERNEL_FAILURE));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stopped without reporting a verdict"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Kernel panic - not syncing: sysrq triggered crash"),
        "{stderr}"
    );
}
