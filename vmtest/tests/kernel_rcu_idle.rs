//! A trap taken where RCU is not watching (`vmtest/scenarios/kernel_rcu_idle.sh`, issue 24
//! item 2): with `vmtest/kmods/idle_poll` giving the guest a poll+halt cpuidle driver (as
//! cpuidle-haltpoll does in KVM guests), a trap splice on `cpuidle_poll_time()` is taken in
//! `poll_idle()`, after `cpuidle_enter_state()` entered RCU-idle. The handler
//! (`components/tv_rcu_watch.c`) counts whether RCU was watching when it ran: never "not
//! watching", because the dispatcher entered RCU as an NMI does; the module counted those traps
//! (`rcu_idle` > 0: the case was really covered). Then the splice is removed and made again in
//! a loop while both CPUs poll through it: no oops (vmtest), no RCU complaint in dmesg, and the
//! module still unloads.
//!
//! `TRAPVEC_RCU_IDLE_MODULE=/path/trapvec.ko` tests that module instead of the tree's (a module
//! without the fix runs the handler with RCU not watching: UNWATCHED > 0).

use vmtest::testing::{can_boot, can_boot_kernel, guest_module, guest_module_for, tvraw, Scenario};

#[test]
fn traps_taken_in_rcu_idle_run_their_handler_with_rcu_watching_and_survive_removal_loops() {
    if !can_boot("kernel scenario") {
        return;
    }
    rcu_idle(
        Scenario::named("kernel_rcu_idle.sh").file(guest_module("idle_poll", "tv_idle_poll")),
        "cpuidle_poll_time",
        30,
    );
}

/// The same on Debian 13's kernel, where `poll_idle()` and `cpuidle_poll_time()` are noinstr
/// (refused, naming it): the trap goes into the helper module's own poll loop,
/// `tv_idle_spin()`, which cpuidle also runs with RCU not watching. 10 removal cycles instead of
/// 30 (CI's 6.12 budget: 30 took 85 s there).
#[test]
fn traps_taken_in_rcu_idle_run_their_handler_with_rcu_watching_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    rcu_idle(
        Scenario::named("kernel_rcu_idle.sh")
            .kernel("6.12")
            .file(guest_module_for("6.12", "idle_poll", "tv_idle_poll"))
            .append("tv_rcu_idle.cycles=10"),
        "tv_idle_spin",
        10,
    );
}

/// `point`: the function the scenario's trap went into; `cycles`: the removal cycles asked for.
fn rcu_idle(scenario: Scenario, point: &str, cycles: u64) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let scenario = scenario
        .file(tvraw(dir.path()))
        .timeout(400)
        .module_under_test("TRAPVEC_RCU_IDLE_MODULE", "tv_rcu_idle");
    let run = scenario.run(env!("CARGO_BIN_EXE_vmtest"));
    println!("{}", run.stdout);
    run.assert_passed();
    assert!(
        run.stdout.contains("RCU_IDLE_DONE"),
        "the scenario ran to its end"
    );
    assert_eq!(
        run.expect("DRIVER"),
        "tv_idle_poll",
        "the guest idles through cpuidle"
    );
    assert_eq!(run.expect("POINT"), point);
    if point != "cpuidle_poll_time" {
        assert!(
            run.expect("NOINSTR").contains("cpuidle_poll_time")
                && run.expect("NOINSTR").contains("in noinstr text"),
            "the kernel's poll loop is refused as noinstr: {}",
            run.expect("NOINSTR")
        );
    }
    let hits = run.number("HITS");
    assert!(
        hits > 100,
        "the poll loop called {point} through the trap: {hits} hits"
    );
    assert_eq!(
        run.number("UNWATCHED"),
        0,
        "the handler never ran with RCU not watching"
    );
    assert!(
        run.number("WATCHED") >= hits,
        "the handler ran for every hit"
    );
    let rcu_idle = run.number("RCU_IDLE");
    assert!(rcu_idle >= hits, "the dispatcher counted {rcu_idle} traps taken in RCU-idle ({hits} hits): the case was covered");
    assert_eq!(
        run.number("CYCLES_DONE"),
        cycles,
        "every removal cycle completed"
    );
    assert_eq!(run.number("UNWATCHED_END"), 0);
    assert!(
        run.number("RCU_IDLE_END") > rcu_idle,
        "traps were taken in RCU-idle during the removal cycles"
    );
    assert_eq!(run.expect("UNSPLICED"), "yes");
    assert_eq!(run.expect("UNLOADED"), "yes");
    assert!(
        run.expect("QUIESCE").starts_with("ret=0 "),
        "{}",
        run.expect("QUIESCE")
    );
    assert_eq!(run.number("RCU_COMPLAINTS"), 0, "no RCU complaint in dmesg");
    assert_eq!(run.expect("RMMOD"), "yes");
    println!(
        "kernel_rcu_idle: {hits} hits in 2 s of polling, {cycles} removal cycles in {} s",
        run.number("CYCLE_SECONDS")
    );
}
