//! Batches of trap and jmp splices on functions that the tick and its softirqs run all the time
//! (`vmtest/scenarios/kernel_hot_int3.sh`, issue 24). Each apply and revert of a window over two
//! instructions leaves the module's CC at its site for an RCU-tasks grace period, and FINISH's
//! stop_machine() then waits for both CPUs with interrupts on while a tick's softirq runs the
//! sites: the die notifier must send every CPU that meets a CC on. A jmp rel8 onto a springboard
//! written by the same batch stalled 6.12 guests (both CPUs at `sched_balance_softirq+9`): the
//! notifier sent them to the springboard before FINISH had written it, and its padding fell
//! through into the function, to the same CC. Asserted: every round applied and reverted (a stall
//! is the guest's timeout), CPUs really met the CCs (the notifier's counter grew), nothing left
//! live; on 6.12, some jmp went by a springboard (the case that stalled: the scenario adds the
//! first springboard block of functions every interrupt runs, such as `irq_exit_rcu`).
//!
//! `TRAPVEC_HOT_INT3_MODULE=/path/trapvec.ko` tests that module instead of the tree's (one
//! without the fix stalls on 6.12 in the first round).

use vmtest::testing::{can_boot, can_boot_kernel, Run, Scenario};

/// Apply-and-revert rounds of each batch.
const ROUNDS: u64 = 6;

fn run(kernel: Option<&str>) -> Run {
    let mut scenario = Scenario::named("kernel_hot_int3.sh")
        .append(&format!("HOT_ROUNDS={ROUNDS}"))
        .timeout(300)
        .module_under_test("TRAPVEC_HOT_INT3_MODULE", "tv_hot_int3");
    if let Some(k) = kernel {
        scenario = scenario.kernel(k);
    }
    // One boot: a stall here is the bug, not a flaky host.
    let run = scenario.run_once(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert!(
        run.stdout.contains("HOT_DONE"),
        "the scenario ran to its end"
    );
    assert!(
        run.number("HOT_POINTS_TRAP") >= 3,
        "the tick's functions take trap splices"
    );
    assert_eq!(run.number("HOT_ROUNDS"), ROUNDS, "every round ran");
    assert!(
        run.number("HOT_REDIRECTS") > 0,
        "CPUs met the pending CCs (the race was exercised)"
    );
    assert_eq!(run.number("HOT_LIVE"), 0, "nothing left live");
    run
}

#[test]
fn splice_batches_on_tick_functions_never_stall() {
    if !can_boot("kernel scenario") {
        return;
    }
    run(None);
}

#[test]
fn splice_batches_on_tick_functions_never_stall_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    let run = run(Some("6.12"));
    assert!(
        run.number("HOT_JMP_REL8") > 0,
        "a jmp rel8 went by a springboard of its own batch"
    );
}
