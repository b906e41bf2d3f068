//! A call trampoline's *prelude*, everything before the displaced instructions: it depends only
//! on a [`PreludeShape`] (the options, the red zone, whether the handler is in rel32 reach), so it
//! is encoded once per thread for each shape and copied with a trampoline's own addresses and
//! values written into its holes.

use iced_x86::{Code, Instruction, MemoryOperand, Register};

use super::{
    rip_at, rsp_at, CallTrampoline, RcuWatch, TrampolineOptions, FRAME, PUSH_ORDER, RIP_SLOT,
    RSP_SLOT, XMM, XMM_AREA, XSAVE_HEADER,
};
use crate::error::Refusal;

/// The values a call trampoline's prelude refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Hits,
    Inflight,
    Site,
    Cookie,
    Handler,
    RcuEnter,
    RcuExit,
}

impl Slot {
    fn of(self, t: &CallTrampoline, rcu: Option<RcuWatch>) -> u64 {
        match self {
            Slot::Hits => t.hits,
            Slot::Inflight => t.inflight,
            Slot::Site => t.site,
            Slot::Cookie => t.cookie,
            Slot::Handler => t.handler,
            // Only in a prelude whose shape has `rcu_watch`.
            Slot::RcuEnter => rcu.map_or(0, |r| r.enter),
            Slot::RcuExit => rcu.map_or(0, |r| r.exit),
        }
    }
}

/// Where a slot's value goes in an encoded prelude.
#[derive(Clone, Copy, Debug)]
enum Hole {
    /// A rel32 (RIP-relative displacement or branch) at `at`, relative to `next`, the end of its
    /// instruction.
    Rel32 { slot: Slot, at: usize, next: usize },
    /// A 64-bit immediate at `at`.
    Imm64 { slot: Slot, at: usize },
}

/// What a call trampoline's prelude depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct PreludeShape {
    pub(super) red_zone: u32,
    /// The handler is out of rel32 reach: `mov rax, imm64; call rax` instead of `call rel32`.
    pub(super) far_handler: bool,
    pub(super) opts: TrampolineOptions,
}

/// A call trampoline's instructions up to the displaced ones, encoded for one [`PreludeShape`],
/// with the holes its values go into.
pub(super) struct Prelude {
    bytes: Vec<u8>,
    holes: Vec<Hole>,
}

impl Prelude {
    /// The prelude of `shape`, encoded the first time this thread asks for it.
    pub(super) fn of(
        shape: PreludeShape,
        what: &'static str,
    ) -> Result<std::rc::Rc<Prelude>, Refusal> {
        use std::cell::RefCell;
        use std::collections::HashMap;
        thread_local! {
            static PRELUDES: RefCell<HashMap<PreludeShape, std::rc::Rc<Prelude>>> = RefCell::new(HashMap::new());
        }
        if let Some(p) = PRELUDES.with_borrow(|m| m.get(&shape).cloned()) {
            return Ok(p);
        }
        let p = std::rc::Rc::new(Prelude::encode(shape, what)?);
        PRELUDES.with_borrow_mut(|m| m.insert(shape, p.clone()));
        Ok(p)
    }

    /// Encode the prelude of `shape` (the sequence in the module docs, up to the displaced
    /// instructions) at address 0, every slot's value 0, and note where the values go.
    fn encode(shape: PreludeShape, what: &'static str) -> Result<Prelude, Refusal> {
        let encode_err = |e: iced_x86::IcedError| Refusal::Encode {
            what,
            addr: 0,
            reason: e.to_string(),
        };
        let rz = i64::from(shape.red_zone);
        let opts = shape.opts;
        // Each instruction with the slot its value comes from; 0 stands for every value (a rel32
        // to 0 from address 0 is in reach, and every form used has a fixed length).
        let mut instrs: Vec<(Instruction, Option<Slot>)> = Vec::with_capacity(80);
        let mut push = |r: Result<Instruction, iced_x86::IcedError>,
                        slot: Option<Slot>|
         -> Result<(), Refusal> {
            instrs.push((r.map_err(encode_err)?, slot));
            Ok(())
        };
        let lea_rsp =
            |delta: i64| Instruction::with2(Code::Lea_r64_m, Register::RSP, rsp_at(delta));
        let locked = |code: Code| {
            Instruction::with1(code, rip_at(0)).map(|mut i| {
                i.set_has_lock_prefix(true);
                i
            })
        };
        if rz > 0 {
            push(lea_rsp(-rz), None)?;
        }
        push(Ok(Instruction::with(Code::Pushfq)), None)?;
        push(locked(Code::Inc_rm64), Some(Slot::Hits))?;
        if opts.count_inflight {
            push(locked(Code::Inc_rm64), Some(Slot::Inflight))?;
        }
        push(lea_rsp(-16), None)?;
        for r in PUSH_ORDER {
            push(Instruction::with1(Code::Push_r64, r), None)?;
        }
        push(
            Instruction::with2(Code::Mov_r64_imm64, Register::RAX, 0u64),
            Some(Slot::Site),
        )?;
        push(
            Instruction::with2(Code::Mov_rm64_r64, rsp_at(RIP_SLOT), Register::RAX),
            None,
        )?;
        push(
            Instruction::with2(Code::Lea_r64_m, Register::RAX, rsp_at(FRAME + rz)),
            None,
        )?;
        push(
            Instruction::with2(Code::Mov_rm64_r64, rsp_at(RSP_SLOT), Register::RAX),
            None,
        )?;
        push(
            Instruction::with2(Code::Mov_r64_rm64, Register::RBX, Register::RSP),
            None,
        )?;
        push(
            Instruction::with2(Code::And_rm64_imm8, Register::RSP, -16i32),
            None,
        )?;
        match (opts.save_vector_regs, opts.xsave_size) {
            (true, Some(size)) => {
                // XRSTOR faults on a header whose reserved bytes are not 0, and XSAVE writes only
                // XSTATE_BV: zero the header first. The flags are saved, rax too.
                let area =
                    i32::try_from(size.next_multiple_of(64)).map_err(|_| Refusal::Encode {
                        what,
                        addr: 0,
                        reason: format!("an xsave area of {size} bytes"),
                    })?;
                push(
                    Instruction::with2(Code::Sub_rm64_imm32, Register::RSP, area),
                    None,
                )?;
                push(
                    Instruction::with2(Code::And_rm64_imm8, Register::RSP, -64i32),
                    None,
                )?;
                push(
                    Instruction::with2(Code::Xor_r32_rm32, Register::EAX, Register::EAX),
                    None,
                )?;
                for i in 0..8 {
                    push(
                        Instruction::with2(
                            Code::Mov_rm64_r64,
                            rsp_at(XSAVE_HEADER + 8 * i),
                            Register::RAX,
                        ),
                        None,
                    )?;
                }
                push(
                    Instruction::with2(Code::Mov_r32_imm32, Register::EAX, u32::MAX),
                    None,
                )?;
                push(
                    Instruction::with2(Code::Mov_r32_imm32, Register::EDX, u32::MAX),
                    None,
                )?;
                push(Instruction::with1(Code::Xsave64_mem, rsp_at(0)), None)?;
            }
            (true, None) => {
                push(
                    Instruction::with2(
                        Code::Sub_rm64_imm32,
                        Register::RSP,
                        i32::try_from(XMM_AREA).unwrap_or(256),
                    ),
                    None,
                )?;
                for (i, x) in (0i64..).zip(XMM) {
                    push(
                        Instruction::with2(Code::Movdqa_xmmm128_xmm, rsp_at(16 * i), x),
                        None,
                    )?;
                }
            }
            (false, _) => {}
        }
        if opts.rcu_watch.is_some() {
            // rsp is 16-aligned here, as at the handler's call.
            push(
                Instruction::with_branch(Code::Call_rel32_64, 0),
                Some(Slot::RcuEnter),
            )?;
            push(
                Instruction::with2(Code::Mov_r64_rm64, Register::R12, Register::RAX),
                None,
            )?;
        }
        // The SysV ABI wants DF clear at a call; the original DF comes back with the flags.
        push(Ok(Instruction::with(Code::Cld)), None)?;
        push(
            Instruction::with2(Code::Mov_r64_rm64, Register::RDI, Register::RBX),
            None,
        )?;
        push(
            Instruction::with2(Code::Mov_r64_imm64, Register::RSI, 0u64),
            Some(Slot::Cookie),
        )?;
        if shape.far_handler {
            push(
                Instruction::with2(Code::Mov_r64_imm64, Register::RAX, 0u64),
                Some(Slot::Handler),
            )?;
            push(Instruction::with1(Code::Call_rm64, Register::RAX), None)?;
        } else {
            push(
                Instruction::with_branch(Code::Call_rel32_64, 0),
                Some(Slot::Handler),
            )?;
        }
        if opts.rcu_watch.is_some() {
            push(
                Instruction::with2(Code::Test_rm64_r64, Register::R12, Register::R12),
                None,
            )?;
            // jz over the 5-byte call.
            push(Ok(Instruction::with_declare_byte_2(0x74, 0x05)), None)?;
            push(
                Instruction::with_branch(Code::Call_rel32_64, 0),
                Some(Slot::RcuExit),
            )?;
        }
        match (opts.save_vector_regs, opts.xsave_size) {
            (true, Some(_)) => {
                push(
                    Instruction::with2(Code::Mov_r32_imm32, Register::EAX, u32::MAX),
                    None,
                )?;
                push(
                    Instruction::with2(Code::Mov_r32_imm32, Register::EDX, u32::MAX),
                    None,
                )?;
                push(Instruction::with1(Code::Xrstor64_mem, rsp_at(0)), None)?;
            }
            (true, None) => {
                for (i, x) in (0i64..).zip(XMM) {
                    push(
                        Instruction::with2(Code::Movdqa_xmm_xmmm128, x, rsp_at(16 * i)),
                        None,
                    )?;
                }
            }
            (false, _) => {}
        }
        push(
            Instruction::with2(Code::Mov_r64_rm64, Register::RSP, Register::RBX),
            None,
        )?;
        for r in PUSH_ORDER.iter().rev() {
            push(Instruction::with1(Code::Pop_r64, *r), None)?;
        }
        push(lea_rsp(16), None)?;
        if opts.count_inflight {
            push(locked(Code::Dec_rm64), Some(Slot::Inflight))?;
        }
        if opts.restore_flags {
            push(Ok(Instruction::with(Code::Popfq)), None)?;
        } else {
            // The status flags are dead here but DF is not: set it again if it was set
            // (`test byte [rsp+1], 4` reads DF, bit 10, from the saved flags; `jz` over `std`).
            push(
                Instruction::with2(
                    Code::Test_rm8_imm8,
                    MemoryOperand::with_base_displ(Register::RSP, 1),
                    4u32,
                ),
                None,
            )?;
            push(Ok(Instruction::with_declare_byte_3(0x74, 0x01, 0xFD)), None)?; // jz +1; std
            push(lea_rsp(8), None)?;
        }
        if rz > 0 {
            push(lea_rsp(rz), None)?;
        }
        let mut enc = iced_x86::Encoder::new(64);
        let mut holes = Vec::new();
        let mut at = 0usize;
        for (i, slot) in &instrs {
            let len = enc.encode(i, at as u64).map_err(encode_err)?;
            let co = enc.get_constant_offsets();
            let next = at + len;
            match (slot, i.code()) {
                (None, _) => {}
                (Some(slot), Code::Call_rel32_64) => holes.push(Hole::Rel32 {
                    slot: *slot,
                    at: next - 4,
                    next,
                }),
                (Some(slot), Code::Mov_r64_imm64) => holes.push(Hole::Imm64 {
                    slot: *slot,
                    at: at + co.immediate_offset(),
                }),
                (Some(slot), _) => holes.push(Hole::Rel32 {
                    slot: *slot,
                    at: at + co.displacement_offset(),
                    next,
                }),
            }
            at = next;
        }
        log::debug!(
            "call trampoline prelude for {shape:?}: {at} bytes, {} holes",
            holes.len()
        );
        Ok(Prelude {
            bytes: enc.take_buffer(),
            holes,
        })
    }

    /// The prelude of trampoline `t` at `t.addr`: the template's bytes with `t`'s values in.
    pub(super) fn fill(
        &self,
        t: &CallTrampoline,
        rcu: Option<RcuWatch>,
        what: &'static str,
    ) -> Result<Vec<u8>, Refusal> {
        let mut out = Vec::with_capacity(self.bytes.len() + 64);
        out.extend_from_slice(&self.bytes);
        for hole in &self.holes {
            match *hole {
                Hole::Rel32 { slot, at, next } => {
                    let to = slot.of(t, rcu);
                    let from = t.addr + next as u64;
                    let rel = i32::try_from(i128::from(to) - i128::from(from)).map_err(|_| {
                        Refusal::Encode {
                            what,
                            addr: t.addr,
                            reason: format!("{to:#x} is out of rel32 reach of {from:#x}"),
                        }
                    })?;
                    out[at..at + 4].copy_from_slice(&rel.to_le_bytes());
                }
                Hole::Imm64 { slot, at } => {
                    out[at..at + 8].copy_from_slice(&slot.of(t, rcu).to_le_bytes())
                }
            }
        }
        Ok(out)
    }
}
