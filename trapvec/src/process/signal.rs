//! Signal handlers of the process backend. Everything here runs in signal context: no locks, no
//! allocation, no logging, only atomics and reads of [`EpochCell`] values.
//!
//! - **SIGSEGV** (the trap): a user-mode `int 0xF5` hits a DPL-0 gate and raises #GP, delivered with
//!   `si_code == SI_KERNEL`, `trapno == 13`, error code `0x7AA` and `RIP` at the `CD F5`. If the
//!   site is in the dispatch table, RIP becomes its destination. If it is not, but the bytes there
//!   are no longer `CD F5`, the splice was removed under our feet: return with RIP unchanged, and
//!   the original instruction runs. Anything else goes to the handler installed before ours.
//! - **SIGTRAP** (the int3-first protocol): a thread that meets the transient `CC` of a text write
//!   in progress is sent back to retry (RIP = address of the `CC`), until the write completes.
//! - **Scan signal** (`SIGRTMAX - 1`, queued with a generation number): reports whether the
//!   interrupted RIP lies in the ranges being scanned, for quiescence and window checks.
//!   It is blocked while the SIGSEGV handler runs, so a thread that was just redirected is scanned
//!   only once its RIP already holds the destination.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::OnceLock;

use crate::abi::{TRAP_BYTES, USER_TRAP_ERROR_CODE};
use crate::error::TargetError;
use crate::process::epoch::EpochCell;

/// Sorted sites and their destinations.
#[derive(Clone, Default)]
pub(crate) struct DispatchTable {
    pub sites: Vec<u64>,
    pub dests: Vec<u64>,
}

impl DispatchTable {
    fn lookup(&self, site: u64) -> Option<u64> {
        self.sites.binary_search(&site).ok().map(|i| self.dests[i])
    }
}

pub(crate) static DISPATCH: EpochCell<DispatchTable> = EpochCell::new();
/// Addresses where a transient `CC` may currently be written (sorted).
pub(crate) static TRANSIENT: EpochCell<Vec<u64>> = EpochCell::new();
/// Ranges `[start, end)` (sorted, disjoint) examined by the current scan.
pub(crate) static SCAN_RANGES: EpochCell<Vec<(u64, u64)>> = EpochCell::new();
pub(crate) static SCAN_GEN: AtomicU64 = AtomicU64::new(0);
pub(crate) static SCAN_ACKS: AtomicUsize = AtomicUsize::new(0);
pub(crate) static SCAN_HIT: AtomicBool = AtomicBool::new(false);
pub(crate) static SCAN_HIT_RIP: AtomicU64 = AtomicU64::new(0);

/// Traps that reached the SIGSEGV handler and were redirected (all sites).
pub(crate) static TRAPS_REDIRECTED: AtomicU64 = AtomicU64::new(0);
/// Traps whose site had been removed and were sent back to run the original.
pub(crate) static TRAPS_RETRIED: AtomicU64 = AtomicU64::new(0);

struct OldActions {
    segv: libc::sigaction,
    trap: libc::sigaction,
}

// SAFETY: `sigaction` is plain data (function pointers and a signal mask); it is written once
// before publication through `OnceLock` and only read afterwards.
unsafe impl Send for OldActions {}
// SAFETY: as above, immutable after publication.
unsafe impl Sync for OldActions {}

type SigActionFn = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

static OLD: OnceLock<OldActions> = OnceLock::new();
static INSTALL: OnceLock<Result<(), String>> = OnceLock::new();

/// The real-time signal used to scan threads.
pub(crate) fn scan_signal() -> libc::c_int {
    libc::SIGRTMAX() - 1
}

/// Install the three handlers once per process.
pub(crate) fn install() -> Result<(), TargetError> {
    INSTALL
        .get_or_init(|| {
            // SAFETY: each call passes valid pointers to initialised `sigaction` structs; the
            // handlers installed are `extern "C"` functions with the SA_SIGINFO signature.
            unsafe {
                let segv = set_handler(libc::SIGSEGV, on_segv as SigActionFn as usize, &[scan_signal()])?;
                let trap = set_handler(libc::SIGTRAP, on_trap as SigActionFn as usize, &[scan_signal()])?;
                let _ = OLD.set(OldActions { segv, trap });
                set_handler(scan_signal(), on_scan as SigActionFn as usize, &[])?;
            }
            Ok(())
        })
        .clone()
        .map_err(TargetError::Other)
}

/// # Safety
/// `handler` must be the address of an `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)`.
unsafe fn set_handler(sig: libc::c_int, handler: usize, block: &[libc::c_int]) -> Result<libc::sigaction, String> {
    // SAFETY: zeroed `sigaction` is a valid starting value (empty mask, no flags).
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = handler;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART | libc::SA_NODEFER;
    // SAFETY: `sa.sa_mask` is a valid sigset_t owned by us.
    unsafe { libc::sigemptyset(&mut sa.sa_mask) };
    for &b in block {
        // SAFETY: as above.
        unsafe { libc::sigaddset(&mut sa.sa_mask, b) };
    }
    // SAFETY: zeroed is a valid out-parameter.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call.
    if unsafe { libc::sigaction(sig, &sa, &mut old) } != 0 {
        return Err(format!("sigaction({sig}): {}", std::io::Error::last_os_error()));
    }
    Ok(old)
}

/// # Safety
/// `ctx` must be the `ucontext_t` the kernel passed to a handler.
unsafe fn greg(ctx: *mut libc::c_void, reg: libc::c_int) -> *mut i64 {
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: the caller guarantees `uc` is the live context; REG_* indexes are in bounds.
    unsafe { &mut (*uc).uc_mcontext.gregs[reg as usize] as *mut i64 }
}

/// # Safety
/// `addr` must be readable (it is the RIP of an instruction that just trapped).
unsafe fn bytes_are(addr: u64, expect: &[u8]) -> bool {
    expect.iter().enumerate().all(|(i, &b)| {
        // SAFETY: the caller guarantees readability; volatile because another thread may be
        // rewriting it right now.
        unsafe { std::ptr::read_volatile((addr as *const u8).add(i)) == b }
    })
}

/// The #GP error code of a user-mode `int 0xF5`: the IDT index with the IDT bit, `0x7AA`.
/// QEMU's TCG reports `0xF52` (the vector shifted by 4) for the same fault; both are accepted,
/// since the dispatch table (or the bytes at RIP) decide whether the trap is ours anyway.
fn is_trap_error_code(err: u64) -> bool {
    err == USER_TRAP_ERROR_CODE || err == ((USER_TRAP_ERROR_CODE >> 3) << 4) | 2
}

extern "C" fn on_segv(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes valid `info` and `ctx` pointers to an SA_SIGINFO handler; we read
    // the saved registers one field at a time.
    unsafe {
        let code = (*info).si_code;
        let trapno = *greg(ctx, libc::REG_TRAPNO);
        let err = *greg(ctx, libc::REG_ERR);
        if code == 0x80 /* SI_KERNEL */ && trapno == 13 && is_trap_error_code(err as u64) {
            let rip = greg(ctx, libc::REG_RIP);
            let site = *rip as u64;
            if let Some(dest) = DISPATCH.read(|t| t.and_then(|t| t.lookup(site))) {
                *rip = dest as i64;
                TRAPS_REDIRECTED.fetch_add(1, SeqCst);
                return;
            }
            if !bytes_are(site, &TRAP_BYTES) {
                TRAPS_RETRIED.fetch_add(1, SeqCst);
                return;
            }
        }
        chain(sig, info, ctx, OLD.get().map(|o| &o.segv));
    }
}

extern "C" fn on_trap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in `on_segv`.
    unsafe {
        let rip = greg(ctx, libc::REG_RIP);
        let at = (*rip as u64).wrapping_sub(1);
        // Ours if a text write is in progress there, or if the CC is already gone again (the
        // write completed between the int3 and this handler).
        let ours = TRANSIENT.read(|t| t.is_some_and(|t| t.binary_search(&at).is_ok())) || !bytes_are(at, &[crate::abi::INT3]);
        if ours {
            // Retry: either the CC is still there (we trap again) or the write completed.
            *rip = at as i64;
            return;
        }
        report(b"trapvec: int3 at ", at, b" is not trapvec's; passing SIGTRAP on\n");
        chain(sig, info, ctx, OLD.get().map(|o| &o.trap));
    }
}

/// Write `prefix`, `addr` in hex and `suffix` to stderr with one async-signal-safe `write`.
fn report(prefix: &[u8], addr: u64, suffix: &[u8]) {
    let mut buf = [0u8; 128];
    let mut n = 0;
    for &b in prefix.iter().chain(b"0x") {
        buf[n] = b;
        n += 1;
    }
    for i in (0..16).rev() {
        buf[n] = b"0123456789abcdef"[((addr >> (i * 4)) & 0xf) as usize];
        n += 1;
    }
    for &b in suffix.iter().take(buf.len() - n) {
        buf[n] = b;
        n += 1;
    }
    // SAFETY: write(2) is async-signal-safe; `buf[..n]` is initialised.
    unsafe { libc::write(2, buf.as_ptr().cast(), n) };
}

extern "C" fn on_scan(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in `on_segv`; `si_value` is valid for a queued signal (si_code SI_QUEUE).
    unsafe {
        if (*info).si_code != libc::SI_QUEUE {
            return;
        }
        let generation = (*info).si_value().sival_ptr as u64;
        if generation != SCAN_GEN.load(SeqCst) {
            return;
        }
        let rip = *greg(ctx, libc::REG_RIP) as u64;
        let inside = SCAN_RANGES.read(|r| {
            r.is_some_and(|r| {
                let i = r.partition_point(|&(s, _)| s <= rip);
                i > 0 && rip < r[i - 1].1
            })
        });
        if inside {
            SCAN_HIT_RIP.store(rip, SeqCst);
            SCAN_HIT.store(true, SeqCst);
        }
        SCAN_ACKS.fetch_add(1, SeqCst);
    }
}

/// Hand a signal that is not ours to the handler installed before ours.
///
/// # Safety
/// Called only from our handlers with the kernel's `info` and `ctx`.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void, old: Option<&libc::sigaction>) {
    let dfl = libc::SIG_DFL;
    let handler = old.map_or(dfl, |o| o.sa_sigaction);
    if handler == dfl || handler == libc::SIG_IGN {
        // SAFETY: restoring the default disposition; a zeroed sigaction with SIG_DFL is valid.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = dfl;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
            // A fault re-executes and now takes the default action; a sent signal or a trap
            // (RIP already past the int3) must be raised again.
            if (*info).si_code <= 0 || sig == libc::SIGTRAP {
                libc::raise(sig);
            }
        }
        return;
    }
    let old = old.expect("non-default handler implies a recorded action");
    if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous owner installed this as an SA_SIGINFO handler.
        let f: SigActionFn = unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the previous owner installed this as a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}
