//! Calls: `call target` (direct, `call reg`, `call [mem]`, `call [rip+x]`) is relocated as
//!
//! ```text
//! lea rsp, [rsp-8]             ; no flag changes
//! mov dword [rsp], lo32        ; the ORIGINAL return address
//! mov dword [rsp+4], hi32
//! jmp target                   ; same operand as the call
//! ```
//!
//! so the callee returns straight to the original code after the window: a thread parked in the
//! callee never returns into a trampoline that may have been freed, and unwinders see a real
//! return address. Hence a call must be the last displaced instruction (anything after it would
//! be skipped), and a call whose operand uses `rsp` is refused (the push moves `rsp`).

use iced_x86::{Code, Instruction, MemoryOperand, Register};

use super::rip_relative::RipRelative;
use super::{Ctx, Fixup};
use crate::analysis::Insn;
use crate::error::Refusal;

pub(crate) struct Call;

fn uses_rsp(instr: &Instruction) -> bool {
    let rsp = |r: Register| r.full_register() == Register::RSP;
    match instr.op0_kind() {
        iced_x86::OpKind::Register => rsp(instr.op0_register()),
        iced_x86::OpKind::Memory => rsp(instr.memory_base()) || rsp(instr.memory_index()),
        _ => false,
    }
}

fn encode_err(insn: &Insn, ctx: &Ctx<'_>, e: &iced_x86::IcedError) -> Refusal {
    ctx.refuse(
        insn,
        crate::RefusalCause::Reencode,
        format!("building its push-and-jump replacement failed: {e}"),
    )
}

impl Fixup for Call {
    fn claims(&self, insn: &Insn) -> bool {
        insn.is_call()
    }

    fn lower(&self, insn: &Insn, ctx: &Ctx<'_>, out: &mut Vec<Instruction>) -> Result<(), Refusal> {
        let ret = insn.end();
        if !ctx.is_last() {
            return Err(Refusal::CallReturnsIntoWindow {
                site: ctx.site(),
                call_addr: insn.addr,
                insn: insn.intel(),
                ret,
                window_end: ctx.window_end(),
            });
        }
        let jmp_code = match insn.instr.code() {
            Code::Call_rel32_64 => Code::Jmp_rel32_64,
            Code::Call_rm64 => Code::Jmp_rm64,
            _ => {
                return Err(ctx.refuse(
                    insn,
                    crate::RefusalCause::NotNearCall,
                    "only 64-bit near calls are relocated",
                ))
            }
        };
        if uses_rsp(&insn.instr) {
            return Err(ctx.refuse(
                insn,
                crate::RefusalCause::CallThroughRsp,
                "its target is read through rsp, which the pushed return address moves",
            ));
        }
        if insn.instr.is_ip_rel_memory_operand() {
            // `call [rip+x]`: the pointer must stay reachable, as for any RIP-relative operand.
            let mut check = Vec::new();
            RipRelative.lower(insn, ctx, &mut check)?;
        }
        let lo = u32::try_from(ret & 0xffff_ffff).unwrap_or_default();
        let hi = u32::try_from(ret >> 32).unwrap_or_default();
        let at = |disp: i64| MemoryOperand::with_base_displ(Register::RSP, disp);
        out.push(
            Instruction::with2(Code::Lea_r64_m, Register::RSP, at(-8))
                .map_err(|e| encode_err(insn, ctx, &e))?,
        );
        out.push(
            Instruction::with2(
                Code::Mov_rm32_imm32,
                MemoryOperand::with_base(Register::RSP),
                lo,
            )
            .map_err(|e| encode_err(insn, ctx, &e))?,
        );
        out.push(
            Instruction::with2(Code::Mov_rm32_imm32, at(4), hi)
                .map_err(|e| encode_err(insn, ctx, &e))?,
        );
        // Same operand (target, register or memory), jump instead of call.
        let mut jmp = insn.instr;
        jmp.set_code(jmp_code);
        out.push(jmp);
        Ok(())
    }
}
