//! Cycle measurement: `rdtsc` fenced with `lfence`, pinned to one CPU, medians over rounds.

use std::arch::x86_64::{__rdtscp, _mm_lfence, _rdtsc};

#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
}

/// Pin the calling thread to the CPU it runs on (less migration noise).
pub fn pin_to_one_cpu() {
    // SAFETY: plain libc calls with a zeroed, then filled, cpu set.
    unsafe {
        let Ok(cpu) = usize::try_from(libc::sched_getcpu()) else {
            return;
        };
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn now() -> u64 {
    // SAFETY: rdtsc/lfence are available on every x86-64 CPU.
    unsafe {
        _mm_lfence();
        let t = _rdtsc();
        _mm_lfence();
        t
    }
}

/// Cycles per call of `f` over one round of `iters` calls.
pub fn round(iters: u32, f: &mut impl FnMut()) -> f64 {
    let t0 = now();
    for _ in 0..iters {
        f();
    }
    (now() - t0) as f64 / f64::from(iters.max(1))
}

/// Cycles per call of `f`: `rounds` rounds of `iters` calls, median and 10th/90th percentiles.
pub fn measure(rounds: u32, iters: u32, mut f: impl FnMut()) -> Stats {
    for _ in 0..iters.min(100) {
        f();
    }
    stats((0..rounds.max(1)).map(|_| round(iters, &mut f)).collect())
}

/// Median and 10th/90th percentiles of per-round figures (at least one).
pub fn stats(mut per: Vec<f64>) -> Stats {
    if per.is_empty() {
        per.push(f64::NAN);
    }
    per.sort_by(f64::total_cmp);
    // Nearest-rank percentile of `pct` (0..=100): an index in [0, len - 1].
    let at = |pct: usize| per[(per.len() - 1) * pct / 100];
    Stats {
        median: at(50),
        p10: at(10),
        p90: at(90),
    }
}

/// TSC frequency in GHz, measured against the monotonic clock.
pub fn tsc_ghz() -> f64 {
    let mut aux = 0;
    let t = std::time::Instant::now();
    // SAFETY: rdtscp is available on every x86-64 CPU this runs on.
    let c0 = unsafe { __rdtscp(&mut aux) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: as above.
    let c1 = unsafe { __rdtscp(&mut aux) };
    (c1 - c0) as f64 / t.elapsed().as_nanos() as f64
}
