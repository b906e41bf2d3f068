//! `libtrapvec_agent.so`: splice a running, dynamically linked program without recompiling it.
//!
//! `LD_PRELOAD=libtrapvec_agent.so TRAPVEC_SPEC=spec.toml ./program`: before `main`, the agent
//! loads the spec's components and applies its splices in one batch. A spec that cannot be
//! applied is reported on stderr and the program exits with status 86 before `main`, with nothing
//! applied. A point in a library that is not loaded yet waits for its `dlopen` ([`deferred`]).
//! The JSON file named by `TRAPVEC_STATS` (`%p` in it becomes the pid) is written at `exit`, at
//! `_exit`/`_Exit` and before every `exec`, one entry per splice in spec order:
//! `{"splices": [{"at": "...", "mechanism": "trap"|"jmp", "hits": N, "state": "applied"}, ...]}`
//! (then the splices the spec's components declare in `.trapvec.splices`, applied with them);
//! a deferred splice's state is `pending`, `applied`, `removed` (its library was unloaded) or
//! `failed` (with `"error"`), its hits are summed over every time it was applied, and `loads`
//! says how many times that was.
//! `TRAPVEC_ONCE_MS=N` (coverage's once mode, [`once`]): every N ms the splices applied at start
//! that were hit are removed in one batch; their stats entry says `disarmed`.
//! Logging: `TRAPVEC_LOG=debug` (env_logger syntax).
//!
//! The agent owns the process's trap signals ([`signals`]): it interposes the libc functions
//! that change signal dispositions and masks, so SIGSEGV and SIGTRAP stay unblocked in every
//! thread and the program's own handlers for them are recorded and chained behind trapvec's.
//! Children ([`children`]): an exec'd program does not inherit the spec unless
//! `TRAPVEC_INHERIT=1`; a forked child keeps its splices, on a private copy of the repository.
//! `posix_spawn(p)`, `system`, `popen`/`pclose` and `vfork` are the agent's ([`spawn`]): glibc's
//! run their child in the parent's spliced memory with its handlers reset, where a trap kills it.
//!
//! Nothing here must run the agent's machinery when no spec was given: every interposer passes
//! straight through to libc until trapvec's handlers are installed.

#![allow(clippy::missing_safety_doc)] // the interposers have libc's contracts, documented there.

mod attached;
mod children;
mod control;
mod deferred;
mod got;
mod once;
mod real;
mod signals;
mod spawn;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use instr_manager::ops::{self, SpliceRow};
use instr_manager::spec::Spec;
use instr_manager::splicer::{SpliceId, Splicer};
use trapvec::error_chain;
use trapvec::process::ProcessTarget;

/// Exit status of a program whose spec could not be applied.
pub const EXIT_SPEC_FAILED: i32 = 86;

struct State {
    splicer: Splicer<ProcessTarget>,
    /// The splices applied before `main`: the spec's (those not deferred), then the ones its
    /// components declare.
    applied: Vec<SpliceRow>,
    /// Splices waiting for, or living in, libraries loaded by `dlopen`.
    deferred: Vec<deferred::Deferred>,
    /// The spec's splices in spec order.
    slots: Vec<Slot>,
}

/// Where one splice of the spec is recorded.
#[derive(Clone, Copy)]
enum Slot {
    /// Index into `State::applied` (applied before `main`).
    Now(usize),
    /// Index into `State::deferred`.
    Deferred(usize),
}

/// Run `f` on the agent's state, if a spec was applied (the thread marked as inside the agent,
/// so the agent's own calls of interposed functions go straight to libc).
fn with_state(f: impl FnOnce(&mut State)) {
    deferred::as_agent(|| {
        let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = guard.as_mut() {
            f(state);
        }
    });
}

/// Run `f` on the agent's state, making it (an empty one, with a new process backend) first
/// when there is none and `create` (a request of the control channel).
pub(crate) fn with_state_or_new<R>(f: impl FnOnce(Option<&mut State>) -> R, create: bool) -> R {
    deferred::as_agent(|| {
        let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() && create {
            match ProcessTarget::new() {
                Ok(target) => {
                    *guard = Some(State {
                        splicer: Splicer::new(target),
                        applied: Vec::new(),
                        deferred: Vec::new(),
                        slots: Vec::new(),
                    })
                }
                Err(e) => log::warn!(
                    "trapvec: cannot start the process backend: {}",
                    error_chain(&e)
                ),
            }
        }
        f(guard.as_mut())
    })
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// `TRAPVEC_STATS` as given (before `%p` expansion).
static STATS: OnceLock<String> = OnceLock::new();
/// The process that applied the spec.
static INIT_PID: AtomicU32 = AtomicU32::new(0);
/// The latest fork child of that process (or of one of its fork children), set in the child.
static FORK_PID: AtomicU32 = AtomicU32::new(0);

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = trapvec_agent_init;

extern "C" fn trapvec_agent_init() {
    spawn::prepare();
    let Some(spec_path) = std::env::var_os("TRAPVEC_SPEC") else {
        start_control_if_asked();
        return;
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("TRAPVEC_LOG", "warn"))
        .try_init();
    real::resolve_all();
    deferred::note_seccomp_at_start();
    children::forget_spec_for_exec();
    let spec_path = std::path::PathBuf::from(spec_path);
    let result = (|| -> Result<State, String> {
        let spec = Spec::from_path(&spec_path).map_err(|e| error_chain(&e))?;
        let target = ProcessTarget::new().map_err(|e| error_chain(&e))?;
        let mut splicer = Splicer::new(target);
        // Points in libraries not loaded yet wait for their dlopen; the others are applied now.
        let loaded = deferred::loaded_objects();
        let mut now = spec.clone();
        now.splices.clear();
        let mut later = Vec::new();
        let mut slots = Vec::with_capacity(spec.splices.len());
        for s in &spec.splices {
            // A spec's points parse (Spec::parse checked them); one that did not would be
            // refused with its reason by the splicer below.
            match s
                .point()
                .ok()
                .and_then(|point| deferred::waits_for(&point, &loaded))
            {
                Some(object) => {
                    log::debug!("point `{}` waits for {object} to be loaded", s.at);
                    slots.push(Slot::Deferred(later.len()));
                    later.push(deferred::Deferred {
                        request: s.clone(),
                        object,
                        state: deferred::DState::Pending,
                        hits_before: 0,
                        loads: 0,
                    });
                }
                None => {
                    slots.push(Slot::Now(now.splices.len()));
                    now.splices.push(s.clone());
                }
            }
        }
        // The spec's components are loaded as every front end loads them (`ops`): the splices
        // they declare go live with them, listed in the stats after the spec's own.
        let (report, _) = ops::apply(&mut splicer, &now, false).map_err(|e| error_chain(&e))?;
        let applied = report.spliced;
        slots.extend((now.splices.len()..applied.len()).map(Slot::Now));
        // A deferred point is checked now as far as it can be: its handler must be a function
        // of a loaded component (the process exits here on an error: nothing to undo).
        for d in &later {
            if let Some(h) = d.request.action.symbol() {
                splicer
                    .components()
                    .entry(h)
                    .map_err(|e| format!("{}: handler `{h}`: {}", d.request.at, error_chain(&e)))?;
            }
        }
        for row in &applied {
            if let Some(s) = splicer.get(SpliceId(row.id)) {
                if let Some(w) = spawn::taken_over_warning(
                    &row.at,
                    &s.point.function.name,
                    s.point.function.origin.as_deref(),
                ) {
                    eprintln!("{w}");
                }
            }
        }
        Ok(State {
            splicer,
            applied,
            deferred: later,
            slots,
        })
    })();
    match result {
        Ok(state) => {
            log::info!(
                "trapvec: applied {} splices from {} ({} waiting for their library)",
                state.applied.len(),
                spec_path.display(),
                state.deferred.len()
            );
            let has_deferred = !state.deferred.is_empty();
            *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
            if has_deferred {
                deferred::activate();
            }
            if let Ok(path) = std::env::var("TRAPVEC_STATS") {
                let _ = STATS.set(path);
            }
            INIT_PID.store(std::process::id(), SeqCst);
            spawn::activate();
            if let Err(e) = once::start_if_asked() {
                eprintln!("trapvec: {e}; every site stays armed");
            }
            start_control_if_asked();
            // SAFETY: registering plain extern "C" functions with no arguments.
            unsafe {
                libc::atexit(trapvec_agent_exit);
                libc::pthread_atfork(None, None, Some(after_fork_in_child));
            }
        }
        Err(e) => {
            eprintln!("trapvec: cannot apply {}: {e}", spec_path.display());
            // SAFETY: leaving before main, without running the program's destructors.
            unsafe { libc::_exit(EXIT_SPEC_FAILED) };
        }
    }
}

/// `TRAPVEC_CONTROL=1`: serve the control channel ([`control`]) from the start, so that
/// `trapctl -p PID list` reads the live figures of a program started under `LD_PRELOAD`.
fn start_control_if_asked() {
    if std::env::var_os("TRAPVEC_CONTROL").is_some_and(|v| v == "1") {
        let _ =
            env_logger::Builder::from_env(env_logger::Env::new().filter_or("TRAPVEC_LOG", "warn"))
                .try_init();
        if let Err(e) = control::start() {
            eprintln!("trapvec: control channel: {e}");
        }
    }
}

/// Entry point of an agent loaded into a running process (`trapctl -p PID attach` calls it in
/// one of the process's threads, the others stopped): start the control channel and return at
/// once; everything else happens on the channel's thread. 0 when the channel runs (now or
/// already), -1 when it cannot start (the reason is logged on the process's stderr).
///
/// An agent loaded this way does not interpose libc (it was not preloaded): its `sigaction`,
/// `dlopen`, `posix_spawn`... are not the program's, see docs/process.md.
#[no_mangle]
pub extern "C" fn trapvec_agent_attach() -> libc::c_int {
    // Not preloaded: the program's dlopen calls reach the agent only through hooked GOT slots
    // (see `got`; a slot that already calls the agent is left alone).
    attached::ATTACHED.store(true, SeqCst);
    let _ = env_logger::Builder::from_env(env_logger::Env::new().filter_or("TRAPVEC_LOG", "warn"))
        .try_init();
    match control::start() {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("trapvec: control channel: {e}");
            -1
        }
    }
}

extern "C" fn after_fork_in_child() {
    FORK_PID.store(std::process::id(), SeqCst);
}

extern "C" fn trapvec_agent_exit() {
    write_stats();
}

/// Write `TRAPVEC_STATS` now (at exit, `_exit` or before an exec).
///
/// Only the process that applied the spec writes it, or one of its fork children when the path
/// holds `%p` (each child its own file; otherwise a child would overwrite its parent's; the
/// agent's `vfork` is a `fork`). A child of a raw `vfork` system call (no atfork handler ran)
/// never writes: it shares its parent's memory.
pub(crate) fn write_stats() {
    let Some(template) = STATS.get() else { return };
    let pid = std::process::id();
    let per_pid = template.contains("%p");
    if pid != INIT_PID.load(SeqCst) && !(per_pid && pid == FORK_PID.load(SeqCst)) {
        return;
    }
    // Another thread may be writing the stats right now (or held the lock when this process was
    // forked): wait a little, never for ever.
    let deadline = Instant::now() + Duration::from_secs(1);
    let guard = loop {
        match STATE.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => {
                eprintln!("trapvec: stats not written: the agent's state stayed locked");
                return;
            }
        }
    };
    let Some(state) = guard.as_ref() else { return };
    let path = template.replace("%p", &pid.to_string());
    let splices: Vec<serde_json::Value> = state
        .slots
        .iter()
        .map(|slot| match *slot {
            Slot::Now(i) => {
                let row = &state.applied[i];
                // Removed by once mode: its hits when it was removed.
                let (hits, st) = match once::disarmed_hits(row.id) {
                    Some(h) => (h, "disarmed"),
                    None => (state.splicer.hits(SpliceId(row.id)).map(|h| h.hits).unwrap_or(0), "applied"),
                };
                let mut v = serde_json::json!({ "at": row.at, "mechanism": row.mechanism, "hits": hits, "state": st });
                add_return_stats(&mut v, &state.splicer, SpliceId(row.id));
                v
            }
            Slot::Deferred(i) => {
                let d = &state.deferred[i];
                let mut v = serde_json::json!({
                    "at": d.request.at, "mechanism": d.request.mechanism, "hits": d.hits(&state.splicer),
                    "state": d.state_name(), "loads": d.loads,
                });
                if let deferred::DState::Applied { id, .. } = &d.state {
                    add_return_stats(&mut v, &state.splicer, *id);
                }
                if let deferred::DState::Failed(why) = &d.state {
                    v["error"] = why.clone().into();
                }
                v
            }
        })
        .collect();
    let mut doc = serde_json::json!({ "splices": splices });
    if let Some(n) = once::batches() {
        doc["once_batches"] = n.into();
    }
    if let Err(e) = std::fs::write(&path, format!("{doc:#}\n")) {
        eprintln!("trapvec: cannot write stats to {path}: {e}");
    }
}

/// A return point's or timer's figures in its stats entry: `returns`, `missed` (calls without
/// their return half), `active` (calls in progress) and, for a timer, `histogram` (count, mean,
/// p50, p99, max and sum in ns, and the non-empty log2 buckets).
/// A keyed count's: `by` and its table, `keys` (`key`, `count`, most hits first) and `overflow`.
fn add_return_stats(
    v: &mut serde_json::Value,
    splicer: &instr_manager::splicer::Splicer<trapvec::process::ProcessTarget>,
    id: SpliceId,
) {
    if let (Ok(Some(table)), Some(by)) = (
        splicer.key_counts(id),
        splicer.get(id).and_then(|s| s.request.options.by),
    ) {
        v["by"] = by.name().into();
        v["keys"] = serde_json::to_value(&table.keys).unwrap_or_default();
        v["overflow"] = table.overflow.into();
    }
    let Ok(Some(st)) = splicer.return_stats(id) else {
        return;
    };
    v["when"] = "return".into();
    v["returns"] = st.returns.into();
    v["missed"] = st.missed.into();
    v["active"] = st.active.into();
    if let Some(h) = &st.histogram {
        v["histogram"] = serde_json::to_value(h.summary()).unwrap_or_default();
    }
}

/// `_exit`: write the stats, then leave as libc's would (`exit_group`).
#[no_mangle]
pub extern "C" fn _exit(status: libc::c_int) -> ! {
    write_stats();
    real::exit_group(status)
}

/// `_Exit`: the same as `_exit`.
#[no_mangle]
pub extern "C" fn _Exit(status: libc::c_int) -> ! {
    write_stats();
    real::exit_group(status)
}
