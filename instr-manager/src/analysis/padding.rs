//! Padding: bytes no control flow reaches, where a springboard may be written.
//!
//! Padding is a run of `int3` or NOP instructions (any `nop` form, with prefixes) that
//! - lies between functions (after one function's extent and before the next symbol), or
//! - follows a `ret` or `jmp` inside a function's extent (alignment before a loop head, or the
//!   trailing padding of a function whose size is unknown), and ends at the function's end or at
//!   a branch target. When the function has an indirect jump whose table was not recognised, only
//!   the trailing run (ending at the function's end) is trusted: an unknown target could fall into
//!   an inner run.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

use super::Function;

/// Whether `instr` can be padding (`int3` or a NOP form).
pub fn is_padding_instr(instr: &Instruction) -> bool {
    matches!(instr.mnemonic(), Mnemonic::Nop | Mnemonic::Int3)
}

/// Whether control never falls through past `instr`.
fn stops_flow(instr: &Instruction) -> bool {
    matches!(
        instr.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    )
}

impl Function {
    /// Padding runs `[lo, hi)` inside the function's extent, in address order.
    pub fn padding_runs(&self) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut dead = false;
        let mut run: Option<(u64, u64)> = None;
        for insn in &self.insns {
            let target = self.branch_targets.contains(&insn.addr);
            if dead && !target && is_padding_instr(&insn.instr) {
                run = Some(run.map_or((insn.addr, insn.end()), |(lo, _)| (lo, insn.end())));
                continue;
            }
            if let Some(r) = run.take() {
                runs.push(r);
            }
            dead = stops_flow(&insn.instr);
        }
        if let Some(r) = run {
            runs.push(r);
        }
        let decoded_end = self.insns.last().map_or(self.start, |i| i.end());
        if self.unresolved_indirect_jumps().next().is_some() {
            runs.retain(|&(_, hi)| hi == decoded_end && self.undecodable_from.is_none());
        }
        runs
    }
}

/// Padding runs in a gap between functions that starts at `start` (the end of the previous
/// function) and holds `bytes`. Decoding stops at the first instruction that is not padding.
pub fn gap_padding(start: u64, bytes: &[u8]) -> Option<(u64, u64)> {
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut end = start;
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() || !is_padding_instr(&instr) {
            break;
        }
        end = instr.next_ip();
    }
    (end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze_function;

    #[test]
    fn trailing_nops_after_ret_are_padding_but_reachable_nops_are_not() {
        #[rustfmt::skip]
        let code = [
            /*00*/ 0x90,                         // nop (reachable: not padding)
            /*01*/ 0x85, 0xFF,                   // test edi, edi
            /*03*/ 0x74, 0x08,                   // je 0x0d
            /*05*/ 0xEB, 0x00,                   // jmp 0x07
            /*07*/ 0x0F, 0x1F, 0x00,             // nop dword [rax]      <- branch target of jmp
            /*0a*/ 0xC3,                         // ret
            /*0b*/ 0x66, 0x90,                   // xchg ax, ax (nop)    dead
            /*0d*/ 0x31, 0xC0,                   // xor eax, eax         je target
            /*0f*/ 0xC3,                         // ret
            /*10*/ 0xCC, 0x0F, 0x1F, 0x44, 0x00, 0x00, 0xCC, // int3; nop5; int3 (trailing)
        ];
        let f = analyze_function("p", 0x100, &code).unwrap();
        assert_eq!(f.padding_runs(), vec![(0x10b, 0x10d), (0x110, 0x117)]);
    }

    #[test]
    fn unresolved_indirect_jump_keeps_only_the_trailing_run() {
        #[rustfmt::skip]
        let code = [
            /*00*/ 0xFF, 0xE0,       // jmp rax (no table known)
            /*02*/ 0x90, 0x90,       // nop nop: an unknown target may land here
            /*04*/ 0x31, 0xC0,       // xor eax, eax
            /*06*/ 0xC3,             // ret
            /*07*/ 0xCC,             // int3
        ];
        let f = analyze_function("p", 0x100, &code).unwrap();
        assert_eq!(f.padding_runs(), vec![(0x107, 0x108)]);
    }

    #[test]
    fn gap_padding_stops_at_the_first_real_instruction() {
        let bytes = [
            0xCC, 0xCC, 0x66, 0x2E, 0x0F, 0x1F, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, 0x55, 0xCC,
        ];
        assert_eq!(gap_padding(0x200, &bytes), Some((0x200, 0x20c)));
        assert_eq!(gap_padding(0x200, &[0x55]), None);
    }
}
