//! Instructions whose meaning does not depend on their address: copied as they are.

use iced_x86::Instruction;

use super::{Ctx, Fixup};
use crate::analysis::Insn;
use crate::error::Refusal;

pub(crate) struct Plain;

impl Fixup for Plain {
    fn claims(&self, _insn: &Insn) -> bool {
        true
    }

    fn lower(
        &self,
        insn: &Insn,
        _ctx: &Ctx<'_>,
        out: &mut Vec<Instruction>,
    ) -> Result<(), Refusal> {
        out.push(insn.instr);
        Ok(())
    }
}
