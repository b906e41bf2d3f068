//! Switching sets of splices in one text batch: the splices of one configuration go and those
//! of another come in a single all-or-nothing write (a daemon's profile switch). There is no
//! moment at which running code sees neither set, or both.
//!
//! Order of effects: plan the new splices as if the old ones were already gone, build them,
//! add their dispatch entries, then write one batch holding the old sites' original bytes and the
//! new sites' patches (springboards first). Only after that batch succeeded are the old splices'
//! dispatch entries removed, their code quiesced and freed, as [`Splicer::remove`] does. A failure
//! before or during the batch undoes everything this call built; the old splices stay live.

use std::collections::HashSet;


use trapvec::target::{DispatchEntry, TextPatch};
use trapvec::Target;

use super::{Hits, LiveSplice, SpliceError, SpliceId, SpliceRequest, Splicer};

impl<T: Target> Splicer<T> {
    /// Remove the splices `remove` and apply `add` in one text batch; returns the new splices'
    /// ids (in the order of `add`) and the removed splices' final hit counts. A point of `add`
    /// whose site is one of `remove`'s is refused ([`SpliceError::AlreadySpliced`]): one site
    /// cannot change hands inside a batch.
    pub fn switch(&mut self, remove: &[SpliceId], add: &[SpliceRequest]) -> Result<(Vec<SpliceId>, Vec<Hits>), SpliceError> {
        for id in remove {
            if !self.live.contains_key(id) {
                return Err(SpliceError::UnknownSplice(id.0));
            }
        }
        if add.is_empty() {
            let hits = if remove.is_empty() { Vec::new() } else { self.remove(remove)? };
            return Ok((Vec::new(), hits));
        }
        // One site cannot change hands inside a batch (its old bytes would be the trap).
        for r in add {
            let site = self.resolve(&r.at)?.site;
            if let Some(other) = remove.iter().map(|id| &self.live[id]).find(|s| s.point.site == site) {
                return Err(SpliceError::AlreadySpliced { at: r.at.clone(), site, other: other.request.at.clone() });
            }
        }
        // Plan against the live set without the splices that go (their text is freed by the
        // same batch), then put them back whatever planning said.
        let leaving: Vec<LiveSplice> = remove.iter().map(|id| self.live.remove(id).expect("checked above")).collect();
        let planned = self.plan(add);
        for s in &leaving {
            self.live.insert(s.id, s.clone());
        }
        let plans = planned?;
        self.verify_components(add)?;
        let mut built: Vec<LiveSplice> = Vec::with_capacity(plans.len());
        for (r, (point, plan)) in add.iter().zip(plans) {
            match self.build(r, point, plan) {
                Ok(s) => built.push(s),
                Err(e) => {
                    self.discard(&built);
                    return Err(e);
                }
            }
        }
        let entries: Vec<DispatchEntry> = built.iter().filter_map(|s| s.dispatch).collect();
        if !entries.is_empty() {
            if let Err(e) = self.target.add_dispatch(&entries) {
                self.discard(&built);
                return Err(e.into());
            }
        }
        self.set_orig_slots(&built, true);
        let mut batch: Vec<TextPatch> = leaving.iter().map(|s| s.site_patch.inverse()).collect();
        for s in &built {
            batch.extend(s.springboard_patch.iter().cloned());
            batch.push(s.site_patch.clone());
        }
        let interior: Vec<u64> = built
            .iter()
            .flat_map(|s| {
                let end = s.site_patch.addr + s.site_patch.new.len() as u64;
                s.plan.displaced_addrs.iter().copied().filter(move |&a| a > s.site_patch.addr && a < end)
            })
            .collect();
        if let Err(e) = self.target.patch_text_live(&batch, &interior) {
            self.set_orig_slots(&built, false);
            // The leaving splices' replays take their slots back.
            self.set_orig_slots(&leaving, true);
            let sites: Vec<u64> = entries.iter().map(|e| e.site).collect();
            if !sites.is_empty() {
                let _ = self.target.remove_dispatch(&sites);
            }
            self.discard(&built);
            return Err(e.into());
        }
        log::debug!("switch: {} splice(s) out, {} in, one batch of {} patches", leaving.len(), built.len(), batch.len());
        let mut ids = Vec::with_capacity(built.len());
        for s in built {
            if let Some(c) = s.component {
                self.components.acquire(c)?;
            }
            ids.push(s.id);
            self.live.insert(s.id, s);
        }
        let hits = self.retire(remove)?;
        Ok((ids, hits))
    }

    /// The part of [`Splicer::remove`] after the text is restored: drop the dispatch entries,
    /// point original trampolines back, wait for quiescence, restore springboards, free.
    fn retire(&mut self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        let taken: Vec<LiveSplice> = ids.iter().filter_map(|id| self.live.remove(id)).collect();
        // The dispatcher's counters go with the dispatch entries: read them first.
        let mut hits: Vec<Hits> = taken.iter().map(|s| self.hits_of(s)).collect();
        let sites: Vec<u64> = taken.iter().filter_map(|s| s.dispatch.map(|d| d.site)).collect();
        if !sites.is_empty() {
            self.target.remove_dispatch(&sites)?;
        }
        // A replaced function's original trampoline now goes to the function itself, unless a
        // new splice of the same function (set when it was built) holds the slot.
        let still_replaced: HashSet<u64> = self
            .live
            .values()
            .filter(|s| matches!(s.request.action, super::Action::Replace { .. }))
            .map(|s| s.point.function.addr)
            .collect();
        let release: Vec<LiveSplice> = taken.iter().filter(|s| !still_replaced.contains(&s.point.function.addr)).cloned().collect();
        self.set_orig_slots(&release, false);
        let ranges: Vec<(u64, u64)> = taken.iter().flat_map(|s| s.ranges()).collect();
        self.wait_quiescent(&taken, &ranges)?;
        // Trampoline counters may still have moved until quiescence.
        for (h, s) in hits.iter_mut().zip(&taken) {
            let now = self.hits_of(s);
            h.hits = h.hits.max(now.hits);
            h.missed = h.missed.max(now.missed);
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
}
