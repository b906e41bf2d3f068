//! The real kernel under churn (`vmtest/scenarios/kernel_stress.sh`): splice/unsplice
//! cycles of mss_clamp's replacement of tcp_sync_mss, alternating trap and jmp, while loopback
//! connections open one after another and a checked stream runs; then `rmmod trapvec` with a
//! trap and a jmp splice live reverts them and restores the gate, so that `insmod` works again.
//! vmtest fails the run on any oops, BUG or WARNING in the kernel log.
//!
//! Cycles: [`CI_CYCLES`] by default (what fits in CI's budget); the long run is
//! `TRAPVEC_STRESS_CYCLES=500 cargo test --release -p vmtest --test kernel_stress` (its figures
//! are in the session notes). Every cycle is checked the same way at any length.

use vmtest::testing::{can_boot, Scenario};

/// Cycles in CI: 200 of them alternate trap and jmp 100 times each under traffic, in about
/// 40% of the guest time 500 took.
const CI_CYCLES: u64 = 200;

fn cycles() -> u64 {
    match std::env::var("TRAPVEC_STRESS_CYCLES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("TRAPVEC_STRESS_CYCLES={v} is not a number")),
        Err(_) => CI_CYCLES,
    }
}

#[test]
fn cycles_under_traffic_restore_every_byte_and_rmmod_reverts_live_splices() {
    if !can_boot("kernel scenario") {
        return;
    }
    let cycles = cycles();
    let run = Scenario::named("kernel_stress.sh")
        .append(&format!("trapvec_stress.cycles={cycles}"))
        .timeout(1200 + 2 * cycles)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    assert_eq!(run.number("CYCLES_DONE"), cycles);
    assert!(
        run.number("CONNECTIONS") > 50,
        "connections were opened during the cycles"
    );
    let seen: Vec<&str> = run.expect("MSS_SEEN").split_whitespace().collect();
    assert!(
        seen.iter().all(|m| *m == "32741" || *m == "948"),
        "every connection got the kernel's or the clamped MSS: {seen:?}"
    );
    assert!(
        run.number("TRAFFIC_BYTES") > 0,
        "the stream went through with every byte checked"
    );
    assert_eq!(
        run.expect("STRESS_RESTORED"),
        "yes",
        "tcp_sync_mss byte for byte after every cycle"
    );

    assert_eq!(run.expect("LIVE_MSS"), "948");
    assert_eq!(run.expect("LIVE_PATCHED"), "yes");
    assert_eq!(
        run.expect("RMMOD_MSS"),
        "32741",
        "rmmod reverted the live splices"
    );
    assert_eq!(
        run.expect("REINSMOD"),
        "yes",
        "insmod accepts the gate rmmod restored"
    );
    assert_eq!(
        run.number("STATE_AFTER_RELOAD"),
        0,
        "the state went with the old module"
    );
    assert_eq!(
        run.expect("RELOAD_RESTORED"),
        "yes",
        "tcp_sync_mss and __x64_sys_getppid byte for byte"
    );
    assert_eq!(
        run.expect("RELOAD_MSS"),
        "948",
        "the reloaded module splices again"
    );
}
