//! x86-64 code for the probes, with iced-x86's `CodeAssembler`.
//!
//! Each handler follows trapvec.h's ABI: `h(struct trapvec_regs *regs, void *cookie)` at an
//! entry, `h(struct trapvec_regs *regs, struct trapvec_call *call)` at a return. It keeps
//! `rbx` = regs, `r12` = the second argument, `r13` = the data block (maps and counters, one
//! `.bss` symbol), `rbp` = its frame (the `$variables`), and evaluates expressions into `rax`
//! with intermediate values on the stack. For a process it calls nothing: the pid, tid, cpu,
//! time and fault-safe reads are system calls made inline (`process_vm_readv` on itself for a
//! read). For the kernel ([`KernelTask`]) the task's fields are read from `current` (the
//! per-CPU `current_task` and the `task_struct` offsets trapvec.ko's INFO reports), and the
//! time and fault-safe reads are direct calls of kernel functions (`call rel32` with an
//! `R_X86_64_PLT32` against the kernel symbol, resolved by the component manager from
//! `/proc/kallsyms`): `copy_from_kernel_nofault`, `copy_from_user_nofault`, their
//! `strncpy_*` forms and `ktime_get_mono_fast_ns`, all safe with interrupts off and none
//! taking a lock. Their clobbers are harmless: a handler keeps its state in callee-saved
//! registers and on its stack.
//!
//! A handler starts with fixed bytes whose `lea r13, [rip + data]` displacement is at
//! [`DATA_DISP`] from its start (the relocation's place); the dump function also has
//! `lea r14, [rip + path]` at [`PATH_DISP`].

use iced_x86::code_asm::*;

use crate::ast::*;
use crate::check::{operands_signed, reg_offset, str_bytes, ty_of, Body, MapKind, Ty};
use crate::layout::{
    Layout, MapLayout, Strings, DELETED, EXIT_OFFSET, HEAD_OFFSET, READY, RECORD_WORDS,
};
use crate::KernelTask;

/// push rbx; push rbp; push r12; push r13; push r14; push r15; lea r13, [rip + 0]
#[rustfmt::skip]
pub const PROLOGUE: [u8; 17] = [
    /*00*/ 0x53, 0x55, 0x41, 0x54, 0x41, 0x55, 0x41, 0x56, 0x41, 0x57,
    /*0a*/ 0x4C, 0x8D, 0x2D, 0x00, 0x00, 0x00, 0x00, // lea r13,[rip+disp32]
];
/// lea r14, [rip + 0] (after the prologue, in the dump function).
pub const LEA_R14: [u8; 7] = [0x4C, 0x8D, 0x35, 0x00, 0x00, 0x00, 0x00];
/// `struct trapvec_regs`'s size (a replacement builds one on its stack).
const REGS_SIZE: i32 = 144;
/// Where the data displacement is in a handler.
pub const DATA_DISP: usize = 13;
/// Where the path displacement is in the dump function.
pub const PATH_DISP: usize = 20;

/// The selector of the per-CPU GDT segment whose limit holds the CPU number:
/// `GDT_ENTRY_CPUNODE` (15) * 8, RPL 3 (`__CPUNODE_SEG` in arch/x86/include/asm/segment.h).
const CPUNODE_SELECTOR: i32 = 15 * 8 + 3;
/// The CPU number's bits of that limit (`VDSO_CPUNODE_MASK`: the node is above them).
const CPUNODE_CPU_MASK: i32 = 0xfff;

/// How many slots a lookup tries before counting the update as dropped.
pub const MAX_PROBES: u32 = 32;
/// How many times a lookup waits for a slot another thread is filling.
const MAX_SPINS: i32 = 1000;

const SYS_WRITE: i32 = 1;
const SYS_OPEN: i32 = 2;
const SYS_CLOSE: i32 = 3;
const SYS_GETPID: i32 = 39;
const SYS_PRCTL: i32 = 157;
const PR_GET_NAME: i32 = 16;
const SYS_GETTID: i32 = 186;
const SYS_CLOCK_GETTIME: i32 = 228;
const SYS_GETCPU: i32 = 309;
const SYS_PROCESS_VM_READV: i32 = 310;

/// Why code could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("assembling: {0}")]
    Asm(#[from] IcedError),
    #[error("the maps need {0} bytes, more than a handler can address (2 GiB): use fewer slots")]
    TooLarge(usize),
    #[error("current_task's per-CPU offset {0:#x} is not a 32-bit displacement")]
    PerCpu(u64),
    #[error("a return under a predicate needs the function's original trampoline to go on to")]
    NoOriginal,
}

/// A handler's bytes and the symbols it calls (kernel functions) or jumps to (a replaced
/// function's original trampoline): `(offset of the rel32, symbol)`.
#[derive(Clone, Debug, Default)]
pub struct Code {
    pub bytes: Vec<u8>,
    pub calls: Vec<(usize, String)>,
}

/// Kernel functions the handlers call (see the module docs).
pub const COPY_FROM_KERNEL: &str = "copy_from_kernel_nofault";
pub const COPY_FROM_USER: &str = "copy_from_user_nofault";
pub const STR_FROM_KERNEL: &str = "strncpy_from_kernel_nofault";
pub const STR_FROM_USER: &str = "strncpy_from_user_nofault";
pub const KTIME: &str = "ktime_get_mono_fast_ns";

type R<T> = Result<T, CodegenError>;

/// [`READY`] and [`DELETED`] as immediates.
const READY_I32: i32 = 2;
const _: () = assert!(READY_I32 as u64 == READY);
const DELETED_I32: i32 = 3;
const _: () = assert!(DELETED_I32 as u64 == DELETED);

/// What a lookup of keys does with their slot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Update { has_val: bool },
    Read,
    Delete,
}

/// An i64's bits.
fn bits(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

fn disp(off: usize) -> R<i32> {
    i32::try_from(off).map_err(|_| CodegenError::TooLarge(off))
}

/// One handler's context.
pub struct Handler<'a> {
    pub body: &'a Body,
    pub ret: bool,
    /// Offset of this handler's failed-read counter in the data block.
    pub failed: usize,
    /// String-table indices of `func` and `probe` here.
    pub func: u64,
    pub probe: u64,
    /// Compiled for the kernel: where `current`'s fields are.
    pub kernel: Option<KernelTask>,
    /// The probes' printf formats (a record's format is its index here).
    pub formats: &'a [(String, Vec<Ty>)],
    /// A probe calls `exit()`: a handler does nothing once the exit flag is set.
    pub exits: bool,
    /// A replacement (`return EXPR`) under a predicate: the function's original trampoline
    /// (`__trapvec_orig_<fn>`), where a call the predicate does not select goes on.
    pub orig: Option<String>,
}

/// The handler's code (prologue included).
pub fn handler(h: &Handler<'_>, layout: &Layout, strings: &mut Strings) -> R<Code> {
    let mut a = CodeAssembler::new(64)?;
    let mut done = a.create_label();
    let replace = h.body.replaces();
    if replace {
        // Called as the function itself: a trapvec_regs on the stack holds its argument
        // registers, so that argN reads as at an entry.
        a.sub(rsp, REGS_SIZE)?;
        for n in 0..6 {
            const R: [AsmRegister64; 6] = [rdi, rsi, rdx, rcx, r8, r9];
            a.mov(qword_ptr(rsp + arg_reg(n)), R[usize::from(n)])?;
        }
        a.mov(rbx, rsp)?;
        a.xor(r12d, r12d)?;
    } else {
        a.mov(rbx, rdi)?;
        a.mov(r12, rsi)?;
    }
    a.mov(rbp, rsp)?;
    let frame = (h.body.vars.len() * 8 + 15) & !15;
    if frame > 0 {
        a.sub(rsp, disp(frame)?)?;
    }
    // With an `if`, every variable starts at 0: one that only a branch assigns reads 0 when the
    // branch did not run (never what the stack held). Without one, the checker lets a variable
    // be read only after its assignment, and a hit pays for no stores.
    if h.body.stmts.iter().any(|s| matches!(s, Stmt::If { .. })) {
        for slot in 0..h.body.vars.len() {
            a.mov(qword_ptr(rbp + var_slot(slot)), 0)?;
        }
    }
    let mut g = Gen {
        a,
        h,
        layout,
        strings,
        calls: Vec::new(),
    };
    if h.exits && !replace {
        // After exit() nothing more is recorded, as bpftrace stops its probes.
        g.a.cmp(qword_ptr(r13 + disp(EXIT_OFFSET)?), 0)?;
        g.a.jne(done)?;
    }
    // A replacement's call its predicate does not select runs the original function.
    let mut original = g.a.create_label();
    if let Some(p) = &h.body.predicate {
        g.expr(p)?;
        g.a.test(rax, rax)?;
        if replace {
            g.a.jz(original)?;
        } else {
            g.a.jz(done)?;
        }
    }
    for s in &h.body.stmts {
        g.stmt(s)?;
    }
    g.a.set_label(&mut done)?;
    if replace {
        // rax is the return value; the epilogue's `mov rsp, rbp` drops the regs too.
        g.a.add(rbp, REGS_SIZE)?;
    }
    epilogue(&mut g.a)?;
    if let (true, Some(orig)) = (replace && h.body.predicate.is_some(), &h.orig) {
        // The arguments as the caller passed them (the predicate changed no register), the
        // callee-saved registers and the stack as at the call, then a tail jump: the original
        // returns straight to the caller.
        g.a.set_label(&mut original)?;
        for n in 0..6 {
            const R: [AsmRegister64; 6] = [rdi, rsi, rdx, rcx, r8, r9];
            g.a.mov(R[usize::from(n)], qword_ptr(rbx + arg_reg(n)))?;
        }
        g.a.add(rbp, REGS_SIZE)?;
        g.a.mov(rsp, rbp)?;
        for r in [r15, r14, r13, r12, rbp, rbx] {
            g.a.pop(r)?;
        }
        let mut at = g.a.create_label();
        g.a.set_label(&mut at)?;
        // jmp rel32, relocated at load as a call is.
        g.a.db(&[0xE9, 0, 0, 0, 0])?;
        g.calls.push((at, orig.clone()));
    } else if replace && h.body.predicate.is_some() {
        return Err(CodegenError::NoOriginal);
    }
    let mut a = g.a;
    let out = a.assemble_options(
        0,
        iced_x86::BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )?;
    let mut bytes = PROLOGUE.to_vec();
    bytes.extend(&out.inner.code_buffer);
    let mut calls = Vec::with_capacity(g.calls.len());
    for (label, symbol) in &g.calls {
        let ip = usize::try_from(out.label_ip(label)?).expect("a handler is small");
        // The rel32 follows the call's E8 byte.
        calls.push((PROLOGUE.len() + ip + 1, symbol.clone()));
    }
    Ok(Code { bytes, calls })
}

fn epilogue(a: &mut CodeAssembler) -> R<()> {
    a.mov(rsp, rbp)?;
    a.pop(r15)?;
    a.pop(r14)?;
    a.pop(r13)?;
    a.pop(r12)?;
    a.pop(rbp)?;
    a.pop(rbx)?;
    a.ret()?;
    Ok(())
}

/// The dump function, a call handler at the program's `exit`: writes the data block to the
/// path (`open(path, O_WRONLY|O_CREAT|O_TRUNC, 0600)`, `write` until done, `close`).
pub fn dump(size: usize) -> R<Vec<u8>> {
    let mut a = CodeAssembler::new(64)?;
    let mut out = a.create_label();
    let mut again = a.create_label();
    let mut close = a.create_label();
    a.mov(rbp, rsp)?;
    a.mov(rdi, r14)?;
    a.mov(esi, 0x241)?;
    a.mov(edx, 0o600)?;
    a.mov(eax, SYS_OPEN)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.js(out)?;
    a.mov(r15, rax)?;
    a.mov(r12, size as u64)?;
    a.set_label(&mut again)?;
    a.test(r12, r12)?;
    a.jz(close)?;
    a.mov(rdi, r15)?;
    a.mov(rsi, r13)?;
    a.mov(rdx, r12)?;
    a.mov(eax, SYS_WRITE)?;
    a.syscall()?;
    a.test(rax, rax)?;
    a.jle(close)?;
    a.add(r13, rax)?;
    a.sub(r12, rax)?;
    a.jmp(again)?;
    a.set_label(&mut close)?;
    a.mov(rdi, r15)?;
    a.mov(eax, SYS_CLOSE)?;
    a.syscall()?;
    a.set_label(&mut out)?;
    epilogue(&mut a)?;
    let mut code = PROLOGUE.to_vec();
    code.extend(LEA_R14);
    code.extend(a.assemble(0)?);
    Ok(code)
}

struct Gen<'a, 'b> {
    a: CodeAssembler,
    h: &'a Handler<'a>,
    layout: &'a Layout,
    strings: &'b mut Strings,
    /// The calls of kernel functions and the jump to an original trampoline made so far: the
    /// label at each `call rel32` / `jmp rel32`, and its symbol.
    calls: Vec<(CodeLabel, String)>,
}

/// Offset in `trapvec_regs` of argument register `n` (rdi, rsi, rdx, rcx, r8, r9).
fn arg_reg(n: u8) -> i32 {
    const R: [&str; 6] = ["rdi", "rsi", "rdx", "rcx", "r8", "r9"];
    reg_offset(R[usize::from(n)]).expect("argument registers are in trapvec_regs")
}

fn var_slot(slot: usize) -> i32 {
    -(i32::try_from(slot).unwrap_or(i32::MAX / 8 - 1) + 1) * 8
}

impl Gen<'_, '_> {
    fn stmt(&mut self, s: &Stmt) -> R<()> {
        match s {
            Stmt::VarAssign { name, value, .. } => {
                self.expr(value)?;
                let slot = self.h.body.vars[name].0;
                self.a.mov(qword_ptr(rbp + var_slot(slot)), rax)?;
            }
            Stmt::Change { target, value, .. } => {
                self.expr(value)?;
                let off = match target {
                    Target::Retval => reg_offset("rax").expect("rax"),
                    Target::Arg(n) => arg_reg(*n),
                    Target::Reg(r) => reg_offset(r).expect("checked"),
                };
                self.a.mov(qword_ptr(rbx + off), rax)?;
            }
            Stmt::MapAssign {
                name, keys, value, ..
            } => {
                let (m, words) = self.push_keys(name, keys)?;
                let arg = match &value.kind {
                    ExprKind::Call(f, args) if f != "count" => Some(&args[0]),
                    ExprKind::Call(..) => None,
                    _ => Some(value),
                };
                if let Some(x) = arg {
                    self.expr(x)?;
                    self.a.push(rax)?;
                }
                self.update(&m, words, arg.is_some())?;
            }
            // The last statement (checked): its value is the function's, in rax at the end.
            Stmt::Return { value, .. } => self.expr(value)?,
            Stmt::Printf { format, args, .. } => self.printf(format, args)?,
            Stmt::If {
                cond, then, els, ..
            } => {
                let mut other = self.a.create_label();
                let mut end = self.a.create_label();
                self.expr(cond)?;
                self.a.test(rax, rax)?;
                self.a.jz(other)?;
                for s in then {
                    self.stmt(s)?;
                }
                if !els.is_empty() {
                    self.a.jmp(end)?;
                }
                // A label needs an instruction: an empty one where the branch ends.
                self.a.set_label(&mut other)?;
                self.a.zero_bytes()?;
                for s in els {
                    self.stmt(s)?;
                }
                self.a.set_label(&mut end)?;
                self.a.zero_bytes()?;
            }
            Stmt::Exit { .. } => {
                self.a.mov(qword_ptr(r13 + disp(EXIT_OFFSET)?), 1)?;
            }
            Stmt::Delete { name, keys, .. } => {
                let (m, words) = self.push_keys(name, keys)?;
                self.slot_op(&m, words, Op::Delete)?;
            }
            Stmt::Clear { name, .. } => {
                // Every slot back to EMPTY with zero keys and values: a bounded `rep stosq`.
                let m = self.map(name);
                self.a.lea(rdi, qword_ptr(r13 + disp(m.offset)?))?;
                self.a.mov(ecx, disp(m.slots * m.slot_words)?)?;
                self.a.xor(eax, eax)?;
                // The ABI's DF is clear at a function's entry; a splice elsewhere may not be.
                self.a.cld()?;
                self.a.rep().stosq()?;
            }
            Stmt::Print { .. } => unreachable!("refused by the checker"),
        }
        Ok(())
    }

    fn map(&self, name: &str) -> MapLayout {
        self.layout
            .maps
            .iter()
            .find(|m| m.info.name == name)
            .expect("every map has a layout")
            .clone()
    }

    /// Push a map's keys as `update` wants them; the map and the words pushed.
    fn push_keys(&mut self, name: &str, keys: &[Expr]) -> R<(MapLayout, usize)> {
        let m = self.map(name);
        let mut words = 0;
        for k in keys {
            let t = ty_of(k, &self.h.body.vars);
            words += self.push_value(k, &t)?;
        }
        Ok((m, words))
    }

    /// Push `e`'s value of type `t` on the stack (bytes as words, the first word pushed first;
    /// anything else from rax); the words pushed.
    fn push_value(&mut self, e: &Expr, t: &Ty) -> R<usize> {
        if let Ty::Bytes(_) = t {
            self.bytes(e)?;
        } else {
            self.expr(e)?;
            self.a.push(rax)?;
        }
        Ok(t.words())
    }

    /// A printf in a probe: the arguments pushed, a ticket taken from the ring's head, the
    /// record written in its slot (seq last: see layout's ring).
    fn printf(&mut self, format: &str, args: &[Expr]) -> R<()> {
        let vars = &self.h.body.vars;
        let tys: Vec<Ty> = args
            .iter()
            .map(|a| crate::check::printf_ty(ty_of(a, vars)))
            .collect();
        let index = self
            .h
            .formats
            .iter()
            .position(|(f, t)| f == format && *t == tys)
            .expect("the checker lists every format");
        let mut words = 0;
        for (arg, t) in args.iter().zip(&tys) {
            words += self.push_value(arg, t)?;
        }
        let records = self.layout.ring_records;
        let a = &mut self.a;
        a.mov(eax, 1)?;
        a.lock().xadd(qword_ptr(r13 + disp(HEAD_OFFSET)?), rax)?;
        a.mov(r8, rax)?;
        a.and(r8, disp(records - 1)?)?;
        a.imul_3(r8, r8, disp(RECORD_WORDS * 8)?)?;
        a.add(r8, r13)?;
        a.add(r8, disp(self.layout.ring)?)?;
        a.mov(qword_ptr(r8), 0)?;
        a.mov(qword_ptr(r8 + 8), disp(index)?)?;
        for p in 0..words {
            a.mov(rcx, qword_ptr(rsp + disp(8 * (words - 1 - p))?))?;
            a.mov(qword_ptr(r8 + disp(16 + 8 * p)?), rcx)?;
        }
        a.inc(rax)?;
        a.mov(qword_ptr(r8), rax)?;
        if words > 0 {
            a.add(rsp, disp(words * 8)?)?;
        }
        Ok(())
    }

    /// Push the bytes of `e` (`comm`, `str(p, n)`) as words, the first word pushed first (so
    /// at the highest address, as consecutive integer keys are).
    fn bytes(&mut self, e: &Expr) -> R<()> {
        let n = match &e.kind {
            ExprKind::Builtin(Builtin::Comm) if self.h.kernel.is_some() => {
                let k = self.h.kernel.expect("just tested");
                // current->comm's 16 bytes (set_task_comm pads them with NULs).
                let comm = k.comm;
                self.a.sub(rsp, 16)?;
                self.current(&k)?;
                self.a.mov(rcx, qword_ptr(rax + comm))?;
                self.a.mov(qword_ptr(rsp), rcx)?;
                self.a.mov(rcx, qword_ptr(rax + comm + 8))?;
                self.a.mov(qword_ptr(rsp + 8), rcx)?;
                16
            }
            ExprKind::Builtin(Builtin::Comm) => {
                let a = &mut self.a;
                // prctl(PR_GET_NAME) writes the 16 bytes of the thread's name, NUL-padded.
                a.sub(rsp, 16)?;
                a.mov(edi, PR_GET_NAME)?;
                a.mov(rsi, rsp)?;
                a.mov(eax, SYS_PRCTL)?;
                a.syscall()?;
                16
            }
            ExprKind::Call(_, args) => {
                let n = str_bytes(args);
                let len = match args[1].kind {
                    ExprKind::Int(k) => disp(usize::try_from(k).unwrap_or(n))?,
                    _ => unreachable!("checked"),
                };
                self.expr(&args[0])?;
                if self.h.kernel.is_some() {
                    self.str_read_kernel(n, len)?;
                } else {
                    self.str_read(n, len)?;
                }
                n
            }
            _ => unreachable!("checked: only comm and str() are bytes"),
        };
        // Reverse the words in place: the buffer's word 0 goes to the highest address.
        let w = n / 8;
        for i in 0..w / 2 {
            let lo = disp(8 * i)?;
            let hi = disp(8 * (w - 1 - i))?;
            self.a.mov(rax, qword_ptr(rsp + lo))?;
            self.a.mov(rcx, qword_ptr(rsp + hi))?;
            self.a.mov(qword_ptr(rsp + hi), rax)?;
            self.a.mov(qword_ptr(rsp + lo), rcx)?;
        }
        Ok(())
    }

    /// Read at most `len` bytes at rax into a zeroed `n`-byte buffer left on the stack, cut at
    /// the first NUL. The read is `process_vm_readv` on this process with two remote pieces
    /// split at the page boundary, so that a string ending on a mapped page reads even though
    /// the next page is not mapped (the kernel also stops a piece at its first fault; the
    /// split does not depend on that). Nothing read counts as a failed read.
    fn str_read(&mut self, n: usize, len: i32) -> R<()> {
        let a = &mut self.a;
        let mut ok = a.create_label();
        let mut fits = a.create_label();
        let buf = disp(n)?;
        a.sub(rsp, buf)?;
        for i in 0..n / 8 {
            a.mov(qword_ptr(rsp + disp(8 * i)?), 0)?;
        }
        // [rsp] local iovec {buf, len}, [rsp+16] and [rsp+32] the remote pieces.
        a.sub(rsp, 48)?;
        a.lea(rcx, qword_ptr(rsp + 48))?;
        a.mov(qword_ptr(rsp), rcx)?;
        a.mov(qword_ptr(rsp + 8), len)?;
        a.mov(qword_ptr(rsp + 16), rax)?;
        // first = min(len, 4096 - (addr & 4095))
        a.mov(rcx, rax)?;
        a.and(ecx, 4095)?;
        a.neg(rcx)?;
        a.add(rcx, 4096)?;
        a.cmp(rcx, len)?;
        a.jbe(fits)?;
        a.mov(ecx, len)?;
        a.set_label(&mut fits)?;
        a.mov(qword_ptr(rsp + 24), rcx)?;
        a.add(rax, rcx)?;
        a.mov(qword_ptr(rsp + 32), rax)?;
        a.mov(edx, len)?;
        a.sub(rdx, rcx)?;
        a.mov(qword_ptr(rsp + 40), rdx)?;
        a.mov(eax, SYS_GETPID)?;
        a.syscall()?;
        a.mov(rdi, rax)?;
        a.mov(rsi, rsp)?;
        a.mov(edx, 1)?;
        a.lea(r10, qword_ptr(rsp + 16))?;
        a.mov(r8d, 2)?;
        a.xor(r9d, r9d)?;
        a.mov(eax, SYS_PROCESS_VM_READV)?;
        a.syscall()?;
        a.test(rax, rax)?;
        a.jg(ok)?;
        a.lock().inc(qword_ptr(r13 + disp(self.h.failed)?))?;
        a.set_label(&mut ok)?;
        a.add(rsp, 48)?;
        self.cut_at_nul(len)
    }

    /// `call SYMBOL`, a kernel function: the rel32 is relocated at load (`R_X86_64_PLT32`).
    fn call_kernel(&mut self, symbol: &'static str) -> R<()> {
        let mut at = self.a.create_label();
        self.a.set_label(&mut at)?;
        self.a.db(&[0xE8, 0, 0, 0, 0])?;
        self.calls.push((at, symbol.to_string()));
        Ok(())
    }

    /// rax = current, the running task: `mov rax, gs:[current_task]` (the per-CPU offset
    /// trapvec.ko reports: `current_task` on 6.1, `pcpu_hot.current_task` since 6.2).
    fn current(&mut self, k: &KernelTask) -> R<()> {
        let off =
            i32::try_from(k.current_task).map_err(|_| CodegenError::PerCpu(k.current_task))?;
        // gs: REX.W mov r64, r/m64 with a SIB of no base and no index: an absolute disp32.
        let mut b = vec![0x65, 0x48, 0x8B, 0x04, 0x25];
        b.extend(off.to_le_bytes());
        self.a.db(&b)?;
        Ok(())
    }

    /// rax = the CPU this runs on, as the vDSO's getcpu() finds it without RDPID: every CPU's
    /// GDT has a per-CPU segment (`GDT_ENTRY_CPUNODE`, selector [`CPUNODE_SELECTOR`]) whose
    /// limit is `node << 12 | cpu` (`setup_getcpu()`, since 4.19 and on every x86-64 kernel),
    /// so `lsl` of it gives `smp_processor_id()` with no per-CPU offset and no call. The
    /// handler runs with interrupts off: it cannot migrate between the `lsl` and its use.
    /// (RDPID would read the same number from `MSR_TSC_AUX`, but QEMU's default CPU lacks it.)
    fn kernel_cpu(&mut self) -> R<()> {
        self.a.mov(eax, CPUNODE_SELECTOR)?;
        self.a.lsl(eax, eax)?;
        self.a.and(eax, CPUNODE_CPU_MASK)?;
        Ok(())
    }

    /// The fault-safe copy at rsi (kernel or user half by its top bit) of rdx bytes to rdi:
    /// `kernel` or `user` (one of the `*_nofault` functions); the result is in rax.
    fn nofault(&mut self, kernel: &'static str, user: &'static str) -> R<()> {
        let mut high = self.a.create_label();
        let mut done = self.a.create_label();
        self.a.test(rsi, rsi)?;
        self.a.js(high)?;
        self.call_kernel(user)?;
        self.a.jmp(done)?;
        self.a.set_label(&mut high)?;
        // The call has a label of its own (an instruction takes one).
        self.a.nop()?;
        self.call_kernel(kernel)?;
        self.a.set_label(&mut done)?;
        Ok(())
    }

    /// Zero what follows the first NUL of the `len` bytes at rsp.
    fn cut_at_nul(&mut self, len: i32) -> R<()> {
        let a = &mut self.a;
        let mut find = a.create_label();
        let mut zero = a.create_label();
        let mut done = a.create_label();
        a.mov(rdi, rsp)?;
        a.mov(ecx, len)?;
        a.set_label(&mut find)?;
        a.cmp(byte_ptr(rdi), 0)?;
        a.je(zero)?;
        a.inc(rdi)?;
        a.dec(ecx)?;
        a.jnz(find)?;
        a.jmp(done)?;
        a.set_label(&mut zero)?;
        a.mov(byte_ptr(rdi), 0)?;
        a.inc(rdi)?;
        a.dec(ecx)?;
        a.jnz(zero)?;
        a.set_label(&mut done)?;
        a.nop()?;
        Ok(())
    }

    /// The kernel's `str()`: at most `len` bytes at rax into a zeroed `n`-byte buffer left on
    /// the stack, cut at the first NUL, by `strncpy_from_{kernel,user}_nofault` into a
    /// scratch buffer below it. Those copy at most count - 1 characters and a NUL, so they are
    /// given len + 1; a fault (a negative result) leaves the empty string and is counted.
    fn str_read_kernel(&mut self, n: usize, len: i32) -> R<()> {
        let buf = disp(n)?;
        let scratch = disp(n + 16)?;
        let mut ok = self.a.create_label();
        self.a.sub(rsp, buf)?;
        for i in 0..n / 8 {
            self.a.mov(qword_ptr(rsp + disp(8 * i)?), 0)?;
        }
        self.a.sub(rsp, scratch)?;
        self.a.mov(rdi, rsp)?;
        self.a.mov(rsi, rax)?;
        self.a.mov(edx, len + 1)?;
        self.nofault(STR_FROM_KERNEL, STR_FROM_USER)?;
        self.a.test(rax, rax)?;
        self.a.jns(ok)?;
        self.a.lock().inc(qword_ptr(r13 + disp(self.h.failed)?))?;
        self.a.mov(byte_ptr(rsp), 0)?;
        self.a.set_label(&mut ok)?;
        self.cut_at_nul(len)?;
        // Bytes len..n of the scratch were never written: the buffer keeps its zeros there.
        for i in 0..n / 8 {
            let keep = usize::try_from(len)
                .unwrap_or(n)
                .saturating_sub(8 * i)
                .min(8);
            if keep == 0 {
                break;
            }
            self.a.mov(rax, qword_ptr(rsp + disp(8 * i)?))?;
            if keep < 8 {
                // Little endian: the first `keep` bytes are the low ones.
                self.a.mov(rcx, (1u64 << (8 * keep)) - 1)?;
                self.a.and(rax, rcx)?;
            }
            self.a.mov(qword_ptr(rsp + scratch + disp(8 * i)?), rax)?;
        }
        self.a.add(rsp, scratch)?;
        Ok(())
    }

    /// The kernel's `*(T *)rax`: `copy_from_{kernel,user}_nofault` into a stack word; a
    /// failure counts and gives 0.
    fn read_kernel(&mut self, t: IntTy) -> R<()> {
        let mut ok = self.a.create_label();
        self.a.sub(rsp, 16)?;
        self.a.mov(qword_ptr(rsp), 0)?;
        self.a.mov(rdi, rsp)?;
        self.a.mov(rsi, rax)?;
        self.a.mov(edx, i32::from(t.bytes))?;
        self.nofault(COPY_FROM_KERNEL, COPY_FROM_USER)?;
        self.a.test(rax, rax)?;
        self.a.jz(ok)?;
        self.a.lock().inc(qword_ptr(r13 + disp(self.h.failed)?))?;
        self.a.mov(qword_ptr(rsp), 0)?;
        self.a.set_label(&mut ok)?;
        self.a.mov(rax, qword_ptr(rsp))?;
        self.a.add(rsp, 16)?;
        self.extend(t)
    }

    /// `bytes == "literal"` (or `!=`) into rax.
    fn compare_bytes(&mut self, op: BinOp, x: &Expr, lit: &str) -> R<()> {
        self.bytes(x)?;
        let Ty::Bytes(n) = ty_of(x, &self.h.body.vars) else {
            unreachable!("checked")
        };
        let w = n / 8;
        let mut padded = lit.as_bytes().to_vec();
        padded.resize(n, 0);
        let a = &mut self.a;
        let mut differ = a.create_label();
        let mut end = a.create_label();
        for i in 0..w {
            let mut b = [0u8; 8];
            b.copy_from_slice(&padded[8 * i..8 * i + 8]);
            a.mov(rax, u64::from_le_bytes(b))?;
            a.cmp(qword_ptr(rsp + disp(8 * (w - 1 - i))?), rax)?;
            a.jne(differ)?;
        }
        a.mov(eax, i32::from(op == BinOp::Eq))?;
        a.jmp(end)?;
        a.set_label(&mut differ)?;
        a.mov(eax, i32::from(op == BinOp::Ne))?;
        a.set_label(&mut end)?;
        a.add(rsp, disp(n)?)?;
        Ok(())
    }

    /// Find or claim the slot of the keys on the stack (the value above them when `has_val`)
    /// and update it; pop them all.
    fn update(&mut self, m: &MapLayout, nkeys: usize, has_val: bool) -> R<()> {
        self.slot_op(m, nkeys, Op::Update { has_val })
    }

    /// The keys on the stack's slot in map `m`: update it (claiming a slot for new keys, or
    /// taking back a deleted slot of the same keys), read its value into rax (0 when absent),
    /// or delete it (state DELETED: lookups go past it, the same keys take it back); pop the
    /// keys (and the value).
    fn slot_op(&mut self, m: &MapLayout, nkeys: usize, op: Op) -> R<()> {
        let has_val = matches!(op, Op::Update { has_val: true });
        let update = matches!(op, Op::Update { .. });
        let a = &mut self.a;
        let key_at = |i: usize| -> i32 {
            let words = usize::from(has_val) + (nkeys - 1 - i);
            i32::try_from(words * 8).unwrap_or(0)
        };
        let mut lookup = a.create_label();
        let mut occupied = a.create_label();
        let mut next = a.create_label();
        let mut found = a.create_label();
        let mut out = a.create_label();
        let mut absent = a.create_label();
        let mut spin = a.create_label();
        let mut compare = a.create_label();
        let mut deleted = a.create_label();
        let mut init = a.create_label();
        // h = fold of (h ^ key) * golden ratio; index = high half & (slots - 1).
        a.mov(rax, 0xcbf2_9ce4_8422_2325u64)?;
        a.mov(rcx, 0x9e37_79b9_7f4a_7c15u64)?;
        for i in 0..nkeys {
            a.xor(rax, qword_ptr(rsp + key_at(i)))?;
            a.imul_2(rax, rcx)?;
        }
        a.shr(rax, 32)?;
        a.and(rax, disp(m.slots - 1)?)?;
        a.mov(r14, rax)?;
        a.mov(
            r15d,
            MAX_PROBES.min(u32::try_from(m.slots).unwrap_or(u32::MAX)),
        )?;
        a.set_label(&mut lookup)?;
        a.mov(r8, r14)?;
        a.imul_3(r8, r8, disp(m.slot_words * 8)?)?;
        a.add(r8, r13)?;
        a.add(r8, disp(m.offset)?)?;
        a.mov(rax, qword_ptr(r8))?;
        a.test(rax, rax)?;
        a.jnz(occupied)?;
        if !update {
            // An empty slot ends the chain: the keys are not in the map.
            a.jmp(absent)?;
        } else {
            // Empty: claim it (EMPTY -> 1), write the keys and the initial value, publish READY.
            a.xor(eax, eax)?;
            a.mov(ecx, 1)?;
            a.lock().cmpxchg(qword_ptr(r8), rcx)?;
            a.jnz(occupied)?;
            for i in 0..nkeys {
                a.mov(rax, qword_ptr(rsp + key_at(i)))?;
                a.mov(qword_ptr(r8 + disp(8 + 8 * i)?), rax)?;
            }
            a.set_label(&mut init)?;
            let init_value = match m.info.kind {
                MapKind::Min if m.info.signed => Some(i64::MAX as u64),
                MapKind::Min => Some(u64::MAX),
                MapKind::Max if m.info.signed => Some(bits(i64::MIN)),
                _ => None,
            };
            match init_value {
                Some(v) => {
                    a.mov(rax, v)?;
                    a.mov(qword_ptr(r8 + disp(8 + 8 * nkeys)?), rax)?;
                }
                None => a.nop()?,
            }
            // x86 stores are not reordered with older stores: READY publishes the keys.
            a.mov(qword_ptr(r8), READY_I32)?;
            a.jmp(found)?;
        }
        a.set_label(&mut occupied)?;
        // Another thread is filling it: wait for READY a bounded time, else try the next.
        a.mov(r10d, MAX_SPINS)?;
        a.set_label(&mut spin)?;
        a.mov(rax, qword_ptr(r8))?;
        a.cmp(rax, READY_I32)?;
        a.je(compare)?;
        a.cmp(rax, DELETED_I32)?;
        a.je(deleted)?;
        a.pause()?;
        a.dec(r10d)?;
        a.jnz(spin)?;
        a.jmp(next)?;
        a.set_label(&mut deleted)?;
        if update {
            // A deleted slot of the same keys is taken back (DELETED -> 1), its value zeroed.
            for i in 0..nkeys {
                a.mov(rax, qword_ptr(r8 + disp(8 + 8 * i)?))?;
                a.cmp(rax, qword_ptr(rsp + key_at(i)))?;
                a.jne(next)?;
            }
            a.mov(eax, DELETED_I32)?;
            a.mov(ecx, 1)?;
            a.lock().cmpxchg(qword_ptr(r8), rcx)?;
            a.jnz(occupied)?;
            a.lea(rdi, qword_ptr(r8 + disp(8 + 8 * nkeys)?))?;
            a.mov(ecx, disp(m.info.kind.value_words())?)?;
            a.xor(eax, eax)?;
            a.cld()?;
            a.rep().stosq()?;
            a.jmp(init)?;
        } else {
            a.jmp(next)?;
        }
        a.set_label(&mut compare)?;
        for i in 0..nkeys {
            a.mov(rax, qword_ptr(r8 + disp(8 + 8 * i)?))?;
            a.cmp(rax, qword_ptr(rsp + key_at(i)))?;
            a.jne(next)?;
        }
        a.jmp(found)?;
        a.set_label(&mut next)?;
        a.inc(r14)?;
        a.and(r14, disp(m.slots - 1)?)?;
        a.dec(r15d)?;
        a.jnz(lookup)?;
        if update {
            a.lock().inc(qword_ptr(r13 + disp(m.dropped)?))?;
            a.jmp(out)?;
        }
        a.set_label(&mut absent)?;
        a.xor(eax, eax)?;
        a.jmp(out)?;
        a.set_label(&mut found)?;
        a.lea(r9, qword_ptr(r8 + disp(8 + 8 * nkeys)?))?;
        match op {
            Op::Update { .. } => {}
            Op::Read => {
                a.mov(rax, qword_ptr(r9))?;
                if let MapKind::Avg = m.info.kind {
                    // sum / count (count >= 1 once READY).
                    a.mov(rcx, qword_ptr(r9 + 8))?;
                    a.test(rcx, rcx)?;
                    a.jz(out)?;
                    if m.info.signed {
                        a.cqo()?;
                        a.idiv(rcx)?;
                    } else {
                        a.xor(edx, edx)?;
                        a.div(rcx)?;
                    }
                }
                a.jmp(out)?;
            }
            Op::Delete => {
                a.mov(eax, READY_I32)?;
                a.mov(ecx, DELETED_I32)?;
                a.lock().cmpxchg(qword_ptr(r8), rcx)?;
                a.jmp(out)?;
            }
        }
        if has_val {
            a.mov(rcx, qword_ptr(rsp))?;
        }
        let signed = m.info.signed;
        match m.info.kind {
            _ if !update => {}
            MapKind::Count => a.lock().inc(qword_ptr(r9))?,
            MapKind::Sum => a.lock().add(qword_ptr(r9), rcx)?,
            MapKind::Avg => {
                a.lock().add(qword_ptr(r9), rcx)?;
                a.lock().inc(qword_ptr(r9 + 8))?;
            }
            MapKind::Value => a.mov(qword_ptr(r9), rcx)?,
            MapKind::Min | MapKind::Max => {
                // cmpxchg until the stored value is no longer worse than x.
                let mut retry = a.create_label();
                a.mov(rax, qword_ptr(r9))?;
                a.set_label(&mut retry)?;
                a.cmp(rcx, rax)?;
                match (m.info.kind == MapKind::Min, signed) {
                    (true, true) => a.jge(out)?,
                    (true, false) => a.jae(out)?,
                    (false, true) => a.jle(out)?,
                    (false, false) => a.jbe(out)?,
                }
                a.lock().cmpxchg(qword_ptr(r9), rcx)?;
                a.jnz(retry)?;
            }
            MapKind::Hist => {
                let mut have = a.create_label();
                a.xor(eax, eax)?;
                a.test(rcx, rcx)?;
                a.js(have)?;
                a.mov(eax, 1)?;
                a.jz(have)?;
                a.bsr(rax, rcx)?;
                a.add(rax, 2)?;
                a.set_label(&mut have)?;
                a.lock().inc(qword_ptr(r9 + rax * 8))?;
            }
            MapKind::Lhist { lo, hi, step } => {
                let nb = crate::check::lhist_buckets(lo, hi, step);
                let mut have = a.create_label();
                a.xor(eax, eax)?;
                a.mov(rdx, bits(lo))?;
                a.cmp(rcx, rdx)?;
                a.jl(have)?;
                a.mov(eax, disp(nb - 1)?)?;
                a.mov(rdx, bits(hi))?;
                a.cmp(rcx, rdx)?;
                a.jge(have)?;
                a.mov(rax, rcx)?;
                a.mov(rdx, bits(lo))?;
                a.sub(rax, rdx)?;
                a.xor(edx, edx)?;
                a.mov(r10, bits(step))?;
                a.div(r10)?;
                a.inc(rax)?;
                a.set_label(&mut have)?;
                a.lock().inc(qword_ptr(r9 + rax * 8))?;
            }
        }
        a.set_label(&mut out)?;
        let words = nkeys + usize::from(has_val);
        if words > 0 {
            a.add(rsp, disp(words * 8)?)?;
        } else {
            // `out` needs an instruction of its own (the next label may follow).
            a.nop()?;
        }
        Ok(())
    }

    /// Evaluate `e` into rax.
    fn expr(&mut self, e: &Expr) -> R<()> {
        let vars = &self.h.body.vars;
        match &e.kind {
            ExprKind::Int(v) => self.a.mov(rax, *v)?,
            ExprKind::Str(s) => {
                let i = self.strings.intern(s);
                self.a.mov(rax, i)?
            }
            ExprKind::Builtin(b) => self.builtin(*b)?,
            ExprKind::Reg(r) => self
                .a
                .mov(rax, qword_ptr(rbx + reg_offset(r).expect("checked")))?,
            ExprKind::Var(v) => self.a.mov(rax, qword_ptr(rbp + var_slot(vars[v].0)))?,
            ExprKind::Map(name, keys) => {
                let (m, words) = self.push_keys(name, keys)?;
                self.slot_op(&m, words, Op::Read)?;
            }
            ExprKind::Call(..) => unreachable!("refused by the checker"),
            ExprKind::Unary(op, x) => {
                self.expr(x)?;
                match op {
                    UnOp::Neg => self.a.neg(rax)?,
                    UnOp::BitNot => self.a.not(rax)?,
                    UnOp::Not => {
                        self.a.test(rax, rax)?;
                        self.a.sete(al)?;
                        self.a.movzx(eax, al)?;
                    }
                }
            }
            ExprKind::Cast(t, x) => {
                self.expr(x)?;
                self.extend(*t)?;
            }
            ExprKind::Deref(t, x) => {
                self.expr(x)?;
                self.read(*t)?;
            }
            ExprKind::Binary(op, x, y) => self.binary(*op, x, y, operands_signed(x, y, vars))?,
        }
        Ok(())
    }

    /// rax = rax as `t` (truncated, then sign- or zero-extended).
    fn extend(&mut self, t: IntTy) -> R<()> {
        let a = &mut self.a;
        match (t.bytes, t.signed) {
            (8, _) => {}
            (4, true) => a.movsxd(rax, eax)?,
            (4, false) => a.mov(eax, eax)?,
            (2, true) => a.movsx(rax, ax)?,
            (2, false) => a.movzx(eax, ax)?,
            (_, true) => a.movsx(rax, al)?,
            (_, false) => a.movzx(eax, al)?,
        }
        Ok(())
    }

    /// rax = *(t *)rax, read with process_vm_readv on this process (a bad address fails the
    /// call instead of faulting); a failed read counts in the handler's counter and gives 0.
    fn read(&mut self, t: IntTy) -> R<()> {
        if self.h.kernel.is_some() {
            return self.read_kernel(t);
        }
        let n = i32::from(t.bytes);
        let a = &mut self.a;
        let mut ok = a.create_label();
        a.sub(rsp, 48)?;
        // [rsp] local iovec {buf, n}, [rsp+16] remote iovec {addr, n}, [rsp+32] the buffer.
        a.mov(qword_ptr(rsp + 16), rax)?;
        a.mov(qword_ptr(rsp + 24), n)?;
        a.lea(rcx, qword_ptr(rsp + 32))?;
        a.mov(qword_ptr(rsp), rcx)?;
        a.mov(qword_ptr(rsp + 8), n)?;
        a.mov(qword_ptr(rsp + 32), 0)?;
        a.mov(eax, SYS_GETPID)?;
        a.syscall()?;
        a.mov(rdi, rax)?;
        a.mov(rsi, rsp)?;
        a.mov(edx, 1)?;
        a.lea(r10, qword_ptr(rsp + 16))?;
        a.mov(r8d, 1)?;
        a.xor(r9d, r9d)?;
        a.mov(eax, SYS_PROCESS_VM_READV)?;
        a.syscall()?;
        a.cmp(rax, n)?;
        a.je(ok)?;
        a.lock().inc(qword_ptr(r13 + disp(self.h.failed)?))?;
        a.set_label(&mut ok)?;
        a.mov(rax, qword_ptr(rsp + 32))?;
        a.add(rsp, 48)?;
        self.extend(t)
    }

    fn builtin(&mut self, b: Builtin) -> R<()> {
        if let Some(k) = self.h.kernel {
            match b {
                // bpftrace's pid is the process (task->tgid), tid the thread (task->pid).
                Builtin::Pid | Builtin::Tid => {
                    let off = if b == Builtin::Pid { k.tgid } else { k.pid };
                    self.current(&k)?;
                    self.a.mov(eax, dword_ptr(rax + off))?;
                    return Ok(());
                }
                Builtin::Nsecs => return self.call_kernel(KTIME),
                Builtin::Cpu => return self.kernel_cpu(),
                _ => {}
            }
        }
        let a = &mut self.a;
        match b {
            Builtin::Pid => {
                a.mov(eax, SYS_GETPID)?;
                a.syscall()?;
            }
            Builtin::Tid => {
                a.mov(eax, SYS_GETTID)?;
                a.syscall()?;
            }
            Builtin::Cpu => {
                a.sub(rsp, 16)?;
                a.mov(rdi, rsp)?;
                a.xor(esi, esi)?;
                a.xor(edx, edx)?;
                a.mov(eax, SYS_GETCPU)?;
                a.syscall()?;
                a.mov(eax, dword_ptr(rsp))?;
                a.add(rsp, 16)?;
            }
            Builtin::Nsecs => {
                a.sub(rsp, 16)?;
                a.mov(edi, 1)?; // CLOCK_MONOTONIC
                a.mov(rsi, rsp)?;
                a.mov(eax, SYS_CLOCK_GETTIME)?;
                a.syscall()?;
                a.imul_3(rax, qword_ptr(rsp), 1_000_000_000)?;
                a.add(rax, qword_ptr(rsp + 8))?;
                a.add(rsp, 16)?;
            }
            Builtin::Retval => a.mov(rax, qword_ptr(rbx + reg_offset("rax").expect("rax")))?,
            Builtin::Arg(n) if self.h.ret => a.mov(rax, qword_ptr(r12 + i32::from(n) * 8))?,
            Builtin::Arg(n) => a.mov(rax, qword_ptr(rbx + arg_reg(n)))?,
            Builtin::Func => a.mov(rax, self.h.func)?,
            Builtin::Comm => unreachable!("checked: comm is bytes, pushed by bytes()"),
            Builtin::Probe => a.mov(rax, self.h.probe)?,
        }
        Ok(())
    }

    fn binary(&mut self, op: BinOp, x: &Expr, y: &Expr, signed: bool) -> R<()> {
        if matches!(op, BinOp::Eq | BinOp::Ne) {
            match (&x.kind, &y.kind) {
                (_, ExprKind::Str(s)) if matches!(ty_of(x, &self.h.body.vars), Ty::Bytes(_)) => {
                    return self.compare_bytes(op, x, s)
                }
                (ExprKind::Str(s), _) if matches!(ty_of(y, &self.h.body.vars), Ty::Bytes(_)) => {
                    return self.compare_bytes(op, y, s)
                }
                _ => {}
            }
        }
        if matches!(op, BinOp::LogAnd | BinOp::LogOr) {
            let mut short = self.a.create_label();
            let mut end = self.a.create_label();
            self.expr(x)?;
            self.a.test(rax, rax)?;
            if op == BinOp::LogAnd {
                self.a.jz(short)?;
            } else {
                self.a.jnz(short)?;
            }
            self.expr(y)?;
            self.a.test(rax, rax)?;
            self.a.setne(al)?;
            self.a.movzx(eax, al)?;
            self.a.jmp(end)?;
            self.a.set_label(&mut short)?;
            self.a.mov(eax, i32::from(op == BinOp::LogOr))?;
            self.a.set_label(&mut end)?;
            return Ok(());
        }
        // Comparisons use the signedness of their operands.
        let cmp_signed = operands_signed(x, y, &self.h.body.vars);
        self.expr(x)?;
        self.a.push(rax)?;
        self.expr(y)?;
        let a = &mut self.a;
        a.mov(rcx, rax)?;
        a.pop(rax)?;
        match op {
            BinOp::Add => a.add(rax, rcx)?,
            BinOp::Sub => a.sub(rax, rcx)?,
            BinOp::Mul => a.imul_2(rax, rcx)?,
            BinOp::And => a.and(rax, rcx)?,
            BinOp::Or => a.or(rax, rcx)?,
            BinOp::Xor => a.xor(rax, rcx)?,
            BinOp::Shl => a.shl(rax, cl)?,
            BinOp::Shr if signed => a.sar(rax, cl)?,
            BinOp::Shr => a.shr(rax, cl)?,
            BinOp::Div | BinOp::Mod => {
                // x / 0 is 0 (no #DE in the host); INT_MIN / -1 is done as a negation.
                let mut zero = a.create_label();
                let mut end = a.create_label();
                let mut divide = a.create_label();
                a.test(rcx, rcx)?;
                a.jz(zero)?;
                if signed {
                    a.cmp(rcx, -1)?;
                    a.jne(divide)?;
                    if op == BinOp::Div {
                        a.neg(rax)?;
                    } else {
                        a.xor(eax, eax)?;
                    }
                    a.jmp(end)?;
                    a.set_label(&mut divide)?;
                    a.cqo()?;
                    a.idiv(rcx)?;
                } else {
                    a.set_label(&mut divide)?;
                    a.xor(edx, edx)?;
                    a.div(rcx)?;
                }
                if op == BinOp::Mod {
                    a.mov(rax, rdx)?;
                }
                a.jmp(end)?;
                a.set_label(&mut zero)?;
                a.xor(eax, eax)?;
                a.set_label(&mut end)?;
            }
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                a.cmp(rax, rcx)?;
                match (op, cmp_signed) {
                    (BinOp::Eq, _) => a.sete(al)?,
                    (BinOp::Ne, _) => a.setne(al)?,
                    (BinOp::Lt, true) => a.setl(al)?,
                    (BinOp::Le, true) => a.setle(al)?,
                    (BinOp::Gt, true) => a.setg(al)?,
                    (BinOp::Ge, true) => a.setge(al)?,
                    (BinOp::Lt, false) => a.setb(al)?,
                    (BinOp::Le, false) => a.setbe(al)?,
                    (BinOp::Gt, false) => a.seta(al)?,
                    _ => a.setae(al)?,
                }
                a.movzx(eax, al)?;
            }
            BinOp::LogAnd | BinOp::LogOr => unreachable!("handled above"),
        }
        Ok(())
    }
}
