//! Trampolines and patch bytes, generated for a given address (pure byte generation; the caller
//! writes them into the repository and the text).
//!
//! The call trampoline ([`emit_call_trampoline`]) builds a `struct trapvec_regs`
//! ([`trapvec::abi::TrapvecRegs`]) on the stack, lowest address first `r15 .. r8, rdi, rsi, rbp,
//! rbx, rdx, rcx, rax, rsp, rip, rflags`, calls `handler(regs, cookie)`, restores the registers
//! (with the handler's changes), then replays the displaced instructions and jumps back:
//!
//! ```text
//! lea rsp,[rsp-RZ]                 ; step over the red zone (omitted when RZ = 0)
//! pushfq                           ; rflags slot
//! lock inc qword [rip+hits]
//! lock inc qword [rip+inflight]
//! lea rsp,[rsp-16]                 ; rip and rsp slots
//! push rax .. push r15
//! mov rax, imm64 site ; mov [rsp+128], rax      ; rip slot
//! lea rax,[rsp+144+RZ] ; mov [rsp+120], rax     ; rsp at the point
//! mov rbx, rsp                     ; callee-saved: survives the handler
//! and rsp,-16
//! (sub rsp,256 ; movdqa [rsp+16*i], xmm_i)      ; with save_vector_regs
//!   or (sub rsp,N ; and rsp,-64 ; zero the header ; mov eax,-1 ; mov edx,-1 ; xsave64 [rsp])
//! cld
//! mov rdi, rbx ; mov rsi, imm64 cookie
//! call handler                     ; rel32, or mov rax, imm64 ; call rax
//! (movdqa xmm_i, [rsp+16*i])  or  (mov eax,-1 ; mov edx,-1 ; xrstor64 [rsp])
//! mov rsp, rbx
//! pop r15 .. pop rax
//! lea rsp,[rsp+16]
//! lock dec qword [rip+inflight]    ; flags are still saved on the stack
//! popfq
//! lea rsp,[rsp+RZ]
//! <displaced instructions relocated here>
//! jmp site+displaced_len
//! ```
//!
//! With [`TrampolineOptions::rcu_watch`] (kernel code, a module that provides the two calls),
//! the handler's call is wrapped so that it runs with RCU watching wherever the site is (the
//! idle loop after `ct_idle_enter()` runs ordinary text: `kmod/jmp_rcu.c` says why):
//!
//! ```text
//! call enter                       ; rel32: 0 where RCU watches, else 1 after ct_nmi_enter()
//! mov r12, rax                     ; callee-saved: survives the handler (its value is in the frame)
//! cld ; mov rdi, rbx ; mov rsi, cookie ; call handler
//! test r12, r12 ; jz +5 ; call exit ; rel32: ct_nmi_exit()
//! ```
//!
//! `cld` comes right before the call (the SysV ABI wants DF clear there); `popfq` brings the
//! original DF back. Where the status flags are dead and `popfq` is left out, DF is set again
//! from the saved flags (`test byte [rsp+1], 4; jz +1; std`).
//!
//! Vector state: with [`TrampolineOptions::xsave_size`] (user space, a CPU with XSAVE) the whole
//! extended state (x87, MXCSR, xmm/ymm/zmm0–31, k0–7) is saved with `xsave64` into a
//! 64-byte-aligned area whose header is zeroed first, and restored with `xrstor64`, both with
//! EDX:EAX all ones (every feature XCR0 enables; the area's size comes from CPUID leaf 0xD).
//! Without it only xmm0–15 are saved (the `movdqa` form above). Kernel trampolines save no vector
//! state: kernel handlers must not use the FPU.

//! The counting replay of a count-only splice where the dispatcher does not count lives in
//! [`count`].

mod count;
mod guard;
mod prelude;
mod replace;

pub(crate) use count::emit_counting_replay;
pub(crate) use guard::GuardShape;
use prelude::{Prelude, PreludeShape};
pub use replace::{emit_replace_trampoline, ReplaceTrampoline, REPLACE_STACK_WORDS};

use iced_x86::{Code, Instruction, MemoryOperand, Register};
use trapvec::abi::TRAP_BYTES;
use trapvec::TargetInfo;

use crate::error::Refusal;
use crate::plan::{Plan, Springboard, JMP_REL32_LEN, JMP_REL8_LEN};
use crate::relocate::{encode_block, lower_displaced, reaches, LAYOUT_MARGIN};

/// Where a call trampoline goes and what it refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallTrampoline {
    /// Address the trampoline is generated for.
    pub addr: u64,
    pub site: u64,
    /// `void handler(struct trapvec_regs *, void *cookie)`.
    pub handler: u64,
    pub cookie: u64,
    /// Address of an 8-byte hit counter (within ±2 GiB of `addr`).
    pub hits: u64,
    /// Address of an 8-byte in-flight counter (within ±2 GiB of `addr`).
    pub inflight: u64,
}

/// The general registers in push order (the reverse of `struct trapvec_regs`).
const PUSH_ORDER: [Register; 15] = [
    Register::RAX,
    Register::RCX,
    Register::RDX,
    Register::RBX,
    Register::RBP,
    Register::RSI,
    Register::RDI,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// Offsets in `struct trapvec_regs` once every register is pushed.
const RSP_SLOT: i64 = 120;
const RIP_SLOT: i64 = 128;
/// Bytes from the pushed frame's base to the stack pointer at the point (minus the red zone).
const FRAME: i64 = 144;
/// Vector save area: xmm0–15, 16 bytes each.
const XMM_AREA: i64 = 256;

const XMM: [Register; 16] = [
    Register::XMM0,
    Register::XMM1,
    Register::XMM2,
    Register::XMM3,
    Register::XMM4,
    Register::XMM5,
    Register::XMM6,
    Register::XMM7,
    Register::XMM8,
    Register::XMM9,
    Register::XMM10,
    Register::XMM11,
    Register::XMM12,
    Register::XMM13,
    Register::XMM14,
    Register::XMM15,
];

/// Builds instruction lists, turning iced's creation errors (which fixed, valid operand
/// combinations never produce) into [`Refusal::Encode`].
struct Asm {
    instrs: Vec<Instruction>,
    addr: u64,
    what: &'static str,
    /// Index of the first relocated (displaced) instruction: everything before it has a fixed
    /// length and is encoded directly; the rest goes through the BlockEncoder.
    tail: Option<usize>,
}

fn rsp_at(disp: i64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RSP, disp)
}

fn rip_at(addr: u64) -> MemoryOperand {
    // iced: with a RIP base the displacement is the absolute target.
    MemoryOperand::with_base_displ(Register::RIP, i64::from_ne_bytes(addr.to_ne_bytes()))
}

impl Asm {
    fn new(addr: u64, what: &'static str) -> Self {
        // Room for a relocated window and its jump back, or a stub.
        Asm {
            instrs: Vec::with_capacity(16),
            addr,
            what,
            tail: None,
        }
    }

    fn push(&mut self, r: Result<Instruction, iced_x86::IcedError>) -> Result<(), Refusal> {
        let i = r.map_err(|e| Refusal::Encode {
            what: self.what,
            addr: self.addr,
            reason: e.to_string(),
        })?;
        self.instrs.push(i);
        Ok(())
    }

    fn lea_rsp(&mut self, delta: i64) -> Result<(), Refusal> {
        self.push(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            rsp_at(delta),
        ))
    }

    fn locked(&mut self, code: Code, counter: u64) -> Result<(), Refusal> {
        let mut i = Instruction::with1(code, rip_at(counter)).map_err(|e| Refusal::Encode {
            what: self.what,
            addr: self.addr,
            reason: e.to_string(),
        })?;
        i.set_has_lock_prefix(true);
        self.instrs.push(i);
        Ok(())
    }

    fn jmp(&mut self, dest: u64) -> Result<(), Refusal> {
        self.push(Instruction::with_branch(Code::Jmp_rel32_64, dest))
    }

    /// Append the displaced instructions relocated to this block.
    fn displaced(&mut self, plan: &Plan) -> Result<(), Refusal> {
        self.tail = Some(self.instrs.len());
        self.instrs
            .extend(lower_displaced(&plan.displaced, self.addr)?);
        Ok(())
    }

    /// Encode. Fixed-size forms come from per-shape templates (see [`encode_prefix`]); when the
    /// relocated tail needs the BlockEncoder (a `jcc rel8` that must grow to reach its target from
    /// here), the tail goes through it at the address where the prefix ends; a prefix the direct
    /// encoder refuses (e.g. a target out of rel32 reach) falls back to one BlockEncoder pass.
    fn encode(mut self) -> Result<Vec<u8>, Refusal> {
        // Most relocated tails (push, mov, lea, a rel32 call or jmp) have fixed forms too.
        if let Some(all) = encode_prefix(&self.instrs, self.addr) {
            return Ok(all);
        }
        let split = self.tail.unwrap_or(self.instrs.len());
        let Some(mut out) = encode_prefix(&self.instrs[..split], self.addr) else {
            return encode_block(&mut self.instrs, self.addr, self.what);
        };
        if split < self.instrs.len() {
            let ip = self.addr + out.len() as u64;
            out.extend(encode_block(&mut self.instrs[split..], ip, self.what)?);
        }
        Ok(out)
    }
}

/// Encoded bytes of an instruction sequence with fixed-size forms, and where each instruction's
/// address-dependent fields are.
struct Template {
    bytes: Vec<u8>,
    /// Per instruction: offset, length, constant offsets.
    layout: Vec<(usize, usize, iced_x86::ConstantOffsets)>,
}

/// An instruction with its address-dependent values (RIP-relative displacement, near branch
/// target, 64-bit immediate) cleared: two sequences with equal shapes encode to the same bytes
/// but for those fields.
fn shape(i: &Instruction) -> Instruction {
    let mut m = *i;
    m.set_ip(0);
    if m.memory_base() == Register::RIP {
        m.set_memory_displacement64(0);
    }
    // Every near branch (call, jmp, jcc, loop, jrcxz, xbegin): its displacement is rewritten
    // for the address each copy is placed at, so its target is no part of the shape. A target
    // left in the key would still match a later copy placed elsewhere, whose bytes would keep
    // the displacement of the first (a count site's replay is encoded once at a trial address
    // to size it, then at its block: every relocated jcc went where the trial copy would have).
    if m.op0_kind() == iced_x86::OpKind::NearBranch64 {
        m.set_near_branch64(0);
    }
    if m.code() == Code::Mov_r64_imm64 {
        m.set_immediate64(0);
    }
    m
}

/// Encode `instrs` at `addr` without the BlockEncoder. Encoding a trampoline's hundred fixed
/// instructions one by one dominates the cost of a batch of thousands of splices, so each shape
/// is encoded once per thread and later instances copy its bytes and rewrite only the
/// address-dependent fields. `None` if an instruction cannot be encoded this way.
fn encode_prefix(instrs: &[Instruction], addr: u64) -> Option<Vec<u8>> {
    use std::cell::RefCell;
    use std::collections::HashMap;
    type Shapes = HashMap<u64, Vec<(Vec<Instruction>, std::rc::Rc<Template>)>>;
    thread_local! {
        static TEMPLATES: RefCell<Shapes> = RefCell::new(HashMap::new());
    }
    let key: Vec<Instruction> = instrs.iter().map(shape).collect();
    // A cheap fingerprint picks the bucket (hashing whole `Instruction`s costs more than the
    // encoding saved); equality of the shapes decides.
    let print = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, m| {
        let fields = [
            m.code() as u64,
            u64::from(m.op_count()),
            m.op0_register() as u64
                | (m.op1_register() as u64) << 16
                | (m.memory_base() as u64) << 32
                | (m.memory_index() as u64) << 48,
            m.memory_displacement64(),
            u64::from(m.immediate32()) | u64::from(m.has_lock_prefix()) << 32,
        ];
        fields
            .iter()
            .fold(h, |h, &f| (h ^ f).wrapping_mul(0x0100_0000_01b3))
    });
    let cached = TEMPLATES.with(|t| {
        t.borrow()
            .get(&print)
            .and_then(|b| b.iter().find(|(k, _)| *k == key).map(|(_, t)| t.clone()))
    });
    let template = match cached {
        Some(t) => t,
        None => {
            let mut enc = iced_x86::Encoder::new(64);
            let mut layout = Vec::with_capacity(instrs.len());
            let mut ip = addr;
            for i in instrs {
                let n = enc.encode(i, ip).ok()?;
                layout.push((
                    usize::try_from(ip - addr).ok()?,
                    n,
                    enc.get_constant_offsets(),
                ));
                ip += n as u64;
            }
            let t = std::rc::Rc::new(Template {
                bytes: enc.take_buffer(),
                layout,
            });
            TEMPLATES.with(|c| {
                let mut c = c.borrow_mut();
                if c.len() > 256 {
                    c.clear();
                }
                c.entry(print).or_default().push((key, t.clone()));
            });
            t
        }
    };
    let mut out = template.bytes.clone();
    for (i, &(off, len, co)) in instrs.iter().zip(&template.layout) {
        let next = addr + (off + len) as u64;
        let rel32 = |target: u64| i32::try_from(i128::from(target) - i128::from(next)).ok();
        if i.memory_base() == Register::RIP && co.has_displacement() {
            let d = rel32(i.memory_displacement64())?;
            let at = off + co.displacement_offset();
            out[at..at + 4].copy_from_slice(&d.to_le_bytes());
        }
        if i.op0_kind() == iced_x86::OpKind::NearBranch64 {
            // The form (rel8 or rel32) is the instruction's code; only the displacement moves.
            // One that does not fit from here is left to the BlockEncoder. iced reports a branch's
            // displacement as the instruction's immediate.
            if !co.has_immediate() {
                return None;
            }
            let d = i128::from(i.near_branch64()) - i128::from(next);
            let at = off + co.immediate_offset();
            match co.immediate_size() {
                4 => out[at..at + 4].copy_from_slice(&i32::try_from(d).ok()?.to_le_bytes()),
                1 => out[at] = i8::try_from(d).ok()?.to_le_bytes()[0],
                _ => return None,
            }
        }
        if i.code() == Code::Mov_r64_imm64 {
            let at = off + co.immediate_offset();
            out[at..at + 8].copy_from_slice(&i.immediate64().to_le_bytes());
        }
    }
    Some(out)
}

/// What a call trampoline may leave out, from the analysis of the point and of the handler
/// ([`crate::analysis::liveness`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TrampolineOptions {
    /// Restore the flags with `popfq` (not needed where they are dead at the point).
    pub restore_flags: bool,
    /// Save vector state around the handler (xmm0–15, or all of it with `xsave_size`), only when
    /// the target wants it and the handler is not a lean leaf.
    pub save_vector_regs: bool,
    /// Count threads inside the handler (not needed for a lean leaf, whose range is scanned).
    pub count_inflight: bool,
    /// With `save_vector_regs`: save the whole extended state (ymm upper halves, zmm0–31,
    /// k0–7, x87, MXCSR) with `xsave64`/`xrstor64` into a 64-byte-aligned area of this many
    /// bytes (CPUID leaf 0xD, see [`host_xsave_size`]) instead of xmm0–15 alone.
    pub xsave_size: Option<u32>,
    /// Wrap the handler's call in the target's RCU entry and exit (see the module docs):
    /// kernel trampolines, whose site may be in text the idle loop runs with RCU not watching.
    pub rcu_watch: Option<RcuWatch>,
}

/// The kernel module's calls that make RCU watch around a trampoline's handler
/// (`trapvec_jmp_rcu_enter` returns 1 when it entered RCU, and then `trapvec_jmp_rcu_exit`
/// must be called after the handler), found by name in the target's symbols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RcuWatch {
    pub enter: u64,
    pub exit: u64,
}

impl RcuWatch {
    /// The module's symbol names.
    pub const ENTER: &'static str = "trapvec_jmp_rcu_enter";
    pub const EXIT: &'static str = "trapvec_jmp_rcu_exit";
    /// The module that defines them (the symbols' origin in kallsyms).
    pub const MODULE: &'static str = "trapvec";

    /// Both calls in `symbols`, defined by the kernel module; `None` in a process, or with a
    /// module that predates them.
    pub fn find(symbols: &trapvec::SymbolTable) -> Option<RcuWatch> {
        let of_module = |name: &str| {
            symbols
                .lookup_all(name)
                .into_iter()
                .find(|s| s.origin.as_deref() == Some(Self::MODULE))
                .map(|s| s.addr)
        };
        Some(RcuWatch {
            enter: of_module(Self::ENTER)?,
            exit: of_module(Self::EXIT)?,
        })
    }
}

impl TrampolineOptions {
    /// Everything, as the module docs show.
    pub fn full(info: &TargetInfo) -> Self {
        TrampolineOptions {
            restore_flags: true,
            save_vector_regs: info.save_vector_regs,
            count_inflight: true,
            xsave_size: None,
            rcu_watch: None,
        }
    }
}

/// The size of the XSAVE area (standard form) for the features this CPU and OS enable in XCR0:
/// CPUID leaf 0xD, sub-leaf 0, EBX. `None` without XSAVE (or OS support for it). Read once.
pub fn host_xsave_size() -> Option<u32> {
    static SIZE: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if !std::arch::is_x86_feature_detected!("xsave") {
                return None;
            }
            // CPUID is available on every x86-64 CPU; leaf 0xD exists where XSAVE does.
            let leaf = std::arch::x86_64::__cpuid_count(0xD, 0);
            log::debug!(
                "xsave area: {} bytes for the features enabled in XCR0",
                leaf.ebx
            );
            (leaf.ebx >= XSAVE_MIN).then_some(leaf.ebx)
        }
        #[cfg(not(target_arch = "x86_64"))]
        None
    })
}

/// The legacy area and the XSAVE header: the smallest XSAVE area.
const XSAVE_MIN: u32 = 576;
/// Offset of the XSAVE header in the area.
const XSAVE_HEADER: i64 = 512;

/// The call trampoline of a `call` splice (see the module docs for the exact sequence).
pub fn emit_call_trampoline(
    t: &CallTrampoline,
    plan: &Plan,
    info: &TargetInfo,
) -> Result<Vec<u8>, Refusal> {
    emit_call_trampoline_with(t, plan, info, &TrampolineOptions::full(info))
}

/// The call trampoline, leaving out what `opts` says is not needed: without `restore_flags` the
/// flags slot is dropped with `lea rsp,[rsp+8]` instead of `popfq`; without `count_inflight` the
/// in-flight counter is neither incremented nor decremented; without `save_vector_regs` no xmm
/// register is saved.
///
/// Everything before the displaced instructions (the *prelude*) depends only on the options, the
/// red zone and whether the handler is in rel32 reach: it is encoded once per thread for each
/// such shape and copied with this trampoline's addresses and values written in.
pub fn emit_call_trampoline_with(
    t: &CallTrampoline,
    plan: &Plan,
    info: &TargetInfo,
    opts: &TrampolineOptions,
) -> Result<Vec<u8>, Refusal> {
    let what = "the call trampoline";
    for (counter, name) in [
        (t.hits, "the trampoline's hit counter"),
        (t.inflight, "the trampoline's in-flight counter"),
    ] {
        if !reaches(t.addr, counter, LAYOUT_MARGIN) {
            log::debug!(
                "{name} at {counter:#x} is out of rip-relative reach of {:#x}",
                t.addr
            );
            return Err(Refusal::OutOfReach {
                what: "a call trampoline's counter",
                from: t.addr,
                to: counter,
            });
        }
    }
    if let Some(rcu) = opts.rcu_watch {
        for (to, name) in [(rcu.enter, RcuWatch::ENTER), (rcu.exit, RcuWatch::EXIT)] {
            if !reaches(t.addr, to, LAYOUT_MARGIN) {
                log::debug!("{name} at {to:#x} is out of rel32 reach of {:#x}", t.addr);
                return Err(Refusal::OutOfReach {
                    what: "a call trampoline's RCU entry or exit",
                    from: t.addr,
                    to,
                });
            }
        }
    }
    let far_handler = !reaches(t.addr, t.handler, LAYOUT_MARGIN);
    if far_handler {
        log::debug!(
            "handler {:#x} is out of rel32 reach of {:#x}: call through rax",
            t.handler,
            t.addr
        );
    }
    let shape = PreludeShape {
        red_zone: info.red_zone,
        far_handler,
        opts: *opts,
    };
    let mut out = Prelude::of(shape, what)?.fill(t, opts.rcu_watch, what)?;
    let mut tail = Asm::new(t.addr + out.len() as u64, what);
    tail.displaced(plan)?;
    tail.jmp(plan.window_end())?;
    out.extend(tail.encode()?);
    Ok(out)
}

/// The displaced instructions relocated to `addr`, then `jmp site+displaced_len`: the *original
/// trampoline* of a `replace` splice, and the destination of a trap whose handler the dispatcher
/// runs itself.
pub fn emit_replay(plan: &Plan, addr: u64) -> Result<Vec<u8>, Refusal> {
    let mut a = Asm::new(addr, "the replay trampoline");
    a.displaced(plan)?;
    a.jmp(plan.window_end())?;
    a.encode()
}

/// `jmp qword [rip+slot]`: a stub that goes wherever the 8-byte slot points.
///
/// When `slot` is out of rip-relative reach: load the slot through `rax` below the red zone and
/// `ret 136` to it (every register, the flags and `rsp` arrive unchanged).
pub fn emit_indirect_stub(addr: u64, slot: u64) -> Vec<u8> {
    let build = || -> Result<Vec<u8>, Refusal> {
        let mut a = Asm::new(addr, "an indirect stub");
        if reaches(addr, slot, LAYOUT_MARGIN) {
            a.push(Instruction::with1(Code::Jmp_rm64, rip_at(slot)))?;
        } else {
            a.lea_rsp(-128)?; // S-128: step over the red zone
            a.push(Instruction::with1(Code::Push_r64, Register::RAX))?; // [S-136] = rax
            a.push(Instruction::with1(Code::Push_r64, Register::RAX))?; // [S-144] = room for dest
            a.push(Instruction::with2(Code::Mov_r64_imm64, Register::RAX, slot))?;
            a.push(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RAX,
                MemoryOperand::with_base(Register::RAX),
            ))?;
            a.push(Instruction::with2(
                Code::Mov_rm64_r64,
                rsp_at(0),
                Register::RAX,
            ))?;
            a.push(Instruction::with2(
                Code::Mov_r64_rm64,
                Register::RAX,
                rsp_at(8),
            ))?;
            a.push(Instruction::with1(Code::Retnq_imm16, 136u32))?; // pop dest, rsp += 136 -> S
        }
        a.encode()
    };
    // Fixed register and RIP-relative (checked in reach) operands always encode.
    build().unwrap_or_else(|e| unreachable!("indirect stub at {addr:#x}: {e}"))
}

/// The trap written at a site: `int <vector>` (`CD F5` unless the kernel module was loaded with
/// another vector, [`TargetInfo::trap_vector`]).
pub fn trap_bytes(vector: u8) -> [u8; 2] {
    [TRAP_BYTES[0], vector]
}

fn rel32(from_end: u64, to: u64) -> Option<i32> {
    i32::try_from(i128::from(to) - i128::from(from_end)).ok()
}

/// The jump written at a jmp plan's site: `E9 rel32` to `dest`, or `EB rel8` to the plan's
/// springboard (which then jumps to `dest`, see [`springboard_bytes`]).
pub fn jmp_bytes(plan: &Plan, dest: u64) -> Result<Vec<u8>, Refusal> {
    if let Some(sb) = &plan.springboard {
        let rel = i8::try_from(i128::from(sb.addr) - i128::from(plan.site + JMP_REL8_LEN as u64))
            .map_err(|_| Refusal::OutOfReach {
            what: "a jmp rel8 to its springboard",
            from: plan.site,
            to: sb.addr,
        })?;
        return Ok(vec![0xEB, rel.to_le_bytes()[0]]);
    }
    if plan.displaced_len < JMP_REL32_LEN {
        return Err(Refusal::Encode {
            what: "a jmp rel32",
            addr: plan.site,
            reason: format!("the plan displaces only {} bytes", plan.displaced_len),
        });
    }
    let rel = rel32(plan.site + JMP_REL32_LEN as u64, dest).ok_or(Refusal::OutOfReach {
        what: "a jmp rel32",
        from: plan.site,
        to: dest,
    })?;
    let mut out = vec![0xE9];
    out.extend(rel.to_le_bytes());
    Ok(out)
}

/// The `jmp rel32` to `dest` written into a springboard.
pub fn springboard_bytes(sb: &Springboard, dest: u64) -> Result<[u8; 5], Refusal> {
    let rel = rel32(sb.addr + 5, dest).ok_or(Refusal::OutOfReach {
        what: "a springboard's jmp rel32",
        from: sb.addr,
        to: dest,
    })?;
    let r = rel.to_le_bytes();
    Ok([0xE9, r[0], r[1], r[2], r[3]])
}

#[cfg(test)]
mod tests;
