//! The operations over the fake kernel: declared splices go live with their component whoever
//! loads it, and every operation leaves nothing half applied (splices, variables, components).

use std::path::Path;

use component_manager::LoadOptions;
use trapvec::fake::{func_addr, knob_component, FakeKernel};

use super::*;
use crate::plan::Mechanism;
use crate::spec::{ComponentSpec, SetSpec, Spec};
use crate::splice::{Action, SpliceRequest};

fn count(at: &str) -> SpliceRequest {
    SpliceRequest::new(at, Action::Count, Mechanism::Trap)
}

fn set(symbol: &str, value: u64, size: Option<usize>) -> SetSpec {
    SetSpec {
        symbol: symbol.into(),
        value,
        size,
    }
}

fn knob_spec(dir: &Path) -> Spec {
    Spec {
        components: vec![ComponentSpec {
            path: knob_component(dir),
            crc32: None,
        }],
        ..Spec::default()
    }
}

fn knob(sp: &Splicer<FakeKernel>) -> u64 {
    sp.get_var("knob", 2).unwrap()
}

#[test]
fn values_fit_their_size_signed_or_unsigned() {
    assert_eq!(parse_value("1400", 4).unwrap(), 1400);
    assert_eq!(parse_value("0x578", 4).unwrap(), 1400);
    assert_eq!(parse_value("-1", 1).unwrap(), 0xff);
    assert_eq!(parse_value("-128", 1).unwrap(), 0x80);
    assert_eq!(parse_value("255", 1).unwrap(), 255);
    assert_eq!(parse_value("-1", 8).unwrap(), u64::MAX);
    assert_eq!(parse_value("18446744073709551615", 8).unwrap(), u64::MAX);
    for (bad, size) in [
        ("256", 1),
        ("-129", 1),
        ("0x1_0000_0000", 4),
        ("4294967296", 4),
        ("twelve", 8),
        ("", 8),
    ] {
        let e = parse_value(bad, size).unwrap_err().to_string();
        assert!(
            e.contains(&format!("`{bad}`")),
            "{bad} in {size} bytes: {e}"
        );
    }
}

#[test]
fn values_cross_the_socket_as_numbers_or_text() {
    assert_eq!(
        serde_json::from_str::<Value>("1400").unwrap(),
        Value::Number(1400)
    );
    assert_eq!(
        serde_json::from_str::<Value>("\"-1\"").unwrap(),
        Value::Text("-1".into())
    );
    assert!(serde_json::from_str::<Value>("-1").is_err());
}

#[test]
fn refusals_name_what_is_there() {
    let e = OpError::NoSplice {
        at: "f".into(),
        live: vec!["g (0x10)".into()],
    };
    assert_eq!(e.to_string(), "no splice at `f` (live: g (0x10))");
    let e = OpError::NoComponent {
        name: "c".into(),
        loaded: vec![],
    };
    assert_eq!(e.to_string(), "no component named `c` is loaded (none is)");
    let e = OpError::InUse {
        name: "c".into(),
        users: vec!["f".into(), "g".into()],
    };
    assert_eq!(
        e.to_string(),
        "component `c` is used by the splice(s) at f, g: unsplice them first"
    );
}

#[test]
fn components_go_near_the_kernel_text_or_the_program() {
    // The fake kernel has no `_stext` or `main`: its first function stands for its text.
    assert_eq!(near(&FakeKernel::new()), func_addr("f0"));
}

#[test]
fn a_spec_makes_its_splices_and_those_its_components_declare_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let mut spec = knob_spec(dir.path());
    spec.splices = vec![count("f1")];
    // No size: the variable's own (2 bytes), the value fitted as a signed number.
    spec.sets = vec![set("knob", u64::MAX, None)];
    let batches = k.state().batches;
    let (report, made) = apply(&mut sp, &spec, false).unwrap();
    assert_eq!(k.state().batches, batches + 1, "one text batch");
    let ats: Vec<&str> = report.spliced.iter().map(|r| r.at.as_str()).collect();
    assert_eq!(
        ats,
        ["f1", "f3"],
        "the spec's splice, then the one its component declares"
    );
    assert_eq!(report.requested, 1);
    assert!(k.trapped("f1") && k.trapped("f3"));
    assert_eq!(knob(&sp), 0xffff);
    assert_eq!(
        made.vars,
        [Written {
            symbol: "knob".into(),
            before: 7,
            size: 2
        }]
    );
    undo(&mut sp, &made).unwrap();
    assert!(k.pristine());
    assert_eq!(sp.components().iter().count(), 0);
}

#[test]
fn a_refused_variable_undoes_the_whole_spec_and_restores_the_variables_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    // The component is there before the spec: its variable must get its old value back.
    let (loaded, _) = load(
        &mut sp,
        &knob_component(dir.path()),
        &LoadOptions::default(),
    )
    .unwrap();
    assert_eq!(loaded.spliced.len(), 1, "declared splice made by load");
    let spec = Spec {
        splices: vec![count("f1")],
        sets: vec![set("knob", 5, None), set("no_such_var", 1, Some(4))],
        ..Spec::default()
    };
    let e = apply(&mut sp, &spec, false).unwrap_err();
    assert!(e.to_string().contains("no_such_var"), "{e}");
    assert_eq!(
        knob(&sp),
        7,
        "the variable written before the refusal has its old value"
    );
    assert!(
        !k.trapped("f1") && k.trapped("f3"),
        "the spec's splice is gone, the component's stays"
    );
    // A value that does not fit the variable is refused before anything is written.
    let spec = Spec {
        sets: vec![set("knob", 70_000, None)],
        ..Spec::default()
    };
    let e = apply(&mut sp, &spec, false).unwrap_err().to_string();
    assert!(e.contains("`70000` does not fit in 2 byte(s)"), "{e}");
    let e = apply(
        &mut sp,
        &Spec {
            sets: vec![set("knob", 1, Some(4))],
            ..Spec::default()
        },
        false,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(e, "`knob` is 2 bytes long; size 4 would write past it");
    assert_eq!(knob(&sp), 7);
}

#[test]
fn a_component_whose_declared_splice_is_refused_is_not_left_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    // f3 taken: the declared splice cannot be made.
    splice(&mut sp, &count("f3")).unwrap();
    let path = knob_component(dir.path());
    let e = load(&mut sp, &path, &LoadOptions::default()).unwrap_err();
    assert!(matches!(e, OpError::Declared { .. }), "{e}");
    assert_eq!(sp.components().iter().count(), 0);
    // The same through a spec: the batch with the declared splice is refused, nothing stays.
    let e = apply(&mut sp, &knob_spec(dir.path()), false).unwrap_err();
    assert!(e.to_string().contains("f3"), "{e}");
    assert_eq!(sp.components().iter().count(), 0);
    unsplice_all(&mut sp).unwrap();
    assert!(k.pristine());
}

#[test]
fn a_switch_loads_what_it_needs_and_undoes_it_when_its_batch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let first = Spec {
        splices: vec![count("f0"), count("f1")],
        ..Spec::default()
    };
    assert_eq!(
        switch(&mut sp, &[], &first).unwrap(),
        Switched {
            removed: 0,
            added: 2,
            in_place: 0,
            handed_over: 0,
            removed_hits: 0
        }
    );
    // To a configuration with a component (declaring f3), a variable and a bad point.
    let mut bad = knob_spec(dir.path());
    bad.splices = vec![count("f1"), count("no_such_function")];
    bad.sets = vec![set("knob", 9, None)];
    let e = switch(&mut sp, &first.splices, &bad).unwrap_err();
    assert!(e.to_string().contains("no_such_function"), "{e}");
    assert_eq!(
        sp.components().iter().count(),
        0,
        "the component loaded for the switch is gone"
    );
    assert!(
        k.trapped("f0") && k.trapped("f1") && !k.trapped("f3"),
        "the old splices stay live"
    );
    // Without the bad point: f0 goes, f1 stays, f3 comes with its component.
    bad.splices.pop();
    assert_eq!(
        switch(&mut sp, &first.splices, &bad).unwrap(),
        Switched {
            removed: 1,
            added: 1,
            in_place: 0,
            handed_over: 0,
            removed_hits: 0
        }
    );
    assert!(!k.trapped("f0") && k.trapped("f1") && k.trapped("f3"));
    assert_eq!(knob(&sp), 9);
    // Unloading the component takes its declared splice; the rest is the spec's.
    let name = sp.components().iter().next().unwrap().name.clone();
    assert_eq!(
        unload(&mut sp, &name).unwrap(),
        Unloaded {
            name: "knob".into(),
            declared_removed: 1
        }
    );
    unsplice_all(&mut sp).unwrap();
    assert!(k.pristine());
}

/// Two configurations that splice one site differently. Trap to trap, the site keeps its trap
/// and its dispatch entry is replaced inside the switch's batch. Trap to jmp, the old splice is
/// taken out by a batch of its own, then the switch runs; a refused switch makes the old splice
/// again.
#[test]
fn a_switch_hands_a_site_over_to_another_splice_and_puts_it_back_when_refused() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let site = func_addr("f0") + 5;
    let first = Spec {
        splices: vec![count("f0"), count("f1")],
        ..Spec::default()
    };
    switch(&mut sp, &[], &first).unwrap();
    let old_bytes = k.text(site, 2);
    let mut only = count("f0");
    only.options.only.tgid = Some(42);
    let second = Spec {
        splices: vec![only.clone(), count("f1"), count("f2")],
        ..Spec::default()
    };
    let batches = k.state().batches;
    k.state().hits.insert(site, 4);
    assert_eq!(
        switch(&mut sp, &first.splices, &second).unwrap(),
        Switched {
            removed: 1,
            added: 2,
            in_place: 1,
            handed_over: 0,
            removed_hits: 4
        }
    );
    assert_eq!(
        k.state().batches,
        batches + 1,
        "the switch's batch only (f2's trap)"
    );
    assert_eq!(k.state().replaced, 1, "f0's entry replaced");
    assert!(k.trapped("f0") && k.trapped("f1") && k.trapped("f2"));
    assert_eq!(
        k.state().dispatch[&site].only.map(|o| o.tgid),
        Some(Some(42))
    );
    assert_eq!(sp.live().count(), 3);
    // Trap to trap again, refused by a point that does not plan (inside `mov rbp,rsp`):
    // nothing changed, f0 keeps the tgid 42 entry.
    let mut other = count("f0");
    other.options.only.tgid = Some(43);
    let e = switch(
        &mut sp,
        &second.splices,
        &Spec {
            splices: vec![other, count("f1"), count("f3+0x7")],
            ..Spec::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("f3+0x7"), "{e}");
    let state = k.state();
    assert_eq!(
        (state.batches, state.replaced),
        (batches + 1, 1),
        "nothing written, nothing replaced"
    );
    drop(state);
    assert_eq!(
        k.state().dispatch[&site].only.map(|o| o.tgid),
        Some(Some(42))
    );
    let batches = k.state().batches;

    // Handing f0 over again, to a jmp, in a switch refused for another point: f0 is the tgid
    // 42 count again, with the same bytes at its site; nothing else changed.
    let mut jmp = count("f0");
    jmp.mechanism = Mechanism::Jmp;
    let bad = Spec {
        splices: vec![jmp.clone(), count("f1"), count("no_such_function")],
        ..Spec::default()
    };
    let e = switch(&mut sp, &second.splices, &bad).unwrap_err();
    assert!(e.to_string().contains("no_such_function"), "{e}");
    assert_eq!(
        k.state().batches,
        batches,
        "nothing written: the point did not resolve"
    );
    // A point that resolves but cannot be spliced (inside `mov rbp,rsp`) is refused after the
    // handover's batch: f0's old splice is made again.
    let refused_late = Spec {
        splices: vec![jmp.clone(), count("f1"), count("f3+0x7")],
        ..Spec::default()
    };
    let before = k.text(site, 8);
    let e = switch(&mut sp, &second.splices, &refused_late).unwrap_err();
    assert!(e.to_string().contains("f3+0x7"), "{e}");
    assert_eq!(
        k.state().batches,
        batches + 2,
        "the handover's batch, and the one making f0 again"
    );
    assert_eq!(k.text(site, 8), before, "the old splice made again: {e}");
    assert_eq!(
        k.state().dispatch[&site].only.map(|o| o.tgid),
        Some(Some(42))
    );
    assert!(
        sp.live().any(|s| s.request == only),
        "f0's old request is live again"
    );
    assert!(k.trapped("f1") && k.trapped("f2") && !k.trapped("f3"));
    assert_eq!(sp.live().count(), 3);
    // The handover's own batch cannot finish (a thread stays inside): the splice it took out
    // is retiring (its text restored, its code kept), whose window cannot be spliced again
    // until that removal finishes. The error says both, and nothing else changed.
    k.state().quiesce_busy = Some("a task sleeps in the handler".into());
    let e = switch(&mut sp, &second.splices, &to_jmp_spec(&jmp)).unwrap_err();
    assert!(matches!(e, OpError::HandoverLost { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("a task sleeps in the handler")
            && text.contains(
                "the splice(s) at f0 that the switch had taken out could not be made again"
            ),
        "{text}"
    );
    k.state().quiesce_busy = None;
    assert_eq!(
        k.text(site, 8),
        FakeKernel::new().text(site, 8),
        "f0's original bytes"
    );
    assert_eq!((sp.retiring().count(), sp.live().count()), (1, 2));
    assert!(k.trapped("f1") && k.trapped("f2"));
    // Once the task has left, the removal finishes and f0 can be spliced again.
    let retiring: Vec<_> = sp.retiring().map(|s| s.id).collect();
    sp.finish_retiring(&retiring).unwrap();
    sp.apply(std::slice::from_ref(&only)).unwrap();
    assert_eq!(k.text(site, 8), before);
    // The same to a jmp, with nothing wrong: f0 goes from trap to jmp.
    let to_jmp = to_jmp_spec(&jmp);
    assert_eq!(
        switch(&mut sp, &second.splices, &to_jmp).unwrap(),
        Switched {
            removed: 2,
            added: 1,
            in_place: 0,
            handed_over: 1,
            removed_hits: 0
        }
    );
    assert!(
        !k.state().dispatch.contains_key(&site),
        "a jmp splice has no dispatch entry"
    );
    assert_ne!(k.text(site, 2), old_bytes);
    assert!(sp.live().any(|s| s.request == jmp));
    unsplice_all(&mut sp).unwrap();
    assert!(k.pristine());
}

fn to_jmp_spec(jmp: &SpliceRequest) -> Spec {
    Spec {
        splices: vec![jmp.clone(), count("f1")],
        ..Spec::default()
    }
}

/// A splice owned by a process that has exited (a child, reaped), and one by this process.
#[test]
fn orphans_are_the_splices_whose_owner_is_gone_and_only_they_are_removed() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let child_pid = child.id();
    // Its start time, read while it may still run; once reaped it is gone whatever it was.
    let start = std::fs::read_to_string(format!("/proc/{child_pid}/stat"))
        .ok()
        .and_then(|t| {
            let rest = t[t.rfind(')')? + 1..].to_string();
            rest.split_whitespace().nth(19)?.parse().ok()
        });
    child.wait().unwrap();
    let dead = crate::owner::Owner {
        pid: child_pid,
        start: start.unwrap_or(1),
        command: "trapctl time f0".into(),
    };
    let alive = crate::owner::Owner::current("trapctl count f1").unwrap();
    let owned = |at: &str, owner: crate::owner::Owner| SpliceRequest {
        options: crate::SpliceOptions {
            owner: Some(owner),
            ..Default::default()
        },
        ..count(at)
    };
    splice_batch(
        &mut sp,
        &[
            owned("f0", dead.clone()),
            owned("f1", alive.clone()),
            count("f2"),
        ],
    )
    .unwrap();

    let rows = listing(&sp).unwrap().splices;
    let flags: Vec<(&str, bool, Option<u32>)> = rows
        .iter()
        .map(|r| (r.at.as_str(), r.orphaned, r.owner.as_ref().map(|o| o.pid)))
        .collect();
    assert_eq!(
        flags,
        [
            ("f0", true, Some(child_pid)),
            ("f1", false, Some(alive.pid)),
            ("f2", false, None)
        ]
    );
    // The owner survives the saved state (the next trapctl lists it).
    let again = Splicer::import_state(k.clone(), &sp.export_state()).unwrap();
    assert_eq!(listing(&again).unwrap().splices[0].owner, Some(dead));

    let removed = unsplice_orphans(&mut sp).unwrap();
    assert_eq!(
        removed
            .unspliced
            .iter()
            .map(|u| u.at.as_str())
            .collect::<Vec<_>>(),
        ["f0"]
    );
    assert!(!k.trapped("f0") && k.trapped("f1") && k.trapped("f2"));
    assert!(
        unsplice_orphans(&mut sp).unwrap().unspliced.is_empty(),
        "nothing more is orphaned"
    );
}

#[test]
fn execute_runs_each_request_and_returns_what_a_change_made() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let path = knob_component(dir.path());
    let (reply, made) = execute(
        &mut sp,
        &Request::Load {
            path: path.clone(),
            name: None,
        },
    )
    .unwrap();
    let Reply::Load(loaded) = reply else {
        panic!("a load answered {reply:?}")
    };
    assert_eq!(loaded.spliced[0].at, "f3", "its declared splice went live");
    assert_eq!(made.components.len(), 1);
    assert_eq!(made.splices.len(), 1);

    let (reply, made) = execute(&mut sp, &Request::Splice(count("f1"))).unwrap();
    assert!(matches!(&reply, Reply::Splice(SpliceReply::Made(r)) if r.at == "f1"));
    assert_eq!(made.splices.len(), 1);
    assert!(k.trapped("f1"));

    let (reply, made) = execute(&mut sp, &Request::List).unwrap();
    let ListReply { listing, daemon } = ListReply::try_from(reply).unwrap();
    assert_eq!(listing.splices.len(), 2);
    assert!(daemon.is_none() && made.is_empty(), "a read makes nothing");

    let set = Request::Set {
        symbol: "knob".into(),
        value: Value::Text("9".into()),
        size: None,
    };
    let (reply, made) = execute(&mut sp, &set).unwrap();
    assert_eq!(Var::try_from(reply).unwrap().value, 9);
    assert_eq!(made.vars[0].before, 7, "the old value, for undo");

    let (reply, _) = execute(
        &mut sp,
        &Request::Unsplice {
            at: Some("f1".into()),
            all: false,
        },
    )
    .unwrap();
    assert!(matches!(reply, Reply::Unsplice(UnspliceReply::One(u)) if u.at == "f1"));
    assert!(!k.trapped("f1"));

    for daemons in [
        Request::Status,
        Request::Activate {
            profile: "p".into(),
        },
        Request::Require { module: "m".into() },
    ] {
        let e = execute(&mut sp, &daemons).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("`{}` is answered by trapd only", daemons.op())
        );
    }
}

#[test]
fn a_brief_apply_names_its_splices_by_id_point_and_site_only() {
    let dir = tempfile::tempdir().unwrap();
    let spec_path = dir.path().join("cover.json");
    std::fs::write(
        &spec_path,
        r#"{"splice": [{"at": "f1", "action": "count"}, {"at": "f2", "action": "count"}]}"#,
    )
    .unwrap();
    let wire = |brief: bool| {
        serde_json::from_value::<Request>(serde_json::json!({
            "op": "apply", "spec": spec_path, "best_effort": true, "brief": brief,
        }))
        .unwrap()
    };
    // The same spec on two fresh kernels, whole rows and brief.
    let whole = {
        let mut sp = Splicer::new(FakeKernel::new());
        let Reply::Apply(r) = execute(&mut sp, &wire(false)).unwrap().0 else {
            panic!("an apply answers Apply")
        };
        r
    };
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let (reply, made) = execute(&mut sp, &wire(true)).unwrap();
    let Reply::Apply(brief) = reply else {
        panic!("an apply answers Apply")
    };
    assert!(whole.placed.is_empty() && whole.spliced.len() == 2);
    assert!(brief.spliced.is_empty(), "no whole row: {brief:?}");
    let named: Vec<(u64, &str, &str)> = brief
        .placed
        .iter()
        .map(|p| (p.id, p.at.as_str(), p.site.as_str()))
        .collect();
    let rows: Vec<(u64, &str, &str)> = whole
        .spliced
        .iter()
        .map(|r| (r.id, r.at.as_str(), r.site.as_str()))
        .collect();
    assert_eq!(named, rows, "the same splices, ids and sites");
    assert_eq!(made.splices.len(), 2);
    assert!(k.trapped("f1") && k.trapped("f2"));
    // On the wire: `placed`, and no `spliced` row.
    let text = serde_json::to_string(&brief).unwrap();
    assert!(
        text.contains(r#""spliced":[]"#) && text.contains(r#""placed":[{"id":"#),
        "{text}"
    );
    // A trapd older than `brief` refuses the request whole, naming the field.
    let err = serde_json::from_value::<Request>(serde_json::json!({
        "op": "apply", "spec": "/s.json", "later": true,
    }))
    .unwrap_err();
    assert!(err.to_string().contains("unknown field `later`"), "{err}");
}
