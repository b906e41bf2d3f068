//! Commands that hold a splice for a while, ended by signals in the real kernel
//! (`vmtest/scenarios/kernel_signals.sh`, issue 24 item 13), in one boot: `trapctl count` ended
//! by SIGTERM, `trapctl time` by SIGINT and `trapctl count --by comm` by SIGHUP each print their
//! exact figures, end by that signal (status 128+N in the shell) and leave nothing spliced;
//! `-- COMMAND` counts while the command runs and exits with its status; a count killed by
//! SIGKILL leaves a splice that `trapctl list` shows orphaned with the killed pid and that
//! `trapctl unsplice --orphans` removes, as it removes a kernel `trapctl trace` killed while
//! live with its component `trace_PID` (issue 29); through trapd a timer ended by SIGTERM is removed by
//! its request; the function's bytes come back (vmtest fails the run on any oops or WARNING).

use serde_json::Value;
use vmtest::testing::{build_trapd, can_boot, can_boot_kernel, Scenario};

#[test]
fn counts_and_timers_ended_by_signals_remove_their_splices_and_print_their_figures() {
    if !can_boot("kernel scenario") {
        return;
    }
    signals(Scenario::named("kernel_signals.sh"));
}

/// The same on Debian 13's kernel.
#[test]
fn counts_and_timers_ended_by_signals_remove_their_splices_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    signals(Scenario::named("kernel_signals.sh").kernel("6.12"));
}

fn signals(scenario: Scenario) {
    let trapd = build_trapd();
    let run = scenario
        .file(&trapd)
        .timeout(300)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert_eq!(run.expect("SIGNALS"), "done");
    let empty = "no splices|no components|";

    // 1. Each signal: the figures (ppidloop's -n calls and the one that learns the answer),
    // trapctl ended by the signal, nothing left.
    assert_eq!(run.expect("TERM_STATUS"), "143", "SIGTERM: 128 + 15");
    let out = run.expect("TERM_OUT");
    assert!(
        out.contains("|__x64_sys_getppid: 101 calls in "),
        "the count's figures: {out}"
    );
    assert_eq!(run.expect("TERM_LIST"), empty);

    assert_eq!(
        run.expect("INT_STATUS"),
        "130",
        "SIGINT: 128 + 2; stderr: {}",
        run.expect("INT_ERR")
    );
    let timer: Value = serde_json::from_str(run.expect("INT_JSON"))
        .unwrap_or_else(|e| panic!("INT_JSON: {e}: {}", run.expect("INT_JSON")));
    assert_eq!(timer["count"], 51, "every ppidloop call timed: {timer}");
    assert_eq!(timer["ended"], "SIGINT", "{timer}");
    assert_eq!(run.expect("INT_LIST"), empty);

    assert_eq!(run.expect("HUP_STATUS"), "129", "SIGHUP: 128 + 1");
    let out = run.expect("HUP_OUT");
    assert!(
        out.contains("@[ppidloop]: 21|"),
        "the keyed count's table: {out}"
    );
    assert!(out.contains("|__x64_sys_getppid: 21 calls in "), "{out}");
    assert_eq!(run.expect("HUP_LIST"), empty);

    assert_eq!(run.expect("CYCLE_STATUS"), "143");
    let out = run.expect("CYCLE_OUT");
    assert!(
        out.contains(" cycles of trap at 0x") && out.contains("restored each time"),
        "the cycles made before SIGTERM: {out}"
    );
    assert_eq!(run.expect("CYCLE_LIST"), empty);

    // 2. A command: counted while it runs, its status trapctl's.
    assert_eq!(run.expect("CMD_STATUS"), "0");
    let out = run.expect("CMD_OUT");
    assert!(out.starts_with("counting __x64_sys_getppid at 0x"), "{out}");
    assert!(
        out.contains(
            "while `/bin/ppidloop -n 30` runs|CALLS=31 WRONG=0|__x64_sys_getppid: 31 calls in "
        ),
        "{out}"
    );
    assert_eq!(run.expect("CMD3_STATUS"), "3", "the command's exit status");
    assert_eq!(run.expect("CMD_LIST"), empty);

    // 3. SIGKILL: an orphan, named, then removed.
    assert_eq!(run.expect("KILL_STATUS"), "137");
    let pid = run.expect("KILL_PID");
    let listed = run.expect("KILL_LIST");
    assert!(
        listed.starts_with("POINT"),
        "the killed count's splice stays: {listed}"
    );
    assert!(
        listed.contains(&format!(
            "|  orphaned: held by pid {pid} `trapctl count __x64_sys_getppid`, which is gone"
        )),
        "{listed}"
    );
    let removed = run.expect("ORPHANS");
    assert!(
        removed.starts_with("unspliced orphan __x64_sys_getppid at 0x"),
        "{removed}"
    );
    assert!(
        removed.ends_with("|unspliced 1 orphaned splice(s)|"),
        "{removed}"
    );
    assert_eq!(run.expect("ORPHANS_LIST"), empty);

    // 3b. A kernel trace killed while live: its splice and its component trace_PID are
    // orphans, listed as such, then removed with the text restored.
    assert_eq!(run.expect("TRACE_STATUS"), "137");
    let pid = run.expect("TRACE_PID");
    let listed = run.expect("TRACE_LIST");
    assert!(
        listed.starts_with("POINT") && listed.contains(&format!("|trace_{pid} ")),
        "the killed trace's splice and component stay: {listed}"
    );
    assert!(
        listed.contains(&format!("|  orphaned: its handler is in trace_{pid}, whose `trapctl trace` is gone; `trapctl unsplice --orphans` removes both|")),
        "{listed}"
    );
    let removed = run.expect("TRACE_ORPHANS");
    assert!(
        removed.starts_with("unspliced orphan __x64_sys_getppid at 0x")
            && removed.ends_with("|unspliced 1 orphaned splice(s)|"),
        "{removed}"
    );
    assert_eq!(
        run.expect("TRACE_ORPHANS_LIST"),
        empty,
        "no splice, no trace_{pid}"
    );
    assert_eq!(run.expect("TRACE_BYTES"), "restored");

    // 4. Through trapd.
    assert_eq!(run.expect("TD_STATUS"), "143");
    assert!(
        run.expect("TD_OUT").starts_with("__x64_sys_getppid: "),
        "the timer's last line: {}",
        run.expect("TD_OUT")
    );
    let listed = run.expect("TD_LIST");
    assert!(
        listed.contains("no splices|"),
        "trapd's listing is empty: {listed}"
    );

    // 5.
    assert_eq!(run.expect("BYTES"), "restored");
}
