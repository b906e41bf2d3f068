//! `trapctl splice 'GLOB' --count` over more than a thousand functions of the running kernel
//! (`vmtest/scenarios/kernel_glob.sh`, issue 28): all or nothing by default; `--best-effort`
//! splices what validates, exits 3 and names every refusal reason with its count (text and
//! `--json`), one line per cause rather than per function; traffic hits the spliced functions;
//! `trapctl unsplice 'GLOB'` removes exactly the glob's splices. The guest's part takes about
//! 35 s under TCG.

use vmtest::testing::{can_boot, Scenario};

#[test]
fn a_glob_over_a_thousand_kernel_functions_splices_best_effort_and_unsplices_exactly_its_own() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("kernel_glob.sh")
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert!(
        run.stdout.contains("GLOB_DONE"),
        "the scenario ran to its end"
    );
    let functions = run.number("KALLSYMS");
    assert!(
        functions >= 1000,
        "the glob names >= 1,000 functions: {functions}"
    );

    // All or nothing: refused, the refusals named, nothing left but the bystander.
    assert_eq!(
        run.number("STRICT_STATUS"),
        1,
        "{}",
        run.expect("STRICT_ERR")
    );
    let strict = run.expect("STRICT_ERR");
    assert!(
        strict.contains("nothing was spliced") && strict.contains("splices refused"),
        "{strict}"
    );
    assert_eq!(run.number("STRICT_LEFT"), 0, "nothing spliced: {strict}");

    // --best-effort: exit 3, one row per splice, one line per reason, the counts add up.
    assert_eq!(run.number("BE_STATUS"), 3, "partly applied");
    let spliced = run.number("BE_SPLICED_ROWS");
    let refused = run.number("BE_REFUSED_SUM");
    assert!(spliced >= 900, "most of the glob spliced: {spliced}");
    let lines = run.number("BE_REFUSAL_LINES");
    assert!(refused > 0 && lines > 0);
    // One line per cause, not per function: a reason is its cause's fixed sentence, whatever
    // addresses, bytes, instruction or function its errors name (6.1: 85 refusals, 7 causes).
    assert!(
        lines <= 20 && lines * 4 <= refused,
        "{lines} reason lines for {refused} refusals"
    );
    assert_eq!(
        run.expect("BE_SUMMARY"),
        format!("spliced {spliced} of {} functions", spliced + refused)
    );
    assert!(spliced + refused >= 1000);
    let first = run.expect("BE_REFUSAL_FIRST");
    assert!(
        first.contains(" (at ") && first.contains(':'),
        "a reason and the first points refused for it: {first}"
    );
    assert_eq!(run.expect("BE_ERR_OTHER"), "", "stderr: only refusals");
    // vmlinux's init code, freed after boot, is its own cause (6.1: 65 functions, 39 of
    // them refused as invalid instructions before), never decoded from the freed memory.
    let init = run.number("INIT_FUNCS");
    assert!(
        init > 0,
        "the glob names __init functions: {}",
        run.expect("INIT_RANGE")
    );
    assert_eq!(
        run.number("BE_INIT_FREED"),
        init,
        "each refused as init code"
    );
    let invalid = run.value("BE_INVALID").unwrap_or_default().to_string();
    // A name several static functions share: each copy spliced by its address (6.1: 24 such
    // functions were refused as ambiguous before), none refused as ambiguous.
    assert_eq!(
        run.number("BE_AMBIGUOUS"),
        0,
        "no copy refused as ambiguous"
    );
    let copies = run.number("KALLSYMS_COPIES");
    let copy_rows = run.number("BE_COPY_ROWS");
    assert!(
        copies > 0 && copy_rows > 0 && copy_rows <= copies,
        "{copy_rows} copies spliced by address of {copies}: {}",
        run.expect("BE_COPY_ROW")
    );
    assert_eq!(run.number("LIVE"), spliced, "the listing has every splice");

    // Traffic through the spliced network stack.
    let hit: Vec<(&str, u64)> = [
        "tcp_v4_connect",
        "tcp_connect",
        "ip_queue_xmit",
        "tcp_v4_rcv",
        "ip_rcv",
        "ip_local_deliver",
        "tcp_sendmsg",
    ]
    .into_iter()
    .filter_map(|f| Some((f, run.value(&format!("HITS_{f}"))?.parse().ok()?)))
    .collect();
    assert!(hit.len() >= 3, "at least three of them spliced: {hit:?}");
    assert!(hit.iter().all(|(_, n)| *n > 0), "each was hit: {hit:?}");
    assert!(
        run.expect("BYSTANDER_ROW").contains("__x64_sys_getpid"),
        "the splice outside the glob is listed"
    );

    // unsplice GLOB: exactly the glob's splices.
    assert_eq!(run.number("UN_ROWS"), spliced);
    assert_eq!(
        run.expect("UN_SUMMARY"),
        format!("unspliced {spliced} splice(s) matching [iut][cdp]*")
    );
    assert_eq!(run.number("AFTER_UNSPLICE"), 0, "none of the glob's left");
    assert_eq!(run.number("AFTER_BYSTANDER"), 1, "the bystander stays");

    // --json: the same batch, the refusals in the object.
    assert_eq!(run.number("JSON_STATUS"), 3);
    assert_eq!(run.number("JSON_SCHEMA"), 1, "\"schema\": 1 at the top");
    assert_eq!(run.number("JSON_REQUESTED"), spliced + refused);
    assert_eq!(run.number("JSON_SPLICED"), spliced);
    assert_eq!(run.number("JSON_REFUSED"), refused, "each refusal named");
    assert_eq!(
        run.number("JSON_REASONS"),
        run.number("BE_REFUSAL_LINES"),
        "one group per reason, as the text"
    );
    assert_eq!(
        run.number("JSON_CAUSES"),
        run.number("JSON_REASONS"),
        "every group has its cause: no refusal fell back to its text"
    );
    assert_eq!(run.number("JSON_INIT_FREED"), 1, "init_freed, one group");
    assert_eq!(run.number("UN_JSON_ROWS"), spliced);
    assert_eq!(run.number("FINAL_LEFT"), 0);
    eprintln!(
        "glob over {} functions: {spliced} spliced, {refused} refused ({lines} causes: {init} init code, {} invalid instruction); {copy_rows} of {copies} copies of shared names spliced by address; in {} s under TCG",
        spliced + refused,
        if invalid.is_empty() { "0" } else { &invalid },
        run.number("BE_SECONDS")
    );
    for r in run.stdout.lines().filter(|l| l.starts_with("REASON: ")) {
        eprintln!("  {r}");
    }
}
