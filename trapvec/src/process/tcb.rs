//! Where a thread's id lies in its thread control block: the process backend's
//! [`TaskLayout`] for task predicates ([`crate::predicate`]).
//!
//! On x86-64 Linux `fs` points at the running thread's control block (glibc's `struct pthread`,
//! musl's `struct pthread`), which keeps the thread's kernel id (`tid`, written by the kernel
//! through `CLONE_CHILD_SETTID`/`set_tid_address` and by the C library). Its offset depends on
//! the C library and its version, so it is found, not assumed: the 4-byte words of the first
//! [`SCAN`] bytes of the block that hold the calling thread's id, intersected with those of a
//! second thread started for the purpose. Exactly one offset must remain, or predicates are
//! refused with the reason. The guard then compares `dword fs:[offset]` with the wanted id: one
//! instruction, no register, no system call.

use std::sync::OnceLock;

use crate::predicate::{TaskBase, TaskLayout};

/// Bytes of the control block searched (glibc keeps `tid` at 0x2d0 in 2.3x, musl near 0x30).
const SCAN: usize = 1024;

/// The offsets in this thread's control block whose word equals its id.
fn candidates() -> Vec<i32> {
    let tp: usize;
    // SAFETY: on x86-64 Linux with any C library, fs:0 holds the control block's own address
    // (the TLS ABI's self pointer); reading it has no side effect.
    unsafe {
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    (0..SCAN / 4)
        .filter(|i| {
            // SAFETY: the control block (struct pthread) is larger than SCAN bytes in glibc and
            // musl and lies in mapped memory (the thread's stack mapping or the static TLS
            // block); the read is aligned and of plain data.
            let word = unsafe { std::ptr::read_volatile((tp + 4 * i) as *const u32) };
            word == tid
        })
        .map(|i| i32::try_from(4 * i).unwrap_or(i32::MAX))
        .collect()
}

/// The one offset of the thread id in every thread's control block.
fn find_tid_offset() -> Result<i32, String> {
    let here = candidates();
    let there = std::thread::Builder::new()
        .name("trapvec-tcb".into())
        .spawn(candidates)
        .map_err(|e| format!("starting a thread to find the thread id's place: {e}"))?
        .join()
        .map_err(|_| "the thread finding the thread id's place panicked".to_string())?;
    let both: Vec<i32> = here.iter().copied().filter(|o| there.contains(o)).collect();
    log::debug!(
        "thread id in the control block: candidates {here:?} and {there:?}, common {both:?}"
    );
    match both.as_slice() {
        [one] => Ok(*one),
        [] => Err(format!("no word of the first {SCAN} bytes at fs:0 holds the thread id in two threads (an unknown C library)")),
        many => Err(format!("several words at fs:0 ({many:?}) hold the thread id in two threads")),
    }
}

/// This process's layout of thread fields: `tid` at `fs:[offset]`, found once.
pub(crate) fn layout() -> Result<TaskLayout, String> {
    static OFFSET: OnceLock<Result<i32, String>> = OnceLock::new();
    let tid = OFFSET.get_or_init(find_tid_offset).clone()?;
    Ok(TaskLayout {
        base: TaskBase::ThreadPointer,
        tid: Some(tid),
        pid: None,
        tgid: None,
        comm: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_finds_its_own_id_at_the_offset_found() {
        let l = layout().unwrap();
        let off = l.tid.unwrap();
        let read = move || {
            let v: u32;
            // SAFETY: off was found inside the control block at fs:0.
            unsafe {
                std::arch::asm!("mov {:e}, fs:[{}]", out(reg) v, in(reg) i64::from(off), options(nostack, readonly, preserves_flags))
            };
            // SAFETY: gettid cannot fail.
            (v, unsafe { libc::syscall(libc::SYS_gettid) } as u32)
        };
        let (v, t) = read();
        assert_eq!(v, t);
        for h in (0..4).map(|_| std::thread::spawn(read)).collect::<Vec<_>>() {
            let (v, t) = h.join().unwrap();
            assert_eq!(v, t);
        }
    }
}
