//! Symbol resolution: every undefined symbol of a component gets an address, searched in order
//! in components already loaded (their exports), the caller's [`ExtraSymbols`] hook, then the
//! target's symbol table. A symbol the component defines itself never reaches this pass: a
//! relocation against it binds to the component's own definition (no interposition).
//!
//! `_GLOBAL_OFFSET_TABLE_`, which `-fPIC` objects name without using it on x86-64 (only
//! `GOTPC32`/`GOTOFF64`, which are not supported, would), is not an import: a relocation
//! against it is refused as having no definition.
//!
//! Resolution is pure: it only reads the target's symbol table, needs no repository memory, and
//! runs before anything of the component is allocated; every unresolved name is reported at
//! once. What the caller's hook will name is made before it, in [`ExtraSymbols::make`].

use std::collections::BTreeMap;

use thiserror::Error;
use trapvec::{SymbolKind, Target};

use crate::manager::ComponentId;
use crate::parse::{Binding, Object, SymbolDef};

/// The linker-defined name of the GOT.
const GOT_SYMBOL: &str = "_GLOBAL_OFFSET_TABLE_";

/// Names the caller answers before the target is asked (the instr-manager answers
/// `__trapvec_orig_<fn>` with the original trampoline of `fn`).
pub trait ExtraSymbols {
    /// Make what the answers will name, before resolution starts: `wanted` are the component's
    /// imports that no loaded component exports. The one step of the hook with effects (the
    /// default makes nothing).
    fn make(&mut self, _target: &mut dyn Target, _wanted: &[&str]) -> Result<(), ResolveError> {
        Ok(())
    }

    /// Part of the pure resolution pass (the target is only read). `None`: not mine, keep
    /// searching. `Some(Err(e))`: mine, but it cannot be had (usually [`ResolveError::Extra`]).
    fn resolve(&mut self, target: &dyn Target, name: &str) -> Option<Result<u64, ResolveError>>;
}

/// An [`ExtraSymbols`] that knows no names.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoExtra;

impl ExtraSymbols for NoExtra {
    fn resolve(&mut self, _target: &dyn Target, _name: &str) -> Option<Result<u64, ResolveError>> {
        None
    }
}

/// Symbols that cannot be resolved.
#[derive(Debug, Error)]
pub enum ResolveError {
    #[error("unresolved symbol{}: {} (searched the loaded components, the caller's extra symbols and the target)", if symbols.len() == 1 { "" } else { "s" }, symbols.join(", "))]
    Unresolved { symbols: Vec<String> },
    #[error("symbol {symbol}: {reason}")]
    Extra { symbol: String, reason: String },
    /// What the caller's hook makes for `symbol` (in [`ExtraSymbols::make`]) failed in the target
    /// (boxed: errors travel by value, and this is the largest).
    #[error("symbol {symbol}: making {what}")]
    Make {
        symbol: String,
        what: String,
        #[source]
        source: Box<trapvec::TargetError>,
    },
}

/// A global symbol exported by a loaded component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Export {
    pub component: ComponentId,
    pub addr: u64,
    pub kind: SymbolKind,
    /// Size in bytes (0 in state saved before sizes were kept).
    #[serde(default)]
    pub size: u64,
    /// A weak definition: a later strong one does not conflict with it (the first stays).
    pub weak: bool,
}

/// Where an import was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportSource {
    Component(ComponentId),
    Extra,
    Target,
    /// A weak undefined symbol found nowhere: its address is 0, as a static linker would make it.
    UndefinedWeak,
}

/// The resolution of one undefined symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    pub name: String,
    pub addr: u64,
    /// What the definition is, when known (`Function` for extra symbols).
    pub kind: SymbolKind,
    /// Size of the definition; 0 when unknown (extra symbols, kernel symbols).
    pub size: u64,
    pub source: ImportSource,
}

/// The named undefined symbols of `obj` that no loaded component exports: what the caller's
/// [`ExtraSymbols`] may be asked for.
pub fn unexported_imports<'a>(obj: &'a Object, exports: &BTreeMap<String, Export>) -> Vec<&'a str> {
    obj.symbols
        .iter()
        .skip(1)
        .filter(|s| {
            s.def == SymbolDef::Undefined
                && !s.name.is_empty()
                && s.name != GOT_SYMBOL
                && !exports.contains_key(&s.name)
        })
        .map(|s| s.name.as_str())
        .collect()
}

/// Resolve every named undefined symbol of `obj`. The result is indexed by symbol index
/// (`None` for symbols that are not imports).
pub fn resolve_imports(
    obj: &Object,
    exports: &BTreeMap<String, Export>,
    extra: &mut dyn ExtraSymbols,
    target: &dyn Target,
) -> Result<Vec<Option<Import>>, ResolveError> {
    let mut imports = vec![None; obj.symbols.len()];
    let mut unresolved = Vec::new();
    for sym in obj.symbols.iter().skip(1) {
        if sym.def != SymbolDef::Undefined || sym.name.is_empty() || sym.name == GOT_SYMBOL {
            continue;
        }
        let name = sym.name.as_str();
        let found = if let Some(e) = exports.get(name) {
            Some((e.addr, e.kind, e.size, ImportSource::Component(e.component)))
        } else if let Some(answer) = extra.resolve(target, name) {
            let addr = answer?;
            Some((addr, SymbolKind::Function, 0, ImportSource::Extra))
        } else if let Some(t) = target.symbols().lookup(name) {
            Some((t.addr, t.kind, t.size, ImportSource::Target))
        } else if sym.binding == Binding::Weak {
            Some((0, SymbolKind::Other, 0, ImportSource::UndefinedWeak))
        } else {
            None
        };
        match found {
            Some((addr, kind, size, source)) => {
                log::debug!("import {name} = {addr:#x} ({kind:?}, {size} bytes, from {source:?})");
                imports[sym.index] = Some(Import {
                    name: name.to_string(),
                    addr,
                    kind,
                    size,
                    source,
                });
            }
            None => unresolved.push(name.to_string()),
        }
    }
    if unresolved.is_empty() {
        Ok(imports)
    } else {
        Err(ResolveError::Unresolved {
            symbols: unresolved,
        })
    }
}
