//! The guard of a splice with a task predicate ([`trapvec::predicate`]): a few instructions in
//! front of its trampoline that let only the matching tasks in. A task that does not match
//! goes to the *skip* path, the displaced instructions replayed with nothing counted or called,
//! so a non-matching hit costs the test and the replay.
//!
//! ```text
//! guard:                           ; the splice's entry
//!   lea rsp,[rsp-RZ]               ; only if anything is pushed (red zone)
//!   pushfq                         ; only where the flags are live at the point
//!   push rax                       ; kernel: the task is read into rax
//!   mov rax, gs:[current_task]     ; kernel
//!   cmp dword [rax+off], imm32     ; kernel; a process compares dword fs:[off] directly
//!   jne skip                       ; one compare and jne per 4 bytes tested
//!   pop rax
//!   popfq
//!   lea rsp,[rsp+RZ]
//! body:                            ; the trampoline, unchanged
//!   ...
//! skip:
//!   pop rax ; popfq ; lea rsp,[rsp+RZ]   ; as above
//!   <displaced instructions relocated here> ; jmp site+displaced_len
//! ```
//!
//! `pop` and `lea` leave the flags alone, so one `jne` per compare suffices. Every form has a
//! fixed length, so the guard's length is known before its `jne` targets are.

use iced_x86::{Code, Instruction, MemoryOperand, Register};
use trapvec::predicate::{PredicateTest, TaskBase};

use super::{emit_replay, Asm};
use crate::error::Refusal;
use crate::plan::Plan;

const WHAT: &str = "a predicate's guard";

/// How a guard is made: what it tests and what it must keep.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GuardShape<'a> {
    pub test: &'a PredicateTest,
    pub red_zone: u32,
    /// Keep the flags (`pushfq`/`popfq`): they are live at the point.
    pub keep_flags: bool,
}

impl GuardShape<'_> {
    fn uses_rax(&self) -> bool {
        matches!(self.test.base, TaskBase::CurrentTask { .. })
    }

    /// Bytes below the stack pointer to step over before pushing anything.
    fn red_zone(&self) -> i64 {
        match self.keep_flags || self.uses_rax() {
            true => i64::from(self.red_zone),
            false => 0,
        }
    }

    /// Undo what the guard pushed: `pop rax`, `popfq`, `lea rsp,[rsp+RZ]` (each where made).
    fn unwind(&self, a: &mut Asm) -> Result<(), Refusal> {
        if self.uses_rax() {
            a.push(Instruction::with1(Code::Pop_r64, Register::RAX))?;
        }
        if self.keep_flags {
            a.push(Ok(Instruction::with(Code::Popfq)))?;
        }
        if self.red_zone() > 0 {
            a.lea_rsp(self.red_zone())?;
        }
        Ok(())
    }

    /// The guard at `addr`, sending non-matching tasks to `skip` and falling through into the
    /// body behind it.
    pub(crate) fn emit(&self, addr: u64, skip: u64) -> Result<Vec<u8>, Refusal> {
        let mut a = Asm::new(addr, WHAT);
        if self.red_zone() > 0 {
            a.lea_rsp(-self.red_zone())?;
        }
        if self.keep_flags {
            a.push(Ok(Instruction::with(Code::Pushfq)))?;
        }
        if let TaskBase::CurrentTask { per_cpu } = self.test.base {
            a.push(Instruction::with1(Code::Push_r64, Register::RAX))?;
            let disp = i64::try_from(per_cpu)
                .ok()
                .filter(|d| i32::try_from(*d).is_ok())
                .ok_or(Refusal::Encode {
                    what: WHAT,
                    addr,
                    reason: format!(
                        "current_task's per-CPU offset {per_cpu:#x} is not a 32-bit displacement"
                    ),
                })?;
            let mut m = MemoryOperand::with_displ(u64::from_ne_bytes(disp.to_ne_bytes()), 4);
            m.segment_prefix = Register::GS;
            a.push(Instruction::with2(Code::Mov_r64_rm64, Register::RAX, m))?;
        }
        for t in &self.test.tests {
            let mem = match self.test.base {
                TaskBase::CurrentTask { .. } => {
                    MemoryOperand::with_base_displ(Register::RAX, i64::from(t.offset))
                }
                TaskBase::ThreadPointer => {
                    let mut m = MemoryOperand::with_displ(
                        u64::from_ne_bytes(i64::from(t.offset).to_ne_bytes()),
                        4,
                    );
                    m.segment_prefix = Register::FS;
                    m
                }
            };
            a.push(Instruction::with2(Code::Cmp_rm32_imm32, mem, t.value))?;
            a.push(Instruction::with_branch(Code::Jne_rel32_64, skip))?;
        }
        self.unwind(&mut a)?;
        a.encode()
    }

    /// The guard's length (every form is fixed: a guard at any address with any skip has it).
    pub(crate) fn len(&self, addr: u64) -> Result<usize, Refusal> {
        Ok(self.emit(addr, addr)?.len())
    }

    /// The skip path at `addr`: undo the guard's pushes, then the replay of `plan`.
    pub(crate) fn emit_skip(&self, plan: &Plan, addr: u64) -> Result<Vec<u8>, Refusal> {
        let mut a = Asm::new(addr, WHAT);
        self.unwind(&mut a)?;
        let mut out = a.encode()?;
        out.extend(emit_replay(plan, addr + out.len() as u64)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
    use trapvec::fake::{ARENA, FUNC, TEXT};
    use trapvec::predicate::FieldTest;
    use trapvec::{SymbolTable, TargetInfo};

    use super::*;
    use crate::analysis::analyze_function;
    use crate::plan::{plan_trap, PlanInput};

    fn listing(bytes: &[u8], ip: u64) -> Vec<String> {
        let mut d = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        let mut out = Vec::new();
        for i in &mut d {
            let mut s = String::new();
            f.format(&i, &mut s);
            out.push(s);
        }
        out
    }

    fn plan(info: &TargetInfo) -> Plan {
        let func = analyze_function("f", TEXT, &FUNC).unwrap();
        let symbols = SymbolTable::default();
        let read = |_: u64, _: usize| None;
        let busy = |_: u64, _: u64| false;
        let input = PlanInput {
            func: &func,
            info,
            read: &read,
            symbols: &symbols,
            busy: &busy,
            trampoline_near: None,
        };
        plan_trap(&input, TEXT + 5).unwrap()
    }

    #[test]
    fn a_kernel_guard_reads_current_through_gs_and_skips_to_an_uncounted_replay() {
        let test = PredicateTest {
            base: TaskBase::CurrentTask { per_cpu: 0x1fbc0 },
            tests: vec![
                FieldTest {
                    offset: 0x590,
                    value: 42,
                },
                FieldTest {
                    offset: 0x738,
                    value: 0x6873,
                },
            ],
        };
        let g = GuardShape {
            test: &test,
            red_zone: 0,
            keep_flags: true,
        };
        let skip = ARENA + 0x100;
        let bytes = g.emit(ARENA, skip).unwrap();
        assert_eq!(bytes.len(), g.len(ARENA + 0x40).unwrap());
        assert_eq!(
            listing(&bytes, ARENA),
            [
                "pushfq",
                "push rax",
                "mov rax,gs:[1FBC0h]",
                "cmp dword ptr [rax+590h],2Ah",
                &format!("jne 0{skip:X}h"),
                "cmp dword ptr [rax+738h],6873h",
                &format!("jne 0{skip:X}h"),
                "pop rax",
                "popfq",
            ]
        );
        let info = TargetInfo::kernel("kernel", 0xF5);
        let s = listing(&g.emit_skip(&plan(&info), skip).unwrap(), skip);
        assert_eq!(&s[..4], ["pop rax", "popfq", "push rbp", "mov rbp,rsp"]);
        assert_eq!(s[4], format!("jmp 0{:X}h", TEXT + 9));
    }

    #[test]
    fn a_process_guard_compares_fs_directly_and_keeps_the_red_zone_only_when_it_pushes() {
        let test = PredicateTest {
            base: TaskBase::ThreadPointer,
            tests: vec![FieldTest {
                offset: 0x2d0,
                value: 7,
            }],
        };
        let live = GuardShape {
            test: &test,
            red_zone: 128,
            keep_flags: true,
        };
        let l = listing(&live.emit(ARENA, ARENA + 0x80).unwrap(), ARENA);
        assert_eq!(l[0], "lea rsp,[rsp-80h]");
        assert_eq!(l[1], "pushfq");
        assert_eq!(l[2], "cmp dword ptr fs:[2D0h],7");
        assert_eq!(&l[4..], ["popfq", "lea rsp,[rsp+80h]"]);
        let dead = GuardShape {
            test: &test,
            red_zone: 128,
            keep_flags: false,
        };
        let l = listing(&dead.emit(ARENA, ARENA + 0x80).unwrap(), ARENA);
        assert_eq!(l.len(), 2, "{l:?}");
        assert_eq!(l[0], "cmp dword ptr fs:[2D0h],7");
        let info = TargetInfo::user("process");
        let s = listing(
            &live.emit_skip(&plan(&info), ARENA + 0x80).unwrap(),
            ARENA + 0x80,
        );
        assert_eq!(&s[..3], ["popfq", "lea rsp,[rsp+80h]", "push rbp"]);
    }
}
