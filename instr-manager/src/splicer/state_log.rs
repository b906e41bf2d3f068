//! The splicer's state kept incrementally: a snapshot (the whole state, [`super::state`]) and
//! an append-only log of changes after it, so that one change costs what it changes, not what
//! is live.
//!
//! The log is a file of JSON lines. Its first line is a header naming the format, its version
//! and the *epoch* of the snapshot it continues (a number drawn when that snapshot was written);
//! every further line is one change, whole: the splices it made (each in full, a count splice
//! as a compact array), the ids it removed, the next splice number and, only when they changed,
//! the components, original trampolines and retiring splices (all three small: they do not grow
//! with the live count). Since version 6 a line that adds compact arrays carries its own tables
//! of the owners and functions they share (`owners`, `functions`, before `add`;
//! [`super::state::compact`]): an index in a line means its own line's table, never the
//! snapshot's or another line's, so each line is read on its own.
//! A change line is written with one `write` and `fsync`ed before the command reports success.
//!
//! Loading is the snapshot, then every change line of a log whose epoch is the snapshot's, in
//! order. A last line cut short (a crash while writing it) is skipped with a warning: the change
//! it began never reported success, and no earlier line is lost. A log of another epoch is stale
//! (the snapshot was rewritten after it, or the module was reloaded) and is ignored.
//!
//! Compaction writes a new snapshot (new epoch) and then a new, empty log (written beside it and
//! renamed over it). It happens when the log has grown larger than the last snapshot (so its
//! cost, proportional to the live count, is paid at most once per as many bytes of changes), when
//! the log cannot be appended to (missing, stale, torn), and whenever a caller asks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use component_manager::ComponentManager;
use serde::{Deserialize, Serialize};
use trapvec::{Target, TargetError};

use super::state::{compact, read_as, Part, SavedState, StateError, STATE_VERSION};
use super::{LiveSplice, OrigStub, Retiring, SpliceId, Splicer};

/// The `format` of a state log's header line.
pub const LOG_FORMAT: &str = "trapvec-state-log";

/// Where trapctl and trapd keep the log of the kernel's state (beside the snapshot held in
/// trapvec.ko) unless `TRAPVEC_STATE_LOG` names another file. In trapd's state directory: the one
/// place trapd's systemd unit may write that outlives the service (`/run` is read-only to it and
/// its runtime directory goes when it stops). A log that outlives the module's state (a reboot,
/// an `rmmod`) is harmless: it names another snapshot's epoch and is ignored.
pub const DEFAULT_STATE_LOG: &str = "/var/lib/trapd/state.log";

/// Below this size a log is never compacted (a small state would otherwise be rewritten on
/// nearly every change).
pub const MIN_COMPACT_BYTES: u64 = 64 * 1024;

/// Fewer bytes than any splice's record in a change line takes, with the comma after it: the
/// shortest, a compact array, has ten elements of a byte or more (two of them quoted strings)
/// and their nine commas between brackets (a whole record is an object of many named fields).
const MIN_RECORD_BYTES: u64 = 16;

/// The log path trapctl and trapd use for the kernel: `TRAPVEC_STATE_LOG` or
/// [`DEFAULT_STATE_LOG`].
pub fn kernel_state_log() -> PathBuf {
    std::env::var_os("TRAPVEC_STATE_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_LOG))
}

/// The live splices, with the ids inserted or removed since the state was last written (the
/// splices a change line must carry) and a digest of the rest of the state as last written.
/// Reads go to the map ([`Deref`]); every write goes through [`LiveMap::insert`] and
/// [`LiveMap::remove`], which note the id.
#[derive(Debug, Default)]
pub(super) struct LiveMap {
    map: BTreeMap<SpliceId, Box<LiveSplice>>,
    changed: BTreeSet<SpliceId>,
    /// [`meta_digest`] of the components, original trampolines and retiring splices last
    /// written; `None`: never written (the next change line carries them).
    written_meta: Option<u64>,
    /// Indexes over `map`, kept by the same two writers ([`super::index`]).
    index: super::index::LiveIndex,
}

impl Deref for LiveMap {
    type Target = BTreeMap<SpliceId, Box<LiveSplice>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl LiveMap {
    /// A map restored from a saved state: nothing changed since it was written.
    pub(super) fn restored(map: BTreeMap<SpliceId, Box<LiveSplice>>, meta: Option<u64>) -> Self {
        LiveMap {
            index: super::index::LiveIndex::of(map.values().map(|s| &**s)),
            map,
            changed: BTreeSet::new(),
            written_meta: meta,
        }
    }

    pub(super) fn insert(&mut self, id: SpliceId, s: Box<LiveSplice>) -> Option<Box<LiveSplice>> {
        self.changed.insert(id);
        self.index.add(&s);
        let old = self.map.insert(id, s);
        if let Some(old) = &old {
            self.index.remove(old);
            // The old one may have shared an entry with the new one: put the new one's back.
            self.index.add(&self.map[&id]);
        }
        old
    }

    pub(super) fn remove(&mut self, id: &SpliceId) -> Option<Box<LiveSplice>> {
        let s = self.map.remove(id);
        if let Some(s) = &s {
            self.changed.insert(*id);
            self.index.remove(s);
        }
        s
    }

    /// The indexes over the live splices.
    pub(super) fn index(&self) -> &super::index::LiveIndex {
        &self.index
    }
}

/// The header line of a log.
#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    epoch: u64,
}

/// The part of the state that does not grow with the live count, as written...
#[derive(Serialize)]
struct MetaRef<'a> {
    components: &'a ComponentManager,
    orig: BTreeMap<&'a str, &'a OrigStub>,
    retiring: Vec<&'a Retiring>,
}

/// ...and as read back.
#[derive(Deserialize)]
struct Meta {
    components: ComponentManager,
    orig: BTreeMap<String, OrigStub>,
    retiring: Vec<Retiring>,
}

/// One change line, as written (its tables hold what its own compact records index, see
/// [`super::state::compact`])...
#[derive(Serialize)]
struct ChangeRef<'a> {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    owners: Vec<&'a crate::owner::Owner>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    functions: Vec<compact::FunctionRow>,
    add: Vec<compact::RecordRef<'a>>,
    remove: Vec<SpliceId>,
    next_splice: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<MetaRef<'a>>,
}

/// ...and as read back (before version 6, without tables).
#[derive(Deserialize)]
struct Change {
    #[serde(default)]
    owners: Vec<crate::owner::Owner>,
    #[serde(default)]
    functions: Vec<compact::FunctionRow>,
    add: Vec<compact::Record>,
    remove: Vec<SpliceId>,
    next_splice: u64,
    #[serde(default)]
    meta: Option<Meta>,
}

fn meta_ref<T: Target>(sp: &Splicer<T>) -> MetaRef<'_> {
    meta_of(&sp.components, &sp.orig, &sp.retiring)
}

fn meta_of<'a>(
    components: &'a ComponentManager,
    orig: &'a HashMap<String, OrigStub>,
    retiring: &'a BTreeMap<SpliceId, Retiring>,
) -> MetaRef<'a> {
    MetaRef {
        components,
        orig: orig.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        retiring: retiring.values().collect(),
    }
}

/// The digest of the state's small part as a change line would carry it.
pub(super) fn digest_of(
    components: &ComponentManager,
    orig: &HashMap<String, OrigStub>,
    retiring: &BTreeMap<SpliceId, Retiring>,
) -> u64 {
    meta_digest(&meta_of(components, orig, retiring)).1
}

/// The serialized meta and its digest.
fn meta_digest(meta: &MetaRef<'_>) -> (Vec<u8>, u64) {
    let bytes = serde_json::to_vec(meta).expect("the splicer state always serializes");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    (bytes, h.finish())
}

/// A fresh epoch: never 0 (the epoch of a snapshot no log continues).
fn new_epoch() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (t, std::process::id()).hash(&mut h);
    h.finish().max(1)
}

/// What loading made of a log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogReplay {
    /// Change lines applied after the snapshot.
    pub changes: u64,
    /// The last line was cut short (skipped).
    pub torn: bool,
    /// A log was there but continued another snapshot (ignored).
    pub stale: bool,
    /// The log is of an older version than this program writes: read, never appended to (the
    /// next save writes a snapshot of the current version).
    pub older: bool,
}

impl<T: Target> Splicer<T> {
    /// Whether anything changed since the state was last written ([`Splicer::state_change`],
    /// [`Splicer::compact_state`]) or restored. Costs nothing for the live splices: only the
    /// small rest of the state is serialized to find out.
    pub fn state_changed(&self) -> bool {
        !self.live.changed.is_empty()
            || self.live.written_meta != Some(meta_digest(&meta_ref(self)).1)
    }

    /// Bytes the next [`Splicer::state_change`] line takes at least: [`MIN_RECORD_BYTES`] for
    /// each splice it adds (the rest of the line not counted).
    fn state_change_least(&self) -> u64 {
        let added = self.live.changed.iter();
        let added = added.filter(|id| self.live.map.contains_key(id)).count();
        added as u64 * MIN_RECORD_BYTES
    }

    /// The change line (ending in `\n`) for everything changed since the state was last
    /// written, or `None` if nothing did; from now on the state counts as written. Its size
    /// depends on the splices changed, not on the splices live.
    pub fn state_change(&mut self) -> Option<Vec<u8>> {
        let (_, digest) = meta_digest(&meta_ref(self));
        let meta_changed = self.live.written_meta != Some(digest);
        if self.live.changed.is_empty() && !meta_changed {
            return None;
        }
        let changed = std::mem::take(&mut self.live.changed);
        let (add, remove): (Vec<SpliceId>, Vec<SpliceId>) = changed
            .into_iter()
            .partition(|id| self.live.map.contains_key(id));
        let mut tables = compact::Tables::default();
        let mut add: Vec<_> = add
            .iter()
            .map(|id| tables.record(&self.live.map[id]))
            .collect();
        let tables = tables.finish(&mut add);
        let line = ChangeRef {
            owners: tables.owners,
            functions: tables.functions,
            add,
            remove,
            next_splice: self.next,
            meta: meta_changed.then(|| meta_ref(self)),
        };
        let mut bytes = serde_json::to_vec(&line).expect("the splicer state always serializes");
        bytes.push(b'\n');
        self.live.written_meta = Some(digest);
        Some(bytes)
    }

    /// The whole state as a snapshot of a new epoch (which a new log must name in its
    /// header); from now on the state counts as written.
    pub fn compact_state(&mut self) -> (u64, Vec<u8>) {
        let epoch = new_epoch();
        let bytes = self.snapshot_bytes(epoch);
        self.live.changed.clear();
        self.live.written_meta = Some(meta_digest(&meta_ref(self)).1);
        (epoch, bytes)
    }

    /// A splicer restored from `snapshot` (see [`Splicer::import_state`]) and the changes of
    /// `log` after it (a log of another epoch is ignored; a torn last line is skipped with a
    /// warning), checked against the target as a whole.
    pub fn import_state_with_log(
        target: T,
        snapshot: &[u8],
        log: &[u8],
    ) -> Result<(Self, LogReplay), StateError> {
        let Some(mut saved) = SavedState::decode(snapshot)? else {
            if !log.is_empty() {
                log::info!("state log ignored: there is no snapshot for it to continue");
            }
            let replay = LogReplay {
                stale: !log.is_empty(),
                ..LogReplay::default()
            };
            return Ok((Splicer::new(target), replay));
        };
        let replay = replay_log(&mut saved, log)?;
        let sp = Splicer::restore(target, saved)?;
        Ok((sp, replay))
    }
}

/// Apply `log`'s change lines to `saved` if it continues `saved`'s epoch.
fn replay_log(saved: &mut SavedState, log: &[u8]) -> Result<LogReplay, StateError> {
    let mut replay = LogReplay::default();
    if log.is_empty() {
        return Ok(replay);
    }
    let mut lines = log.split_inclusive(|&b| b == b'\n').peekable();
    let header = lines.next().expect("a non-empty log has a first line");
    let header: Header = match serde_json::from_slice(header) {
        Ok(h) => h,
        Err(_) if !header.ends_with(b"\n") => {
            log::warn!("state log: its header was cut short; ignoring it");
            replay.torn = true;
            return Ok(replay);
        }
        Err(e) => return Err(StateError::LogLine { line: 1, source: e }),
    };
    if header.format != LOG_FORMAT {
        return Err(StateError::LogFormat {
            format: header.format,
        });
    }
    // An older log's keys are read as they meant then (a key `pid` was the thread).
    let _keys = read_as(header.version, Part::Log)?;
    replay.older = header.version < STATE_VERSION;
    if saved.epoch == 0 || header.epoch != saved.epoch {
        log::info!(
            "state log of epoch {:#x} ignored: the snapshot is of epoch {:#x}",
            header.epoch,
            saved.epoch
        );
        replay.stale = true;
        return Ok(replay);
    }
    let mut live: BTreeMap<SpliceId, LiveSplice> = std::mem::take(&mut saved.splices)
        .into_iter()
        .map(|s| (s.id, s))
        .collect();
    let mut number = 1;
    while let Some(line) = lines.next() {
        number += 1;
        let last = lines.peek().is_none();
        let change: Change = match serde_json::from_slice(line) {
            Ok(c) => c,
            // Only the last line can be cut short: every line is written whole and synced
            // before the next is begun.
            Err(e) if last && (!line.ends_with(b"\n") || e.is_eof()) => {
                log::warn!(
                    "state log: line {number} was cut short (a change interrupted before it reported success); skipping it"
                );
                replay.torn = true;
                break;
            }
            Err(e) => {
                return Err(StateError::LogLine {
                    line: number,
                    source: e,
                })
            }
        };
        let tables = compact::ReadTables {
            owners: change.owners,
            functions: change.functions,
        };
        let add = tables
            .splices(change.add)
            .map_err(|e| StateError::LogLine {
                line: number,
                source: serde::de::Error::custom(e),
            })?;
        for id in change.remove {
            live.remove(&id);
        }
        for s in add {
            live.insert(s.id, s);
        }
        saved.next_splice = change.next_splice;
        if let Some(meta) = change.meta {
            saved.components = meta.components;
            saved.orig = meta.orig;
            saved.retiring = meta.retiring;
        }
        replay.changes += 1;
    }
    saved.splices = live.into_values().collect();
    Ok(replay)
}

/// Why the state could not be written.
#[derive(Debug, thiserror::Error)]
pub enum StateLogError {
    #[error("state log {path}: {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the state snapshot")]
    Snapshot(#[source] TargetError),
}

/// How a save went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Nothing changed; nothing written.
    Unchanged,
    /// One change line of `bytes` appended to the log.
    Appended { bytes: u64 },
    /// A snapshot of `bytes` written and a new log begun.
    Compacted { bytes: u64 },
}

/// The log file of one state: its path and, when it may be appended to, the open file.
#[derive(Debug)]
pub struct StateLog {
    path: PathBuf,
    /// Open for appending; `None`: the next save compacts (no log yet, stale, torn, or an
    /// append failed).
    file: Option<File>,
    /// Bytes in the log (header included).
    log_len: u64,
    /// Bytes of the snapshot it continues.
    snapshot_len: u64,
    /// Change lines in the log.
    changes: u64,
    /// Snapshots written since the log was opened.
    compactions: u64,
}

impl StateLog {
    /// Read `path` (a missing file is an empty log) and restore the splicer from `snapshot`
    /// and it ([`Splicer::import_state_with_log`]). The log is appended to later only if it
    /// continues the snapshot and is whole; otherwise the next save compacts.
    pub fn load<T: Target>(
        path: &Path,
        target: T,
        snapshot: &[u8],
    ) -> Result<(Splicer<T>, StateLog, LogReplay), StateLoadError> {
        let io = |what| {
            move |source| StateLoadError::Io {
                path: path.to_owned(),
                what,
                source,
            }
        };
        let log = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io("reading")(e)),
        };
        let (sp, replay) = Splicer::import_state_with_log(target, snapshot, &log)?;
        // A log of an older version is read, not continued: the first save writes the state
        // anew in the current version (migrating it).
        let appendable = !log.is_empty() && !replay.torn && !replay.stale && !replay.older;
        let file = match appendable {
            true => Some(
                OpenOptions::new()
                    .append(true)
                    .open(path)
                    .map_err(io("opening to append"))?,
            ),
            false => None,
        };
        log::debug!(
            "state: snapshot {} bytes, log {} bytes with {} change(s){}",
            snapshot.len(),
            log.len(),
            replay.changes,
            if appendable {
                ""
            } else {
                " (compacted at the next change)"
            }
        );
        let state_log = StateLog {
            path: path.to_owned(),
            file,
            log_len: log.len() as u64,
            snapshot_len: snapshot.len() as u64,
            changes: replay.changes,
            compactions: 0,
        };
        Ok((sp, state_log, replay))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Change lines in the current log (0 after a compaction).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Snapshots written through this log.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Write what changed in `sp` since it was last written: one change line appended and
    /// synced, or (log missing, stale, torn, or grown larger than the snapshot) a compaction:
    /// the whole state handed to `put_snapshot` (with the target, where the snapshot may be
    /// kept), then a new empty log.
    pub fn save<T: Target>(
        &mut self,
        sp: &mut Splicer<T>,
        put_snapshot: impl FnOnce(&T, &[u8]) -> Result<(), TargetError>,
    ) -> Result<Saved, StateLogError> {
        let limit = self.snapshot_len.max(MIN_COMPACT_BYTES);
        // A line sure to take the log past the limit is not made: the save compacts anyway
        // (a coverage run's batch of thousands of sites, whose line would cost what the
        // snapshot costs).
        if self.file.is_some() && self.log_len + sp.state_change_least() <= limit {
            let Some(line) = sp.state_change() else {
                return Ok(Saved::Unchanged);
            };
            let len = line.len() as u64;
            if self.log_len + len <= limit {
                let file = self.file.as_mut().expect("checked above");
                let res = file.write_all(&line).and_then(|()| file.sync_data());
                if let Err(source) = res {
                    // Part of the line may be in the file: only a new snapshot and log are
                    // sure to say what is live now.
                    self.file = None;
                    return Err(StateLogError::Io {
                        path: self.path.clone(),
                        what: "appending a change",
                        source,
                    });
                }
                self.log_len += len;
                self.changes += 1;
                return Ok(Saved::Appended { bytes: len });
            }
        }
        self.compact(sp, put_snapshot)
    }

    /// Write the whole state of `sp` (`put_snapshot`) and begin a new, empty log after it.
    pub fn compact<T: Target>(
        &mut self,
        sp: &mut Splicer<T>,
        put_snapshot: impl FnOnce(&T, &[u8]) -> Result<(), TargetError>,
    ) -> Result<Saved, StateLogError> {
        // Until the new log is in place, a failure leaves the next save to compact again.
        self.file = None;
        let (epoch, snapshot) = sp.compact_state();
        put_snapshot(sp.target(), &snapshot).map_err(StateLogError::Snapshot)?;
        let io = |what| {
            let path = self.path.clone();
            move |source| StateLogError::Io { path, what, source }
        };
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io("creating its directory"))?;
        }
        let mut header = serde_json::to_vec(&Header {
            format: LOG_FORMAT.to_string(),
            version: STATE_VERSION,
            epoch,
        })
        .expect("a header always serializes");
        header.push(b'\n');
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        let mut f = File::create(&tmp).map_err(io("creating the new log"))?;
        f.write_all(&header)
            .and_then(|()| f.sync_data())
            .map_err(io("writing the new log"))?;
        std::fs::rename(&tmp, &self.path).map_err(io("renaming the new log into place"))?;
        let file = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(io("opening to append"))?;
        self.file = Some(file);
        self.log_len = header.len() as u64;
        self.snapshot_len = snapshot.len() as u64;
        self.changes = 0;
        self.compactions += 1;
        Ok(Saved::Compacted {
            bytes: (snapshot.len() + header.len()) as u64,
        })
    }
}

/// Why a state could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateLoadError {
    #[error("state log {path}: {what}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    State(#[from] StateError),
}

#[cfg(test)]
#[path = "state_log_tests.rs"]
mod tests;
