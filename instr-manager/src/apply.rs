//! Applying a [`Spec`] to any target: load its components, apply its splices in one batch, write
//! its variables. All or nothing: on any error everything this call did is undone
//! ([`apply_spec`]). [`apply_spec_best_effort`] applies every splice that validates instead, and
//! reports each refused one with its reason; components and variables are still all or nothing.

use std::path::PathBuf;

use component_manager::{ComponentId, LoadOptions};
use trapvec::Target;

use crate::plan::Mechanism;
use crate::spec::Spec;
use crate::splicer::{SpliceError, SpliceId, Splicer};

/// What applying a spec made.
#[derive(Debug, Default)]
pub struct Applied {
    pub components: Vec<ComponentId>,
    /// `(point as written, mechanism, splice)` in spec order.
    pub splices: Vec<(String, Mechanism, SpliceId)>,
}

impl Applied {
    /// The record [`crate::ops::undo`] takes.
    pub fn made(&self) -> crate::ops::Made {
        crate::ops::Made { splices: self.splices.iter().map(|s| s.2).collect(), components: self.components.clone() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("component {path}: {source}")]
    Component { path: PathBuf, #[source] source: Box<SpliceError> },
    #[error(transparent)]
    Splice(#[from] SpliceError),
    #[error("set {symbol}: {source}")]
    Set { symbol: String, #[source] source: Box<SpliceError> },
}

/// What [`apply_spec_best_effort`] made, and each splice it refused: `(point as written, why)`.
#[derive(Debug, Default)]
pub struct AppliedBestEffort {
    pub applied: Applied,
    pub refused: Vec<(String, SpliceError)>,
}

/// Undo what an apply made, through the one undo of [`crate::ops`] (its failures are logged).
fn undo<T: Target>(splicer: &mut Splicer<T>, applied: &Applied) {
    let _ = crate::ops::undo(splicer, &applied.made());
}

/// Load the spec's components (all or none).
fn load_components<T: Target>(splicer: &mut Splicer<T>, spec: &Spec, near: u64, applied: &mut Applied) -> Result<(), ApplyError> {
    for c in &spec.components {
        let opts = LoadOptions { near, expected_crc32: c.crc32, name: None };
        match splicer.load_component(&c.path, &opts) {
            Ok(id) => applied.components.push(id),
            Err(source) => {
                undo(splicer, applied);
                return Err(ApplyError::Component { path: c.path.clone(), source: Box::new(source) });
            }
        }
    }
    Ok(())
}

/// Write the spec's variables; on a failure undo everything `applied` holds.
fn write_sets<T: Target>(splicer: &mut Splicer<T>, spec: &Spec, applied: &Applied) -> Result<(), ApplyError> {
    for s in &spec.sets {
        if let Err(source) = splicer.set_var(&s.symbol, s.value, usize::from(s.size)) {
            undo(splicer, applied);
            return Err(ApplyError::Set { symbol: s.symbol.clone(), source: Box::new(source) });
        }
    }
    Ok(())
}

/// Apply `spec` with every splice that validates; each refused splice is reported with its
/// reason (the caller decides what a refusal means, e.g. trapctl's non-zero exit).
pub fn apply_spec_best_effort<T: Target>(splicer: &mut Splicer<T>, spec: &Spec, near: u64) -> Result<AppliedBestEffort, ApplyError> {
    let mut out = AppliedBestEffort::default();
    load_components(splicer, spec, near, &mut out.applied)?;
    let requests = &spec.splices;
    match splicer.apply_best_effort(requests) {
        Ok(r) => {
            out.applied.splices = r.applied.iter().map(|&(i, id)| (requests[i].at.clone(), requests[i].mechanism, id)).collect();
            out.refused = r.refused.into_iter().map(|(i, e)| (requests[i].at.clone(), e)).collect();
        }
        Err(e) => {
            undo(splicer, &out.applied);
            return Err(e.into());
        }
    }
    write_sets(splicer, spec, &out.applied)?;
    Ok(out)
}

/// Apply `spec`; components are placed near `near` (0: the backend's default).
pub fn apply_spec<T: Target>(splicer: &mut Splicer<T>, spec: &Spec, near: u64) -> Result<Applied, ApplyError> {
    let mut applied = Applied::default();
    load_components(splicer, spec, near, &mut applied)?;
    let requests = &spec.splices;
    match splicer.apply(requests) {
        Ok(ids) => {
            applied.splices = requests.iter().zip(ids).map(|(r, id)| (r.at.clone(), r.mechanism, id)).collect();
        }
        Err(e) => {
            undo(splicer, &applied);
            return Err(e.into());
        }
    }
    write_sets(splicer, spec, &applied)?;
    Ok(applied)
}
