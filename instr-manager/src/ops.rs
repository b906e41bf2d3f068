//! The operations layer, begun: what every front end (trapctl, trapd, the agent, [`crate::session`])
//! does over a [`Splicer`], written once here. So far it holds the one record of what a change
//! made ([`Made`]) with its one [`undo`], used by [`crate::apply`] and `trapctl::ops`, and the
//! splices a loaded component declares ([`declared_requests`]). Load, unload, splice, unsplice,
//! set/get, list and profile switches are still written in `trapctl::ops` (which trapd shares)
//! and, for a process modifying itself, in [`crate::session`].

use component_manager::ComponentId;
use trapvec::Target;

use crate::splice::{SpliceFormError, SpliceRequest};
use crate::splicer::{SpliceError, SpliceId, Splicer};

/// What a change made, for [`undo`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Made {
    pub splices: Vec<SpliceId>,
    pub components: Vec<ComponentId>,
}

impl Made {
    pub fn is_empty(&self) -> bool {
        self.splices.is_empty() && self.components.is_empty()
    }
}

/// Undo a change: its splices (one batch), then its components, newest first. Everything that
/// can be undone is; the first failure is returned.
pub fn undo<T: Target>(sp: &mut Splicer<T>, made: &Made) -> Result<(), SpliceError> {
    let mut first = None;
    if !made.splices.is_empty() {
        if let Err(e) = sp.remove(&made.splices) {
            log::error!("undoing {} splice(s): {e}", made.splices.len());
            first = Some(e);
        }
    }
    for &c in made.components.iter().rev() {
        if let Err(e) = sp.unload_component(c) {
            log::error!("undoing component {}: {e}", c.0);
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// The splices component `id` declares in `.trapvec.splices` (none for an unknown id).
pub fn declared_requests<T: Target>(sp: &Splicer<T>, id: ComponentId) -> Result<Vec<SpliceRequest>, SpliceFormError> {
    let Some(c) = sp.components().get(id) else { return Ok(Vec::new()) };
    c.declared_splices.iter().map(SpliceRequest::from_declared).collect()
}
