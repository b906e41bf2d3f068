//! The checks [`crate::daemon::Daemon::start`] makes of the imported state against what else
//! it knows (the journal's profile, the module's dispatch table), each over an index of the
//! live splices built once: O(N + M) for N live and M asked, not a scan of the live set for
//! each of the M (issue 26, item 4: at 100,000 live and a profile or a table of as many, the
//! scans were 10^10 comparisons, minutes before the daemon served anything).

use std::collections::{HashMap, HashSet};

use instr_manager::splicer::SpliceRequest;
use trapvec::DispatchEntry;

/// Whether every request of `wanted` is among `live` (equal in every field).
pub(crate) fn all_live<'a>(
    live: impl IntoIterator<Item = &'a SpliceRequest>,
    wanted: &[SpliceRequest],
) -> bool {
    // By point, the distinct requests there: a point holds few (one per action, mechanism and
    // options), however many splices repeat one of them.
    let mut by_at: HashMap<&str, Vec<&SpliceRequest>> = HashMap::new();
    for r in live {
        let there = by_at.entry(r.at.as_str()).or_default();
        if !there.contains(&r) {
            there.push(r);
        }
    }
    wanted
        .iter()
        .all(|w| by_at.get(w.at.as_str()).is_some_and(|rs| rs.contains(&w)))
}

/// The entries of `listed` at none of the sites in `known`, in `listed`'s order.
pub(crate) fn unrecorded(
    known: impl IntoIterator<Item = u64>,
    listed: Vec<DispatchEntry>,
) -> Vec<DispatchEntry> {
    let known: HashSet<u64> = known.into_iter().collect();
    listed
        .into_iter()
        .filter(|e| !known.contains(&e.site))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use instr_manager::plan::Mechanism;
    use instr_manager::splicer::{Action, SpliceRequest};
    use trapvec::DispatchEntry;

    use super::{all_live, unrecorded};

    fn req(at: &str, mechanism: Mechanism) -> SpliceRequest {
        SpliceRequest::new(at, Action::Count, mechanism)
    }

    fn entry(site: u64) -> DispatchEntry {
        DispatchEntry {
            site,
            dest: site + 7,
            handler: 0,
            cookie: 0,
            only: None,
        }
    }

    #[test]
    fn all_live_compares_whole_requests_not_only_their_points() {
        let live = [req("f0", Mechanism::Trap), req("f1", Mechanism::Jmp)];
        assert!(all_live(&live, &[]));
        assert!(all_live(&live, &[req("f1", Mechanism::Jmp)]));
        assert!(all_live(&live, &[live[1].clone(), live[0].clone()]));
        assert!(!all_live(&live, &[req("f1", Mechanism::Trap)]));
        assert!(!all_live(
            &live,
            &[req("f0", Mechanism::Trap), req("f2", Mechanism::Trap)]
        ));
        assert!(!all_live([], &[req("f0", Mechanism::Trap)]));
    }

    #[test]
    fn unrecorded_keeps_the_entries_at_sites_no_splice_knows_in_order() {
        let got = unrecorded([0x20, 0x10], vec![entry(0x30), entry(0x10), entry(0x5)]);
        assert_eq!(got.iter().map(|e| e.site).collect::<Vec<_>>(), [0x30, 0x5]);
        assert!(unrecorded([], Vec::new()).is_empty());
    }

    /// 200,000 live against 200,000 asked: 4 * 10^10 comparisons as scans (minutes), well
    /// under a second indexed; 10 s leaves room for a loaded machine.
    #[test]
    fn start_up_checks_of_200000_live_against_200000_asked_take_linear_time() {
        const N: u64 = 200_000;
        let live: Vec<SpliceRequest> = (0..N)
            .map(|i| req(&format!("{:#x}", 0x1000 + 16 * i), Mechanism::Trap))
            .collect();
        // Asked in reverse: a scan from the front finds each late.
        let wanted: Vec<SpliceRequest> = live.iter().rev().cloned().collect();
        let listed: Vec<DispatchEntry> = (0..N).rev().map(|i| entry(0x1000 + 16 * i)).collect();
        let t = Instant::now();
        assert!(all_live(&live, &wanted));
        let left = unrecorded((0..N).map(|i| 0x1000 + 16 * i), listed);
        let took = t.elapsed();
        assert!(left.is_empty(), "{} left", left.len());
        assert!(
            took < Duration::from_secs(10),
            "the start-up checks of {N} live took {took:?}"
        );
    }
}
