//! The incremental state: what one change writes (independent of the live count), replay equal
//! to the live state after a random sequence of changes, a torn last line, and the whole-file
//! format of version 1.

use trapvec::fake::{FakeKernel, FUNCS};

use super::super::state::SavedState;
use super::*;
use crate::plan::Mechanism;
use crate::splice::{Action, SpliceRequest};

fn count(at: &str) -> SpliceRequest {
    SpliceRequest::new(at, Action::Count, Mechanism::Trap)
}

/// The snapshot kept "in the module": the fake kernel's blob.
fn put(k: &FakeKernel) -> impl FnOnce(&FakeKernel, &[u8]) -> Result<(), TargetError> + '_ {
    move |_, bytes| k.put_blob(k.blob().0, bytes).map(|_| ())
}

fn load(k: &FakeKernel, path: &Path) -> (Splicer<FakeKernel>, StateLog, LogReplay) {
    StateLog::load(path, k.clone(), &k.blob().1).unwrap()
}

/// A splicer holding one real splice (at f0) and `n` more copies of it under fresh ids: the
/// size of the state, not its effects, is what these tests need.
fn with_copies(k: &FakeKernel, n: u64) -> Splicer<FakeKernel> {
    let mut sp = Splicer::new(k.clone());
    let id = sp.apply(&[count("f0")]).unwrap()[0];
    let model = sp.live[&id].clone();
    for _ in 0..n {
        sp.next += 1;
        let mut s = model.clone();
        s.id = SpliceId(sp.next);
        sp.live.insert(s.id, s);
    }
    sp
}

/// Bytes written by the change "one more splice" to a state of `n` live splices, right after a
/// compaction, and the size of the whole state.
fn bytes_of_one_change(n: u64) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let mut sp = with_copies(&k, n);
    let (_, mut log, _) = load(&k, &path);
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let whole = sp.export_state().len() as u64;
    sp.apply(&[count("f1")]).unwrap();
    match log.save(&mut sp, put(&k)).unwrap() {
        Saved::Appended { bytes } => (bytes, whole),
        other => panic!("one change at {n} live was written as {other:?}"),
    }
}

#[test]
fn one_change_writes_the_same_bytes_with_0_and_10000_live_splices() {
    let (small, small_whole) = bytes_of_one_change(0);
    let (big, big_whole) = bytes_of_one_change(10_000);
    eprintln!("one change: {small} bytes at 1 live ({small_whole} whole), {big} bytes at 10,001 live ({big_whole} whole)");
    assert!(
        big <= 2 * small && small <= 2 * big,
        "{small} vs {big} bytes"
    );
    assert!(
        big * 1000 < big_whole,
        "one change ({big} bytes) is not far below the whole state ({big_whole} bytes)"
    );
}

/// A tiny deterministic generator (xorshift64*), so a failure can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn snapshot_and_log_replay_to_the_live_state_after_random_applies_and_removes() {
    for seed in [1u64, 7, 0x5eed] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.log");
        let k = FakeKernel::new();
        let (mut sp, mut log, _) = load(&k, &path);
        let mut rng = Rng(seed);
        let mut appended = 0;
        // Enough changes to outgrow MIN_COMPACT_BYTES (compact count lines are ~100 bytes).
        for step in 0..1_200 {
            let free: Vec<&str> = FUNCS
                .iter()
                .copied()
                .filter(|f| sp.find(f).is_none())
                .collect();
            let live: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
            if !free.is_empty() && (live.is_empty() || rng.below(2) == 0) {
                let reqs: Vec<SpliceRequest> = free
                    .iter()
                    .filter(|_| rng.below(2) == 0)
                    .map(|f| count(f))
                    .collect();
                sp.apply(&reqs).unwrap();
            } else {
                let ids: Vec<SpliceId> = live.into_iter().filter(|_| rng.below(2) == 0).collect();
                sp.remove(&ids).unwrap();
            }
            if let Saved::Appended { .. } = log.save(&mut sp, put(&k)).unwrap() {
                appended += 1;
            }
            if step % 10 == 9 {
                let (again, _, replay) = load(&k, &path);
                assert!(!replay.torn && !replay.stale, "seed {seed} step {step}");
                assert_eq!(
                    again.export_state(),
                    sp.export_state(),
                    "seed {seed} step {step}: snapshot + {} change(s) replayed",
                    replay.changes
                );
            }
        }
        assert!(appended > 50, "seed {seed}: only {appended} appended");
        assert!(
            log.compactions() > 1,
            "seed {seed}: the log was compacted again"
        );
    }
}

#[test]
fn a_log_larger_than_the_snapshot_is_compacted_and_the_state_survives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = load(&k, &path);
    let mut saved = Vec::new();
    for _ in 0..600 {
        let id = sp.apply(&[count("f2")]).unwrap()[0];
        saved.push(log.save(&mut sp, put(&k)).unwrap());
        sp.remove(&[id]).unwrap();
        saved.push(log.save(&mut sp, put(&k)).unwrap());
    }
    let compacted = saved
        .iter()
        .filter(|s| matches!(s, Saved::Compacted { .. }))
        .count();
    assert!(
        (2..20).contains(&compacted),
        "{compacted} compactions in 1,200 changes"
    );
    assert!(std::fs::metadata(&path).unwrap().len() <= MIN_COMPACT_BYTES);
    let (again, _, _) = load(&k, &path);
    assert_eq!(again.export_state(), sp.export_state());
}

/// Above [`MIN_COMPACT_BYTES`], a log is compacted when the next line would take it past the
/// snapshot's size, not before: a snapshot (the cost that grows with the live count) is paid
/// once per as many bytes of changes as it has itself.
#[test]
fn a_log_is_compacted_when_it_would_outgrow_a_snapshot_larger_than_the_minimum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    // A compact count record is ~100 bytes: 2,000 of them are well past 2 x MIN_COMPACT_BYTES.
    let mut sp = with_copies(&k, 2_000);
    let (_, mut log, _) = load(&k, &path);
    let Saved::Compacted { bytes: snapshot } = log.save(&mut sp, put(&k)).unwrap() else {
        panic!("the first save did not write a snapshot");
    };
    assert!(
        snapshot > 2 * MIN_COMPACT_BYTES,
        "a snapshot of {snapshot} bytes"
    );
    let header = std::fs::metadata(&path).unwrap().len();
    let (mut logged, mut changes, mut longest) = (header, 0u64, 0);
    // f1 spliced and unspliced in turn, each change saved on its own.
    let mut spliced = None;
    let next_snapshot = loop {
        match spliced.take() {
            None => spliced = Some(sp.apply(&[count("f1")]).unwrap()[0]),
            Some(id) => drop(sp.remove(&[id]).unwrap()),
        }
        match log.save(&mut sp, put(&k)).unwrap() {
            Saved::Appended { bytes } => {
                logged += bytes;
                changes += 1;
                longest = longest.max(bytes);
                assert_eq!(std::fs::metadata(&path).unwrap().len(), logged);
            }
            Saved::Compacted { bytes } => break bytes,
            Saved::Unchanged => panic!("a change was not written"),
        }
        assert!(changes < 100_000, "never compacted");
    };
    assert!(
        next_snapshot.abs_diff(snapshot) < 1_000,
        "{next_snapshot} against {snapshot}"
    );
    assert!(
        logged <= snapshot && logged + 2 * longest > snapshot,
        "compacted at {logged} bytes of log ({changes} changes) against a {snapshot}-byte snapshot"
    );
    // A new epoch's header (its number's digits may differ), no change line.
    let new_log = std::fs::metadata(&path).unwrap().len();
    assert!(
        new_log.abs_diff(header) < 8,
        "the new log has {new_log} bytes"
    );
    let (again, _, replay) = load(&k, &path);
    assert_eq!(replay.changes, 0);
    assert_eq!(again.export_state(), sp.export_state());
}

#[test]
fn a_torn_last_line_is_skipped_and_no_earlier_change_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = load(&k, &path);
    let a = sp.apply(&[count("f0")]).unwrap();
    log.save(&mut sp, put(&k)).unwrap();
    let b = sp.apply(&[count("f1")]).unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Appended { .. }
    ));
    let after_b = sp.export_state();
    sp.apply(&[count("f2")]).unwrap();
    let Saved::Appended { bytes } = log.save(&mut sp, put(&k)).unwrap() else {
        panic!("not appended")
    };
    // A crash half-way through writing the last line.
    let len = std::fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - bytes / 2).unwrap();
    drop(f);

    let (mut again, mut log, replay) = load(&k, &path);
    assert!(replay.torn);
    assert_eq!(replay.changes, 1, "the change of f1 was replayed");
    assert_eq!(again.export_state(), after_b);
    let ids: Vec<SpliceId> = again.live().map(|s| s.id).collect();
    assert_eq!(ids, [a[0], b[0]]);
    // The f2 splice is in the kernel but not in the state: the next save starts a whole new
    // snapshot rather than appending after the torn bytes.
    again.apply(&[count("f3")]).unwrap();
    assert!(matches!(
        log.save(&mut again, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let (third, _, replay) = load(&k, &path);
    assert!(!replay.torn);
    assert_eq!(third.export_state(), again.export_state());
}

#[test]
fn a_line_torn_in_the_middle_of_the_log_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = load(&k, &path);
    sp.apply(&[count("f0")]).unwrap();
    log.save(&mut sp, put(&k)).unwrap();
    sp.apply(&[count("f1")]).unwrap();
    log.save(&mut sp, put(&k)).unwrap();
    sp.apply(&[count("f2")]).unwrap();
    log.save(&mut sp, put(&k)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "header and two changes");
    let broken = format!("{}\n{}\n{}\n", lines[0], &lines[1][..20], lines[2]);
    std::fs::write(&path, broken).unwrap();
    let Err(err) = StateLog::load(&path, k.clone(), &k.blob().1) else {
        panic!("a broken line in the middle was taken")
    };
    assert!(
        matches!(
            err,
            StateLoadError::State(StateError::LogLine { line: 2, .. })
        ),
        "{err}"
    );
}

#[test]
fn a_version_1_whole_state_is_read_and_a_log_beside_it_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f0"), count("f3")]).unwrap();
    // The whole-file format as the previous version wrote it: version 1, no epoch.
    let mut v1: serde_json::Value = serde_json::from_slice(&sp.export_state()).unwrap();
    v1["version"] = 1.into();
    v1.as_object_mut().unwrap().remove("epoch");
    let v1 = serde_json::to_vec(&v1).unwrap();
    k.put_blob(k.blob().0, &v1).unwrap();
    // A log some earlier state left.
    std::fs::write(
        &path,
        format!("{{\"format\":\"{LOG_FORMAT}\",\"version\":2,\"epoch\":99}}\n"),
    )
    .unwrap();
    let (mut again, mut log, replay) = load(&k, &path);
    assert!(replay.stale && replay.changes == 0);
    assert_eq!(again.export_state(), sp.export_state());
    // The first save migrates: a version-2 snapshot and a log that continues it.
    again.remove_all().unwrap();
    assert!(matches!(
        log.save(&mut again, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let saved = SavedState::decode(&k.blob().1).unwrap().unwrap();
    assert_eq!((saved.version, saved.splices.len()), (STATE_VERSION, 0));
    assert_ne!(saved.epoch, 0);
}

/// A log's header names a version the snapshot reader reads too, but version 1 (the whole file
/// from before the log) never had a log: a log of it, or of a version from nowhere, is refused
/// naming the version. An older log (version 4) is read and never appended to: the next save
/// writes a snapshot of the current version, whose log the save after appends to.
#[test]
fn a_log_is_read_only_in_a_version_with_logs_and_an_older_one_is_not_appended_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let (_, mut log, _) = load(&k, &path);
    sp.apply(&[count("f0")]).unwrap();
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let epoch = SavedState::decode(&k.blob().1).unwrap().unwrap().epoch;
    let header = |version: u32| {
        format!("{{\"format\":\"{LOG_FORMAT}\",\"version\":{version},\"epoch\":{epoch}}}\n")
    };
    for version in [1, 99] {
        std::fs::write(&path, header(version)).unwrap();
        let err = StateLog::load(&path, k.clone(), &k.blob().1).err().unwrap();
        assert!(
            matches!(err, StateLoadError::State(StateError::Version { found }) if found == version),
            "{err}"
        );
    }
    std::fs::write(&path, header(4)).unwrap();
    let (mut again, mut log, replay) = load(&k, &path);
    assert_eq!(
        (replay.older, replay.stale, replay.torn, replay.changes),
        (true, false, false, 0)
    );
    again.apply(&[count("f1")]).unwrap();
    assert!(matches!(
        log.save(&mut again, put(&k)).unwrap(),
        Saved::Compacted { .. }
    ));
    let (mut again, mut log, replay) = load(&k, &path);
    assert!(!replay.older);
    again.apply(&[count("f2")]).unwrap();
    assert!(matches!(
        log.save(&mut again, put(&k)).unwrap(),
        Saved::Appended { .. }
    ));
}

#[test]
fn nothing_changed_writes_nothing_and_a_component_change_alone_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.log");
    let k = FakeKernel::new();
    let (mut sp, mut log, _) = load(&k, &path);
    sp.apply(&[count("f0")]).unwrap();
    log.save(&mut sp, put(&k)).unwrap();
    assert!(!sp.state_changed());
    assert_eq!(log.save(&mut sp, put(&k)).unwrap(), Saved::Unchanged);
    let c = trapvec::fake::knob_component(dir.path());
    sp.load_component(&c, &Default::default()).unwrap();
    assert!(sp.state_changed(), "a component came");
    assert!(matches!(
        log.save(&mut sp, put(&k)).unwrap(),
        Saved::Appended { .. }
    ));
    let (again, _, replay) = load(&k, &path);
    assert_eq!(replay.changes, 1);
    assert_eq!(again.components().iter().count(), 1);
    assert_eq!(again.export_state(), sp.export_state());
}
