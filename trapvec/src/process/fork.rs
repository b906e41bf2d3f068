//! `fork()` in a process with splices: the child keeps every splice working, and nothing the child
//! does changes the parent's code.
//!
//! Text pages and data arenas are private mappings, copied on write by the kernel. The code
//! arenas are not: they are a `memfd` mapped `MAP_SHARED` twice (see [`memory`](super::memory)),
//! so a child freeing a trampoline (filled with `CC`) or allocating a new one would write into the
//! parent's. A `pthread_atfork` child handler therefore gives the child its own memfd per code
//! arena, a copy of the parent's at the fork, mapped over both views at the same addresses. If
//! that fails (no memory), the child's repository refuses every change instead.
//!
//! The prepare handler takes trapvec's process-wide locks (the text/dispatch writer, the thread
//! scanner, the arena registry), so a fork never copies one of them held by another thread, and
//! the child resets the reader counts of the values published to signal handlers (a thread that
//! was inside a handler at the fork does not exist in the child).
//!
//! A raw `clone`/`fork` system call, or `vfork`, runs no atfork handler: such a child must only
//! `exec` or `_exit`. If it shares the memory, its `sigaction` calls leave the parent's recorded
//! dispositions alone ([`chain::shares_the_owners_memory`](super::chain::shares_the_owners_memory)).

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, Once};

use crate::process::memory;
use crate::process::signal::{DISPATCH, SCAN_RANGES, TRANSIENT, WRITTEN};

struct Held {
    _writer: MutexGuard<'static, ()>,
    _scanner: MutexGuard<'static, ()>,
    arenas: MutexGuard<'static, Vec<memory::CodeArena>>,
}

// SAFETY: the guards are taken by the forking thread in `prepare` and released by that same
// thread in `parent`, or by its copy (the child's only thread) in `child`.
unsafe impl Send for Held {}

static HELD: Mutex<Option<Held>> = Mutex::new(None);
static REGISTER: Once = Once::new();

/// Set in a child whose code arenas could not be made private: its repository refuses changes.
pub(crate) static SHARED_WITH_PARENT: AtomicBool = AtomicBool::new(false);

/// Register the atfork handlers (once per process).
pub(crate) fn register() {
    REGISTER.call_once(|| {
        // SAFETY: three `extern "C" fn()` with no arguments.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

extern "C" fn prepare() {
    let writer = super::WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let scanner = super::scan::SCANNER
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let arenas = memory::CODE_ARENAS
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    *HELD.lock().unwrap_or_else(|e| e.into_inner()) = Some(Held {
        _writer: writer,
        _scanner: scanner,
        arenas,
    });
}

extern "C" fn parent() {
    drop(HELD.lock().unwrap_or_else(|e| e.into_inner()).take());
}

extern "C" fn child() {
    let held = HELD.lock().unwrap_or_else(|e| e.into_inner()).take();
    // The child's copy of the recorded dispositions is its own.
    crate::process::chain::set_owner();
    DISPATCH.reset_readers_after_fork();
    TRANSIENT.reset_readers_after_fork();
    WRITTEN.reset_readers_after_fork();
    SCAN_RANGES.reset_readers_after_fork();
    if let Some(h) = &held {
        for a in h.arenas.iter() {
            if !memory::make_private(a) {
                SHARED_WITH_PARENT.store(true, SeqCst);
            }
        }
    }
    drop(held);
}
