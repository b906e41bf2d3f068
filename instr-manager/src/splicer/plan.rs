//! Step 1 of a splice's life, planning: resolve each request's point, analyse its function
//! (the batch's text read in a few spans, each function analysed once: [`super::batch`]), plan
//! the window (trap or jmp, springboard) against the text live splices and earlier requests of
//! the batch claim, and put the windows to the target's own rules ([`Target::check_sites`], or
//! [`Target::check_sites`] for a whole batch: [`super::plan_checks`]).
//! Nothing here allocates or writes: planning only reads the target.

use std::cell::RefCell;
use std::collections::BTreeMap;

use component_manager::{ComponentError, ComponentId};
use trapvec::{Target, TargetExt};

use crate::analysis::liveness::flags_dead_at;
use crate::plan::{plan_splice, Mechanism, Plan, PlanInput, Springboard};
use crate::point::{kernel_entry_len, resolve_point, PointSpec, ResolvedPoint, KERNEL_ENTRY_MAX};

use super::batch::BatchCache;
use super::index::LiveIndex;
use super::plan_checks::{self, Checks};
use super::{LiveSplice, SpliceError, SpliceId, SpliceRequest, Splicer};

/// Longest window a target checks as one window of [`Target::check_sites`] (the kernel module's
/// longest patch); longer windows are checked one displaced instruction at a time.
pub(super) const CHECK_WINDOW_MAX: usize = trapvec::abi::TRAPVEC_PATCH_MAX;

/// How far before or after a function a live text patch is looked for when the function is
/// analysed with the live patches' original bytes (longer than any patch: one starting that far
/// out cannot reach into it).
const PATCH_REACH: u64 = 64;

/// A planned request, with what building it needs to know of the text it was planned on.
pub(super) struct Planned {
    pub(super) point: ResolvedPoint,
    pub(super) plan: Plan,
    /// The displaced window's bytes (`plan.displaced_len` from the site, at least
    /// `plan.patch_len`), as analysed.
    pub(super) site_text: Option<Vec<u8>>,
    /// Whether the status flags are dead at the site (only asked for `call` splices).
    pub(super) flags_dead: bool,
}

/// Text claimed by splices: displaced windows and springboards, as disjoint `[start, end)`
/// ranges keyed by start (a batch of 10,000 splices checks each window in O(log n)). The live
/// splices' claims are read from their index, not copied: a request does not pay for the
/// splices already live.
pub(super) struct Claimed<'a> {
    live: &'a LiveIndex,
    /// Retiring splices' claims and the batch's own: end, and the request of the batch that
    /// claimed it (none for a retiring splice).
    more: BTreeMap<u64, (u64, Option<usize>)>,
    /// The batch's requests whose claims the queries met since [`Claimed::take_met`].
    met: RefCell<Vec<usize>>,
}

impl Claimed<'_> {
    /// `plan`'s window and springboard, claimed by request `owner` of the batch.
    pub(super) fn add(&mut self, plan: &Plan, owner: Option<usize>) {
        self.add_text(
            plan.site,
            plan.displaced_len,
            plan.springboard.as_ref(),
            owner,
        );
    }

    fn add_text(
        &mut self,
        site: u64,
        displaced_len: usize,
        springboard: Option<&Springboard>,
        owner: Option<usize>,
    ) {
        self.more.insert(site, (site + displaced_len as u64, owner));
        if let Some(sb) = springboard {
            self.more.insert(sb.addr, (sb.addr + 5, owner));
        }
    }

    fn met(&self, owner: Option<usize>) {
        if let Some(i) = owner {
            self.met.borrow_mut().push(i);
        }
    }

    /// The requests of the batch whose claims answered a query since the last call.
    pub(super) fn take_met(&self) -> Vec<usize> {
        std::mem::take(&mut *self.met.borrow_mut())
    }

    fn overlaps(&self, lo: u64, hi: u64) -> bool {
        if self.live.claim_overlaps(lo, hi) {
            return true;
        }
        match self.more.range(..hi).next_back() {
            Some((_, &(end, owner))) if end > lo => {
                self.met(owner);
                true
            }
            _ => false,
        }
    }

    fn starts_at(&self, addr: u64) -> bool {
        if self.live.claim_starts_at(addr) {
            return true;
        }
        match self.more.get(&addr) {
            Some(&(_, owner)) => {
                self.met(owner);
                true
            }
            None => false,
        }
    }
}

impl<T: Target> Splicer<T> {
    /// Resolve `at` (as [`SpliceRequest::at`] is written) to the site a splice there would use.
    pub fn resolve(&self, at: &str) -> Result<ResolvedPoint, SpliceError> {
        let spec: PointSpec = at.parse().map_err(|e| SpliceError::Point {
            at: at.to_string(),
            source: e,
        })?;
        let entry_len = |entry: u64| {
            self.target
                .read(entry, KERNEL_ENTRY_MAX)
                .map_or(0, |b| kernel_entry_len(&b))
        };
        resolve_point(&spec, self.target.symbols(), self.target.info(), entry_len).map_err(|e| {
            SpliceError::Point {
                at: at.to_string(),
                source: e,
            }
        })
    }

    /// The live splice at `at`: the point exactly as it was written when spliced, else the
    /// splice whose site `at` resolves to (`tcp_sync_mss` finds the splice at its entry past
    /// the ftrace site; `0x…` finds the splice at that site).
    pub fn find(&self, at: &str) -> Option<SpliceId> {
        let index = self.live.index();
        if let Some(id) = index.by_at(at) {
            return Some(id);
        }
        let site = match at.parse::<PointSpec>() {
            Ok(PointSpec::Address(a)) if index.at_site(a).is_some() => a,
            _ => self.resolve(at).ok()?.site,
        };
        index.at_site(site)
    }

    /// The retiring splice at `at`, matched as [`Splicer::find`] matches live ones.
    pub fn find_retiring(&self, at: &str) -> Option<SpliceId> {
        // None retiring (the usual case): no need to resolve `at` to find none.
        if self.retiring.is_empty() {
            return None;
        }
        self.find_in(self.retiring.values().map(|r| &*r.splice), at)
    }

    /// The splice of `splices` at `at`: the one requested with that text, else the one at the
    /// address `at` names or resolves to.
    pub(super) fn find_in<'a>(
        &self,
        splices: impl Iterator<Item = &'a LiveSplice> + Clone,
        at: &str,
    ) -> Option<SpliceId> {
        if let Some(s) = splices.clone().find(|s| s.request.at == at) {
            return Some(s.id);
        }
        let site = match at.parse::<PointSpec>() {
            Ok(PointSpec::Address(a)) if splices.clone().any(|s| s.point.site == a) => a,
            _ => self.resolve(at).ok()?.site,
        };
        splices
            .into_iter()
            .find(|s| s.point.site == site)
            .map(|s| s.id)
    }

    /// Plan every request without changing anything; returns the plans or the first refusal.
    pub fn plan(
        &self,
        requests: &[SpliceRequest],
    ) -> Result<Vec<(ResolvedPoint, Plan)>, SpliceError> {
        let planned = self.plan_batch(requests, &mut BatchCache::default())?;
        Ok(planned.into_iter().map(|p| (p.point, p.plan)).collect())
    }

    /// [`Splicer::plan`], with what building needs to know of the text, through `cache`.
    pub(super) fn plan_batch(
        &self,
        requests: &[SpliceRequest],
        cache: &mut BatchCache,
    ) -> Result<Vec<Planned>, SpliceError> {
        self.plan_requests(requests, cache, true)
            .into_iter()
            .collect()
    }

    /// Resolve every request's point, and read the text of their functions ahead.
    pub(super) fn resolve_batch(
        &self,
        requests: &[SpliceRequest],
        cache: &mut BatchCache,
    ) -> Vec<Result<ResolvedPoint, SpliceError>> {
        let points: Vec<Result<ResolvedPoint, SpliceError>> =
            requests.iter().map(|r| self.resolve(&r.at)).collect();
        // Only the live patches in (or just before) the batch's functions can change how they
        // analyse: found through the index, not by walking every live splice.
        let mut near: Vec<SpliceId> = points
            .iter()
            .filter_map(|p| p.as_ref().ok())
            .flat_map(|p| {
                let f = &p.function;
                let lo = f.addr.saturating_sub(PATCH_REACH);
                let hi = f.addr.saturating_add(f.size).saturating_add(PATCH_REACH);
                self.live.index().patched_in(lo, hi)
            })
            .collect();
        near.sort_unstable();
        near.dedup();
        cache.set_originals(
            near.iter()
                .map(|id| &*self.live[id])
                .flat_map(|s| std::iter::once(&s.site_patch).chain(s.springboard_patch.as_ref())),
        );
        cache.prefetch(
            &self.target,
            points
                .iter()
                .filter_map(|p| p.as_ref().ok())
                .map(|p| &p.function),
        );
        points
    }

    /// Plan each request on its own, against the live splices and the requests before it that
    /// planned: one result per request, in order. Changes nothing.
    pub fn plan_each(
        &self,
        requests: &[SpliceRequest],
    ) -> Vec<Result<(ResolvedPoint, Plan), SpliceError>> {
        let planned = self.plan_each_batch(requests, &mut BatchCache::default());
        planned
            .into_iter()
            .map(|p| p.map(|p| (p.point, p.plan)))
            .collect()
    }

    /// [`Splicer::plan_each`], with what building needs to know of the text, through `cache`.
    pub(super) fn plan_each_batch(
        &self,
        requests: &[SpliceRequest],
        cache: &mut BatchCache,
    ) -> Vec<Result<Planned, SpliceError>> {
        self.plan_requests(requests, cache, false)
    }

    /// Plan `r` at its resolved `point`. `earlier(site)` names the point of an earlier request of
    /// the batch planned at `site`, if any; `claimed` holds the text live splices and earlier
    /// requests of the batch take; `checks` says how its windows go to the target.
    pub(super) fn plan_one(
        &self,
        r: &SpliceRequest,
        point: ResolvedPoint,
        earlier: &dyn Fn(u64) -> Option<String>,
        claimed: &Claimed,
        cache: &mut BatchCache,
        checks: &mut Checks<'_>,
    ) -> Result<Planned, SpliceError> {
        let at = r.at.as_str();
        let info = self.target.info();
        let read = |a: u64, n: usize| self.target.read(a, n).ok();
        let entry_len =
            |entry: u64| read(entry, KERNEL_ENTRY_MAX).map_or(0, |b| kernel_entry_len(&b));
        // A claim starting at the site is the only way it can be spliced already (the linear
        // searches for the message run only then: batches of thousands stay O(n log n)).
        if claimed.starts_at(point.site) {
            if let Some(other) = self.live.index().at_site(point.site) {
                return Err(SpliceError::AlreadySpliced {
                    at: at.to_string(),
                    site: point.site,
                    other: self.live[&other].request.at.clone(),
                });
            }
            if let Some(other) = earlier(point.site) {
                return Err(SpliceError::AlreadySpliced {
                    at: at.to_string(),
                    site: point.site,
                    other,
                });
            }
        }
        // A predicate's fields are checked before anything is allocated (the spec's form checks
        // them too; a request built in code comes here unchecked).
        r.options
            .only
            .check()
            .map_err(|reason| SpliceError::BadPredicate {
                at: at.to_string(),
                reason,
            })?;
        // A replacement takes over the whole call, and a return point takes the return address
        // from the top of the stack: both need the function's entry.
        if super::actions::kind_of(r).needs_entry() {
            let entry = point.function.addr;
            let past_entry = info.has_fentry && point.site == entry + entry_len(entry);
            if point.site != entry && !past_entry {
                let (at, site, function, offset) = (
                    at.to_string(),
                    point.site,
                    point.function.name.clone(),
                    point.site - point.function.addr,
                );
                return Err(if r.at_return() {
                    SpliceError::ReturnNotAtEntry {
                        at,
                        site,
                        function,
                        offset,
                    }
                } else {
                    SpliceError::ReplaceNotAtEntry {
                        at,
                        site,
                        function,
                        offset,
                    }
                });
            }
        }
        if r.at_return() {
            self.refuse_returns_twice(at, &point)?;
        }
        let analysed = cache.function(&self.target, at, &point.function)?;
        let func = &*analysed;
        // Text already claimed: the displaced windows and springboards of live splices and of
        // earlier splices of this batch.
        let busy = |lo: u64, hi: u64| claimed.overlaps(lo, hi);
        let input = PlanInput {
            func,
            info,
            read: &read,
            symbols: self.target.symbols(),
            busy: &busy,
            trampoline_near: None,
        };
        let plan = plan_splice(&input, point.site, r.mechanism).map_err(|refusal| {
            SpliceError::Refused {
                at: at.to_string(),
                site: point.site,
                mechanism: r.mechanism,
                refusal,
            }
        })?;
        // A trap on the window of a leaving trap takes the site over in place: no text is
        // written there, and the target's rules (which would see the leaving trap as a live
        // patch over the window) were put to the window when that trap was made.
        if !(plan.mechanism == Mechanism::Trap && cache.leaving_trap(plan.site, plan.displaced_len))
        {
            let t = std::time::Instant::now();
            let checked = self.check_windows(at, &plan, checks);
            cache.check_time += t.elapsed();
            checked?;
        }
        if let Some(name) = r.action.symbol() {
            self.resolve_dest(at, name)?;
        }
        let start = usize::try_from(plan.site - func.start).unwrap_or(usize::MAX);
        let site_text = func
            .bytes
            .get(start..start.saturating_add(plan.displaced_len.max(plan.patch_len)))
            .map(<[u8]>::to_vec);
        let flags_dead = super::actions::kind_of(r).asks_flags(r) && flags_dead_at(func, plan.site);
        Ok(Planned {
            point,
            plan,
            site_text,
            flags_dead,
        })
    }

    /// Refuse a return point on a function that returns twice ([`super::returns_twice`]), by
    /// any of the names its address has.
    fn refuse_returns_twice(&self, at: &str, point: &ResolvedPoint) -> Result<(), SpliceError> {
        let f = &point.function;
        let aliases = self.target.symbols().functions_in(f.addr, f.addr + 1);
        for name in std::iter::once(f.name.as_str()).chain(aliases.map(|s| s.name.as_str())) {
            if let Some(why) = super::returns_twice::returns_twice(name) {
                log::debug!("{at}: return point refused: `{name}` returns twice");
                return Err(SpliceError::ReturnsTwice {
                    at: at.to_string(),
                    function: name.to_string(),
                    why,
                });
            }
        }
        Ok(())
    }

    /// Put the plan's windows to the target's own rules ([`plan_checks::windows`]), or record
    /// them for the batch's one check.
    fn check_windows(
        &self,
        at: &str,
        plan: &Plan,
        checks: &mut Checks<'_>,
    ) -> Result<(), SpliceError> {
        for w in plan_checks::windows(plan) {
            match checks {
                Checks::Defer(windows) => windows.push(w),
                Checks::Now(answers) => answers
                    .remove(&w)
                    .unwrap_or_else(|| self.target.check_site(w.0, w.1))
                    .map_err(|source| SpliceError::Target {
                        at: at.to_string(),
                        source,
                    })?,
            }
        }
        Ok(())
    }

    /// Text claimed by live splices, and by retiring ones (their springboards are still
    /// written; a new splice of their sites waits until they are gone).
    pub(super) fn claimed(&self) -> Claimed<'_> {
        let mut claimed = Claimed {
            live: self.live.index(),
            more: BTreeMap::new(),
            met: RefCell::new(Vec::new()),
        };
        for s in self.retiring.values().map(|r| &r.splice) {
            claimed.add_text(
                s.plan.site,
                s.plan.displaced_len,
                s.plan.springboard.as_ref(),
                None,
            );
        }
        claimed
    }

    /// Resolve a handler/replacement name: a loaded component's function, inside its code
    /// (a data symbol or one outside the component is refused with the reason).
    pub(super) fn resolve_dest(
        &self,
        at: &str,
        name: &str,
    ) -> Result<(u64, Option<ComponentId>), SpliceError> {
        match self.components.entry(name) {
            Ok((id, addr)) => Ok((addr, Some(id))),
            Err(ComponentError::UnknownSymbol { .. }) => Err(SpliceError::UnknownHandler {
                at: at.to_string(),
                name: name.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Check the code of every component the requests use (CRC of the code as written).
    pub(super) fn verify_components(&self, requests: &[SpliceRequest]) -> Result<(), SpliceError> {
        let mut seen = Vec::new();
        for r in requests {
            let Some((c, _)) = r.action.symbol().and_then(|n| self.components.lookup(n)) else {
                continue;
            };
            if !seen.contains(&c) {
                self.components.verify(&self.target, c)?;
                seen.push(c);
            }
        }
        Ok(())
    }
}
