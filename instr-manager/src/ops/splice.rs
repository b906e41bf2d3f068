//! Making and removing splices, and listing what is live.

use trapvec::Target;

use super::report::{ComponentRow, Listing, SpliceRow, Unspliced, UnsplicedAll};
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
    for (&id, h) in ids.iter().zip(hits) {
        if let Some(s) = sp.get(id) {
            let mut row = SpliceRow::of(s, h);
            row.returns = sp.return_stats(id)?;
            row.keys = sp.key_counts(id)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Everything live, with its counters now.
pub fn listing<T: Target>(sp: &Splicer<T>) -> Result<Listing, OpError> {
    let ids: Vec<SpliceId> = sp.live().map(|s| s.id).collect();
    let splices = rows_of(sp, &ids)?;
    let components = sp.components().iter().map(ComponentRow::of).collect();
    let retiring = sp
        .retiring()
        .map(|s| SpliceRow::of(s, Hits::default()))
        .collect();
    Ok(Listing {
        splices,
        components,
        retiring,
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
    Ok(UnsplicedAll { unspliced })
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
    let ids: Vec<SpliceId> = sp
        .live()
        .filter(|s| {
            s.request
                .options
                .owner
                .as_ref()
                .is_some_and(crate::owner::Owner::is_gone)
        })
        .map(|s| s.id)
        .collect();
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
    Ok(UnsplicedAll {
        unspliced: unsplice_ids(sp, &ids)?,
    })
}
