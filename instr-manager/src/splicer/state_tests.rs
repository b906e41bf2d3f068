//! The saved state against the fake kernel: a round trip, a restored splicer removing what the
//! first made, retiring splices, and every check a restore makes against the target.

use super::*;

#[test]
fn state_round_trips_and_the_restored_splicer_removes_what_the_first_made() {
    let k = FakeKernel::new();
    let mut first = Splicer::new(k.clone());
    let ids = first
        .apply(&[count("f0", Mechanism::Trap), count("f2", Mechanism::Jmp)])
        .unwrap();
    let state = first.export_state();
    let json: serde_json::Value = serde_json::from_slice(&state).unwrap();
    assert_eq!(json["version"], crate::splicer::state::STATE_VERSION);
    assert_eq!(json["splices"].as_array().unwrap().len(), 2);
    // A count splice is saved compact: an array, the point as written second (`null`: the
    // function's name, fourth: the only splice of its function, so inline, not in a table).
    assert_eq!(json["splices"][0][1], serde_json::Value::Null);
    assert_eq!(json["splices"][0][3][0], "f0");
    assert!(json.get("functions").is_none(), "{json}");
    drop(first);

    let mut second = Splicer::import_state(k.clone(), &state).unwrap();
    assert_eq!(second.live().map(|s| s.id).collect::<Vec<_>>(), ids);
    assert_eq!(
        second.export_state(),
        state,
        "export after import is the same state"
    );
    let more = second.apply(&[count("f3", Mechanism::Trap)]).unwrap();
    assert!(more[0] > ids[1], "splice ids are not reused");
    second.remove_all().unwrap();
    for f in FUNCS {
        assert_eq!(k.text(func_addr(f), 32), FUNC, "{f} restored");
    }
    assert_eq!(k.live_blocks(), 0);
    assert!(k.state().dispatch.is_empty());
}

#[test]
fn removal_that_cannot_reach_quiescence_leaves_the_splice_retiring_and_a_later_one_finishes_it() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let ids = sp
        .apply(&[count("f1", Mechanism::Trap), count("f2", Mechanism::Jmp)])
        .unwrap();
    k.state().quiesce_busy = Some("a task is still inside".into());
    let err = sp.remove(&ids).unwrap_err();
    assert!(
        matches!(&err, SpliceError::Retiring { at, .. } if at == "f1, f2"),
        "{err}"
    );
    assert!(
        err.to_string().contains("a task is still inside")
            && err
                .to_string()
                .contains("run the unsplice (or unload) again"),
        "{err}"
    );
    // The text is restored at once; the dispatch entries are gone; the blocks are kept.
    assert_eq!(k.text(func_addr("f1"), 32), FUNC);
    assert_eq!(k.text(func_addr("f2"), 32), FUNC);
    assert!(k.state().dispatch.is_empty());
    assert!(k.live_blocks() > 0);
    assert_eq!(sp.live().count(), 0);
    assert_eq!(sp.retiring().map(|s| s.id).collect::<Vec<_>>(), ids);
    // The state says so, and a later command takes it over and finishes it.
    let state = sp.export_state();
    drop(sp);
    let mut later = Splicer::import_state(k.clone(), &state).unwrap();
    assert_eq!(later.find_retiring("f1"), Some(ids[0]));
    assert_eq!(
        later.find_retiring(&format!("{:#x}", func_addr("f2") + 5)),
        Some(ids[1])
    );
    assert!(
        later.finish_retiring(&ids).is_err(),
        "still busy: still retiring"
    );
    assert_eq!(later.retiring().count(), 2);
    k.state().quiesce_busy = None;
    later.finish_retiring(&ids).unwrap();
    assert_eq!(later.retiring().count(), 0);
    assert!(k.pristine(), "every block freed");
}

#[test]
fn retiring_splice_whose_site_changed_again_is_refused_in_the_state() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let ids = sp.apply(&[count("f1", Mechanism::Trap)]).unwrap();
    k.state().quiesce_busy = Some("busy".into());
    sp.remove(&ids).unwrap_err();
    let state = sp.export_state();
    let site = func_addr("f1") + 5;
    k.state().memory.insert(site, 0xCD);
    let err = Splicer::import_state(k, &state).err().unwrap();
    assert!(
        matches!(&err, StateError::RetiringTextDiffers { at, addr, .. } if at == "f1" && *addr == site),
        "{err}"
    );
}

#[test]
fn empty_state_is_a_fresh_splicer() {
    let sp = Splicer::import_state(FakeKernel::new(), b"").unwrap();
    assert_eq!(sp.live().count(), 0);
}

#[test]
fn state_whose_site_bytes_changed_is_refused_naming_the_splice() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f1", Mechanism::Trap)]).unwrap();
    let state = sp.export_state();
    // Someone else restored the text behind our back.
    let site = func_addr("f1") + 5;
    k.state().memory.insert(site, 0x55);
    k.state().memory.insert(site + 1, 0x48);
    let err = Splicer::import_state(k, &state).err().unwrap();
    assert!(
        matches!(&err, StateError::TextDiffers { at, addr, .. } if at == "f1" && *addr == site),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("holds 55 48, not the patched bytes cd f5"),
        "{err}"
    );
}

#[test]
fn state_whose_dispatch_entry_is_gone_or_different_is_refused() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f1", Mechanism::Trap)]).unwrap();
    let state = sp.export_state();
    let site = func_addr("f1") + 5;
    let entry = k.state().dispatch.remove(&site).unwrap();
    let err = Splicer::import_state(k.clone(), &state).err().unwrap();
    assert!(
        matches!(err, StateError::MissingDispatch { site: s, .. } if s == site),
        "{err}"
    );
    k.state().dispatch.insert(
        site,
        DispatchEntry {
            dest: entry.dest + 16,
            ..entry
        },
    );
    let err = Splicer::import_state(k, &state).err().unwrap();
    assert!(matches!(err, StateError::DispatchDiffers { .. }), "{err}");
}

#[test]
fn state_of_another_version_or_garbage_is_refused() {
    let k = FakeKernel::new();
    let sp = Splicer::new(k.clone());
    let mut json: serde_json::Value = serde_json::from_slice(&sp.export_state()).unwrap();
    json["version"] = 99.into();
    let err = Splicer::import_state(k.clone(), json.to_string().as_bytes())
        .err()
        .unwrap();
    assert!(matches!(err, StateError::Version { found: 99 }), "{err}");
    let err = Splicer::import_state(k, b"{not json").err().unwrap();
    assert!(matches!(err, StateError::Decode(_)), "{err}");
}

/// `json` as a state of version 4 would have spelled it (the key `pid` the thread, `tgid` the
/// process): the process's key as `tgid`, the thread's as `pid`, the version 4.
fn old_keys(json: &str) -> String {
    use crate::splicer::state::STATE_VERSION;
    json.replace(r#""by":"pid""#, r#""by":"tgid""#)
        .replace(r#""by":"tid""#, r#""by":"pid""#)
        .replacen(
            &format!(r#"{{"version":{STATE_VERSION},"#),
            r#"{"version":4,"#,
            1,
        )
}

#[test]
fn keys_saved_by_version_4_keep_their_meaning_and_are_written_anew_as_tid_and_pid() {
    use crate::splicer::state::STATE_VERSION;
    use trapvec::keyed::KeyBy;
    let k = FakeKernel::new();
    k.state().runtime_slots = true;
    let mut first = Splicer::new(k.clone());
    let keyed = |at: &str, by| {
        let mut r = count(at, Mechanism::Trap);
        r.options.by = Some(by);
        r
    };
    first
        .apply(&[
            keyed("f0", KeyBy::Tid),
            keyed("f1", KeyBy::Pid),
            keyed("f2", KeyBy::Cpu),
        ])
        .unwrap();
    let snapshot = first.snapshot_bytes(7);
    // Then one more in the log.
    first.apply(&[keyed("f3", KeyBy::Tid)]).unwrap();
    let whole: serde_json::Value = serde_json::from_slice(&first.snapshot_bytes(7)).unwrap();
    let f3 = whole["splices"].as_array().unwrap().last().unwrap().clone();
    let change =
        serde_json::json!({"add": [f3], "remove": [], "next_splice": whole["next_splice"]});
    let log_v4 = format!(
        "{{\"format\":\"trapvec-state-log\",\"version\":4,\"epoch\":7}}\n{}\n",
        old_keys(&change.to_string())
    );
    let snapshot_v4 = old_keys(std::str::from_utf8(&snapshot).unwrap());
    assert!(snapshot_v4.starts_with(r#"{"version":4,"#), "{snapshot_v4}");
    assert!(
        snapshot_v4.contains(r#""by":"tgid""#) && log_v4.contains(r#""by":"pid""#),
        "the process spelled `tgid`, the thread `pid`"
    );
    let expect = [
        ("f0", Some(KeyBy::Tid)),
        ("f1", Some(KeyBy::Pid)),
        ("f2", Some(KeyBy::Cpu)),
        ("f3", Some(KeyBy::Tid)),
    ];
    let keys = |sp: &Splicer<FakeKernel>| -> Vec<(String, Option<KeyBy>)> {
        sp.live()
            .map(|s| (s.request.at.clone(), s.request.options.by))
            .collect()
    };
    let want: Vec<(String, Option<KeyBy>)> =
        expect.iter().map(|(a, b)| (a.to_string(), *b)).collect();
    let (second, replay) =
        Splicer::import_state_with_log(k.clone(), snapshot_v4.as_bytes(), log_v4.as_bytes())
            .unwrap();
    assert_eq!(replay.changes, 1);
    assert_eq!(
        keys(&second),
        want,
        "an old `pid` is the thread (`tid`), an old `tgid` the process (`pid`)"
    );
    // Written anew: the current version (5 or later), the thread as `tid`, the process as `pid`;
    // read back the same.
    let again = second.export_state();
    let text = String::from_utf8(again.clone()).unwrap();
    assert!(text.starts_with(&format!(r#"{{"version":{STATE_VERSION},"#)));
    const { assert!(STATE_VERSION >= 5) };
    assert!(!text.contains("tgid"), "{text}");
    assert_eq!(text.matches(r#""by":"tid""#).count(), 2, "{text}");
    assert_eq!(text.matches(r#""by":"pid""#).count(), 1, "{text}");
    let third = Splicer::import_state(k.clone(), &again).unwrap();
    assert_eq!(
        keys(&third),
        want,
        "the current version's `pid` is the process"
    );
    // The current version's log reads `pid` as the process too.
    let log_v5 = format!(
        "{{\"format\":\"trapvec-state-log\",\"version\":{STATE_VERSION},\"epoch\":7}}\n{change}\n"
    );
    let (fourth, _) = Splicer::import_state_with_log(k, &snapshot, log_v5.as_bytes()).unwrap();
    assert_eq!(keys(&fourth), want);
}
