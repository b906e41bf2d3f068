//! Two facts that let a call trampoline do less (KernInst computes live registers for the same
//! reason): whether the arithmetic flags are dead at a point, and whether a handler is a *lean
//! leaf*.
//!
//! - [`flags_dead_at`]: walking forward from the point over the function's control flow, every
//!   path writes all six status flags (OF SF ZF AF CF PF) before reading any of them, or returns.
//!   Then the trampoline need not restore them (`popfq` is the slowest instruction it runs).
//!   Calls, indirect jumps, leaving the function or running out of budget count as "live".
//! - [`is_lean_leaf`]: the handler calls nothing, jumps nowhere outside itself and touches no
//!   vector, x87 or mask register. Then the trampoline need not save vector state, and a thread inside
//!   the handler is found by its RIP (the handler's range joins the quiescence ranges), so the
//!   in-flight counter can go.

use iced_x86::{FlowControl, InstructionInfoFactory, Register, RflagsBits};

use crate::analysis::Function;

const STATUS: u32 = RflagsBits::OF
    | RflagsBits::SF
    | RflagsBits::ZF
    | RflagsBits::AF
    | RflagsBits::CF
    | RflagsBits::PF;

/// Instructions examined at most, over all paths.
const BUDGET: usize = 256;

/// Whether the status flags are dead at `site` (see the module docs).
pub fn flags_dead_at(func: &Function, site: u64) -> bool {
    let Some(start) = func.insn_index(site) else {
        return false;
    };
    // Work list of (instruction index, flags still undetermined on this path).
    let mut work = vec![(start, STATUS)];
    // Sorted; at most BUDGET entries, so a vector is the cheapest set.
    let mut seen: Vec<(usize, u32)> = Vec::with_capacity(32);
    let mut steps = 0;
    while let Some((mut i, mut open)) = work.pop() {
        loop {
            match seen.binary_search(&(i, open)) {
                Ok(_) => break,
                Err(at) => seen.insert(at, (i, open)),
            }
            steps += 1;
            if steps > BUDGET {
                return false;
            }
            let Some(insn) = func.insns.get(i) else {
                return false;
            };
            let ins = &insn.instr;
            if ins.rflags_read() & open != 0 {
                return false;
            }
            open &= !ins.rflags_modified();
            if open == 0 {
                break;
            }
            match ins.flow_control() {
                FlowControl::Next => i += 1,
                FlowControl::Return => break,
                FlowControl::UnconditionalBranch => match func.insn_index(ins.near_branch_target())
                {
                    Some(t) => i = t,
                    None => return false,
                },
                FlowControl::ConditionalBranch => match func.insn_index(ins.near_branch_target()) {
                    Some(t) => {
                        work.push((t, open));
                        i += 1;
                    }
                    None => return false,
                },
                _ => return false,
            }
        }
    }
    true
}

/// Whether the handler decoded as `func` is a lean leaf (see the module docs).
pub fn is_lean_leaf(func: &Function) -> bool {
    if func.undecodable_from.is_some() || func.insns.is_empty() {
        return false;
    }
    let mut factory = InstructionInfoFactory::new();
    func.insns.iter().all(|insn| {
        let ins = &insn.instr;
        let flow_ok = match ins.flow_control() {
            FlowControl::Next | FlowControl::Return => true,
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => {
                let t = ins.near_branch_target();
                t >= func.start && t < func.end
            }
            _ => false,
        };
        flow_ok
            && factory.info(ins).used_registers().iter().all(|r| {
                let reg: Register = r.register();
                !(reg.is_xmm()
                    || reg.is_ymm()
                    || reg.is_zmm()
                    || reg.is_mm()
                    || reg.is_st()
                    || reg.is_k()
                    || reg.is_tr())
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze_function;

    fn f(bytes: &[u8]) -> Function {
        analyze_function("f", 0x1000, bytes).unwrap()
    }

    #[rustfmt::skip]
    #[test]
    fn flags_are_dead_before_a_full_write_and_live_before_a_read() {
        // push rbp; mov rbp,rsp; sub rsp,0x10; ret
        let g = f(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3]);
        assert!(flags_dead_at(&g, 0x1000));
        // cmp edi,0; jz +1; ret; ret   -- at the jz the flags are read
        let g = f(&[0x83, 0xff, 0x00, 0x74, 0x01, 0xc3, 0xc3]);
        assert!(flags_dead_at(&g, 0x1000), "cmp writes them all first");
        assert!(!flags_dead_at(&g, 0x1003), "jz reads ZF");
        // inc eax (leaves CF); adc eax,0 (reads CF)
        let g = f(&[0xff, 0xc0, 0x83, 0xd0, 0x00, 0xc3]);
        assert!(!flags_dead_at(&g, 0x1000), "CF survives inc and adc reads it");
        // a call before any write: conservatively live
        let g = f(&[0xe8, 0x00, 0x00, 0x00, 0x00, 0xc3]);
        assert!(!flags_dead_at(&g, 0x1000));
        // return before any flag use: dead
        let g = f(&[0x89, 0xf8, 0xc3]);
        assert!(flags_dead_at(&g, 0x1000));
    }

    #[rustfmt::skip]
    #[test]
    fn lean_leaf_needs_no_calls_and_no_vector_registers() {
        // lock inc qword [rip+x]; ret
        assert!(is_lean_leaf(&f(&[0xf0, 0x48, 0xff, 0x05, 0x00, 0x00, 0x00, 0x00, 0xc3])));
        // ret
        assert!(is_lean_leaf(&f(&[0xc3])));
        // pxor xmm0,xmm0; ret
        assert!(!is_lean_leaf(&f(&[0x66, 0x0f, 0xef, 0xc0, 0xc3])));
        // call rel32; ret
        assert!(!is_lean_leaf(&f(&[0xe8, 0x00, 0x00, 0x00, 0x00, 0xc3])));
        // jmp rel32 out of the function (a tail call)
        assert!(!is_lean_leaf(&f(&[0xe9, 0x00, 0x10, 0x00, 0x00])));
    }
}
