//! Instructions that must run at their own address and are never relocated.

use iced_x86::{Instruction, Mnemonic};

use super::{Ctx, Fixup};
use crate::analysis::Insn;
use crate::error::Refusal;
use crate::RefusalCause;

pub(crate) struct Forbidden;

/// Why `instr` cannot leave its address, or `None` when it can.
fn reason(instr: &Instruction) -> Option<(RefusalCause, &'static str)> {
    Some(match instr.mnemonic() {
        Mnemonic::Syscall | Mnemonic::Sysenter | Mnemonic::Sysexit | Mnemonic::Sysexitq | Mnemonic::Sysret | Mnemonic::Sysretq => {
            (RefusalCause::SystemCall, "a system call saves its return address: a thread blocked in it would sit in the trampoline, \
             which could then never be freed, and a restarted call would re-execute from there")
        }
        Mnemonic::Int | Mnemonic::Int1 | Mnemonic::Int3 | Mnemonic::Into => {
            (RefusalCause::InterruptInstruction, "an interrupt instruction is identified by its address (a debugger's breakpoint, a kernel trap, \
             another tool's probe)")
        }
        Mnemonic::Ud0 | Mnemonic::Ud1 | Mnemonic::Ud2 => {
            (RefusalCause::UndefinedOpcode, "an undefined-opcode trap is identified by its address (the kernel's BUG/WARN table)")
        }
        Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq | Mnemonic::Retf => (RefusalCause::FarReturn, "a far return changes privilege or code segment"),
        _ if instr.is_jmp_far() || instr.is_call_far() || instr.is_jmp_far_indirect() || instr.is_call_far_indirect() => {
            (RefusalCause::FarBranch, "a far jump or call changes the code segment")
        }
        _ if instr.is_ip_rel_memory_operand() && instr.memory_base() == iced_x86::Register::EIP => {
            (RefusalCause::EipRelative, "an EIP-relative (32-bit address) operand cannot be re-aimed")
        }
        _ => return None,
    })
}

impl Fixup for Forbidden {
    fn claims(&self, insn: &Insn) -> bool {
        reason(&insn.instr).is_some()
    }

    fn lower(
        &self,
        insn: &Insn,
        ctx: &Ctx<'_>,
        _out: &mut Vec<Instruction>,
    ) -> Result<(), Refusal> {
        let (cause, why) = reason(&insn.instr).unwrap_or((
            RefusalCause::MustStayInPlace,
            "it must run at its own address",
        ));
        Err(ctx.refuse(insn, cause, why))
    }
}
