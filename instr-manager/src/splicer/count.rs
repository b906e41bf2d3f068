//! The trampoline of a count-only splice where the dispatcher does not count (jmp splices, and
//! every splice in a process): count, then replay the displaced instructions and jump back.
//!
//! ```text
//! lea rsp,[rsp-RZ]                 ; step over the red zone (omitted when RZ = 0)
//! pushfq                           ; the flags are live at an arbitrary point
//! lock inc qword [rip+hits]
//! popfq
//! lea rsp,[rsp+RZ]
//! <displaced instructions relocated here> ; jmp site+displaced_len   (emit_replay)
//! ```

use iced_x86::{Code, Encoder, Instruction, MemoryOperand, Register};
use trapvec::TargetInfo;

use crate::error::Refusal;
use crate::plan::Plan;
use crate::trampoline::emit_replay;

const WHAT: &str = "the counting trampoline";

/// The counting replay trampoline of `plan` at `addr`, counting into the 8 bytes at `hits`.
pub(crate) fn emit_counting_replay(addr: u64, hits: u64, plan: &Plan, info: &TargetInfo) -> Result<Vec<u8>, Refusal> {
    let encode_err = |e: iced_x86::IcedError| Refusal::Encode { what: WHAT, addr, reason: e.to_string() };
    let rz = i64::from(info.red_zone);
    let rsp_plus = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
    let mut prefix = Vec::with_capacity(5);
    if rz > 0 {
        prefix.push(Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp_plus(-rz)).map_err(encode_err)?);
    }
    prefix.push(Instruction::with(Code::Pushfq));
    // iced: with a RIP base the displacement is the absolute target.
    let counter = MemoryOperand::with_base_displ(Register::RIP, i64::from_ne_bytes(hits.to_ne_bytes()));
    let mut inc = Instruction::with1(Code::Inc_rm64, counter).map_err(encode_err)?;
    inc.set_has_lock_prefix(true);
    prefix.push(inc);
    prefix.push(Instruction::with(Code::Popfq));
    if rz > 0 {
        prefix.push(Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp_plus(rz)).map_err(encode_err)?);
    }
    let mut enc = Encoder::new(64);
    let mut ip = addr;
    for i in &prefix {
        // The only operand that can fail is the counter's rel32: out of reach of `addr`.
        ip += enc.encode(i, ip).map_err(|_| Refusal::OutOfReach { what: "a counting trampoline's counter", from: addr, to: hits })? as u64;
    }
    let mut out = enc.take_buffer();
    out.extend(emit_replay(plan, ip)?);
    Ok(out)
}
