//! The real kernel, spliced by trapctl (`vmtest/scenarios/kernel_mss.sh`): `trapctl count`
//! counts exactly the tcp_sync_mss calls that loopback connections make (5 each: 3 on the
//! client, 2 on the server), and mss_clamp.o replaces tcp_sync_mss by trap and by jmp: the MSS
//! of a new connection is clamped (948 at the default 1000-byte MTU ceiling), `trapctl set
//! mss_clamp_mtu 1400` changes the next connection's MSS to 1348, and unsplicing brings the
//! kernel's 32741 and every byte of the function back.

use vmtest::testing::{can_boot, Scenario};

/// tcp_sync_mss calls per fresh loopback connection (see the scenario's header).
const CALLS_PER_CONNECTION: u64 = 5;

#[test]
fn count_is_exact_and_mss_clamp_replaces_tcp_sync_mss_by_trap_and_by_jmp() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("kernel_mss.sh")
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    let connections = run.number("COUNT_CONNECTIONS");
    assert_eq!(
        run.number("COUNT_CALLS"),
        CALLS_PER_CONNECTION * connections,
        "tcp_sync_mss calls counted by the trap"
    );
    assert_eq!(
        run.number("COUNT_LEFT"),
        0,
        "the count splice is removed at the end"
    );

    assert_eq!(run.expect("MSS_BEFORE"), "32741");
    for mech in ["trap", "jmp"] {
        assert_eq!(
            run.expect(&format!("MSS_{mech}_CLAMPED")),
            "948",
            "{mech}: path MTU clamped to 1000"
        );
        assert_eq!(
            run.expect(&format!("MSS_{mech}_GET")),
            "1400",
            "{mech}: trapctl get reads what set wrote"
        );
        assert_eq!(
            run.expect(&format!("MSS_{mech}_TUNED")),
            "1348",
            "{mech}: tuned live to 1400"
        );
        assert_eq!(
            run.expect(&format!("MSS_{mech}_AFTER")),
            "32741",
            "{mech}: unspliced"
        );
        assert_eq!(
            run.expect(&format!("BYTES_{mech}_RESTORED")),
            "yes",
            "{mech}: every byte of tcp_sync_mss"
        );
    }
}
