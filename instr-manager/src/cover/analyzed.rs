//! One function decoded for a listing ([`super::object_blocks`], `trapctl points`, the kernel's
//! blocks): leniently, with the branch targets of its whole object where they are known.

use trapvec::Symbol;

use crate::analysis::{analyze_function_with, AnalysisOptions, Function, ObjectTargets, ReadFn};

/// `sym`'s bytes over `extent` and its decoded function (leniently: a listing goes on past what
/// cannot be decoded), or `None` when either cannot be had. `trapctl points` lists with it too.
pub fn analyzed(sym: &Symbol, extent: u64, read: ReadFn<'_>) -> Option<(Vec<u8>, Function)> {
    analyzed_or_why(sym, extent, read).ok()
}

/// [`analyzed`], with the branch targets of the function's whole object
/// ([`crate::image::CodeImage::object_targets`]): those inside it that code outside it reaches are block
/// leaders no window may cover.
pub fn analyzed_in(
    sym: &Symbol,
    extent: u64,
    read: ReadFn<'_>,
    targets: &ObjectTargets,
) -> Option<(Vec<u8>, Function)> {
    analyzed_with(sym, extent, read, Some(targets)).ok()
}

/// [`analyzed`], or why not: the bytes cannot be read (`unreadable`), or the decoder's cause.
pub fn analyzed_or_why(
    sym: &Symbol,
    extent: u64,
    read: ReadFn<'_>,
) -> Result<(Vec<u8>, Function), crate::RefusalCause> {
    analyzed_with(sym, extent, read, None)
}

fn analyzed_with(
    sym: &Symbol,
    extent: u64,
    read: ReadFn<'_>,
    object_targets: Option<&ObjectTargets>,
) -> Result<(Vec<u8>, Function), crate::RefusalCause> {
    let bytes = usize::try_from(extent)
        .ok()
        .and_then(|n| read(sym.addr, n))
        .ok_or(crate::RefusalCause::Unreadable)?;
    let func = analyze_function_with(
        &sym.name,
        sym.addr,
        &bytes,
        &AnalysisOptions {
            read: Some(read),
            lenient: true,
            object_targets,
        },
    )
    .map_err(|e| e.cause())?;
    Ok((bytes, func))
}
