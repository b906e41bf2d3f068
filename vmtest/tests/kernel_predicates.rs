//! Task predicates in the kernel (`vmtest/scenarios/kernel_predicates.sh`, issue 12 item 3), in
//! one boot: of two processes making 3,000 and 2,000 getppid() calls, a splice with `--tgid`,
//! `--comm` or `--pid` counts (or runs its return handler for) exactly the one it names, by trap
//! (the dispatcher tests `current`) and by jmp (a guard in the trampoline reads
//! `gs:current_task`); two fields that no task has together count nothing; a name the kernel
//! cannot hold is refused and changes nothing. trapd's profiles that splice getppid differently
//! hand the site over, and a refused switch leaves the old profile's splice live and recorded.

use serde_json::Value;
use vmtest::testing::{build_trapd, can_boot, can_boot_kernel, Run, Scenario};

/// The one live splice of a squashed `trapctl list --json`.
fn row(run: &Run, key: &str) -> Value {
    let v: Value =
        serde_json::from_str(run.expect(key)).unwrap_or_else(|e| panic!("{key} is not JSON: {e}"));
    let splices = v["splices"]
        .as_array()
        .unwrap_or_else(|| panic!("{key} has no splices"));
    assert_eq!(splices.len(), 1, "{key}: one live splice");
    splices[0].clone()
}

/// `CALLS=n` of a ppidloop line (every answer right).
fn calls(run: &Run, key: &str) -> u64 {
    let line = run.expect(key);
    let word = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{key}={line} has no {k}"))
    };
    assert_eq!(word("WRONG="), 0, "{key}: every getppid() answered right");
    word("CALLS=")
}

#[test]
fn predicates_let_only_the_named_task_in_by_trap_and_by_jmp() {
    if !can_boot("kernel scenario") {
        return;
    }
    predicates(Scenario::named("kernel_predicates.sh"));
}

/// The same on Debian 13's kernel.
#[test]
fn predicates_let_only_the_named_task_in_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    predicates(Scenario::named("kernel_predicates.sh").kernel("6.12"));
}

fn predicates(scenario: Scenario) {
    let trapd = build_trapd();
    let run = scenario
        .file(&trapd)
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert_eq!(run.expect("PREDICATES"), "done");
    for mech in ["trap", "jmp"] {
        // 1. --tgid A: A's 3,001 calls (3,000 and the one that learns the answer), not B's.
        assert!(
            run.expect(&format!("TGID_{mech}_SPLICE"))
                .contains(&format!("by {mech}: count (only tgid ")),
            "{}",
            run.expect(&format!("TGID_{mech}_SPLICE"))
        );
        let (a, b) = (
            calls(&run, &format!("TGID_{mech}_A")),
            calls(&run, &format!("TGID_{mech}_B")),
        );
        assert_eq!((a, b), (3001, 2001));
        let r = row(&run, &format!("TGID_{mech}_LIST"));
        assert_eq!(
            r["hits"].as_u64(),
            Some(a),
            "{mech}: --tgid counts only A's calls: {r}"
        );
        // 2. --comm otherloop: B's returns.
        let b = calls(&run, &format!("COMM_{mech}_B"));
        let r = row(&run, &format!("COMM_{mech}_LIST"));
        assert_eq!(
            r["hits"].as_u64(),
            Some(b),
            "{mech}: --comm counts only otherloop's entries: {r}"
        );
        assert_eq!(
            r["returns"]["returns"].as_u64(),
            Some(b),
            "{mech}: and its returns: {r}"
        );
        assert_eq!(r["returns"]["missed"].as_u64(), Some(0));
        // 3. --pid A: the handler ran once per call of A, each returning the shell's pid.
        let a = calls(&run, &format!("PID_{mech}_A"));
        let num = |k: &str| -> Vec<u64> {
            run.expect(k)
                .split_whitespace()
                .map(|n| n.parse().unwrap())
                .collect()
        };
        let (before, after) = (
            num(&format!("PID_BEFORE_{mech}")),
            num(&format!("PID_AFTER_{mech}")),
        );
        assert_eq!(
            after[0] - before[0],
            a,
            "{mech}: one return handler per call of A"
        );
        assert_eq!(
            after[1] - before[1],
            a,
            "{mech}: each returned the shell's pid"
        );
        let r = row(&run, &format!("PID_LIST_{mech}"));
        assert_eq!(
            (r["hits"].as_u64(), r["returns"]["returns"].as_u64()),
            (Some(a), Some(a)),
            "{mech}: {r}"
        );
    }
    // 4. Both fields must match: nothing.
    assert_eq!(calls(&run, "NONE_B"), 2001);
    assert_eq!(row(&run, "NONE_LIST")["hits"].as_u64(), Some(0));
    // 5. A name longer than the kernel keeps: refused, naming it, nothing written.
    let bad = run.expect("BAD_COMM");
    assert!(
        bad.contains("systemd-journald") && bad.contains("1 to 15 bytes") && bad.ends_with("rc=1"),
        "{bad}"
    );
    assert_eq!(
        run.expect("BAD_BYTES_BEFORE"),
        run.expect("BAD_BYTES_AFTER")
    );
    let v: Value = serde_json::from_str(run.expect("BAD_LIST")).unwrap();
    assert_eq!(v["splices"].as_array().map(Vec::len), Some(0));
    // 6. trapd: `all` counts both processes, `only_a` (comm ppidloop) takes the site over.
    let json = |k: &str| -> Value {
        serde_json::from_str(run.expect(k)).unwrap_or_else(|e| panic!("{k} is not JSON: {e}"))
    };
    let live = |k: &str| -> Value {
        let v = json(k);
        let s = v["splices"]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {v}"));
        assert_eq!(s.len(), 1, "{k}: one live splice: {v}");
        assert_eq!(v["unrecorded"], serde_json::json!([]), "{k}: {v}");
        s[0].clone()
    };
    let a = json("HAND_ALL_ACTIVATE");
    assert_eq!(
        (
            a["ok"].as_bool(),
            a["added"].as_u64(),
            a["handed_over"].as_u64()
        ),
        (Some(true), Some(1), Some(0)),
        "{a}"
    );
    let both = calls(&run, "HAND_ALL_A") + calls(&run, "HAND_ALL_B");
    assert_eq!(
        live("HAND_ALL_TRAPD")["hits"].as_u64(),
        Some(both),
        "profile all counts every call"
    );
    // Made while A called getppid without pause: in place, so every call of A was counted by
    // `all`'s splice (its final count in the reply, which also holds HAND_ALL's calls) or by
    // `only_a`'s, and both saw some.
    let a = json("HAND_ONLY_ACTIVATE");
    assert_eq!(
        (
            a["removed"].as_u64(),
            a["added"].as_u64(),
            a["in_place"].as_u64(),
            a["handed_over"].as_u64()
        ),
        (Some(1), Some(1), Some(1), Some(0)),
        "{a}"
    );
    let r = live("HAND_ONLY_TRAPD");
    assert_eq!(
        r["action"].as_str(),
        Some("count (only comm ppidloop)"),
        "{r}"
    );
    let before = a["removed_hits"].as_u64().unwrap() - both;
    let after = r["hits"].as_u64().unwrap();
    assert_eq!(
        before + after,
        calls(&run, "HAND_ONLY_A"),
        "every call of A counted once, across the switch: {before} + {after}"
    );
    let kprobe: u64 = run.expect("HAND_ONLY_KPROBE").parse().unwrap();
    assert_eq!(
        kprobe,
        before + after,
        "the kernel's kprobe on getppid saw the calls trapvec counted"
    );
    assert!(
        before > 0 && after > 0,
        "the switch came while A ran: {before} before, {after} after"
    );
    // A refused switch: only_a's splice made again, counting A's calls from zero, and recorded.
    let a = json("HAND_BROKEN_ACTIVATE");
    assert_eq!(a["ok"].as_bool(), Some(false), "{a}");
    assert!(
        a["error"]
            .as_str()
            .unwrap()
            .contains("__x64_sys_getppid+0x1"),
        "the refusal names its point: {a}"
    );
    assert_eq!(
        json("HAND_BROKEN_TRAPD")["profile"].as_str(),
        Some("only_a")
    );
    let r = live("HAND_BROKEN_TRAPD");
    assert_eq!(
        (r["action"].as_str(), r["mechanism"].as_str()),
        (Some("count (only comm ppidloop)"), Some("trap")),
        "{r}"
    );
    assert_eq!(
        r["hits"].as_u64(),
        Some(calls(&run, "HAND_BROKEN_A")),
        "{r}"
    );
    let v = json("HAND_RESTART");
    assert_eq!(v["profile"].as_str(), Some("only_a"), "{v}");
    assert_eq!(
        live("HAND_RESTART")["action"].as_str(),
        Some("count (only comm ppidloop)")
    );
    assert_eq!(
        json("HAND_UNSPLICE")["unspliced"].as_array().map(Vec::len),
        Some(1)
    );
}
