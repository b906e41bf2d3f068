//! Task predicates in the kernel (`vmtest/scenarios/kernel_predicates.sh`, issue 12 item 3), in
//! one boot: of two processes making 3,000 and 2,000 getppid() calls, a splice with `--tgid`,
//! `--comm` or `--pid` counts (or runs its return handler for) exactly the one it names, by trap
//! (the dispatcher tests `current`) and by jmp (a guard in the trampoline reads
//! `gs:current_task`); two fields that no task has together count nothing; a name the kernel
//! cannot hold is refused and changes nothing.

use serde_json::Value;
use vmtest::testing::{can_boot, Run, Scenario};

/// The one live splice of a squashed `trapctl list --json`.
fn row(run: &Run, key: &str) -> Value {
    let v: Value = serde_json::from_str(run.expect(key)).unwrap_or_else(|e| panic!("{key} is not JSON: {e}"));
    let splices = v["splices"].as_array().unwrap_or_else(|| panic!("{key} has no splices"));
    assert_eq!(splices.len(), 1, "{key}: one live splice");
    splices[0].clone()
}

/// `CALLS=n` of a ppidloop line (every answer right).
fn calls(run: &Run, key: &str) -> u64 {
    let line = run.expect(key);
    let word = |k: &str| -> u64 { line.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{key}={line} has no {k}")) };
    assert_eq!(word("WRONG="), 0, "{key}: every getppid() answered right");
    word("CALLS=")
}

#[test]
fn predicates_let_only_the_named_task_in_by_trap_and_by_jmp() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("kernel_predicates.sh").timeout(600).run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert_eq!(run.expect("PREDICATES"), "done");
    for mech in ["trap", "jmp"] {
        // 1. --tgid A: A's 3,001 calls (3,000 and the one that learns the answer), not B's.
        assert!(run.expect(&format!("TGID_{mech}_SPLICE")).contains(&format!("by {mech}: count (only tgid ")), "{}", run.expect(&format!("TGID_{mech}_SPLICE")));
        let (a, b) = (calls(&run, &format!("TGID_{mech}_A")), calls(&run, &format!("TGID_{mech}_B")));
        assert_eq!((a, b), (3001, 2001));
        let r = row(&run, &format!("TGID_{mech}_LIST"));
        assert_eq!(r["hits"].as_u64(), Some(a), "{mech}: --tgid counts only A's calls: {r}");
        // 2. --comm otherloop: B's returns.
        let b = calls(&run, &format!("COMM_{mech}_B"));
        let r = row(&run, &format!("COMM_{mech}_LIST"));
        assert_eq!(r["hits"].as_u64(), Some(b), "{mech}: --comm counts only otherloop's entries: {r}");
        assert_eq!(r["returns"]["returns"].as_u64(), Some(b), "{mech}: and its returns: {r}");
        assert_eq!(r["returns"]["missed"].as_u64(), Some(0));
        // 3. --pid A: the handler ran once per call of A, each returning the shell's pid.
        let a = calls(&run, &format!("PID_{mech}_A"));
        let num = |k: &str| -> Vec<u64> { run.expect(k).split_whitespace().map(|n| n.parse().unwrap()).collect() };
        let (before, after) = (num(&format!("PID_BEFORE_{mech}")), num(&format!("PID_AFTER_{mech}")));
        assert_eq!(after[0] - before[0], a, "{mech}: one return handler per call of A");
        assert_eq!(after[1] - before[1], a, "{mech}: each returned the shell's pid");
        let r = row(&run, &format!("PID_LIST_{mech}"));
        assert_eq!((r["hits"].as_u64(), r["returns"]["returns"].as_u64()), (Some(a), Some(a)), "{mech}: {r}");
    }
    // 4. Both fields must match: nothing.
    assert_eq!(calls(&run, "NONE_B"), 2001);
    assert_eq!(row(&run, "NONE_LIST")["hits"].as_u64(), Some(0));
    // 5. A name longer than the kernel keeps: refused, naming it, nothing written.
    let bad = run.expect("BAD_COMM");
    assert!(bad.contains("systemd-journald") && bad.contains("1 to 15 bytes") && bad.ends_with("rc=1"), "{bad}");
    assert_eq!(run.expect("BAD_BYTES_BEFORE"), run.expect("BAD_BYTES_AFTER"));
    let v: Value = serde_json::from_str(run.expect("BAD_LIST")).unwrap();
    assert_eq!(v["splices"].as_array().map(Vec::len), Some(0));
}
