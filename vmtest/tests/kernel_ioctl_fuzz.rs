//! The module's ioctl surface under random input (`vmtest/scenarios/kernel_ioctl_fuzz.sh`,
//! fuzzer `vmtest/helpers/ioctl_fuzz.c`): random and mutated requests to /dev/trapvec as root,
//! with a trap and a jmp splice live and their functions called all the while. No oops or
//! warning (vmtest fails the run on any), every refusal an errno the interface documents, the
//! module's counters back where they were, the live splices intact, and rmmod/insmod work.
//!
//! The run lasts 20 s of guest time; `TRAPVEC_FUZZ_SECONDS=600 cargo test --release -p vmtest
//! --test kernel_ioctl_fuzz` makes the long run (figures in the issue notes).

use vmtest::testing::{can_boot, Scenario};

#[test]
fn random_ioctls_with_splices_live_are_refused_with_errnos_and_leave_nothing_behind() {
    if !can_boot("kernel scenario") {
        return;
    }
    let seconds: u64 = std::env::var("TRAPVEC_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let run = Scenario::named("kernel_ioctl_fuzz.sh")
        .timeout(300 + 2 * seconds)
        .args(["--append".to_string(), format!("trapvec_fuzz_seconds={seconds}")])
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    assert_eq!(run.number("FUZZ_SECONDS"), seconds);
    assert_eq!(run.number("FUZZ_EXIT"), 0, "the fuzzer ran to its end");
    assert_eq!(run.number("FUZZ_LIVE_SITES"), 1, "it saw the trap splice's dispatch entry");
    let requests = run.number("FUZZ_REQUESTS");
    assert!(requests > 1000, "{requests} requests");
    assert!(run.number("FUZZ_OK") > 0, "some requests were valid");
    assert_eq!(run.number("FUZZ_ODD_COUNT"), 0, "every refusal is a documented errno:\n{}", run.stdout);
    assert_eq!(run.value("FUZZ_CLEANUP"), None, "the fuzzer undid what it made");
    for leak in ["FUZZ_LEAK_CODE", "FUZZ_LEAK_DATA", "FUZZ_LEAK_ENTRIES", "FUZZ_LEAK_PATCHES"] {
        assert_eq!(run.expect(leak), "0", "{leak}");
    }

    assert!(run.number("CONNECTIONS") > 0, "connections were opened while the fuzzer ran");
    assert_eq!(run.expect("MSS_SEEN").trim(), "32741");
    assert_eq!(run.number("LIST_EXIT"), 0, "trapctl reads its state back after the fuzzer");
    assert!(run.number("MSS_HITS") >= 5 * run.number("CONNECTIONS"), "the trap splice counted five calls per connection");
    assert_eq!(run.number("GETPPID_LISTED"), 1);
    assert_eq!(run.expect("UNSPLICED"), "yes");
    assert_eq!(run.expect("UNLOADED"), "yes");
    assert_eq!(run.expect("RESTORED"), "yes", "both functions byte for byte");
    assert_eq!(run.expect("RMMOD"), "yes");
    assert_eq!(run.expect("REINSMOD"), "yes");
    assert_eq!(run.expect("LIST_AFTER_RELOAD"), "yes");
}
