//! Every refusal the planner makes over real objects' functions names its cause: every function
//! of this test process (libc, the dynamic linker, Rust's std, the test itself, and the
//! assembly fixtures `functions.S` and `bare.S` loaded as shared objects) planned at its entry
//! by trap and by jmp, as a `*` glob with `--best-effort` plans them. A refusal without a cause
//! would be grouped by its text (`ops::expand::summarize`), so a new refusal site that gives
//! none is caught here. Planning only: nothing is spliced.

use instr_manager::ops::expand::{expand, summarize, RefusedPoint};
use instr_manager::splicer::Splicer;
use instr_manager::{Action, Mechanism, SpliceRequest};
use trapvec::process::ProcessTarget;

#[allow(
    dead_code,
    reason = "the other test binaries use the rest of the helpers"
)]
mod common;

use common::{fixture_source, load_shared_object, serial};

#[test]
fn every_refusal_over_a_real_process_s_functions_has_a_cause() {
    let _one = serial();
    let dir = tempfile::tempdir().unwrap();
    load_shared_object(
        &fixture_source("functions.S"),
        &dir.path().join("libfns.so"),
    );
    load_shared_object(&fixture_source("bare.S"), &dir.path().join("libbare.so"));
    let sp = Splicer::new(ProcessTarget::new().unwrap());
    let all = SpliceRequest::new("*", Action::Count, Mechanism::Trap);
    let (points, globbed) = expand(&sp, &[all]).unwrap();
    assert!(globbed);
    assert!(
        points.len() >= 1000,
        "a real process has thousands of functions: {}",
        points.len()
    );
    for mechanism in [Mechanism::Trap, Mechanism::Jmp] {
        let requests: Vec<SpliceRequest> = points
            .iter()
            .map(|p| SpliceRequest {
                mechanism,
                ..p.clone()
            })
            .collect();
        let refused: Vec<RefusedPoint> = requests
            .iter()
            .zip(sp.plan_each(&requests))
            .filter_map(|(r, res)| res.err().map(|e| RefusedPoint::of(&r.at, &e)))
            .collect();
        let groups = summarize(&refused);
        for g in &groups {
            eprintln!("{mechanism}: {:<28} {g}", g.cause.as_deref().unwrap_or("-"));
        }
        let without: Vec<String> = groups
            .iter()
            .filter(|g| g.cause.is_none())
            .map(|g| g.to_string())
            .collect();
        assert!(
            without.is_empty(),
            "{mechanism}: refusals without a cause, grouped by their text: {without:#?}"
        );
        // The test sees refusals of several causes (short functions, blocks ending early,
        // instructions that cannot move), or it would prove nothing.
        assert!(
            refused.len() >= 10 && groups.len() >= 3,
            "{mechanism}: {} refusals in {} groups",
            refused.len(),
            groups.len()
        );
        let planned = requests.len() - refused.len();
        assert!(
            planned * 2 > requests.len(),
            "{mechanism}: most functions plan: {planned} of {}",
            requests.len()
        );
        eprintln!(
            "{mechanism}: {planned} of {} functions planned, {} refused for {} causes",
            requests.len(),
            refused.len(),
            groups.len()
        );
    }
}
