//! Loading and unloading components. Loading is one thing whoever asks: the component goes
//! where [`super::near`] says (unless the caller placed it), and the splices it declares in
//! `.trapvec.splices` go live with it or it does not stay loaded.

use std::path::Path;

use component_manager::{ComponentId, LoadOptions};
use trapvec::Target;

use super::report::{ComponentRow, Loaded, Unloaded};
use super::splice::{finish_retiring, rows_of};
use super::{near, undone, Made, OpError};
use crate::splice::SpliceRequest;
use crate::splicer::{LiveSplice, SpliceId, Splicer};

/// Load the component at `path` (placed by [`near`] when `opts.near` is 0) and read the splices
/// it declares; a declaration that does not parse unloads it again. The declared splices are
/// the caller's to apply (alone, or in a spec's batch).
pub(super) fn load_declaring<T: Target>(
    sp: &mut Splicer<T>,
    path: &Path,
    opts: &LoadOptions,
) -> Result<(ComponentId, Vec<SpliceRequest>), OpError> {
    let mut opts = opts.clone();
    if opts.near == 0 {
        opts.near = near(sp.target());
    }
    let id = sp
        .load_component(path, &opts)
        .map_err(|source| OpError::Load {
            path: path.display().to_string(),
            source,
        })?;
    match declared(sp, id) {
        Ok(requests) => Ok((id, requests)),
        Err(e) => Err(undone(
            sp,
            &Made {
                components: vec![id],
                ..Made::default()
            },
            e,
        )),
    }
}

/// The splices component `id` declares.
fn declared<T: Target>(sp: &Splicer<T>, id: ComponentId) -> Result<Vec<SpliceRequest>, OpError> {
    let Some(c) = sp.components().get(id) else {
        return Ok(Vec::new());
    };
    c.declared_splices
        .iter()
        .map(SpliceRequest::from_declared)
        .collect::<Result<_, _>>()
        .map_err(|source| OpError::DeclaredForm {
            component: c.label.clone(),
            source,
        })
}

/// Load a component and apply the splices it declares, in one batch; if that batch is refused
/// the component is unloaded again.
pub fn load<T: Target>(
    sp: &mut Splicer<T>,
    path: &Path,
    opts: &LoadOptions,
) -> Result<(Loaded, Made), OpError> {
    let (id, requests) = load_declaring(sp, path, opts)?;
    let mut made = Made {
        components: vec![id],
        ..Made::default()
    };
    if !requests.is_empty() {
        match sp.apply(&requests) {
            Ok(ids) => made.splices = ids,
            Err(source) => {
                return Err(undone(
                    sp,
                    &made,
                    OpError::Declared {
                        path: path.display().to_string(),
                        source,
                    },
                ))
            }
        }
    }
    let component = ComponentRow::of(sp.components().get(id).expect("just loaded"));
    let spliced = rows_of(sp, &made.splices)?;
    Ok((Loaded { component, spliced }, made))
}

/// Unload component `name`, removing the splices it declared first; refused while another
/// splice uses it.
pub fn unload<T: Target>(sp: &mut Splicer<T>, name: &str) -> Result<Unloaded, OpError> {
    let Some(id) = sp.components().by_name(name) else {
        return Err(OpError::NoComponent {
            name: name.to_string(),
            loaded: sp.components().iter().map(|c| c.name.clone()).collect(),
        });
    };
    unload_id(sp, id)
}

/// [`unload`] by id (the session's handles hold ids).
pub(crate) fn unload_id<T: Target>(
    sp: &mut Splicer<T>,
    id: ComponentId,
) -> Result<Unloaded, OpError> {
    let name = sp
        .components()
        .get(id)
        .map(|c| c.name.clone())
        .unwrap_or_default();
    // Its retiring splices first: they hold references on it until they are gone.
    let retiring: Vec<SpliceId> = sp
        .retiring()
        .filter(|s| s.component == Some(id))
        .map(|s| s.id)
        .collect();
    finish_retiring(sp, &retiring)?;
    let declared = declared(sp, id)?;
    let is_declared = |s: &LiveSplice| {
        declared
            .iter()
            .any(|d| d.at == s.request.at && d.action == s.request.action)
    };
    let own: Vec<SpliceId> = sp
        .live()
        .filter(|s| s.component == Some(id) && is_declared(s))
        .map(|s| s.id)
        .collect();
    let users: Vec<String> = sp
        .live()
        .filter(|s| s.component == Some(id) && !own.contains(&s.id))
        .map(|s| s.request.at.clone())
        .collect();
    if !users.is_empty() {
        return Err(OpError::InUse { name, users });
    }
    if !own.is_empty() {
        sp.remove(&own)?;
    }
    sp.unload_component(id)?;
    Ok(Unloaded {
        name,
        declared_removed: own.len(),
    })
}
