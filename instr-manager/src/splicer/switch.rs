//! Switching sets of splices in one text batch: the splices of one configuration go and those
//! of another come in a single all-or-nothing write (a daemon's profile switch). There is no
//! moment at which running code sees neither set, or both.
//!
//! Order of effects: plan the new splices as if the old ones were already gone (their sites
//! analysed with their original bytes), build them, then publish them as [`Splicer::apply`]
//! does, in one batch that also holds the old sites' original bytes. Only after that batch
//! succeeded are the old splices retired (dispatch entries removed, code quiesced and freed) as
//! [`Splicer::remove`] does. A failure before or during the batch undoes everything this call
//! built; the old splices stay live.
//!
//! A site both sets splice changes hands *in place* when the old and the new splice are both
//! traps on a target that replaces dispatch entries ([`TargetInfo::replaces_dispatch`](trapvec::TargetInfo::replaces_dispatch)): the trap
//! bytes stay, and the site's dispatch entry is swapped for the new one in one step, so a trap
//! there meets the old splice or the new, never neither. Any other change of hands (trap to
//! jmp, jmp to anything) would need the site's bytes to go through the original in one batch:
//! [`Splicer::switch`] refuses it, and [`Splicer::handovers`] tells a caller which splices to
//! take out first ([`crate::ops::switch`] does).

use std::collections::BTreeSet;

use trapvec::{Target, TargetExt};

use super::batch::BatchCache;
use super::{Hits, LiveSplice, SpliceError, SpliceId, SpliceRequest, Splicer};
use crate::plan::Mechanism;

/// The splices of a switch's `remove` at sites its `add` takes over ([`Splicer::handovers`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handovers {
    /// Changing hands in place: trap to trap, the dispatch entry swapped in one step.
    pub in_place: Vec<SpliceId>,
    /// Changing hands through the original bytes (another mechanism on either side, or a
    /// target that cannot swap entries): [`Splicer::switch`] refuses these; take them out first.
    pub out_first: Vec<SpliceId>,
}

impl<T: Target> Splicer<T> {
    /// Remove the splices `remove` and apply `add` in one text batch; returns the new splices'
    /// ids (in the order of `add`) and the removed splices' final hit counts. A point of `add`
    /// whose site one of `remove`'s holds changes hands in place when both are traps (see the
    /// module docs); otherwise it is refused ([`SpliceError::AlreadySpliced`]).
    pub fn switch(
        &mut self,
        remove: &[SpliceId],
        add: &[SpliceRequest],
    ) -> Result<(Vec<SpliceId>, Vec<Hits>), SpliceError> {
        for id in remove {
            if !self.live.contains_key(id) {
                return Err(SpliceError::UnknownSplice(id.0));
            }
        }
        if add.is_empty() {
            let hits = if remove.is_empty() {
                Vec::new()
            } else {
                self.remove(remove)?
            };
            return Ok((Vec::new(), hits));
        }
        let changing = self.changing_hands(remove, add)?;
        if let Some(&(i, old)) = changing
            .iter()
            .find(|&&(i, old)| !self.in_place(&self.live[&old], &add[i]))
        {
            let other = &self.live[&old];
            return Err(SpliceError::AlreadySpliced {
                at: add[i].at.clone(),
                site: other.point.site,
                other: other.request.at.clone(),
            });
        }
        // Plan against the live set without the splices that go (their text is freed by the
        // same batch), their sites read as they were before them; then put them back whatever
        // planning said.
        let leaving: Vec<Box<LiveSplice>> = remove
            .iter()
            .map(|id| self.live.remove(id).expect("checked above"))
            .collect();
        let mut cache = BatchCache::default();
        cache.keep_originals(
            leaving
                .iter()
                .flat_map(|s| std::iter::once(&s.site_patch).chain(s.springboard_patch.as_ref())),
        );
        cache.keep_trap_windows(
            leaving
                .iter()
                .filter(|s| changing.iter().any(|&(_, old)| old == s.id))
                .map(|s| (s.plan.site, s.plan.displaced_len)),
        );
        let planned = self.plan_batch(add, &mut cache);
        for s in &leaving {
            self.live.insert(s.id, s.clone());
        }
        let plans = planned?;
        self.verify_components(add)?;
        let built = self.build_all(add, plans, &mut cache)?;
        // In place means the same bytes at the site: the trap over the same original bytes.
        for &(i, old) in &changing {
            let (new, old) = (&built[i], &self.live[&old]);
            if new.site_patch != old.site_patch || new.dispatch.is_none() || old.dispatch.is_none()
            {
                let e = SpliceError::AlreadySpliced {
                    at: new.request.at.clone(),
                    site: old.point.site,
                    other: old.request.at.clone(),
                };
                self.discard(&built);
                return Err(e);
            }
        }
        let in_place: BTreeSet<u64> = changing.iter().map(|&(i, _)| built[i].point.site).collect();
        let n_built = built.len();
        let (ids, replaced) = self.publish(built, &leaving, &in_place)?;
        log::debug!(
            "switch: {} splice(s) out, {n_built} in ({} in place), one text batch",
            leaving.len(),
            in_place.len()
        );
        let hits = self.retire_replaced(remove, &replaced)?;
        Ok((ids, hits))
    }

    /// Which splices of `remove` sit at a site a request of `add` takes over, and how each
    /// would change hands ([`Handovers`]). Resolves `add`'s points (the first that does not
    /// resolve is the error); changes nothing. With nothing to remove nothing is resolved.
    pub fn handovers(
        &self,
        remove: &[SpliceId],
        add: &[SpliceRequest],
    ) -> Result<Handovers, SpliceError> {
        let mut out = Handovers::default();
        for (i, old) in self.changing_hands(remove, add)? {
            match self.in_place(&self.live[&old], &add[i]) {
                true => out.in_place.push(old),
                false => out.out_first.push(old),
            }
        }
        Ok(out)
    }

    /// `(index in add, splice of remove)` for each request of `add` at a site a splice of
    /// `remove` holds.
    fn changing_hands(
        &self,
        remove: &[SpliceId],
        add: &[SpliceRequest],
    ) -> Result<Vec<(usize, SpliceId)>, SpliceError> {
        let leaving: Vec<&LiveSplice> = remove
            .iter()
            .filter_map(|id| self.live.get(id).map(|s| &**s))
            .collect();
        if leaving.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for (i, r) in add.iter().enumerate() {
            let site = self.resolve(&r.at)?.site;
            if let Some(old) = leaving.iter().find(|s| s.point.site == site) {
                out.push((i, old.id));
            }
        }
        Ok(out)
    }

    /// Can `new` take `old`'s site over in place: both traps with dispatch entries, on a target
    /// that swaps entries.
    fn in_place(&self, old: &LiveSplice, new: &SpliceRequest) -> bool {
        self.target.replaces_dispatch()
            && old.plan.mechanism == Mechanism::Trap
            && old.dispatch.is_some()
            && new.mechanism == Mechanism::Trap
    }
}
