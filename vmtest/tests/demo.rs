//! The demo `make demo` runs (vmtest/scenarios/demo.sh, README "Kernel demo"): it must keep
//! working as the README shows it. The scenario itself fails unless the MSS is 32741 before,
//! 948 with mss_clamp at MTU 1000, 1348 after `trapctl set mss_clamp_mtu 1400`, and 32741 again
//! after unsplicing; here also the count of its first step and the listings are checked.

use vmtest::testing::{can_boot, Scenario};

#[test]
fn the_kernel_demo_counts_hot_swaps_tunes_and_restores_the_mss_policy() {
    if !can_boot("demo") {
        return;
    }
    let run = Scenario::named("demo.sh").timeout(600).run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    let lines: Vec<&str> = run.stdout.lines().map(|l| l.trim_end_matches('\r')).collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    assert!(has("tcp_sync_mss: 20 calls in 5 s"), "4 connections x 5 tcp_sync_mss calls");
    assert!(has("loaded mss_clamp (crc32 0x"));
    assert!(has("spliced tcp_sync_mss at 0x") && has("unspliced tcp_sync_mss at 0x"));
    assert!(has("mss_clamp_mtu = 1400 (4 bytes)"));
    assert!(has("=== MSS before 32741, during 948 (MTU ceiling 1000) and 1348 (1400), after 32741"));
    assert_eq!(lines.iter().filter(|l| **l == "no splices").count(), 1, "only the last listing is empty");
}
