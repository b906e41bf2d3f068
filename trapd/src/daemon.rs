//! The daemon's state and request handling: one [`Splicer`] over the kernel, the journal, the
//! configuration's profiles and the active one.
//!
//! Every change follows one protocol, whoever asked (a client or a rule): journal the intent
//! (`fsync`), make the change (all or nothing: the splicer's batches undo themselves, and
//! [`Daemon::activate`] undoes the components and variables it touched), store the splicer's
//! state (one change line appended to the state log, `fsync`; now and then a whole snapshot in
//! the module, [`StateHome`], and a new log: [`StateLog`]), journal `done` with the state's
//! position (snapshot generation, change lines after it; `fsync`),
//! and only then reply. A refused change normally leaves the splicer as it was; where undoing it
//! changed the kernel all the same (a profile switch that handed a site over makes the old
//! splice again, in new code), the state is stored before the refusal is replied. At start the
//! module's state is imported (checked against the live kernel by [`Splicer::import_state`]:
//! the module is the truth) and the journal is reconciled with it ([`journal::reconcile`]).

// Errors here are made at most once per request, and they carry the splicer's errors whole.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use instr_manager::ops::{self, Activated, DaemonListing, ForgotPending, ListReply};
use instr_manager::ops::{PendingSplice, Reply, Required, SpliceReply, Status, UnspliceReply};
use instr_manager::splicer::state::StateError;
use instr_manager::splicer::state_log::{self, StateLoadError, StateLog, StateLogError};
use instr_manager::splicer::{SpliceId, SpliceRequest, Splicer};
use serde_json::Value;
use trapvec::{DispatchEntry, Target, TargetError, TargetExt};

use super::config::Config;
use super::journal::{self, Journal, JournalError, Outcome, Record};
use super::pending::{self, Arm, ModuleEvents, Pending};
use super::protocol::{self, Request};
use super::startup;

/// Where a target keeps the splicer's state between daemon runs (the kernel module's blob).
pub trait StateHome {
    /// The stored state and its generation (0, empty: never stored).
    fn load_state(&self) -> Result<(u64, Vec<u8>), TargetError>;
    /// Store `bytes` if the generation is still `expected`; returns the new generation.
    fn store_state(&self, expected: u64, bytes: &[u8]) -> Result<u64, TargetError>;
    /// Read the target's symbols again (modules came or went); pending points need it.
    fn refresh_symbols(&mut self) -> Result<(), TargetError> {
        Ok(())
    }
    /// Make text batches deferred patches (a coming module's pending points) or not.
    fn set_deferred(&mut self, _on: bool) {}
    /// The log of changes after the stored snapshot, if it has a fixed place (the kernel's is
    /// shared with trapctl); `None`: beside the journal.
    fn state_log_path(&self) -> Option<PathBuf> {
        None
    }
}

impl StateHome for trapvec::kernel::KernelTarget {
    fn load_state(&self) -> Result<(u64, Vec<u8>), TargetError> {
        let blob = self.state()?;
        Ok((blob.generation, blob.bytes))
    }

    fn store_state(&self, expected: u64, bytes: &[u8]) -> Result<u64, TargetError> {
        self.put_state(expected, bytes)
    }

    fn refresh_symbols(&mut self) -> Result<(), TargetError> {
        trapvec::kernel::KernelTarget::refresh_symbols(self)
    }

    fn set_deferred(&mut self, on: bool) {
        trapvec::kernel::KernelTarget::set_deferred(self, on)
    }

    fn state_log_path(&self) -> Option<PathBuf> {
        Some(state_log::kernel_state_log())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("reading the state kept in the module")]
    LoadState(#[source] TargetError),
    #[error("the module's state does not match the kernel (rmmod trapvec reverts everything)")]
    Import(#[from] StateError),
    #[error("reading the state log")]
    StateLog(#[source] StateLoadError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("listing the module's dispatch entries")]
    List(#[source] TargetError),
    #[error("activating the initial profile `{profile}`: {error}")]
    Initial { profile: String, error: String },
}

/// Why a request failed (the reply's `error`).
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error(transparent)]
    Op(#[from] ops::OpError),
    #[error("no profile named `{0}` in the configuration")]
    NoProfile(String),
    #[error("profile `{profile}`")]
    Profile {
        profile: String,
        #[source]
        source: Box<OpError>,
    },
}

/// The daemon.
pub struct Daemon<T: Target + StateHome> {
    splicer: Splicer<T>,
    config: Config,
    journal: Journal,
    generation: u64,
    /// The log of changes after the module's snapshot.
    state_log: StateLog,
    profile: Option<String>,
    started: Instant,
    /// When the active profile became active (time since `started`).
    switched_at: Option<Duration>,
    switches: u64,
    /// Dispatch entries the module lists that the stored state does not know.
    unrecorded: Vec<DispatchEntry>,
    /// The metrics' last values, for `status`.
    pub metrics: BTreeMap<String, f64>,
    /// Points in kernel modules that are not loaded ([`pending`]).
    pending: Pending,
}

impl<T: Target + StateHome> Daemon<T> {
    /// Take over what the module holds, reconcile the journal with it, compact the journal and
    /// activate the initial profile if none is recorded.
    pub fn start(target: T, config: Config, journal_path: &Path) -> Result<Self, DaemonError> {
        let (generation, bytes) = target.load_state().map_err(DaemonError::LoadState)?;
        let log_path = target
            .state_log_path()
            .unwrap_or_else(|| journal_path.with_extension("state"));
        let (splicer, state_log, _) = match StateLog::load(&log_path, target, &bytes) {
            Ok(loaded) => loaded,
            Err(StateLoadError::State(e)) => return Err(DaemonError::Import(e)),
            Err(e) => return Err(DaemonError::StateLog(e)),
        };
        let changes = state_log.changes();
        let (mut journal, replayed) = Journal::open(journal_path)?;
        let mut profile = replayed.profile.clone();
        match journal::reconcile(&replayed, generation, changes) {
            Outcome::Clean => {}
            Outcome::Completed { seq } => {
                log::warn!("journal: change {seq} was interrupted after its state was stored: taking it as done");
                if let Some((_, Request::Activate { profile: p })) = &replayed.interrupted {
                    profile = Some(p.clone());
                }
                journal.append(&Record::Done {
                    seq,
                    time: journal::now_secs(),
                    generation,
                    changes,
                    profile: profile.clone(),
                })?;
            }
            Outcome::NotStored { seq } => {
                log::warn!("journal: change {seq} was interrupted before its state was stored: the module's state stands");
                journal.append(&Record::Failed {
                    seq,
                    time: journal::now_secs(),
                    error: "interrupted (daemon stopped)".into(),
                })?;
            }
        }
        // The journal's profile counts only if its splices are live: after the module was
        // reloaded (its state gone) the journal describes a kernel that no longer exists.
        if let Some(p) = profile.clone() {
            let wanted = config.profiles.get(&p).map(|prof| prof.requests());
            match wanted {
                Some(reqs) if startup::all_live(splicer.live().map(|s| &s.request), &reqs) => {}
                Some(_) => {
                    log::warn!("the journal's profile {p} is not live in the module (was trapvec.ko reloaded?): no profile is active");
                    profile = None;
                }
                None => {
                    log::warn!("the journal's profile {p} is not in the configuration any more: no profile is active");
                    profile = None;
                }
            }
        }
        let known: Vec<u64> = splicer
            .live()
            .filter_map(|s| s.dispatch().map(|d| d.site))
            .collect();
        let unrecorded: Vec<DispatchEntry> = match splicer.target().dispatch_entries() {
            Some(listed) => startup::unrecorded(known, listed.map_err(DaemonError::List)?),
            None => Vec::new(),
        };
        for e in &unrecorded {
            log::warn!("the module has a dispatch entry at {:#x} (to {:#x}) that no stored state describes; `rmmod trapvec` reverts it", e.site, e.dest);
        }
        log::info!(
            "started: {} splice(s), {} component(s) live, state generation {generation}, profile {}",
            splicer.live().count(),
            splicer.components().iter().count(),
            profile.as_deref().unwrap_or("(none)")
        );
        journal.compact(generation, changes, profile.clone())?;
        let initial = config.initial_profile.clone();
        let mut d = Daemon {
            splicer,
            config,
            journal,
            generation,
            state_log,
            profile,
            started: Instant::now(),
            switched_at: None,
            switches: 0,
            unrecorded,
            metrics: BTreeMap::new(),
            pending: Pending::default(),
        };
        if let (None, Some(p)) = (&d.profile, initial) {
            if let Err(error) =
                d.answer(Request::Activate { profile: p.clone() }, "initial profile")
            {
                return Err(DaemonError::Initial { profile: p, error });
            }
        }
        Ok(d)
    }

    pub fn profile(&self) -> Option<&str> {
        self.profile.as_deref()
    }

    /// Time since start, the clock of the rules engine.
    pub fn now(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn switched_at(&self) -> Option<Duration> {
        self.switched_at
    }

    /// Answer one request (see the module docs for the order of effects).
    pub fn handle(&mut self, req: Request) -> Value {
        self.handle_with_cause(req, "client request")
    }

    /// As [`Daemon::handle`], with the reason logged for a profile switch.
    pub fn handle_with_cause(&mut self, req: Request, cause: &str) -> Value {
        match self.answer(req, cause) {
            Ok(reply) => protocol::ok(reply.to_fields()),
            Err(message) => protocol::error(message),
        }
    }

    /// Answer one request, typed: the reply, or the error reply's message (see the module
    /// docs for the order of effects). In-process callers (the rules) use this.
    pub fn answer(&mut self, req: Request, cause: &str) -> Result<Reply, String> {
        if !req.changes() {
            return self.read(&req).map_err(|e| trapvec::error_chain(&e));
        }
        let started = Instant::now();
        let seq = self.journal.next_seq();
        if let Err(e) = self.journal.append(&Record::Intent {
            seq,
            time: journal::now_secs(),
            request: req.clone(),
        }) {
            let e = trapvec::error_chain(&e);
            log::error!("{e}");
            return Err(format!("nothing changed: {e}"));
        }
        let journaled = started.elapsed();
        let result = self.change(&req, cause);
        let changed = started.elapsed();
        let time = journal::now_secs();
        match result {
            Ok(v) => {
                if let Err(e) = self.store() {
                    let e = trapvec::error_chain(&e);
                    log::error!("storing the state in the module after change {seq}: {e}");
                    let msg = format!("the change was made in the kernel, but storing the daemon's state in the module failed: {e}");
                    let _ = self.journal.append(&Record::Failed {
                        seq,
                        time,
                        error: msg.clone(),
                    });
                    return Err(msg);
                }
                let done = Record::Done {
                    seq,
                    time,
                    generation: self.generation,
                    changes: self.state_log.changes(),
                    profile: self.profile.clone(),
                };
                if let Err(e) = self.journal.append(&done) {
                    let e = trapvec::error_chain(&e);
                    log::error!("{e}");
                    return Err(format!(
                        "the change was made and stored in the module, but not journaled: {e}"
                    ));
                }
                log::debug!(
                    "timing: change {seq} ({}): intent journaled {:.3} ms, change {:.3} ms, state stored and done journaled {:.3} ms",
                    req.op(),
                    journaled.as_secs_f64() * 1e3,
                    (changed - journaled).as_secs_f64() * 1e3,
                    (started.elapsed() - changed).as_secs_f64() * 1e3
                );
                Ok(v)
            }
            Err(e) => {
                let mut why = trapvec::error_chain(&e);
                log::info!("request {seq} refused: {why}");
                if let Err(se) = self.store_if_changed() {
                    let se = trapvec::error_chain(&se);
                    log::error!("storing the state in the module after refused change {seq}: {se}");
                    why = format!("{why}; undoing it changed the kernel, and storing the daemon's state in the module failed: {se}");
                }
                if let Err(je) = self.journal.append(&Record::Failed {
                    seq,
                    time,
                    error: why.clone(),
                }) {
                    log::error!("{}", trapvec::error_chain(&je));
                }
                Err(why)
            }
        }
    }

    /// Store the splicer's state if it is not what the module holds (a refused change whose
    /// undoing made splices anew).
    fn store_if_changed(&mut self) -> Result<(), StateLogError> {
        match self.splicer.state_changed() {
            false => Ok(()),
            true => self.store(),
        }
    }

    /// Store what changed in the splicer's state: a change line in the log, or a snapshot in
    /// the module (after the generation it holds) and a new log.
    fn store(&mut self) -> Result<(), StateLogError> {
        let generation = &mut self.generation;
        self.state_log.save(&mut self.splicer, |target, bytes| {
            *generation = target.store_state(*generation, bytes)?;
            Ok(())
        })?;
        Ok(())
    }

    /// A request that changes nothing: the daemon's own reads, else [`ops::execute`].
    fn read(&mut self, req: &Request) -> Result<Reply, OpError> {
        Ok(match req {
            Request::List => Reply::List(self.list()?),
            Request::Status => Reply::Status(self.status()),
            _ => ops::execute(&mut self.splicer, req)?.0,
        })
    }

    /// A change: pending points, profiles and required modules are the daemon's own; every
    /// other request is [`ops::execute`]'s.
    fn change(&mut self, req: &Request, cause: &str) -> Result<Reply, OpError> {
        if let Some(v) = self.change_pending(req) {
            return v;
        }
        match req {
            Request::Activate { profile } => {
                let a = self
                    .activate(profile, cause)
                    .map_err(|e| OpError::Profile {
                        profile: profile.clone(),
                        source: Box::new(e),
                    })?;
                Ok(Reply::Activate(a))
            }
            Request::Require { module } => {
                self.pending.require(module);
                log::info!("module {module} is required: its load is refused if a pending point in it cannot be made");
                Ok(Reply::Require(Required {
                    require: module.clone(),
                }))
            }
            _ => {
                let (reply, _) = ops::execute(&mut self.splicer, req)?;
                log_change(req, &reply);
                Ok(reply)
            }
        }
    }

    /// The requests of profile `name` (none for no profile).
    fn requests_of(&self, name: Option<&str>) -> Result<Vec<SpliceRequest>, OpError> {
        let Some(name) = name else {
            return Ok(Vec::new());
        };
        let p = self
            .config
            .profiles
            .get(name)
            .ok_or_else(|| OpError::NoProfile(name.to_string()))?;
        Ok(p.requests())
    }

    /// Switch to profile `name` ([`ops::switch`]: its missing components loaded, its variables
    /// written, then one batch removing the active profile's splices that `name` does not have
    /// and adding those it adds, after a batch of its own for sites that change hands; all or
    /// nothing).
    fn activate(&mut self, name: &str, cause: &str) -> Result<Activated, OpError> {
        let profile = self
            .config
            .profiles
            .get(name)
            .ok_or_else(|| OpError::NoProfile(name.to_string()))?
            .spec();
        // A profile that is no longer in the configuration owns nothing we can name.
        let old = self
            .requests_of(self.profile.as_deref())
            .unwrap_or_default();
        let switched = ops::switch(&mut self.splicer, &old, &profile)?;
        let previous = self.profile.replace(name.to_string());
        self.switched_at = Some(self.now());
        self.switches += 1;
        log::info!(
            "profile {} -> {name} ({cause}): {} splice(s) removed, {} added, {} site(s) changed hands in place, {} through a batch of their own",
            previous.as_deref().unwrap_or("(none)"),
            switched.removed,
            switched.added,
            switched.in_place,
            switched.handed_over
        );
        Ok(Activated {
            profile: name.to_string(),
            previous,
            switched,
        })
    }

    /// The listing of [`ops::listing`], with each splice's `in_profile`, the active profile and
    /// the unrecorded dispatch entries.
    fn list(&self) -> Result<ListReply, OpError> {
        let active = self
            .requests_of(self.profile.as_deref())
            .unwrap_or_default();
        let mut listing = ops::listing(&self.splicer)?;
        for row in &mut listing.splices {
            let live = self.splicer.get(SpliceId(row.id)).map(|s| &s.request);
            row.in_profile = Some(live.is_some_and(|r| active.contains(r)));
        }
        let unrecorded: Vec<ops::Unrecorded> = self
            .unrecorded
            .iter()
            .map(|e| {
                let h = self.splicer.target().trap_hits(e.site).unwrap_or_default();
                ops::Unrecorded {
                    site: format!("{:#x}", e.site),
                    dest: format!("{:#x}", e.dest),
                    hits: h.hits,
                }
            })
            .collect();
        let mut daemon = DaemonListing {
            profile: self.profile.clone(),
            unrecorded,
            pending: None,
        };
        if !self.pending.is_empty() {
            let sp = &self.splicer;
            let rows = self.pending.rows(|at| {
                sp.find(at)
                    .and_then(|id| sp.get(id))
                    .and_then(|s| s.dispatch())
                    .and_then(|d| sp.target().trap_hits(d.site))
                    .map_or(0, |h| h.hits)
            });
            daemon.pending = Some(rows);
        }
        Ok(ListReply {
            listing,
            daemon: Some(daemon),
        })
    }

    /// A splice at `MOD:sym` whose module is not loaded is made pending; unsplicing a pending
    /// point (or a glob matching pending points) forgets it (and removes its splice if armed).
    /// `None`: not a pending matter.
    fn change_pending(&mut self, req: &Request) -> Option<Result<Reply, OpError>> {
        match req {
            Request::Splice(r) => {
                let module = pending::module_of(r)?;
                let sp = &mut self.splicer;
                if let Err(e) = sp.target_mut().refresh_symbols() {
                    log::warn!("refreshing the symbols: {}", trapvec::error_chain(&e));
                }
                if instr_manager::point::object_loaded(sp.target().symbols(), &module) {
                    return None;
                }
                log::info!(
                    "{} ({}) is pending: module {module} is not loaded",
                    r.at,
                    r.action
                );
                self.pending.add(r.clone(), module.clone());
                Some(Ok(Reply::Splice(SpliceReply::Pending(PendingSplice {
                    pending: true,
                    at: r.at.clone(),
                    module,
                }))))
            }
            Request::Unsplice { at: Some(at), .. } if instr_manager::glob::is_glob(at) => {
                self.unsplice_glob_pending(at)
            }
            Request::Unsplice { at: Some(at), .. } => {
                let p = self.pending.remove(at)?;
                let mut hits = p.hits;
                if p.arm == Arm::Armed {
                    match ops::unsplice(&mut self.splicer, at) {
                        Ok(u) => hits += u.hits,
                        Err(e) => log::warn!("{at}: {}", trapvec::error_chain(&e)),
                    }
                }
                log::info!("forgot pending point {at} after {hits} hit(s)");
                Some(Ok(Reply::Unsplice(UnspliceReply::Pending(ForgotPending {
                    at: at.clone(),
                    pending: true,
                    hits,
                }))))
            }
            _ => None,
        }
    }

    /// `unsplice GLOB` when the glob matches pending points: they are forgotten (an armed one's
    /// live splice removed with the live splices the glob matches, in one batch), so that the
    /// next load of their module does not make them again. A glob that matches pending points
    /// and no live splice is not an error. `None`: it matches no pending point (or is not a
    /// glob), the splicer's to answer.
    fn unsplice_glob_pending(&mut self, glob: &str) -> Option<Result<Reply, OpError>> {
        let g = instr_manager::glob::FunctionGlob::new(glob).ok()?;
        let forgotten = self.pending.remove_matching(&g);
        if forgotten.is_empty() {
            return None;
        }
        let req = Request::Unsplice {
            at: Some(glob.to_string()),
            all: false,
        };
        let mut all = match ops::execute(&mut self.splicer, &req) {
            Ok((Reply::Unsplice(UnspliceReply::All(all)), _)) => all,
            Ok((other, _)) => {
                // Not a glob's answer after all: the pending points stay.
                for p in forgotten {
                    self.pending.add_back(p);
                }
                return Some(Ok(other));
            }
            Err(ops::OpError::NoSplice { .. }) => ops::UnsplicedAll::default(),
            Err(e) => {
                // Nothing was removed: the pending points are not forgotten either.
                for p in forgotten {
                    self.pending.add_back(p);
                }
                return Some(Err(e.into()));
            }
        };
        for p in forgotten {
            // An armed point's live hits are in its removed splice's row.
            let live = all
                .unspliced
                .iter()
                .position(|u| u.at == p.request.at)
                .map(|i| all.unspliced.remove(i));
            let hits = p.hits + live.map_or(0, |u| u.hits);
            log::info!(
                "forgot pending point {} after {hits} hit(s) (unsplice {glob})",
                p.request.at
            );
            all.forgot.push(ForgotPending {
                at: p.request.at,
                pending: true,
                hits,
            });
        }
        Some(Ok(Reply::Unsplice(UnspliceReply::All(all))))
    }

    /// Journal a pending point that its module's arrival showed invalid, as a refused splice.
    fn journal_invalid(&mut self, request: &instr_manager::SpliceRequest, why: &str) {
        let seq = self.journal.next_seq();
        let time = journal::now_secs();
        let intent = Record::Intent {
            seq,
            time,
            request: Request::Splice(request.clone()),
        };
        let failed = Record::Failed {
            seq,
            time,
            error: format!("pending point: {why}"),
        };
        for rec in [intent, failed] {
            if let Err(e) = self.journal.append(&rec) {
                log::error!("{}", trapvec::error_chain(&e));
            }
        }
    }

    fn status(&self) -> Status {
        Status {
            pid: std::process::id(),
            uptime_s: self.now().as_secs(),
            profile: self.profile.clone(),
            profiles: self.config.profiles.keys().cloned().collect(),
            switches: self.switches,
            splices: self.splicer.live().count(),
            components: self.splicer.components().iter().count(),
            generation: self.generation,
            journal: self.journal.path().to_path_buf(),
            unrecorded: self.unrecorded.len(),
            metrics: self.metrics.clone(),
        }
    }
}

/// Say what a change [`ops::execute`] made did, in the daemon's log.
fn log_change(req: &Request, reply: &Reply) {
    match (req, reply) {
        (Request::Load { path, .. }, Reply::Load(loaded)) => log::info!(
            "loaded component {} from {} ({} declared splice(s))",
            loaded.component.name,
            path.display(),
            loaded.spliced.len()
        ),
        (Request::Unload { name }, _) => log::info!("unloaded component {name}"),
        (Request::Splice(r), Reply::Splice(SpliceReply::Made(row))) => {
            log::info!("spliced {} ({}) at {}", r.at, row.action, row.site)
        }
        (Request::Unsplice { at: Some(at), .. }, Reply::Unsplice(UnspliceReply::One(u))) => {
            log::info!("unspliced {at} after {} hit(s)", u.hits)
        }
        (_, Reply::Unsplice(UnspliceReply::All(all))) => {
            log::info!("unspliced all {} splice(s)", all.unspliced.len())
        }
        (Request::Apply { spec, .. }, Reply::Apply(report)) => log::info!(
            "applied {}: {} component(s), {} splice(s), {} refused",
            spec.display(),
            report.components.len(),
            report.spliced.len(),
            report.refused.len()
        ),
        (Request::Set { symbol, .. }, Reply::Set(var)) => {
            log::info!("set {symbol} = {}", var.value)
        }
        _ => {}
    }
}

impl<T: Target + StateHome> ModuleEvents for Daemon<T> {
    /// Make the module's pending points (deferred patches), before its init runs.
    fn module_coming(&mut self, name: &str) -> Result<(), String> {
        if !self.pending.has(name) {
            return Ok(());
        }
        let sp = &mut self.splicer;
        if let Err(e) = sp.target_mut().refresh_symbols() {
            log::warn!("refreshing the symbols: {}", trapvec::error_chain(&e));
        }
        sp.target_mut().set_deferred(true);
        let mut invalid = Vec::new();
        for p in self.pending.of_module_mut(name) {
            match ops::splice(sp, &p.request) {
                Ok(_) => {
                    p.arm = Arm::Armed;
                    p.loads += 1;
                }
                Err(e) => {
                    let why = trapvec::error_chain(&e);
                    p.arm = Arm::Invalid(why.clone());
                    invalid.push((p.request.clone(), why));
                }
            }
        }
        sp.target_mut().set_deferred(false);
        for (r, why) in &invalid {
            log::warn!(
                "pending point {} cannot be made in module {name}: {why}",
                r.at
            );
            pending::kmsg(&format!(
                "pending point {} cannot be made in module {name}: {why}",
                r.at
            ));
            self.journal_invalid(r, why);
        }
        let refuse = !invalid.is_empty() && self.pending.required(name);
        if refuse {
            self.module_going(name);
        } else if let Err(e) = self.store_if_changed() {
            log::error!(
                "storing the state after arming {name}: {}",
                trapvec::error_chain(&e)
            );
        }
        let armed = self
            .pending
            .of_module_mut(name)
            .filter(|p| p.arm == Arm::Armed)
            .count();
        log::info!(
            "module {name} came: {armed} pending point(s) armed, {} invalid",
            invalid.len()
        );
        match refuse {
            true => Err(format!(
                "{} pending point(s) cannot be made (first: {}: {})",
                invalid.len(),
                invalid[0].0.at,
                invalid[0].1
            )),
            false => Ok(()),
        }
    }

    /// Take the module's armed points out (its exit has run), keeping their hits: pending again.
    fn module_going(&mut self, name: &str) {
        if !self.pending.has(name) {
            return;
        }
        let sp = &mut self.splicer;
        let mut removed = 0;
        for p in self.pending.of_module_mut(name) {
            if p.arm == Arm::Armed {
                match ops::unsplice(sp, &p.request.at) {
                    Ok(u) => {
                        p.hits += u.hits;
                        removed += 1;
                    }
                    // The kernel removes what is left in the module's text after our answer.
                    Err(e) => log::error!(
                        "removing pending point {} from module {name}: {}",
                        p.request.at,
                        trapvec::error_chain(&e)
                    ),
                }
            }
            p.arm = Arm::Waiting;
        }
        if let Err(e) = self.store_if_changed() {
            log::error!(
                "storing the state after {name} went: {}",
                trapvec::error_chain(&e)
            );
        }
        log::info!("module {name} went: {removed} pending point(s) back to pending");
    }
}
