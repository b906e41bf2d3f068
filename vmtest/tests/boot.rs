//! Boot tests: prove the runner against the real Debian cloud kernel under QEMU TCG.
//!
//! Each test runs the `vmtest` binary on a small scenario. Without QEMU, the kernel, its
//! headers or busybox the tests say why and skip; with `CI=true` that is a failure instead.

use vmtest::testing::{can_boot, repo_root, Run, Scenario};

/// Names these tests in skip and CI-failure messages.
const WHAT: &str = "VM test";

/// Runs `vmtest run` on the script `text` with extra arguments.
fn vmtest(text: &str, args: &[&str]) -> Run {
    Scenario::inline(text)
        .args(args)
        .run(env!("CARGO_BIN_EXE_vmtest"))
}

#[test]
fn guest_has_mounts_lo_path_helpers_files_and_mss_follows_lo_mtu() {
    if !can_boot(WHAT) {
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
# 6.12's tc asks the kernel for the alias net-sch-netem, which this initramfs cannot resolve:
# load the qdisc by name first.
modprobe sch_netem
tc qdisc add dev lo root netem delay 1ms
echo "NETEM=$(tc qdisc show dev lo | grep -c netem)"
modprobe veth
ip link add vmt0 type veth
echo "VETH=$(ls /sys/class/net | grep -c '^vmt0$')"
"#
    );
    let out = Scenario::inline(&scenario)
        .arg("--no-load")
        .file(data.path())
        .args(["--with-module", "veth"])
        .run(env!("CARGO_BIN_EXE_vmtest"));
    assert_eq!(out.status, Some(0));
    assert_eq!(out.value("UID"), Some("0"));
    assert_eq!(out.value("LO_UP"), Some("1"));
    assert_eq!(out.value("TRAPCTL"), Some("/bin/trapctl"));
    assert_eq!(out.value("TCPMSS"), Some("/bin/tcpmss"));
    assert_eq!(out.value("FILE"), Some("payload for the guest"));
    assert_eq!(out.value("MSS_DEFAULT"), Some("32741"));
    assert_eq!(out.value("MSS_THREE"), Some("32741,32741,32741,"));
    assert_eq!(out.value("MSS_1000"), Some("948"));
    assert_eq!(out.value("MSS_1400"), Some("1348"));
    let traffic: u64 = out
        .value("TRAFFIC")
        .and_then(|v| v.parse().ok())
        .expect("TRAFFIC=<bytes>");
    assert!(traffic > 0);
    assert_eq!(out.value("VETH"), Some("1"), "--with-module veth");
    assert_eq!(
        out.value("NETEM"),
        Some("1"),
        "iproute2's tc with sch_netem from the guest kernel"
    );
}

#[test]
fn scenario_exit_status_becomes_vmtest_exit_status() {
    if !can_boot(WHAT) {
        return;
    }
    let out = vmtest("echo about to fail\nexit 3\n", &["--no-load"]);
    assert_eq!(out.status, Some(3));
    let stderr = &out.stderr;
    assert!(stderr.contains("scenario exited with status 3"), "{stderr}");
    assert!(out.stdout.contains("TRAPVEC-VMTEST-EXIT=3"));
}

#[test]
fn scenario_running_past_timeout_is_killed_and_fails() {
    if !can_boot(WHAT) {
        return;
    }
    let started = std::time::Instant::now();
    // Once: Scenario::run would boot a scenario that timed out once more. One CPU spins in
    // the kernel (reading /dev/zero is clearing user memory), the other in user space.
    let out = Scenario::inline("dd if=/dev/zero of=/dev/null bs=1M &\nwhile :; do :; done\n")
        .args(["--no-load", "--timeout", "40"])
        .run_once(env!("CARGO_BIN_EXE_vmtest"));
    assert_eq!(out.status, Some(vmtest::runner::EXIT_TIMEOUT));
    let stderr = &out.stderr;
    assert!(stderr.contains("timed out after 40 s"), "{stderr}");
    // Where the vCPUs were, the kernel's addresses named by a second boot's kallsyms.
    assert!(
        stderr.contains("the vCPUs before qemu was killed (5 samples 200 ms apart):"),
        "{stderr}"
    );
    let vcpus: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("  @ "))
        .collect();
    assert_eq!(vcpus.len(), 2, "{stderr}");
    assert!(
        vcpus[0].starts_with("cpu0: ") && vcpus[1].starts_with("cpu1: "),
        "{vcpus:?}"
    );
    assert!(
        vcpus.iter().any(|l| l.contains(" user ")),
        "the shell's loop: {vcpus:?}"
    );
    assert!(
        vcpus.iter().any(|l| l
            .split(", ")
            .any(|p| p.contains(" ffffffff8") && p.contains("+0x"))),
        "dd in the kernel, named: {vcpus:?}"
    );
    // Building may take a while before the clock starts; the guest itself gets 40 s.
    assert!(started.elapsed().as_secs() < 600, "{:?}", started.elapsed());
}

#[test]
fn trapvec_module_is_loaded_before_the_scenario() {
    if !can_boot(WHAT) {
        return;
    }
    if !repo_root().join("kmod/Kbuild").is_file() {
        eprintln!("skipping: kmod/Kbuild does not exist yet, so there is no module to load");
        return;
    }
    let out = vmtest(
        "grep '^trapvec ' /proc/modules\ntest -c /dev/trapvec\n",
        &[],
    );
    assert_eq!(out.status, Some(0));
}

#[test]
fn kernel_panic_in_the_guest_fails_the_run_and_is_reported() {
    if !can_boot(WHAT) {
        return;
    }
    let out = vmtest("echo c > /proc/sysrq-trigger\nsleep 60\n", &["--no-load"]);
    assert_eq!(out.status, Some(vmtest::runner::EXIT_KERNEL_FAILURE));
    let stderr = &out.stderr;
    assert!(
        stderr.contains("stopped without reporting a verdict"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Kernel panic - not syncing: sysrq triggered crash"),
        "{stderr}"
    );
}
