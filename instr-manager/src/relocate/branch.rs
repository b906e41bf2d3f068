//! Relative branches: `jcc`, `jmp` (short and near), `loop`/`loope`/`loopne`, `jrcxz`/`jecxz` and
//! `xbegin`. They keep their absolute target; `BlockEncoder` widens `jcc rel8` to `rel32` and uses
//! its long forms (`jcc` over a `jmp qword [rip+x]`, `loop`/`jrcxz` over near jumps) when the
//! target is out of reach from the new address.

use iced_x86::{Instruction, Mnemonic};

use super::{Ctx, Fixup};
use crate::analysis::Insn;
use crate::error::Refusal;

pub(crate) struct Branch;

impl Fixup for Branch {
    fn claims(&self, insn: &Insn) -> bool {
        let i = &insn.instr;
        i.is_jcc_short_or_near()
            || i.is_jmp_short_or_near()
            || i.is_loop()
            || i.is_loopcc()
            || i.is_jcx_short()
            || i.mnemonic() == Mnemonic::Xbegin
    }

    fn lower(&self, insn: &Insn, ctx: &Ctx<'_>, out: &mut Vec<Instruction>) -> Result<(), Refusal> {
        if insn.instr.op0_kind() != iced_x86::OpKind::NearBranch64 {
            return Err(ctx.refuse(
                insn,
                crate::RefusalCause::NarrowBranch,
                "a branch with a 16- or 32-bit operand size truncates its target",
            ));
        }
        out.push(insn.instr);
        Ok(())
    }
}
