//! Children that would share the address space: `posix_spawn`, `posix_spawnp`, `system`,
//! `popen`/`pclose` and `vfork`.
//!
//! **Why glibc's own versions cannot run in a spliced process.** glibc starts the child of
//! `posix_spawn` (and of `system` and `popen`, which call it internally) with
//! `CLONE_VM|CLONE_VFORK`: the child runs in the parent's memory, hence in its spliced text, while
//! the parent's thread waits for the `exec`. Before anything else the child resets every handled
//! signal to `SIG_DFL` with glibc's internal `sigaction` (a raw system call no interposer sees),
//! so that no handler of the parent runs on the child's borrowed memory. trapvec's SIGSEGV
//! handler is one of them: from then on a trap kills the child, and the child goes on to call
//! `dup2`, `close`, `open`, `execve` and, for `posix_spawnp`, the string functions of the `PATH`
//! search, all in the shared text. A splice on any of them by trap kills every command the
//! program starts (status 11). Nothing at the trap site can tell the child from the parent's
//! other threads, which must still meet the trap: the text is one, the trap cannot be delivered
//! to a handler the child no longer has (a fault on a `SIG_DFL` or blocked signal is fatal), and
//! any other trap instruction raises a signal that is just as fatal by default. Taking the traps
//! out of the text while a child runs would let the other threads run the original code unspliced
//! (a `replace` would be skipped).
//!
//! **What the agent does instead.** The child must execute no spliced text, so the agent starts it
//! itself, for every public entry point a program uses:
//! - `posix_spawn` and `posix_spawnp`: a `clone(CLONE_VFORK)` *without* `CLONE_VM` (the child has
//!   its own copy of memory, as after `fork`, and the parent's thread still waits for the `exec`,
//!   as `posix_spawn` promises), in which the child does glibc's child steps with raw system calls
//!   only (dispositions, scheduling, session, process group, ids, the file actions in order, the
//!   mask, then `execve` of each `PATH` candidate computed by the parent), and reports a failure
//!   through a shared page, so that `posix_spawn` returns the error and reaps the child as
//!   glibc's does. trapvec's handlers stay installed in the child and SIGSEGV/SIGTRAP unblocked
//!   until the final mask is set, so even code the compiler calls (`memcpy`) could meet a trap
//!   safely. The file actions are read from glibc's `posix_spawn_file_actions_t`, whose layout
//!   is checked once at start against actions made through glibc's own functions; if it does not
//!   match, a spawn with file actions goes to glibc's `posix_spawn` (as before) with a warning.
//! - `system` and `popen`/`pclose`: the POSIX behaviour (`/bin/sh -c`, SIGINT and SIGQUIT ignored
//!   and SIGCHLD blocked while `system` waits; the pipe, the `e` flag and the closing of earlier
//!   `popen` streams in the child) on top of the spawn above; `pclose` or `fclose` of a stream
//!   the agent opened waits for its child (glibc's `fclose` of a `popen` stream does too), any
//!   other stream goes to glibc's.
//! - `vfork` is `fork` (POSIX allows it: a `vfork` child may only `exec` or `_exit`): the child
//!   gets its own memory, so its `sigaction` calls and its traps change nothing of the parent's
//!   (issue 24 item 10: Python's `_posixsubprocess` resets SIGSEGV in its `vfork` child through
//!   the interposed `sigaction`, which used to overwrite the parent's recorded handler). `vfork`
//!   without a spec is glibc's, reached by a tail jump (a wrapper cannot call it: the child would
//!   return through the wrapper's frame on the parent's stack).
//!
//! Limits: a child started by a raw `clone(CLONE_VM)` or `vfork` system call, or by a glibc
//! function other than these (`wordexp`'s command substitution), still runs glibc's or the
//! program's code in shared memory; one that resets SIGSEGV itself dies at its first trap.
//! `vfork` as `fork` copies the page tables of a large process and may fail where overcommit is
//! strict.

// System-call arguments are register words: every integer is passed bit for bit as the kernel
// reads it (x86-64 Linux only, where `usize`, `u64` and pointers are 64 bits), and results are
// small counts, descriptors or negated errnos.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

use crate::real;

type Argv = *const *const libc::c_char;

/// Set when a spec was applied: the entry points below use the agent's spawn from then on.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Whether glibc's `posix_spawn_file_actions_t` reads as [`FileActions`] expects.
static LAYOUT_OK: AtomicBool = AtomicBool::new(false);
/// glibc's `vfork`, for the pass-through without a spec (0 until resolved).
static REAL_VFORK: AtomicUsize = AtomicUsize::new(0);
/// `vfork` is `fork` (a byte: read by the `vfork` stub).
static VFORK_AS_FORK: AtomicBool = AtomicBool::new(false);

/// First thing at start, spec or not: find glibc's `vfork`.
pub(crate) fn prepare() {
    // SAFETY: dlsym with a NUL-terminated name; a null result is kept as 0 (the stub then forks).
    REAL_VFORK.store(
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"vfork".as_ptr()) } as usize,
        SeqCst,
    );
}

/// Once the spec is applied: children are started by the agent.
pub(crate) fn activate() {
    let ok = file_actions_layout_ok();
    if !ok {
        log::warn!("trapvec: glibc's posix_spawn file actions have an unknown layout: a posix_spawn with file actions runs glibc's own, whose child dies at a trap");
    }
    LAYOUT_OK.store(ok, SeqCst);
    ACTIVE.store(true, SeqCst);
    VFORK_AS_FORK.store(true, SeqCst);
}

/// The libc functions the agent stands in for: a program's calls never reach them.
const TAKEN_OVER: [&str; 7] = [
    "posix_spawn",
    "posix_spawnp",
    "system",
    "popen",
    "pclose",
    "vfork",
    "__vfork",
];

/// A warning for a splice in one of glibc's functions the agent stands in for (it would never be
/// hit by the program's calls), naming the agent's function to splice instead.
pub(crate) fn taken_over_warning(at: &str, function: &str, origin: Option<&str>) -> Option<String> {
    let libc = origin
        .and_then(|o| std::path::Path::new(o).file_name())
        .is_some_and(|f| f.to_string_lossy().starts_with("libc.so"));
    let name = TAKEN_OVER.iter().find(|&&n| n == function)?;
    let own = name.trim_start_matches("__");
    libc.then(|| {
        format!("trapvec: warning: {at}: the agent runs `{own}` itself (its children must not share spliced memory), so the program's calls do not reach glibc's; splice `libtrapvec_agent:{own}` to see them")
    })
}

pub(crate) fn active() -> bool {
    ACTIVE.load(SeqCst)
}

// ---------------------------------------------------------------------------------------------
// Raw system calls: the child makes no call into libc.

/// # Safety
/// The arguments must be valid for system call `nr`.
unsafe fn sys(nr: libc::c_long, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction with the x86-64 Linux convention; the kernel clobbers
    // rcx and r11 only; the caller vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

fn sys0(nr: libc::c_long) -> isize {
    // SAFETY: a system call without arguments that touches no memory (getpid, setsid, …).
    unsafe { sys(nr, [0; 6]) }
}

/// `rt_sigprocmask` on the kernel's 64-bit mask.
fn sigmask(how: libc::c_int, set: Option<u64>, old: Option<&mut u64>) -> isize {
    let set_p = set.as_ref().map_or(0, |s| s as *const u64 as usize);
    let old_p = old.map_or(0, |o| o as *mut u64 as usize);
    // SAFETY: both pointers are null or point at a u64 alive for the call; sigsetsize 8.
    unsafe {
        sys(
            libc::SYS_rt_sigprocmask,
            [how as usize, set_p, old_p, 8, 0, 0],
        )
    }
}

/// The kernel's 64-bit view of a glibc `sigset_t` (its first word holds signals 1 to 64).
fn kernel_mask(m: &libc::sigset_t) -> u64 {
    // SAFETY: glibc's sigset_t is an array of unsigned longs, at least one.
    unsafe { *(m as *const libc::sigset_t).cast::<u64>() }
}

fn sigbit(sig: libc::c_int) -> u64 {
    1u64 << (sig - 1)
}

/// The kernel's `struct sigaction` (x86-64): handler, flags, restorer, mask.
#[repr(C)]
#[derive(Default)]
struct KSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

// ---------------------------------------------------------------------------------------------
// File actions: glibc's `struct __spawn_action`, read through a layout checked at start.

/// `posix_spawn_file_actions_t`: allocated, used, the array of actions, padding.
#[repr(C)]
struct FileActions {
    allocated: libc::c_int,
    used: libc::c_int,
    actions: *const RawAction,
    pad: [libc::c_int; 16],
}

const _: () = assert!(size_of::<FileActions>() == size_of::<libc::posix_spawn_file_actions_t>());

/// One `struct __spawn_action`: the tag, then a union whose words are read per tag.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawAction {
    tag: libc::c_int,
    w0: u64,
    w1: u64,
    w2: u64,
}

const _: () = assert!(size_of::<RawAction>() == 32);

/// A file action, as the child performs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Close(libc::c_int),
    Dup2(libc::c_int, libc::c_int),
    Open {
        fd: libc::c_int,
        path: *const libc::c_char,
        oflag: libc::c_int,
        mode: libc::mode_t,
    },
    Chdir(*const libc::c_char),
    Fchdir(libc::c_int),
    Closefrom(libc::c_int),
    Tcsetpgrp(libc::c_int),
}

/// The union's first `int` field: the low half of its word.
fn lo(w: u64) -> libc::c_int {
    w as u32 as libc::c_int
}

/// The union's second `int` field: the high half of its word.
fn hi(w: u64) -> libc::c_int {
    (w >> 32) as u32 as libc::c_int
}

/// The actions of `fa`, or the tag that is not known.
///
/// # Safety
/// `fa` is a `posix_spawn_file_actions_t` initialised by glibc.
unsafe fn read_actions(
    fa: *const libc::posix_spawn_file_actions_t,
) -> Result<Vec<Action>, libc::c_int> {
    // SAFETY: the caller's initialised file actions, with the layout checked at start.
    let fa = unsafe { &*fa.cast::<FileActions>() };
    let n = usize::try_from(fa.used).unwrap_or(0);
    let raw: &[RawAction] = if n == 0 || fa.actions.is_null() {
        &[]
    } else {
        // SAFETY: glibc keeps `used` initialised actions in the array.
        unsafe { std::slice::from_raw_parts(fa.actions, n) }
    };
    raw.iter()
        .map(|a| {
            Ok(match a.tag {
                0 => Action::Close(lo(a.w0)),
                1 => Action::Dup2(lo(a.w0), hi(a.w0)),
                2 => Action::Open {
                    fd: lo(a.w0),
                    path: a.w1 as *const libc::c_char,
                    oflag: lo(a.w2),
                    mode: hi(a.w2) as libc::mode_t,
                },
                3 => Action::Chdir(a.w0 as *const libc::c_char),
                4 => Action::Fchdir(lo(a.w0)),
                5 => Action::Closefrom(lo(a.w0)),
                6 => Action::Tcsetpgrp(lo(a.w0)),
                t => return Err(t),
            })
        })
        .collect()
}

/// Make file actions with glibc's functions and read them back: the layout is the one expected.
fn file_actions_layout_ok() -> bool {
    let path = c"/trapvec/layout-probe";
    type AddFd =
        unsafe extern "C" fn(*mut libc::posix_spawn_file_actions_t, libc::c_int) -> libc::c_int;
    type AddPath = unsafe extern "C" fn(
        *mut libc::posix_spawn_file_actions_t,
        *const libc::c_char,
    ) -> libc::c_int;
    let find = |name: &CStr| {
        // SAFETY: dlsym with a NUL-terminated name.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        (!f.is_null()).then_some(f as usize)
    };
    // SAFETY: the file actions are initialised, used with glibc's functions and destroyed; the
    // `_np` functions found by name have the signatures glibc documents for them.
    unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        if libc::posix_spawn_file_actions_init(&mut fa) != 0 {
            return false;
        }
        let mut want = vec![
            Action::Close(11),
            Action::Dup2(12, 13),
            Action::Open {
                fd: 14,
                path: path.as_ptr(),
                oflag: libc::O_RDONLY | libc::O_CLOEXEC,
                mode: 0o640,
            },
        ];
        libc::posix_spawn_file_actions_addclose(&mut fa, 11);
        libc::posix_spawn_file_actions_adddup2(&mut fa, 12, 13);
        libc::posix_spawn_file_actions_addopen(
            &mut fa,
            14,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            0o640,
        );
        if let Some(f) = find(c"posix_spawn_file_actions_addchdir_np") {
            std::mem::transmute::<usize, AddPath>(f)(&mut fa, path.as_ptr());
            want.push(Action::Chdir(path.as_ptr()));
        }
        for (name, fd, make) in [
            (
                c"posix_spawn_file_actions_addfchdir_np",
                15,
                Action::Fchdir as fn(libc::c_int) -> Action,
            ),
            (
                c"posix_spawn_file_actions_addclosefrom_np",
                16,
                Action::Closefrom,
            ),
            (
                c"posix_spawn_file_actions_addtcsetpgrp_np",
                17,
                Action::Tcsetpgrp,
            ),
        ] {
            if let Some(f) = find(name) {
                std::mem::transmute::<usize, AddFd>(f)(&mut fa, fd);
                want.push(make(fd));
            }
        }
        // glibc copies the open and chdir paths: compare them by content.
        let got = read_actions(&fa);
        let same = |a: &Action, b: &Action| match (a, b) {
            (
                Action::Open {
                    fd,
                    path: p,
                    oflag,
                    mode,
                },
                Action::Open {
                    fd: f2,
                    path: p2,
                    oflag: o2,
                    mode: m2,
                },
            ) => {
                fd == f2
                    && oflag == o2
                    && mode == m2
                    && !p2.is_null()
                    && CStr::from_ptr(*p) == CStr::from_ptr(*p2)
            }
            (Action::Chdir(p), Action::Chdir(p2)) => {
                !p2.is_null() && CStr::from_ptr(*p) == CStr::from_ptr(*p2)
            }
            _ => a == b,
        };
        let ok = got
            .is_ok_and(|g| g.len() == want.len() && g.iter().zip(&want).all(|(a, b)| same(b, a)));
        libc::posix_spawn_file_actions_destroy(&mut fa);
        ok
    }
}

// ---------------------------------------------------------------------------------------------
// The spawn.

/// Everything the child does, computed by the parent (the child allocates nothing).
struct Plan {
    /// `execve` candidates in order (one path, or the `PATH` search's).
    candidates: Vec<CString>,
    /// The error when there is no candidate at all.
    no_candidate: libc::c_int,
    argv: Argv,
    envp: Argv,
    actions: Vec<Action>,
    flags: libc::c_int,
    pgroup: libc::pid_t,
    /// Signals set to `SIG_DFL` (`POSIX_SPAWN_SETSIGDEF`), as a kernel mask.
    sigdefault: u64,
    /// The child's final mask (`POSIX_SPAWN_SETSIGMASK`), else the parent's.
    sigmask: Option<u64>,
    policy: libc::c_int,
    param: libc::sched_param,
}

/// The `execve` candidates of `file`: itself when it has a `/`, else each `PATH` entry (the
/// parent's `PATH`, or `/bin:/usr/bin`; an empty entry is the current directory).
fn candidates(file: &CStr, use_path: bool) -> (Vec<CString>, libc::c_int) {
    let bytes = file.to_bytes();
    if bytes.is_empty() {
        return (Vec::new(), libc::ENOENT);
    }
    if !use_path || bytes.contains(&b'/') {
        return (vec![file.to_owned()], 0);
    }
    let path = std::env::var_os("PATH")
        .map(std::os::unix::ffi::OsStringExt::into_vec)
        .unwrap_or_else(|| b"/bin:/usr/bin".to_vec());
    let list = path
        .split(|&b| b == b':')
        .map(|dir| {
            let mut p = if dir.is_empty() {
                Vec::new()
            } else {
                [dir, b"/"].concat()
            };
            p.extend_from_slice(bytes);
            CString::new(p).expect("no NUL inside PATH or a C string")
        })
        .collect();
    (list, libc::ENOENT)
}

/// The attributes of `attr` (null: none).
///
/// # Safety
/// `attr` is null or a `posix_spawnattr_t` initialised by glibc.
unsafe fn attributes(plan: &mut Plan, attr: *const libc::posix_spawnattr_t) {
    if attr.is_null() {
        return;
    }
    // SAFETY: glibc's getters on the caller's initialised attributes; each out-parameter is ours.
    unsafe {
        let mut flags: libc::c_short = 0;
        libc::posix_spawnattr_getflags(attr, &mut flags);
        plan.flags = libc::c_int::from(flags);
        libc::posix_spawnattr_getpgroup(attr, &mut plan.pgroup);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::posix_spawnattr_getsigdefault(attr, &mut set);
        plan.sigdefault = kernel_mask(&set);
        if plan.flags & libc::POSIX_SPAWN_SETSIGMASK != 0 {
            libc::posix_spawnattr_getsigmask(attr, &mut set);
            plan.sigmask = Some(kernel_mask(&set));
        }
        libc::posix_spawnattr_getschedpolicy(attr, &mut plan.policy);
        libc::posix_spawnattr_getschedparam(attr, &mut plan.param);
    }
}

/// Start the child of `plan`: its pid, or the error `posix_spawn` returns.
fn spawn(plan: &Plan) -> Result<libc::pid_t, libc::c_int> {
    // The child's error, in a page the child's own copy of memory still shares.
    // SAFETY: an anonymous shared mapping of one page, checked below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::ENOMEM));
    }
    let err = page.cast::<libc::c_int>();
    // Every signal blocked across the clone, so that none runs a handler in the child before it
    // has reset them; nothing but the clone runs meanwhile, so no trap can meet a blocked SIGSEGV.
    let mut old = 0u64;
    sigmask(libc::SIG_SETMASK, Some(!0), Some(&mut old));
    // SAFETY: clone without CLONE_VM and without a new stack: the child continues here on its
    // own copy of this stack, as after fork; the parent's thread waits until it execs or exits.
    let pid = unsafe {
        sys(
            libc::SYS_clone,
            [(libc::CLONE_VFORK | libc::SIGCHLD) as usize, 0, 0, 0, 0, 0],
        )
    };
    if pid == 0 {
        // SAFETY: `err` is the shared page, `plan` the parent's (copied), `old` its mask.
        unsafe { child(plan, old, err) }
    }
    sigmask(libc::SIG_SETMASK, Some(old), None);
    // SAFETY: the page is ours; the child has exec'd or exited (CLONE_VFORK).
    let e = unsafe { std::ptr::read_volatile(err) };
    // SAFETY: unmapping the page mapped above.
    unsafe { libc::munmap(page, 4096) };
    if pid < 0 {
        return Err(i32::try_from(-pid).unwrap_or(libc::EAGAIN));
    }
    let pid = libc::pid_t::try_from(pid).expect("a pid");
    if e != 0 {
        // The child failed before its exec and exited: reap it, as glibc does.
        let mut st = 0;
        // SAFETY: waiting for our own child.
        while unsafe { libc::waitpid(pid, &mut st, 0) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        return Err(e);
    }
    Ok(pid)
}

/// The child: glibc's child steps with raw system calls, then `execve`; on failure the error
/// goes to `err` and the child exits with 127.
///
/// # Safety
/// Runs only in the child of [`spawn`]'s clone; `err` points at the shared page.
unsafe fn child(plan: &Plan, parent_mask: u64, err: *mut libc::c_int) -> ! {
    let fail = |r: isize| -> ! {
        // SAFETY: the shared page; exit_group ends the child.
        unsafe {
            std::ptr::write_volatile(err, i32::try_from(-r).unwrap_or(libc::EINVAL));
            loop {
                sys(libc::SYS_exit_group, [127, 0, 0, 0, 0, 0]);
            }
        }
    };
    let check = |r: isize| if r < 0 { fail(r) } else { r };
    // trapvec's signals first: a trap in the child (in code the compiler calls) finds its handler.
    sigmask(
        libc::SIG_UNBLOCK,
        Some(sigbit(libc::SIGSEGV) | sigbit(libc::SIGTRAP)),
        None,
    );
    // No handler of the parent may run in the child once the mask opens: every handled signal
    // goes back to SIG_DFL, and the ones POSIX_SPAWN_SETSIGDEF names too. trapvec's stay until
    // the exec (which resets them): they are what makes a trap in the child harmless.
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP || trapvec::process::chain::owns(sig) {
            continue;
        }
        let mut cur = KSigaction::default();
        // SAFETY: a query into our struct, sigsetsize 8.
        if unsafe {
            sys(
                libc::SYS_rt_sigaction,
                [
                    sig as usize,
                    0,
                    &mut cur as *mut KSigaction as usize,
                    8,
                    0,
                    0,
                ],
            )
        } < 0
        {
            continue;
        }
        let listed =
            plan.flags & libc::POSIX_SPAWN_SETSIGDEF != 0 && plan.sigdefault & sigbit(sig) != 0;
        if listed || (cur.handler != libc::SIG_DFL && cur.handler != libc::SIG_IGN) {
            let dfl = KSigaction::default();
            // SAFETY: SIG_DFL with no flags, from our struct.
            unsafe {
                sys(
                    libc::SYS_rt_sigaction,
                    [sig as usize, &dfl as *const KSigaction as usize, 0, 8, 0, 0],
                )
            };
        }
    }
    let param = &plan.param as *const libc::sched_param as usize;
    if plan.flags & libc::POSIX_SPAWN_SETSCHEDULER != 0 {
        // SAFETY: our sched_param.
        check(unsafe {
            sys(
                libc::SYS_sched_setscheduler,
                [0, plan.policy as usize, param, 0, 0, 0],
            )
        });
    } else if plan.flags & libc::POSIX_SPAWN_SETSCHEDPARAM != 0 {
        // SAFETY: as above.
        check(unsafe { sys(libc::SYS_sched_setparam, [0, param, 0, 0, 0, 0]) });
    }
    if plan.flags & libc::c_int::from(libc::POSIX_SPAWN_SETSID) != 0 {
        check(sys0(libc::SYS_setsid));
    }
    if plan.flags & libc::POSIX_SPAWN_SETPGROUP != 0 {
        // SAFETY: integers only.
        check(unsafe { sys(libc::SYS_setpgid, [0, plan.pgroup as usize, 0, 0, 0, 0]) });
    }
    if plan.flags & libc::POSIX_SPAWN_RESETIDS != 0 {
        let (uid, gid) = (
            sys0(libc::SYS_getuid) as usize,
            sys0(libc::SYS_getgid) as usize,
        );
        // SAFETY: integers only (-1 leaves an id as it is).
        unsafe {
            check(sys(
                libc::SYS_setresuid,
                [usize::MAX, uid, usize::MAX, 0, 0, 0],
            ));
            check(sys(
                libc::SYS_setresgid,
                [usize::MAX, gid, usize::MAX, 0, 0, 0],
            ));
        }
    }
    for a in &plan.actions {
        // SAFETY: each system call gets integers or a C string of the caller's file actions.
        unsafe {
            match *a {
                // glibc ignores a failed close (the descriptor was not open).
                Action::Close(fd) => {
                    sys(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]);
                }
                Action::Dup2(fd, new) if fd == new => {
                    // A dup2 onto itself clears close-on-exec.
                    let flags = check(sys(
                        libc::SYS_fcntl,
                        [fd as usize, libc::F_GETFD as usize, 0, 0, 0, 0],
                    ));
                    check(sys(
                        libc::SYS_fcntl,
                        [
                            fd as usize,
                            libc::F_SETFD as usize,
                            (flags as usize) & !(libc::FD_CLOEXEC as usize),
                            0,
                            0,
                            0,
                        ],
                    ));
                }
                Action::Dup2(fd, new) => {
                    check(sys(libc::SYS_dup2, [fd as usize, new as usize, 0, 0, 0, 0]));
                }
                Action::Open {
                    fd,
                    path,
                    oflag,
                    mode,
                } => {
                    let got = check(sys(
                        libc::SYS_openat,
                        [
                            libc::AT_FDCWD as usize,
                            path as usize,
                            oflag as usize,
                            mode as usize,
                            0,
                            0,
                        ],
                    ));
                    if got != fd as isize {
                        check(sys(libc::SYS_dup2, [got as usize, fd as usize, 0, 0, 0, 0]));
                        sys(libc::SYS_close, [got as usize, 0, 0, 0, 0, 0]);
                    }
                }
                Action::Chdir(path) => {
                    check(sys(libc::SYS_chdir, [path as usize, 0, 0, 0, 0, 0]));
                }
                Action::Fchdir(fd) => {
                    check(sys(libc::SYS_fchdir, [fd as usize, 0, 0, 0, 0, 0]));
                }
                Action::Closefrom(from) => {
                    check(sys(
                        libc::SYS_close_range,
                        [from as usize, u32::MAX as usize, 0, 0, 0, 0],
                    ));
                }
                Action::Tcsetpgrp(fd) => {
                    let pgrp: libc::pid_t =
                        libc::pid_t::try_from(sys0(libc::SYS_getpgrp)).unwrap_or(0);
                    check(sys(
                        libc::SYS_ioctl,
                        [
                            fd as usize,
                            libc::TIOCSPGRP as usize,
                            &pgrp as *const libc::pid_t as usize,
                            0,
                            0,
                            0,
                        ],
                    ));
                }
            }
        }
    }
    // trapvec's signals as the program asked for them: one it ignores (its recorded disposition)
    // stays ignored across the exec unless POSIX_SPAWN_SETSIGDEF names it, as without the
    // agent; the exec itself makes the others SIG_DFL. Read first, set last: from the first
    // SIG_IGN to the exec, nothing but system calls runs (a trap would now be fatal).
    let mut ignored = 0u64;
    for sig in (1..=64).filter(|&s| trapvec::process::chain::owns(s)) {
        let listed =
            plan.flags & libc::POSIX_SPAWN_SETSIGDEF != 0 && plan.sigdefault & sigbit(sig) != 0;
        if !listed
            && trapvec::process::chain::program_action(sig, None)
                .is_some_and(|d| d.handler == libc::SIG_IGN)
        {
            ignored |= sigbit(sig);
        }
    }
    for sig in (1..=64).filter(|&s| ignored & sigbit(s) != 0) {
        let ign = KSigaction {
            handler: libc::SIG_IGN,
            ..KSigaction::default()
        };
        // SAFETY: SIG_IGN from our struct.
        unsafe {
            sys(
                libc::SYS_rt_sigaction,
                [sig as usize, &ign as *const KSigaction as usize, 0, 8, 0, 0],
            )
        };
    }
    // The final mask may block SIGSEGV: nothing but system calls runs from here either.
    sigmask(
        libc::SIG_SETMASK,
        Some(plan.sigmask.unwrap_or(parent_mask)),
        None,
    );
    let mut last = -(plan.no_candidate as isize);
    let mut eacces = false;
    for c in &plan.candidates {
        // SAFETY: a C string, the caller's argv and the (filtered) environment.
        let r = unsafe {
            sys(
                libc::SYS_execve,
                [
                    c.as_ptr() as usize,
                    plan.argv as usize,
                    plan.envp as usize,
                    0,
                    0,
                    0,
                ],
            )
        };
        let e = i32::try_from(-r).unwrap_or(libc::EINVAL);
        last = r;
        match e {
            libc::EACCES => eacces = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => break,
        }
    }
    if eacces
        && plan.candidates.len() > 1
        && [
            -libc::ENOENT,
            -libc::ENOTDIR,
            -libc::ESTALE,
            -libc::ENODEV,
            -libc::ETIMEDOUT,
        ]
        .contains(&(last as i32))
    {
        last = -(libc::EACCES as isize);
    }
    fail(last)
}

/// `posix_spawn`/`posix_spawnp` by the agent; `None`: glibc's must do it (file actions of an
/// unknown layout or kind).
///
/// # Safety
/// The arguments of `posix_spawn`.
pub(crate) unsafe fn posix_spawn(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
    use_path: bool,
) -> Option<libc::c_int> {
    let actions = if fa.is_null() {
        Vec::new()
    } else if !LAYOUT_OK.load(SeqCst) {
        return None;
    } else {
        // SAFETY: the caller's initialised file actions, layout checked.
        match unsafe { read_actions(fa) } {
            Ok(a) => a,
            Err(tag) => {
                log::warn!("trapvec: posix_spawn file action of unknown kind {tag}: glibc's posix_spawn runs it");
                return None;
            }
        }
    };
    // SAFETY: `file` is the caller's C string.
    let (candidates, no_candidate) = candidates(unsafe { CStr::from_ptr(file) }, use_path);
    // SAFETY: an all-zero sched_param is valid.
    let mut plan = Plan {
        candidates,
        no_candidate,
        argv,
        envp,
        actions,
        flags: 0,
        pgroup: 0,
        sigdefault: 0,
        sigmask: None,
        policy: 0,
        // SAFETY: sched_param is plain integers; all-zero is priority 0.
        param: unsafe { std::mem::zeroed() },
    };
    // SAFETY: the caller's attributes.
    unsafe { attributes(&mut plan, attr) };
    Some(match spawn(&plan) {
        Ok(p) => {
            if !pid.is_null() {
                // SAFETY: the caller's out-parameter.
                unsafe { *pid = p };
            }
            0
        }
        Err(e) => e,
    })
}

// ---------------------------------------------------------------------------------------------
// system, popen, pclose, vfork.

fn environ() -> Argv {
    extern "C" {
        static environ: *const *const libc::c_char;
    }
    // SAFETY: libc's environ, read once.
    unsafe { environ }
}

/// `/bin/sh -c -- command` with `actions` and `attr`-like settings: the child's pid or the error.
fn shell(
    command: &CStr,
    actions: Vec<Action>,
    sigdefault: u64,
    sigmask: Option<u64>,
) -> Result<libc::pid_t, libc::c_int> {
    let argv: [*const libc::c_char; 5] = [
        c"sh".as_ptr(),
        c"-c".as_ptr(),
        c"--".as_ptr(),
        command.as_ptr(),
        std::ptr::null(),
    ];
    let mut flags = libc::POSIX_SPAWN_SETSIGDEF;
    if sigmask.is_some() {
        flags |= libc::POSIX_SPAWN_SETSIGMASK;
    }
    let plan = Plan {
        candidates: vec![c"/bin/sh".to_owned()],
        no_candidate: 0,
        argv: argv.as_ptr(),
        envp: environ(),
        actions,
        flags,
        pgroup: 0,
        sigdefault,
        sigmask,
        policy: 0,
        // SAFETY: an all-zero sched_param is valid.
        // SAFETY: sched_param is plain integers; all-zero is priority 0.
        param: unsafe { std::mem::zeroed() },
    };
    spawn(&plan)
}

fn wait_status(pid: libc::pid_t) -> libc::c_int {
    let mut st = 0;
    loop {
        // SAFETY: waiting for our own child.
        if unsafe { libc::waitpid(pid, &mut st, 0) } >= 0 {
            return st;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return -1;
        }
    }
}

/// `system` calls in progress (SIGINT and SIGQUIT stay ignored until the last one returns),
/// with the dispositions they replaced.
static SYSTEM: Mutex<(usize, Option<(libc::sigaction, libc::sigaction)>)> = Mutex::new((0, None));

/// `system`: POSIX's, on the agent's spawn.
///
/// # Safety
/// `command` is null or a C string.
pub(crate) unsafe fn system(command: *const libc::c_char) -> libc::c_int {
    if command.is_null() {
        // Whether a shell is there: run one.
        // SAFETY: a C string.
        return libc::c_int::from(unsafe { system(c"exit 0".as_ptr()) } == 0);
    }
    // SAFETY: all-zero sigaction values are valid; SIG_IGN with an empty mask.
    let (mut ign, mut intr, mut quit): (libc::sigaction, libc::sigaction, libc::sigaction) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    ign.sa_sigaction = libc::SIG_IGN;
    {
        let mut g = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 == 0 {
            // SAFETY: libc's sigaction with valid structs (SIGINT/SIGQUIT are not trapvec's).
            unsafe {
                real::sigaction()(libc::SIGINT, &ign, &mut intr);
                real::sigaction()(libc::SIGQUIT, &ign, &mut quit);
            }
            g.1 = Some((intr, quit));
        }
        g.0 += 1;
        (intr, quit) = g.1.expect("set by the first caller");
    }
    let mut old = 0u64;
    sigmask(libc::SIG_BLOCK, Some(sigbit(libc::SIGCHLD)), Some(&mut old));
    // The child gets back the dispositions system() ignored (if they were not ignored before)
    // and the caller's mask.
    let mut def = 0;
    for (sig, sa) in [(libc::SIGINT, &intr), (libc::SIGQUIT, &quit)] {
        if sa.sa_sigaction != libc::SIG_IGN {
            def |= sigbit(sig);
        }
    }
    // SAFETY: a C string.
    let status = match shell(
        unsafe { CStr::from_ptr(command) },
        Vec::new(),
        def,
        Some(old),
    ) {
        Ok(pid) => wait_status(pid),
        Err(_) => 127 << 8,
    };
    {
        let mut g = SYSTEM.lock().unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        if g.0 == 0 {
            if let Some((intr, quit)) = g.1.take() {
                // SAFETY: libc's sigaction with the dispositions saved above.
                unsafe {
                    real::sigaction()(libc::SIGINT, &intr, std::ptr::null_mut());
                    real::sigaction()(libc::SIGQUIT, &quit, std::ptr::null_mut());
                }
            }
        }
    }
    sigmask(libc::SIG_SETMASK, Some(old), None);
    status
}

/// Streams opened by [`popen`]: (FILE address, child pid, descriptor).
static STREAMS: Mutex<Vec<(usize, libc::pid_t, libc::c_int)>> = Mutex::new(Vec::new());

fn set_errno(e: libc::c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// `popen`: POSIX's, on the agent's spawn.
///
/// # Safety
/// `command` and `mode` are C strings.
pub(crate) unsafe fn popen(
    command: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    // SAFETY: the caller's C strings.
    let (command, mode_s) = unsafe { (CStr::from_ptr(command), CStr::from_ptr(mode).to_bytes()) };
    let read = match mode_s.first() {
        Some(b'r') => true,
        Some(b'w') => false,
        _ => {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
    };
    let cloexec = mode_s[1..].contains(&b'e');
    let mut fds = [0; 2];
    // SAFETY: a two-int array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return std::ptr::null_mut();
    }
    let (parent_end, child_end, child_fd) = if read {
        (fds[0], fds[1], 1)
    } else {
        (fds[1], fds[0], 0)
    };
    let mut streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    // The child's end on its stdin or stdout (a dup2 onto itself clears its close-on-exec), and
    // the streams of earlier popen calls closed in the child, as POSIX asks.
    let mut actions = vec![Action::Dup2(child_end, child_fd)];
    actions.extend(streams.iter().map(|s| Action::Close(s.2)));
    let pid = match shell(command, actions, 0, None) {
        Ok(pid) => pid,
        Err(e) => {
            // SAFETY: closing our own pipe.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    // SAFETY: our descriptors; fdopen with a C string mode.
    unsafe {
        libc::close(child_end);
        if !cloexec {
            libc::fcntl(parent_end, libc::F_SETFD, 0);
        }
        let fp = libc::fdopen(parent_end, if read { c"r".as_ptr() } else { c"w".as_ptr() });
        if fp.is_null() {
            let e = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM);
            libc::close(parent_end);
            wait_status(pid);
            set_errno(e);
            return std::ptr::null_mut();
        }
        streams.push((fp as usize, pid, parent_end));
        OPEN_STREAMS.fetch_add(1, SeqCst);
        fp
    }
}

/// How many streams [`STREAMS`] holds (`fclose` looks there only when some are open).
static OPEN_STREAMS: AtomicUsize = AtomicUsize::new(0);

/// `pclose`, or `fclose`, of a stream of [`popen`]: closed and its child waited for, the result
/// glibc's gives (the wait status, or the close's result when that status is 0); `None` for
/// any other stream, which goes to glibc.
///
/// # Safety
/// `fp` is a stream.
pub(crate) unsafe fn close_stream(fp: *mut libc::FILE) -> Option<libc::c_int> {
    if OPEN_STREAMS.load(SeqCst) == 0 {
        return None;
    }
    let pid = {
        let mut streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
        let i = streams.iter().position(|s| s.0 == fp as usize)?;
        OPEN_STREAMS.fetch_sub(1, SeqCst);
        streams.swap_remove(i).1
    };
    // SAFETY: the caller's stream, ours; glibc's fclose.
    let r = unsafe { real::fclose()(fp) };
    let st = wait_status(pid);
    Some(if st != 0 { st } else { r })
}

extern "C" fn vfork_as_fork() -> libc::pid_t {
    // SAFETY: fork has no preconditions; its child has its own memory.
    unsafe { libc::fork() }
}

/// `vfork`: `fork` once a spec is applied, else a tail jump into glibc's `vfork` (which takes
/// its caller's return address itself: no frame of ours may be on the stack).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    std::arch::naked_asm!(
        "cmp byte ptr [rip + {as_fork}], 0",
        "jne 2f",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "jmp {fork}",
        as_fork = sym VFORK_AS_FORK,
        real = sym REAL_VFORK,
        fork = sym vfork_as_fork,
    )
}
