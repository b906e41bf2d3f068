//! Return points keep livepatch's consistency (`vmtest/scenarios/kernel_livepatch_returns.sh`,
//! issue 24 item 4): a task sleeping under a return point on `do_nanosleep()` has a trapvec stub
//! for a return address, which hides `common_nsleep()` above it. A livepatch of
//! `common_nsleep()` (`vmtest/kmods/lp_nsleep`) must leave that task unswitched: the stub's
//! unwind hint makes the stack walk unreliable, so the transition stays 1 while the task
//! sleeps and reaches 0 once it is killed.
//!
//! `TRAPVEC_LP_RETURNS_MODULE=/path/trapvec.ko` tests that module instead of the tree's (with
//! the stubs marked end-of-stack, as before this fix, the transition completes within a second
//! or two while the task still sleeps inside the old `common_nsleep()`).

use vmtest::testing::{can_boot, can_boot_kernel, guest_module, guest_module_for, Scenario};

#[test]
fn a_livepatch_transition_waits_for_a_task_sleeping_under_a_pending_return_point() {
    if !can_boot("kernel scenario") {
        return;
    }
    livepatch_returns(
        Scenario::named("kernel_livepatch_returns.sh")
            .file(guest_module("lp_nsleep", "tv_lp_nsleep")),
    );
}

/// The same on Debian 13's kernel (the livepatch built against its headers), its vCPUs in one
/// TCG thread (`Scenario::single_tcg_thread`: 6.12 dies of a stale int3 left by a transition's
/// static-call rewrites under multi-threaded TCG, trapvec loaded or not).
#[test]
fn a_livepatch_transition_waits_for_a_task_under_a_return_point_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    livepatch_returns(
        Scenario::named("kernel_livepatch_returns.sh")
            .kernel("6.12")
            .single_tcg_thread()
            .file(guest_module_for("6.12", "lp_nsleep", "tv_lp_nsleep")),
    );
}

fn livepatch_returns(scenario: Scenario) {
    let scenario = scenario
        .timeout(300)
        .module_under_test("TRAPVEC_LP_RETURNS_MODULE", "tv_lp_returns");
    let run = scenario.run(env!("CARGO_BIN_EXE_vmtest"));
    println!("{}", run.stdout);
    run.assert_passed();
    assert!(
        run.stdout.contains("LP_RETURNS_DONE"),
        "the scenario ran to its end"
    );
    assert!(
        run.expect("STACK_TOP").contains("trapvec_rp_stubs"),
        "the sleeper's stack walk stops at the stub: {}",
        run.expect("STACK_TOP")
    );
    assert_eq!(
        run.expect("SLEEPER_ALIVE"),
        "yes",
        "the sleeper slept throughout"
    );
    assert_eq!(
        run.expect("TRANSITION_WHILE_SLEEPING"),
        "1111",
        "the transition waited for the sleeper every second (a 0: it switched a task inside the old common_nsleep)"
    );
    assert_eq!(
        run.number("TRANSITION_AFTER"),
        0,
        "the transition completed once the sleeper was gone"
    );
    assert_eq!(run.number("ENABLED"), 1);
    assert!(
        run.number("LP_CALLS") >= 1,
        "a sleep after the transition ran the new common_nsleep"
    );
    assert_eq!(
        run.expect("LP_RMMOD"),
        "yes",
        "the livepatch was disabled and removed"
    );
    assert!(
        run.number("RETURNS") >= 1,
        "the return point counted returns of do_nanosleep"
    );
    assert_eq!(run.expect("UNSPLICED"), "yes");
}
