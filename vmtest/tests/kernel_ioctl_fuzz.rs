//! The module's ioctl surface under random input (`vmtest/scenarios/kernel_ioctl_fuzz.sh`,
//! fuzzer `vmtest/helpers/ioctl_fuzz.c`): random and mutated requests to /dev/trapvec as root,
//! with a trap and a jmp splice live and their functions called all the while. No oops or
//! warning (vmtest fails the run on any), every refusal an errno the interface documents, the
//! module's counters back where they were, the live splices intact, and rmmod/insmod work. No
//! leak: the module's count of its own allocations (kmod/mem.c) is up while the splices are
//! live, back at its baseline once they and the fuzzer's leftovers are gone, and at zero after
//! rmmod, as its last line in dmesg says.
//!
//! The run lasts 20 s of guest time; `TRAPVEC_FUZZ_SECONDS=600 cargo test --release -p vmtest
//! --test kernel_ioctl_fuzz` makes the long run (figures in the issue notes).

use std::collections::BTreeMap;

use vmtest::testing::{can_boot, tvraw, Run, Scenario};

/// An `ALLOC_*` line: the module's allocations as `kind -> (objects, bytes)`.
fn allocations(run: &Run, key: &str) -> BTreeMap<String, (i64, i64)> {
    let mut kinds = BTreeMap::new();
    for line in run.expect(key).split(',').filter(|l| !l.trim().is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words.len(),
            3,
            "{key}: `{line}` is not `kind objects bytes`"
        );
        let n = |w: &str| {
            w.parse::<i64>()
                .unwrap_or_else(|e| panic!("{key}: `{line}`: {e}"))
        };
        kinds.insert(words[0].to_string(), (n(words[1]), n(words[2])));
    }
    for kind in [
        "entry", "block", "patch", "alias", "pending", "state", "reserved", "scratch",
    ] {
        assert!(kinds.contains_key(kind), "{key} has no `{kind}`: {kinds:?}");
    }
    kinds
}

#[test]
fn random_ioctls_with_splices_live_are_refused_with_errnos_and_leave_nothing_behind() {
    if !can_boot("kernel scenario") {
        return;
    }
    let seconds: u64 = std::env::var("TRAPVEC_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = Scenario::named("kernel_ioctl_fuzz.sh")
        .file(tvraw(dir.path()))
        .timeout(300 + 2 * seconds)
        .args([
            "--append".to_string(),
            format!("trapvec_fuzz_seconds={seconds}"),
        ])
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    assert_eq!(run.number("FUZZ_SECONDS"), seconds);
    assert_eq!(run.number("FUZZ_EXIT"), 0, "the fuzzer ran to its end");
    assert_eq!(
        run.number("FUZZ_LIVE_SITES"),
        1,
        "it saw the trap splice's dispatch entry"
    );
    let requests = run.number("FUZZ_REQUESTS");
    assert!(requests > 1000, "{requests} requests");
    assert!(run.number("FUZZ_OK") > 0, "some requests were valid");
    assert_eq!(
        run.number("FUZZ_ODD_COUNT"),
        0,
        "every refusal is a documented errno:\n{}",
        run.stdout
    );
    assert_eq!(
        run.value("FUZZ_CLEANUP"),
        None,
        "the fuzzer undid what it made"
    );
    assert!(
        run.number("FUZZ_KEYS_TAKEN") > 0,
        "keyed-count slots were taken (and given back: ENTRY allocations below)"
    );
    for leak in [
        "FUZZ_LEAK_CODE",
        "FUZZ_LEAK_DATA",
        "FUZZ_LEAK_ENTRIES",
        "FUZZ_LEAK_PATCHES",
    ] {
        assert_eq!(run.expect(leak), "0", "{leak}");
    }

    assert!(
        run.number("CONNECTIONS") > 0,
        "connections were opened while the fuzzer ran"
    );
    assert_eq!(run.expect("MSS_SEEN").trim(), "32741");
    assert_eq!(
        run.number("LIST_EXIT"),
        0,
        "trapctl reads its state back after the fuzzer"
    );
    assert!(
        run.number("MSS_HITS") >= 5 * run.number("CONNECTIONS"),
        "the trap splice counted five calls per connection"
    );
    assert_eq!(run.number("GETPPID_LISTED"), 1);
    assert_eq!(run.expect("UNSPLICED"), "yes");
    assert_eq!(run.expect("UNLOADED"), "yes");
    assert_eq!(
        run.expect("RESTORED"),
        "yes",
        "both functions byte for byte"
    );

    // No leak, and a test that can see one: the splices' dispatch entries, blocks and patch
    // records are counted while they live; what is left at the end is what was there at
    // insmod (aliases, the reserved table) and trapctl's state blob; none after rmmod.
    let base = allocations(&run, "ALLOC_BASE");
    let live = allocations(&run, "ALLOC_LIVE");
    let end = allocations(&run, "ALLOC_END");
    for kind in ["entry", "block", "patch", "pending", "state", "scratch"] {
        assert_eq!(
            base[kind],
            (0, 0),
            "nothing of kind {kind} right after insmod: {base:?}"
        );
    }
    // The reserved tables: one of jump labels, static calls and bugs (reserved.c's trapvec_rsv),
    // one of the sorted hidden branch targets (trapvec_hid).
    assert!(
        base["alias"].0 >= 2 && base["reserved"].0 == 2,
        "the IDT and arena aliases, the two reserved tables: {base:?}"
    );
    // A call splice's entry has a side record for its handler and cookie (kmod/dispatch_table.c;
    // a plain count's has none).
    assert_eq!(
        live["entry"].0, 3,
        "the trap splice's dispatch entry, its handler's side record and its per-CPU counters: {live:?}"
    );
    assert!(
        live["block"].0 >= 4,
        "code and data blocks of the component and both splices: {live:?}"
    );
    assert!(
        live["patch"].0 >= 3,
        "the trap's and the jmp's patch records and a blacklist entry: {live:?}"
    );
    assert_eq!(
        live["alias"],
        base["alias"],
        "a batch maps the pages it writes for itself and drops them after it: a live patch keeps no alias: {live:?}"
    );
    assert_eq!(live["state"].0, 1, "trapctl's state blob: {live:?}");
    assert!(
        run.expect("QUIESCE_AFTER").starts_with("ret=0 "),
        "{}",
        run.expect("QUIESCE_AFTER")
    );
    for kind in ["block", "patch", "pending", "scratch", "alias", "reserved"] {
        assert_eq!(
            end[kind], base[kind],
            "kind {kind} back at its baseline after unsplice, unload and QUIESCE: {end:?}"
        );
    }
    // A return-point slot keeps its per-CPU counters from its first use until unload
    // (kmod/returns.c): one more ENTRY object for each slot the fuzzer ever took, none after rmmod.
    let slots = i64::try_from(run.number("FUZZ_RETURN_SLOTS_USED")).expect("a slot count");
    assert!(slots >= 1, "the fuzzer's FREE probe took a return slot");
    assert_eq!(
        end["entry"].0,
        base["entry"].0 + slots,
        "entries back at the baseline but for {slots} return slots' counters: {end:?}"
    );
    assert!(end["state"].0 <= 1, "at most trapctl's state blob: {end:?}");
    assert_eq!(run.expect("RMMOD"), "yes");
    assert_eq!(
        run.expect("UNLOAD_LINE"),
        "trapvec: unloaded, 0 allocations outstanding"
    );
    assert_eq!(run.expect("REINSMOD"), "yes");
    assert_eq!(run.expect("LIST_AFTER_RELOAD"), "yes");
}
