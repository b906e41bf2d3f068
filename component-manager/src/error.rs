//! The crate's top-level error: every failure of loading, verifying or unloading a component,
//! each naming the component and the culprit (file, field, section, symbol, relocation, address).
//!
//! The per-pass errors ([`ParseError`], [`ValidateError`], [`ResolveError`], [`LayoutError`], [`RelocError`])
//! and the target's [`TargetError`] are wrapped with the component's name and kept as the
//! [`source`](std::error::Error::source) (typed, for callers that match on them; the relocation
//! error boxed: it is the largest, and errors travel by value). A message names its own layer
//! only, so [`trapvec::error_chain`] shows everything once: `component foo.o: machine is ...`.

use thiserror::Error;
use trapvec::TargetError;

use crate::layout::LayoutError;
use crate::manager::ComponentId;
use crate::parse::ParseError;
use crate::reloc::RelocError;
use crate::resolve::ResolveError;
use crate::validate::ValidateError;

/// What went wrong with a component.
#[derive(Debug, Error)]
pub enum ComponentError {
    #[error("component {path}: cannot read the file")]
    Io {
        path: String,
        #[source]
        error: std::io::Error,
    },
    #[error("component {component}")]
    Parse {
        component: String,
        #[source]
        error: ParseError,
    },
    #[error(
        "component {component}: CRC32 of the file is {actual:#010x}, expected {expected:#010x}"
    )]
    CrcMismatch {
        component: String,
        expected: u32,
        actual: u32,
    },
    #[error("component {component}: a component named {name:?} is already loaded ({existing})")]
    DuplicateName {
        component: String,
        name: String,
        existing: ComponentId,
    },
    #[error(
        "component {component}: global symbol {symbol} is already defined by component {existing}"
    )]
    DuplicateSymbol {
        component: String,
        symbol: String,
        existing: String,
    },
    #[error("component {component}")]
    Validate {
        component: String,
        #[source]
        error: ValidateError,
    },
    #[error("component {component}")]
    Resolve {
        component: String,
        #[source]
        error: ResolveError,
    },
    #[error("component {component}")]
    Layout {
        component: String,
        #[source]
        error: LayoutError,
    },
    #[error("component {component}")]
    Reloc {
        component: String,
        #[source]
        error: Box<RelocError>,
    },
    #[error("component {component}: {what}")]
    Target {
        component: String,
        what: String,
        #[source]
        error: TargetError,
    },
    #[error("no component {0} is loaded")]
    UnknownId(ComponentId),
    #[error("component {component} is in use by {refs} splice(s)")]
    InUse { component: String, refs: usize },
    #[error("component {component} is not acquired: release without acquire")]
    NotAcquired { component: String },
    #[error("component {component} is imported by {}", importers.join(", "))]
    Imported {
        component: String,
        importers: Vec<String>,
    },
    #[error("no loaded component exports {symbol}")]
    UnknownSymbol { symbol: String },
    #[error("component {component}: {symbol} at {addr:#x} cannot be executed: {reason}")]
    NotAnEntry {
        component: String,
        symbol: String,
        addr: u64,
        reason: String,
    },
    #[error("component {component}: {symbol} at {addr:#x} cannot be accessed as a {size}-byte variable: {reason}")]
    NotAVariable {
        component: String,
        symbol: String,
        addr: u64,
        size: u64,
        reason: String,
    },
    #[error("component {component}: code at {addr:#x} ({len} bytes) has CRC32 {actual:#010x}, expected {expected:#010x} as written")]
    CodeModified {
        component: String,
        addr: u64,
        len: usize,
        expected: u32,
        actual: u32,
    },
}
