//! Where are the other threads? Queue the scan signal to every thread of the process and collect
//! whether any interrupted RIP lies in a set of ranges. Used to wait until no thread is inside a
//! window about to be rewritten, or inside code about to be freed.
//!
//! [`Scan::new`] does everything that allocates or takes a lock (publishing the ranges, reserving
//! the thread list); [`Scan::wait`] then enters no libc function at all (raw system calls,
//! preallocated buffers), because the text writer calls it while a transient `CC` sits in some
//! function that may be `malloc`, `syscall`, `nanosleep` or `readdir` itself.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::error::TargetError;
use crate::process::signal::{
    scan_signal, scan_value, SCAN_ACKS, SCAN_GEN, SCAN_HIT, SCAN_HIT_RIP, SCAN_RANGES,
};
use crate::process::sys;

pub(crate) static SCANNER: Mutex<()> = Mutex::new(());

/// Why a [`Scan::wait`] gave up (formatted by the caller, outside any `CC` window).
#[derive(Debug)]
pub(crate) enum Stuck {
    /// Threads that did not answer the scan signal (the first of them, how many).
    Unanswered { tid: i32, count: usize },
    /// A thread was still executing at this address when the time was up.
    At(u64),
    /// More threads than the list reserved in [`Scan::new`].
    TooManyThreads(usize),
    /// `/proc/self/task` could not be read (errno).
    TaskList(i64),
}

impl Stuck {
    pub(crate) fn into_error(self, timeout: Duration) -> TargetError {
        TargetError::Quiesce(match self {
            Stuck::Unanswered { tid, count } => format!(
                "{count} thread(s), first {tid}, did not answer the scan signal ({}) within {timeout:?}; is it blocked?",
                scan_signal()
            ),
            Stuck::At(rip) => format!("a thread is still executing at {rip:#x} after {timeout:?}"),
            Stuck::TooManyThreads(n) => format!("more than {n} threads appeared during a scan"),
            Stuck::TaskList(e) => format!("reading /proc/self/task: {}", std::io::Error::from_raw_os_error(e as i32)),
        })
    }
}

/// A prepared scan over published ranges; dropping it unpublishes them.
pub(crate) struct Scan {
    _one: MutexGuard<'static, ()>,
    tids: Vec<i32>,
    sent: Vec<i32>,
    dirbuf: Vec<u8>,
}

impl Scan {
    /// Publish `ranges` (`[start, end)`) and reserve everything [`Scan::wait`] needs; `None`
    /// when there is nothing to scan.
    pub(crate) fn new(ranges: &[(u64, u64)]) -> Result<Option<Scan>, TargetError> {
        if ranges.is_empty() {
            return Ok(None);
        }
        let one = SCANNER.lock().unwrap_or_else(|e| e.into_inner());
        let mut sorted: Vec<(u64, u64)> = ranges.iter().copied().filter(|(s, e)| s < e).collect();
        sorted.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
        for (s, e) in sorted {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        let threads = std::fs::read_dir("/proc/self/task")
            .map_err(|e| TargetError::os("listing /proc/self/task", e))?
            .count();
        let room = threads * 4 + 1024;
        SCAN_RANGES.replace(Some(merged));
        Ok(Some(Scan {
            _one: one,
            tids: Vec::with_capacity(room),
            sent: Vec::with_capacity(room),
            dirbuf: vec![0; 32 << 10],
        }))
    }

    /// The thread ids of this process, into the reserved list, by raw `openat`/`getdents64`.
    fn list_threads(&mut self) -> Result<(), Stuck> {
        self.tids.clear();
        // SAFETY: a NUL-terminated path; flags only.
        let fd = unsafe {
            sys::syscall6(
                libc::SYS_openat,
                [
                    libc::AT_FDCWD as u64,
                    c"/proc/self/task".as_ptr() as u64,
                    (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
                    0,
                    0,
                    0,
                ],
            )
        };
        if fd < 0 {
            return Err(Stuck::TaskList(-fd));
        }
        let result = loop {
            // SAFETY: `dirbuf` is writable for its length.
            let n = unsafe {
                sys::syscall6(
                    libc::SYS_getdents64,
                    [
                        fd as u64,
                        self.dirbuf.as_mut_ptr() as u64,
                        self.dirbuf.len() as u64,
                        0,
                        0,
                        0,
                    ],
                )
            };
            if n < 0 {
                break Err(Stuck::TaskList(-n));
            }
            if n == 0 {
                break Ok(());
            }
            let mut off = 0usize;
            while off < n as usize {
                // linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name[].
                let reclen =
                    u16::from_ne_bytes([self.dirbuf[off + 16], self.dirbuf[off + 17]]) as usize;
                let mut tid: i64 = 0;
                let mut digits = 0;
                for &b in &self.dirbuf[off + 19..off + reclen] {
                    if !b.is_ascii_digit() {
                        break;
                    }
                    tid = tid * 10 + i64::from(b - b'0');
                    digits += 1;
                }
                if digits > 0 && self.dirbuf[off + 19 + digits] == 0 {
                    if self.tids.len() == self.tids.capacity() {
                        break;
                    }
                    self.tids.push(tid as i32);
                }
                off += reclen;
            }
            if self.tids.len() == self.tids.capacity() {
                break Err(Stuck::TooManyThreads(self.tids.capacity()));
            }
        };
        // SAFETY: closing the fd opened above.
        unsafe { sys::syscall6(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0]) };
        result
    }

    /// One scan: `Ok(None)` if no other thread's RIP is in the ranges, `Ok(Some(rip))` for one
    /// that is.
    fn scan_once(&mut self, deadline_ns: u64) -> Result<Option<u64>, Stuck> {
        let me = sys::gettid();
        let pid = sys::getpid();
        let generation = SCAN_GEN.fetch_add(1, SeqCst) + 1;
        SCAN_HIT.store(false, SeqCst);
        SCAN_ACKS.store(0, SeqCst);
        self.list_threads()?;
        self.sent.clear();
        // The kernel's siginfo for SI_QUEUE: signo, errno, code, then pid, uid at 16 and the
        // sigval at 24 (`_sifields._rt`); built by hand, libc exposes no setter.
        let mut si = [0u64; 16];
        si[0] = scan_signal() as u32 as u64;
        si[1] = libc::SI_QUEUE as u32 as u64;
        si[2] = pid as u32 as u64;
        si[3] = scan_value(generation);
        for i in 0..self.tids.len() {
            let tid = self.tids[i];
            if tid == me {
                continue;
            }
            // SAFETY: a valid 128-byte siginfo.
            let r = unsafe {
                sys::syscall6(
                    libc::SYS_rt_tgsigqueueinfo,
                    [
                        pid as u64,
                        tid as u64,
                        scan_signal() as u64,
                        si.as_ptr() as u64,
                        0,
                        0,
                    ],
                )
            };
            if r == 0 {
                self.sent.push(tid);
            }
        }
        let mut spins = 0u32;
        while SCAN_ACKS.load(SeqCst) < self.sent.len() {
            spins += 1;
            if spins.is_multiple_of(64) {
                // Threads that exited will never answer.
                self.sent.retain(|&t| sys::tgkill(t, 0) == 0);
                if sys::monotonic_ns() > deadline_ns && SCAN_ACKS.load(SeqCst) < self.sent.len() {
                    return Err(Stuck::Unanswered {
                        tid: self.sent.first().copied().unwrap_or(0),
                        count: self.sent.len(),
                    });
                }
            }
            if spins < 200 {
                std::hint::spin_loop();
            } else {
                sys::sleep_us(20);
            }
        }
        Ok(SCAN_HIT.load(SeqCst).then(|| SCAN_HIT_RIP.load(SeqCst)))
    }

    /// Wait until no other thread's RIP lies in the ranges, re-scanning with short sleeps; give
    /// up after `timeout`. Enters no libc function.
    pub(crate) fn wait(&mut self, timeout: Duration) -> Result<(), Stuck> {
        let start = sys::monotonic_ns();
        let deadline = start + timeout.as_nanos() as u64;
        let mut pause_us = 10;
        loop {
            match self.scan_once(deadline.max(sys::monotonic_ns() + 5_000_000_000))? {
                None => return Ok(()),
                Some(rip) => {
                    if sys::monotonic_ns() > deadline {
                        return Err(Stuck::At(rip));
                    }
                    sys::sleep_us(pause_us);
                    pause_us = (pause_us * 2).min(2000);
                }
            }
        }
    }
}

impl Drop for Scan {
    fn drop(&mut self) {
        SCAN_RANGES.replace(None);
    }
}

/// Wait until no other thread's RIP lies in `ranges` (`[start, end)`), re-scanning with short
/// sleeps; give up after `timeout` with an error naming the address a thread was stuck at.
pub(crate) fn wait_until_outside(
    ranges: &[(u64, u64)],
    timeout: Duration,
) -> Result<(), TargetError> {
    match Scan::new(ranges)? {
        None => Ok(()),
        Some(mut scan) => scan.wait(timeout).map_err(|s| s.into_error(timeout)),
    }
}
