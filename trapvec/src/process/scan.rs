//! Where are the other threads? Queue the scan signal to every thread of the process and collect
//! whether any interrupted RIP lies in a set of ranges. Used to wait until no thread is inside a
//! window about to be rewritten, or inside code about to be freed.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::TargetError;
use crate::process::signal::{scan_signal, SCAN_ACKS, SCAN_GEN, SCAN_HIT, SCAN_HIT_RIP, SCAN_RANGES};

static SCANNER: Mutex<()> = Mutex::new(());

fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn thread_ids() -> Result<Vec<libc::pid_t>, TargetError> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| TargetError::os("listing /proc/self/task", e))?;
    Ok(dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

fn thread_alive(tid: libc::pid_t) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}

/// One scan of the published [`SCAN_RANGES`]: `Ok(None)` if no other thread's RIP is in them,
/// `Ok(Some(rip))` for one that is.
fn scan_once() -> Result<Option<u64>, TargetError> {
    let me = gettid();
    let pid = std::process::id() as libc::pid_t;
    let generation = SCAN_GEN.fetch_add(1, SeqCst) + 1;
    SCAN_HIT.store(false, SeqCst);
    SCAN_ACKS.store(0, SeqCst);
    let mut sent = Vec::new();
    for tid in thread_ids()? {
        if tid == me {
            continue;
        }
        // SAFETY: zeroed siginfo is a valid base; we fill the fields rt_tgsigqueueinfo reads.
        let mut si: libc::siginfo_t = unsafe { std::mem::zeroed() };
        si.si_signo = scan_signal();
        si.si_code = libc::SI_QUEUE;
        // SAFETY: for SI_QUEUE the kernel's siginfo layout has pid, uid, then the sigval at
        // offset 24 on x86-64 (`_sifields._rt`); libc exposes no setter, so write it in place.
        unsafe {
            let base = (&mut si as *mut libc::siginfo_t).cast::<u8>();
            *base.add(16).cast::<u32>() = pid as u32;
            *base.add(24).cast::<u64>() = generation;
        }
        // SAFETY: a raw syscall with a valid siginfo pointer.
        let r = unsafe { libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, scan_signal(), &si as *const libc::siginfo_t) };
        if r == 0 {
            sent.push(tid);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut spins = 0u32;
    while SCAN_ACKS.load(SeqCst) < sent.len() {
        spins += 1;
        if spins.is_multiple_of(64) {
            // Threads that exited will never answer.
            sent.retain(|&t| thread_alive(t));
            if Instant::now() > deadline {
                return Err(TargetError::Quiesce(format!(
                    "threads {sent:?} did not answer the scan signal (SIGRTMAX-1) within 5 s; is it blocked?"
                )));
            }
        }
        if spins < 200 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    Ok(SCAN_HIT.load(SeqCst).then(|| SCAN_HIT_RIP.load(SeqCst)))
}

/// Wait until no other thread's RIP lies in `ranges` (`[start, end)`), re-scanning with short
/// sleeps; give up after `timeout` with an error naming the address a thread was stuck at.
pub(crate) fn wait_until_outside(ranges: &[(u64, u64)], timeout: Duration) -> Result<(), TargetError> {
    if ranges.is_empty() {
        return Ok(());
    }
    let _one = SCANNER.lock().unwrap_or_else(|e| e.into_inner());
    let mut sorted: Vec<(u64, u64)> = ranges.iter().copied().filter(|(s, e)| s < e).collect();
    sorted.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    SCAN_RANGES.replace(Some(merged));
    let start = Instant::now();
    let mut pause = Duration::from_micros(10);
    let result = loop {
        match scan_once() {
            Err(e) => break Err(e),
            Ok(None) => break Ok(()),
            Ok(Some(rip)) => {
                if start.elapsed() > timeout {
                    break Err(TargetError::Quiesce(format!(
                        "a thread is still executing at {rip:#x} after {timeout:?}"
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
        }
    };
    SCAN_RANGES.replace(None);
    result
}
