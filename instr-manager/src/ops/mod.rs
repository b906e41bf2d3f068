//! The operations layer: everything a front end does to a running system, written once, over
//! any [`Target`].
//!
//! | operation | what it does |
//! |---|---|
//! | [`load`] | load a component and apply the splices it declares, in one batch |
//! | [`unload`] | remove a component's declared splices, then unload it (refused while in use) |
//! | [`splice`], [`splice_batch`] | make splices, all or nothing |
//! | [`unsplice`], [`unsplice_all`] | remove splices (finishing retiring ones first) |
//! | [`apply`] | a whole [`Spec`]: components, splices, variables; all or nothing, or best effort |
//! | [`check`] | plan every splice of a spec, changing nothing |
//! | [`switch`] | go from one set of splices to another in one text batch (a profile switch) |
//! | [`set`], [`get`] | write or read a component variable at its size |
//! | [`listing`] | live splices with their counters, components, retiring splices |
//! | [`hits`] | the counters alone of some or all live splices, only those hit enough |
//!
//! A front end's [`Request`] is executed by one function, [`execute`], which calls the
//! operation above and answers with a typed [`Reply`] (trapd sends its fields; trapctl prints
//! them, or reads them back from trapd with [`Reply::from_fields`]).
//!
//! The front ends are thin: `trapctl` (straight to `/dev/trapvec`, its state kept in the
//! module), `trapd` (the same operations on its socket and for its rules), the agent (a spec
//! before `main`, deferred splices at `dlopen`) and [`crate::session`] (RAII handles for a
//! process modifying itself). Each decides where a change is recorded and how a report is
//! shown; none decides what a change is.
//!
//! Every operation that changes the target is all or nothing by itself: a refused batch
//! changes nothing, a component whose declared splices are refused is unloaded again, a
//! variable written before a later step failed gets its old value back. It also returns what
//! it [`Made`], so that a caller who then cannot record the change (trapctl's state blob in the
//! module) can [`undo`] it exactly. Components are placed by one policy, [`near`].
//!
//! Reports are serializable: trapctl prints them, trapd sends them as its replies (and a
//! trapctl that went through trapd reads them back and prints them the same way).

// Errors are made at most once per operation, and they carry the splicer's errors whole.
#![allow(clippy::result_large_err)]

mod apply;
mod component;
mod execute;
pub mod expand;
pub mod reply;
mod report;
pub mod request;
mod splice;
mod var;

use component_manager::ComponentId;
use trapvec::{SymbolKind, Target};

use crate::splice::SpliceFormError;
use crate::splicer::{SpliceError, SpliceId, Splicer};
use crate::SpecError;

pub use apply::{apply, apply_as, check, switch, Rows, Switched};
pub(crate) use component::unload_id;
pub use component::{load, unload};
pub use execute::execute;
pub use reply::{
    Activated, DaemonListing, ForgotPending, ListReply, PendingSplice, Reply, Required,
    SpliceReply, Status, UnspliceReply, WrongReply,
};
pub use report::{
    ApplyReport, CheckReport, CheckRow, ComponentRow, GoneOwners, HitsReply, HitsRow, Listing,
    Loaded, PendingRow, Placed, SpliceRow, Timings, Unloaded, Unrecorded, Unspliced, UnsplicedAll,
    Var,
};
pub use request::{BadRequest, Request};
pub use splice::{hits, listing, splice, splice_batch, unsplice, unsplice_all, unsplice_orphans};
pub use var::{get, parse_u64, parse_value, set, var_size, NumberError, Value};

/// Why an operation was refused; each names its culprit.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Splice(#[from] SpliceError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("loading {path}")]
    Load {
        path: String,
        #[source]
        source: SpliceError,
    },
    #[error("{path}: a splice it declares was refused; nothing was loaded")]
    Declared {
        path: String,
        #[source]
        source: SpliceError,
    },
    #[error("component {component}: declared splice")]
    DeclaredForm {
        component: String,
        #[source]
        source: SpliceFormError,
    },
    #[error("no component named `{name}` is loaded ({})", loaded_list(.loaded))]
    NoComponent { name: String, loaded: Vec<String> },
    #[error("component `{name}` is used by the splice(s) at {}: unsplice them first", .users.join(", "))]
    InUse { name: String, users: Vec<String> },
    #[error("no splice at `{at}` ({})", live_list(.live))]
    NoSplice { at: String, live: Vec<String> },
    #[error("no live splice has id {} ({live} live); nothing was read", id_list(.ids))]
    NoSpliceId { ids: Vec<u64>, live: usize },
    #[error("set {symbol}")]
    Set {
        symbol: String,
        #[source]
        source: SpliceError,
    },
    #[error("size {0} is not 1, 2, 4 or 8")]
    Size(usize),
    #[error("`{symbol}` is {len} bytes long; size {size} would write past it")]
    PastEnd {
        symbol: String,
        len: usize,
        size: usize,
    },
    #[error(transparent)]
    Number(#[from] NumberError),
    /// A profile switch that had taken out the splices at the sites it hands over was refused,
    /// and they could not be made again: those functions run unspliced.
    #[error("{}; the splice(s) at {} that the switch had taken out could not be made again ({again}): they are no longer live", trapvec::error_chain(.refused), .lost.join(", "))]
    HandoverLost {
        refused: Box<SpliceError>,
        lost: Vec<String>,
        again: String,
    },
    #[error(transparent)]
    Glob(#[from] expand::ExpandError),
    #[error("`{op}` is answered by trapd only")]
    DaemonOnly { op: &'static str },
}

fn loaded_list(loaded: &[String]) -> String {
    if loaded.is_empty() {
        "none is".to_string()
    } else {
        format!("loaded: {}", loaded.join(", "))
    }
}

/// `ids` as `3, 9, 12`, the first ten and how many more.
fn id_list(ids: &[u64]) -> String {
    let mut s: Vec<String> = ids.iter().take(10).map(u64::to_string).collect();
    if ids.len() > 10 {
        s.push(format!("and {} more", ids.len() - 10));
    }
    s.join(", ")
}

fn live_list(live: &[String]) -> String {
    if live.is_empty() {
        "nothing is spliced".to_string()
    } else {
        format!("live: {}", live.join(", "))
    }
}

/// A variable an operation wrote, with the value it had before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub symbol: String,
    pub before: u64,
    pub size: usize,
}

/// What a change made, for [`undo`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Made {
    /// In the order made (for [`apply`]: the spec's splices in spec order, then the splices its
    /// components declare).
    pub splices: Vec<SpliceId>,
    pub components: Vec<ComponentId>,
    pub vars: Vec<Written>,
}

impl Made {
    pub fn is_empty(&self) -> bool {
        self.splices.is_empty() && self.components.is_empty() && self.vars.is_empty()
    }
}

/// Undo a change: its splices (one batch), its variables (old values, newest first), then its
/// components, newest first. Everything that can be undone is; the first failure is returned.
pub fn undo<T: Target>(sp: &mut Splicer<T>, made: &Made) -> Result<(), SpliceError> {
    let mut first = None;
    if !made.splices.is_empty() {
        if let Err(e) = sp.remove(&made.splices) {
            log::error!(
                "undoing {} splice(s): {}",
                made.splices.len(),
                trapvec::error_chain(&e)
            );
            first = Some(e);
        }
    }
    for w in made.vars.iter().rev() {
        if let Err(e) = sp.set_var(&w.symbol, w.before, w.size) {
            log::error!("restoring {}: {}", w.symbol, trapvec::error_chain(&e));
            first.get_or_insert(e);
        }
    }
    for &c in made.components.iter().rev() {
        if let Err(e) = sp.unload_component(c) {
            log::error!("undoing component {}: {}", c.0, trapvec::error_chain(&e));
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Undo `made` after `error`, logging (not returning) what cannot be undone, and give `error`
/// back: the one way every operation leaves nothing half applied.
fn undone<T: Target, E>(sp: &mut Splicer<T>, made: &Made, error: E) -> E {
    let _ = undo(sp, made);
    error
}

/// Where components go unless a caller says otherwise (the one placement policy): in a kernel,
/// near its text (`_stext`, else `_text`), within rel32 reach of all of it; in a process, near
/// the main executable's code (`main`, else its first function), where the program's own
/// functions are; 0 (anywhere the backend likes) for a target with none of these.
pub fn near(t: &dyn Target) -> u64 {
    let syms = t.symbols();
    syms.lookup("_stext")
        .or_else(|| syms.lookup("_text"))
        .or_else(|| syms.lookup("main"))
        .or_else(|| {
            syms.iter()
                .find(|s| s.kind == SymbolKind::Function && s.origin.is_none())
        })
        .map_or(0, |s| s.addr)
}

#[cfg(test)]
mod tests;
