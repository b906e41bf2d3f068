//! libc's own functions behind the agent's interposers, found with `dlsym(RTLD_NEXT, …)` (the
//! next object after the agent in the lookup order). Resolved once at start, and lazily for a
//! call that comes before the agent's constructor (another library's constructor).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// Resolve (and cache) `name`; abort with a message if libc lacks it.
fn lookup(cache: &AtomicUsize, name: &std::ffi::CStr) -> usize {
    let f = cache.load(SeqCst);
    if f != 0 {
        return f;
    }
    // SAFETY: dlsym with a NUL-terminated name; the result is checked.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if f == 0 {
        let msg = format!("trapvec agent: libc has no {name:?}\n");
        // SAFETY: write(2) of an initialised buffer; abort has no preconditions.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }
    cache.store(f, SeqCst);
    f
}

macro_rules! real {
    ($($name:ident: fn($($arg:ty),*) -> $ret:ty;)*) => {
        $(
            /// libc's function of this name.
            pub(crate) fn $name() -> unsafe extern "C" fn($($arg),*) -> $ret {
                static CACHE: AtomicUsize = AtomicUsize::new(0);
                let name = std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()).expect("one NUL");
                let f = lookup(&CACHE, name);
                // SAFETY: `f` is libc's function of this name, which has this C signature.
                unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(f) }
            }
        )*
        /// Resolve every function now, outside any signal handler.
        pub(crate) fn resolve_all() {
            $( let _ = $name(); )*
        }
    };
}

type Sigset = libc::sigset_t;
type CStrP = *const libc::c_char;
type Argv = *const *const libc::c_char;

real! {
    sigaction: fn(libc::c_int, *const libc::sigaction, *mut libc::sigaction) -> libc::c_int;
    signal: fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
    bsd_signal: fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
    sysv_signal: fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
    sigset: fn(libc::c_int, libc::sighandler_t) -> libc::sighandler_t;
    sighold: fn(libc::c_int) -> libc::c_int;
    sigrelse: fn(libc::c_int) -> libc::c_int;
    sigignore: fn(libc::c_int) -> libc::c_int;
    sigprocmask: fn(libc::c_int, *const Sigset, *mut Sigset) -> libc::c_int;
    pthread_sigmask: fn(libc::c_int, *const Sigset, *mut Sigset) -> libc::c_int;
    pthread_attr_setsigmask_np: fn(*mut libc::pthread_attr_t, *const Sigset) -> libc::c_int;
    execve: fn(CStrP, Argv, Argv) -> libc::c_int;
    execv: fn(CStrP, Argv) -> libc::c_int;
    execvp: fn(CStrP, Argv) -> libc::c_int;
    execvpe: fn(CStrP, Argv, Argv) -> libc::c_int;
    fexecve: fn(libc::c_int, Argv, Argv) -> libc::c_int;
    posix_spawn: fn(*mut libc::pid_t, CStrP, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, Argv, Argv) -> libc::c_int;
    dlopen: fn(CStrP, libc::c_int) -> *mut libc::c_void;
    dlmopen: fn(libc::Lmid_t, CStrP, libc::c_int) -> *mut libc::c_void;
    dlclose: fn(*mut libc::c_void) -> libc::c_int;
    system: fn(CStrP) -> libc::c_int;
    popen: fn(CStrP, CStrP) -> *mut libc::FILE;
    pclose: fn(*mut libc::FILE) -> libc::c_int;
    fclose: fn(*mut libc::FILE) -> libc::c_int;
    posix_spawnp: fn(*mut libc::pid_t, CStrP, *const libc::posix_spawn_file_actions_t, *const libc::posix_spawnattr_t, Argv, Argv) -> libc::c_int;
}

/// Leave the process as libc's `_exit` does: `exit_group(status)`, a raw system call.
pub(crate) fn exit_group(status: libc::c_int) -> ! {
    loop {
        // SAFETY: exit_group takes an integer and does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}
