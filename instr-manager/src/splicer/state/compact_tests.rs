//! The compact records' tests: a count site's array reads back the same splice, what is saved
//! whole, states of versions 2 and 3 read and migrated, and the record's size against version 3.

use trapvec::fake::{func_addr, FakeKernel, FUNC};

use super::Tables;
use crate::plan::Mechanism;
use crate::splicer::state_log::{Saved, StateLog};
use crate::splicer::{Action, LiveSplice, SpliceRequest, Splicer};

fn count(at: &str, mechanism: Mechanism) -> SpliceRequest {
    SpliceRequest::new(at, Action::Count, mechanism)
}

/// `s` as a document of its own saves it (without the tables its array indexes).
fn record(s: &LiveSplice) -> serde_json::Value {
    let mut tables = Tables::default();
    let mut records = [tables.record(s)];
    tables.finish(&mut records);
    serde_json::to_value(&records[0]).unwrap()
}

pub(super) fn state_json(sp: &Splicer<FakeKernel>) -> serde_json::Value {
    serde_json::from_slice(&sp.export_state()).unwrap()
}

/// The whole form of every splice (what version 2 wrote, without tables), as a state of
/// `version`.
pub(super) fn whole_form(sp: &Splicer<FakeKernel>, version: u32) -> serde_json::Value {
    let mut v = state_json(sp);
    v["version"] = version.into();
    let map = v.as_object_mut().unwrap();
    map.remove("owners");
    map.remove("functions");
    let whole: Vec<serde_json::Value> = sp
        .live()
        .map(|s: &LiveSplice| serde_json::to_value(s).unwrap())
        .collect();
    v["splices"] = whole.into();
    v
}

#[test]
fn a_count_site_is_saved_as_a_compact_array_that_reads_back_the_same_splice() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[
        count("f0", Mechanism::Trap),
        count("f1+0x5", Mechanism::Jmp),
        count("f2+0x9", Mechanism::Trap),
    ])
    .unwrap();
    let v = state_json(&sp);
    let splices = v["splices"].as_array().unwrap();
    assert_eq!(splices.len(), 3);
    assert!(splices.iter().all(serde_json::Value::is_array), "{v}");
    let again = Splicer::import_state(k, &sp.export_state()).unwrap();
    assert_eq!(
        whole_form(&again, 3),
        whole_form(&sp, 3),
        "a splice read back from its compact record differs"
    );
    for s in sp.live() {
        let whole = serde_json::to_vec(s).unwrap().len();
        let compact = record(s).to_string().len();
        eprintln!("{}: {whole} bytes whole, {compact} compact", s.request.at);
        assert!(compact * 4 < whole, "{compact} bytes against {whole}");
    }
}

#[test]
fn a_splice_the_array_cannot_describe_is_saved_whole() {
    let mut sp = Splicer::new(FakeKernel::new());
    sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let plain = sp.live().next().unwrap().clone();
    let is_whole = |s: &LiveSplice| record(s).is_object();
    assert!(!is_whole(&plain));
    // Not a plain count: a handler, a component's.
    let handled = LiveSplice {
        dest_fn: 0x1234,
        ..plain.clone()
    };
    assert!(is_whole(&handled));
    // A plain count the array would not give back: its data block is not 16 bytes.
    let mut odd = plain.clone();
    odd.data = Some(trapvec::RepoBlock {
        size: 32,
        ..odd.code.clone()
    });
    assert!(is_whole(&odd));
    // A dispatch entry with a cookie the array has no room for.
    let mut cookie = plain;
    cookie.dispatch.as_mut().unwrap().cookie = 9;
    assert!(is_whole(&cookie));
}

#[test]
fn a_version_2_state_and_its_log_are_read_and_the_first_save_migrates_them_to_compact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f0", Mechanism::Trap)]).unwrap();
    let mut old = whole_form(&sp, 2);
    old["epoch"] = 5.into();
    k.put_blob(k.blob().0, &serde_json::to_vec(&old).unwrap())
        .unwrap();
    // A version-2 log after it: one change adding f2's splice, whole.
    let id = sp.apply(&[count("f2", Mechanism::Jmp)]).unwrap()[0];
    let added = serde_json::to_value(&*sp.live[&id]).unwrap();
    let change = serde_json::json!({"add": [added], "remove": [], "next_splice": sp.next});
    std::fs::write(
        &path,
        format!("{{\"format\":\"trapvec-state-log\",\"version\":2,\"epoch\":5}}\n{change}\n"),
    )
    .unwrap();
    let (mut again, mut log, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(
        (replay.changes, replay.stale, replay.torn),
        (1, false, false)
    );
    assert_eq!(whole_form(&again, 3), whole_form(&sp, 3));
    // The first change is written as a new snapshot of the current version, compact.
    again.apply(&[count("f3", Mechanism::Trap)]).unwrap();
    let put = |_: &FakeKernel, b: &[u8]| k.put_blob(k.blob().0, b).map(|_| ());
    assert!(matches!(
        log.save(&mut again, put).unwrap(),
        Saved::Compacted { .. }
    ));
    let v: serde_json::Value = serde_json::from_slice(&k.blob().1).unwrap();
    assert_eq!(v["version"], super::super::STATE_VERSION);
    let splices = v["splices"].as_array().unwrap();
    assert_eq!(splices.len(), 3);
    assert!(splices.iter().all(serde_json::Value::is_array), "{v}");
}

/// The record of a version-3 state (its array as that version wrote it): text, addresses
/// and original bytes, no window bytes.
fn version_3_record(s: &LiveSplice) -> serde_json::Value {
    let (site, f) = (s.point.site, &s.point.function);
    let data = s.data.as_ref().expect("a jmp count has a data block");
    let offsets: Vec<u64> = s.plan.displaced_addrs.iter().map(|a| a - site).collect();
    serde_json::json!([
        s.id.0,
        s.request.at,
        s.request.mechanism,
        null,
        [f.name, f.addr, f.size, null],
        site - f.addr,
        s.plan.displaced_len,
        s.plan.patch_len,
        offsets,
        s.plan.displaced_text.as_str(),
        super::to_hex(&s.site_patch.old),
        super::to_hex(&s.site_patch.new),
        [s.code.id, s.code.addr.wrapping_sub(site), s.code.size],
        [data.id, data.addr.wrapping_sub(s.code.addr)],
        u8::from(s.replay.is_some()) | u8::from(s.dispatch.is_some()) << 1
    ])
}

#[test]
fn a_version_3_state_is_read_its_window_bytes_read_back_and_saved_again_in_the_current_version() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f0", Mechanism::Jmp), count("f1+0x5", Mechanism::Jmp)])
        .unwrap();
    let mut v3 = state_json(&sp);
    v3["version"] = 3.into();
    v3["splices"] = sp.live().map(version_3_record).collect();
    let again = Splicer::import_state(k.clone(), &serde_json::to_vec(&v3).unwrap()).unwrap();
    assert!(again.live().all(|s| !s.plan.displaced_bytes.is_empty()));
    assert_eq!(
        whole_form(&again, 4),
        whole_form(&sp, 4),
        "a splice read from a version-3 record differs"
    );
    let v4 = state_json(&again);
    // Written in the current version's arrays (10 elements: no owner).
    assert_eq!(v4["version"], super::super::STATE_VERSION);
    let splices = v4["splices"].as_array().unwrap();
    assert!(
        splices
            .iter()
            .all(|r| r.as_array().is_some_and(|a| a.len() == 10)),
        "{v4}"
    );
}

/// The fake machine as the version-3 code left it after writing `testdata/v3.*` (commit
/// bf52218's splicer, before item 1 of issue 26: every count site has a data block): its
/// memory, blocks, dispatch entries and text patches, with the snapshot as its blob.
fn v3_machine() -> FakeKernel {
    machine(
        include_str!("testdata/v3.machine.json"),
        include_bytes!("testdata/v3.snapshot.json"),
    )
}

/// The fake machine `m` describes (a `testdata/v*.machine.json`), with `snapshot` as its
/// blob.
pub(super) fn machine(m: &str, snapshot: &[u8]) -> FakeKernel {
    let m: serde_json::Value = serde_json::from_str(m).unwrap();
    let field = |name: &str| m[name].clone();
    let k = FakeKernel::new();
    {
        let mut st = k.state();
        for run in m["memory"].as_array().unwrap() {
            let addr = run[0].as_u64().unwrap();
            let bytes = super::from_hex(run[1].as_str().unwrap()).unwrap();
            for (i, b) in bytes.into_iter().enumerate() {
                st.memory.insert(addr + i as u64, b);
            }
        }
        st.next_block = m["next_block"].as_u64().unwrap();
        let blocks: Vec<trapvec::RepoBlock> = serde_json::from_value(field("blocks")).unwrap();
        st.blocks = blocks.into_iter().map(|b| (b.id, b)).collect();
        st.sealed = serde_json::from_value(field("sealed")).unwrap();
        let dispatch: Vec<trapvec::DispatchEntry> =
            serde_json::from_value(field("dispatch")).unwrap();
        st.dispatch = dispatch.into_iter().map(|d| (d.site, d)).collect();
        let patched: Vec<(u64, u8)> = serde_json::from_value(field("patched")).unwrap();
        st.patched = patched.into_iter().collect();
        st.blob = (m["blob_generation"].as_u64().unwrap(), snapshot.to_vec());
    }
    k
}

/// A snapshot and a log written by the version-3 code (count traps and jmps at entries and
/// offsets, each with a data block, one splice saved whole, a splice added and one removed
/// in the log) are read: the windows' bytes are read back from the text, the hits are the
/// dispatcher's, the first change writes a snapshot of the current version (arrays of 10, the whole
/// record kept whole) that reads back the same splices, and removing them all leaves the
/// machine as it was before any splice (every block given back, the data blocks too).
#[test]
fn a_state_written_by_version_3_is_read_migrated_to_the_current_version_and_removed_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    std::fs::write(&path, include_bytes!("testdata/v3.log")).unwrap();
    let k = v3_machine();
    let (mut sp, mut log, replay) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(
        (replay.changes, replay.stale, replay.torn),
        (2, false, false)
    );
    let live: Vec<(&str, Mechanism, bool)> = sp
        .live()
        .map(|s| (s.request.at.as_str(), s.request.mechanism, s.data.is_some()))
        .collect();
    assert_eq!(
        live,
        [
            ("f0", Mechanism::Trap, true),
            ("f1+0x5", Mechanism::Jmp, true),
            ("f2+0x9", Mechanism::Trap, true),
            ("f0+0x9", Mechanism::Trap, true),
            ("f2", Mechanism::Trap, true),
        ]
    );
    for s in sp.live() {
        let off = usize::try_from(s.plan.site - func_addr(&s.point.function.name)).unwrap();
        assert_eq!(
            s.plan.displaced_bytes,
            FUNC[off..off + s.plan.displaced_len],
            "{}: the window's bytes read back from the text",
            s.request.at
        );
    }
    let f0 = sp.live().next().unwrap();
    let (f0_id, f0_site) = (f0.id, f0.point.site);
    k.state().hits.insert(f0_site, 11);
    assert_eq!(sp.hits(f0_id).unwrap().hits, 11);
    // The first change migrates: a new snapshot of the current version, not a line in the
    // old log.
    sp.apply(&[count("f3", Mechanism::Trap)]).unwrap();
    let put = |_: &FakeKernel, b: &[u8]| k.put_blob(k.blob().0, b).map(|_| ());
    assert!(matches!(
        log.save(&mut sp, put).unwrap(),
        Saved::Compacted { .. }
    ));
    let v: serde_json::Value = serde_json::from_slice(&k.blob().1).unwrap();
    assert_eq!(v["version"], super::super::STATE_VERSION);
    let lens: Vec<Option<usize>> = v["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().map(Vec::len))
        .collect();
    assert_eq!(
        lens,
        [Some(10), Some(10), Some(10), None, Some(10), Some(10)],
        "plain counts as arrays, the one with a task predicate whole: {v}"
    );
    let (mut again, _, _) = StateLog::load(&path, k.clone(), &k.blob().1).unwrap();
    assert_eq!(whole_form(&again, 4), whole_form(&sp, 4));
    let ids: Vec<_> = again.live().map(|s| s.id).collect();
    assert_eq!(again.remove(&ids).unwrap()[0].hits, 11);
    assert!(
        k.pristine(),
        "text, dispatch entries and blocks as before any splice"
    );
}

/// A version-4 record of a count site at its function's entry leaves out the point text
/// (the function's name), the displaced text and addresses (decoded from the window's
/// bytes) and the data block the dispatcher's count needs none of: under 120 bytes here
/// (the fake's block ids and the distance of its code from the site are 20 and 10 digits;
/// the module's ids are shorter). A jmp's keeps its data block: a fifth shorter than the
/// version-3 array of the same splice.
#[test]
fn the_current_record_is_shorter_than_the_version_3_record() {
    let mut sp = Splicer::new(FakeKernel::new());
    sp.apply(&[count("f0", Mechanism::Trap), count("f1", Mechanism::Jmp)])
        .unwrap();
    for s in sp.live() {
        let v4 = record(s).to_string();
        eprintln!("{}: {} bytes: {v4}", s.request.at, v4.len());
        match s.data.is_some() {
            true => {
                let v3 = version_3_record(s).to_string();
                assert!(5 * v4.len() < 4 * v3.len(), "{v4} against {v3}");
            }
            false => assert!(v4.len() < 120, "{v4}"),
        }
    }
}
