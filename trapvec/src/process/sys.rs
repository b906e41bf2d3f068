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
    unsafe { syscall6(libc::SYS_rt_sigprocmask, [how as u64, set_ptr, old_ptr, 8, 0, 0]) }
}

/// Send `sig` to thread `tid` of this process.
pub(crate) fn tgkill(tid: i32, sig: i32) -> i64 {
    // SAFETY: integer arguments only.
    unsafe { syscall6(libc::SYS_tgkill, [getpid() as u64, tid as u64, sig as u64, 0, 0, 0]) }
}

/// `nanosleep` for `micros` microseconds.
pub(crate) fn sleep_us(micros: u64) {
    let ts = libc::timespec { tv_sec: (micros / 1_000_000) as i64, tv_nsec: ((micros % 1_000_000) * 1000) as i64 };
    // SAFETY: `ts` is a valid timespec; no remainder requested.
    unsafe { syscall6(libc::SYS_nanosleep, [&ts as *const libc::timespec as u64, 0, 0, 0, 0, 0]) };
}

/// CLOCK_MONOTONIC in nanoseconds, through the system call (not the vDSO wrapper in libc).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is writable.
    unsafe { syscall6(libc::SYS_clock_gettime, [libc::CLOCK_MONOTONIC as u64, &mut ts as *mut libc::timespec as u64, 0, 0, 0, 0]) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The bit of `sig` in a kernel signal set.
pub(crate) fn sigbit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}
