//! `trapctl points` in the running kernel (`vmtest/scenarios/kernel_points.sh`, issue 28 item 1):
//! a glob lists exactly the kallsyms functions it names; the verdicts agree with what `trapctl
//! splice` then does, for trap and jmp, on a sample of rows each way; a noinstr function is
//! refused as such; `--blocks` lists a function's basic blocks; listing changes nothing.

use vmtest::testing::{can_boot, Scenario};

#[test]
fn points_lists_a_globs_functions_and_its_verdicts_are_what_splice_does() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("kernel_points.sh")
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert!(
        run.stdout.contains("POINTS_DONE"),
        "the scenario ran to its end"
    );

    // One row per tcp_* text address of kallsyms (vmlinux and loaded modules).
    let rows = run.number("TCP_ROWS");
    assert!(rows > 300, "tcp_* has hundreds of functions: {rows}");
    assert_eq!(rows, run.number("TCP_KALLSYMS"));
    let summary = run.expect("TCP_SUMMARY");
    assert!(
        summary.starts_with(&format!(
            "kernel: {rows} function(s), {rows} site(s): trap possible at "
        )),
        "{summary}"
    );
    // tcp_sync_mss takes both (the demo splices it).
    let mss: Vec<&str> = run.expect("MSS_ROW").split_whitespace().collect();
    assert_eq!(mss.get(2..4), Some(&["yes", "yes"][..]), "{mss:?}");
    let noinstr = run.expect("NOINSTR_ROW");
    assert!(
        noinstr.contains(" no ") && noinstr.contains("noinstr"),
        "exc_int3 is noinstr text: {noinstr}"
    );
    assert!(
        run.number("MSS_BLOCK_SITES") > 3,
        "tcp_sync_mss has several blocks"
    );
    assert_eq!(
        run.number("ENTRIES_AFTER_LISTING"),
        0,
        "listing spliced nothing"
    );

    // The oracle: every sampled verdict is what splicing then does.
    for mech in ["trap", "jmp"] {
        assert_eq!(
            run.number(&format!("ORACLE_{mech}_DISAGREE")),
            0,
            "{}",
            run.stdout
                .lines()
                .filter(|l| l.starts_with("ORACLE_DISAGREES="))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            run.number(&format!("ORACLE_{mech}_AGREE")) >= 12,
            "{mech}: both ways sampled"
        );
    }
    let all = run.expect("ALL_SUMMARY");
    let functions: u64 = all
        .strip_prefix("kernel: ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{all}"));
    assert!(functions > 30_000, "the whole kernel: {all}");
    assert!(
        run.number("ALL_REFUSALS") >= 2,
        "refusals are grouped by kind"
    );
    eprintln!(
        "trapctl points over the whole kernel: {} s under TCG; {all}",
        run.number("ALL_SECONDS")
    );
}
