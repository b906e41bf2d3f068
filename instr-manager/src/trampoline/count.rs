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

use super::emit_replay;
use crate::error::Refusal;
use crate::plan::Plan;

const WHAT: &str = "the counting trampoline";

/// The counting replay trampoline of `plan` at `addr`, counting into the 8 bytes at `hits`.
pub(crate) fn emit_counting_replay(
    addr: u64,
    hits: u64,
    plan: &Plan,
    info: &TargetInfo,
) -> Result<Vec<u8>, Refusal> {
    let encode_err = |e: iced_x86::IcedError| Refusal::Encode {
        what: WHAT,
        addr,
        reason: e.to_string(),
    };
    let rz = i64::from(info.red_zone);
    let rsp_plus = |d: i64| MemoryOperand::with_base_displ(Register::RSP, d);
    let mut prefix = Vec::with_capacity(5);
    if rz > 0 {
        prefix.push(
            Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp_plus(-rz))
                .map_err(encode_err)?,
        );
    }
    prefix.push(Instruction::with(Code::Pushfq));
    // iced: with a RIP base the displacement is the absolute target.
    let counter =
        MemoryOperand::with_base_displ(Register::RIP, i64::from_ne_bytes(hits.to_ne_bytes()));
    let mut inc = Instruction::with1(Code::Inc_rm64, counter).map_err(encode_err)?;
    inc.set_has_lock_prefix(true);
    prefix.push(inc);
    prefix.push(Instruction::with(Code::Popfq));
    if rz > 0 {
        prefix.push(
            Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp_plus(rz)).map_err(encode_err)?,
        );
    }
    let mut enc = Encoder::new(64);
    let mut ip = addr;
    for i in &prefix {
        // The only operand that can fail is the counter's rel32: out of reach of `addr`.
        ip += enc.encode(i, ip).map_err(|_| Refusal::OutOfReach {
            what: "a counting trampoline's counter",
            from: addr,
            to: hits,
        })? as u64;
    }
    let mut out = enc.take_buffer();
    out.extend(emit_replay(plan, ip)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use trapvec::fake::{ARENA, FUNC, TEXT};
    use trapvec::{SymbolTable, TargetInfo};

    use super::*;
    use crate::analysis::analyze_function;
    use crate::plan::{plan_trap, PlanInput};

    #[test]
    fn counting_trampoline_in_user_space_steps_over_the_red_zone_and_keeps_the_flags() {
        let func = analyze_function("f", TEXT, &FUNC).unwrap();
        let info = TargetInfo::user("process");
        let symbols = SymbolTable::default();
        let read = |_: u64, _: usize| None;
        let busy = |_: u64, _: u64| false;
        let input = PlanInput {
            func: &func,
            info: &info,
            read: &read,
            symbols: &symbols,
            busy: &busy,
            trampoline_near: None,
        };
        let plan = plan_trap(&input, TEXT + 5).unwrap();
        let at = ARENA;
        let hits = ARENA + 0x1000;
        let code = emit_counting_replay(at, hits, &plan, &info).unwrap();
        #[rustfmt::skip]
        let prefix: [u8; 20] = [
            /*00*/ 0x48, 0x8D, 0x64, 0x24, 0x80,             // lea rsp,[rsp-0x80]
            /*05*/ 0x9C,                                     // pushfq
            /*06*/ 0xF0, 0x48, 0xFF, 0x05, 0xF2, 0x0F, 0x00, 0x00, // lock inc qword [rip+0xff2] -> hits
            /*0e*/ 0x9D,                                     // popfq
            /*0f*/ 0x48, 0x8D, 0xA4, 0x24, 0x80,             // lea rsp,[rsp+0x80] (disp32 follows)
        ];
        assert_eq!(code[..20], prefix);
        assert_eq!(code[20..23], [0x00, 0x00, 0x00]);
        // Then the displaced `push rbp; mov rbp,rsp` and `jmp f+9`.
        assert_eq!(code[23..27], [0x55, 0x48, 0x89, 0xE5]);
        assert_eq!(code[27], 0xE9);
        let rel = i32::from_le_bytes(code[28..32].try_into().unwrap());
        assert_eq!((at + 32).wrapping_add_signed(i64::from(rel)), TEXT + 9);
        let far = emit_counting_replay(at, at - (4u64 << 30), &plan, &info).unwrap_err();
        assert!(matches!(far, crate::Refusal::OutOfReach { .. }), "{far}");
    }
}
