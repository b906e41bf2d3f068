//! Making and removing splices, and listing what is live.

use trapvec::Target;

use super::report::{
    ComponentRow, GoneOwners, HitsReply, HitsRow, Listing, SpliceRow, Unspliced, UnsplicedAll,
};
use super::{Made, OpError};
use crate::splice::SpliceRequest;
use crate::splicer::{Hits, SpliceId, Splicer};

/// The rows of live splices `ids`, with their counters now (read together).
pub(super) fn rows_of<T: Target>(
    sp: &Splicer<T>,
    ids: &[SpliceId],
) -> Result<Vec<SpliceRow>, OpError> {
    let hits = sp.hits_many(ids)?;
    let mut rows = Vec::with_capacity(ids.len());
    let mut gone = GoneOwners::default();
    for (&id, h) in ids.iter().zip(hits) {
        if let Some(s) = sp.get(id) {
            let mut row = with_component(sp, s, SpliceRow::of_with(s, h, &mut gone));
            row.returns = sp.return_stats(id)?;
            row.keys = sp.key_counts(id)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// `row` with the name of the component its handler is in; orphaned too when that component
/// is a `trapctl trace`'s whose trapctl is gone ([`crate::owner::is_orphaned_trace`]).
fn with_component<T: Target>(
    sp: &Splicer<T>,
    s: &crate::splicer::LiveSplice,
    mut row: SpliceRow,
) -> SpliceRow {
    row.component = s
        .component
        .and_then(|id| sp.components().get(id))
        .map(|c| c.name.clone());
    if row
        .component
        .as_deref()
        .is_some_and(crate::owner::is_orphaned_trace)
    {
        row.orphaned = true;
    }
    row
}

/// Everything live, with its counters now.
pub fn listing<T: Target>(sp: &Splicer<T>) -> Result<Listing, OpError> {
    let ids: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
    let splices = rows_of(sp, &ids)?;
    let components = sp.components().iter().map(ComponentRow::of).collect();
    let retiring = sp
        .retiring()
        .map(|s| with_component(sp, s, SpliceRow::of(s, Hits::default())))
        .collect();
    Ok(Listing {
        splices,
        components,
        retiring,
    })
}

/// The hits of the live splices `ids` (every one must be live, else none is read and the
/// unknown ids are named), else of every live splice: a row (id, site, hits) for each hit at
/// least `min_hits` times, by id. The counters are read together ([`Splicer::hits_many`]; with
/// `min_hits` 1 or more, only the hit ones where the target lists them, [`Splicer::hit_among`]);
/// nothing else of a splice is read or formatted, and only for the rows given back.
pub fn hits<T: Target>(
    sp: &Splicer<T>,
    ids: Option<&[u64]>,
    min_hits: u64,
) -> Result<HitsReply, OpError> {
    let ids: Vec<SpliceId> = match ids {
        Some(ids) => {
            let asked: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
            let unknown: Vec<u64> = asked
                .iter()
                .copied()
                .filter(|&id| sp.get(SpliceId(id)).is_none())
                .collect();
            if !unknown.is_empty() {
                return Err(OpError::NoSpliceId {
                    ids: unknown,
                    live: sp.live().count(),
                });
            }
            asked.into_iter().map(SpliceId).collect()
        }
        None => sp.live().map(|s| s.id).collect(),
    };
    // Asked for hit splices only: those the target lists as hit ([`Splicer::hit_among`]).
    let counters: Vec<(SpliceId, crate::splicer::Hits)> = if min_hits > 0 {
        sp.hit_among(&ids)?
    } else {
        ids.iter().copied().zip(sp.hits_many(&ids)?).collect()
    };
    let splices = counters
        .into_iter()
        .filter(|(_, h)| h.hits >= min_hits)
        .filter_map(|(id, h)| {
            sp.get(id).map(|s| HitsRow {
                id: id.0,
                site: format!("{:#x}", s.point.site),
                hits: h.hits,
            })
        })
        .collect();
    Ok(HitsReply {
        splices,
        read: ids.len(),
    })
}

/// Make one splice.
pub fn splice<T: Target>(
    sp: &mut Splicer<T>,
    request: &SpliceRequest,
) -> Result<(SpliceRow, Made), OpError> {
    let (mut rows, made) = splice_batch(sp, std::slice::from_ref(request))?;
    Ok((rows.remove(0), made))
}

/// Make `requests` in one batch, all or nothing; rows and [`Made::splices`] in request order.
pub fn splice_batch<T: Target>(
    sp: &mut Splicer<T>,
    requests: &[SpliceRequest],
) -> Result<(Vec<SpliceRow>, Made), OpError> {
    let ids = sp.apply(requests)?;
    let rows = rows_of(sp, &ids)?;
    Ok((
        rows,
        Made {
            splices: ids,
            ..Made::default()
        },
    ))
}

/// Remove the splice at `at` (the point as spliced, its function, or the site's address).
/// A retiring splice at `at` (its removal failed to reach quiescence) is finished instead.
pub fn unsplice<T: Target>(sp: &mut Splicer<T>, at: &str) -> Result<Unspliced, OpError> {
    if let Some(id) = sp.find_retiring(at) {
        return Ok(finish_retiring(sp, &[id])?.remove(0));
    }
    let Some(id) = sp.find(at) else {
        let live = sp
            .live()
            .map(|s| format!("{} ({:#x})", s.request.at, s.point.site))
            .collect();
        return Err(OpError::NoSplice {
            at: at.to_string(),
            live,
        });
    };
    Ok(unsplice_ids(sp, &[id])?.remove(0))
}

/// Remove every live splice in one batch, after finishing the retiring ones.
pub fn unsplice_all<T: Target>(sp: &mut Splicer<T>) -> Result<UnsplicedAll, OpError> {
    let retiring: Vec<SpliceId> = sp.retiring().map(|s| s.id).collect();
    let mut unspliced = finish_retiring(sp, &retiring)?;
    let ids: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
    unspliced.extend(unsplice_ids(sp, &ids)?);
    Ok(UnsplicedAll {
        unspliced,
        forgot: Vec::new(),
    })
}

/// Remove, in one batch, every live splice whose function `glob` matches (`'tcp_*'`,
/// `'MOD:nf_*'`; [`crate::glob`]), after finishing the retiring ones it matches. A glob that
/// matches no splice is an error naming the live ones, as a point that names none is.
pub fn unsplice_glob<T: Target>(sp: &mut Splicer<T>, glob: &str) -> Result<UnsplicedAll, OpError> {
    let g = crate::glob::FunctionGlob::new(glob).map_err(super::expand::ExpandError::from)?;
    let of = |s: &crate::splicer::LiveSplice| {
        g.matches(&s.point.function.name, s.point.function.origin.as_deref())
    };
    let retiring: Vec<SpliceId> = sp.retiring().filter(|s| of(s)).map(|s| s.id).collect();
    let ids: Vec<SpliceId> = sp.live().filter(|s| of(s)).map(|s| s.id).collect();
    if retiring.is_empty() && ids.is_empty() {
        let live = sp
            .live()
            .map(|s| format!("{} ({:#x})", s.request.at, s.point.site))
            .collect();
        return Err(OpError::NoSplice {
            at: glob.to_string(),
            live,
        });
    }
    log::debug!(
        "unsplice {glob}: {} live and {} retiring splice(s) match",
        ids.len(),
        retiring.len()
    );
    let mut unspliced = finish_retiring(sp, &retiring)?;
    unspliced.extend(unsplice_ids(sp, &ids)?);
    Ok(UnsplicedAll {
        unspliced,
        forgot: Vec::new(),
    })
}

/// Remove the splices `at` names (each as [`unsplice`] names one) in one batch, after finishing
/// the retiring ones among them; all or nothing: one that names no splice removes none.
pub fn unsplice_each<T: Target>(
    sp: &mut Splicer<T>,
    at: &[String],
) -> Result<UnsplicedAll, OpError> {
    let mut retiring = Vec::new();
    let mut ids = Vec::new();
    // The same splice named twice (by its point and by its site) is removed once.
    let mut seen = std::collections::HashSet::new();
    for a in at {
        if let Some(id) = sp.find_retiring(a) {
            if seen.insert(id) {
                retiring.push(id);
            }
        } else if let Some(id) = sp.find(a) {
            if seen.insert(id) {
                ids.push(id);
            }
        } else {
            let live = sp
                .live()
                .map(|s| format!("{} ({:#x})", s.request.at, s.point.site))
                .collect();
            return Err(OpError::NoSplice {
                at: a.clone(),
                live,
            });
        }
    }
    let mut unspliced = finish_retiring(sp, &retiring)?;
    unspliced.extend(unsplice_ids(sp, &ids)?);
    Ok(UnsplicedAll {
        unspliced,
        forgot: Vec::new(),
    })
}

/// Finish the removal of retiring splices `ids`.
pub(super) fn finish_retiring<T: Target>(
    sp: &mut Splicer<T>,
    ids: &[SpliceId],
) -> Result<Vec<Unspliced>, OpError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let named: Vec<(String, u64)> = ids
        .iter()
        .filter_map(|&id| sp.retiring().find(|s| s.id == id))
        .map(|s| (s.request.at.clone(), s.point.site))
        .collect();
    let hits = sp.finish_retiring(ids)?;
    Ok(unspliced(named, hits))
}

fn unsplice_ids<T: Target>(
    sp: &mut Splicer<T>,
    ids: &[SpliceId],
) -> Result<Vec<Unspliced>, OpError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let named: Vec<(String, u64)> = ids
        .iter()
        .filter_map(|&id| sp.get(id))
        .map(|s| (s.request.at.clone(), s.point.site))
        .collect();
    let hits = sp.remove(ids)?;
    Ok(unspliced(named, hits))
}

fn unspliced(named: Vec<(String, u64)>, hits: Vec<Hits>) -> Vec<Unspliced> {
    named
        .into_iter()
        .zip(hits)
        .map(|((at, site), h)| Unspliced {
            at,
            site: format!("{site:#x}"),
            hits: h.hits,
            missed: h.missed,
        })
        .collect()
}

/// Remove, in one batch, every live splice whose owner is gone (a `trapctl count` or `time`
/// killed by SIGKILL, which could not remove its splice itself); splices without an owner and
/// those of running commands stay.
pub fn unsplice_orphans<T: Target>(sp: &mut Splicer<T>) -> Result<UnsplicedAll, OpError> {
    let mut gone = GoneOwners::default();
    let ids: Vec<SpliceId> = sp
        .live()
        .filter(|s| {
            s.request
                .options
                .owner
                .as_ref()
                .is_some_and(|o| gone.is_gone(o))
        })
        .map(|s| s.id)
        .collect();
    // A kernel `trapctl trace` killed by SIGKILL leaves its component `trace_PID` and the call
    // splices on its handlers, none of them owned: they are orphans too, and the component goes.
    let traces: Vec<_> = sp
        .components()
        .iter()
        .filter(|c| crate::owner::is_orphaned_trace(&c.name))
        .map(|c| (c.id, c.name.clone()))
        .collect();
    let of_traces: Vec<SpliceId> = sp
        .live()
        .filter(|s| !ids.contains(&s.id))
        .filter(|s| traces.iter().any(|(id, _)| s.component == Some(*id)))
        .map(|s| s.id)
        .collect();
    let mut ids = ids;
    ids.extend(of_traces);
    for s in ids.iter().filter_map(|&id| sp.get(id)) {
        log::debug!(
            "orphan: {} at {:#x}, owner {} gone",
            s.request.at,
            s.point.site,
            s.request
                .options
                .owner
                .as_ref()
                .map_or(String::new(), ToString::to_string)
        );
    }
    let unspliced = unsplice_ids(sp, &ids)?;
    for (_, name) in &traces {
        log::info!("orphan: component {name}, its trapctl trace gone: unloaded");
        super::component::unload(sp, name)?;
    }
    Ok(UnsplicedAll {
        unspliced,
        forgot: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Mechanism;
    use crate::splice::Action;
    use trapvec::fake::FakeKernel;

    fn spliced(at: &[&str]) -> (FakeKernel, Splicer<FakeKernel>) {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        let requests: Vec<SpliceRequest> = at
            .iter()
            .map(|f| SpliceRequest::new(*f, Action::Count, Mechanism::Trap))
            .collect();
        sp.apply(&requests).unwrap();
        (k, sp)
    }

    #[test]
    fn unsplice_glob_removes_the_splices_of_every_matching_function_and_no_other() {
        let (k, mut sp) = spliced(&["f0", "f1", "f3"]);
        let all = unsplice_glob(&mut sp, "f[0-2]").unwrap();
        let ats: Vec<&str> = all.unspliced.iter().map(|u| u.at.as_str()).collect();
        assert_eq!(ats, ["f0", "f1"]);
        assert!(!k.trapped("f0") && !k.trapped("f1") && k.trapped("f3"));
        assert_eq!(sp.live().count(), 1);
    }

    #[test]
    fn unsplice_glob_matching_no_splice_is_an_error_naming_the_glob_and_the_live_ones() {
        let (k, mut sp) = spliced(&["f3"]);
        let e = unsplice_glob(&mut sp, "f[0-2]").unwrap_err().to_string();
        assert!(e.starts_with("no splice at `f[0-2]`"), "{e}");
        assert!(e.contains("f3"), "{e}");
        assert!(k.trapped("f3"));
        let e = trapvec::error_chain(&unsplice_glob(&mut sp, "f[").unwrap_err());
        assert!(e.contains("bad glob `f[`"), "{e}");
    }

    #[test]
    fn unsplice_each_removes_every_named_splice_once_or_none() {
        let (k, mut sp) = spliced(&["f0", "f1", "f2"]);
        let site = format!("{:#x}", sp.get(sp.find("f1").unwrap()).unwrap().point.site);
        let e = unsplice_each(&mut sp, &["f0".into(), "f3".into()])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("no splice at `f3`"), "{e}");
        assert!(k.trapped("f0"), "all or nothing: f0 stays");
        let all = unsplice_each(&mut sp, &["f0".into(), "f1".into(), site]).unwrap();
        assert_eq!(all.unspliced.len(), 2, "f1 named twice is removed once");
        assert!(!k.trapped("f0") && !k.trapped("f1") && k.trapped("f2"));
    }
}
