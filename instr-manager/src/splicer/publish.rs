//! Step 3 of a splice's life, publishing: a batch is planned, built, then made visible at once
//! (dispatch entries first, then the original-trampoline slots, then every text patch in one
//! all-or-nothing write); a failure undoes the batch. [`Splicer::apply`] is all-or-nothing;
//! [`Splicer::apply_best_effort`] applies every request that plans and builds and reports each
//! other one with its reason.

use std::collections::{BTreeMap, BTreeSet};

use trapvec::target::{DispatchEntry, Target, TargetExt, TextPatch, TrapHits};

use super::batch::BatchCache;
use super::{BatchTimings, BestEffort, LiveSplice, SpliceError, SpliceId, SpliceRequest, Splicer};

impl<T: Target> Splicer<T> {
    /// Apply `requests` as one all-or-nothing batch.
    pub fn apply(&mut self, requests: &[SpliceRequest]) -> Result<Vec<SpliceId>, SpliceError> {
        let start = std::time::Instant::now();
        let mut cache = BatchCache::default();
        let plans = self.plan_batch(requests, &mut cache)?;
        self.verify_components(requests)?;
        let planned = start.elapsed();
        let built = self.build_all(requests, plans, &mut cache)?;
        let built_at = start.elapsed();
        let (ids, _) = self.publish(built, &[], &BTreeSet::new())?;
        self.record_batch(
            ids.len(),
            cache.check_time,
            planned,
            built_at,
            start.elapsed(),
        );
        Ok(ids)
    }

    /// Apply every request that can be applied, in one batch; report each other one with its
    /// reason. The batch itself is still all-or-nothing: if the target refuses it as a whole
    /// (an error no planning check foresaw) nothing is applied and that error is returned.
    pub fn apply_best_effort(
        &mut self,
        requests: &[SpliceRequest],
    ) -> Result<BestEffort, SpliceError> {
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
        let (ids, _) = self.publish(
            built.into_iter().map(|(_, s)| s).collect(),
            &[],
            &BTreeSet::new(),
        )?;
        self.record_batch(
            ids.len(),
            cache.check_time,
            planned_at,
            built_at,
            start.elapsed(),
        );
        log::debug!(
            "best effort: {} applied, {} refused",
            ids.len(),
            refused.len()
        );
        Ok(BestEffort {
            applied: indices.into_iter().zip(ids).collect(),
            refused,
        })
    }

    fn record_batch(
        &mut self,
        splices: usize,
        check: std::time::Duration,
        planned: std::time::Duration,
        built: std::time::Duration,
        done: std::time::Duration,
    ) {
        let t = BatchTimings {
            splices,
            plan: planned,
            check,
            build: built - planned,
            commit: done - built,
        };
        log::debug!(
            "batch of {splices} splices: planned in {:?} (the target's checks {:?}), built in {:?}, committed in {:?}",
            t.plan,
            t.check,
            t.build,
            t.commit
        );
        self.last_batch = Some(t);
    }

    /// Make built splices visible in one text batch, which also gives the sites of `leaving`
    /// (splices already taken out of the live set, for [`Splicer::switch`]) their original bytes
    /// back: dispatch entries first, so that a trap hit the moment it is written finds its way,
    /// then the original-trampoline slots, then every text patch at once. If the target refuses,
    /// everything this made is undone, the built splices are freed and `leaving`'s slots are
    /// theirs again.
    ///
    /// `in_place`: sites where a built trap splice takes over from a leaving one without a text
    /// change ([`Splicer::switch`]): their dispatch entries are replaced, each in one step, and
    /// their text is left out of the batch. Returns the new splices' ids and, by site, the
    /// final counts of the entries replaced; a refused batch puts those entries back with them.
    #[allow(
        clippy::vec_box,
        reason = "the boxes move into the live map as they are"
    )]
    pub(super) fn publish(
        &mut self,
        built: Vec<Box<LiveSplice>>,
        leaving: &[Box<LiveSplice>],
        in_place: &BTreeSet<u64>,
    ) -> Result<(Vec<SpliceId>, BTreeMap<u64, TrapHits>), SpliceError> {
        if built.is_empty() && leaving.is_empty() {
            return Ok((Vec::new(), BTreeMap::new()));
        }
        let (swapped, entries): (Vec<DispatchEntry>, Vec<DispatchEntry>) = built
            .iter()
            .filter_map(|s| s.dispatch)
            .partition(|d| in_place.contains(&d.site));
        if !entries.is_empty() {
            if let Err(e) = self.target.add_dispatch(&entries) {
                self.discard(&built);
                return Err(e.into());
            }
        }
        let sites: Vec<u64> = entries.iter().map(|e| e.site).collect();
        let mut replaced = BTreeMap::new();
        if !swapped.is_empty() {
            match self
                .target
                .replace_dispatch(&swapped, &vec![TrapHits::default(); swapped.len()])
            {
                Ok(old) => replaced = swapped.iter().map(|d| d.site).zip(old).collect(),
                Err(e) => {
                    if !sites.is_empty() {
                        let _ = self.target.remove_dispatch(&sites);
                    }
                    self.discard(&built);
                    return Err(e.into());
                }
            }
        }
        self.set_orig_slots(built.iter().map(|s| &**s), true);
        let mut batch: Vec<TextPatch> = Vec::with_capacity(leaving.len() + built.len());
        batch.extend(
            leaving
                .iter()
                .filter(|s| !in_place.contains(&s.point.site))
                .map(|s| s.site_patch.inverse()),
        );
        for s in built.iter().filter(|s| !in_place.contains(&s.point.site)) {
            batch.extend(s.springboard_patch.iter().cloned());
            batch.push(s.site_patch.clone());
        }
        // Where a thread may be inside a window: the displaced instructions after the first that
        // start under the patched bytes.
        let interior: Vec<u64> = built
            .iter()
            .filter(|s| !in_place.contains(&s.point.site))
            .flat_map(|s| {
                let end = s.site_patch.addr + s.site_patch.new.len() as u64;
                s.plan
                    .displaced_addrs
                    .iter()
                    .copied()
                    .filter(move |&a| a > s.site_patch.addr && a < end)
            })
            .collect();
        let written = if batch.is_empty() {
            Ok(())
        } else {
            self.target.patch_text_live(&batch, &interior)
        };
        if let Err(e) = written {
            self.set_orig_slots(built.iter().map(|s| &**s), false);
            // The leaving splices' replays take their slots back.
            self.set_orig_slots(leaving.iter().map(|s| &**s), true);
            let mut still_sent = BTreeSet::new();
            if !replaced.is_empty() {
                // The old entries back, counting on from where they were.
                let old: Vec<DispatchEntry> = leaving
                    .iter()
                    .filter_map(|s| s.dispatch)
                    .filter(|d| replaced.contains_key(&d.site))
                    .collect();
                let counts: Vec<TrapHits> = old.iter().map(|d| replaced[&d.site]).collect();
                if let Err(again) = self.target.replace_dispatch(&old, &counts) {
                    // Only memory running out in the target gets here (the old entries were
                    // valid a moment ago). Their sites still send CPUs to the new splices'
                    // code, which is therefore never freed: leaked, not a crash.
                    log::error!(
                        "putting back the dispatch entries of {} site(s) after a refused batch: {}; their new splices' code stays allocated",
                        old.len(),
                        trapvec::error_chain(&again)
                    );
                    still_sent = replaced.keys().copied().collect();
                }
            }
            if !sites.is_empty() {
                let _ = self.target.remove_dispatch(&sites);
            }
            let freed: Vec<Box<LiveSplice>> = built
                .into_iter()
                .filter(|s| !still_sent.contains(&s.point.site))
                .collect();
            self.discard(&freed);
            return Err(e.into());
        }
        let mut ids = Vec::with_capacity(built.len());
        for s in built {
            log::debug!(
                "spliced {} at {:#x} by {} (entry {:#x})",
                s.request.at,
                s.point.site,
                s.plan.mechanism,
                s.entry
            );
            if let Some(c) = s.component {
                self.components.acquire(c)?;
            }
            ids.push(s.id);
            self.live.insert(s.id, s);
        }
        Ok((ids, replaced))
    }
}
