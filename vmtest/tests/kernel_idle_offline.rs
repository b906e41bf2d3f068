//! The last gaps of issue 24 (`vmtest/scenarios/kernel_idle_offline.sh`), in one boot:
//!
//! - A jmp splice's handler in RCU-idle text runs with RCU watching: with
//!   `vmtest/kmods/idle_poll`'s poll state, a jmp splice on `cpuidle_poll_time()` (noinstr
//!   from 6.3 on, refused: there `tv_idle_spin()`, which the module's own poll state calls) calls
//!   `components/tv_rcu_watch.c`, which never finds RCU not watching; the module counted the
//!   handlers it entered RCU for (`jmp_rcu_idle`); removal cycles while both CPUs poll do not
//!   oops or upset RCU.
//! - The CPU-offline path after `rcu_report_dead()` is refused by name (trap and jmp), and
//!   CPU1 goes offline and online while allowed splices on the hotplug and idle paths come and
//!   go.
//! - A module's jump-label target and exception fix-up inside a jmp window are refused by name
//!   (`vmtest/kmods/hidden_mod`); the key flips both ways and both functions still work.
//!
//! `TRAPVEC_IDLE_OFFLINE_MODULE=/path/trapvec.ko` tests that module instead of the tree's (one
//! without the fixes runs the jmp handler with RCU not watching and accepts the offline path).

use vmtest::testing::{can_boot, guest_module, Scenario};

const CYCLES: u64 = 6;
const ROUNDS: u64 = 4;

#[test]
fn jmp_handlers_in_idle_text_watch_rcu_the_offline_path_is_refused_and_module_targets_are_named() {
    if !can_boot("kernel scenario") {
        return;
    }
    let started = std::time::Instant::now();
    let run = Scenario::named("kernel_idle_offline.sh")
        .file(guest_module("idle_poll", "tv_idle_poll"))
        .file(guest_module("hidden_mod", "tv_hidden"))
        .timeout(400)
        .module_under_test("TRAPVEC_IDLE_OFFLINE_MODULE", "tv_idle_offline")
        .run(env!("CARGO_BIN_EXE_vmtest"));
    println!("{}", run.stdout);
    run.assert_passed();
    assert!(
        run.stdout.contains("IDLE_OFFLINE_DONE"),
        "the scenario ran to its end"
    );

    // A. jmp in RCU-idle text.
    assert_eq!(run.expect("DRIVER"), "tv_idle_poll");
    let listed = run.expect("A_LISTED");
    assert!(
        listed.split_whitespace().any(|w| w == "jmp"),
        "the splice is a jmp: {listed}"
    );
    let hits = run.number("A_HITS");
    assert!(
        hits > 100,
        "poll_idle called cpuidle_poll_time through the jmp: {hits} hits"
    );
    assert_eq!(
        run.number("A_UNWATCHED"),
        0,
        "the jmp splice's handler never ran with RCU not watching"
    );
    assert!(
        run.number("A_WATCHED") >= hits,
        "the handler ran for every hit"
    );
    let entered = run.number("A_JMP_RCU_IDLE");
    assert!(
        entered >= hits,
        "the trampoline entered RCU for {entered} of {hits} handlers: the case was covered"
    );
    assert_eq!(run.number("A_CYCLES_DONE"), CYCLES);
    assert_eq!(run.number("A_UNWATCHED_END"), 0);
    assert!(run.number("A_JMP_RCU_IDLE_END") > entered);

    // B. The offline path.
    let functions: Vec<&str> = run.expect("B_FUNCTIONS").split_whitespace().collect();
    assert!(
        functions.len() >= 4,
        "the offline-path functions of this kernel: {functions:?}"
    );
    for f in [
        "cpuhp_report_idle_dead",
        "native_play_dead",
        "hlt_play_dead",
    ] {
        assert!(functions.contains(&f), "{f} is in kallsyms: {functions:?}");
    }
    assert_eq!(
        run.number("B_ACCEPTED_COUNT"),
        0,
        "no window in the offline path is accepted: {:?}",
        run.value("B_ACCEPTED")
    );
    for f in &functions {
        assert!(
            run.number(&format!("B_NAMED_{f}")) > 0,
            "the module refused windows in {f}, naming it"
        );
    }
    let point = run.expect("B_HLT_POINT");
    assert!(point.starts_with("hlt_play_dead+"), "{point}");
    let msg = run.expect("B_ERR_HLT");
    assert!(
        msg.contains(&format!("trapctl: {point}: "))
            && msg.contains(
                "in hlt_play_dead, which a CPU going offline runs after rcu_report_dead(): no RCU grace period waits for that CPU"
            ),
        "{msg}"
    );
    assert_eq!(run.value("B_SPLICE_FAILED"), None);
    assert_eq!(run.value("B_ROUND_FAILED"), None);
    assert_eq!(run.value("B_IDLE_CYCLE_FAILED"), None);
    assert_eq!(run.number("B_ROUNDS"), ROUNDS, "every offline/online round");
    assert_eq!(run.number("B_CPU1_ONLINE"), 1);
    assert!(
        run.number("B_CALLBACK_HITS") >= ROUNDS,
        "cpuhp_invoke_callback ran through its trap in every round"
    );
    assert!(run.number("B_IDLE_HITS") > 0);
    assert_eq!(run.number("B_UNWATCHED"), 0);
    assert_eq!(run.expect("B_UNSPLICED"), "yes");

    // C. A module's hidden branch targets.
    assert_eq!(
        run.number("C_ACCEPTED_COUNT"),
        0,
        "no jmp window over a hidden target was accepted"
    );
    let jump = run.expect("C_ERR_JUMP");
    assert!(
        jump.contains("jump-label target of static key tv_hidden_key")
            && jump.contains(" at tv_hidden_sum+0x")
            && jump.ends_with(" inside the window"),
        "the key and the target are named: {jump}"
    );
    let fixup = run.expect("C_ERR_FIXUP");
    assert!(
        fixup.contains("exception fixup of tv_hidden_load+0x")
            && fixup.contains(" at tv_hidden_load+0x")
            && fixup.ends_with(" inside the window"),
        "the faulting instruction and the fix-up are named: {fixup}"
    );
    // sum(3): (4 << 3) + 3 = 35, ^ 3 = 32 with the key on; 4 ^ 3 = 7 with it off.
    assert_eq!(run.expect("C_RESULT_ON"), "key=1 sum=32 ok=1 faulted=1");
    assert_eq!(run.expect("C_RESULT_OFF"), "key=0 sum=7 ok=2 faulted=2");
    assert_eq!(run.expect("C_RESULT_BACK"), "key=1 sum=32 ok=3 faulted=3");

    assert_eq!(run.number("RCU_COMPLAINTS"), 0, "no RCU complaint in dmesg");
    assert_eq!(run.expect("DMESG_CLEAN"), "yes");
    assert_eq!(run.expect("RMMOD"), "yes");
    println!(
        "kernel_idle_offline: {hits} jmp hits in 2 s of polling, {CYCLES} removal cycles in {} s, {ROUNDS} offline/online rounds in {} s, {} s in all",
        run.number("A_CYCLE_SECONDS"),
        run.number("B_SECONDS"),
        started.elapsed().as_secs()
    );
}
