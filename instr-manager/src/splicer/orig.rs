//! Original trampolines: `replace` splices keep the original callable through
//! `__trapvec_orig_<fn>`, a stub `jmp [rip+slot]` whose slot holds the function itself while no
//! replace splice of it is live, and its replay trampoline while one is.
//!
//! A component that imports `__trapvec_orig_<fn>` gets the stub of `fn`. The stub is made
//! (allocated, written, sealed) by [`OrigStubs::make`], which the component manager calls
//! before it resolves the component's symbols; the resolution itself ([`OrigStubs::resolve`])
//! only looks the stub up, and reads nothing but the target's symbol table.

use std::collections::{BTreeMap, HashMap};

use component_manager::resolve::ResolveError;
use component_manager::ExtraSymbols;
use serde::{Deserialize, Serialize};
use trapvec::target::{BlockKind, RepoBlock, Target};
use trapvec::TargetError;

use crate::trampoline::emit_indirect_stub;

use super::{LiveSplice, SpliceId, Splicer};

/// Prefix of the symbols through which components call a replaced function's original.
pub const ORIG_PREFIX: &str = "__trapvec_orig_";

/// The original trampoline of one function: the stub and its indirection slot.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct OrigStub {
    pub(super) function: u64,
    pub(super) code: RepoBlock,
    pub(super) slot: RepoBlock,
}

/// The `__trapvec_orig_*` answers of one component load.
pub(super) struct OrigStubs<'a> {
    pub(super) orig: &'a mut HashMap<String, OrigStub>,
    pub(super) live: &'a BTreeMap<SpliceId, Box<LiveSplice>>,
}

impl ExtraSymbols for OrigStubs<'_> {
    /// Build the stubs the load will name that do not exist yet (of functions the target has;
    /// a missing one is refused by `resolve`).
    fn make(&mut self, target: &mut dyn Target, wanted: &[&str]) -> Result<(), ResolveError> {
        for name in wanted {
            let Some(func) = name.strip_prefix(ORIG_PREFIX) else {
                continue;
            };
            if self.orig.contains_key(func) {
                continue;
            }
            let Some(sym) = target.symbols().lookup(func).cloned() else {
                continue;
            };
            // While a replace splice of `func` is live, the slot points at its replay.
            let current = self
                .live
                .values()
                .find(|s| {
                    s.point.function.addr == sym.addr
                        && super::actions::kind_of(&s.request).replaces_function()
                })
                .and_then(|s| s.replay)
                .unwrap_or(sym.addr);
            let stub = make_orig_stub(target, sym.addr, current).map_err(|(what, source)| {
                ResolveError::Make {
                    symbol: name.to_string(),
                    what: format!("the original trampoline of `{func}`: {what}"),
                    source: Box::new(source),
                }
            })?;
            log::debug!(
                "original trampoline of {func} at {:#x} (slot {:#x} = {current:#x})",
                stub.code.addr,
                stub.slot.addr
            );
            self.orig.insert(func.to_string(), stub);
        }
        Ok(())
    }

    fn resolve(&mut self, target: &dyn Target, name: &str) -> Option<Result<u64, ResolveError>> {
        let func = name.strip_prefix(ORIG_PREFIX)?;
        let refuse = |reason: String| {
            Err(ResolveError::Extra {
                symbol: name.to_string(),
                reason,
            })
        };
        Some(match self.orig.get(func) {
            Some(s) => Ok(s.code.addr),
            None if target.symbols().lookup(func).is_none() => {
                refuse(format!("the target has no function `{func}`"))
            }
            None => refuse(format!("no original trampoline was made for `{func}`")),
        })
    }
}

/// Allocate, write and seal the stub of `function` with its slot holding `current`; on failure
/// free what was allocated, and say which step failed.
fn make_orig_stub(
    target: &mut dyn Target,
    function: u64,
    current: u64,
) -> Result<OrigStub, (&'static str, TargetError)> {
    let slot = target
        .alloc(function, 8, BlockKind::Data)
        .map_err(|e| ("allocating its slot", e))?;
    let code = match target.alloc(function, 16, BlockKind::Code) {
        Ok(c) => c,
        Err(e) => {
            let _ = target.free(&slot);
            return Err(("allocating its code", e));
        }
    };
    let r = (|| {
        target.write(&slot, 0, &current.to_le_bytes())?;
        target.write(&code, 0, &emit_indirect_stub(code.addr, slot.addr))?;
        target.seal(&code)
    })();
    if let Err(e) = r {
        let _ = target.free(&code);
        let _ = target.free(&slot);
        return Err(("writing and sealing it", e));
    }
    Ok(OrigStub {
        function,
        code,
        slot,
    })
}

impl<T: Target> Splicer<T> {
    /// Point the original-trampoline slots of replaced functions at their replays (`on`), or back
    /// at the functions themselves.
    pub(super) fn set_orig_slots<'a>(
        &mut self,
        splices: impl IntoIterator<Item = &'a LiveSplice>,
        on: bool,
    ) {
        for s in splices {
            let Some(replay) = s
                .replay
                .filter(|_| super::actions::kind_of(&s.request).replaces_function())
            else {
                continue;
            };
            if let Some(stub) = self.orig.get(&s.point.function.name) {
                let v = if on { replay } else { stub.function };
                if let Err(e) = self.target.write(&stub.slot, 0, &v.to_le_bytes()) {
                    log::warn!(
                        "original trampoline slot of {}: {}",
                        s.point.function.name,
                        trapvec::error_chain(&e)
                    );
                }
            }
        }
    }
}
