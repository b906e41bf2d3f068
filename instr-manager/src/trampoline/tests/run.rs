//! One call trampoline, executed: a tiny function is patched with a jmp rel32 to it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

static SEEN_RDI: AtomicU64 = AtomicU64::new(0);
static SEEN_COOKIE: AtomicU64 = AtomicU64::new(0);
static SEEN_RIP: AtomicU64 = AtomicU64::new(0);
static SEEN_RSP: AtomicU64 = AtomicU64::new(0);
static SEEN_RFLAGS: AtomicU64 = AtomicU64::new(0);
static SEEN_ENTRY_RSP: AtomicU64 = AtomicU64::new(0);

extern "C" fn handler(regs: *mut TrapvecRegs, cookie: u64) {
    // SAFETY: the trampoline passes a pointer to the register frame it built on its stack,
    // valid and exclusively ours for the duration of this call.
    let regs = unsafe { &mut *regs };
    SEEN_RDI.store(regs.rdi, Ordering::SeqCst);
    SEEN_COOKIE.store(cookie, Ordering::SeqCst);
    SEEN_RIP.store(regs.rip, Ordering::SeqCst);
    SEEN_RSP.store(regs.rsp, Ordering::SeqCst);
    SEEN_RFLAGS.store(regs.rflags, Ordering::SeqCst);
    let here = 0u8;
    SEEN_ENTRY_RSP.store(std::ptr::addr_of!(here) as u64, Ordering::SeqCst);
    regs.rdi += 10; // visible to the patched code
}

#[test]
fn call_trampoline_runs_handler_and_replays_displaced_code() {
    const PAGE: usize = 4096;
    // SAFETY: an anonymous private mapping; no existing memory is affected.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(mem, libc::MAP_FAILED);
    let base = mem as u64;
    let (func, tramp_addr, hits, inflight) = (
        base,
        base + 0x100,
        base + PAGE as u64,
        base + PAGE as u64 + 8,
    );
    // int f(int x) { return x + 1; }  as  mov eax, edi; add eax, 1; ret
    let code = [0x89, 0xF8, 0x83, 0xC0, 0x01, 0xC3];
    let plan = plan_for(&code[..5], func, 5);
    let t = CallTrampoline {
        addr: tramp_addr,
        site: func,
        handler: handler as extern "C" fn(*mut TrapvecRegs, u64) as usize as u64,
        cookie: 0x1234,
        hits,
        inflight,
    };
    let tbytes = emit_call_trampoline(&t, &plan, &info(true)).unwrap();
    let jmp = jmp_bytes(
        &Plan {
            mechanism: Mechanism::Jmp,
            ..plan.clone()
        },
        tramp_addr,
    )
    .unwrap();
    // SAFETY: all writes stay inside the first page of the mapping made above (the function
    // is 6 bytes at offset 0, the trampoline is under 0x200 bytes at 0x100); nothing else
    // refers to it yet.
    unsafe {
        let p = mem.cast::<u8>();
        std::ptr::copy_nonoverlapping(code.as_ptr(), p, code.len());
        std::ptr::copy_nonoverlapping(jmp.as_ptr(), p, jmp.len());
        std::ptr::copy_nonoverlapping(tbytes.as_ptr(), p.add(0x100), tbytes.len());
        assert_eq!(
            libc::mprotect(mem, PAGE, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
    }
    // SAFETY: the page now holds a complete function with the C ABI `int (int)`: a jmp to
    // the trampoline, which calls `handler`, replays `mov eax, edi; add eax, 1` and jumps
    // back to the `ret` at offset 5.
    let f: extern "C" fn(i32) -> i32 =
        unsafe { std::mem::transmute(usize::try_from(func).unwrap()) };
    assert_eq!(f(5), 16, "handler's rdi += 10 is seen by the replayed code");
    assert_eq!(f(-1), 10);
    assert_eq!(SEEN_RDI.load(Ordering::SeqCst) & 0xffff_ffff, 0xffff_ffff);
    assert_eq!(SEEN_COOKIE.load(Ordering::SeqCst), 0x1234);
    assert_eq!(SEEN_RIP.load(Ordering::SeqCst), func);
    // At the site, rsp points at the return address: 16-byte aligned + 8.
    assert_eq!(SEEN_RSP.load(Ordering::SeqCst) % 16, 8);
    assert_ne!(
        SEEN_RFLAGS.load(Ordering::SeqCst) & 0x2,
        0,
        "bit 1 of rflags is always set"
    );
    assert!(
        SEEN_ENTRY_RSP.load(Ordering::SeqCst) < SEEN_RSP.load(Ordering::SeqCst) - 128 - 144,
        "frame below the red zone"
    );
    // SAFETY: the counters are in the second, still writable page of the mapping.
    let (h, i) = unsafe { (*(hits as *const u64), *(inflight as *const u64)) };
    assert_eq!((h, i), (2, 0));
    // SAFETY: the mapping is ours and no longer used.
    unsafe { libc::munmap(mem, 2 * PAGE) };
}
