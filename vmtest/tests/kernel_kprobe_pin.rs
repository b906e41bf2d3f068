//! A kprobe armed on a live patch pins trapvec.ko (`vmtest/scenarios/kernel_kprobe_pin.sh`,
//! issue 24 item 6). The race that lets a kprobe in (register_kprobe() reads the blacklist
//! before it takes kprobe_mutex) is replaced by the module's test knob `kprobe_blacklist=0`;
//! everything after it is the real path: the next APPLY finds the probe with get_kprobe(),
//! dmesg names the site and the probe, `rmmod` is refused while the probe exists (the arena
//! its copied trap runs would be freed), and once the probe is gone the module drops its own
//! reference and `rmmod` reverts the live patches. `TRAPVEC_KPROBE_PIN_MODULE=/path/trapvec.ko`
//! tests that module instead of the tree's (how the module without the pin was shown to fail).

use vmtest::testing::{can_boot, tvraw, Scenario};

#[test]
fn a_kprobe_on_a_live_patch_refuses_unload_naming_the_site_until_it_is_removed() {
    if !can_boot("kernel scenario") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::named("kernel_kprobe_pin.sh")
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
    let pin = run.expect("PIN_LINE");
    assert!(
        pin.contains("kprobe at tcp_sync_mss+0x5/")
            && pin.contains("armed on the live patch at tcp_sync_mss+0x5/"),
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
