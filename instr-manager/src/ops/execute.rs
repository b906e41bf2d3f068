//! The one executor: what every [`Request`] that acts on a splicer does, for trapd (between its
//! journal's intent and the state it stores) and for trapctl's direct path (before it saves the
//! state in the module) alike. Requests only a daemon can answer (its status, profiles, pending
//! points) are trapd's own and refused here.

use component_manager::LoadOptions;
use trapvec::Target;

use super::reply::{ListReply, Reply, SpliceReply, UnspliceReply};
use super::request::Request;
use super::{Made, OpError};
use crate::splicer::Splicer;
use crate::Spec;

/// Execute `request` on `sp`: the reply, and what it [`Made`] (for [`super::undo`] when the
/// caller cannot record the change). Reads make nothing.
pub fn execute<T: Target>(
    sp: &mut Splicer<T>,
    request: &Request,
) -> Result<(Reply, Made), OpError> {
    let nothing = Made::default();
    Ok(match request {
        Request::List => (
            Reply::List(ListReply {
                listing: super::listing(sp)?,
                daemon: None,
            }),
            nothing,
        ),
        Request::Hits { ids, min_hits } => (
            Reply::Hits(super::hits(sp, ids.as_deref(), *min_hits)?),
            nothing,
        ),
        Request::Get { symbol, size } => (Reply::Get(super::get(sp, symbol, *size)?), nothing),
        Request::Apply {
            spec, check: true, ..
        } => (
            Reply::Check(super::check(sp, &Spec::from_path(spec)?)),
            nothing,
        ),
        Request::Apply {
            spec,
            best_effort,
            brief,
            ..
        } => {
            let rows = match brief {
                true => super::Rows::Brief,
                false => super::Rows::Whole,
            };
            let (report, made) = super::apply_as(sp, &Spec::from_path(spec)?, *best_effort, rows)?;
            (Reply::Apply(report), made)
        }
        Request::Load { path, name } => {
            let options = LoadOptions {
                name: name.clone(),
                ..LoadOptions::default()
            };
            let (loaded, made) = super::load(sp, path, &options)?;
            (Reply::Load(loaded), made)
        }
        Request::Unload { name } => (Reply::Unload(super::unload(sp, name)?), nothing),
        Request::Splice(r) => {
            let (row, made) = super::splice(sp, r)?;
            (Reply::Splice(SpliceReply::Made(Box::new(row))), made)
        }
        Request::Unsplice { at: Some(at), .. } if crate::glob::is_glob(at) => (
            Reply::Unsplice(UnspliceReply::All(super::splice::unsplice_glob(sp, at)?)),
            nothing,
        ),
        Request::Unsplice { at: Some(at), .. } => (
            Reply::Unsplice(UnspliceReply::One(super::unsplice(sp, at)?)),
            nothing,
        ),
        Request::Unsplice { at: None, .. } => (
            Reply::Unsplice(UnspliceReply::All(super::unsplice_all(sp)?)),
            nothing,
        ),
        Request::Remove { at } => (
            Reply::Unsplice(UnspliceReply::All(super::splice::unsplice_each(sp, at)?)),
            nothing,
        ),
        Request::Set {
            symbol,
            value,
            size,
        } => {
            let (var, made) = super::set(sp, symbol, value, *size)?;
            (Reply::Set(var), made)
        }
        Request::Status | Request::Activate { .. } | Request::Require { .. } => {
            return Err(OpError::DaemonOnly { op: request.op() })
        }
    })
}
