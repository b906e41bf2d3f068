//! Whole specs and profile switches: components, splices and variables together.

use std::time::Duration;

use component_manager::LoadOptions;
use trapvec::Target;

use super::component::load_declaring;
use super::expand::{expand, summarize, ExpandError, RefusedPoint, FIRST_REFUSALS};
use super::report::{ApplyReport, CheckReport, CheckRow, ComponentRow, Placed, Timings};
use super::splice::rows_of;
use super::var::{fit_signed, var_size, write};
use super::{undone, Made, OpError};
use crate::spec::Spec;
use crate::splice::SpliceRequest;
use crate::splicer::{SpliceError, SpliceId, Splicer};

/// Load the spec's components that `skip` does not say are there already, collecting the
/// splices they declare; on an error everything `made` holds is undone.
fn load_components<T: Target>(
    sp: &mut Splicer<T>,
    spec: &Spec,
    skip: impl Fn(&Splicer<T>, &std::path::Path) -> bool,
    made: &mut Made,
) -> Result<Vec<SpliceRequest>, OpError> {
    let mut declared = Vec::new();
    for c in &spec.components {
        if skip(sp, &c.path) {
            continue;
        }
        let opts = LoadOptions {
            near: 0,
            expected_crc32: c.crc32,
            name: None,
        };
        match load_declaring(sp, &c.path, &opts) {
            Ok((id, requests)) => {
                made.components.push(id);
                declared.extend(requests);
            }
            Err(e) => return Err(undone(sp, made, e)),
        }
    }
    Ok(declared)
}

/// Write the spec's variables, recording their old values in `made`; on an error everything
/// `made` holds is undone.
fn write_sets<T: Target>(sp: &mut Splicer<T>, spec: &Spec, made: &mut Made) -> Result<(), OpError> {
    for s in &spec.sets {
        let written = var_size(sp, &s.symbol, s.size)
            .and_then(|size| Ok((size, fit_signed(s.value, size)?)))
            .and_then(|(size, value)| write(sp, &s.symbol, value, Some(size)));
        match written {
            Ok(w) => made.vars.push(w),
            Err(e) => return Err(undone(sp, made, e)),
        }
    }
    Ok(())
}

/// `spec`'s splices, then the splices its components declare that it does not make itself.
fn with_declared(splices: &[SpliceRequest], declared: Vec<SpliceRequest>) -> Vec<SpliceRequest> {
    let mut all = splices.to_vec();
    all.extend(declared.into_iter().filter(|d| !splices.contains(d)));
    all
}

/// Apply a spec: load its components, make its splices and those its components declare in
/// one batch, write its variables. All or nothing; with `best_effort` every splice that
/// validates is made instead and each refused one is reported with its reason (components and
/// variables are all or nothing either way).
pub fn apply<T: Target>(
    sp: &mut Splicer<T>,
    spec: &Spec,
    best_effort: bool,
) -> Result<(ApplyReport, Made), OpError> {
    apply_as(sp, spec, best_effort, Rows::Whole)
}

/// How an apply's report names the splices it made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// A whole row each (`spliced`: hits, owner, displaced text, ...).
    Whole,
    /// Id, point and site each (`placed`), the request's `brief`.
    Brief,
}

/// [`apply`], its report's splices named as `rows` says.
pub fn apply_as<T: Target>(
    sp: &mut Splicer<T>,
    spec: &Spec,
    best_effort: bool,
    rows: Rows,
) -> Result<(ApplyReport, Made), OpError> {
    let mut made = Made::default();
    let declared = load_components(sp, spec, |_, _| false, &mut made)?;
    let (own, globbed) = match expand(sp, &spec.splices) {
        Ok(x) => x,
        Err(e) => return Err(undone(sp, &made, e.into())),
    };
    let requests = with_declared(&own, declared);
    let mut refused = Vec::new();
    let mut refused_reasons = Vec::new();
    let mut refused_causes = Vec::new();
    let mut refusals = Vec::new();
    let batch = if best_effort {
        sp.apply_best_effort(&requests).map(|r| {
            let points: Vec<RefusedPoint> = r
                .refused
                .iter()
                .map(|(i, e)| RefusedPoint::of(&requests[*i].at, e))
                .collect();
            if globbed {
                refusals = summarize(&points);
            }
            refused_reasons = points.iter().map(RefusedPoint::reason).collect();
            refused_causes = points.iter().map(RefusedPoint::kind).collect();
            refused = points.into_iter().map(|p| p.chain).collect();
            r.applied.iter().map(|&(_, id)| id).collect()
        })
    } else {
        sp.apply(&requests)
    };
    match batch {
        Ok(ids) => made.splices = ids,
        Err(e) if globbed => {
            let e = all_refusals(sp, &requests).unwrap_or_else(|| e.into());
            return Err(undone(sp, &made, e));
        }
        Err(e) => return Err(undone(sp, &made, e.into())),
    }
    write_sets(sp, spec, &mut made)?;
    let components = made
        .components
        .iter()
        .filter_map(|&c| sp.components().get(c))
        .map(ComponentRow::of)
        .collect();
    let (spliced, placed) = match rows {
        Rows::Whole => (rows_of(sp, &made.splices)?, Vec::new()),
        Rows::Brief => (Vec::new(), placed_of(sp, &made.splices)),
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let timings = sp.last_batch().map(|t| Timings {
        splices: t.splices,
        plan_ms: ms(t.plan),
        check_ms: ms(t.check),
        build_ms: ms(t.build),
        commit_ms: ms(t.commit),
    });
    Ok((
        ApplyReport {
            components,
            spliced,
            placed,
            refused,
            refused_reasons,
            refused_causes,
            refusals,
            requested: own.len(),
            timings,
        },
        made,
    ))
}

/// The splices `ids` by id, point and site.
fn placed_of<T: Target>(sp: &Splicer<T>, ids: &[SpliceId]) -> Vec<Placed> {
    ids.iter()
        .filter_map(|&id| sp.get(id))
        .map(|s| Placed {
            id: s.id.0,
            at: s.request.at.clone(),
            site: format!("{:#x}", s.point.site),
        })
        .collect()
}

/// After an all-or-nothing batch with globs was refused: every refusal planning finds, as one
/// error naming the first few and their count (`None` if planning refuses none of them: the
/// batch's own error then stands).
fn all_refusals<T: Target>(sp: &Splicer<T>, requests: &[SpliceRequest]) -> Option<OpError> {
    let refused: Vec<String> = sp
        .plan_each(requests)
        .into_iter()
        .filter_map(Result::err)
        .map(|e| trapvec::error_chain(&e))
        .collect();
    if refused.is_empty() {
        return None;
    }
    Some(
        ExpandError::Refused {
            count: refused.len(),
            total: requests.len(),
            first: refused.into_iter().take(FIRST_REFUSALS).collect(),
        }
        .into(),
    )
}

/// Plan and check every splice of a spec (each glob as the functions it matches), changing
/// nothing. A glob that is not one or matches nothing is one refusal.
pub fn check<T: Target>(sp: &Splicer<T>, spec: &Spec) -> CheckReport {
    let mut report = CheckReport::default();
    let splices = match expand(sp, &spec.splices) {
        Ok((s, _)) => s,
        Err(e) => {
            report.refused.push(trapvec::error_chain(&e));
            return report;
        }
    };
    for (r, res) in splices.iter().zip(sp.plan_each(&splices)) {
        match res {
            Ok((p, plan)) => report.ok.push(CheckRow {
                at: r.at.clone(),
                site: format!("{:#x}", p.site),
                mechanism: plan.mechanism.to_string(),
                displaced: plan.displaced_text(),
            }),
            Err(e) => report.refused.push(trapvec::error_chain(&e)),
        }
    }
    report
}

/// What a [`switch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Switched {
    pub removed: usize,
    pub added: usize,
    /// Of `removed`, the trap splices whose sites `to` splices by trap differently (another
    /// handler, action or predicate): the site kept its trap and got the new splice's dispatch
    /// entry in one step, with no moment unspliced.
    pub in_place: usize,
    /// Of `removed`, the splices whose sites `to` splices with another mechanism (trap to jmp,
    /// jmp to anything): taken out by a batch of their own just before the switch.
    pub handed_over: usize,
    /// The final hit counts of the removed splices, summed: with `in_place`, every call of a
    /// function that changed hands is counted by its old splice (here) or its new one.
    pub removed_hits: u64,
}

/// Go from the splices `from` to the configuration `to` (a daemon's profile switch): load
/// `to`'s components that are not loaded yet (by path), write its variables, then in one text
/// batch remove the live splices of `from` that `to` does not have and make those `to` adds
/// (its own and those its new components declare). All or nothing: on an error the variables
/// get their old values and the components loaded here go. Undoing a switch is switching back.
///
/// A site that both configurations splice, differently, changes hands. Trap to trap happens in
/// place, inside the switch: the trap stays and the site's dispatch entry is replaced in one
/// step ([`Splicer::switch`]). Any other change of hands needs the site's original bytes in
/// between, which one text batch cannot hold (the site's old bytes would be the old splice's
/// trap or jmp), so the old splices at such sites are removed first, in a batch of their own,
/// and the switch follows: between the two batches (about one batch's time) those functions
/// run their original code, with neither configuration's splice. Should the switch then fail,
/// the splices taken out are made again (the same requests: the same bytes at their sites,
/// their hit counts from zero) before the error is returned, so a refused switch still leaves
/// `from` in place. One case cannot be undone: the batch taking them out could not reach
/// quiescence (a thread stays inside a replacement), so they are retiring and their windows
/// stay reserved until that removal finishes; the error ([`OpError::HandoverLost`]) then says
/// which functions run unspliced.
pub fn switch<T: Target>(
    sp: &mut Splicer<T>,
    from: &[SpliceRequest],
    to: &Spec,
) -> Result<Switched, OpError> {
    let mut remove: Vec<SpliceId> = sp
        .live()
        .filter(|s| from.contains(&s.request) && !to.splices.contains(&s.request))
        .map(|s| s.id)
        .collect();
    let mut made = Made::default();
    let present = |sp: &Splicer<T>, path: &std::path::Path| {
        sp.components()
            .iter()
            .any(|c| c.path.as_deref() == Some(path))
    };
    let declared = load_components(sp, to, present, &mut made)?;
    write_sets(sp, to, &mut made)?;
    let add: Vec<SpliceRequest> = with_declared(&to.splices, declared)
        .into_iter()
        .filter(|r| !sp.live().any(|s| s.request == *r))
        .collect();
    let handovers = match sp.handovers(&remove, &add) {
        Ok(h) => h,
        Err(e) => return Err(undone(sp, &made, e.into())),
    };
    let handover = handovers.out_first;
    let taken_out: Vec<(SpliceId, SpliceRequest)> = handover
        .iter()
        .filter_map(|&id| sp.get(id).map(|s| (id, s.request.clone())))
        .collect();
    let mut removed_hits = 0;
    if !handover.is_empty() {
        match sp.remove(&handover) {
            Ok(hits) => removed_hits += hits.iter().map(|h| h.hits).sum::<u64>(),
            Err(e) => {
                let e = make_again(sp, &taken_out, e);
                return Err(undone(sp, &made, e));
            }
        }
        remove.retain(|id| !handover.contains(id));
    }
    match sp.switch(&remove, &add) {
        Ok((_, hits)) => removed_hits += hits.iter().map(|h| h.hits).sum::<u64>(),
        Err(e) => {
            let e = make_again(sp, &taken_out, e);
            return Err(undone(sp, &made, e));
        }
    }
    Ok(Switched {
        removed: remove.len() + handover.len(),
        added: add.len(),
        in_place: handovers.in_place.len(),
        handed_over: handover.len(),
        removed_hits,
    })
}

/// After a switch was refused with `refused`: make again, in one batch, the splices of
/// `taken_out` that are no longer live (their removal went through, or left them retiring:
/// text restored, code kept until a later removal finishes it). The error to return:
/// `refused`, or [`OpError::HandoverLost`] when they cannot be made again.
fn make_again<T: Target>(
    sp: &mut Splicer<T>,
    taken_out: &[(SpliceId, SpliceRequest)],
    refused: SpliceError,
) -> OpError {
    let gone: Vec<SpliceRequest> = taken_out
        .iter()
        .filter(|(id, _)| sp.get(*id).is_none())
        .map(|(_, r)| r.clone())
        .collect();
    if gone.is_empty() {
        return refused.into();
    }
    match sp.apply(&gone) {
        Ok(_) => refused.into(),
        Err(again) => OpError::HandoverLost {
            refused: Box::new(refused),
            lost: gone.iter().map(|r| r.at.clone()).collect(),
            again: trapvec::error_chain(&again),
        },
    }
}
