//! Planning a batch with the target's checks made at once ([`Target::check_sites`]): the kernel
//! module reads and decodes each function once for all its windows, instead of once per window
//! and ioctl.
//!
//! The answer must be the one of planning request after request with a check each: a request
//! whose window the target refuses claims no text, so a later request may plan where it would
//! have met that claim. So the batch is planned twice, the second time only where it matters:
//! 1. every request is planned in order, its windows recorded instead of checked, and which
//!    earlier requests' claims its planning met (`Claimed` notes them);
//! 2. the target checks every recorded window in one call;
//! 3. in order again: a request that met no claim that has changed since keeps its plan, or
//!    the refusal of its first refused window (its claim then changes); any other is planned
//!    anew against the claims as they now stand, its windows answered from step 2 where they
//!    are the same. Should a plan made anew claim other text than before, every request after
//!    it is planned anew (it might meet that claim; rare: a springboard chosen elsewhere).

use std::collections::HashMap;
use std::ops::Range;

use trapvec::{Target, TargetError, TargetExt};

use crate::plan::Plan;

use super::batch::BatchCache;
use super::plan::{Planned, CHECK_WINDOW_MAX};
use super::{SpliceError, SpliceRequest, Splicer};

/// The target's answers, by window, not yet taken.
pub(super) type Answers = HashMap<(u64, usize), Result<(), TargetError>>;

/// How planning puts a plan's windows to the target.
pub(super) enum Checks<'a> {
    /// Record them: the target checks the batch's windows at once afterwards.
    Defer(&'a mut Vec<(u64, usize)>),
    /// Ask now, taking the batch's answer where there is one.
    Now(&'a mut Answers),
}

/// The windows of `plan` the target checks, in the order they are checked: the displaced window
/// (whole, or one instruction at a time when longer than a target checks at once) and the
/// springboard.
pub(super) fn windows(plan: &Plan) -> Vec<(u64, usize)> {
    let mut w: Vec<(u64, usize)> = if plan.displaced_len <= CHECK_WINDOW_MAX {
        vec![(plan.site, plan.displaced_len)]
    } else {
        plan.displaced.iter().map(|i| (i.addr, i.len)).collect()
    };
    if let Some(sb) = &plan.springboard {
        w.push((sb.addr, sb.old.len()));
    }
    w
}

/// The text a plan claims: site, displaced length, springboard.
fn claim(p: &Result<Planned, SpliceError>) -> Option<(u64, usize, Option<u64>)> {
    p.as_ref().ok().map(|p| {
        let plan = &p.plan;
        (
            plan.site,
            plan.displaced_len,
            plan.springboard.as_ref().map(|s| s.addr),
        )
    })
}

/// A request as the first pass planned it.
struct First {
    /// Its point, kept to plan it again.
    point: Option<crate::point::ResolvedPoint>,
    result: Result<Planned, SpliceError>,
    /// Its windows, in the batch's list, when its planning got as far as the checks.
    windows: Range<usize>,
    /// The earlier requests whose claims its planning met.
    met: Vec<usize>,
}

impl<T: Target> Splicer<T> {
    /// Plan `requests` in order, each against the live splices and the requests before it that
    /// planned, the target's checks made for the batch at once (see the module docs). With
    /// `all_or_nothing`, planning stops at the first refusal (the last result).
    pub(super) fn plan_requests(
        &self,
        requests: &[SpliceRequest],
        cache: &mut BatchCache,
        all_or_nothing: bool,
    ) -> Vec<Result<Planned, SpliceError>> {
        let points = self.resolve_batch(requests, cache);
        let mut claimed = self.claimed();
        let mut windows: Vec<(u64, usize)> = Vec::new();
        let mut first: Vec<First> = Vec::with_capacity(requests.len());
        for (i, (r, point)) in requests.iter().zip(points).enumerate() {
            let earlier = |site: u64| {
                first
                    .iter()
                    .filter_map(|f| f.result.as_ref().ok())
                    .find(|p| p.point.site == site)
                    .map(|p| p.point.spec_text.clone())
            };
            let start = windows.len();
            let kept = point.as_ref().ok().cloned();
            let result = point.and_then(|point| {
                let mut checks = Checks::Defer(&mut windows);
                self.plan_one(r, point, &earlier, &claimed, cache, &mut checks)
            });
            let met = claimed.take_met();
            if let Ok(p) = &result {
                claimed.add(&p.plan, Some(i));
            }
            let stop = all_or_nothing && result.is_err();
            first.push(First {
                point: kept,
                result,
                windows: start..windows.len(),
                met,
            });
            if stop {
                break;
            }
        }

        let t = std::time::Instant::now();
        let mut unique = windows.clone();
        unique.sort_unstable();
        unique.dedup();
        let answers = self.target.check_sites(&unique);
        let mut answers: Answers = unique.into_iter().zip(answers).collect();
        cache.check_time += t.elapsed();
        log::debug!(
            "planned {} requests; the target checked {} windows at once in {:?}",
            first.len(),
            answers.len(),
            t.elapsed()
        );

        let mut claimed = self.claimed();
        let mut changed = vec![false; first.len()];
        let mut again_all = false;
        let mut out: Vec<Result<Planned, SpliceError>> = Vec::with_capacity(first.len());
        for (i, f) in first.into_iter().enumerate() {
            let r = &requests[i];
            let before = claim(&f.result);
            let result = if again_all || f.met.iter().any(|&m| changed[m]) {
                log::debug!("{}: planned again (a claim it met changed)", r.at);
                let earlier = |site: u64| {
                    out.iter()
                        .filter_map(|p| p.as_ref().ok())
                        .find(|p| p.point.site == site)
                        .map(|p| p.point.spec_text.clone())
                };
                let result = match f.point {
                    Some(point) => {
                        let mut checks = Checks::Now(&mut answers);
                        self.plan_one(r, point, &earlier, &claimed, cache, &mut checks)
                    }
                    None => f.result,
                };
                claimed.take_met();
                let after = claim(&result);
                again_all |= after.is_some() && after != before;
                result
            } else {
                let refused = windows[f.windows]
                    .iter()
                    .find_map(|&w| self.answer(&mut answers, w, cache).err());
                match refused {
                    Some(source) => Err(SpliceError::Target {
                        at: r.at.clone(),
                        source,
                    }),
                    None => f.result,
                }
            };
            changed[i] = claim(&result) != before;
            match &result {
                Ok(p) => claimed.add(&p.plan, Some(i)),
                Err(e) => log::debug!("{}: refused: {}", r.at, trapvec::error_chain(e)),
            }
            let stop = all_or_nothing && result.is_err();
            out.push(result);
            if stop {
                break;
            }
        }
        out
    }

    /// The target's answer for window `w`: the batch's, or (asked for a second time) its own.
    pub(super) fn answer(
        &self,
        answers: &mut Answers,
        w: (u64, usize),
        cache: &mut BatchCache,
    ) -> Result<(), TargetError> {
        answers.remove(&w).unwrap_or_else(|| {
            let t = std::time::Instant::now();
            let answer = self.target.check_site(w.0, w.1);
            cache.check_time += t.elapsed();
            answer
        })
    }
}
