//! Step 4 of a splice's life, removal: restore the text (one batch), drop the dispatch entries
//! and point the original trampolines' slots back at the functions, wait until no thread is in
//! the trampolines, springboards or handlers, restore the springboards, free. A removal that
//! cannot reach quiescence in time (a task sleeping in a replacement) leaves its splices
//! *retiring*: text restored, code kept; [`Splicer::finish_retiring`] ends it later.

use std::collections::{BTreeMap, HashSet};

use trapvec::target::{Target, TargetExt, TextPatch, TrapHits};

use super::batch::read_words;
use super::{Hits, LiveSplice, Retiring, SpliceError, SpliceId, Splicer};

impl<T: Target> Splicer<T> {
    /// Remove splices in one batch; returns their final hit counts.
    pub fn remove(&mut self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        for id in ids {
            if !self.live.contains_key(id) {
                return Err(SpliceError::UnknownSplice(id.0));
            }
        }
        // The trap or jmp is one instruction: no thread can be inside it.
        let batch: Vec<TextPatch> = ids
            .iter()
            .map(|id| self.live[id].site_patch.inverse())
            .collect();
        self.target.patch_text_live(&batch, &[])?;
        self.retire(ids)
    }

    /// Remove every live splice.
    pub fn remove_all(&mut self) -> Result<(), SpliceError> {
        let ids: Vec<SpliceId> = self.live.keys().copied().collect();
        if !ids.is_empty() {
            self.remove(&ids)?;
        }
        Ok(())
    }

    /// Removal once the sites hold their original bytes again (by [`Splicer::remove`]'s text
    /// batch, or by [`Splicer::switch`]'s): drop the dispatch entries, point original trampolines
    /// back, wait for quiescence, restore the springboards, free. Returns the final hit counts.
    pub(super) fn retire(&mut self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        self.retire_replaced(ids, &BTreeMap::new())
    }

    /// [`Splicer::retire`] when some of the splices' dispatch entries were replaced in place
    /// ([`Splicer::switch`]): `replaced` holds, by site, those entries' final counts; such a
    /// site's entry now belongs to the new splice and stays.
    pub(super) fn retire_replaced(
        &mut self,
        ids: &[SpliceId],
        replaced: &BTreeMap<u64, TrapHits>,
    ) -> Result<Vec<Hits>, SpliceError> {
        let taken: Vec<Box<LiveSplice>> =
            ids.iter().filter_map(|id| self.live.remove(id)).collect();
        // The dispatcher's counters go with the dispatch entries: read them now. No trap is
        // still on its way into the dispatcher: the text was written with every CPU stopped, and
        // a CPU is stopped only outside the dispatcher (it runs with interrupts off). The
        // trampolines' counters (as the process backend's) are read after quiescence: a thread
        // still on its way through a trampoline counts its hit after the text is restored.
        let by_dispatcher = self.target.info().dispatcher_counts_hits;
        let swapped = |s: &LiveSplice| s.dispatch.is_some_and(|d| replaced.contains_key(&d.site));
        let now: Vec<usize> = (0..taken.len())
            .filter(|&i| by_dispatcher && taken[i].dispatch.is_some() && !swapped(&taken[i]))
            .collect();
        let mut counted: Vec<Option<Hits>> = vec![None; taken.len()];
        for (&i, h) in now
            .iter()
            .zip(self.hits_of(now.iter().map(|&i| &*taken[i])))
        {
            counted[i] = Some(h);
        }
        for (i, s) in taken.iter().enumerate() {
            if let Some(h) = s
                .dispatch
                .and_then(|d| replaced.get(&d.site))
                .filter(|_| by_dispatcher)
            {
                counted[i] = Some(Hits {
                    hits: h.hits,
                    missed: h.missed,
                });
            }
        }
        let sites: Vec<u64> = taken
            .iter()
            .filter(|s| !swapped(s))
            .filter_map(|s| s.dispatch.map(|d| d.site))
            .collect();
        if !sites.is_empty() {
            self.target.remove_dispatch(&sites)?;
        }
        // A replaced function's original trampoline now goes to the function itself, unless a
        // new splice of the same function (set when it was built) holds the slot.
        // A replacement's site is its function's entry (or just past the ftrace call there):
        // the live splices near each taken one's function entry are found through the index.
        let still_replaced: HashSet<u64> = taken
            .iter()
            .map(|t| t.point.function.addr)
            .filter(|&f| {
                let hi = f.saturating_add(crate::point::KERNEL_ENTRY_MAX as u64 + 1);
                self.live.index().sites_in(f, hi).any(|id| {
                    let s = &self.live[&id];
                    s.point.function.addr == f
                        && super::actions::kind_of(&s.request).replaces_function()
                })
            })
            .collect();
        self.set_orig_slots(
            taken
                .iter()
                .map(|s| &**s)
                .filter(|s| !still_replaced.contains(&s.point.function.addr)),
            false,
        );
        self.finish_removal(taken, counted)
    }

    /// Finish removing retiring splices `ids`: wait for quiescence again, restore their
    /// springboards, free their code. On failure they stay retiring. Returns their final hits.
    pub fn finish_retiring(&mut self, ids: &[SpliceId]) -> Result<Vec<Hits>, SpliceError> {
        for id in ids {
            if !self.retiring.contains_key(id) {
                return Err(SpliceError::UnknownSplice(id.0));
            }
        }
        let (taken, counted): (Vec<Box<LiveSplice>>, Vec<Option<Hits>>) = ids
            .iter()
            .filter_map(|id| self.retiring.remove(id))
            .map(|r| (r.splice, r.hits))
            .unzip();
        log::debug!(
            "finishing the removal of {} retiring splice(s)",
            taken.len()
        );
        self.finish_removal(taken, counted)
    }

    /// The end of a removal, once no thread can enter the splices' code any more (text
    /// restored, dispatch entries gone): wait for quiescence, read the counters not read yet
    /// (`counted[i]` is None), restore the springboards, free. If quiescence is not reached the
    /// splices become retiring and the error says so: running the removal again finishes it.
    // Boxed as in `live` and `retiring`: the splices move between them without copies.
    #[allow(clippy::vec_box)]
    fn finish_removal(
        &mut self,
        mut taken: Vec<Box<LiveSplice>>,
        counted: Vec<Option<Hits>>,
    ) -> Result<Vec<Hits>, SpliceError> {
        let mut ranges = Vec::with_capacity(2 * taken.len());
        for s in &taken {
            s.add_ranges(&mut ranges);
        }
        if let Err(e) = self.wait_quiescent(&taken, &ranges) {
            log::debug!(
                "{} splice(s) left retiring: {}",
                taken.len(),
                trapvec::error_chain(&e)
            );
            let e = match e {
                e @ SpliceError::Retiring { .. } => e,
                e => SpliceError::Retiring {
                    at: taken
                        .iter()
                        .map(|s| s.request.at.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    reason: trapvec::error_chain(&e),
                },
            };
            for (splice, hits) in taken.into_iter().zip(counted) {
                self.retiring.insert(splice.id, Retiring { splice, hits });
            }
            return Err(e);
        }
        // Quiescent: no thread can start a slot's routine any more (the entry half of a return
        // point, a keyed count's counting routine); give the slots back, which for a return
        // point waits for threads in its return handler (before the components go).
        // A slot given back is forgotten at once, so that a removal finished later (after a
        // slot that would not drain) does not give it back twice.
        let mut drained = Ok(());
        for s in taken.iter_mut() {
            let Some(slot) = s.slot() else { continue };
            if let Err(e) = self.target.free_slot(&slot) {
                drained = Err(SpliceError::Retiring {
                    at: s.request.at.clone(),
                    reason: trapvec::error_chain(&e),
                });
                break;
            }
            s.set_slot(None);
        }
        if let Err(e) = drained {
            for (splice, hits) in taken.into_iter().zip(counted) {
                self.retiring.insert(splice.id, Retiring { splice, hits });
            }
            return Err(e);
        }
        let later: Vec<usize> = (0..taken.len()).filter(|&i| counted[i].is_none()).collect();
        let mut hits: Vec<Hits> = counted.iter().map(|h| h.unwrap_or_default()).collect();
        for (&i, h) in later
            .iter()
            .zip(self.hits_of(later.iter().map(|&i| &*taken[i])))
        {
            hits[i] = h;
        }
        let springboards: Vec<TextPatch> = taken
            .iter()
            .filter_map(|s| s.springboard_patch.as_ref().map(TextPatch::inverse))
            .collect();
        if !springboards.is_empty() {
            self.target.patch_text_live(&springboards, &[])?;
        }
        for s in &taken {
            if let Some(c) = s.component {
                self.components.release(c)?;
            }
            self.target.free(&s.code)?;
            if let Some(data) = &s.data {
                self.target.free(data)?;
            }
        }
        Ok(hits)
    }

    /// Wait until no thread can be executing in the splices' code. Nothing can enter anew (the
    /// text and dispatch entries are gone before this is called), so it is enough to see, around
    /// one scan of the ranges that finds no thread, that no thread was inside a handler and that
    /// no thread entered a trampoline (the entry counters did not move): a thread entering during
    /// the scan moves a counter; one in the trampoline's prefix or tail is seen by the scan.
    fn wait_quiescent(
        &mut self,
        taken: &[Box<LiveSplice>],
        ranges: &[(u64, u64)],
    ) -> Result<(), SpliceError> {
        // Per splice that counts in its own words: its hit counter, then its in-flight counter
        // (`counting` names the splice of each pair). A splice without them (the dispatcher
        // counts its hits) is found by the scan alone.
        let counting: Vec<usize> = (0..taken.len())
            .filter(|&i| taken[i].hits_addr().is_some() && taken[i].inflight_addr().is_some())
            .collect();
        let addrs: Vec<u64> = counting
            .iter()
            .flat_map(|&i| [taken[i].hits_addr(), taken[i].inflight_addr()])
            .flatten()
            .collect();
        let start = std::time::Instant::now();
        loop {
            let before = read_words(&self.target, &addrs);
            if let Some(i) = before.chunks(2).position(|c| c[1] != 0) {
                if start.elapsed() > self.quiesce_timeout {
                    let s = &taken[counting[i]];
                    let waited = self.quiesce_timeout;
                    let msg = super::actions::kind_of(&s.request).still_inside(
                        s,
                        before[2 * i + 1],
                        waited,
                    );
                    return Err(SpliceError::Retiring {
                        at: s.request.at.clone(),
                        reason: msg,
                    });
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
}
