//! The kernel module in the field (`vmtest/scenarios/kernel_field.sh`, issue 9), in one boot:
//! kprobes and splices kept apart in both orders, text the module refuses with a reason of its
//! own, the invariants between text and dispatch table, more dispatch entries than one batch,
//! kernel.modules_disabled and kernel lockdown. Every refusal leaves the kernel unchanged.

use vmtest::testing::{can_boot, tvraw, Run, Scenario};

/// The `reason=N` word of a tvraw line printed as `key`.
fn reason(run: &Run, key: &str) -> String {
    let line = run.expect(key);
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("reason="))
        .unwrap_or_else(|| panic!("{key}={line} has no reason"))
        .to_owned()
}

/// The `ret=N` word of a tvraw line printed as `key`.
fn ret(run: &Run, key: &str) -> i64 {
    let line = run.expect(key);
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("ret=")?.parse().ok())
        .unwrap_or_else(|| panic!("{key}={line} has no ret"))
}

fn err(run: &Run, key: &str, words: &[&str]) {
    let msg = run.expect(key);
    assert!(msg.starts_with("trapctl: "), "{key}: one trapctl error line, got `{msg}`");
    for w in words {
        assert!(msg.contains(w), "{key}: `{msg}` lacks `{w}`");
    }
}

#[test]
fn kprobes_protected_text_invariants_scale_and_lockdown_in_the_field() {
    if !can_boot("kernel scenario") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = Scenario::named("kernel_field.sh").file(tvraw(dir.path())).timeout(900).run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    // 1b: a splice first.
    assert_eq!(run.expect("BL_LIVE"), "yes", "the live window is on the kprobes blacklist");
    assert_eq!(run.expect("KP_ON_SPLICE"), "refused", "a kprobe on the trap's first byte");
    assert_eq!(run.expect("KP_IN_SPLICE"), "refused", "a kprobe on the window's second byte");
    assert_eq!(run.expect("OOPS"), "no");
    assert_eq!(run.expect("KP_ENTRY"), "ok", "an ftrace-based kprobe at the entry beside the splice");
    let splice = run.number("SPLICE_DELTA");
    assert!(splice >= 300, "sysbench made 300 getppid calls, the splice counted {splice}");
    assert_eq!(run.number("PROBE_DELTA"), splice, "the entry kprobe and the splice count the same calls");
    assert_eq!(run.expect("BL_AFTER"), "gone", "unsplice takes the window off the blacklist");
    assert_eq!(run.expect("KP_AFTER_UNSPLICE"), "ok");

    // 1a: a kprobe first.
    err(&run, "ERR_KPROBE", &["a kprobe is registered at __x64_sys_getppid+5", "remove it first"]);
    assert_eq!(reason(&run, "CHECK_KPROBE"), "19");
    assert_eq!(run.expect("KP_MSS"), "ok");
    err(&run, "ERR_KPROBE_MSS", &["a kprobe is registered at tcp_sync_mss+6"]);
    assert_eq!(run.expect("THROUGH_PROBE"), "same", "the boundary decoder reads the probe's saved bytes");
    assert_eq!(reason_of(&run, "R_KPROBE_SLOT"), "22", "a kprobe instruction slot");
    assert_eq!(run.expect("KPROBE_UNCHANGED"), "yes");

    // 2: text the module refuses.
    assert_eq!(reason_of(&run, "R_CPUIDLE"), "20", ".cpuidle.text (default_idle)");
    assert_eq!(reason_of(&run, "R_SCT"), "21", "__SCT__cond_resched");
    assert_eq!(reason_of(&run, "R_RETURN_THUNK"), "6");
    assert_eq!(reason_of(&run, "R_SRSO"), "6", "an SRSO thunk");
    assert_eq!(reason_of(&run, "R_BPF"), "23", "a BPF JIT image");
    assert_eq!(reason_of(&run, "R_FTRACE_TRAMP"), "24", "an ftrace trampoline");
    assert_eq!(reason_of(&run, "R_FTRACE"), "8");
    err(&run, "ERR_CPUIDLE", &["default_idle+5", ".cpuidle.text"]);

    // 4: invariants.
    assert_eq!((ret(&run, "APPLY_NO_ENTRY"), reason(&run, "APPLY_NO_ENTRY")), (-22, "28".into()));
    assert_eq!((ret(&run, "APPLY_FOREIGN"), reason(&run, "APPLY_FOREIGN")), (-22, "29".into()));
    assert_eq!(run.expect("TEXT_UNCHANGED"), "yes");
    assert_eq!(ret(&run, "REMOVE_LIVE"), -16, "DISPATCH_REMOVE of a live trap's entry: EBUSY");
    assert!(run.number("HITS_AFTER_REMOVE") >= 50, "the splice kept working");
    assert_eq!(run.number("UNKNOWN_TRAPS"), 0, "no trap of ours was chained to the old handler");

    // 6: scale.
    let scale = run.expect("SCALE");
    for w in ["added=70000", "listed=70000", "sorted=1", "removed=70000"] {
        assert!(scale.contains(w), "SCALE={scale} lacks {w}");
    }
    assert_eq!(run.expect("SOFT_LOCKUP"), "no");

    // 5: another vector: INFO reports it, user space writes it and the splice counts; an int of
    // another vector (0xf5 here) is refused rather than run.
    let vec = run.expect("OTHER_VECTOR");
    assert_ne!(vec, "none", "the module loads with another free system vector");
    assert_eq!(vector_of(&run, "OTHER_INFO"), vec);
    assert_eq!(reason(&run, "OTHER_NO_ENTRY"), "28", "a trap of the module's vector without an entry");
    assert_eq!(reason(&run, "OTHER_F5"), "29", "int 0xf5 while the module's vector is another");
    assert_eq!(run.value("ERR_OTHER_VECTOR"), None, "trapctl splices with the module's vector");
    assert_eq!(run.expect("OTHER_SITE_BYTES"), format!("cd{}", vec.trim_start_matches("0x")), "CD <vector> at tcp_sync_mss+5");
    assert_eq!(run.number("OTHER_HITS"), 10, "two connections, five calls each");
    assert_eq!(run.expect("OTHER_UNSPLICED"), "yes");

    // 3: modules_disabled, lockdown.
    err(&run, "ERR_MODULES_DISABLED", &["kernel.modules_disabled=1 forbids writing kernel text"]);
    assert_eq!((ret(&run, "APPLY_MODULES_DISABLED"), reason(&run, "APPLY_MODULES_DISABLED")), (-1, "27".into()));
    assert!(run.expect("LOCKDOWN_NOW").contains("[integrity]"), "lockdown is on");
    err(&run, "ERR_LOCKDOWN", &["kernel lockdown (integrity) forbids writing kernel text"]);
    assert_eq!((ret(&run, "APPLY_LOCKDOWN"), reason(&run, "APPLY_LOCKDOWN")), (-1, "26".into()));
    assert_eq!(run.expect("LOCKDOWN_UNCHANGED"), "yes", "bytes, list and arena use as before");
    assert_eq!(run.expect("DMESG_CLEAN"), "yes");
}

/// A `KEY=N` line that rcheck printed (the reason alone), or tvraw's `reason=N` line.
fn reason_of(run: &Run, key: &str) -> String {
    let v = run.expect(key);
    v.strip_prefix("reason=").map_or(v, |r| r.split_whitespace().next().unwrap_or("")).to_owned()
}

/// What INFO's `vector=` word says.
fn vector_of(run: &Run, key: &str) -> String {
    run.expect(key).split_whitespace().find_map(|w| w.strip_prefix("vector=")).unwrap_or("").to_owned()
}
