//! Applying and removing splices through a [`Target`]: the part of the instrumentation manager
//! with effects. Everything before the first write is planning (pure functions of this crate);
//! every batch is all-or-nothing, and removal waits for quiescence before freeing.
//!
//! Life of a splice:
//! 1. resolve the point, analyse its function, plan the window (trap or jmp, springboard); a batch
//!    reads its functions' text in a few spans and analyses each function once (`batch`);
//! 2. allocate a data block (hit counter, in-flight counter) and a code block near the site,
//!    emit the trampoline (call), or the counting entry jump and the *replay* (replace), seal;
//! 3. add the dispatch entries of all trap splices of the batch, then write all text in one batch;
//!    a failure undoes steps 2–3 for the whole batch;
//! 4. removal: restore the text (one batch), drop the dispatch entries and point the original
//!    trampolines' indirection slots back at the functions, wait until no thread is in the
//!    trampolines, springboards or handlers, restore the springboards, free.
//!
//! `replace` splices keep the original callable through `__trapvec_orig_<fn>`: a stub
//! `jmp [rip+slot]` whose slot holds the function itself while no replace splice of it is live,
//! and its replay trampoline while one is.
//!
//! Batches are all-or-nothing ([`Splicer::apply`]) or best-effort ([`Splicer::apply_best_effort`]:
//! every request that plans and builds is applied in one batch, each other one is reported with
//! its reason). Every planned window is also put to the target's own rules
//! ([`Target::check_site`]) before anything is allocated.
//!
//! A splicer's bookkeeping can be saved and restored ([`state`]): a one-shot tool (trapctl)
//! keeps it in the kernel module between commands, checked against the module on every restore.

mod batch;
mod count;
pub mod state;
mod summary;
mod switch;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};

use component_manager::{ComponentError, ComponentId, ComponentManager, ExtraSymbols};
use serde::{Deserialize, Serialize};
use trapvec::target::{BlockKind, DispatchEntry, RepoBlock, Target, TextPatch};
use trapvec::TargetError;

use crate::analysis::analyze_function;
use crate::analysis::liveness::{flags_dead_at, is_lean_leaf};
use crate::point::is_fentry_site;
use crate::plan::{plan_splice, Mechanism, Plan, PlanInput, Springboard};
use crate::point::{resolve_point, PointSpec, ResolvedPoint};
use crate::trampoline::{
    emit_call_trampoline_with, emit_indirect_stub, emit_replace_trampoline, emit_replay, jmp_bytes, springboard_bytes,
    trap_bytes, CallTrampoline, ReplaceTrampoline, TrampolineOptions, REPLACE_STACK_WORDS,
};
use batch::{read_words, BatchCache};
use count::emit_counting_replay;
pub use crate::splice::{Action, SpliceRequest};
pub use summary::{DisplacedText, PlanSummary};

/// Longest window a target checks in one [`Target::check_site`] call (the kernel module's
/// longest patch); longer windows are checked one displaced instruction at a time.
const CHECK_WINDOW_MAX: usize = trapvec::abi::TRAPVEC_PATCH_MAX;

/// Prefix of the symbols through which components call a replaced function's original.
pub const ORIG_PREFIX: &str = "__trapvec_orig_";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SpliceId(pub u64);

/// Errors of the splicer; each names the point (as written) it is about.
#[derive(Debug, thiserror::Error)]
pub enum SpliceError {
    #[error("{at}: {source}")]
    Point { at: String, #[source] source: crate::PlanError },
    #[error("{at}: cannot splice at {site:#x} by {mechanism}: {refusal}")]
    Refused { at: String, site: u64, mechanism: Mechanism, refusal: crate::Refusal },
    #[error("{at}: handler `{name}` is not a symbol of any loaded component")]
    UnknownHandler { at: String, name: String },
    #[error("{at}: replace needs the function's entry, but {site:#x} is {offset:#x} bytes into {function}")]
    ReplaceNotAtEntry { at: String, site: u64, function: String, offset: u64 },
    #[error("{at}: the site {site:#x} is already spliced (by {other})")]
    AlreadySpliced { at: String, site: u64, other: String },
    #[error("{at}: {source}")]
    Target { at: String, #[source] source: TargetError },
    #[error("`{name}` is not a variable of any loaded component")]
    UnknownVariable { name: String },
    #[error("variable `{name}`: size must be 1, 2, 4 or 8 bytes, not {size}")]
    VariableSize { name: String, size: usize },
    #[error("variable `{name}` at {addr:#x}: {size} bytes do not lie inside its component's data")]
    VariableOutside { name: String, addr: u64, size: usize },
    #[error("no live splice with id {0}")]
    UnknownSplice(u64),
    #[error(transparent)]
    Component(#[from] ComponentError),
    #[error("{0}")]
    TargetOp(#[from] TargetError),
}

/// A splice that is in the text right now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LiveSplice {
    pub id: SpliceId,
    pub request: SpliceRequest,
    pub point: ResolvedPoint,
    pub plan: PlanSummary,
    /// Handler or replacement address.
    pub dest_fn: u64,
    /// The component that owns `dest_fn`, if any (its reference is held while the splice lives).
    pub component: Option<ComponentId>,
    site_patch: TextPatch,
    springboard_patch: Option<TextPatch>,
    code: RepoBlock,
    data: RepoBlock,
    /// Where the trap/jmp sends the CPU.
    entry: u64,
    /// Replay (displaced + jmp back), for replace splices and dispatcher-run handlers.
    replay: Option<u64>,
    dispatch: Option<DispatchEntry>,
    /// The handler's code, when it is a lean leaf: scanned for threads instead of counting them.
    #[serde(default)]
    handler_range: Option<(u64, u64)>,
    /// The in-flight counter when the target owns it ([`trapvec::Target::replace_counter`]:
    /// the kernel module's, for a replace trampoline); else the data block's second word.
    #[serde(default)]
    inflight: Option<u64>,
}

impl LiveSplice {
    /// The text patch at the site (its `new` bytes are in the text while the splice lives).
    pub fn site_patch(&self) -> &TextPatch {
        &self.site_patch
    }

    /// Where the trap or jmp sends the CPU.
    pub fn entry(&self) -> u64 {
        self.entry
    }

    /// The dispatch entry of a trap splice.
    pub fn dispatch(&self) -> Option<DispatchEntry> {
        self.dispatch
    }

    fn hits_addr(&self) -> u64 {
        self.data.addr
    }
    fn inflight_addr(&self) -> u64 {
        self.inflight.unwrap_or(self.data.addr + 8)
    }
    /// Add the ranges a thread could be executing in because of this splice to `out`.
    fn add_ranges(&self, out: &mut Vec<(u64, u64)>) {
        out.push((self.code.addr, self.code.addr + self.code.size as u64));
        out.extend(self.handler_range);
        if let Some(sb) = &self.springboard_patch {
            out.push((sb.addr, sb.addr + sb.new.len() as u64));
        }
    }
}

/// The repository side of a splice being built: its blocks and where its action goes.
struct Blocks {
    code: RepoBlock,
    data: RepoBlock,
    /// Handler or replacement address (0 for a count).
    dest_fn: u64,
    component: Option<ComponentId>,
}

/// A planned request, with what building it needs to know of the text it was planned on.
struct Planned {
    point: ResolvedPoint,
    plan: Plan,
    /// The `plan.patch_len` bytes at the site, as analysed.
    site_text: Option<Vec<u8>>,
    /// Whether the status flags are dead at the site (only asked for `call` splices).
    flags_dead: bool,
}

/// What [`Splicer::fill`] made of a splice's blocks.
struct Filled {
    site_patch: TextPatch,
    springboard_patch: Option<TextPatch>,
    entry: u64,
    replay: Option<u64>,
    dispatch: Option<DispatchEntry>,
    handler_range: Option<(u64, u64)>,
    inflight: Option<u64>,
}

/// Hit counters of a splice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hits {
    pub hits: u64,
    pub missed: u64,
}

/// What [`Splicer::apply_best_effort`] did: the index of each request applied, with its splice,
/// and the index of each request refused, with the reason.
#[derive(Debug, Default)]
pub struct BestEffort {
    pub applied: Vec<(usize, SpliceId)>,
    pub refused: Vec<(usize, SpliceError)>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct OrigStub {
    function: u64,
    code: RepoBlock,
    slot: RepoBlock,
}

/// Text claimed by splices: displaced windows and springboards, as disjoint `[start, end)`
/// ranges keyed by start (a batch of 10,000 splices checks each window in O(log n)).
#[derive(Default)]
struct Claimed(BTreeMap<u64, u64>);

impl Claimed {
    fn add(&mut self, site: u64, displaced_len: usize, springboard: Option<&Springboard>) {
        self.0.insert(site, site + displaced_len as u64);
        if let Some(sb) = springboard {
            self.0.insert(sb.addr, sb.addr + 5);
        }
    }

    fn overlaps(&self, lo: u64, hi: u64) -> bool {
        self.0.range(..hi).next_back().is_some_and(|(_, &end)| end > lo)
    }

    fn starts_at(&self, addr: u64) -> bool {
        self.0.contains_key(&addr)
    }
}

/// The instrumentation manager over one target: components, splices, original trampolines.
pub struct Splicer<T: Target> {
    target: T,
    components: ComponentManager,
    /// Boxed: a batch moves thousands of them between lists and this map.
    live: BTreeMap<SpliceId, Box<LiveSplice>>,
    orig: HashMap<String, OrigStub>,
    next: u64,
    last_batch: Option<BatchTimings>,
}

/// Where the time of the last [`Splicer::apply`] or [`Splicer::apply_best_effort`] went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchTimings {
    pub splices: usize,
    /// Resolving, decoding, validating and planning every point (the target's checks included).
    pub plan: std::time::Duration,
    /// Allocating, generating and writing trampolines.
    pub build: std::time::Duration,
    /// Making the batch visible: dispatch entries and the one text batch.
    pub commit: std::time::Duration,
}

struct OrigResolver<'a> {
    orig: &'a mut HashMap<String, OrigStub>,
    live: &'a BTreeMap<SpliceId, Box<LiveSplice>>,
}

impl ExtraSymbols for OrigResolver<'_> {
    fn resolve(&mut self, target: &mut dyn Target, name: &str) -> Option<Result<u64, String>> {
        let func = name.strip_prefix(ORIG_PREFIX)?;
        if let Some(s) = self.orig.get(func) {
            return Some(Ok(s.code.addr));
        }
        let Some(sym) = target.symbols().lookup(func).cloned() else {
            return Some(Err(format!("{name}: the target has no function `{func}`")));
        };
        // While a replace splice of `func` is live, the slot points at its replay.
        let current = self
            .live
            .values()
            .find(|s| s.point.function.addr == sym.addr && matches!(s.request.action, Action::Replace { .. }))
            .and_then(|s| s.replay)
            .unwrap_or(sym.addr);
        Some(make_orig_stub(target, sym.addr, current).map(|stub| {
            let addr = stub.code.addr;
            self.orig.insert(func.to_string(), stub);
            addr
        }))
    }
}

fn make_orig_stub(target: &mut dyn Target, function: u64, current: u64) -> Result<OrigStub, String> {
    let slot = target.alloc(function, 8, BlockKind::Data).map_err(|e| e.to_string())?;
    let code = match target.alloc(function, 16, BlockKind::Code) {
        Ok(c) => c,
        Err(e) => {
            let _ = target.free(&slot);
            return Err(e.to_string());
        }
    };
    let r = (|| {
        target.write(&slot, 0, &current.to_le_bytes())?;
        target.write(&code, 0, &emit_indirect_stub(code.addr, slot.addr))?;
        target.seal(&code)
    })();
    if let Err(e) = r {
        let _ = target.free(&code);
        let _ = target.free(&slot);
        return Err(e.to_string());
    }
    Ok(OrigStub { function, code, slot })
}

impl<T: Target> Splicer<T> {
    pub fn new(target: T) -> Self {
        Splicer { target, components: ComponentManager::new(), live: BTreeMap::new(), orig: HashMap::new(), next: 0, last_batch: None }
    }

    /// Timings of the last batch applied.
    pub fn last_batch(&self) -> Option<BatchTimings> {
        self.last_batch
    }

    pub fn target(&self) -> &T {
        &self.target
    }

    pub fn target_mut(&mut self) -> &mut T {
        &mut self.target
    }

    pub fn components(&self) -> &ComponentManager {
        &self.components
    }

    /// Load a component, answering `__trapvec_orig_*` imports with original trampolines.
    pub fn load_component(&mut self, path: &std::path::Path, opts: &component_manager::LoadOptions) -> Result<ComponentId, SpliceError> {
        let mut extra = OrigResolver { orig: &mut self.orig, live: &self.live };
        Ok(self.components.load_path(&mut self.target, path, opts, &mut extra)?)
    }

    /// Unload a component (refused while a splice uses it).
    pub fn unload_component(&mut self, id: ComponentId) -> Result<(), SpliceError> {
        Ok(self.components.unload(&mut self.target, id)?)
    }

    pub fn live(&self) -> impl Iterator<Item = &LiveSplice> {
        self.live.values().map(|s| &**s)
    }

    pub fn get(&self, id: SpliceId) -> Option<&LiveSplice> {
        self.live.get(&id).map(|s| &**s)
    }

    /// Current hit counters of a live splice.
    pub fn hits(&self, id: SpliceId) -> Result<Hits, SpliceError> {
        let s = self.live.get(&id).ok_or(SpliceError::UnknownSplice(id.0))?;
        Ok(self.hits_of([&**s])[0])
    }

    /// Current hit counters of live splices `ids`, in order, read together (a listing of many
    /// splices costs a few target reads, not one each).
    pub fn hits_many(&self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        let splices = ids.iter().map(|id| self.live.get(id).map(|s| &**s).ok_or(SpliceError::UnknownSplice(id.0))).collect::<Result<Vec<_>, _>>()?;
        Ok(self.hits_of(splices))
    }

    /// Hit counters of `splices`: the dispatcher's for trap splices where it counts, else the
    /// trampolines' (read together, see [`read_words`]).
    fn hits_of<'a>(&self, splices: impl IntoIterator<Item = &'a LiveSplice>) -> Vec<Hits> {
        let by_dispatcher = self.target.info().dispatcher_counts_hits;
        let mut out = Vec::new();
        let mut counted: Vec<(usize, u64)> = Vec::new();
        for (i, s) in splices.into_iter().enumerate() {
            out.push(Hits::default());
            let dispatched = (s.plan.mechanism == Mechanism::Trap && by_dispatcher).then(|| self.target.trap_hits(s.point.site)).flatten();
            match dispatched {
                Some(h) => out[i] = Hits { hits: h.hits, missed: h.missed },
                None => counted.push((i, s.hits_addr())),
            }
        }
        let addrs: Vec<u64> = counted.iter().map(|c| c.1).collect();
        for ((i, _), hits) in counted.iter().zip(read_words(&self.target, &addrs)) {
            out[*i].hits = hits;
        }
        out
    }

    /// Resolve a handler/replacement name: a loaded component's function, inside its code
    /// (a data symbol or one outside the component is refused with the reason).
    fn resolve_dest(&self, at: &str, name: &str) -> Result<(u64, Option<ComponentId>), SpliceError> {
        match self.components.entry(name) {
            Ok((id, addr)) => Ok((addr, Some(id))),
            Err(ComponentError::UnknownSymbol { .. }) => Err(SpliceError::UnknownHandler { at: at.to_string(), name: name.to_string() }),
            Err(e) => Err(e.into()),
        }
    }

    /// Text claimed by live splices.
    fn claimed(&self) -> Claimed {
        let mut claimed = Claimed::default();
        for s in self.live.values() {
            claimed.add(s.plan.site, s.plan.displaced_len, s.plan.springboard.as_ref());
        }
        claimed
    }

    /// Plan every request without changing anything; returns the plans or the first refusal.
    pub fn plan(&self, requests: &[SpliceRequest]) -> Result<Vec<(ResolvedPoint, Plan)>, SpliceError> {
        let planned = self.plan_batch(requests, &mut BatchCache::default())?;
        Ok(planned.into_iter().map(|p| (p.point, p.plan)).collect())
    }

    /// [`Splicer::plan`], with what building needs to know of the text, through `cache`.
    fn plan_batch(&self, requests: &[SpliceRequest], cache: &mut BatchCache) -> Result<Vec<Planned>, SpliceError> {
        let points = self.resolve_batch(requests, cache);
        let mut claimed = self.claimed();
        let mut out: Vec<Planned> = Vec::with_capacity(requests.len());
        for (r, point) in requests.iter().zip(points) {
            let earlier = |site: u64| out.iter().find(|p| p.point.site == site).map(|p| p.point.spec_text.clone());
            let planned = self.plan_one(r, point?, &earlier, &claimed, cache)?;
            claimed.add(planned.plan.site, planned.plan.displaced_len, planned.plan.springboard.as_ref());
            out.push(planned);
        }
        Ok(out)
    }

    /// Resolve every request's point, and read the text of their functions ahead.
    fn resolve_batch(&self, requests: &[SpliceRequest], cache: &mut BatchCache) -> Vec<Result<ResolvedPoint, SpliceError>> {
        let points: Vec<Result<ResolvedPoint, SpliceError>> = requests.iter().map(|r| self.resolve(&r.at)).collect();
        cache.prefetch(&self.target, points.iter().filter_map(|p| p.as_ref().ok()).map(|p| &p.function));
        points
    }

    /// Plan each request on its own, against the live splices and the requests before it that
    /// planned: one result per request, in order. Changes nothing.
    pub fn plan_each(&self, requests: &[SpliceRequest]) -> Vec<Result<(ResolvedPoint, Plan), SpliceError>> {
        let planned = self.plan_each_batch(requests, &mut BatchCache::default());
        planned.into_iter().map(|p| p.map(|p| (p.point, p.plan))).collect()
    }

    /// [`Splicer::plan_each`], with what building needs to know of the text, through `cache`.
    fn plan_each_batch(&self, requests: &[SpliceRequest], cache: &mut BatchCache) -> Vec<Result<Planned, SpliceError>> {
        let points = self.resolve_batch(requests, cache);
        let mut claimed = self.claimed();
        let mut out: Vec<Result<Planned, SpliceError>> = Vec::with_capacity(requests.len());
        for (r, point) in requests.iter().zip(points) {
            let earlier =
                |site: u64| out.iter().filter_map(|p| p.as_ref().ok()).find(|p| p.point.site == site).map(|p| p.point.spec_text.clone());
            match point.and_then(|point| self.plan_one(r, point, &earlier, &claimed, cache)) {
                Ok(p) => {
                    claimed.add(p.plan.site, p.plan.displaced_len, p.plan.springboard.as_ref());
                    out.push(Ok(p));
                }
                Err(e) => {
                    log::debug!("{}: refused: {e}", r.at);
                    out.push(Err(e));
                }
            }
        }
        out
    }

    /// Resolve `at` (as [`SpliceRequest::at`] is written) to the site a splice there would use.
    pub fn resolve(&self, at: &str) -> Result<ResolvedPoint, SpliceError> {
        let spec: PointSpec = at.parse().map_err(|e| SpliceError::Point { at: at.to_string(), source: e })?;
        let fentry = |entry: u64| self.target.read(entry, 5).is_ok_and(|b| is_fentry_site(&b));
        resolve_point(&spec, self.target.symbols(), self.target.info(), fentry)
            .map_err(|e| SpliceError::Point { at: at.to_string(), source: e })
    }

    /// The live splice at `at`: the point exactly as it was written when spliced, else the
    /// splice whose site `at` resolves to (`tcp_sync_mss` finds the splice at its entry past
    /// the ftrace site; `0x…` finds the splice at that site).
    pub fn find(&self, at: &str) -> Option<SpliceId> {
        if let Some(s) = self.live.values().find(|s| s.request.at == at) {
            return Some(s.id);
        }
        let site = match at.parse::<PointSpec>() {
            Ok(PointSpec::Address(a)) if self.live.values().any(|s| s.point.site == a) => a,
            _ => self.resolve(at).ok()?.site,
        };
        self.live.values().find(|s| s.point.site == site).map(|s| s.id)
    }

    /// Plan `r` at its resolved `point`. `earlier(site)` names the point of an earlier request of
    /// the batch planned at `site`, if any; `claimed` holds the text live splices and earlier
    /// requests of the batch take.
    fn plan_one(
        &self,
        r: &SpliceRequest,
        point: ResolvedPoint,
        earlier: &dyn Fn(u64) -> Option<String>,
        claimed: &Claimed,
        cache: &mut BatchCache,
    ) -> Result<Planned, SpliceError> {
        let at = r.at.as_str();
        let info = self.target.info();
        let read = |a: u64, n: usize| self.target.read(a, n).ok();
        let fentry = |entry: u64| read(entry, 5).is_some_and(|b| is_fentry_site(&b));
        // A claim starting at the site is the only way it can be spliced already (the linear
        // searches for the message run only then: batches of thousands stay O(n log n)).
        if claimed.starts_at(point.site) {
            if let Some(other) = self.live.values().find(|s| s.point.site == point.site) {
                return Err(SpliceError::AlreadySpliced { at: at.to_string(), site: point.site, other: other.request.at.clone() });
            }
            if let Some(other) = earlier(point.site) {
                return Err(SpliceError::AlreadySpliced { at: at.to_string(), site: point.site, other });
            }
        }
        if let Action::Replace { .. } = r.action {
            let entry = point.function.addr;
            let past_fentry = info.has_fentry && point.site == entry + 5 && fentry(entry);
            if point.site != entry && !past_fentry {
                return Err(SpliceError::ReplaceNotAtEntry {
                    at: at.to_string(),
                    site: point.site,
                    function: point.function.name.clone(),
                    offset: point.site - point.function.addr,
                });
            }
        }
        let analysed = cache.function(&self.target, at, &point.function)?;
        let func = &*analysed;
        // Text already claimed: the displaced windows and springboards of live splices and of
        // earlier splices of this batch.
        let busy = |lo: u64, hi: u64| claimed.overlaps(lo, hi);
        let input = PlanInput { func, info, read: &read, symbols: self.target.symbols(), busy: &busy, trampoline_near: None };
        let plan = plan_splice(&input, point.site, r.mechanism).map_err(|refusal| SpliceError::Refused {
            at: at.to_string(),
            site: point.site,
            mechanism: r.mechanism,
            refusal,
        })?;
        self.check_windows(at, &plan)?;
        if let Some(name) = r.action.symbol() {
            self.resolve_dest(at, name)?;
        }
        let start = usize::try_from(plan.site - func.start).unwrap_or(usize::MAX);
        let site_text = func.bytes.get(start..start.saturating_add(plan.patch_len)).map(<[u8]>::to_vec);
        let flags_dead = matches!(r.action, Action::Call { .. }) && flags_dead_at(func, plan.site);
        Ok(Planned { point, plan, site_text, flags_dead })
    }

    /// Put the plan's windows to the target's own rules: the displaced window (whole, or one
    /// instruction at a time when longer than a target checks at once) and the springboard.
    fn check_windows(&self, at: &str, plan: &Plan) -> Result<(), SpliceError> {
        let terr = |source| SpliceError::Target { at: at.to_string(), source };
        if plan.displaced_len <= CHECK_WINDOW_MAX {
            self.target.check_site(plan.site, plan.displaced_len).map_err(terr)?;
        } else {
            for i in &plan.displaced {
                self.target.check_site(i.addr, i.len).map_err(terr)?;
            }
        }
        if let Some(sb) = &plan.springboard {
            self.target.check_site(sb.addr, sb.old.len()).map_err(terr)?;
        }
        Ok(())
    }

    /// Apply `requests` as one all-or-nothing batch.
    pub fn apply(&mut self, requests: &[SpliceRequest]) -> Result<Vec<SpliceId>, SpliceError> {
        let start = std::time::Instant::now();
        let mut cache = BatchCache::default();
        let plans = self.plan_batch(requests, &mut cache)?;
        self.verify_components(requests)?;
        let planned = start.elapsed();
        let built = self.build_all(requests, plans, &mut cache)?;
        let built_at = start.elapsed();
        let ids = self.publish(built, &[])?;
        self.record_batch(ids.len(), planned, built_at, start.elapsed());
        Ok(ids)
    }

    fn record_batch(&mut self, splices: usize, planned: std::time::Duration, built: std::time::Duration, done: std::time::Duration) {
        let t = BatchTimings { splices, plan: planned, build: built - planned, commit: done - built };
        log::debug!("batch of {splices} splices: planned in {:?}, built in {:?}, committed in {:?}", t.plan, t.build, t.commit);
        self.last_batch = Some(t);
    }

    /// Apply every request that can be applied, in one batch; report each other one with its
    /// reason. The batch itself is still all-or-nothing: if the target refuses it as a whole
    /// (an error no planning check foresaw) nothing is applied and that error is returned.
    pub fn apply_best_effort(&mut self, requests: &[SpliceRequest]) -> Result<BestEffort, SpliceError> {
        let start = std::time::Instant::now();
        let mut cache = BatchCache::default();
        let planned = self.plan_each_batch(requests, &mut cache);
        self.verify_components(requests)?;
        let planned_at = start.elapsed();
        let mut built: Vec<(usize, Box<LiveSplice>)> = Vec::new();
        let mut refused: Vec<(usize, SpliceError)> = Vec::new();
        for (i, (r, p)) in requests.iter().zip(planned).enumerate() {
            match p.and_then(|planned| self.build(r, planned, &mut cache)) {
                Ok(s) => built.push((i, s)),
                Err(e) => refused.push((i, e)),
            }
        }
        let indices: Vec<usize> = built.iter().map(|(i, _)| *i).collect();
        let built_at = start.elapsed();
        let ids = self.publish(built.into_iter().map(|(_, s)| s).collect(), &[])?;
        self.record_batch(ids.len(), planned_at, built_at, start.elapsed());
        log::debug!("best effort: {} applied, {} refused", ids.len(), refused.len());
        Ok(BestEffort { applied: indices.into_iter().zip(ids).collect(), refused })
    }

    /// Check the code of every component the requests use (CRC of the code as written).
    fn verify_components(&self, requests: &[SpliceRequest]) -> Result<(), SpliceError> {
        let mut seen = Vec::new();
        for r in requests {
            let Some((c, _)) = r.action.symbol().and_then(|n| self.components.lookup(n)) else { continue };
            if !seen.contains(&c) {
                self.components.verify(&self.target, c)?;
                seen.push(c);
            }
        }
        Ok(())
    }

    /// Build the repository side of every planned request (in the order of `requests`); on the
    /// first failure free everything built so far and return that failure.
    #[allow(clippy::vec_box, reason = "the boxes move into the live map as they are")]
    fn build_all(&mut self, requests: &[SpliceRequest], plans: Vec<Planned>, cache: &mut BatchCache) -> Result<Vec<Box<LiveSplice>>, SpliceError> {
        let mut built: Vec<Box<LiveSplice>> = Vec::with_capacity(plans.len());
        for (r, planned) in requests.iter().zip(plans) {
            match self.build(r, planned, cache) {
                Ok(s) => built.push(s),
                Err(e) => {
                    self.discard(&built);
                    return Err(e);
                }
            }
        }
        Ok(built)
    }

    /// Make built splices visible in one text batch, which also gives the sites of `leaving`
    /// (splices already taken out of the live set, for [`Splicer::switch`]) their original bytes
    /// back: dispatch entries first, so that a trap hit the moment it is written finds its way,
    /// then the original-trampoline slots, then every text patch at once. If the target refuses,
    /// everything this made is undone, the built splices are freed and `leaving`'s slots are
    /// theirs again.
    #[allow(clippy::vec_box, reason = "the boxes move into the live map as they are")]
    fn publish(&mut self, built: Vec<Box<LiveSplice>>, leaving: &[Box<LiveSplice>]) -> Result<Vec<SpliceId>, SpliceError> {
        if built.is_empty() && leaving.is_empty() {
            return Ok(Vec::new());
        }
        let entries: Vec<DispatchEntry> = built.iter().filter_map(|s| s.dispatch).collect();
        if !entries.is_empty() {
            if let Err(e) = self.target.add_dispatch(&entries) {
                self.discard(&built);
                return Err(e.into());
            }
        }
        self.set_orig_slots(built.iter().map(|s| &**s), true);
        let mut batch: Vec<TextPatch> = Vec::with_capacity(leaving.len() + built.len());
        batch.extend(leaving.iter().map(|s| s.site_patch.inverse()));
        for s in &built {
            batch.extend(s.springboard_patch.iter().cloned());
            batch.push(s.site_patch.clone());
        }
        // Where a thread may be inside a window: the displaced instructions after the first that
        // start under the patched bytes.
        let interior: Vec<u64> = built
            .iter()
            .flat_map(|s| {
                let end = s.site_patch.addr + s.site_patch.new.len() as u64;
                s.plan.displaced_addrs.iter().copied().filter(move |&a| a > s.site_patch.addr && a < end)
            })
            .collect();
        if let Err(e) = self.target.patch_text_live(&batch, &interior) {
            self.set_orig_slots(built.iter().map(|s| &**s), false);
            // The leaving splices' replays take their slots back.
            self.set_orig_slots(leaving.iter().map(|s| &**s), true);
            let sites: Vec<u64> = entries.iter().map(|e| e.site).collect();
            if !sites.is_empty() {
                let _ = self.target.remove_dispatch(&sites);
            }
            self.discard(&built);
            return Err(e.into());
        }
        let mut ids = Vec::with_capacity(built.len());
        for s in built {
            log::debug!("spliced {} at {:#x} by {} (entry {:#x})", s.request.at, s.point.site, s.plan.mechanism, s.entry);
            if let Some(c) = s.component {
                self.components.acquire(c)?;
            }
            ids.push(s.id);
            self.live.insert(s.id, s);
        }
        Ok(ids)
    }

    /// Allocate and fill the repository side of one splice (nothing visible to running code yet).
    fn build(&mut self, r: &SpliceRequest, mut planned: Planned, cache: &mut BatchCache) -> Result<Box<LiveSplice>, SpliceError> {
        let (dest_fn, component) = match r.action.symbol() {
            Some(name) => self.resolve_dest(&r.at, name)?,
            None => (0, None),
        };
        let terr = |e: TargetError| SpliceError::Target { at: r.at.clone(), source: e };
        let site = planned.point.site;
        let data = self.target.alloc(site, 16, BlockKind::Data).map_err(terr)?;
        let code = match self.target.alloc(site, 512, BlockKind::Code) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.target.free(&data);
                return Err(terr(e));
            }
        };
        let blocks = Blocks { code, data, dest_fn, component };
        let filled = match self.fill(r, &mut planned, &blocks, cache) {
            Ok(f) => f,
            Err(e) => {
                let _ = self.target.free(&blocks.code);
                let _ = self.target.free(&blocks.data);
                return Err(e);
            }
        };
        self.next += 1;
        Ok(Box::new(LiveSplice {
            id: SpliceId(self.next),
            request: r.clone(),
            plan: PlanSummary::of(&planned.plan),
            point: planned.point,
            dest_fn,
            component,
            site_patch: filled.site_patch,
            springboard_patch: filled.springboard_patch,
            code: blocks.code,
            data: blocks.data,
            entry: filled.entry,
            replay: filled.replay,
            dispatch: filled.dispatch,
            handler_range: filled.handler_range,
            inflight: filled.inflight,
        }))
    }

    /// Write the trampoline of one splice into its freshly allocated blocks and make its text
    /// patches (taking the site's bytes from `planned`); the caller frees the blocks if this fails.
    fn fill(&mut self, r: &SpliceRequest, planned: &mut Planned, blocks: &Blocks, cache: &mut BatchCache) -> Result<Filled, SpliceError> {
        let site_text = planned.site_text.take();
        let Planned { point, plan, flags_dead, .. } = &*planned;
        let at = &r.at;
        let site = point.site;
        let (code, data, dest_fn) = (&blocks.code, &blocks.data, blocks.dest_fn);
        let terr = |e: TargetError| SpliceError::Target { at: at.clone(), source: e };
        let refused = |refusal| SpliceError::Refused { at: at.clone(), site, mechanism: plan.mechanism, refusal };
        self.target.write(data, 0, &[0u8; 16]).map_err(terr)?;
        let info = self.target.info();
        let trap = plan.mechanism == Mechanism::Trap;
        let mut handler_range = None;
        let mut inflight = None;
        let (bytes, replay, dispatch) = match &r.action {
            Action::Call { cookie, .. } if trap && info.dispatcher_runs_handlers => {
                let replay = emit_replay(plan, code.addr).map_err(refused)?;
                let d = DispatchEntry { site, dest: code.addr, handler: dest_fn, cookie: *cookie };
                (replay, Some(code.addr), Some(d))
            }
            Action::Call { cookie, .. } => {
                let t = CallTrampoline { addr: code.addr, site, handler: dest_fn, cookie: *cookie, hits: data.addr, inflight: data.addr + 8 };
                let (opts, lean) = self.trampoline_options(point.site, *flags_dead, dest_fn, blocks.component, cache);
                handler_range = lean;
                let bytes = emit_call_trampoline_with(&t, plan, info, &opts).map_err(refused)?;
                (bytes, None, trap.then_some(DispatchEntry { site, dest: code.addr, handler: 0, cookie: 0 }))
            }
            Action::Count if trap && info.dispatcher_counts_hits => {
                let replay = emit_replay(plan, code.addr).map_err(refused)?;
                (replay, Some(code.addr), Some(DispatchEntry { site, dest: code.addr, handler: 0, cookie: 0 }))
            }
            Action::Count => {
                let bytes = emit_counting_replay(code.addr, data.addr, plan, info).map_err(refused)?;
                (bytes, None, trap.then_some(DispatchEntry { site, dest: code.addr, handler: 0, cookie: 0 }))
            }
            Action::Replace { .. } => {
                // The replacement may sleep: count the tasks inside it (see REPLACE_STACK_WORDS
                // for the arguments), in the target's counter where it keeps one.
                let owned = self.target.replace_counter(code);
                inflight = owned.map(|c| c.counter);
                let t = ReplaceTrampoline {
                    addr: code.addr,
                    hits: data.addr,
                    inflight: owned.map_or(data.addr + 8, |c| c.counter),
                    dest: dest_fn,
                    exit: owned.map(|c| c.exit),
                };
                let mut bytes = emit_replace_trampoline(&t, REPLACE_STACK_WORDS).map_err(refused)?;
                bytes.resize(bytes.len().next_multiple_of(16), 0xCC);
                let replay_at = code.addr + bytes.len() as u64;
                bytes.extend(emit_replay(plan, replay_at).map_err(refused)?);
                (bytes, Some(replay_at), trap.then_some(DispatchEntry { site, dest: code.addr, handler: 0, cookie: 0 }))
            }
        };
        if bytes.len() > code.size {
            let reason = "trampoline larger than its block".into();
            return Err(terr(TargetError::Block { addr: code.addr, offset: 0, len: bytes.len(), reason }));
        }
        self.target.write(code, 0, &bytes).map_err(terr)?;
        self.target.seal(code).map_err(terr)?;
        // Every splice enters its code block at the start.
        let entry = code.addr;
        let site_new = match plan.mechanism {
            Mechanism::Trap => trap_bytes(self.target.info().trap_vector).to_vec(),
            Mechanism::Jmp => jmp_bytes(plan, plan.springboard.as_ref().map_or(entry, |sb| sb.addr)).map_err(refused)?,
        };
        // The bytes the planning analysed are the text's bytes: nothing writes text before the
        // batch ends (and the text writer checks them again).
        let old = match site_text.filter(|t| t.len() == site_new.len()) {
            Some(old) => old,
            None => self.target.read(site, site_new.len()).map_err(terr)?,
        };
        let springboard_patch = match &plan.springboard {
            Some(sb) => Some(TextPatch { addr: sb.addr, old: sb.old.clone(), new: springboard_bytes(sb, entry).map_err(refused)?.to_vec() }),
            None => None,
        };
        Ok(Filled { site_patch: TextPatch { addr: site, old, new: site_new }, springboard_patch, entry, replay, dispatch, handler_range, inflight })
    }

    /// What the call trampoline of a splice at `site` with handler `handler` may leave out: the
    /// `popfq` where the flags are dead at the site (`flags_dead`, from the planning), the vector
    /// saves and the in-flight counter where the handler is a lean leaf (then its range,
    /// returned, is scanned at removal).
    fn trampoline_options(
        &self,
        site: u64,
        flags_dead: bool,
        handler: u64,
        component: Option<ComponentId>,
        cache: &mut BatchCache,
    ) -> (TrampolineOptions, Option<(u64, u64)>) {
        let info = self.target.info();
        let lean = cache.lean_leaf(handler, || {
            let s = self.components.get(component?)?.symbols.iter().find(|s| s.addr == handler && s.size > 0)?;
            let bytes = self.target.read(s.addr, usize::try_from(s.size).ok()?).ok()?;
            let lean = analyze_function(&s.name, s.addr, &bytes).is_ok_and(|func| is_lean_leaf(&func));
            log::debug!("handler {} at {handler:#x} {}", s.name, if lean { "is a lean leaf" } else { "needs the full frame" });
            lean.then_some((s.addr, s.addr + s.size))
        });
        log::debug!("trampoline for {site:#x}: flags {}", if flags_dead { "dead" } else { "live" });
        let opts = TrampolineOptions {
            restore_flags: !flags_dead,
            save_vector_regs: info.save_vector_regs && lean.is_none(),
            count_inflight: lean.is_none(),
            // Full extended state where the CPU has XSAVE (read once, baked into the trampoline).
            xsave_size: if info.save_vector_regs { crate::trampoline::host_xsave_size() } else { None },
        };
        (opts, lean)
    }

    /// Free the repository side of splices that never became visible.
    fn discard(&mut self, built: &[Box<LiveSplice>]) {
        for s in built {
            let _ = self.target.free(&s.code);
            let _ = self.target.free(&s.data);
        }
    }

    /// Point the original-trampoline slots of replaced functions at their replays (`on`), or back
    /// at the functions themselves.
    fn set_orig_slots<'a>(&mut self, splices: impl IntoIterator<Item = &'a LiveSplice>, on: bool) {
        for s in splices {
            let (Action::Replace { .. }, Some(replay)) = (&s.request.action, s.replay) else { continue };
            if let Some(stub) = self.orig.get(&s.point.function.name) {
                let v = if on { replay } else { stub.function };
                if let Err(e) = self.target.write(&stub.slot, 0, &v.to_le_bytes()) {
                    log::warn!("original trampoline slot of {}: {e}", s.point.function.name);
                }
            }
        }
    }

    /// Remove splices in one batch; returns their final hit counts.
    pub fn remove(&mut self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        for id in ids {
            if !self.live.contains_key(id) {
                return Err(SpliceError::UnknownSplice(id.0));
            }
        }
        // The trap or jmp is one instruction: no thread can be inside it.
        let batch: Vec<TextPatch> = ids.iter().map(|id| self.live[id].site_patch.inverse()).collect();
        self.target.patch_text_live(&batch, &[])?;
        self.retire(ids)
    }

    /// Removal once the sites hold their original bytes again (by [`Splicer::remove`]'s text
    /// batch, or by [`Splicer::switch`]'s): drop the dispatch entries, point original trampolines
    /// back, wait for quiescence, restore the springboards, free. Returns the final hit counts.
    fn retire(&mut self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        let taken: Vec<Box<LiveSplice>> = ids.iter().filter_map(|id| self.live.remove(id)).collect();
        // The dispatcher's counters go with the dispatch entries: read them now. No trap is
        // still on its way into the dispatcher: the text was written with every CPU stopped, and
        // a CPU is stopped only outside the dispatcher (it runs with interrupts off). The
        // trampolines' counters (as the process backend's) are read after quiescence: a thread
        // still on its way through a trampoline counts its hit after the text is restored.
        let by_dispatcher = self.target.info().dispatcher_counts_hits;
        let (now, later): (Vec<usize>, Vec<usize>) = (0..taken.len()).partition(|&i| by_dispatcher && taken[i].dispatch.is_some());
        let mut hits = vec![Hits::default(); taken.len()];
        for (&i, h) in now.iter().zip(self.hits_of(now.iter().map(|&i| &*taken[i]))) {
            hits[i] = h;
        }
        let sites: Vec<u64> = taken.iter().filter_map(|s| s.dispatch.map(|d| d.site)).collect();
        if !sites.is_empty() {
            self.target.remove_dispatch(&sites)?;
        }
        // A replaced function's original trampoline now goes to the function itself, unless a
        // new splice of the same function (set when it was built) holds the slot.
        let still_replaced: HashSet<u64> =
            self.live.values().filter(|s| matches!(s.request.action, Action::Replace { .. })).map(|s| s.point.function.addr).collect();
        self.set_orig_slots(taken.iter().map(|s| &**s).filter(|s| !still_replaced.contains(&s.point.function.addr)), false);
        let mut ranges = Vec::with_capacity(2 * taken.len());
        for s in &taken {
            s.add_ranges(&mut ranges);
        }
        self.wait_quiescent(&taken, &ranges)?;
        for (&i, h) in later.iter().zip(self.hits_of(later.iter().map(|&i| &*taken[i]))) {
            hits[i] = h;
        }
        let springboards: Vec<TextPatch> = taken.iter().filter_map(|s| s.springboard_patch.as_ref().map(TextPatch::inverse)).collect();
        if !springboards.is_empty() {
            self.target.patch_text_live(&springboards, &[])?;
        }
        for s in &taken {
            if let Some(c) = s.component {
                self.components.release(c)?;
            }
            self.target.free(&s.code)?;
            self.target.free(&s.data)?;
        }
        Ok(hits)
    }

    /// Wait until no thread can be executing in the splices' code. Nothing can enter anew (the
    /// text and dispatch entries are gone before this is called), so it is enough to see, around
    /// one scan of the ranges that finds no thread, that no thread was inside a handler and that
    /// no thread entered a trampoline (the entry counters did not move): a thread entering during
    /// the scan moves a counter; one in the trampoline's prefix or tail is seen by the scan.
    fn wait_quiescent(&mut self, taken: &[Box<LiveSplice>], ranges: &[(u64, u64)]) -> Result<(), SpliceError> {
        // Per splice: its hit counter, then its in-flight counter.
        let addrs: Vec<u64> = taken.iter().flat_map(|s| [s.hits_addr(), s.inflight_addr()]).collect();
        let start = std::time::Instant::now();
        loop {
            let before = read_words(&self.target, &addrs);
            if let Some(i) = before.chunks(2).position(|c| c[1] != 0) {
                if start.elapsed() > std::time::Duration::from_secs(10) {
                    let s = &taken[i];
                    let msg = match &s.request.action {
                        Action::Replace { .. } => format!(
                            "{} task(s) still inside the replacement of {} after 10 s; try again",
                            before[2 * i + 1],
                            s.point.function.name
                        ),
                        _ => format!("a thread is still inside the handler of {} after 10 s", s.request.at),
                    };
                    return Err(TargetError::Quiesce(msg).into());
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
                continue;
            }
            self.target.quiesce(ranges)?;
            if read_words(&self.target, &addrs) == before {
                return Ok(());
            }
        }
    }

    /// Locate `size` bytes of a component variable: its data block and offset.
    fn variable(&self, name: &str, size: usize) -> Result<(RepoBlock, usize), SpliceError> {
        if ![1, 2, 4, 8].contains(&size) {
            return Err(SpliceError::VariableSize { name: name.to_string(), size });
        }
        // A data object of the component at least `size` bytes long, inside its data block.
        let (id, addr) = match self.components.variable(name, size as u64) {
            Ok(found) => found,
            Err(ComponentError::UnknownSymbol { .. }) => return Err(SpliceError::UnknownVariable { name: name.to_string() }),
            Err(e) => return Err(e.into()),
        };
        let c = self.components.get(id).ok_or_else(|| SpliceError::UnknownVariable { name: name.to_string() })?;
        if !c.data.contains(addr) || addr + size as u64 > c.data.addr + c.data.size as u64 {
            return Err(SpliceError::VariableOutside { name: name.to_string(), addr, size });
        }
        // Inside the block (checked above), so the offset fits the block's usize size.
        Ok((c.data.clone(), usize::try_from(addr - c.data.addr).unwrap_or(usize::MAX)))
    }

    /// Write a component variable (`size` 1, 2, 4 or 8 bytes, little endian), as KAPI's memcopy.
    pub fn set_var(&mut self, name: &str, value: u64, size: usize) -> Result<(), SpliceError> {
        let (block, off) = self.variable(name, size)?;
        let bytes = value.to_le_bytes();
        self.target.write(&block, off, &bytes[..size])?;
        log::debug!("set {name} = {value} ({size} bytes at {:#x})", block.addr + off as u64);
        Ok(())
    }

    /// Read a component variable.
    pub fn get_var(&self, name: &str, size: usize) -> Result<u64, SpliceError> {
        let (block, off) = self.variable(name, size)?;
        let b = self.target.read(block.addr + off as u64, size)?;
        let mut v = [0u8; 8];
        v[..size].copy_from_slice(&b);
        Ok(u64::from_le_bytes(v))
    }

    /// Remove every live splice.
    pub fn remove_all(&mut self) -> Result<(), SpliceError> {
        let ids: Vec<SpliceId> = self.live.keys().copied().collect();
        if !ids.is_empty() {
            self.remove(&ids)?;
        }
        Ok(())
    }
}
