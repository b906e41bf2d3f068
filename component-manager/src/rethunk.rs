//! Return thunks in kernel components, put right as the kernel's module loader puts them right.
//!
//! A component built with the kernel's flags (`-mfunction-return=thunk-extern`) returns through
//! `jmp __x86_return_thunk` (and `jcc __x86_return_thunk` where a return is conditional). The
//! kernel never runs those as compiled: when it loads a module, `apply_returns()` rewrites each
//! such site from the `.return_sites` table objtool made, to a plain `ret` where no return
//! mitigation is in use, else to a jump to the thunk the mitigation chose (`x86_return_thunk`).
//! trapvec's components are not loaded by the kernel, so the component manager does the same:
//! Linux 6.12's `__x86_return_thunk` warns ("Unpatched return thunk in use") when a site that
//! nobody rewrote reaches it, and on 6.1 such a site would skip the chosen mitigation.
//!
//! What the kernel uses is read from the target once per load: the value of its
//! `x86_return_thunk` variable, against the address of `__x86_return_thunk`. A target without
//! them (a process, a kernel before return thunks) keeps the component's bytes as compiled.

use object::elf::{R_X86_64_PC32, R_X86_64_PLT32};
use trapvec::Target;

use crate::layout::Layout;
use crate::parse::Object;

/// The symbol compilers jump to for a return.
pub const RETURN_THUNK: &str = "__x86_return_thunk";
/// The kernel variable holding the thunk its return mitigation uses.
pub const CHOSEN_THUNK: &str = "x86_return_thunk";

/// What a component's return-thunk sites become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Returns {
    /// Leave the bytes as compiled (not a kernel, or a kernel without return thunks).
    AsCompiled,
    /// A plain `ret`: the kernel uses no return thunk.
    Plain,
    /// A jump to this thunk, the one the kernel's mitigation chose.
    Thunk(u64),
}

impl Returns {
    /// What `target`'s kernel does with its own return sites.
    pub fn of(target: &dyn Target) -> Returns {
        let symbols = target.symbols();
        let (Some(default), Some(chosen)) =
            (symbols.lookup(RETURN_THUNK), symbols.lookup(CHOSEN_THUNK))
        else {
            return Returns::AsCompiled;
        };
        match target.read(chosen.addr, 8) {
            Ok(bytes) => {
                let thunk = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes read"));
                if thunk == default.addr {
                    Returns::Plain
                } else {
                    Returns::Thunk(thunk)
                }
            }
            Err(e) => {
                log::warn!(
                    "cannot read {CHOSEN_THUNK} at {:#x} ({e}): component returns stay as compiled",
                    chosen.addr
                );
                Returns::AsCompiled
            }
        }
    }
}

/// Rewrite the return-thunk sites of `code` (the linked code image at `code_base`): every
/// `jmp rel32` or `jcc rel32` whose `PC32`/`PLT32` relocation names [`RETURN_THUNK`]. Returns
/// how many sites were rewritten. A relocation against the thunk elsewhere (a call, a data
/// reference) is left as linked.
pub fn apply(
    obj: &Object,
    layout: &Layout,
    returns: Returns,
    code: &mut [u8],
    code_base: u64,
) -> usize {
    if returns == Returns::AsCompiled {
        return 0;
    }
    let mut sites = 0;
    for r in &obj.relocations {
        if !matches!(r.r_type, R_X86_64_PC32 | R_X86_64_PLT32)
            || obj.symbol_name(r.symbol) != RETURN_THUNK
        {
            continue;
        }
        let Some(slot) = layout.sections[r.section].filter(|s| s.kind == trapvec::BlockKind::Code)
        else {
            continue;
        };
        let Some(disp) = usize::try_from(r.offset)
            .ok()
            .and_then(|o| o.checked_add(slot.offset))
        else {
            continue;
        };
        if rewrite_site(code, disp, returns, code_base) {
            sites += 1;
        }
    }
    if sites > 0 {
        log::debug!("{sites} return-thunk site(s) rewritten as {returns:?}");
    }
    sites
}

/// Rewrite the jump whose rel32 is at `code[disp..disp + 4]`; false (nothing written) when the
/// bytes before it are neither `jmp rel32` (E9) nor `jcc rel32` (0F 8x).
fn rewrite_site(code: &mut [u8], disp: usize, returns: Returns, code_base: u64) -> bool {
    if disp + 4 > code.len() {
        return false;
    }
    let is_jmp = disp >= 1 && code[disp - 1] == 0xE9;
    let is_jcc = !is_jmp && disp >= 2 && code[disp - 2] == 0x0F && code[disp - 1] & 0xF0 == 0x80;
    if !is_jmp && !is_jcc {
        return false;
    }
    match returns {
        Returns::AsCompiled => return false,
        Returns::Plain if is_jmp => {
            code[disp - 1..disp + 4].copy_from_slice(&[0xC3, 0xCC, 0xCC, 0xCC, 0xCC])
        }
        // jcc rel32 (6 bytes) -> j!cc over the rest; ret; int3 x3: taken, it returns; not
        // taken, it lands where the jcc's fall-through was.
        Returns::Plain => {
            let inverse = 0x70 | ((code[disp - 1] & 0x0F) ^ 1);
            code[disp - 2..disp + 4].copy_from_slice(&[inverse, 0x04, 0xC3, 0xCC, 0xCC, 0xCC]);
        }
        Returns::Thunk(thunk) => {
            let insn_end = code_base + disp as u64 + 4;
            let Ok(rel) = i32::try_from(thunk.wrapping_sub(insn_end).cast_signed()) else {
                log::warn!(
                    "return thunk {thunk:#x} out of rel32 reach of {insn_end:#x}: left as linked"
                );
                return false;
            };
            code[disp..disp + 4].copy_from_slice(&rel.to_le_bytes());
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(bytes: &[u8], disp: usize, returns: Returns) -> Vec<u8> {
        let mut code = bytes.to_vec();
        assert!(rewrite_site(&mut code, disp, returns, 0x1000));
        code
    }

    #[test]
    #[rustfmt::skip]
    fn return_thunk_jumps_become_what_the_kernel_writes() {
        let jmp = [/*00*/ 0x90, /*01*/ 0xE9, 0, 0, 0, 0];                  // nop; jmp __x86_return_thunk
        assert_eq!(rewrite(&jmp, 2, Returns::Plain), [0x90, 0xC3, 0xCC, 0xCC, 0xCC, 0xCC]);
        // The jmp ends at 0x1006: the thunk at 0x2000 is 0xFFA away.
        assert_eq!(rewrite(&jmp, 2, Returns::Thunk(0x2000)), [0x90, 0xE9, 0xFA, 0x0F, 0, 0]);
        let jne = [/*00*/ 0x0F, 0x85, 0, 0, 0, 0, /*06*/ 0x31, 0xC0];   // jne __x86_return_thunk; xor eax,eax
        // je +4 (over ret; int3 x3) lands on the xor at 6, as the jne's fall-through did.
        assert_eq!(rewrite(&jne, 2, Returns::Plain), [0x74, 0x04, 0xC3, 0xCC, 0xCC, 0xCC, 0x31, 0xC0]);
        let call = [/*00*/ 0xE8, 0, 0, 0, 0];                              // call __x86_return_thunk: not a return
        let mut c = call.to_vec();
        assert!(!rewrite_site(&mut c, 1, Returns::Plain, 0x1000));
        assert_eq!(c, call);
    }
}
