//! A splicer's bookkeeping, saved and restored: what a one-shot tool (`trapctl`) leaves behind
//! for the next one, and what a daemon restarts from.
//!
//! The state is JSON: the loaded components (name, path, CRCs, blocks, symbols, imports,
//! stubs, references), the live splices (request, resolved point, plan summary, site and
//! springboard patches, code and data blocks, entry, replay, dispatch entry, component) and the
//! original-trampoline stubs. It describes effects that live in the target, so the target is
//! the truth: [`Splicer::import_state`] checks every claim it can against the target before
//! trusting any of them — each dispatch entry is listed by the target with the same
//! destination, handler and cookie; the bytes at every site and springboard are the patch's new
//! bytes; every component's code still has the CRC it was written with. A mismatch is a
//! [`StateError`] naming the splice or component; nothing is repaired silently.
//!
//! This is the *snapshot*; [`super::state_log`] keeps the changes after one in an append-only
//! log, so that a change does not rewrite every live splice. Format version 2 adds the snapshot's
//! `epoch` (the log that continues it names it); version 1, the whole-file format from before the
//! log, is still read (as a snapshot no log continues). Version 3 saves a plain count splice as
//! a compact array ([`compact`]); versions 1 and 2, every splice whole, are read as they are.
//! Version 4's array keeps the displaced window's bytes instead of their text and addresses,
//! and leaves out what the function's name and the site's offset give (about half the size); a
//! version-3 array is read, its window's bytes read back from the target. Version 5 is version 4
//! with a keyed count's key `pid` meaning the process (it was the thread, now `tid`): a state of
//! an older version reads its keys as they meant then ([`crate::splice::OldKeys`]). Version 6
//! saves a count splice that has an owner (every site of `trapctl cover`) compact too, and
//! writes each distinct owner, and each function several arrays share, once per snapshot (and
//! once per change line that uses it), in the tables `owners` and `functions`, the arrays
//! holding indexes into them ([`compact`]: about 1,130 bytes per owned coverage site before,
//! under 100 now); an unowned count site's array is as version 5 wrote it, and a state of
//! version 5 is read as it is.

use std::collections::{BTreeMap, HashMap, HashSet};

use component_manager::{ComponentError, ComponentManager};
use serde::{Deserialize, Serialize};
use trapvec::error::hex;
use trapvec::{DispatchEntry, Target, TargetError, TargetExt};

use super::state_log::LiveMap;

pub(super) mod compact;
use super::{LiveSplice, OrigStub, Retiring, SpliceId, Splicer, DEFAULT_QUIESCE_TIMEOUT};

/// Version of the state format (snapshot and log) written; a state of another version than
/// this or one of the older ones below is refused.
pub const STATE_VERSION: u32 = 6;

/// The first version whose key `pid` is the process, and the last without the tables of
/// owners and functions: its arrays are version 4's (the function inline), an owned count
/// splice is whole. Read, and its log continued until the next snapshot writes version
/// [`STATE_VERSION`].
pub const STATE_VERSION_PROCESS_PID: u32 = 5;

/// The last version whose key `pid` is the thread (`tid` now) and `tgid` the process (`pid`
/// now): read, its keys migrated, and its log continued until the next snapshot writes version
/// [`STATE_VERSION`].
pub const STATE_VERSION_THREAD_PID: u32 = 4;

/// The version of the first compact records: read, and its log continued until the next
/// snapshot writes version [`STATE_VERSION`].
pub const STATE_VERSION_COMPACT3: u32 = 3;

/// The version before compact records (every splice whole): read, and its log continued until
/// the next snapshot writes version [`STATE_VERSION`].
pub const STATE_VERSION_FULL_RECORDS: u32 = 2;

/// The whole-file format from before the log: read as a snapshot of epoch 0.
pub const STATE_VERSION_WHOLE: u32 = 1;

/// Why a saved state cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the saved state is not a valid splicer state")]
    Decode(#[from] serde_json::Error),
    #[error(
        "the saved state has format version {found}; this program reads version {STATE_VERSION}"
    )]
    Version { found: u32 },
    #[error("saved splice `{at}` (site {site:#x}) has no dispatch entry in the target: the state does not describe this target")]
    MissingDispatch { at: String, site: u64 },
    #[error("saved splice `{at}` (site {site:#x}): the target's dispatch entry goes to {found_dest:#x} (handler {found_handler:#x}), the state says {dest:#x} (handler {handler:#x})")]
    DispatchDiffers {
        at: String,
        site: u64,
        dest: u64,
        handler: u64,
        found_dest: u64,
        found_handler: u64,
    },
    #[error("saved splice `{at}`: {what} at {addr:#x} holds {found}, not the patched bytes {expected}: the text was changed behind trapvec's back")]
    TextDiffers {
        at: String,
        what: &'static str,
        addr: u64,
        expected: String,
        found: String,
    },
    #[error("saved retiring splice `{at}`: the site {addr:#x} holds {found}, not its original bytes {expected}: the text was changed behind trapvec's back")]
    RetiringTextDiffers {
        at: String,
        addr: u64,
        expected: String,
        found: String,
    },
    #[error("saved component `{name}`")]
    Component {
        name: String,
        #[source]
        source: Box<ComponentError>,
    },
    #[error("checking the saved state against the target")]
    Target(#[from] TargetError),
    #[error("state log line {line} is not a valid change (only the last line may be cut short)")]
    LogLine {
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "the state log is of format `{format}`, not `{}`",
        super::state_log::LOG_FORMAT
    )]
    LogFormat { format: String },
}

/// The serialized form (field order is the JSON's), as written...
#[derive(Serialize)]
struct SavedStateRef<'a> {
    version: u32,
    epoch: u64,
    next_splice: u64,
    /// The tables the compact records index ([`compact`]), before them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    owners: Vec<&'a crate::owner::Owner>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    functions: Vec<compact::FunctionRow>,
    components: &'a ComponentManager,
    splices: Vec<compact::RecordRef<'a>>,
    orig: BTreeMap<&'a str, &'a OrigStub>,
    retiring: Vec<&'a Retiring>,
}

/// ...and as read back (its splices from their records through the snapshot's tables).
#[derive(Deserialize)]
#[serde(try_from = "RawSavedState")]
pub(super) struct SavedState {
    pub(super) version: u32,
    /// The log that continues this snapshot names this epoch; 0 (and absent, in version 1):
    /// none does.
    #[serde(default)]
    pub(super) epoch: u64,
    pub(super) next_splice: u64,
    pub(super) components: ComponentManager,
    pub(super) splices: Vec<LiveSplice>,
    /// Original-trampoline stubs by function name, sorted for a stable output.
    pub(super) orig: BTreeMap<String, OrigStub>,
    /// Splices whose removal waits for quiescence (absent in states without any).
    pub(super) retiring: Vec<Retiring>,
}

/// A snapshot as it is in the JSON: the records of its splices not yet expanded.
#[derive(Deserialize)]
struct RawSavedState {
    version: u32,
    #[serde(default)]
    epoch: u64,
    next_splice: u64,
    /// The tables (absent before version 6, and when empty).
    #[serde(default)]
    owners: Vec<crate::owner::Owner>,
    #[serde(default)]
    functions: Vec<compact::FunctionRow>,
    components: ComponentManager,
    splices: Vec<compact::Record>,
    orig: BTreeMap<String, OrigStub>,
    #[serde(default)]
    retiring: Vec<Retiring>,
}

impl TryFrom<RawSavedState> for SavedState {
    type Error = String;
    fn try_from(raw: RawSavedState) -> Result<Self, String> {
        Ok(SavedState {
            version: raw.version,
            epoch: raw.epoch,
            next_splice: raw.next_splice,
            components: raw.components,
            splices: compact::ReadTables {
                owners: raw.owners,
                functions: raw.functions,
            }
            .splices(raw.splices)?,
            orig: raw.orig,
            retiring: raw.retiring,
        })
    }
}

impl SavedState {
    /// The snapshot in `bytes`, of a version this program reads; `None` if empty.
    pub(super) fn decode(bytes: &[u8]) -> Result<Option<SavedState>, StateError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        let version = version_of(bytes)?;
        let _keys = read_as(version, Part::Snapshot)?;
        let saved: SavedState = serde_json::from_slice(bytes)?;
        // The version the keys were read by is the snapshot's (one written twice is not).
        if saved.version != version {
            return Err(StateError::Version {
                found: saved.version,
            });
        }
        Ok(Some(saved))
    }
}

/// What a saved state's version is read as: a snapshot or a log's header.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Snapshot,
    Log,
}

/// Start reading a snapshot or a log of `version`, the one place that says which versions
/// this program reads: [`STATE_VERSION`] and the older ones it migrates, and for a snapshot
/// also [`STATE_VERSION_WHOLE`] (from before the log: no log is of it). While the guard lives,
/// the splices read on this thread have the keys of that version (before version 5, a key
/// `pid` was the thread: [`crate::splice::OldKeys`]).
pub(super) fn read_as(version: u32, part: Part) -> Result<crate::splice::OldKeys, StateError> {
    let read = match version {
        STATE_VERSION
        | STATE_VERSION_PROCESS_PID
        | STATE_VERSION_THREAD_PID
        | STATE_VERSION_COMPACT3
        | STATE_VERSION_FULL_RECORDS => true,
        STATE_VERSION_WHOLE => part == Part::Snapshot,
        _ => false,
    };
    if !read {
        return Err(StateError::Version { found: version });
    }
    Ok(crate::splice::OldKeys::when(
        version < STATE_VERSION_PROCESS_PID,
    ))
}

/// A snapshot's version, known before its splices are read (their keys depend on it). Every
/// version writes it first (`{"version":N,`), read there; a snapshot written otherwise is read
/// once for it alone.
fn version_of(bytes: &[u8]) -> Result<u32, serde_json::Error> {
    if let Some(rest) = bytes.strip_prefix(b"{\"version\":") {
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if rest.get(digits) == Some(&b',') {
            let text = std::str::from_utf8(&rest[..digits]).unwrap_or_default();
            if let Ok(v) = text.parse() {
                return Ok(v);
            }
        }
    }
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    Ok(serde_json::from_slice::<Version>(bytes)?.version)
}

impl<T: Target> Splicer<T> {
    /// Everything this splicer made, as JSON (see the module docs): a snapshot no log
    /// continues (epoch 0). [`Splicer::compact_state`] makes one a log continues.
    pub fn export_state(&self) -> Vec<u8> {
        self.snapshot_bytes(0)
    }

    /// The snapshot of epoch `epoch`.
    pub(super) fn snapshot_bytes(&self, epoch: u64) -> Vec<u8> {
        let mut tables = compact::Tables::default();
        let mut splices: Vec<_> = self.live.values().map(|s| tables.record(s)).collect();
        let tables = tables.finish(&mut splices);
        let saved = SavedStateRef {
            version: STATE_VERSION,
            epoch,
            next_splice: self.next,
            owners: tables.owners,
            functions: tables.functions,
            components: &self.components,
            splices,
            orig: self.orig.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            retiring: self.retiring.values().collect(),
        };
        // Every field is a plain struct, string, number or map with string keys.
        serde_json::to_vec(&saved).expect("the splicer state always serializes")
    }

    /// A splicer over `target` that takes over what `state` (from [`Splicer::export_state`])
    /// says was made, after checking it against the target. An empty `state` is a fresh
    /// splicer.
    pub fn import_state(target: T, state: &[u8]) -> Result<Self, StateError> {
        match SavedState::decode(state)? {
            None => Ok(Splicer::new(target)),
            Some(saved) => Splicer::restore(target, saved),
        }
    }

    /// A splicer over `target` that takes over `saved`, after checking it against the target.
    pub(super) fn restore(target: T, mut saved: SavedState) -> Result<Self, StateError> {
        check_against_target(&target, &saved)?;
        read_displaced_bytes(&target, &mut saved.splices)?;
        let live: BTreeMap<SpliceId, Box<LiveSplice>> = saved
            .splices
            .into_iter()
            .map(|s| (s.id, Box::new(s)))
            .collect();
        let orig: HashMap<String, OrigStub> = saved.orig.into_iter().collect();
        let retiring: BTreeMap<SpliceId, Retiring> = saved
            .retiring
            .into_iter()
            .map(|r| (r.splice.id, r))
            .collect();
        log::debug!(
            "state restored: {} component(s), {} splice(s), {} retiring, {} original trampoline(s)",
            saved.components.iter().count(),
            live.len(),
            retiring.len(),
            orig.len()
        );
        // What was read is what was written last: the next change line carries only what
        // changes after this.
        let meta = super::state_log::digest_of(&saved.components, &orig, &retiring);
        Ok(Splicer {
            target,
            components: saved.components,
            live: LiveMap::restored(live, Some(meta)),
            orig,
            retiring,
            quiesce_timeout: DEFAULT_QUIESCE_TIMEOUT,
            next: saved.next_splice,
            last_batch: None,
        })
    }
}

/// Fill in the displaced window's bytes of splices saved without them (before version 4),
/// from the target: the original bytes under the patch, then the code after it (which no
/// splice changes: displaced windows are disjoint), as a decoder sees it (another tool's armed
/// kprobe there is read as the byte it saved). A state of version 4 reads nothing here.
fn read_displaced_bytes<T: Target>(
    target: &T,
    splices: &mut [LiveSplice],
) -> Result<(), StateError> {
    for s in splices
        .iter_mut()
        .filter(|s| s.plan.displaced_bytes.is_empty())
    {
        let (old, len) = (&s.site_patch.old, s.plan.displaced_len);
        let mut bytes = old.clone();
        if len > old.len() {
            bytes.extend(target.read_code(s.site_patch.addr + old.len() as u64, len - old.len())?);
        }
        s.plan.displaced_bytes = bytes;
    }
    Ok(())
}

/// The checks of [`Splicer::import_state`].
fn check_against_target<T: Target>(target: &T, saved: &SavedState) -> Result<(), StateError> {
    if let Some(listed) = target.dispatch_entries() {
        let listed: HashMap<u64, DispatchEntry> =
            listed?.into_iter().map(|e| (e.site, e)).collect();
        let mut ours = HashSet::new();
        for s in &saved.splices {
            let Some(want) = s.dispatch else { continue };
            ours.insert(want.site);
            let at = s.request.at.clone();
            let got = listed.get(&want.site).ok_or(StateError::MissingDispatch {
                at: at.clone(),
                site: want.site,
            })?;
            if *got != want {
                return Err(StateError::DispatchDiffers {
                    at,
                    site: want.site,
                    dest: want.dest,
                    handler: want.handler,
                    found_dest: got.dest,
                    found_handler: got.handler,
                });
            }
        }
        let foreign = listed.keys().filter(|k| !ours.contains(*k)).count();
        if foreign > 0 {
            log::warn!("the target has {foreign} dispatch entries that the saved state does not know (another client's)");
        }
    }
    // A retiring splice's site holds the original bytes again; its springboard (restored after
    // quiescence) still holds the jmp.
    for r in &saved.retiring {
        let s = &r.splice;
        let found = target.read(s.site_patch.addr, s.site_patch.old.len())?;
        if found != s.site_patch.old {
            return Err(StateError::RetiringTextDiffers {
                at: s.request.at.clone(),
                addr: s.site_patch.addr,
                expected: hex(&s.site_patch.old),
                found: hex(&found),
            });
        }
        if let Some(p) = &s.springboard_patch {
            let found = target.read(p.addr, p.new.len())?;
            if found != p.new {
                return Err(StateError::TextDiffers {
                    at: s.request.at.clone(),
                    what: "the retiring splice's springboard",
                    addr: p.addr,
                    expected: hex(&p.new),
                    found: hex(&found),
                });
            }
        }
    }
    for s in &saved.splices {
        let patches = std::iter::once(("the site", &s.site_patch))
            .chain(s.springboard_patch.as_ref().map(|p| ("the springboard", p)));
        for (what, p) in patches {
            let found = target.read(p.addr, p.new.len())?;
            if found != p.new {
                return Err(StateError::TextDiffers {
                    at: s.request.at.clone(),
                    what,
                    addr: p.addr,
                    expected: hex(&p.new),
                    found: hex(&found),
                });
            }
        }
    }
    for c in saved.components.iter() {
        saved
            .components
            .verify(target, c.id)
            .map_err(|e| StateError::Component {
                name: c.name.clone(),
                source: Box::new(e),
            })?;
    }
    Ok(())
}
