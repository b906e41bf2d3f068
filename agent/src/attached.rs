//! Deferred points of a spec applied over the control channel (`trapctl -p PID apply SPEC`): as
//! at start under `LD_PRELOAD` ([`crate::deferred`]), a point in a library that is not loaded
//! yet waits for the `dlopen` that loads it. An agent loaded by `trapctl -p PID attach` was not
//! preloaded, so the program's `dlopen`, `dlmopen` and `dlclose` reach the agent's through
//! their GOT slots ([`crate::got`]), hooked when the first deferred point is recorded and put
//! back by `detach`.

use std::sync::Once;

use instr_manager::ops::{ApplyReport, DaemonListing, ListReply, PendingRow, Reply};
use instr_manager::spec::Spec;
use trapvec::error_chain;

use crate::deferred::{self, DState, Deferred};
use crate::State;

/// Whether this agent was loaded by `trapctl -p PID attach` (not preloaded).
pub(crate) fn loaded_by_attach() -> bool {
    ATTACHED.load(std::sync::atomic::Ordering::SeqCst)
}

pub(crate) static ATTACHED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

static ACTIVATE: Once = Once::new();

/// Apply `spec` with its deferred points recorded: `None` when none of its points waits (the
/// ordinary path applies it), else the reply or the error.
pub(crate) fn apply(
    state: &mut State,
    spec: &Spec,
    best_effort: bool,
) -> Option<Result<Reply, String>> {
    let loaded = deferred::loaded_objects();
    let mut now = spec.clone();
    now.splices.clear();
    let mut later = Vec::new();
    for s in &spec.splices {
        match s
            .point()
            .ok()
            .and_then(|p| deferred::waits_for(&p, &loaded))
        {
            Some(object) => later.push(Deferred {
                request: s.clone(),
                object,
                state: DState::Pending,
                hits_before: 0,
                loads: 0,
            }),
            None => now.splices.push(s.clone()),
        }
    }
    if later.is_empty() {
        return None;
    }
    Some(apply_with(state, &now, later, best_effort))
}

fn apply_with(
    state: &mut State,
    now: &Spec,
    later: Vec<Deferred>,
    best_effort: bool,
) -> Result<Reply, String> {
    let (report, made): (ApplyReport, _) =
        instr_manager::ops::apply(&mut state.splicer, now, best_effort)
            .map_err(|e| error_chain(&e))?;
    // A deferred point's handler must be a function of a loaded component, checked now as at
    // start; on a refusal what this apply made is undone.
    for d in &later {
        if let Some(h) = d.request.action.symbol() {
            if let Err(e) = state.splicer.components().entry(h) {
                let why = format!("{}: handler `{h}`: {}", d.request.at, error_chain(&e));
                if let Err(u) = instr_manager::ops::undo(&mut state.splicer, &made) {
                    return Err(format!(
                        "{why}; undoing the rest failed: {}",
                        error_chain(&u)
                    ));
                }
                return Err(why);
            }
        }
    }
    for d in &later {
        log::debug!(
            "point `{}` waits for {} to be loaded",
            d.request.at,
            d.object
        );
    }
    state.deferred.extend(later);
    ACTIVATE.call_once(deferred::activate);
    if loaded_by_attach() {
        crate::got::hook_all();
    }
    Ok(Reply::Apply(report))
}

/// A listing with the deferred points as pending rows (`module` is the library waited for).
pub(crate) fn with_pending(state: &State, mut list: ListReply) -> ListReply {
    if state.deferred.is_empty() {
        return list;
    }
    let rows = state
        .deferred
        .iter()
        .map(|d| PendingRow {
            at: d.request.at.clone(),
            module: d.object.clone(),
            action: d.request.action.name().to_string(),
            state: match &d.state {
                DState::Pending => format!("pending ({} not loaded)", d.object),
                DState::Applied { origin, .. } => format!("armed in {origin}"),
                DState::Removed => format!("pending ({} unloaded)", d.object),
                DState::Failed(why) => format!("invalid: {why}"),
            },
            hits: d.hits(&state.splicer),
            loads: u64::from(d.loads),
        })
        .collect();
    list.daemon
        .get_or_insert_with(DaemonListing::default)
        .pending = Some(rows);
    list
}

/// At detach: the deferred points are forgotten (their live splices were removed with the
/// others) and the GOT slots put back.
pub(crate) fn forget(state: &mut State) {
    state.deferred.clear();
    if loaded_by_attach() {
        let n = crate::got::unhook_all();
        log::debug!("detach: {n} GOT slots put back");
    }
}
