//! The entry trampoline of a `replace` splice ([`emit_replace_trampoline`]).

use iced_x86::{Code, Instruction, MemoryOperand, Register};

use super::{rip_at, rsp_at, Asm};
use crate::error::Refusal;
use crate::relocate::{reaches, LAYOUT_MARGIN};

/// Stack words a `replace` trampoline copies for the replacement: the 7th integer argument.
///
/// The trampoline calls the replacement (so that it sees the task come back and can count it
/// out), and a call pushes a return address: the replacement would find its stack-passed
/// arguments one word off. The trampoline therefore copies the words above the return address
/// to below its own call, as the kernel's BPF trampolines do for the functions they call. How
/// many words the replaced function takes is not known here (it would need its BTF or
/// debug information), and copying more than exist can read past the top of a stack: the
/// kernel calls interrupt flow handlers, `__do_softirq` and `__sysvec_*` functions right at
/// the top of the IRQ stack, where only one word (the saved stack pointer) lies above the
/// return address and a guard page follows. One word is always there (that word, or the
/// `pt_regs` at the top of every task stack), so one word is copied: a replaced function may
/// take at most seven integer-class arguments (six in registers, one on the stack) and no
/// structure passed in memory; the replacement of a function with more would read wrong
/// values for the 8th and later ones. (README.md, "Rules for code the module runs".)
pub const REPLACE_STACK_WORDS: u32 = 1;

/// Where a `replace` splice's entry trampoline goes and what it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplaceTrampoline {
    /// Address the trampoline is generated for.
    pub addr: u64,
    /// 8-byte hit counter.
    pub hits: u64,
    /// 8-byte counter of the tasks inside the replacement.
    pub inflight: u64,
    /// The replacement function.
    pub dest: u64,
    /// Where to leave through with `r11` = `inflight` (the kernel module's
    /// `trapvec_replace_ret`, which decrements it outside this block and returns); `None`:
    /// decrement here and `ret`.
    pub exit: Option<u64>,
}

/// Increment or decrement (`code`) the 8-byte counter at `counter`: `lock inc/dec [rip+x]`,
/// or through `r11` (free at a function's entry and return: caller-saved, no argument, no
/// return value) when it is out of rip-relative reach.
fn count_at(a: &mut Asm, code: Code, counter: u64) -> Result<(), Refusal> {
    if reaches(a.addr, counter, LAYOUT_MARGIN) {
        return a.locked(code, counter);
    }
    a.push(Instruction::with2(
        Code::Mov_r64_imm64,
        Register::R11,
        counter,
    ))?;
    let mut i = Instruction::with1(code, MemoryOperand::with_base(Register::R11)).map_err(|e| {
        Refusal::Encode {
            what: a.what,
            addr: a.addr,
            reason: e.to_string(),
        }
    })?;
    i.set_has_lock_prefix(true);
    a.instrs.push(i);
    Ok(())
}

/// The entry trampoline of a `replace` splice: counts the hit, counts the task in, calls the
/// replacement with `stack_words` copied stack words (see [`REPLACE_STACK_WORDS`]), counts
/// the task out and returns to the replaced function's caller:
///
/// ```text
/// lock inc qword [rip+hits]
/// lock inc qword [rip+inflight]
/// (lea rsp,[rsp-8])                 ; stack_words even: keep rsp 16-aligned at the call
/// push qword [rsp+8*(stack_words+pad)]   ; stack_words times, last argument word first
/// call dest                         ; rel32, or call [rip+x] with dest stored after the code
/// lea rsp,[rsp+8*(stack_words+pad)]
/// lea r11,[rip+inflight] ; jmp exit     (target-owned counter: the kernel module)
///   or  lock dec qword [rip+inflight] ; ret
/// ```
///
/// Every `push [rsp+d]` reads the next lower argument word with the same `d`: the address is
/// computed before the push moves `rsp`. The flags the increments and decrement change are dead
/// at a function's entry and return; `rax`/`rdx` (the return value) and the callee-saved
/// registers pass through untouched, `r11` is clobbered only where the ABI lets it be.
pub fn emit_replace_trampoline(
    t: &ReplaceTrampoline,
    stack_words: u32,
) -> Result<Vec<u8>, Refusal> {
    let mut a = Asm::new(t.addr, "a replace trampoline");
    count_at(&mut a, Code::Inc_rm64, t.hits)?;
    count_at(&mut a, Code::Inc_rm64, t.inflight)?;
    let pad = i64::from(stack_words.is_multiple_of(2));
    let words = i64::from(stack_words) + pad;
    if pad == 1 {
        a.lea_rsp(-8)?;
    }
    for _ in 0..stack_words {
        a.push(Instruction::with1(Code::Push_rm64, rsp_at(8 * words)))?;
    }
    a.push(Instruction::with_branch(Code::Call_rel32_64, t.dest))?;
    a.lea_rsp(8 * words)?;
    match t.exit {
        Some(exit) => {
            if reaches(t.addr, t.inflight, LAYOUT_MARGIN) {
                a.push(Instruction::with2(
                    Code::Lea_r64_m,
                    Register::R11,
                    rip_at(t.inflight),
                ))?;
            } else {
                a.push(Instruction::with2(
                    Code::Mov_r64_imm64,
                    Register::R11,
                    t.inflight,
                ))?;
            }
            a.jmp(exit)?;
        }
        None => {
            count_at(&mut a, Code::Dec_rm64, t.inflight)?;
            a.push(Ok(Instruction::with(Code::Retnq)))?;
        }
    }
    a.encode()
}
