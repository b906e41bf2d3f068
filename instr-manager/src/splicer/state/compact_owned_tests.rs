//! Owned count splices (every site of `trapctl cover`) saved compact with the tables of owners
//! and functions (version 6): exact round trips, mixed states, change lines that carry their own
//! tables, a snapshot and log written by version 5, and what a coverage site costs.

use std::time::Instant;

use component_manager::LoadOptions;
use trapvec::fake::{func_addr, knob_component, FakeKernel};
use trapvec::{RepoBlock, TargetError, TargetInfo};

use super::super::{SavedState, STATE_VERSION};
use super::tests::{machine, state_json, whole_form};
use crate::owner::Owner;
use crate::plan::Mechanism;
use crate::splicer::state_log::{Saved, StateLog};
use crate::splicer::summary::DisplacedText;
use crate::splicer::{Action, LiveSplice, SpliceId, SpliceRequest, Splicer};

/// An owner as `trapctl cover` records it: its command cut to 160 bytes, with the note of the
/// length (`instr_manager::owner::COMMAND_MAX`).
fn cover_owner() -> Owner {
    let names: Vec<String> = (0..40).map(|i| format!("tcp_function_{i}")).collect();
    let command = format!("trapctl cover {}", names.join(" "));
    let mut cut = command[..160].to_string();
    cut.push_str(&format!("… ({} bytes)", command.len()));
    Owner {
        pid: 4242,
        start: 987_654,
        command: cut,
    }
}

fn other_owner() -> Owner {
    Owner {
        pid: 5151,
        start: 123,
        command: "trapctl count f3".into(),
    }
}

fn count(at: &str, mechanism: Mechanism, owner: Option<&Owner>) -> SpliceRequest {
    let mut r = SpliceRequest::new(at, Action::Count, mechanism);
    r.options.owner = owner.cloned();
    r
}

/// The point `trapctl cover` writes for a site: its address.
fn at_site(function: &str, offset: u64) -> String {
    format!("{:#x}", func_addr(function) + offset)
}

/// The snapshot kept "in the module": the fake kernel's blob.
fn put(k: &FakeKernel) -> impl FnOnce(&FakeKernel, &[u8]) -> Result<(), TargetError> + '_ {
    move |_, bytes| k.put_blob(k.blob().0, bytes).map(|_| ())
}

/// Each record of a state's `splices` (or a line's `add`): an array (compact) or not (whole).
fn arrays(records: &serde_json::Value) -> Vec<bool> {
    records
        .as_array()
        .unwrap()
        .iter()
        .map(serde_json::Value::is_array)
        .collect()
}

#[test]
fn owned_count_splices_by_trap_and_jmp_in_a_kernel_and_a_process_round_trip_exactly() {
    let (a, b) = (cover_owner(), other_owner());
    let kernel = FakeKernel::new();
    let process = FakeKernel::repository(TargetInfo::user("process"), Vec::new());
    for (what, k) in [("kernel", kernel), ("process", process)] {
        let mut sp = Splicer::new(k.clone());
        sp.apply(&[
            count("f0", Mechanism::Trap, Some(&a)),
            count("f1+0x5", Mechanism::Jmp, Some(&a)),
            count("f2", Mechanism::Trap, Some(&b)),
            count(&at_site("f2", 9), Mechanism::Trap, Some(&a)),
            count("f3", Mechanism::Jmp, Some(&b)),
        ])
        .unwrap();
        // The kernel's dispatcher counts a trap's hits (no data block); a process's trap and
        // every jmp count in a data block.
        let data: Vec<bool> = sp.live().map(|s| s.data.is_some()).collect();
        match what {
            "kernel" => assert_eq!(data, [false, true, false, false, true]),
            _ => assert_eq!(data, [true; 5]),
        }
        let state = sp.export_state();
        let v = state_json(&sp);
        assert_eq!(arrays(&v["splices"]), [true; 5], "{what}: {v}");
        assert_eq!(v["owners"], serde_json::json!([a, b]), "{what}");
        let text = String::from_utf8(state.clone()).unwrap();
        assert_eq!(text.matches(&a.command).count(), 1, "{what}: {text}");
        // f2's two splices share its table row; the others have theirs inline.
        assert_eq!(v["functions"].as_array().unwrap().len(), 1, "{what}");
        assert_eq!(v["functions"][0][0], "f2", "{what}");
        let function: Vec<&serde_json::Value> = (0..5).map(|i| &v["splices"][i][3]).collect();
        assert_eq!(function[2], 0, "{what}");
        assert_eq!(function[3], 0, "{what}");
        assert_eq!(function[4][0], "f3", "{what}");
        // The address point is left out (flag 8), as the function's name is.
        assert_eq!(v["splices"][3][1], serde_json::Value::Null, "{what}");
        let owner: Vec<&serde_json::Value> = (0..5).map(|i| &v["splices"][i][10]).collect();
        assert_eq!(owner, [0, 0, 1, 0, 1], "{what}: the owners' indexes");
        let again = Splicer::import_state(k.clone(), &state).unwrap();
        assert_eq!(whole_form(&again, 0), whole_form(&sp, 0), "{what}");
        let owners: Vec<Option<&Owner>> = again
            .live()
            .map(|s| s.request.options.owner.as_ref())
            .collect();
        assert_eq!(
            owners,
            [Some(&a), Some(&a), Some(&b), Some(&a), Some(&b)],
            "{what}"
        );
        assert_eq!(
            again.export_state(),
            state,
            "{what}: saved again, the same bytes"
        );
    }
}

#[test]
fn a_mixed_state_of_owned_unowned_and_whole_splices_and_a_component_loads_back_equal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let (a, b) = (cover_owner(), other_owner());
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = StateLog::load(&path, k.clone(), &[]).unwrap();
    // The component declares a call at f3: saved whole.
    crate::ops::load(
        &mut sp,
        &knob_component(dir.path()),
        &LoadOptions::default(),
    )
    .unwrap();
    let mut only = count("f0+0x9", Mechanism::Trap, Some(&b));
    only.options.only.pid = Some(4242);
    sp.apply(&[
        count("f0", Mechanism::Trap, Some(&a)),
        count("f1+0x5", Mechanism::Jmp, None),
        count(&at_site("f2", 9), Mechanism::Trap, Some(&a)),
        count("f2", Mechanism::Trap, Some(&b)),
        only,
    ])
    .unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let v: serde_json::Value = serde_json::from_slice(&k.blob().1).unwrap();
    let kinds: Vec<(String, bool)> = sp
        .live()
        .map(|s| s.request.at.clone())
        .zip(arrays(&v["splices"]))
        .collect();
    let address = at_site("f2", 9);
    let want = [
        ("f3", false),
        ("f0", true),
        ("f1+0x5", true),
        (address.as_str(), true),
        ("f2", true),
        ("f0+0x9", false),
    ];
    let want: Vec<(String, bool)> = want.iter().map(|(at, c)| (at.to_string(), *c)).collect();
    assert_eq!(
        kinds, want,
        "the call and the task predicate whole, the counts compact"
    );
    // Only the compact records' owners are in the table (the whole one keeps its own).
    assert_eq!(v["owners"], serde_json::json!([a, b]));
    let (again, _, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(
        (replay.changes, replay.torn, replay.stale),
        (0, false, false)
    );
    assert_eq!(again.export_state(), sp.export_state());
    assert_eq!(whole_form(&again, 0), whole_form(&sp, 0));
}

#[test]
fn change_lines_with_owned_splices_carry_their_own_tables_and_replay_to_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let (a, b) = (cover_owner(), other_owner());
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = StateLog::load(&path, k.clone(), &[]).unwrap();
    sp.apply(&[count("f0", Mechanism::Trap, Some(&a))]).unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    // Two owners and a function two splices share in one line; then an owner the snapshot and
    // the line before have, again in the line's own table; then a removal (no table).
    let ids = sp
        .apply(&[
            count("f2", Mechanism::Trap, Some(&a)),
            count(&at_site("f2", 9), Mechanism::Trap, Some(&b)),
        ])
        .unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Appended { .. }
    ));
    sp.apply(&[count("f1+0x5", Mechanism::Jmp, Some(&a))])
        .unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Appended { .. }
    ));
    sp.remove(&ids[..1]).unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Appended { .. }
    ));
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0]["owners"], serde_json::json!([a, b]));
    assert_eq!(arrays(&lines[0]["add"]), [true, true]);
    assert_eq!(
        (&lines[0]["add"][0][10], &lines[0]["add"][1][10]),
        (&0.into(), &1.into())
    );
    assert_eq!(lines[0]["functions"][0][0], "f2");
    assert_eq!(
        (&lines[0]["add"][0][3], &lines[0]["add"][1][3]),
        (&0.into(), &0.into()),
        "indexes into the line's own table"
    );
    assert_eq!(lines[1]["owners"], serde_json::json!([a]));
    assert!(
        lines[1].get("functions").is_none(),
        "one splice of f1: inline"
    );
    assert_eq!(lines[1]["add"][0][3][0], "f1");
    assert!(lines[2].get("owners").is_none() && lines[2].get("functions").is_none());
    for (i, l) in text.lines().enumerate().skip(1) {
        assert!(l.matches(&a.command).count() <= 1, "line {i}: {l}");
    }
    let (again, _, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(
        (replay.changes, replay.torn, replay.stale),
        (3, false, false)
    );
    assert_eq!(again.export_state(), sp.export_state());
    assert_eq!(whole_form(&again, 0), whole_form(&sp, 0));
}

#[test]
fn a_record_whose_index_is_outside_its_tables_is_an_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let a = cover_owner();
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = StateLog::load(&path, k.clone(), &[]).unwrap();
    sp.apply(&[count("f0", Mechanism::Trap, Some(&a))]).unwrap();
    log.compact(&mut sp, put(&k)).unwrap();
    sp.apply(&[count("f1", Mechanism::Trap, Some(&a))]).unwrap();
    log.save(&mut sp, put(&k)).unwrap();
    // The line's owner index made to point past its table, then the line made good again
    // and followed by one more.
    let text = std::fs::read_to_string(&path).unwrap();
    let bad = text.replace(",3,0]]", ",3,1]]");
    assert_ne!(bad, text, "{text}");
    std::fs::write(
        &path,
        format!("{bad}{{\"add\":[],\"remove\":[],\"next_splice\":9}}\n"),
    )
    .unwrap();
    let Err(e) = StateLog::load(&path, k.clone(), &k.blob().1) else {
        panic!("a line with an owner past its table was read");
    };
    let chain = trapvec::error_chain(&e);
    assert!(
        chain.contains("line 2") && chain.contains("owner 1 of a table of 1"),
        "{chain}"
    );
}

/// A snapshot and a log written by the version-5 code (`testdata/v5.*`, commit 370f80b's
/// splicer): an unowned count trap compact, owned count splices (trap at an entry, jmp at an
/// offset, trap at an address as `trapctl cover` writes them) whole, a task predicate whole; in
/// the log, an owned trap added and a plain jmp added with an owned splice removed. They are
/// read as they were, the first change writes a snapshot of the current version with every
/// count compact and each owner once, that reads back the same splices, and removing them all
/// leaves the machine as before any splice.
#[test]
fn a_state_written_by_version_5_is_read_migrated_with_its_owned_splices_compact_and_removed_cleanly(
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    std::fs::write(&path, include_bytes!("testdata/v5.log")).unwrap();
    let k = machine(
        include_str!("testdata/v5.machine.json"),
        include_bytes!("testdata/v5.snapshot.json"),
    );
    let (mut sp, mut log, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(
        (replay.changes, replay.stale, replay.torn, replay.older),
        (2, false, false, true)
    );
    let a = Owner {
        pid: 4242,
        start: 777,
        command: "trapctl cover 'f*'".into(),
    };
    let b = Owner {
        pid: 5151,
        start: 888,
        command: "trapctl count f0+0x9 --pid 4242".into(),
    };
    let address = at_site("f2", 9);
    let live: Vec<(u64, &str, Mechanism, Option<&Owner>, bool)> = sp
        .live()
        .map(|s| {
            let o = &s.request.options;
            (
                s.id.0,
                s.request.at.as_str(),
                s.request.mechanism,
                o.owner.as_ref(),
                o.only.is_empty(),
            )
        })
        .collect();
    assert_eq!(
        live,
        [
            (1, "f0", Mechanism::Trap, None, true),
            (3, address.as_str(), Mechanism::Trap, Some(&a), true),
            (4, "f0+0x9", Mechanism::Trap, Some(&b), false),
            (5, "f2", Mechanism::Trap, Some(&a), true),
            (6, "f3", Mechanism::Jmp, None, true),
        ]
    );
    let site = sp.live().nth(1).unwrap().point.site;
    k.state().hits.insert(site, 5);
    // The first change migrates: a snapshot of the current version, not a line in the old log.
    sp.apply(&[count("f1", Mechanism::Trap, Some(&a))]).unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let v: serde_json::Value = serde_json::from_slice(&k.blob().1).unwrap();
    assert_eq!(v["version"], STATE_VERSION);
    assert_eq!(
        arrays(&v["splices"]),
        [true, true, false, true, true, true],
        "every count compact but the task predicate's: {v}"
    );
    assert_eq!(v["owners"], serde_json::json!([a]));
    // An unowned count site's array is the same as version 5 wrote it (ten elements, its
    // function inline: the only site of f0).
    let v5: serde_json::Value =
        serde_json::from_slice(include_bytes!("testdata/v5.snapshot.json")).unwrap();
    assert_eq!(v["splices"][0], v5["splices"][0]);
    assert_eq!(v["splices"][0].as_array().unwrap().len(), 10);
    let text = String::from_utf8(k.blob().1).unwrap();
    assert_eq!(text.matches(&a.command).count(), 1, "{text}");
    let (mut again, _, _) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(whole_form(&again, 0), whole_form(&sp, 0));
    let ids: Vec<SpliceId> = again.live().map(|s| s.id).collect();
    let removed = again.remove(&ids).unwrap();
    assert_eq!(removed[1].hits, 5);
    assert!(
        k.pristine(),
        "text, dispatch entries and blocks as before any splice"
    );
}

/// A coverage site as the module would hold it: site `i` of `n`, in function `i / 14` (a
/// kernel function has about 14 blocks with a site: 484,453 over 34,516 functions), the
/// function's name 32 bytes (longer than most), its window one of a few common first
/// instructions, its code block an arena block with a module-like id (serial << 32 | offset /
/// 16), the point its address, the owner `owner`.
fn coverage_site(model: &LiveSplice, i: u64, owner: &Owner) -> LiveSplice {
    const WINDOWS: [&[u8]; 4] = [
        &[0x48, 0x89, 0xe5],                         // mov rbp,rsp
        &[0x48, 0x8b, 0x47, 0x08],                   // mov rax,[rdi+8]
        &[0x41, 0x57],                               // push r15
        &[0x0f, 0xb6, 0x87, 0x10, 0x01, 0x00, 0x00], // movzx eax,byte [rdi+0x110]
    ];
    let function = i / 14;
    let faddr = 0xffff_ffff_8100_0000 + function * 0x400;
    let site = faddr + 5 + (i % 14) * 0x40;
    let bytes = WINDOWS[usize::try_from(i % 4).unwrap()].to_vec();
    let (text, addrs) = DisplacedText::decode(&bytes, site).unwrap();
    let code_addr = 0xffff_ffff_c000_0000 + i * 16;
    let mut s = model.clone();
    s.id = SpliceId(i + 1);
    s.request.at = format!("{site:#x}");
    s.request.options.owner = Some(owner.clone());
    s.point.spec_text = s.request.at.clone();
    s.point.function.name = format!("coverage_function_name_{function:09}");
    s.point.function.addr = faddr;
    s.point.function.size = 0x400;
    s.point.site = site;
    s.plan.site = site;
    s.plan.displaced_len = bytes.len();
    s.plan.displaced_addrs = addrs;
    s.plan.displaced_text = text;
    s.plan.displaced_bytes = bytes.clone();
    s.site_patch.addr = site;
    s.site_patch.old = bytes[..2].to_vec();
    s.code = RepoBlock {
        id: 1 << 32 | i,
        addr: code_addr,
        ..s.code.clone()
    };
    s.entry = code_addr;
    s.replay = Some(code_addr);
    let d = s.dispatch.as_mut().unwrap();
    (d.site, d.dest) = (site, code_addr);
    s
}

/// The issue-27 run: 262,144 coverage sites of one owner (the module's batch limit) were 295 MB
/// saved whole, over `TRAPVEC_STATE_MAX` (256 MiB). Saved compact with the tables, here (on the
/// host, not in a guest) they are under 100 bytes a site, some 24 MiB in all, and read back.
#[test]
fn coverage_sites_of_one_owner_cost_under_100_bytes_each_and_262144_fit_far_under_the_module_limit()
{
    const SITES: u64 = 262_144;
    let owner = cover_owner();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count(&at_site("f2", 9), Mechanism::Trap, Some(&owner))])
        .unwrap();
    let model = sp.live().next().unwrap().clone();
    let whole = serde_json::to_vec(&model).unwrap().len();
    let mut sp = Splicer::new(k);
    let started = Instant::now();
    for i in 0..SITES {
        let s = coverage_site(&model, i, &owner);
        sp.live.insert(s.id, Box::new(s));
    }
    sp.next = SITES + 1;
    let made = started.elapsed();
    let snapshot = sp.snapshot_bytes(1);
    let saved = started.elapsed() - made;
    let v: serde_json::Value = serde_json::from_slice(&snapshot).unwrap();
    let records = v["splices"].as_array().unwrap();
    assert!(
        records.iter().all(serde_json::Value::is_array),
        "all compact"
    );
    assert_eq!(v["owners"].as_array().unwrap().len(), 1);
    assert_eq!(
        v["functions"].as_array().unwrap().len() as u64,
        SITES.div_ceil(14)
    );
    let per_site = snapshot.len() as f64 / SITES as f64;
    let limit = trapvec::abi::TRAPVEC_STATE_MAX as usize;
    eprintln!(
        "{SITES} owned coverage sites: snapshot {} bytes ({per_site:.1} per site; one saved whole: {whole} bytes), {:.1}% of TRAPVEC_STATE_MAX; made in {made:?}, saved in {saved:?}",
        snapshot.len(),
        100.0 * snapshot.len() as f64 / limit as f64
    );
    assert!(per_site < 100.0, "{per_site} bytes per site");
    assert!(snapshot.len() * 8 < limit, "{} bytes", snapshot.len());
    let read = SavedState::decode(&snapshot).unwrap().unwrap();
    assert_eq!(read.splices.len() as u64, SITES);
    for (s, back) in sp.live().zip(&read.splices).step_by(997) {
        assert_eq!(
            serde_json::to_vec(s).unwrap(),
            serde_json::to_vec(back).unwrap(),
            "site {}",
            s.id.0
        );
    }
    eprintln!("read back in {:?}", started.elapsed() - made - saved);
}
