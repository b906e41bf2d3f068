//! A kprobe armed on a live patch pins trapvec.ko (`vmtest/scenarios/kernel_kprobe_pin.sh`,
//! issue 24 item 6). The race that lets a kprobe in (register_kprobe() reads the blacklist
//! before it takes kprobe_mutex) is replaced by the module's test knob `kprobe_blacklist=0`;
//! everything after it is the real path: the next APPLY finds the probe with get_kprobe(),
//! dmesg names the site and the probe, `rmmod` is refused while the probe exists (the arena
//! its copied trap runs would be freed), and once the probe is gone the module drops its own
//! reference and `rmmod` reverts the live patches. `TRAPVEC_KPROBE_PIN_MODULE=/path/trapvec.ko`
//! tests that module instead of the tree's (how the module without the pin was shown to fail).

use vmtest::testing::{can_boot, can_boot_kernel, tvraw, Scenario};

#[test]
fn a_kprobe_on_a_live_patch_refuses_unload_naming_the_site_until_it_is_removed() {
    if !can_boot("kernel scenario") {
        return;
    }
    kprobe_pin(Scenario::named("kernel_kprobe_pin.sh"));
}

/// The same on Debian 13's kernel, at tcp_sync_mss+0x9 (past endbr64 and the ftrace site).
/// There `can_probe()` refuses a kprobe on an `int n` instruction, so no kprobe can land on a
/// live trap: the scenario shows that and pins the module with a kprobe on a jmp splice.
#[test]
fn a_kprobe_on_a_live_patch_pins_the_module_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    kprobe_pin(Scenario::named("kernel_kprobe_pin.sh").kernel("6.12"));
}

/// The kernel lets a kprobe onto the live trap (6.1) or refuses it (6.12, and so the first test
/// under `TRAPVEC_GUEST_KERNEL=6.12`), in which case the probe goes onto a jmp splice of the
/// same point.
fn kprobe_pin(scenario: Scenario) {
    let dir = tempfile::tempdir().unwrap();
    let scenario = scenario
        .file(tvraw(dir.path()))
        .timeout(600)
        .module_under_test("TRAPVEC_KPROBE_PIN_MODULE", "tv_kprobe_pin");
    let run = scenario.run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert!(
        run.stdout.contains("KPROBE_PIN_DONE"),
        "the scenario ran to its end"
    );
    assert_eq!(run.expect("BLACKLIST_KNOB"), "N");
    let on_trap = run.expect("KPROBE_ON_TRAP");
    if run.expect("KERNEL").starts_with("6.1.") {
        assert_eq!(on_trap, "accepted", "a kprobe lands on the live trap");
    } else {
        assert!(
            on_trap.starts_with("refused: "),
            "the kernel refuses a kprobe on `int 0xf5`: {on_trap}"
        );
    }
    assert_eq!(
        run.number("PROBES"),
        1,
        "the kprobe registered on the live trap"
    );
    assert_eq!(run.number("REFCNT_BEFORE"), 0);

    assert_eq!(
        run.number("REFCNT_PINNED"),
        1,
        "the module holds itself while the probe exists"
    );
    // The first instruction past the entry (tcp_sync_mss+5 on 6.1, +9 on 6.12), as the
    // kernel's %pS names it.
    let at: u64 = run
        .expect("MSS_SITE")
        .strip_prefix("tcp_sync_mss+")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("MSS_SITE={}", run.expect("MSS_SITE")));
    let site = format!("tcp_sync_mss+{at:#x}");
    let pin = run.expect("PIN_LINE");
    assert!(
        pin.contains(&format!("kprobe at {site}/"))
            && pin.contains(&format!("armed on the live patch at {site}/")),
        "dmesg names the probe and the site: {pin}"
    );
    assert!(
        pin.contains("handler kprobe_dispatcher"),
        "dmesg names the probe's handler: {pin}"
    );
    assert!(
        run.expect("TOUCH").starts_with("ret=0 "),
        "the APPLY that found the probe was made"
    );
    assert!(
        run.expect("QUIESCE").starts_with("ret=0 "),
        "QUIESCE was made"
    );
    assert_eq!(
        run.number("PIN_LINES"),
        2,
        "APPLY found the probe, and QUIESCE named it again"
    );
    assert_ne!(run.number("RMMOD_PINNED_STATUS"), 0, "rmmod refused");
    assert_eq!(
        run.number("LOADED_PINNED"),
        1,
        "still loaded: {}",
        run.expect("RMMOD_PINNED_ERR")
    );

    assert_eq!(
        run.number("REFCNT_AFTER"),
        0,
        "the reference dropped once the probe went"
    );
    assert!(
        run.value("UNPIN_LINE").is_some(),
        "dmesg says unload is allowed again"
    );
    assert_eq!(run.number("RMMOD_AFTER_STATUS"), 0, "rmmod succeeded");
    assert_eq!(run.number("LOADED_AFTER"), 0);
    assert!(
        run.expect("REVERT_LINE")
            .contains("reverted 2 live patches"),
        "unload reverted the splice and the identity patch"
    );
}
