//! The agent owns the process's trap signals, whatever the program does.
//!
//! - **Masks.** `sigprocmask`, `pthread_sigmask`, `sighold`, `sigset(…, SIG_HOLD)`,
//!   `pthread_attr_setsigmask_np` and the `sa_mask` of every handler installed never block
//!   SIGSEGV, SIGTRAP or the scan signal: they are removed from the requested set (a blocked
//!   synchronous SIGSEGV is forced to its default action, so a thread that blocks it would die at
//!   its first trap; a thread that blocks the scan signal never answers the text writer's scans).
//!   The program's view stays what it asked for: the `oldset` returned includes them
//!   when this thread asked for them to be blocked (kept per thread; a new thread starts with
//!   none asked for, although it may have inherited a creator's request).
//!   `pthread_attr_getsigmask_np` and a `ucontext`'s `uc_sigmask` show the real mask.
//! - **Dispositions.** A handler (or `SIG_DFL`, `SIG_IGN`) for SIGSEGV, SIGTRAP or the scan signal
//!   is recorded, not installed ([`trapvec::process::chain`]), and the old disposition returned
//!   is the program's recorded one; trapvec's handlers call it for every signal that is not theirs.
//!
//! Everything passes straight through to libc until trapvec's handlers are installed (no spec).
//! Raw system calls (`rt_sigaction`, `rt_sigprocmask` through `syscall(2)` or inline assembly)
//! bypass all of this; so do glibc's internal calls (it blocks every signal for short moments
//! inside `pthread_create` and `fork`; the agent's `posix_spawn` blocks them only across its `clone`).

use std::cell::Cell;

use trapvec::process::chain::{self, Disposition};

use crate::real;

thread_local! {
    /// Which of SIGSEGV, SIGTRAP and the scan signal (bit `sig - 1`) this thread asked to have
    /// blocked.
    static ASKED: Cell<u64> = const { Cell::new(0) };
}

fn bit(sig: libc::c_int) -> u64 {
    1u64 << (sig - 1)
}

fn set_errno(e: libc::c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// A copy of `set` without SIGSEGV, SIGTRAP and the scan signal, and which of them it had.
///
/// # Safety
/// `set` must point at a valid sigset_t.
unsafe fn stripped(set: *const libc::sigset_t) -> (libc::sigset_t, u64) {
    // SAFETY: guaranteed by the caller.
    let mut copy = unsafe { *set };
    let present = chain::strip_never_blocked(&mut copy);
    (copy, present)
}

/// The common part of `sigprocmask` and `pthread_sigmask`.
unsafe fn change_mask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
    real: unsafe extern "C" fn(
        libc::c_int,
        *const libc::sigset_t,
        *mut libc::sigset_t,
    ) -> libc::c_int,
) -> libc::c_int {
    if !chain::active() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real(how, set, old) };
    }
    let before = ASKED.with(Cell::get);
    let mut after = before;
    let copy = if set.is_null() {
        None
    } else {
        // SAFETY: a non-null `set` is the caller's valid sigset_t.
        let (copy, present) = unsafe { stripped(set) };
        after = match how {
            libc::SIG_BLOCK => before | present,
            libc::SIG_UNBLOCK => before & !present,
            libc::SIG_SETMASK => present,
            _ => before,
        };
        Some(copy)
    };
    let set2 = copy
        .as_ref()
        .map_or(std::ptr::null(), |c| c as *const libc::sigset_t);
    // SAFETY: `set2` is null or our valid copy; `old` is the caller's.
    let r = unsafe { real(how, set2, old) };
    if r == 0 {
        if !old.is_null() {
            for s in chain::never_blocked() {
                if before & bit(s) != 0 {
                    // SAFETY: `old` was just filled by libc.
                    unsafe { libc::sigaddset(old, s) };
                }
            }
        }
        ASKED.with(|a| a.set(after));
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { change_mask(how, set, old, real::sigprocmask()) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    // SAFETY: libc's contract, passed on.
    unsafe { change_mask(how, set, old, real::pthread_sigmask()) }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_attr_setsigmask_np(
    attr: *mut libc::pthread_attr_t,
    set: *const libc::sigset_t,
) -> libc::c_int {
    if !chain::active() || set.is_null() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::pthread_attr_setsigmask_np()(attr, set) };
    }
    // SAFETY: a non-null `set` is the caller's valid sigset_t.
    let (copy, _) = unsafe { stripped(set) };
    // SAFETY: `attr` is the caller's; `copy` is valid.
    unsafe { real::pthread_attr_setsigmask_np()(attr, &copy) }
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    if !chain::active() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::sigaction()(sig, act, old) };
    }
    if chain::owns(sig) {
        // SAFETY: a non-null `act` is the caller's valid sigaction.
        let new = (!act.is_null()).then(|| Disposition::from_sigaction(unsafe { &*act }));
        let prev = chain::program_action(sig, new.as_ref()).expect("owned");
        if !old.is_null() {
            // SAFETY: a non-null `old` is the caller's writable sigaction.
            unsafe { *old = prev.to_sigaction() };
        }
        return 0;
    }
    if act.is_null() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::sigaction()(sig, act, old) };
    }
    // SAFETY: `act` is the caller's valid sigaction.
    let mut copy = unsafe { *act };
    chain::strip_never_blocked(&mut copy.sa_mask);
    // SAFETY: `copy` is valid; `old` is the caller's.
    unsafe { real::sigaction()(sig, &copy, old) }
}

/// `signal`-style setters on an owned signal: record `handler` with `flags` and `mask_self`.
fn record_simple(
    sig: libc::c_int,
    handler: libc::sighandler_t,
    flags: libc::c_int,
    mask_self: bool,
) -> libc::sighandler_t {
    if handler == libc::SIG_ERR {
        set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    // SAFETY: all-zero is an empty sigset_t.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    if mask_self {
        // SAFETY: `mask` is valid; `sig` is a valid signal.
        unsafe { libc::sigaddset(&mut mask, sig) };
    }
    chain::program_action(
        sig,
        Some(&Disposition {
            handler,
            flags,
            mask,
        }),
    )
    .expect("owned")
    .handler
}

#[no_mangle]
pub unsafe extern "C" fn signal(
    sig: libc::c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if chain::owns(sig) {
        // glibc's `signal` is BSD's: SA_RESTART, the signal masked while its handler runs.
        return record_simple(sig, handler, libc::SA_RESTART, true);
    }
    // SAFETY: libc's signal installs with an empty mask plus `sig`; nothing to strip.
    unsafe { real::signal()(sig, handler) }
}

#[no_mangle]
pub unsafe extern "C" fn bsd_signal(
    sig: libc::c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if chain::owns(sig) {
        return record_simple(sig, handler, libc::SA_RESTART, true);
    }
    // SAFETY: as in `signal`.
    unsafe { real::bsd_signal()(sig, handler) }
}

#[no_mangle]
pub unsafe extern "C" fn sysv_signal(
    sig: libc::c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if chain::owns(sig) {
        // SysV semantics: one-shot, not masked while it runs, no restart.
        return record_simple(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, false);
    }
    // SAFETY: as in `signal`.
    unsafe { real::sysv_signal()(sig, handler) }
}

/// Block or unblock one signal through the interposed `sigprocmask`; whether it was blocked.
fn mask_one(how: libc::c_int, sig: libc::c_int) -> Result<bool, ()> {
    // SAFETY: all-zero sigset_t values are empty sets; `sig` is checked by libc.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::sigaddset(&mut set, sig) != 0 {
            return Err(());
        }
        if sigprocmask(how, &set, &mut old) != 0 {
            return Err(());
        }
        Ok(libc::sigismember(&old, sig) == 1)
    }
}

#[no_mangle]
pub unsafe extern "C" fn sighold(sig: libc::c_int) -> libc::c_int {
    if !chain::active() {
        // SAFETY: passed through.
        return unsafe { real::sighold()(sig) };
    }
    mask_one(libc::SIG_BLOCK, sig).map_or(-1, |_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn sigrelse(sig: libc::c_int) -> libc::c_int {
    if !chain::active() {
        // SAFETY: passed through.
        return unsafe { real::sigrelse()(sig) };
    }
    mask_one(libc::SIG_UNBLOCK, sig).map_or(-1, |_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn sigignore(sig: libc::c_int) -> libc::c_int {
    if !chain::active() {
        // SAFETY: passed through.
        return unsafe { real::sigignore()(sig) };
    }
    // SAFETY: all-zero sigaction plus SIG_IGN is valid.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_IGN;
    // SAFETY: the interposed sigaction with a valid action.
    unsafe { sigaction(sig, &sa, std::ptr::null_mut()) }
}

/// glibc's `SIG_HOLD`.
const SIG_HOLD: libc::sighandler_t = 2;

#[no_mangle]
pub unsafe extern "C" fn sigset(sig: libc::c_int, disp: libc::sighandler_t) -> libc::sighandler_t {
    if !chain::active() {
        // SAFETY: passed through.
        return unsafe { real::sigset()(sig, disp) };
    }
    // SAFETY: all-zero sigaction values are valid.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    let was_blocked = if disp == SIG_HOLD {
        // SAFETY: querying through the interposed sigaction.
        if unsafe { sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            return libc::SIG_ERR;
        }
        mask_one(libc::SIG_BLOCK, sig)
    } else {
        // SAFETY: as above.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = disp;
        // SAFETY: the interposed sigaction with a valid action.
        if unsafe { sigaction(sig, &sa, &mut old) } != 0 {
            return libc::SIG_ERR;
        }
        mask_one(libc::SIG_UNBLOCK, sig)
    };
    match was_blocked {
        Err(()) => libc::SIG_ERR,
        Ok(true) => SIG_HOLD,
        Ok(false) => old.sa_sigaction,
    }
}
