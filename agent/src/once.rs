//! `once` mode for coverage (`trapctl cover --process --mode once`): `TRAPVEC_ONCE_MS=N` starts
//! a thread of the agent that, every N milliseconds, reads the hits of the splices applied at
//! start and removes those hit since the last look in one batch (original bytes back), so a
//! block costs traps only until the next batch, then runs unspliced. A removed splice's hits
//! are kept here and reported in the stats with the state `disarmed`.
//!
//! Deferred splices (libraries loaded later) are left armed: they keep counting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Mutex;
use std::time::Duration;

use instr_manager::splicer::SpliceId;
use trapvec::error_chain;

use crate::{Slot, State};

/// The hits of each disarmed splice (by id), read when it was removed.
static DISARMED: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);
/// How many batches removed hit splices.
static BATCHES: AtomicU64 = AtomicU64::new(0);

/// The longest period taken: a larger `TRAPVEC_ONCE_MS` is a mistake, not a wish.
const MAX_PERIOD_MS: u64 = 60_000;

/// Why `TRAPVEC_ONCE_MS` was not used.
#[derive(Debug)]
pub(crate) enum OnceError {
    Period(String),
    Thread(std::io::Error),
}

impl std::fmt::Display for OnceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OnceError::Period(v) => write!(
                f,
                "TRAPVEC_ONCE_MS=`{v}` is not a number of milliseconds from 1 to {MAX_PERIOD_MS}"
            ),
            OnceError::Thread(e) => write!(f, "cannot start the once-mode thread: {e}"),
        }
    }
}

/// Start the disarming thread when `TRAPVEC_ONCE_MS` asks for it (after the spec was applied).
pub(crate) fn start_if_asked() -> Result<(), OnceError> {
    let Some(v) = std::env::var_os("TRAPVEC_ONCE_MS") else {
        return Ok(());
    };
    let text = v.to_string_lossy().into_owned();
    let ms = match text.parse::<u64>() {
        Ok(ms) if (1..=MAX_PERIOD_MS).contains(&ms) => ms,
        _ => return Err(OnceError::Period(text)),
    };
    *DISARMED.lock().unwrap_or_else(|e| e.into_inner()) = Some(HashMap::new());
    std::thread::Builder::new()
        .name("trapvec-once".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(ms));
            crate::with_state(disarm_hit);
        })
        .map(|_| ())
        .map_err(OnceError::Thread)
}

/// Remove, in one batch, every splice applied at start that was hit and is still live.
fn disarm_hit(state: &mut State) {
    let live: Vec<SpliceId> = state
        .slots
        .iter()
        .filter_map(|slot| match *slot {
            Slot::Now(i) => Some(SpliceId(state.applied[i].id)),
            Slot::Deferred(_) => None,
        })
        .filter(|id| state.splicer.get(*id).is_some())
        .collect();
    if live.is_empty() {
        return;
    }
    let Ok(hits) = state.splicer.hits_many(&live) else {
        return;
    };
    let hit: Vec<SpliceId> = live
        .iter()
        .zip(&hits)
        .filter(|(_, h)| h.hits > 0)
        .map(|(id, _)| *id)
        .collect();
    if hit.is_empty() {
        return;
    }
    match state.splicer.remove(&hit) {
        Ok(fin) => {
            let mut map = DISARMED.lock().unwrap_or_else(|e| e.into_inner());
            let map = map.get_or_insert_with(HashMap::new);
            for (id, h) in hit.iter().zip(fin) {
                map.insert(id.0, h.hits);
            }
            BATCHES.fetch_add(1, SeqCst);
            log::debug!("trapvec: once mode disarmed {} hit site(s)", hit.len());
        }
        // Left armed: they go on counting, and the next look tries again.
        Err(e) => log::warn!(
            "trapvec: once mode could not disarm {} hit site(s): {}",
            hit.len(),
            error_chain(&e)
        ),
    }
}

/// The hits splice `id` had when once mode removed it (`None` when it was not removed).
pub(crate) fn disarmed_hits(id: u64) -> Option<u64> {
    DISARMED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&id).copied())
}

/// How many batches removed hit splices (`None` when once mode is off).
pub(crate) fn batches() -> Option<u64> {
    DISARMED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some()
        .then(|| BATCHES.load(SeqCst))
}
