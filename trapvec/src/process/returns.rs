//! The return runtime of a process: return points and timers (see [`crate::returns`] for the
//! shape), in user space, with no allocation and no lock on the way in or out.
//!
//! Everything is static and shared by the whole process, as kretprobe's trampoline is shared by
//! the whole kernel:
//! - [`INSTANCES`] instances (`INST`), each with a 16-byte stub in this library's text
//!   (`trapvec_rp_stubs`: `nop; push $i; jmp trapvec_rp_common`). A hijacked return address is
//!   `stub + 1`; the common code saves every register and the whole extended state (the return
//!   value may be in `xmm0` or `st0`), calls [`rp_return`], restores, and `ret`s to the real
//!   return address. The stubs and instances are never freed, so a call that is still inside its
//!   function when its splice is removed returns through its stub safely: its slot's generation
//!   no longer matches, and it goes straight back.
//! - [`SLOTS`] slots, one per live return point: its handler, cookie, `maxactive`, clock and
//!   counters (lock-free atomics; the histogram's buckets too).
//! - Free instances are a Treiber stack with a generation tag against ABA, fed first from a bump
//!   counter (no set-up pass over the pool).
//! - Each thread keeps its instances in a list, newest first (a thread-local head, the links in
//!   the instances), and a `BUSY` flag: a return point reached while the thread is in the runtime
//!   (from a handler, or from a signal handler that interrupted the runtime) is counted as missed
//!   and left alone. Returning through an instance drops every newer instance of the thread
//!   first: those calls were left without returning (`longjmp`, an exception caught above them),
//!   and are counted as missed. An entry also drops the thread's instances whose frames lie at
//!   or below its stack pointer and no longer hold their stub's address (calls left by
//!   `longjmp` or an exception before the program called again), so a program that regularly
//!   leaves a function with a return point that way does not use up its pool. This assumes calls nest per thread,
//!   which holds for everything (signal handlers included, on any stack) but code that switches
//!   stacks inside a thread (`swapcontext`, coroutines) while one of its calls has a return
//!   point pending: that is not supported (as with uretprobes). Instances of a thread that exits
//!   inside a function with a return point stay in use (`active`) for the process's life.
//!
//! Unwinding: an exception thrown through a call with a hijacked return address must still find
//! the caller. Each stub has an FDE, registered with libgcc's `__register_frame` when the
//! runtime starts, that says: the caller's stack pointer is the stub's, and the return address
//! is saved at the address of the instance's `ret` field (see `stub_eh_frame`). The unwinder therefore steps from the function
//! through the stub to the real caller, and the instance left behind is dropped later as above.
//! Without `__register_frame` in the process (no libgcc unwinder), return points still work but
//! an exception thrown through one terminates the program; the runtime logs it when it starts.

use std::arch::global_asm;
use std::cell::Cell;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Mutex, Once};

use crate::abi::{TrapvecCall, TrapvecRegs};
use crate::error::TargetError;
use crate::returns::{
    bucket_of, Clock, Histogram, ReturnConfig, ReturnSlot, ReturnStats, HISTOGRAM_BUCKETS,
};

/// Instances in the whole process: calls with a pending return, in all threads and splices.
pub const INSTANCES: usize = 4096;
/// Return points live at once in the process.
pub const SLOTS: usize = 256;
/// Bytes per stub.
const STUB_SIZE: u64 = 16;

/// Slot states: free for a new return point; in use; given back but a thread may still be in
/// its handler.
const SLOT_FREE: u32 = 0;
const SLOT_LIVE: u32 = 1;
const SLOT_DRAINING: u32 = 2;
/// How long giving a slot back waits for threads to leave its handler.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

const FREE: u32 = 0;
const LIVE: u32 = 1;
/// Returned through by a thread that does not own it (its stack was switched between threads):
/// left on its owner's list, which drops it without counting it.
const ORPHAN: u32 = 2;

/// One call in progress.
#[repr(C)]
struct Instance {
    /// The real return address. The stub's FDE names this field's address as where the return
    /// address is saved, so keep it first and never move it.
    ret: AtomicU64,
    /// The stack pointer at the entry (where the return address was).
    sp: AtomicU64,
    /// The thread (its TCB address, `%fs:0`).
    thread: AtomicU64,
    args: [AtomicU64; 6],
    /// The clock at the entry (timers).
    t0: AtomicU64,
    /// The slot and its generation at the entry.
    slot: AtomicU32,
    gen: AtomicU32,
    state: AtomicU32,
    /// The thread's next older instance + 1 (0: none); written only by the owning thread.
    older: AtomicU32,
    /// The next free instance + 1 while on the free stack.
    free_next: AtomicU32,
}

impl Instance {
    const fn new() -> Self {
        Instance {
            ret: AtomicU64::new(0),
            sp: AtomicU64::new(0),
            thread: AtomicU64::new(0),
            args: [const { AtomicU64::new(0) }; 6],
            t0: AtomicU64::new(0),
            slot: AtomicU32::new(0),
            gen: AtomicU32::new(0),
            state: AtomicU32::new(FREE),
            older: AtomicU32::new(0),
            free_next: AtomicU32::new(0),
        }
    }
}

/// One return point.
struct Slot {
    /// [`SLOT_FREE`], [`SLOT_LIVE`] or [`SLOT_DRAINING`].
    state: AtomicU32,
    /// Threads in the return half of this slot right now (counted before the state is read).
    in_return: AtomicU32,
    /// Bumped when the slot is taken and when it is freed: instances of an older generation
    /// belong to a return point that is gone.
    gen: AtomicU32,
    maxactive: AtomicU32,
    active: AtomicU32,
    /// 0: no timer, 1: wall, 2: cpu.
    clock: AtomicU32,
    handler: AtomicU64,
    cookie: AtomicU64,
    returns: AtomicU64,
    missed: AtomicU64,
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    sum: AtomicU64,
    max: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            state: AtomicU32::new(SLOT_FREE),
            in_return: AtomicU32::new(0),
            gen: AtomicU32::new(0),
            maxactive: AtomicU32::new(0),
            active: AtomicU32::new(0),
            clock: AtomicU32::new(0),
            handler: AtomicU64::new(0),
            cookie: AtomicU64::new(0),
            returns: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            buckets: [const { AtomicU64::new(0) }; HISTOGRAM_BUCKETS],
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

static INST: [Instance; INSTANCES] = [const { Instance::new() }; INSTANCES];
static SLOT: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
/// Top of the free stack: `(tag << 32) | (index + 1)`.
static FREE_TOP: AtomicU64 = AtomicU64::new(0);
/// Instances never used yet: `INST[FRESH..]`.
static FRESH: AtomicU32 = AtomicU32::new(0);
/// Slot changes (not the hot path).
static SLOTS_LOCK: Mutex<()> = Mutex::new(());
static START: Once = Once::new();
/// Whether the stubs' unwind table is registered (see `start`).
static REGISTERED: AtomicBool = AtomicBool::new(false);
/// Bytes of the XSAVE area the common return code uses (0: `fxsave64`), read by the assembly.
static XSAVE_SIZE: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The thread's newest instance + 1.
    static NEWEST: Cell<u32> = const { Cell::new(0) };
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

// The stubs and the common return code. Reached by `ret` from the spliced function, with the
// stack pointer where the caller expects it after the return: the caller's red zone is dead
// there (its call wrote the return address into it), so the code may push.
//
// Frame built for rp_return (offsets from %rbx): 0..119 r15..rax, 120 rsp, 128 rip, 136 rflags,
// 144 the instance index (pushed by the stub, then overwritten with the real return address for
// the final `ret`); the caller's stack pointer is %rbx + 152.
global_asm!(
    ".pushsection .text.trapvec_returns,\"ax\",@progbits",
    ".balign 16",
    ".globl trapvec_rp_stubs",
    ".hidden trapvec_rp_stubs",
    "trapvec_rp_stubs:",
    ".set trapvec_rp_i, 0",
    ".rept {n}",
    "nop",
    "pushq $trapvec_rp_i",
    "jmp trapvec_rp_common",
    ".balign 16, 0xcc",
    ".set trapvec_rp_i, trapvec_rp_i + 1",
    ".endr",
    ".globl trapvec_rp_stubs_end",
    ".hidden trapvec_rp_stubs_end",
    "trapvec_rp_stubs_end:",
    "trapvec_rp_common:",
    "pushfq",
    "leaq -16(%rsp), %rsp",
    "pushq %rax", "pushq %rcx", "pushq %rdx", "pushq %rbx", "pushq %rbp", "pushq %rsi", "pushq %rdi",
    "pushq %r8", "pushq %r9", "pushq %r10", "pushq %r11", "pushq %r12", "pushq %r13", "pushq %r14", "pushq %r15",
    "leaq 152(%rsp), %rax",
    "movq %rax, 120(%rsp)",
    "movq $0, 128(%rsp)",
    "movq %rsp, %rbx",
    "andq $-64, %rsp",
    "movl {xsave}(%rip), %eax",
    "testl %eax, %eax",
    "jz 1f",
    "subq %rax, %rsp",
    "andq $-64, %rsp",
    "xorl %eax, %eax",
    "movq %rax, 512(%rsp)", "movq %rax, 520(%rsp)", "movq %rax, 528(%rsp)", "movq %rax, 536(%rsp)",
    "movq %rax, 544(%rsp)", "movq %rax, 552(%rsp)", "movq %rax, 560(%rsp)", "movq %rax, 568(%rsp)",
    "movl $-1, %eax",
    "movl $-1, %edx",
    "xsave64 (%rsp)",
    "jmp 2f",
    "1:",
    "subq $512, %rsp",
    "fxsave64 (%rsp)",
    "2:",
    "cld",
    "movq %rbx, %rdi",
    "movq 144(%rbx), %rsi",
    "call {ret}",
    "movq %rax, 144(%rbx)",
    "movl {xsave}(%rip), %eax",
    "testl %eax, %eax",
    "jz 3f",
    "movl $-1, %eax",
    "movl $-1, %edx",
    "xrstor64 (%rsp)",
    "jmp 4f",
    "3:",
    "fxrstor64 (%rsp)",
    "4:",
    "movq %rbx, %rsp",
    "popq %r15", "popq %r14", "popq %r13", "popq %r12", "popq %r11", "popq %r10", "popq %r9", "popq %r8",
    "popq %rdi", "popq %rsi", "popq %rbp", "popq %rbx", "popq %rdx", "popq %rcx", "popq %rax",
    "leaq 16(%rsp), %rsp",
    "popfq",
    "ret",
    "int3",
    ".popsection",
    n = const INSTANCES,
    xsave = sym XSAVE_SIZE,
    ret = sym rp_return,
    options(att_syntax)
);

extern "C" {
    static trapvec_rp_stubs: u8;
    static trapvec_rp_stubs_end: u8;
}

fn stubs() -> u64 {
    std::ptr::addr_of!(trapvec_rp_stubs) as u64
}

/// The calling thread's TCB address, its identity for the instances.
#[inline(always)]
fn thread_key() -> u64 {
    let t: u64;
    // SAFETY: on x86-64 Linux %fs:0 holds the thread control block's own address (glibc, musl).
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) t, options(nostack, readonly, preserves_flags))
    };
    t
}

fn now(clock: u32) -> u64 {
    let id = if clock == 2 {
        libc::CLOCK_THREAD_CPUTIME_ID
    } else {
        libc::CLOCK_MONOTONIC
    };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe and writes only ts.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

fn take_instance() -> Option<usize> {
    let mut top = FREE_TOP.load(Acquire);
    loop {
        let i = (top & 0xffff_ffff) as u32;
        if i == 0 {
            break;
        }
        let next = u64::from(INST[i as usize - 1].free_next.load(Relaxed));
        let new = ((top >> 32).wrapping_add(1) << 32) | next;
        match FREE_TOP.compare_exchange_weak(top, new, Acquire, Acquire) {
            Ok(_) => return Some(i as usize - 1),
            Err(t) => top = t,
        }
    }
    let i = FRESH.fetch_add(1, Relaxed) as usize;
    if i < INSTANCES {
        Some(i)
    } else {
        FRESH.store(INSTANCES as u32, Relaxed);
        None
    }
}

fn give_instance(i: usize) {
    INST[i].state.store(FREE, Relaxed);
    let mut top = FREE_TOP.load(Relaxed);
    loop {
        INST[i].free_next.store((top & 0xffff_ffff) as u32, Relaxed);
        let new = ((top >> 32).wrapping_add(1) << 32) | (i as u64 + 1);
        match FREE_TOP.compare_exchange_weak(top, new, Release, Relaxed) {
            Ok(_) => return,
            Err(t) => top = t,
        }
    }
}

/// The slot of instance `i` if its return point is still the one that took it.
fn slot_of(i: usize) -> Option<&'static Slot> {
    let inst = &INST[i];
    let slot = SLOT.get(inst.slot.load(Relaxed) as usize)?;
    (slot.state.load(SeqCst) == SLOT_LIVE && slot.gen.load(SeqCst) == inst.gen.load(Relaxed))
        .then_some(slot)
}

/// The entry half, a call handler: `cookie` is `(generation << 32) | slot`.
extern "C" fn rp_entry(regs: *mut TrapvecRegs, cookie: u64) {
    let (si, gen) = ((cookie & 0xffff_ffff) as usize, (cookie >> 32) as u32);
    let Some(slot) = SLOT.get(si) else { return };
    if BUSY.get() {
        slot.missed.fetch_add(1, Relaxed);
        return;
    }
    BUSY.set(true);
    // SAFETY: the call trampoline hands a valid frame of the interrupted thread's registers.
    let r = unsafe { &mut *regs };
    // Calls of this thread that are over give their instances back first (they may be what
    // holds the pool or `maxactive` full).
    drop_dead_above(r.rsp);
    let max = slot.maxactive.load(Relaxed);
    if slot.active.fetch_add(1, Relaxed) >= max {
        slot.active.fetch_sub(1, Relaxed);
        slot.missed.fetch_add(1, Relaxed);
        BUSY.set(false);
        return;
    }
    let Some(i) = take_instance() else {
        slot.active.fetch_sub(1, Relaxed);
        slot.missed.fetch_add(1, Relaxed);
        BUSY.set(false);
        return;
    };
    let inst = &INST[i];
    let ra = r.rsp as *mut u64;
    // SAFETY: the point is the function's entry (the splicer refuses any other), so rsp is where
    // the call left the return address, on the thread's own stack.
    let ret = unsafe { ra.read() };
    inst.ret.store(ret, Relaxed);
    inst.sp.store(r.rsp, Relaxed);
    inst.thread.store(thread_key(), Relaxed);
    for (a, v) in inst
        .args
        .iter()
        .zip([r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9])
    {
        a.store(v, Relaxed);
    }
    let clock = slot.clock.load(Relaxed);
    inst.t0
        .store(if clock != 0 { now(clock) } else { 0 }, Relaxed);
    inst.slot.store(si as u32, Relaxed);
    inst.gen.store(gen, Relaxed);
    inst.state.store(LIVE, Relaxed);
    inst.older.store(NEWEST.get(), Relaxed);
    NEWEST.set(i as u32 + 1);
    // SAFETY: as above; from here the function returns into the instance's stub.
    unsafe { ra.write(stubs() + i as u64 * STUB_SIZE + 1) };
    BUSY.set(false);
}

/// At an entry with stack pointer `sp`: drop the thread's instances whose calls are over.
/// A call in progress still holds its stub's address in its return-address slot (nothing but
/// the call itself owns that word), so an instance whose slot holds anything else is over:
/// its function was left by `longjmp` or an exception and the stack was used again. Only
/// instances at or below `sp` are looked at: on one stack they are the newest (calls in
/// progress lie above the new one), so nesting calls pay one compare; an instance on another
/// stack (a signal handler's alternate stack) is looked at and kept if it is in progress.
fn drop_dead_above(sp: u64) {
    let mut prev: Option<usize> = None;
    let mut cur = NEWEST.get();
    while cur != 0 {
        let n = cur as usize - 1;
        let older = INST[n].older.load(Relaxed);
        let at = INST[n].sp.load(Relaxed);
        if at > sp {
            return;
        }
        if read_word(at) == Some(stubs() + n as u64 * STUB_SIZE + 1) {
            prev = Some(n);
        } else {
            match prev {
                None => NEWEST.set(older),
                Some(p) => INST[p].older.store(older, Relaxed),
            }
            drop_left(n);
        }
        cur = older;
    }
}

/// A word of this process's memory that may be unmapped (a stack that is gone), without faulting.
fn read_word(addr: u64) -> Option<u64> {
    let mut v = 0u64;
    let local = libc::iovec {
        iov_base: std::ptr::addr_of_mut!(v).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: reads 8 bytes of our own address space into v through the kernel, which reports an
    // unmapped address as an error instead of a fault; async-signal-safe (a system call).
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == 8).then_some(v)
}

/// Drop instance `i`, left without returning: counted as missed unless it was returned through
/// by another thread (an orphan).
fn drop_left(i: usize) {
    if INST[i].state.load(Relaxed) == LIVE {
        if let Some(slot) = slot_of(i) {
            slot.missed.fetch_add(1, Relaxed);
            slot.active.fetch_sub(1, Relaxed);
        }
    }
    give_instance(i);
}

/// The return half, called by the common return code with the registers at the return and the
/// instance's index; returns the real return address.
extern "C" fn rp_return(regs: *mut TrapvecRegs, index: u64) -> u64 {
    let i = index as usize;
    let inst = &INST[i];
    let ret = inst.ret.load(Relaxed);
    // SAFETY: the common return code hands its frame of the thread's registers.
    let r = unsafe { &mut *regs };
    r.rip = ret;
    let mine = inst.thread.load(Relaxed) == thread_key();
    if !mine || BUSY.get() {
        // Not on this thread's list (or the list is being changed under us): the owner's list
        // drops it; still run what the return point asks for.
        // (A return during this thread's own list surgery cannot happen, see the module docs;
        // it would be left as an orphan too rather than touch the list now.)
        run_return(i, r, ret);
        inst.state.store(ORPHAN, Relaxed);
        return ret;
    }
    BUSY.set(true);
    // Newer instances of this thread were left without returning.
    loop {
        let newest = NEWEST.get();
        if newest == 0 {
            break;
        }
        let n = newest as usize - 1;
        NEWEST.set(INST[n].older.load(Relaxed));
        if n == i {
            break;
        }
        drop_left(n);
    }
    run_return(i, r, ret);
    give_instance(i);
    BUSY.set(false);
    ret
}

/// Count the return, time it, run the handler (with `BUSY` set when called from the list path).
fn run_return(i: usize, r: &mut TrapvecRegs, ret: u64) {
    let inst = &INST[i];
    if inst.state.load(Relaxed) != LIVE {
        return;
    }
    let Some(any) = SLOT.get(inst.slot.load(Relaxed) as usize) else {
        return;
    };
    // Counted before the slot's state is read: giving the slot back waits for this count to
    // drop, so the handler's component is never unloaded under a thread that runs it.
    any.in_return.fetch_add(1, SeqCst);
    if let Some(slot) = slot_of(i) {
        run_live(slot, inst, r, ret);
    }
    any.in_return.fetch_sub(1, Release);
}

fn run_live(slot: &Slot, inst: &Instance, r: &mut TrapvecRegs, ret: u64) {
    let clock = slot.clock.load(Relaxed);
    let elapsed = if clock != 0 {
        now(clock).saturating_sub(inst.t0.load(Relaxed))
    } else {
        0
    };
    if clock != 0 {
        slot.buckets[bucket_of(elapsed)].fetch_add(1, Relaxed);
        slot.sum.fetch_add(elapsed, Relaxed);
        slot.max.fetch_max(elapsed, Relaxed);
    }
    let handler = slot.handler.load(Relaxed);
    if handler != 0 {
        let mut call = TrapvecCall {
            args: std::array::from_fn(|k| inst.args[k].load(Relaxed)),
            cookie: slot.cookie.load(Relaxed),
            sp: inst.sp.load(Relaxed),
            ret,
            elapsed_ns: elapsed,
        };
        // SAFETY: the handler is a component function with this signature (the splicer resolved
        // it), kept loaded while its splice lives; the slot is live, so the splice is.
        let h: extern "C" fn(*mut TrapvecRegs, *mut TrapvecCall) =
            unsafe { std::mem::transmute(handler) };
        h(r, &mut call);
    }
    slot.returns.fetch_add(1, Relaxed);
    slot.active.fetch_sub(1, Relaxed);
}

/// The unwind table of the stubs: one CIE and an FDE per stub saying that the return address is
/// saved in its instance's `ret` field (`DW_CFA_expression` with `DW_OP_addr`); absolute
/// pointers (`zR`, `DW_EH_PE_absptr`); a zero terminator.
///
/// The stub's frame takes no stack: the caller's stack pointer is the stub's. The CFA is made
/// `rsp + 1` and the caller's `rsp` given back as `CFA - 1` (`DW_CFA_val_expression`), because
/// libgcc tells frames apart by their CFA: with `rsp + 0` the stub's CFA would equal the spliced
/// function's, and an exception caught by the caller would find its handler frame twice and
/// abort. No real frame has an odd CFA.
fn stub_eh_frame(stubs: u64, inst: impl Fn(usize) -> u64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + n * 48);
    // CIE: id 0, version 1, "zR", code align 1, data align -8, return address column 16,
    // augmentation data: the FDE pointer encoding (absptr); DW_CFA_def_cfa rsp, 1;
    // DW_CFA_val_expression rsp, 2 bytes: DW_OP_lit1 DW_OP_minus (the CFA is pushed first).
    let cie: &[u8] = &[
        0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x00, 0x0c, 7, 1, 0x16, 7, 2, 0x31, 0x1c,
    ];
    let mut cie_body = cie.to_vec();
    while !(cie_body.len() + 4).is_multiple_of(8) {
        cie_body.push(0); // DW_CFA_nop
    }
    out.extend((cie_body.len() as u32).to_le_bytes());
    out.extend(&cie_body);
    for k in 0..n {
        let at = out.len();
        let mut body = Vec::with_capacity(44);
        // The CIE pointer: from this field back to the CIE's start.
        body.extend(((at + 4) as u32).to_le_bytes());
        body.extend((stubs + k as u64 * STUB_SIZE).to_le_bytes());
        body.extend(STUB_SIZE.to_le_bytes());
        body.push(0); // augmentation data length
                      // DW_CFA_expression r16 (the return address), 9 bytes: DW_OP_addr <&INST[k].ret>.
        body.extend([0x10, 16, 9, 0x03]);
        body.extend(inst(k).to_le_bytes());
        while !(body.len() + 4).is_multiple_of(8) {
            body.push(0);
        }
        out.extend((body.len() as u32).to_le_bytes());
        out.extend(body);
    }
    out.extend([0, 0, 0, 0]);
    out
}

/// Once per process: the XSAVE area's size. Then, until it succeeds, the stubs' unwind table
/// registered with the unwinder (kept for the process's life): libgcc may be loaded only later
/// (a C program loads it with its first C++ library), so every new return point tries again.
fn start() {
    START.call_once(|| {
        let leaf1 = std::arch::x86_64::__cpuid(1);
        let osxsave = leaf1.ecx & (1 << 27) != 0;
        if osxsave {
            let d = std::arch::x86_64::__cpuid_count(0xd, 0);
            XSAVE_SIZE.store(d.ebx.max(576), Relaxed);
        }
    });
    if REGISTERED.load(Acquire) {
        return;
    }
    let _l = SLOTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if REGISTERED.load(Acquire) {
        return;
    }
    // SAFETY: looking up a symbol by name.
    let reg = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__register_frame".as_ptr()) };
    if reg.is_null() {
        log::warn!("return points: no __register_frame in this process (yet): an exception thrown through a call with a pending return point would not find its handler");
        return;
    }
    let table = stub_eh_frame(
        stubs(),
        |k| std::ptr::addr_of!(INST[k].ret) as u64,
        INSTANCES,
    )
    .leak();
    // SAFETY: libgcc's `void __register_frame(void *begin)`, given a complete .eh_frame image
    // (terminated) that stays alive for the process's life (leaked above).
    let f: extern "C" fn(*const u8) = unsafe { std::mem::transmute(reg) };
    f(table.as_ptr());
    REGISTERED.store(true, Release);
    log::debug!(
        "return points: {INSTANCES} stubs at {:#x} registered with the unwinder",
        stubs()
    );
}

/// Take a slot for a new return point.
pub(crate) fn alloc_slot(cfg: &ReturnConfig) -> Result<ReturnSlot, TargetError> {
    start();
    if cfg.maxactive == 0 || cfg.maxactive as usize > INSTANCES {
        return Err(TargetError::Other(format!(
            "maxactive {} is outside 1..={INSTANCES}",
            cfg.maxactive
        )));
    }
    let _l = SLOTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(si) = SLOT.iter().position(|s| s.state.load(Relaxed) == SLOT_FREE) else {
        return Err(TargetError::Other(format!(
            "all {SLOTS} return-point slots of the process are in use"
        )));
    };
    let s = &SLOT[si];
    let gen = s.gen.load(Relaxed).wrapping_add(1);
    s.gen.store(gen, Relaxed);
    s.maxactive.store(cfg.maxactive, Relaxed);
    s.active.store(0, Relaxed);
    s.clock.store(
        match cfg.clock {
            None => 0,
            Some(Clock::Wall) => 1,
            Some(Clock::Cpu) => 2,
        },
        Relaxed,
    );
    s.handler.store(cfg.handler, Relaxed);
    s.cookie.store(cfg.cookie, Relaxed);
    s.returns.store(0, Relaxed);
    s.missed.store(0, Relaxed);
    for b in &s.buckets {
        b.store(0, Relaxed);
    }
    s.sum.store(0, Relaxed);
    s.max.store(0, Relaxed);
    s.in_return.store(0, Relaxed);
    s.state.store(SLOT_LIVE, SeqCst);
    log::debug!(
        "return point slot {si} (generation {gen}) taken: handler {:#x}, maxactive {}",
        cfg.handler,
        cfg.maxactive
    );
    Ok(ReturnSlot {
        index: si as u32,
        entry: rp_entry as *const () as u64,
        cookie: (u64::from(gen) << 32) | si as u64,
    })
}

/// Give a slot back once its entry half can no longer run (its splice's text is restored and
/// no thread is in its trampoline), and wait until no thread runs its handler. Calls still
/// inside the function return through their stubs and find the generation changed. A thread
/// that stays in the handler longer than [`DRAIN_TIMEOUT`] makes it fail, the slot left
/// draining: calling it again waits again.
pub(crate) fn free_slot(slot: &ReturnSlot) -> Result<(), TargetError> {
    let Some(s) = SLOT.get(slot.index as usize) else {
        return Ok(());
    };
    let gen = (slot.cookie >> 32) as u32;
    {
        let _l = SLOTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        match s.state.load(SeqCst) {
            SLOT_LIVE if s.gen.load(SeqCst) == gen => {
                s.gen.store(gen.wrapping_add(1), SeqCst);
                s.state.store(SLOT_DRAINING, SeqCst);
            }
            SLOT_DRAINING if s.gen.load(SeqCst) == gen.wrapping_add(1) => {}
            _ => return Ok(()),
        }
    }
    let start = std::time::Instant::now();
    while s.in_return.load(SeqCst) != 0 {
        if start.elapsed() > DRAIN_TIMEOUT {
            return Err(TargetError::Quiesce(format!(
                "a thread is still in the return handler of return-point slot {} after {DRAIN_TIMEOUT:?}",
                slot.index
            )));
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    let _l = SLOTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    s.state.store(SLOT_FREE, SeqCst);
    Ok(())
}

/// The figures of a live slot.
pub(crate) fn stats(slot: &ReturnSlot) -> Option<ReturnStats> {
    let s = SLOT.get(slot.index as usize)?;
    if s.state.load(Acquire) != SLOT_LIVE || s.gen.load(Acquire) != (slot.cookie >> 32) as u32 {
        return None;
    }
    let histogram = (s.clock.load(Relaxed) != 0).then(|| Histogram {
        buckets: s.buckets.iter().map(|b| b.load(Relaxed)).collect(),
        sum: s.sum.load(Relaxed),
        max: s.max.load(Relaxed),
    });
    Some(ReturnStats {
        returns: s.returns.load(Relaxed),
        missed: s.missed.load(Relaxed),
        active: u64::from(s.active.load(Relaxed)),
        histogram,
    })
}

/// The code range of the stubs and the common return code (threads may be in it at any time;
/// it is never freed).
pub fn runtime_text() -> (u64, u64) {
    (stubs(), std::ptr::addr_of!(trapvec_rp_stubs_end) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_are_sixteen_bytes_apart_and_push_their_index() {
        let (lo, hi) = runtime_text();
        assert_eq!(hi - lo, INSTANCES as u64 * STUB_SIZE);
        for k in [0usize, 1, 127, 128, 4095] {
            // SAFETY: reading our own text.
            let b =
                unsafe { std::slice::from_raw_parts((lo + k as u64 * STUB_SIZE) as *const u8, 8) };
            assert_eq!(b[0], 0x90, "stub {k}");
            let pushed = match b[1] {
                0x6a => u64::from(b[2]),
                0x68 => u64::from(u32::from_le_bytes(b[2..6].try_into().unwrap())),
                other => panic!("stub {k}: push opcode {other:#x}"),
            };
            assert_eq!(pushed, k as u64);
        }
    }

    #[test]
    fn the_unwind_table_has_one_fde_per_stub_pointing_at_its_instance() {
        let t = stub_eh_frame(0x1000, |k| 0x9000 + 0x60 * k as u64, 3);
        let cie_len = u32::from_le_bytes(t[0..4].try_into().unwrap()) as usize;
        assert_eq!((cie_len + 4) % 8, 0);
        let mut at = 4 + cie_len;
        for k in 0..3u64 {
            let len = u32::from_le_bytes(t[at..at + 4].try_into().unwrap()) as usize;
            let cie_ptr = u32::from_le_bytes(t[at + 4..at + 8].try_into().unwrap()) as usize;
            assert_eq!(at + 4 - cie_ptr, 0, "points back at the CIE");
            let begin = u64::from_le_bytes(t[at + 8..at + 16].try_into().unwrap());
            assert_eq!(begin, 0x1000 + 16 * k);
            assert_eq!(&t[at + 25..at + 29], &[0x10, 16, 9, 0x03]);
            assert_eq!(
                u64::from_le_bytes(t[at + 29..at + 37].try_into().unwrap()),
                0x9000 + 0x60 * k
            );
            at += 4 + len;
        }
        assert_eq!(&t[at..], &[0, 0, 0, 0]);
    }
}
