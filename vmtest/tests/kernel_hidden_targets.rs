//! Branch targets no decoder sees (`vmtest/scenarios/kernel_hidden_targets.sh`, issue 24 item
//! 3), in one boot: a window over a jump-label target or an exception fix-up past its first
//! byte is refused by the module, the refusal names the static key or the faulting instruction
//! and the place; the scheduler feature whose key it is flips both ways while the scheduler runs
//! the function, without an oops; a window that starts at a target is not refused for it. And
//! a window over an endbr64 (6.12, IBT) is refused by the module itself (reason ENDBR).

use vmtest::testing::{can_boot_kernel, tvraw, Scenario};

/// `name+0xHEX`, as the kernel's `%pS` places an address in a symbol.
fn is_place(s: &str) -> bool {
    s.split_once("+0x").is_some_and(|(name, off)| {
        !name.is_empty() && !off.is_empty() && off.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// On Debian 12's 6.1 whatever `TRAPVEC_GUEST_KERNEL` says: the 6.12 run is the test below.
#[test]
fn windows_over_jump_label_targets_and_exception_fixups_are_refused_naming_them() {
    if !can_boot_kernel("kernel scenario", "6.1") {
        return;
    }
    hidden_targets(
        Scenario::named("kernel_hidden_targets.sh").kernel("6.1"),
        false,
    );
}

/// The same on Debian 13's kernel.
#[test]
fn windows_over_jump_label_targets_and_exception_fixups_are_refused_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    hidden_targets(
        Scenario::named("kernel_hidden_targets.sh").kernel("6.12"),
        true,
    );
}

/// `ibt`: the kernel is built with CONFIG_X86_KERNEL_IBT (6.12), so its functions start with endbr64.
fn hidden_targets(scenario: Scenario, ibt: bool) {
    let dir = tempfile::tempdir().unwrap();
    let run = scenario
        .file(tvraw(dir.path()))
        .timeout(300)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    // Jump labels: thousands of targets in core text; some points before them pass the
    // planner (it sees a nop, or a jmp elsewhere) and only the module refuses them.
    assert!(
        run.number("JUMP_TARGETS") > 1000,
        "the core kernel's jump table was read"
    );
    assert!(run.number("JUMP_POINTS") > 1000);
    assert!(
        run.number("JUMP_REFUSED") > 0,
        "windows over jump-label targets are refused"
    );
    let point = run.expect("JUMP_POINT");
    assert_ne!(
        point, "none",
        "a scheduler function with a jump-label target inside a jmp window"
    );
    let msg = run.expect("ERR_JUMP_TARGET");
    assert!(
        msg.starts_with("trapctl: "),
        "trapctl refused the splice: {msg}"
    );
    let (_, rest) = msg
        .split_once("jump-label target of static key sched_feat_keys")
        .unwrap_or_else(|| panic!("the key is named: {msg}"));
    let at = rest
        .split_once(" at ")
        .and_then(|(_, r)| r.strip_suffix(" inside the window"))
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(
        is_place(at),
        "the target is placed as function+0xOFF: {msg}"
    );
    let function = point.split_once('+').map_or(point, |(f, _)| f);
    assert!(
        at.starts_with(&format!("{function}+0x")),
        "the target is in the point's function: {msg}"
    );
    assert_eq!(
        run.expect("FLIPPED"),
        "yes",
        "the feature's key flipped: {}",
        run.expect("FEATURE")
    );
    assert!(
        run.number("CALLED") > 0,
        "{function} ran while its key was flipped"
    );
    assert_eq!(run.expect("RESTORED"), "yes");
    let at_target = run.expect("AT_TARGET");
    let reason = at_target
        .split_whitespace()
        .find_map(|w| w.strip_prefix("reason="))
        .unwrap_or("?");
    assert!(
        reason != "32" && reason != "33",
        "a window starting at the target is not refused for it: {at_target}"
    );

    // Exception fix-ups.
    assert!(
        run.number("FIXUP_TARGETS") > 100,
        "the core kernel's exception table was read"
    );
    assert!(
        run.number("FIXUP_REFUSED") > 0,
        "windows over exception fix-ups are refused"
    );
    assert_ne!(run.expect("FIXUP_POINT"), "none");
    let msg = run.expect("ERR_FIXUP");
    let (_, rest) = msg
        .split_once("exception fixup of ")
        .unwrap_or_else(|| panic!("{msg}"));
    let (insn, at) = rest
        .strip_suffix(" inside the window")
        .and_then(|r| r.split_once(" at "))
        .unwrap_or_else(|| panic!("{msg}"));
    assert!(
        is_place(insn) && is_place(at),
        "the faulting instruction and the fix-up are placed: {msg}"
    );

    // A window over the entry: the endbr64 with IBT (35, ENDBR), the ftrace nop without (8).
    let entry = run.expect("ENTRY_CHECK");
    let want = if ibt { "reason=35" } else { "reason=8" };
    assert!(
        entry.split_whitespace().any(|w| w == want),
        "CHECK of tcp_sync_mss+0, 2 bytes: {entry}, want {want}"
    );

    // Nothing was spliced, nothing oopsed.
    assert_eq!(run.number("LIVE_PATCHES"), 0);
    assert_eq!(run.expect("DMESG_CLEAN"), "yes");
}
