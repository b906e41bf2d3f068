//! The journal: every change the daemon makes, appended and `fsync`ed before it is acknowledged.
//!
//! Records are JSON lines. A change is journaled twice: an `intent` (the request, before anything
//! is touched) and then `done` (after the kernel was changed and the splicer's state was stored
//! in the module, with that state's generation and the profile active afterwards) or `failed`
//! (nothing was changed). A `checkpoint` starts a compacted journal. The state is stored as a
//! snapshot in the module and a log of changes after it ([`instr_manager::splicer::state_log`]):
//! its position is the snapshot's generation and the number of change lines logged after it
//! (`changes`), and a change moves one or the other. The module is the truth
//! about what is live; the journal says what the daemon was doing and which profile was active.
//! [`reconcile`] decides, after a crash, what an interrupted change came to: if the module's state
//! generation moved past the last `done`, the change was made and stored (only the `done` record
//! was lost); otherwise it was not stored, and any dispatch entry the module lists that the stored
//! state does not know is reported as unrecorded.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::protocol::Request;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Record {
    /// A compacted journal's first record: the state after everything before it.
    Checkpoint {
        seq: u64,
        time: u64,
        generation: u64,
        /// Change lines in the state log after the snapshot of `generation`.
        #[serde(default)]
        changes: u64,
        profile: Option<String>,
    },
    /// About to make this change.
    Intent {
        seq: u64,
        time: u64,
        request: Request,
    },
    /// The change of intent `seq` is made and stored (module state `generation`).
    Done {
        seq: u64,
        time: u64,
        generation: u64,
        /// Change lines in the state log after the snapshot of `generation`.
        #[serde(default)]
        changes: u64,
        profile: Option<String>,
    },
    /// The change of intent `seq` was refused; nothing changed.
    Failed { seq: u64, time: u64, error: String },
}

impl Record {
    pub fn seq(&self) -> u64 {
        match self {
            Record::Checkpoint { seq, .. }
            | Record::Intent { seq, .. }
            | Record::Done { seq, .. }
            | Record::Failed { seq, .. } => *seq,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The open journal.
pub struct Journal {
    path: PathBuf,
    file: File,
    next_seq: u64,
}

/// What the journal said when it was read back.
#[derive(Debug, Default, PartialEq)]
pub struct Replayed {
    /// Generation of the module state after the last completed change.
    pub generation: u64,
    /// Change lines in the state log after that snapshot.
    pub changes: u64,
    /// The profile active after the last completed change.
    pub profile: Option<String>,
    /// A change whose intent has neither `done` nor `failed`: the daemon stopped inside it.
    pub interrupted: Option<(u64, Request)>,
    pub last_seq: u64,
    /// Lines that are not records (a torn last write), skipped.
    pub torn: usize,
}

/// Read records; a line that does not parse (a write torn by a crash) is counted and skipped.
pub fn replay(text: &str) -> Replayed {
    let mut r = Replayed::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(rec) = serde_json::from_str::<Record>(line) else {
            r.torn += 1;
            continue;
        };
        r.last_seq = r.last_seq.max(rec.seq());
        match rec {
            Record::Checkpoint {
                generation,
                changes,
                profile,
                ..
            } => {
                r.generation = generation;
                r.changes = changes;
                r.profile = profile;
                r.interrupted = None;
            }
            Record::Intent { seq, request, .. } => r.interrupted = Some((seq, request)),
            Record::Done {
                seq,
                generation,
                changes,
                profile,
                ..
            } => {
                if r.interrupted.as_ref().is_some_and(|(s, _)| *s == seq) {
                    r.interrupted = None;
                }
                r.generation = generation;
                r.changes = changes;
                r.profile = profile;
            }
            Record::Failed { seq, .. } => {
                if r.interrupted.as_ref().is_some_and(|(s, _)| *s == seq) {
                    r.interrupted = None;
                }
            }
        }
    }
    r
}

/// What an interrupted change came to, given the module's state generation now.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Nothing was interrupted.
    Clean,
    /// The change was made and its state stored: the daemon takes it as done.
    Completed { seq: u64 },
    /// The module's state is the one before the change: not made (or made and not stored, which
    /// the caller sees as dispatch entries the state does not know).
    NotStored { seq: u64 },
}

/// Decide the interrupted change's outcome (see the module docs).
/// `module_generation` and `log_changes` are the state's position now (see the module docs).
pub fn reconcile(replayed: &Replayed, module_generation: u64, log_changes: u64) -> Outcome {
    match &replayed.interrupted {
        None => Outcome::Clean,
        Some((seq, _))
            if module_generation != replayed.generation || log_changes != replayed.changes =>
        {
            Outcome::Completed { seq: *seq }
        }
        Some((seq, _)) => Outcome::NotStored { seq: *seq },
    }
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Journal {
    /// Open (creating it and its directory) and read back `path`.
    pub fn open(path: &Path) -> Result<(Journal, Replayed), JournalError> {
        let io = |what: &'static str| {
            move |source| JournalError::Io {
                path: path.to_owned(),
                what,
                source,
            }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io("creating its directory"))?;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io("reading")(e)),
        };
        let replayed = replay(&text);
        if replayed.torn > 0 {
            log::warn!(
                "journal {}: {} torn line(s) skipped",
                path.display(),
                replayed.torn
            );
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io("opening"))?;
        Ok((
            Journal {
                path: path.to_owned(),
                file,
                next_seq: replayed.last_seq + 1,
            },
            replayed,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sequence number for the next intent.
    pub fn next_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Append `rec` and `fsync` the file before returning.
    pub fn append(&mut self, rec: &Record) -> Result<(), JournalError> {
        let mut line = serde_json::to_vec(rec).expect("journal records always serialize");
        line.push(b'\n');
        let path = self.path.clone();
        let io = |what: &'static str| {
            let path = path.clone();
            move |source| JournalError::Io { path, what, source }
        };
        self.file.write_all(&line).map_err(io("appending"))?;
        self.file.sync_data().map_err(io("fsync"))?;
        Ok(())
    }

    /// Replace the journal by one checkpoint (written to a temporary file, synced, renamed over
    /// the journal, directory synced): a crash at any point leaves the old or the new journal.
    pub fn compact(
        &mut self,
        generation: u64,
        changes: u64,
        profile: Option<String>,
    ) -> Result<(), JournalError> {
        let path = self.path.clone();
        let io = |what: &'static str| {
            let path = path.clone();
            move |source| JournalError::Io { path, what, source }
        };
        let tmp = self.path.with_extension("tmp");
        let seq = self.next_seq();
        let rec = Record::Checkpoint {
            seq,
            time: now_secs(),
            generation,
            changes,
            profile,
        };
        let mut line = serde_json::to_vec(&rec).expect("journal records always serialize");
        line.push(b'\n');
        let mut f = File::create(&tmp).map_err(io("creating the compacted journal"))?;
        f.write_all(&line)
            .map_err(io("writing the compacted journal"))?;
        f.sync_all().map_err(io("fsync of the compacted journal"))?;
        std::fs::rename(&tmp, &self.path).map_err(io("renaming the compacted journal"))?;
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io("fsync of its directory"))?;
        }
        self.file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io("reopening"))?;
        Ok(())
    }
}

/// The records of `path`.
#[cfg(test)]
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record>> {
    use std::io::{BufRead, BufReader};
    let f = File::open(path)?;
    Ok(BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activate(p: &str) -> Request {
        Request::Activate { profile: p.into() }
    }

    #[test]
    fn done_changes_set_generation_and_profile_and_failed_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let (mut j, r) = Journal::open(&path).unwrap();
        assert_eq!(r, Replayed::default());
        let s = j.next_seq();
        j.append(&Record::Intent {
            seq: s,
            time: 1,
            request: activate("lossy"),
        })
        .unwrap();
        j.append(&Record::Done {
            seq: s,
            time: 1,
            generation: 7,
            changes: 0,
            profile: Some("lossy".into()),
        })
        .unwrap();
        let s = j.next_seq();
        j.append(&Record::Intent {
            seq: s,
            time: 2,
            request: activate("nope"),
        })
        .unwrap();
        j.append(&Record::Failed {
            seq: s,
            time: 2,
            error: "no profile".into(),
        })
        .unwrap();
        drop(j);
        let (mut j, r) = Journal::open(&path).unwrap();
        assert_eq!(
            (
                r.generation,
                r.profile.as_deref(),
                r.interrupted,
                r.last_seq
            ),
            (7, Some("lossy"), None, 2)
        );
        assert_eq!(j.next_seq(), 3);
    }

    #[test]
    fn an_intent_without_outcome_is_interrupted_and_a_torn_line_is_skipped() {
        let text = [
            r#"{"event":"done","seq":1,"time":0,"generation":3,"profile":"clean"}"#,
            r#"{"event":"intent","seq":2,"time":0,"request":{"op":"activate","profile":"lossy"}}"#,
            r#"{"event":"done","seq":2,"ti"#,
        ]
        .join("\n");
        let r = replay(&text);
        assert_eq!(r.interrupted, Some((2, activate("lossy"))));
        assert_eq!((r.generation, r.torn), (3, 1));
        // The module's generation moved: the change was stored before the crash.
        assert_eq!(reconcile(&r, 4, 0), Outcome::Completed { seq: 2 });
        // Or the state log grew by a change line: stored too.
        assert_eq!(reconcile(&r, 3, 1), Outcome::Completed { seq: 2 });
        // It did not: the change never reached the stored state.
        assert_eq!(reconcile(&r, 3, 0), Outcome::NotStored { seq: 2 });
        assert_eq!(reconcile(&replay(""), 9, 0), Outcome::Clean);
    }

    #[test]
    fn compaction_leaves_one_checkpoint_that_replays_to_the_same_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/journal");
        let (mut j, _) = Journal::open(&path).unwrap();
        for g in 1..=5 {
            let s = j.next_seq();
            j.append(&Record::Intent {
                seq: s,
                time: 0,
                request: activate("p"),
            })
            .unwrap();
            j.append(&Record::Done {
                seq: s,
                time: 0,
                generation: g,
                changes: 0,
                profile: Some("p".into()),
            })
            .unwrap();
        }
        j.compact(5, 0, Some("p".into())).unwrap();
        let s = j.next_seq();
        j.append(&Record::Intent {
            seq: s,
            time: 0,
            request: activate("q"),
        })
        .unwrap();
        let recs = read_records(&path).unwrap();
        assert_eq!(recs.len(), 2);
        assert!(matches!(recs[0], Record::Checkpoint { generation: 5, .. }));
        let r = replay(&std::fs::read_to_string(&path).unwrap());
        assert_eq!((r.generation, r.profile.as_deref()), (5, Some("p")));
        assert_eq!(r.interrupted.map(|i| i.1), Some(activate("q")));
    }
}
