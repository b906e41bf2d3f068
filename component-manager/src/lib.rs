//! component-manager: patch components (x86-64 ELF relocatables) parsed, laid out, linked and
//! loaded into a trapvec repository, and the bookkeeping of what is loaded where.
//!
//! Like `aya-obj`, the work is split into pure passes over owned types and one effectful
//! driver:
//! - [`parse`]: ELF bytes to an owned [`Object`] (checks ELF64, little endian, `ET_REL`,
//!   `EM_X86_64`; decides which sections are loaded; parses `.trapvec.splices`);
//! - [`resolve`]: undefined symbols against loaded components, an [`ExtraSymbols`] hook, then
//!   the target's symbols;
//! - [`layout`]: offsets of sections, GOT slots and far-call stubs in a code and a data block;
//! - [`reloc`]: supported relocations, and the linked images for given block addresses;
//! - [`manager`]: [`ComponentManager`], which allocates, writes and seals through
//!   `&mut dyn Target`, keeps exports, imports and reference counts, verifies and unloads.
//!
//! This crate must never touch memory, signals or text itself: every effect goes through the
//! [`trapvec::Target`] it is handed. It knows nothing of splices beyond the strings a component
//! declares ([`DeclaredSplice`]); the instr-manager interprets them.

pub mod error;
pub mod layout;
pub mod manager;
pub mod parse;
pub mod reloc;
pub mod resolve;

pub use error::ComponentError;
pub use manager::{ComponentId, ComponentManager, ComponentSymbol, LoadOptions, LoadedComponent};
pub use parse::{DeclaredSplice, Object};
pub use reloc::RelocType;
pub use resolve::{ExtraSymbols, NoExtra};
