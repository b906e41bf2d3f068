//! Keyed counts in a process (see [`crate::keyed`]): [`SLOTS`] slots of [`TABLE`] entries each,
//! filled lock-free (an entry's key is claimed with a compare-and-swap, its count is an atomic
//! add), keyed by the thread id (`tid`, cached per thread), the process id (`pid`, one key) or
//! the CPU (`sched_getcpu`, the vDSO).

use std::cell::Cell;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Mutex;

use crate::abi::TrapvecRegs;
use crate::error::TargetError;
use crate::keyed::{KeyBy, KeyCount, KeyCounts, KeySlot};

/// Keyed counts live at once in the process.
pub const SLOTS: usize = 64;
/// Keys one keyed count holds; hits of further keys are counted as overflow.
pub const TABLE: usize = 256;

struct Slot {
    live: AtomicBool,
    /// 0: tid, 1: cpu, 2: pid.
    by: AtomicU32,
    /// Key + 1 of each entry (0: free).
    keys: [AtomicU64; TABLE],
    counts: [AtomicU64; TABLE],
    overflow: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            live: AtomicBool::new(false),
            by: AtomicU32::new(0),
            keys: [const { AtomicU64::new(0) }; TABLE],
            counts: [const { AtomicU64::new(0) }; TABLE],
            overflow: AtomicU64::new(0),
        }
    }
}

static SLOT: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];
static SLOTS_LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    /// This thread's id, once asked (0: not yet).
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> u64 {
    let t = TID.get();
    if t != 0 {
        return u64::from(t);
    }
    // SAFETY: gettid has no arguments and cannot fail; async-signal-safe.
    let t = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    TID.set(t);
    u64::from(t)
}

fn pid() -> u64 {
    // The raw system call (not glibc's getpid, which may be the spliced function itself), not
    // cached: a child of fork() inherits the spliced text and is another process.
    u64::from(super::sys::getpid() as u32)
}

fn cpu() -> u64 {
    // SAFETY: sched_getcpu takes no arguments (the vDSO); -1 only where the kernel cannot say.
    let c = unsafe { libc::sched_getcpu() };
    u64::try_from(c).unwrap_or(u64::MAX - 1)
}

/// The counting routine, a call handler: `cookie` is the slot's index.
extern "C" fn kc_hit(_regs: *mut TrapvecRegs, cookie: u64) {
    let Some(s) = SLOT.get(cookie as usize) else {
        return;
    };
    let key = match s.by.load(Relaxed) {
        1 => cpu(),
        2 => pid(),
        _ => tid(),
    };
    let tag = key.wrapping_add(1);
    // Fibonacci hashing into the table, then linear probing over all of it.
    let start = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % TABLE;
    for k in 0..TABLE {
        let i = (start + k) % TABLE;
        let cur = s.keys[i].load(Acquire);
        if cur == tag {
            s.counts[i].fetch_add(1, Relaxed);
            return;
        }
        if cur == 0 {
            match s.keys[i].compare_exchange(0, tag, AcqRel, Acquire) {
                Ok(_) => {
                    s.counts[i].fetch_add(1, Relaxed);
                    return;
                }
                Err(other) if other == tag => {
                    s.counts[i].fetch_add(1, Relaxed);
                    return;
                }
                Err(_) => {}
            }
        }
    }
    s.overflow.fetch_add(1, Relaxed);
}

/// Take a slot for a keyed count by `by` (a process counts by `tid`, `pid` or `cpu`).
pub(crate) fn alloc_slot(by: KeyBy) -> Result<KeySlot, TargetError> {
    let code = match by {
        KeyBy::Tid => 0,
        KeyBy::Cpu => 1,
        KeyBy::Pid => 2,
        KeyBy::Comm => {
            return Err(TargetError::Unsupported {
                what: "counts by comm (a kernel key)",
                target: "a process".into(),
            })
        }
    };
    let _l = SLOTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some(i) = SLOT.iter().position(|s| !s.live.load(Relaxed)) else {
        return Err(TargetError::Other(format!(
            "all {SLOTS} keyed-count slots of the process are in use"
        )));
    };
    let s = &SLOT[i];
    for (k, c) in s.keys.iter().zip(&s.counts) {
        k.store(0, Relaxed);
        c.store(0, Relaxed);
    }
    s.overflow.store(0, Relaxed);
    s.by.store(code, Relaxed);
    s.live.store(true, Release);
    Ok(KeySlot {
        index: i as u32,
        entry: kc_hit as *const () as u64,
        cookie: i as u64,
    })
}

/// Give a slot back once no thread can be in its counting routine (the splice is quiescent).
pub(crate) fn free_slot(slot: &KeySlot) {
    let _l = SLOTS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = SLOT.get(slot.index as usize) {
        s.live.store(false, Release);
    }
}

/// The table of a live slot, most hits first.
pub(crate) fn counts(slot: &KeySlot) -> Option<KeyCounts> {
    let s = SLOT.get(slot.index as usize)?;
    if !s.live.load(Acquire) {
        return None;
    }
    let keys = s
        .keys
        .iter()
        .zip(&s.counts)
        .filter_map(|(k, c)| {
            let tag = k.load(Acquire);
            (tag != 0).then(|| KeyCount {
                key: (tag - 1).to_string(),
                count: c.load(Relaxed),
            })
        })
        .collect();
    Some(
        KeyCounts {
            keys,
            overflow: s.overflow.load(Relaxed),
        }
        .sorted(),
    )
}
