//! Indexes over the live splices, kept beside the live map ([`super::state_log::LiveMap`]) and
//! updated by its only two writers (insert, remove), so that a request asks them in O(log n)
//! instead of walking every live splice (issue 26, item 4): the splice requested with a point's
//! text, the splice at a site, the text claimed (displaced windows and springboards), and the
//! text patches (their original bytes, for analysing a function as it was).

use std::collections::{BTreeMap, BTreeSet};

use super::{LiveSplice, SpliceId};

/// Length of a springboard (a rel32 `jmp`), the text it claims.
const SPRINGBOARD_LEN: u64 = 5;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct LiveIndex {
    /// `(point as written, id)`.
    by_at: BTreeSet<(String, SpliceId)>,
    /// `(site, id)`.
    by_site: BTreeSet<(u64, SpliceId)>,
    /// `(start, id)` -> end of the text claimed (displaced window, springboard).
    claims: BTreeMap<(u64, SpliceId), u64>,
    /// `(address, id)` of each text patch (site, springboard).
    patches: BTreeSet<(u64, SpliceId)>,
}

impl LiveIndex {
    /// The index of `splices`, built from scratch.
    pub(super) fn of<'a>(splices: impl IntoIterator<Item = &'a LiveSplice>) -> Self {
        let mut index = LiveIndex::default();
        for s in splices {
            index.add(s);
        }
        index
    }

    pub(super) fn add(&mut self, s: &LiveSplice) {
        self.by_at.insert((s.request.at.clone(), s.id));
        self.by_site.insert((s.point.site, s.id));
        for (lo, hi) in claims_of(s) {
            self.claims.insert((lo, s.id), hi);
        }
        for a in patches_of(s) {
            self.patches.insert((a, s.id));
        }
    }

    pub(super) fn remove(&mut self, s: &LiveSplice) {
        self.by_at.remove(&(s.request.at.clone(), s.id));
        self.by_site.remove(&(s.point.site, s.id));
        for (lo, _) in claims_of(s) {
            self.claims.remove(&(lo, s.id));
        }
        for a in patches_of(s) {
            self.patches.remove(&(a, s.id));
        }
    }

    /// The first (lowest id) splice requested with the text `at`.
    pub(super) fn by_at(&self, at: &str) -> Option<SpliceId> {
        self.by_at
            .range((at.to_string(), SpliceId(0))..)
            .next()
            .filter(|(a, _)| a == at)
            .map(|&(_, id)| id)
    }

    /// The first (lowest id) splice at `site`.
    pub(super) fn at_site(&self, site: u64) -> Option<SpliceId> {
        self.by_site
            .range((site, SpliceId(0))..)
            .next()
            .filter(|(s, _)| *s == site)
            .map(|&(_, id)| id)
    }

    /// The splices whose site is in `[lo, hi)`.
    pub(super) fn sites_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = SpliceId> + '_ {
        self.by_site
            .range((lo, SpliceId(0))..(hi, SpliceId(0)))
            .map(|&(_, id)| id)
    }

    /// Whether the claim starting last before `hi` reaches past `lo` (claims do not overlap
    /// one another, so that is the only one that can).
    pub(super) fn claim_overlaps(&self, lo: u64, hi: u64) -> bool {
        self.claims
            .range(..(hi, SpliceId(0)))
            .next_back()
            .is_some_and(|(_, &end)| end > lo)
    }

    /// Whether a claim starts at `addr`.
    pub(super) fn claim_starts_at(&self, addr: u64) -> bool {
        self.claims
            .range((addr, SpliceId(0))..)
            .next()
            .is_some_and(|(&(start, _), _)| start == addr)
    }

    /// The splices with a text patch starting in `[lo, hi)`: one per patched address, the
    /// lowest id there (the first applied, whose patch holds the text's own bytes; the
    /// planner's claims keep a second off an address, a state imported from elsewhere may
    /// not), so the walk costs the addresses patched in the range, not the splices at them.
    pub(super) fn patched_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = SpliceId> + '_ {
        let mut from = lo;
        std::iter::from_fn(move || {
            let &(addr, id) = self
                .patches
                .range((from, SpliceId(0))..(hi, SpliceId(0)))
                .next()?;
            // addr < hi <= u64::MAX: no overflow.
            from = addr + 1;
            Some(id)
        })
    }
}

fn claims_of(s: &LiveSplice) -> impl Iterator<Item = (u64, u64)> {
    let site = (s.plan.site, s.plan.site + s.plan.displaced_len as u64);
    let sb = s
        .plan
        .springboard
        .as_ref()
        .map(|sb| (sb.addr, sb.addr + SPRINGBOARD_LEN));
    std::iter::once(site).chain(sb)
}

fn patches_of(s: &LiveSplice) -> impl Iterator<Item = u64> {
    std::iter::once(s.site_patch.addr).chain(s.springboard_patch.as_ref().map(|p| p.addr))
}

#[cfg(test)]
mod tests {
    use trapvec::fake::FakeKernel;

    use super::LiveIndex;
    use crate::plan::Mechanism;
    use crate::splicer::{Action, LiveSplice, SpliceId, SpliceRequest, Splicer};

    /// A small deterministic generator (xorshift64*): the sequence is the same on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }

        /// An index below `len`.
        fn below(&mut self, len: usize) -> usize {
            let n = u64::try_from(len).expect("a small length");
            usize::try_from(self.next(n)).expect("below len")
        }
    }

    fn check(sp: &Splicer<FakeKernel>, step: usize) {
        let full = LiveIndex::of(sp.live());
        assert_eq!(
            sp.live.index(),
            &full,
            "step {step}: the index drifted from the live splices"
        );
        for s in sp.live() {
            let scanned = sp.find_in(sp.live.values().map(|s| &**s), &s.request.at);
            assert_eq!(
                sp.find(&s.request.at),
                scanned,
                "step {step}: {}",
                s.request.at
            );
            let site = format!("{:#x}", s.point.site);
            assert_eq!(
                sp.find(&site),
                sp.find_in(sp.live.values().map(|s| &**s), &site),
                "step {step}"
            );
        }
    }

    #[test]
    fn patched_in_yields_each_patched_address_once_however_many_splices_share_it() {
        let mut sp = Splicer::new(FakeKernel::new());
        let count = |at| SpliceRequest::new(at, Action::Count, Mechanism::Trap);
        sp.apply(&[count("f0"), count("f2")]).unwrap();
        let live: Vec<LiveSplice> = sp.live().cloned().collect();
        let mut index = LiveIndex::of(&live);
        // Copies of f0's splice under later ids (a state imported as the latency test's).
        for id in 100..1_100 {
            index.add(&LiveSplice {
                id: SpliceId(id),
                ..live[0].clone()
            });
        }
        let got: Vec<SpliceId> = index
            .patched_in(trapvec::fake::TEXT, trapvec::fake::TEXT + 128)
            .collect();
        assert_eq!(got, live.iter().map(|s| s.id).collect::<Vec<_>>());
        let f2 = trapvec::fake::func_addr("f2");
        assert_eq!(
            index.patched_in(f2, f2 + 32).collect::<Vec<_>>(),
            [live[1].id]
        );
    }

    #[test]
    fn indexes_match_a_full_scan_after_a_seeded_random_sequence_of_applies_and_removes() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let offsets = ["", "+0x4", "+0x5", "+0x7", "+0x9", "+0xc", "+0x10"];
        let (mut applied, mut removed) = (0, 0);
        for step in 0..300 {
            match rng.next(5) {
                0..=2 => {
                    let n = 1 + rng.next(4);
                    let requests: Vec<SpliceRequest> = (0..n)
                        .map(|_| {
                            let at =
                                format!("f{}{}", rng.next(4), offsets[rng.below(offsets.len())]);
                            let mechanism = if rng.next(2) == 0 {
                                Mechanism::Trap
                            } else {
                                Mechanism::Jmp
                            };
                            SpliceRequest::new(&at, Action::Count, mechanism)
                        })
                        .collect();
                    // A batch of which nothing applies is an error: the index must not move.
                    if let Ok(done) = sp.apply_best_effort(&requests) {
                        applied += done.applied.len();
                    }
                }
                3 => {
                    let ids: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
                    if !ids.is_empty() {
                        let id = ids[rng.below(ids.len())];
                        sp.remove(&[id]).unwrap();
                        removed += 1;
                    }
                }
                _ => {
                    if rng.next(4) == 0 {
                        removed += sp.live().count();
                        sp.remove_all().unwrap();
                    }
                }
            }
            check(&sp, step);
        }
        // The sequence exercised both directions.
        assert!(
            applied > 20 && removed > 20,
            "{applied} applied, {removed} removed"
        );
    }
}
