//! Signal handlers of the process backend. Everything here runs in signal context: no locks, no
//! allocation, no logging, only atomics and reads of [`EpochCell`] values.
//!
//! - **SIGSEGV** (the trap): a user-mode `int 0xF5` hits a DPL-0 gate and raises #GP, delivered with
//!   `si_code == SI_KERNEL`, `trapno == 13`, error code `0x7AA` and `RIP` at the `CD F5`. If the
//!   site is in the dispatch table, RIP becomes its destination. If it is not, but the bytes there
//!   are no longer `CD F5`, the splice was removed under our feet: return with RIP unchanged, and
//!   the original instruction runs. Anything else goes to the program's disposition
//!   ([`chain::deliver`](crate::process::chain)).
//! - **SIGTRAP** (the int3-first protocol): a thread that meets the transient `CC` of a text write
//!   in progress is sent back to retry (RIP = address of the `CC`), until the write completes.
//!   Only an int3 (`si_code == SI_KERNEL`) at a site of a batch being written (or written, when the
//!   `CC` is already gone again) is trapvec's; a program's `raise(SIGTRAP)` or its own `int3` goes
//!   to the program's disposition, so an unhandled one still dumps core.
//! - **Scan signal** (`SIGRTMAX - 1` unless `TRAPVEC_SIGNAL` names another, queued by this process
//!   with a tagged generation number): reports whether the interrupted RIP lies in the ranges
//!   being scanned, for quiescence and window checks; any other delivery of that signal goes to
//!   the program's disposition. It is blocked while the SIGSEGV handler runs, so a thread that was
//!   just redirected is scanned only once its RIP already holds the destination.

use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst,
};
use std::sync::OnceLock;

use crate::abi::{TRAP_BYTES, USER_TRAP_ERROR_CODE};
use crate::error::TargetError;
use crate::process::chain;
use crate::process::epoch::EpochCell;
use crate::process::sys;

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
/// Every address where a transient `CC` was ever written (sorted): a thread that met the `CC` just
/// before the write completed still gets its SIGTRAP recognised once the `CC` is gone.
pub(crate) static WRITTEN: EpochCell<Vec<u64>> = EpochCell::new();
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

type SigActionFn = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

static INSTALL: OnceLock<Result<(), SignalError>> = OnceLock::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);
static SCAN_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Tag in the upper 16 bits of the scan signal's value: trapvec's own scans carry it.
const SCAN_TAG: u64 = 0x7476 << 48;

/// The value queued with scan `generation`.
pub(crate) fn scan_value(generation: u64) -> u64 {
    SCAN_TAG | (generation & ((1 << 48) - 1))
}

/// Whether trapvec's handlers are installed.
pub(crate) fn installed() -> bool {
    INSTALLED.load(SeqCst)
}

/// The real-time signal used to scan threads (`TRAPVEC_SIGNAL`, default `SIGRTMAX-1`). Once the
/// handlers are installed the number is read from [`SCAN_SIGNAL`] alone: `SIGRTMAX` is a libc
/// function (`__libc_current_sigrtmax`), and the text writer and the scan handler call this while
/// a transient `CC` may sit in any libc function, that one included (a cover of libc's every
/// block killed the writer there).
pub(crate) fn scan_signal() -> libc::c_int {
    match SCAN_SIGNAL.load(SeqCst) {
        0 => libc::SIGRTMAX() - 1,
        s => s,
    }
}

/// Why trapvec's signal handlers cannot be installed; each names the signal at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignalError {
    #[error("TRAPVEC_SIGNAL={text}: signal {signal} cannot be trapvec's scan signal")]
    Reserved { text: String, signal: libc::c_int },
    #[error("TRAPVEC_SIGNAL={text}: not a signal (a number, SIGUSR1, SIGUSR2, SIGRTMIN+n or SIGRTMAX-n)")]
    NotASignal { text: String },
    /// `errno` rather than an `io::Error`: the outcome is kept (cloned) for every later caller.
    #[error("sigaction({signal}): {}", std::io::Error::from_raw_os_error(*.errno))]
    Sigaction { signal: libc::c_int, errno: i32 },
}

/// Parse `TRAPVEC_SIGNAL`: a number, `SIGUSR1`, `SIGUSR2`, `SIGRTMIN+n` or `SIGRTMAX-n` (the
/// `SIG` prefix optional). SIGSEGV, SIGTRAP, SIGKILL and SIGSTOP are refused.
pub fn parse_scan_signal(text: &str) -> Result<libc::c_int, SignalError> {
    let t = text.trim();
    let u = t.strip_prefix("SIG").unwrap_or(t);
    let offset = |rest: &str, sign: i32| -> Option<i32> {
        if rest.is_empty() {
            Some(0)
        } else {
            rest.get(1..)?
                .parse::<i32>()
                .ok()
                .filter(|_| rest.starts_with(if sign > 0 { '+' } else { '-' }))
                .map(|n| n * sign)
        }
    };
    let sig = if let Ok(n) = u.parse::<i32>() {
        Some(n)
    } else if u == "USR1" {
        Some(libc::SIGUSR1)
    } else if u == "USR2" {
        Some(libc::SIGUSR2)
    } else if let Some(rest) = u.strip_prefix("RTMIN") {
        offset(rest, 1).map(|o| libc::SIGRTMIN() + o)
    } else if let Some(rest) = u.strip_prefix("RTMAX") {
        offset(rest, -1).map(|o| libc::SIGRTMAX() + o)
    } else {
        None
    };
    match sig {
        Some(s)
            if (1..=libc::SIGRTMAX()).contains(&s)
                && ![libc::SIGSEGV, libc::SIGTRAP, libc::SIGKILL, libc::SIGSTOP].contains(&s) =>
        {
            Ok(s)
        }
        Some(signal) => Err(SignalError::Reserved {
            text: text.to_string(),
            signal,
        }),
        None => Err(SignalError::NotASignal {
            text: text.to_string(),
        }),
    }
}

/// Install the three handlers once per process.
pub(crate) fn install() -> Result<(), TargetError> {
    INSTALL
        .get_or_init(|| {
            // SAFETY: each call passes valid pointers to initialised `sigaction` structs; the
            // handlers installed are `extern "C"` functions with the SA_SIGINFO signature.
            let signal = match std::env::var("TRAPVEC_SIGNAL") {
                Ok(text) => parse_scan_signal(&text)?,
                Err(_) => libc::SIGRTMAX() - 1,
            };
            SCAN_SIGNAL.store(signal, SeqCst);
            // The program's dispositions are recorded before the handlers go in, so that a
            // signal arriving in between already finds them.
            for sig in [libc::SIGSEGV, libc::SIGTRAP, scan_signal()] {
                // SAFETY: querying only; `old` is a valid out-parameter.
                let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                unsafe { chain::real_sigaction()(sig, std::ptr::null(), &mut old) };
                chain::record_previous(sig, &old);
            }
            INSTALLED.store(true, SeqCst);
            // SAFETY: each call passes valid pointers to initialised `sigaction` structs; the
            // handlers installed are `extern "C"` functions with the SA_SIGINFO signature.
            unsafe {
                set_handler(
                    libc::SIGSEGV,
                    on_segv as SigActionFn as usize,
                    &[scan_signal()],
                )?;
                set_handler(
                    libc::SIGTRAP,
                    on_trap as SigActionFn as usize,
                    &[scan_signal()],
                )?;
                set_handler(scan_signal(), on_scan as SigActionFn as usize, &[])?;
            }
            Ok(())
        })
        .clone()
        .map_err(TargetError::from)
}

/// # Safety
/// `handler` must be the address of an `extern "C" fn(c_int, *mut siginfo_t, *mut c_void)`.
unsafe fn set_handler(
    sig: libc::c_int,
    handler: usize,
    block: &[libc::c_int],
) -> Result<libc::sigaction, SignalError> {
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
    // SAFETY: both pointers are valid for the call; libc's sigaction, not an interposer.
    if unsafe { chain::real_sigaction()(sig, &sa, &mut old) } != 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Err(SignalError::Sigaction { signal: sig, errno });
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
        chain::deliver(sig, info, ctx);
    }
}

extern "C" fn on_trap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in `on_segv`.
    unsafe {
        let rip = greg(ctx, libc::REG_RIP);
        let at = (*rip as u64).wrapping_sub(1);
        // Ours only for an int3 (SI_KERNEL) that met a transient CC of a text batch.
        let ours = (*info).si_code == 0x80 /* SI_KERNEL */ && met_transient_cc(at);
        if ours {
            if WRITER_TID.load(SeqCst) == sys::gettid() {
                // The writer itself met its own transient CC: it would retry for ever.
                report(
                    b"trapvec: the text writer executed the site it is writing at ",
                    at,
                    b"; aborting\n",
                );
                sys::tgkill(sys::gettid(), libc::SIGKILL);
            }
            // Retry: either the CC is still there (we trap again) or the write completed.
            *rip = at as i64;
            return;
        }
        chain::deliver(sig, info, ctx);
    }
}

/// Odd while a text batch may have transient `CC`s in place: the writer makes it odd after
/// publishing [`TRANSIENT`] and before its first `CC`, and even again after its last byte is
/// written and synchronised, before withdrawing [`TRANSIENT`]. Readers use it as a seqlock.
pub(crate) static TEXT_SEQ: AtomicU64 = AtomicU64::new(0);

/// Whether the `int3` that trapped at `at` met a transient `CC`: either the `CC` is still there
/// and a batch in progress lists `at`, or it is gone again and `at` was written by some batch
/// (the write completed between the trap and this handler). The byte and the lists are read as
/// one snapshot under [`TEXT_SEQ`]: read without it, a batch could end between the byte read
/// (`CC`) and the list read (withdrawn), or the next batch's `CC` could appear between a list
/// read that missed it and the byte read, and either way a thread at a site would be killed by
/// its own retry's SIGTRAP.
///
/// # Safety
/// `at` must be readable (an int3 was just executed there).
unsafe fn met_transient_cc(at: u64) -> bool {
    let listed =
        |cell: &EpochCell<Vec<u64>>| cell.read(|t| t.is_some_and(|t| t.binary_search(&at).is_ok()));
    loop {
        let seq = TEXT_SEQ.load(SeqCst);
        // SAFETY: guaranteed by the caller; atomic, so the loads stay ordered with `TEXT_SEQ`'s.
        let cc = unsafe { (*(at as *const AtomicU8)).load(SeqCst) } == crate::abi::INT3;
        let ours = if cc {
            seq & 1 == 1 && listed(&TRANSIENT)
        } else {
            listed(&WRITTEN)
        };
        if TEXT_SEQ.load(SeqCst) == seq {
            return ours;
        }
    }
}

/// The thread writing a batch while its transient `CC`s are in place (0 when none).
pub(crate) static WRITER_TID: AtomicI32 = AtomicI32::new(0);

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
    // A raw system call, not libc's `write`: this runs while a transient `CC` may sit in it.
    // SAFETY: `buf[..n]` is initialised and outlives the call.
    unsafe { sys::syscall6(libc::SYS_write, [2, buf.as_ptr() as u64, n as u64, 0, 0, 0]) };
}

extern "C" fn on_scan(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: as in `on_segv`; `si_value` is valid for a queued signal (si_code SI_QUEUE).
    unsafe {
        let value = (*info).si_value().sival_ptr as u64;
        if (*info).si_code != libc::SI_QUEUE
            || (*info).si_pid() != sys::getpid()
            || value & !((1 << 48) - 1) != SCAN_TAG
        {
            chain::deliver(sig, info, ctx);
            return;
        }
        if value != scan_value(SCAN_GEN.load(SeqCst)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trapvec_signal_accepts_names_offsets_and_numbers_and_refuses_the_trap_signals() {
        assert_eq!(parse_scan_signal("SIGRTMAX-1"), Ok(libc::SIGRTMAX() - 1));
        assert_eq!(parse_scan_signal("RTMIN+3"), Ok(libc::SIGRTMIN() + 3));
        assert_eq!(parse_scan_signal("SIGRTMIN"), Ok(libc::SIGRTMIN()));
        assert_eq!(parse_scan_signal("SIGUSR2"), Ok(libc::SIGUSR2));
        assert_eq!(parse_scan_signal(" 40 "), Ok(40));
        for bad in [
            "SIGSEGV",
            "11",
            "5",
            "9",
            "19",
            "0",
            "65",
            "SIGRTMAX+1",
            "RTMIN-2",
            "SIGFOO",
            "",
        ] {
            let e = parse_scan_signal(bad).expect_err(bad).to_string();
            assert!(
                e.starts_with(&format!("TRAPVEC_SIGNAL={bad}: ")),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_scan_value_carries_the_tag_and_the_generation() {
        assert_eq!(scan_value(7) >> 48, 0x7476);
        assert_eq!(scan_value(7) & 0xffff, 7);
        assert_ne!(scan_value(1), scan_value(2));
    }
}
