//! trapvec: the boundary to the code being modified.
//!
//! This crate owns everything that *touches* a live target: the trap ABI shared with the kernel
//! module ([`abi`]), the [`Target`] trait through which every other crate reads code, allocates
//! repository memory, writes text and manages dispatch entries, and its two backends:
//! [`process`] (the running process modifies itself; the trap arrives as SIGSEGV) and
//! [`kernel`] (ioctls to `/dev/trapvec`, served by `kmod/`).
//!
//! It must never know about components or splices: it moves bytes and dispatch entries that the
//! planners above it have already validated, and it checks again whatever it can check cheaply
//! (expected bytes before every text write, read-back after every repository write).

pub mod abi;
pub mod elfsyms;
pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod kernel;
pub mod keyed;
pub mod predicate;
pub mod process;
pub mod returns;
pub mod slots;
pub mod target;

pub use error::{error_chain, TargetError};
pub use target::{
    BlockKind, DispatchChange, DispatchEntry, DispatchRead, DispatchReading, ReplaceCounter,
    ReplaceCounters, RepoBlock, Symbol, SymbolKind, SymbolTable, Target, TargetExt, TargetInfo,
    TaskFields, TextPatch, TrapHits,
};
