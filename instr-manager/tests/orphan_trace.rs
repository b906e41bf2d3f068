//! A kernel `trapctl trace` killed by SIGKILL leaves its component `trace_PID` and the call
//! splices on its handlers, none with an owner (issue 29): `unsplice --orphans`
//! ([`instr_manager::ops::unsplice_orphans`]) finds them once no process has that pid, removes
//! the splices and unloads the component; a live trace's and other components stay. Over the
//! fake kernel, with the fixture component `knob` (a handler `on_f`, a splice declared at f3).

use component_manager::LoadOptions;
use instr_manager::ops::{load, splice_batch, unsplice_orphans};
use instr_manager::plan::Mechanism;
use instr_manager::splice::{Action, SpliceRequest};
use instr_manager::splicer::Splicer;
use trapvec::fake::{knob_component, FakeKernel};

fn call(at: &str) -> SpliceRequest {
    SpliceRequest::new(
        at,
        Action::Call {
            handler: "on_f".into(),
            cookie: 0,
        },
        Mechanism::Trap,
    )
}

#[test]
fn a_dead_traces_component_and_its_splices_are_orphans_and_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let knob = knob_component(dir.path());
    // A pid no process has any more: a child that ran and was reaped (the killed trapctl).
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let traced = dir.path().join(format!("trace_{dead}.o"));
    std::fs::copy(&knob, &traced).unwrap();

    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    load(&mut sp, &traced, &LoadOptions::default()).unwrap();
    splice_batch(&mut sp, &[call("f0")]).unwrap();
    assert!(k.trapped("f0") && k.trapped("f3"));

    let removed = unsplice_orphans(&mut sp).unwrap();
    let mut at: Vec<&str> = removed.unspliced.iter().map(|u| u.at.as_str()).collect();
    at.sort_unstable();
    assert_eq!(at, ["f0", "f3"], "the probe and the splice it declares");
    assert_eq!(sp.components().iter().count(), 0, "trace_{dead} unloaded");
    assert!(k.pristine(), "nothing of the trace is left");
}

#[test]
fn a_live_traces_component_and_any_other_stay() {
    let dir = tempfile::tempdir().unwrap();
    let knob = knob_component(dir.path());
    // This process stands for the trapctl still tracing.
    let live = dir.path().join(format!("trace_{}.o", std::process::id()));
    std::fs::copy(&knob, &live).unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    load(&mut sp, &live, &LoadOptions::default()).unwrap();
    splice_batch(&mut sp, &[call("f0")]).unwrap();
    assert!(unsplice_orphans(&mut sp).unwrap().unspliced.is_empty());
    assert_eq!(sp.components().iter().count(), 1);
    assert!(k.trapped("f0") && k.trapped("f3"));
}
