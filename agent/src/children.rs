//! Children of a spliced program.
//!
//! - **exec**: the stats are written before every `exec` family call (the image, and its
//!   counters, are about to go). The exec'd program does not inherit the spec unless
//!   `TRAPVEC_INHERIT=1`: at start the agent removes `TRAPVEC_SPEC` and itself (its entry of
//!   `LD_PRELOAD`) from the process's environment, and removes them again from any environment
//!   passed explicitly to `execve`, `execvpe`, `fexecve`, `execle`, `posix_spawn` or
//!   `posix_spawnp`. With `TRAPVEC_INHERIT=1` the child applies the spec to itself (give
//!   `TRAPVEC_STATS` a `%p`, or parent and child write one file).
//! - **fork**: the child keeps every splice (text and data are copied on write; the code
//!   repository is given a private copy by trapvec's atfork handler), and writes its own stats
//!   only when `TRAPVEC_STATS` holds `%p`. Its hit counts start from the parent's at the fork.
//! - **spawn**: `posix_spawn`, `posix_spawnp`, `system`, `popen`, `pclose` and `fclose` below hand over to
//!   the agent's own ([`crate::spawn`]) once a spec is applied, and `vfork` is `fork`.

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use crate::real;

type Argv = *const *const libc::c_char;

/// Set at start when a spec was given and `TRAPVEC_INHERIT` is not 1: explicit environments of
/// exec'd children are filtered (an agent without a spec changes nothing).
static FILTER: AtomicBool = AtomicBool::new(false);

const AGENT_FILE: &str = "libtrapvec_agent.so";

/// `LD_PRELOAD`'s value without the agent (entries are separated by `:` or spaces).
fn preload_without_agent(value: &str) -> String {
    value
        .split([':', ' '])
        .filter(|e| {
            !e.is_empty()
                && std::path::Path::new(e).file_name().and_then(|f| f.to_str()) != Some(AGENT_FILE)
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// At start (before `main`, one thread): keep the spec from exec'd children.
pub(crate) fn forget_spec_for_exec() {
    if std::env::var("TRAPVEC_INHERIT").is_ok_and(|v| v == "1") {
        return;
    }
    FILTER.store(true, SeqCst);
    // SAFETY: set_var/remove_var need a single-threaded process: this runs in the agent's constructor, before `main`, while the
    // process has one thread.
    unsafe {
        std::env::remove_var("TRAPVEC_SPEC");
        if let Ok(p) = std::env::var("LD_PRELOAD") {
            let rest = preload_without_agent(&p);
            if rest.is_empty() {
                std::env::remove_var("LD_PRELOAD");
            } else {
                std::env::set_var("LD_PRELOAD", rest);
            }
        }
    }
}

/// `envp` without `TRAPVEC_SPEC` and the agent's `LD_PRELOAD` entry (the same pointer when there
/// is nothing to remove). The new array and strings are leaked: exec replaces the image, and a
/// failed exec leaks a few bytes.
///
/// # Safety
/// `envp` is null or a null-terminated array of C strings.
unsafe fn child_env(envp: Argv) -> Argv {
    if envp.is_null() || !FILTER.load(SeqCst) {
        return envp;
    }
    let mut entries = Vec::new();
    let mut changed = false;
    let mut i = 0;
    loop {
        // SAFETY: guaranteed by the caller: entries up to the terminating null are readable.
        let e = unsafe { *envp.add(i) };
        if e.is_null() {
            break;
        }
        i += 1;
        // SAFETY: a C string of the environment.
        let bytes = unsafe { CStr::from_ptr(e) }.to_bytes();
        if bytes.starts_with(b"TRAPVEC_SPEC=") {
            changed = true;
            continue;
        }
        if let Some(v) = bytes.strip_prefix(b"LD_PRELOAD=") {
            let v = String::from_utf8_lossy(v);
            let rest = preload_without_agent(&v);
            if rest != v {
                changed = true;
                if !rest.is_empty() {
                    let s =
                        CString::new(format!("LD_PRELOAD={rest}")).expect("no NUL in an env entry");
                    entries.push(s.into_raw().cast_const());
                }
                continue;
            }
        }
        entries.push(e);
    }
    if !changed {
        return envp;
    }
    entries.push(std::ptr::null());
    Box::leak(entries.into_boxed_slice()).as_ptr()
}

fn environ() -> Argv {
    extern "C" {
        static environ: *const *const libc::c_char;
    }
    // SAFETY: libc's environ, read once.
    unsafe { environ }
}

#[no_mangle]
pub unsafe extern "C" fn execve(path: *const libc::c_char, argv: Argv, envp: Argv) -> libc::c_int {
    crate::write_stats();
    // SAFETY: the caller's arguments, the environment filtered.
    unsafe { real::execve()(path, argv, child_env(envp)) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: Argv) -> libc::c_int {
    crate::write_stats();
    // SAFETY: the caller's arguments (environ was cleaned at start).
    unsafe { real::execv()(path, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: Argv) -> libc::c_int {
    crate::write_stats();
    // SAFETY: as in `execv`.
    unsafe { real::execvp()(file, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const libc::c_char, argv: Argv, envp: Argv) -> libc::c_int {
    crate::write_stats();
    // SAFETY: as in `execve`.
    unsafe { real::execvpe()(file, argv, child_env(envp)) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: libc::c_int, argv: Argv, envp: Argv) -> libc::c_int {
    crate::write_stats();
    // SAFETY: as in `execve`.
    unsafe { real::fexecve()(fd, argv, child_env(envp)) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> libc::c_int {
    // SAFETY: the caller's null-terminated environment (or null).
    let envp = unsafe { child_env(envp) };
    if crate::spawn::active() {
        if let Some(r) =
            // SAFETY: the caller's arguments, the environment filtered.
            unsafe { crate::spawn::posix_spawn(pid, path, actions, attr, argv, envp, false) }
        {
            return r;
        }
    }
    // SAFETY: the caller's arguments, the environment filtered.
    unsafe { real::posix_spawn()(pid, path, actions, attr, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> libc::c_int {
    // SAFETY: as in `posix_spawn`.
    let envp = unsafe { child_env(envp) };
    if crate::spawn::active() {
        if let Some(r) =
            // SAFETY: as in `posix_spawn`.
            unsafe { crate::spawn::posix_spawn(pid, file, actions, attr, argv, envp, true) }
        {
            return r;
        }
    }
    // SAFETY: as in `posix_spawn`.
    unsafe { real::posix_spawnp()(pid, file, actions, attr, argv, envp) }
}

/// `system`: the agent's ([`crate::spawn`]) once a spec is applied.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const libc::c_char) -> libc::c_int {
    if crate::spawn::active() {
        // SAFETY: the caller's argument.
        return unsafe { crate::spawn::system(command) };
    }
    // SAFETY: passed through.
    unsafe { real::system()(command) }
}

/// `popen`: the agent's ([`crate::spawn`]) once a spec is applied.
#[no_mangle]
pub unsafe extern "C" fn popen(
    command: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    if crate::spawn::active() {
        // SAFETY: the caller's arguments.
        return unsafe { crate::spawn::popen(command, mode) };
    }
    // SAFETY: passed through.
    unsafe { real::popen()(command, mode) }
}

/// `pclose`: a stream of the agent's `popen` is closed and its child waited for here.
#[no_mangle]
pub unsafe extern "C" fn pclose(fp: *mut libc::FILE) -> libc::c_int {
    // SAFETY: the caller's stream.
    if let Some(st) = unsafe { crate::spawn::close_stream(fp) } {
        return st;
    }
    // SAFETY: passed through.
    unsafe { real::pclose()(fp) }
}

/// `fclose`: as `pclose` for a stream of the agent's `popen` (glibc's waits for the child of a
/// `popen` stream too); any other stream is glibc's.
#[no_mangle]
pub unsafe extern "C" fn fclose(fp: *mut libc::FILE) -> libc::c_int {
    // SAFETY: the caller's stream.
    if let Some(st) = unsafe { crate::spawn::close_stream(fp) } {
        return st;
    }
    // SAFETY: passed through.
    unsafe { real::fclose()(fp) }
}

/// Which `execl` variant [`execl_impl`] serves.
const EXECL: usize = 0;
const EXECLP: usize = 1;
const EXECLE: usize = 2;

/// The variadic `execl`, `execlp` and `execle` (Rust cannot define C variadic functions): naked
/// stubs spill the five register arguments after `path` next to each other and pass
/// [`execl_impl`] a pointer to them and one to the arguments on the stack.
macro_rules! execl_stub {
    ($name:ident, $kind:expr) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            std::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",       // the register arguments, in order
                "lea rdx, [rbp + 16]", // the stack arguments
                "mov ecx, {kind}",
                "and rsp, -16",
                "call {imp}",
                "leave",
                "ret",
                kind = const $kind,
                imp = sym execl_impl,
            )
        }
    };
}

execl_stub!(execl, EXECL);
execl_stub!(execlp, EXECLP);
execl_stub!(execle, EXECLE);

/// Collect the variadic arguments (up to the null, then `envp` for `execle`) and exec.
///
/// # Safety
/// Called only by the stubs above: `regs` holds 5 words, `stack` the caller's further arguments.
unsafe extern "C" fn execl_impl(
    path: *const libc::c_char,
    regs: *const usize,
    stack: *const usize,
    kind: usize,
) -> libc::c_int {
    // SAFETY: argument `i` after `path` is in the registers' spill area, then on the stack.
    let arg = |i: usize| unsafe {
        if i < 5 {
            *regs.add(i)
        } else {
            *stack.add(i - 5)
        }
    };
    let mut argv: Vec<*const libc::c_char> = Vec::new();
    let mut i = 0;
    loop {
        let a = arg(i) as *const libc::c_char;
        argv.push(a);
        i += 1;
        if a.is_null() {
            break;
        }
    }
    // SAFETY: the variants' contracts: execle's envp follows the null.
    unsafe {
        match kind {
            EXECLP => execvp(path, argv.as_ptr()),
            EXECLE => execve(path, argv.as_ptr(), arg(i) as Argv),
            _ => execve(path, argv.as_ptr(), environ()),
        }
    }
}
