//! A claimed int3 always moves the CPU on (`vmtest/scenarios/kernel_int3_progress.sh`, issue 24
//! item 1). The die notifier sends a CPU that meets one of the module's pending CCs where the
//! patch leads; a jmp into its own window (`EB FE`, `EB FF`) or a chain of jmps closing into a
//! cycle would send it from CC to CC for ever (with interrupts off where they were off, so no
//! IPI is answered: the stall of a CPU in `smp_call_function_many_cond()`). APPLY refuses
//! both, whichever jmp of the cycle comes first, and leaves the text as it was.
//!
//! `TRAPVEC_INT3_PROGRESS_MODULE=/path/trapvec.ko` tests that module instead of the tree's (one
//! without the rule accepts every one of these jmps).

use vmtest::testing::{can_boot, tvraw, Run, Scenario};

/// The `key=N` word of the tvraw line printed as `line`.
fn word(run: &Run, line: &str, key: &str) -> i64 {
    let text = run.expect(line);
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        .unwrap_or_else(|| panic!("{line}={text} has no {key}"))
}

/// NOT_A_JUMP and LIVE_PATCH (kmod/trapvec_abi.h).
const NOT_A_JUMP: i64 = 31;
const LIVE_PATCH: i64 = 16;
const EINVAL: i64 = -22;
const EBUSY: i64 = -16;

#[test]
fn jmps_that_would_send_a_cpu_back_to_the_same_int3_are_refused() {
    if !can_boot("kernel scenario") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let scenario = Scenario::named("kernel_int3_progress.sh")
        .file(tvraw(dir.path()))
        .timeout(240)
        .module_under_test("TRAPVEC_INT3_PROGRESS_MODULE", "tv_int3_progress");
    let run = scenario.run(env!("CARGO_BIN_EXE_vmtest"));
    println!("{}", run.stdout);
    run.assert_passed();
    assert!(
        run.stdout.contains("INT3_PROGRESS_DONE"),
        "the scenario ran to its end"
    );
    assert_eq!(
        run.number("CHECK_A"),
        0,
        "the first instruction past tcp_sync_mss's entry takes a 2-byte window"
    );
    for line in ["SELF", "INSIDE"] {
        assert_eq!(
            word(&run, line, "ret"),
            EINVAL,
            "{line}: a jmp into its own window"
        );
        assert_eq!(word(&run, line, "reason"), NOT_A_JUMP, "{line}");
    }
    assert_eq!(
        word(&run, "A_TO_B", "ret"),
        0,
        "a jmp onto ordinary code is written"
    );
    assert_eq!(
        word(&run, "B_TO_A", "ret"),
        EBUSY,
        "the jmp closing the cycle"
    );
    assert_eq!(word(&run, "B_TO_A", "reason"), LIVE_PATCH);
    assert_eq!(word(&run, "A_REVERT", "ret"), 0);
    assert_eq!(
        word(&run, "B_FIRST", "ret"),
        0,
        "a jmp onto A's site before A is a patch"
    );
    assert_eq!(
        word(&run, "A_SECOND", "ret"),
        EBUSY,
        "the jmp closing the cycle"
    );
    assert_eq!(word(&run, "A_SECOND", "reason"), LIVE_PATCH);
    assert_eq!(run.expect("TEXT_UNCHANGED"), "yes");
    assert_eq!(word(&run, "INFO", "live"), 0, "no patch left live");
    assert_eq!(run.expect("SPLICE"), "yes");
    assert_eq!(run.expect("UNSPLICE"), "yes");
    assert_eq!(run.expect("RMMOD"), "yes");
}
