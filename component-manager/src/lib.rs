//! component-manager: patch components (x86-64 ELF relocatables) parsed, laid out, linked and
//! loaded into a trapvec repository, and the bookkeeping of what is loaded where.
//!
//! Like `aya-obj`, the work is split into pure passes over owned types and one effectful
//! driver:
//! - [`parse`]: ELF bytes to an owned [`Object`] (checks ELF64, little endian, `ET_REL`,
//!   `EM_X86_64`; decides which sections are loaded; parses `.trapvec.splices`);
//! - [`validate`]: the whole object checked against [`Limits`] before anything is allocated
//!   (section types, sizes, alignments, symbols inside their sections, declared handlers);
//! - [`resolve`]: undefined symbols against loaded components, an [`ExtraSymbols`] hook (which
//!   makes what it answers beforehand, in [`ExtraSymbols::make`]), then the target's symbols;
//!   the pass itself only reads the target;
//! - [`layout`]: offsets of sections, GOT slots and far-call stubs in a code and a data block;
//! - [`reloc`]: supported relocations, their places and targets checked, and the linked images
//!   for given block addresses;
//! - [`manager`]: [`ComponentManager`], which allocates, writes and seals through
//!   `&mut dyn Target`, keeps exports, imports and reference counts, verifies and unloads.
//!
//! A component is untrusted input: whatever its bytes, loading either succeeds with every
//! defined symbol, relocation place and relocation target inside the component (or at a
//! resolved import), or fails with an error naming the culprit, before anything is allocated
//! and without panicking or aborting on a huge size.
//!
//! This crate must never touch memory, signals or text itself: every effect goes through the
//! [`trapvec::Target`] it is handed. It knows nothing of splices beyond the text of the records a
//! component declares ([`DeclaredSplice`]: which keys, each once); the instr-manager
//! deserializes them into its one splice type.

pub mod error;
pub mod layout;
pub mod manager;
pub mod parse;
pub mod reloc;
pub mod resolve;
pub mod rethunk;
pub mod validate;

pub use error::ComponentError;
pub use manager::{
    ComponentId, ComponentManager, ComponentSymbol, LoadOptions, LoadedComponent, SymbolPlace,
};
pub use parse::{DeclaredSplice, Object};
pub use reloc::RelocType;
pub use resolve::{ExtraSymbols, NoExtra};
pub use validate::Limits;
