//! Raw system calls (inline `syscall` instructions), for the code that must not enter libc: the
//! signal handlers' chain and the text writer while a transient `CC` is in place, when any libc
//! function (`syscall`, `nanosleep`, `readdir`, `malloc`, …) may be the very one being patched.

use std::arch::asm;

/// # Safety
/// The arguments must be valid for system call `nr` (pointers point at memory of the right size).
pub(crate) unsafe fn syscall6(nr: i64, a: [u64; 6]) -> i64 {
    let ret: i64;
    // SAFETY: the x86-64 Linux system call convention; rcx and r11 are clobbered by `syscall`.
    unsafe {
        asm!("syscall", inlateout("rax") nr => ret, in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
             in("r10") a[3], in("r8") a[4], in("r9") a[5], lateout("rcx") _, lateout("r11") _,
             options(nostack));
    }
    ret
}

pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments.
    unsafe { syscall6(libc::SYS_gettid, [0; 6]) as i32 }
}

pub(crate) fn getpid() -> i32 {
    // SAFETY: getpid takes no arguments.
    unsafe { syscall6(libc::SYS_getpid, [0; 6]) as i32 }
}

/// `rt_sigprocmask` on the kernel's 64-bit signal set.
pub(crate) fn sigprocmask(how: i32, set: Option<u64>, old: Option<&mut u64>) -> i64 {
    let set_ptr = set.as_ref().map_or(0, |s| s as *const u64 as u64);
    let old_ptr = old.map_or(0, |o| o as *mut u64 as u64);
    // SAFETY: both pointers are null or point at 8 bytes, the size passed.
    unsafe {
        syscall6(
            libc::SYS_rt_sigprocmask,
            [how as u64, set_ptr, old_ptr, 8, 0, 0],
        )
    }
}

/// Send `sig` to thread `tid` of this process.
pub(crate) fn tgkill(tid: i32, sig: i32) -> i64 {
    // SAFETY: integer arguments only.
    unsafe {
        syscall6(
            libc::SYS_tgkill,
            [getpid() as u64, tid as u64, sig as u64, 0, 0, 0],
        )
    }
}

/// `nanosleep` for `micros` microseconds.
pub(crate) fn sleep_us(micros: u64) {
    let ts = libc::timespec {
        tv_sec: (micros / 1_000_000) as i64,
        tv_nsec: ((micros % 1_000_000) * 1000) as i64,
    };
    // SAFETY: `ts` is a valid timespec; no remainder requested.
    unsafe {
        syscall6(
            libc::SYS_nanosleep,
            [&ts as *const libc::timespec as u64, 0, 0, 0, 0, 0],
        )
    };
}

/// CLOCK_MONOTONIC in nanoseconds, through the system call (not the vDSO wrapper in libc).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is writable.
    unsafe {
        syscall6(
            libc::SYS_clock_gettime,
            [
                libc::CLOCK_MONOTONIC as u64,
                &mut ts as *mut libc::timespec as u64,
                0,
                0,
                0,
                0,
            ],
        )
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The bit of `sig` in a kernel signal set.
pub(crate) fn sigbit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

/// `mprotect`: every protection change of the process backend's text writer goes through here,
/// so a test can make the k-th call fail ([`fake_mprotect`]), as the kernel backend's ioctls go
/// through one seam.
///
/// # Safety
/// `[addr, addr + len)` must be pages of mappings of this process that no Rust reference relies
/// on keeping their current protection (text, or memory the caller owns).
pub(crate) unsafe fn mprotect(addr: u64, len: usize, prot: i32) -> Result<(), std::io::Error> {
    #[cfg(test)]
    if let Some(r) = fake_mprotect::intercept() {
        return r;
    }
    // SAFETY: guaranteed by the caller.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The seam's test side: make one `mprotect` of the current thread fail.
#[cfg(test)]
pub(crate) mod fake_mprotect {
    use std::cell::Cell;

    thread_local! {
        /// `(calls so far, the call to fail (1-based, 0: none), its errno)`.
        static PLAN: Cell<(usize, usize, i32)> = const { Cell::new((0, 0, 0)) };
    }

    /// The `k`-th `mprotect` of this thread from now fails with `errno` (the others are real)
    /// until the guard is dropped.
    pub(crate) fn fail_call(k: usize, errno: i32) -> Guard {
        PLAN.with(|p| p.set((0, k, errno)));
        Guard
    }

    /// How many `mprotect` calls this thread made since [`fail_call`].
    pub(crate) fn calls() -> usize {
        PLAN.with(|p| p.get().0)
    }

    pub(crate) struct Guard;

    impl Drop for Guard {
        fn drop(&mut self) {
            PLAN.with(|p| p.set((0, 0, 0)));
        }
    }

    pub(super) fn intercept() -> Option<Result<(), std::io::Error>> {
        PLAN.with(|p| {
            let (n, k, errno) = p.get();
            p.set((n + 1, k, errno));
            (n + 1 == k).then(|| Err(std::io::Error::from_raw_os_error(errno)))
        })
    }
}
