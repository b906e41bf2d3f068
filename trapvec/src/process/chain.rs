//! The program's own dispositions for the signals trapvec owns (SIGSEGV, SIGTRAP and the scan
//! signal), and the call into them for the signals that are not trapvec's.
//!
//! trapvec's handlers stay installed whatever the program does: an interposer (the LD_PRELOAD
//! agent's `sigaction`, `signal`, …) hands a program's request for an owned signal to
//! [`program_action`], which *records* it instead of installing it. trapvec's handlers then pass
//! every signal that is not theirs to [`deliver`], which honours the recorded disposition as the
//! kernel would have: `SIG_DFL` restores the default action and lets the signal take it (a fault
//! re-executes, anything else is raised again), `SIG_IGN` drops a sent signal (a fault cannot be
//! ignored: the kernel would force the default, so do we), a handler is called with its own
//! calling convention (`SA_SIGINFO` or plain), its `sa_mask` blocked, and `SA_RESETHAND` applied.
//!
//! The record of each signal is an immutable [`Disposition`] published through an `AtomicPtr`
//! (null = `SIG_DFL`); readers copy it out, so a program's handler may itself call `sigaction`.
//! Records come from a static pool, interned by value (no allocation, so `sigaction` stays
//! async-signal-safe); a program that uses more than [`POOL`] different dispositions gets the
//! extra ones from the heap, and they are never freed (a reader may still hold one).
//!
//! Limits: SIGSEGV and SIGTRAP are never blocked, so a program's handler for them runs as if it had
//! `SA_NODEFER` (a fault inside it re-enters it instead of killing the process).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering::SeqCst};

use crate::process::sys;

/// A recorded disposition: what the program passed to `sigaction`.
#[derive(Clone, Copy)]
pub struct Disposition {
    /// `sa_sigaction` (or `SIG_DFL` / `SIG_IGN`).
    pub handler: usize,
    /// `sa_flags`.
    pub flags: libc::c_int,
    /// `sa_mask`.
    pub mask: libc::sigset_t,
}

impl Disposition {
    fn same(&self, other: &Disposition) -> bool {
        self.handler == other.handler
            && self.flags == other.flags
            && mask_bytes(&self.mask) == mask_bytes(&other.mask)
    }

    /// The disposition as a `struct sigaction` for the program (`sa_restorer` null).
    pub fn to_sigaction(&self) -> libc::sigaction {
        // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no flags, empty mask).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = self.handler;
        sa.sa_flags = self.flags;
        sa.sa_mask = self.mask;
        sa
    }

    /// The disposition a `struct sigaction` asks for.
    pub fn from_sigaction(sa: &libc::sigaction) -> Disposition {
        Disposition {
            handler: sa.sa_sigaction,
            flags: sa.sa_flags,
            mask: sa.sa_mask,
        }
    }
}

fn mask_bytes(m: &libc::sigset_t) -> &[u8] {
    // SAFETY: sigset_t is plain data; the slice covers exactly its bytes.
    unsafe {
        std::slice::from_raw_parts(
            (m as *const libc::sigset_t).cast::<u8>(),
            size_of::<libc::sigset_t>(),
        )
    }
}

/// The kernel's 64-bit view of a glibc `sigset_t` (its first word).
pub(crate) fn kernel_mask(m: &libc::sigset_t) -> u64 {
    // SAFETY: glibc's sigset_t is 1024 bits stored as unsigned longs; the first holds signals 1..64.
    unsafe { *(m as *const libc::sigset_t).cast::<u64>() }
}

/// Number of dispositions kept without allocating.
pub const POOL: usize = 128;

struct Slot {
    ready: AtomicBool,
    val: UnsafeCell<MaybeUninit<Disposition>>,
}

// SAFETY: `val` is written once, by the thread that claimed the slot, before `ready` is set;
// afterwards it is only read.
unsafe impl Sync for Slot {}

static SLOTS: [Slot; POOL] = [const {
    Slot {
        ready: AtomicBool::new(false),
        val: UnsafeCell::new(MaybeUninit::uninit()),
    }
}; POOL];
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// Current record of SIGSEGV, SIGTRAP, the scan signal; null is `SIG_DFL`.
static CURRENT: [AtomicPtr<Disposition>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

/// A pointer to an immutable record equal to `d`, null for plain `SIG_DFL`.
fn intern(d: &Disposition) -> *mut Disposition {
    if d.handler == libc::SIG_DFL && d.flags == 0 && kernel_mask(&d.mask) == 0 {
        return std::ptr::null_mut();
    }
    let n = NEXT_SLOT.load(SeqCst).min(POOL);
    for s in &SLOTS[..n] {
        if s.ready.load(SeqCst) {
            // SAFETY: a ready slot is initialised and never written again.
            let v = unsafe { (*s.val.get()).assume_init_ref() };
            if v.same(d) {
                return (v as *const Disposition).cast_mut();
            }
        }
    }
    let i = NEXT_SLOT.fetch_add(1, SeqCst);
    if i < POOL {
        // SAFETY: slot `i` was claimed by this fetch_add alone; nobody reads it before `ready`.
        unsafe { (*SLOTS[i].val.get()).write(*d) };
        SLOTS[i].ready.store(true, SeqCst);
        // SAFETY: just initialised.
        return unsafe { (*SLOTS[i].val.get()).assume_init_mut() as *mut Disposition };
    }
    Box::into_raw(Box::new(*d))
}

fn index(sig: libc::c_int) -> Option<usize> {
    if !crate::process::signal::installed() {
        return None;
    }
    match sig {
        libc::SIGSEGV => Some(0),
        libc::SIGTRAP => Some(1),
        s if s == crate::process::signal::scan_signal() => Some(2),
        _ => None,
    }
}

/// Whether trapvec's handlers are installed in this process (then the interposers apply).
pub fn active() -> bool {
    crate::process::signal::installed()
}

/// Whether `sig` is one of trapvec's signals (its disposition is recorded, not installed).
pub fn owns(sig: libc::c_int) -> bool {
    index(sig).is_some()
}

/// Signals that must stay unblocked in every thread: a blocked synchronous SIGSEGV or SIGTRAP is
/// forced to its default action and kills the process at the first trap, and a thread that
/// blocks the scan signal never answers a scan, so no text batch can see it leave a window (xz
/// starts its workers with every signal blocked: each batch of once mode then waited for them
/// until it gave up, holding the agent's state, and the program's exit lost its coverage).
pub fn never_blocked() -> [libc::c_int; 3] {
    [
        libc::SIGSEGV,
        libc::SIGTRAP,
        crate::process::signal::scan_signal(),
    ]
}

/// Remove [`never_blocked`] from `set`; returns the ones that were in it (bit `sig - 1`).
pub fn strip_never_blocked(set: &mut libc::sigset_t) -> u64 {
    let mut present = 0;
    for s in never_blocked() {
        // SAFETY: `set` is a valid sigset_t; `s` a valid signal number.
        unsafe {
            if libc::sigismember(set, s) == 1 {
                present |= sys::sigbit(s);
                libc::sigdelset(set, s);
            }
        }
    }
    present
}

/// Record the program's disposition of an owned signal: return the previous one and, if `new`
/// is given, record it. `None` if `sig` is not owned (then the caller installs it as usual).
///
/// A child that shares this memory ([`shares_the_owners_memory`]) gets the record's value back
/// but records nothing: the record is its parent's.
pub fn program_action(sig: libc::c_int, new: Option<&Disposition>) -> Option<Disposition> {
    let i = index(sig)?;
    let old = match new {
        Some(d) if !shares_the_owners_memory() => CURRENT[i].swap(intern(d), SeqCst),
        _ => CURRENT[i].load(SeqCst),
    };
    Some(read(old))
}

/// The process whose dispositions [`CURRENT`] records: the one that installed trapvec's
/// handlers, then each fork child in its own copy (0 before installation).
static OWNER: AtomicI32 = AtomicI32::new(0);

/// The calling process is the record's owner from now on (at installation, in a fork child).
pub(crate) fn set_owner() {
    OWNER.store(sys::getpid(), SeqCst);
}

/// Whether the caller is another process that shares the owner's memory: a `vfork` child or a
/// `clone(CLONE_VM)` child, which has its own dispositions but would write its parent's record
/// (a vfork child resetting SIGSEGV before its exec would take the parent's own handler away:
/// issue 24, item 10). Told by `kcmp(KCMP_VM)`; a child with its own copy of memory (a raw
/// `fork` system call, no atfork handler ran) becomes the owner of its copy. If `kcmp` cannot
/// tell (no `CONFIG_KCMP`, refused), the caller is taken to share: the parent's record is kept.
pub(crate) fn shares_the_owners_memory() -> bool {
    let owner = OWNER.load(SeqCst);
    let me = sys::getpid();
    if owner == 0 || owner == me {
        return false;
    }
    const KCMP_VM: u64 = 1;
    // SAFETY: integer arguments only.
    let r = unsafe { sys::syscall6(libc::SYS_kcmp, [me as u64, owner as u64, KCMP_VM, 0, 0, 0]) };
    if r > 0 {
        OWNER.store(me, SeqCst);
        return false;
    }
    true
}

fn read(p: *const Disposition) -> Disposition {
    if p.is_null() {
        return Disposition {
            handler: libc::SIG_DFL,
            flags: 0,
            // SAFETY: all-zero sigset_t is the empty mask.
            mask: unsafe { std::mem::zeroed() },
        };
    }
    // SAFETY: non-null records are interned or leaked, never freed.
    unsafe { *p }
}

/// Record what was installed before trapvec's handler (called once, at installation).
pub(crate) fn record_previous(sig: libc::c_int, old: &libc::sigaction) {
    let i = match sig {
        libc::SIGSEGV => 0,
        libc::SIGTRAP => 1,
        _ => 2,
    };
    set_owner();
    // trapvec's own handler is never a program disposition (a second installation attempt).
    CURRENT[i].store(intern(&Disposition::from_sigaction(old)), SeqCst);
}

type SigActionFn = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);
type RealSigaction =
    unsafe extern "C" fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;

static REAL_SIGACTION: AtomicUsize = AtomicUsize::new(0);

/// libc's `sigaction`, not an interposer's: found with `dlsym(RTLD_NEXT)` (from the agent that
/// is the next object after it, libc; from an executable, libc too).
pub fn real_sigaction() -> RealSigaction {
    let mut f = REAL_SIGACTION.load(SeqCst);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name; the result is checked for null.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) } as usize;
        if f == 0 {
            f = libc::sigaction as RealSigaction as usize;
        }
        REAL_SIGACTION.store(f, SeqCst);
    }
    // SAFETY: `f` is the address of libc's sigaction, which has this signature.
    unsafe { std::mem::transmute::<usize, RealSigaction>(f) }
}

/// Give a signal that is not trapvec's to the program's recorded disposition.
///
/// # Safety
/// Called only from trapvec's SA_SIGINFO handlers with the kernel's `info` and `ctx`.
pub(crate) unsafe fn deliver(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = index(sig) else { return };
    let p = CURRENT[i].load(SeqCst);
    let d = read(p);
    // SAFETY: `info` is the kernel's siginfo.
    let sent = unsafe { (*info).si_code } <= 0;
    match d.handler {
        libc::SIG_IGN if sent => {}
        libc::SIG_DFL | libc::SIG_IGN => take_default(sig, sent),
        h => {
            if d.flags & libc::SA_RESETHAND != 0 {
                let _ = CURRENT[i].compare_exchange(p, std::ptr::null_mut(), SeqCst, SeqCst);
            }
            // Block the handler's sa_mask (and the signal itself unless SA_NODEFER) while it
            // runs, never SIGSEGV or SIGTRAP; a siglongjmp out of it restores its own mask.
            let mut block = kernel_mask(&d.mask);
            if d.flags & libc::SA_NODEFER == 0 {
                block |= sys::sigbit(sig);
            }
            for s in never_blocked() {
                block &= !sys::sigbit(s);
            }
            let mut old = 0u64;
            sys::sigprocmask(libc::SIG_BLOCK, Some(block), Some(&mut old));
            if d.flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program installed `h` as an SA_SIGINFO handler.
                let f: SigActionFn = unsafe { std::mem::transmute::<usize, SigActionFn>(h) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program installed `h` as a plain handler.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(h) };
                f(sig);
            }
            sys::sigprocmask(libc::SIG_SETMASK, Some(old), None);
        }
    }
}

/// The default action, as if no handler had ever been installed: restore `SIG_DFL`, unblock the
/// signal and let it happen again (a fault by re-executing the instruction, so a core dump shows
/// the faulting instruction; anything else by raising it in this thread).
fn take_default(sig: libc::c_int, sent: bool) {
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags; real_sigaction is libc's.
    unsafe {
        let sa: libc::sigaction = std::mem::zeroed();
        real_sigaction()(sig, &sa, std::ptr::null_mut());
    }
    sys::sigprocmask(libc::SIG_UNBLOCK, Some(sys::sigbit(sig)), None);
    if sent || sig != libc::SIGSEGV {
        sys::tgkill(sys::gettid(), sig);
    }
}
