//! What the operations report: rows of splices and components, and one report per operation,
//! serializable so that trapd can send them and trapctl print them the same way either route.

use std::collections::HashMap;

use component_manager::LoadedComponent;
use serde::{Deserialize, Serialize};

use crate::splicer::{Hits, LiveSplice};

/// A live splice as listed and reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpliceRow {
    pub id: u64,
    /// The point as written when spliced.
    pub at: String,
    /// The site's address, `0x...`.
    pub site: String,
    pub function: String,
    /// The site's offset in `function`.
    pub offset: u64,
    pub mechanism: String,
    /// The action as text, with its task predicate: `count (only tgid 42)`.
    pub action: String,
    /// The handler or replacement, if any.
    pub symbol: Option<String>,
    /// The displaced instructions, Intel syntax, `; `-separated.
    pub displaced: String,
    pub hits: u64,
    /// Traps taken while a handler was already running on that CPU (handler skipped).
    pub missed: u64,
    /// trapd only: whether the active profile has this splice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_profile: Option<bool>,
    /// A return point's or timer's figures: returns, calls missed (no instance, `maxactive`,
    /// reentry, left without returning), calls in progress, the timer's histogram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returns: Option<trapvec::returns::ReturnStats>,
    /// A keyed count's key (`count --by KEY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<trapvec::keyed::KeyBy>,
    /// A keyed count's table: every key with its hits, most first, and the overflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<trapvec::keyed::KeyCounts>,
    /// The command holding this splice for its own length (`trapctl count`, `trapctl time`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::owner::Owner>,
    /// Its owner is gone (killed without removing it), or its handler is in the component of a
    /// `trapctl trace` that is gone: `trapctl unsplice --orphans` removes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub orphaned: bool,
    /// The component its handler is in, by name (`trace_PID` for a `trapctl trace`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
}

/// Whether splices' owners have ended ([`crate::owner::Owner::is_gone`]), asked once per owner
/// (pid and start time) for a whole set of rows: the 10,000 rows of one `trapctl cover` batch
/// read its `/proc/PID/stat` 10,000 times, a third of the report's time on a host.
#[derive(Default)]
pub struct GoneOwners(HashMap<(u32, u64), bool>);

impl GoneOwners {
    pub fn is_gone(&mut self, owner: &crate::owner::Owner) -> bool {
        *self
            .0
            .entry((owner.pid, owner.start))
            .or_insert_with(|| owner.is_gone())
    }
}

impl SpliceRow {
    pub fn of(s: &LiveSplice, hits: Hits) -> SpliceRow {
        Self::of_with(s, hits, &mut GoneOwners::default())
    }

    /// [`SpliceRow::of`], asking whether owners have ended through `gone` (one of a set of
    /// rows).
    pub fn of_with(s: &LiveSplice, hits: Hits, gone: &mut GoneOwners) -> SpliceRow {
        SpliceRow {
            id: s.id.0,
            at: s.request.at.clone(),
            site: format!("{:#x}", s.point.site),
            function: s.point.function.name.clone(),
            offset: s.point.site - s.point.function.addr,
            mechanism: s.plan.mechanism.to_string(),
            action: match s.request.options.only.is_empty() {
                true => s.request.action.to_string(),
                false => format!("{} (only {})", s.request.action, s.request.options.only),
            },
            symbol: s.request.action.symbol().map(str::to_string),
            displaced: s.plan.displaced_text.to_string(),
            hits: hits.hits,
            missed: hits.missed,
            in_profile: None,
            returns: None,
            by: s.request.options.by,
            keys: None,
            owner: s.request.options.owner.clone(),
            orphaned: s
                .request
                .options
                .owner
                .as_ref()
                .is_some_and(|o| gone.is_gone(o)),
            component: None,
        }
    }
}

/// A loaded component as listed and reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentRow {
    pub id: u64,
    pub name: String,
    pub path: Option<String>,
    /// CRC32 of the object file, `0x%08x`.
    pub crc32: String,
    pub code: String,
    pub code_len: usize,
    pub data: String,
    pub data_len: usize,
    /// Symbols it takes from the kernel or other components.
    pub imports: usize,
    /// Splices and components that use it.
    pub refs: usize,
}

impl ComponentRow {
    pub fn of(c: &LoadedComponent) -> ComponentRow {
        ComponentRow {
            id: u64::from(c.id.0),
            name: c.name.clone(),
            path: c.path.as_ref().map(|p| p.display().to_string()),
            crc32: format!("{:#010x}", c.file_crc32),
            code: format!("{:#x}", c.code_addr),
            code_len: c.code_len,
            data: format!("{:#x}", c.data_addr),
            data_len: c.data.size,
            imports: c.imports.len(),
            refs: c.refs(),
        }
    }
}

/// Everything live: splices with their counters, components.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub splices: Vec<SpliceRow>,
    pub components: Vec<ComponentRow>,
    /// Splices whose removal waits for a task to leave their code: original bytes back, code
    /// not freed yet (`trapctl unsplice AT` again finishes them). Hits as last read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retiring: Vec<SpliceRow>,
}

/// The answer to `hits`: the splices asked about that had the hits, and how many were read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HitsReply {
    /// By id.
    pub splices: Vec<HitsRow>,
    /// Splices whose counters were read (those named, or every live one).
    pub read: usize,
}

/// One splice's hits, as `hits` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HitsRow {
    pub id: u64,
    /// The site's address, `0x...` (as a listing's `site`).
    pub site: String,
    pub hits: u64,
}

/// A dispatch entry the module lists that no recorded state describes (trapd's `list`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unrecorded {
    pub site: String,
    pub dest: String,
    pub hits: u64,
}

/// What `load` made: the component, and the splices it declares (applied with it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    pub component: ComponentRow,
    pub spliced: Vec<SpliceRow>,
}

/// What `unload` did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unloaded {
    pub name: String,
    /// How many of its own declared splices were removed with it.
    pub declared_removed: usize,
}

/// A removed splice and its final counters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unspliced {
    pub at: String,
    pub site: String,
    pub hits: u64,
    pub missed: u64,
}

/// What `unsplice --all` (or a glob) removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsplicedAll {
    pub unspliced: Vec<Unspliced>,
    /// trapd's pending points a glob matched, forgotten (none elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forgot: Vec<super::reply::ForgotPending>,
}

/// Where the time of a batch went, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub splices: usize,
    pub plan_ms: f64,
    /// Of `plan_ms`, the target's checks of the windows (the kernel module's CHECK per window).
    #[serde(default)]
    pub check_ms: f64,
    pub build_ms: f64,
    pub commit_ms: f64,
}

/// What `apply` made; `refused` (best effort only) has each refused splice with its reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApplyReport {
    pub components: Vec<ComponentRow>,
    /// The spec's splices in spec order, then those its components declare (none for a
    /// `brief` apply: `placed` instead).
    pub spliced: Vec<SpliceRow>,
    /// A `brief` apply's splices, in the same order, by id, point and site only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<Placed>,
    pub refused: Vec<String>,
    /// Why each of `refused` was refused, in its order: its cause's fixed sentence (the same
    /// for every point refused for it), or its own text without the point when it has no cause.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_reasons: Vec<String>,
    /// The cause of each of `refused`, in its order ([`crate::RefusalCause::name`]:
    /// `too_short`, `kernel_jump_label`), `null` for an error that has none: the kind that
    /// `trapctl points`, `trapctl cover` and the summaries group refusals by.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_causes: Vec<Option<String>>,
    /// `refused` grouped by reason, one line each (specs with globs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<super::expand::RefusalGroup>,
    /// How many splices the spec has (a glob counts as every function it matches).
    pub requested: usize,
    pub timings: Option<Timings>,
}

/// A splice made, as a `brief` apply reports it: the id, the point as written, the site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    pub id: u64,
    pub at: String,
    /// The site's address, `0x...`.
    pub site: String,
}

/// A splice `check` found possible.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRow {
    pub at: String,
    pub site: String,
    pub mechanism: String,
    pub displaced: String,
}

/// What `apply --check` found: the splices that would be made and those that would be refused.
/// The list of possible splices is `possible` on the wire: a reply's envelope has its own
/// `"ok": true`, which a field named `ok` replaced (trapd's answer to a check then read as a
/// refusal).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    #[serde(rename = "possible")]
    pub ok: Vec<CheckRow>,
    pub refused: Vec<String>,
}

/// A variable's value as read or written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Var {
    pub symbol: String,
    pub value: u64,
    pub size: usize,
}

/// A pending point (trapd's: a splice in a kernel module that is not loaded) as `list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRow {
    pub at: String,
    pub module: String,
    /// `count`, `call`, `replace`, `time`.
    pub action: String,
    /// `pending (module MOD not loaded)`, `armed`, or `invalid: why`.
    pub state: String,
    /// Hits of every load so far, the live one included.
    pub hits: u64,
    pub loads: u64,
}
