//! RIP-relative memory operands (`mov rax, [rip+x]`, `lea`, `cmp byte [rip+x], 0`, ...): the
//! absolute address stays, the displacement is recomputed by `BlockEncoder`. The address must be
//! within ±2 GiB of the new location, modulo 2^64 as the CPU adds (the repository is allocated
//! near the code, so it is; a 6.12 kernel's per-CPU offsets near 0 are, through the wrap).

use iced_x86::Instruction;

use super::{reaches_wrapping, Ctx, Fixup, LAYOUT_MARGIN};
use crate::analysis::Insn;
use crate::error::Refusal;

pub(crate) struct RipRelative;

impl Fixup for RipRelative {
    fn claims(&self, insn: &Insn) -> bool {
        insn.instr.is_ip_rel_memory_operand()
    }

    fn lower(&self, insn: &Insn, ctx: &Ctx<'_>, out: &mut Vec<Instruction>) -> Result<(), Refusal> {
        let target = insn.instr.ip_rel_memory_address();
        if !reaches_wrapping(ctx.new_addr, target, LAYOUT_MARGIN) {
            return Err(ctx.refuse(
                insn,
                crate::RefusalCause::OperandOutOfReach,
                format!(
                    "its memory operand {target:#x} is more than ±2 GiB from the new address {:#x}",
                    ctx.new_addr
                ),
            ));
        }
        out.push(insn.instr);
        Ok(())
    }
}
