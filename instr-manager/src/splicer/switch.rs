//! Switching sets of splices in one text batch: the splices of one configuration go and those
//! of another come in a single all-or-nothing write (a daemon's profile switch). There is no
//! moment at which running code sees neither set, or both.
//!
//! Order of effects: plan the new splices as if the old ones were already gone, build them,
//! then publish them as [`Splicer::apply`] does, in one batch that also holds the old sites'
//! original bytes. Only after that batch succeeded are the old splices retired (dispatch entries
//! removed, code quiesced and freed) as [`Splicer::remove`] does. A failure before or during the
//! batch undoes everything this call built; the old splices stay live.

use trapvec::Target;

use super::batch::BatchCache;
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
        let leaving: Vec<Box<LiveSplice>> = remove.iter().map(|id| self.live.remove(id).expect("checked above")).collect();
        let mut cache = BatchCache::default();
        let planned = self.plan_batch(add, &mut cache);
        for s in &leaving {
            self.live.insert(s.id, s.clone());
        }
        let plans = planned?;
        self.verify_components(add)?;
        let built = self.build_all(add, plans, &mut cache)?;
        let n_built = built.len();
        let ids = self.publish(built, &leaving)?;
        log::debug!("switch: {} splice(s) out, {n_built} in, one text batch", leaving.len());
        let hits = self.retire(remove)?;
        Ok((ids, hits))
    }
}
