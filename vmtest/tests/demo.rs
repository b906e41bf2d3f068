//! The demo `make demo` runs (vmtest/scenarios/demo.sh, README "Kernel demo"): it must keep
//! working as the README shows it. The scenario itself fails unless the MSS is 32741 before,
//! 948 with mss_clamp at MTU 1000, 1348 after `trapctl set mss_clamp_mtu 1400`, and 32741 again
//! after unsplicing; here also the count of its first step and the listings are checked.

//! It runs on both kernels: the default (6.1) and Debian 13's 6.12, where the splice goes at
//! `tcp_sync_mss+0x9`, past the entry's endbr64 and ftrace site.

use vmtest::testing::{can_boot_kernel, Scenario};

/// On Debian 12's 6.1 whatever `TRAPVEC_GUEST_KERNEL` says: the 6.12 run is the test below.
#[test]
fn the_kernel_demo_counts_hot_swaps_tunes_and_restores_the_mss_policy() {
    if !can_boot_kernel("demo", "6.1") {
        return;
    }
    demo(Scenario::named("demo.sh").kernel("6.1"), "tcp_sync_mss+0x5");
}

#[test]
fn the_kernel_demo_runs_the_same_on_6_12() {
    if !can_boot_kernel("demo on 6.12", "6.12") {
        return;
    }
    demo(
        Scenario::named("demo.sh").kernel("6.12"),
        "tcp_sync_mss+0x9",
    );
}

/// The guest's release, from the demo's first line ("trapvec kernel demo on Linux RELEASE (...").
fn entry_release<'a>(lines: &[&'a str]) -> &'a str {
    lines
        .iter()
        .find_map(|l| l.strip_prefix("=== trapvec kernel demo on Linux "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the demo's title line")
}

fn demo(scenario: Scenario, entry: &str) {
    let run = scenario.timeout(600).run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    // `trapctl doctor` on a real kernel: the series CI boots, lockdown none, the module's ABI.
    let release = entry_release(&lines);
    assert!(
        has(&format!(
            "ok       kernel           {release}: the series of"
        )),
        "doctor knows the guest's kernel: {lines:?}"
    );
    assert!(has(
        "ok       lockdown         none: kernel text may be written"
    ));
    assert!(has("ok       module           loaded, ioctl ABI "));
    assert!(has("ready: the kernel commands can run here"));
    assert!(
        has("tcp_sync_mss: 20 calls in 5 s"),
        "4 connections x 5 tcp_sync_mss calls"
    );
    assert!(has("loaded mss_clamp (crc32 0x"));
    assert!(has("spliced tcp_sync_mss at 0x") && has("unspliced tcp_sync_mss at 0x"));
    let spliced = lines
        .iter()
        .find(|l| l.starts_with("spliced tcp_sync_mss at 0x"))
        .unwrap();
    assert!(
        spliced.contains(&format!("({entry}) by trap")),
        "the entry past the kernel's own bytes: {spliced}"
    );
    assert!(has("mss_clamp_mtu = 1400 (4 bytes)"));
    assert!(has(
        "=== MSS before 32741, during 948 (MTU ceiling 1000) and 1348 (1400), after 32741"
    ));
    assert_eq!(
        lines.iter().filter(|l| **l == "no splices").count(),
        1,
        "only the last listing is empty"
    );
}
