//! Return points: what a target needs to run a handler when a function returns, and the figures
//! it gives back (the types of the [`crate::Target`] contract; the process runtime is
//! [`crate::process::returns`]).
//!
//! A return point is kretprobe's shape. Its *entry half* is an ordinary call splice at the
//! function's entry whose handler is the target's entry routine ([`ReturnSlot::entry`]): it takes
//! an instance from a bounded pool, saves the real return address, the argument registers and
//! (for timers) the time in it, and replaces the return address on the stack with the address
//! of a stub that belongs to that instance. When the function returns (through any `ret`, or
//! through a function it tail-called) the CPU lands in the stub, which runs the return half: the
//! splice's handler with the return value in `rax`/`rdx` and the entry's arguments in a
//! [`crate::abi::TrapvecCall`], the timer's histogram, then the real return address.
//!
//! A call that never returns through the stub (left by `longjmp`, an exception caught above it,
//! a thread that exits inside it) leaves its instance behind; the next return through an older
//! instance of the same thread finds it above itself on the thread's list and drops it, counted
//! as missed. A call that finds the pool empty, or the splice's `maxactive` instances in use, or
//! the thread already inside the runtime (a return point reached from a handler or from a signal
//! handler that interrupted the runtime), runs without its return half and is counted as missed.

/// The clock a timer reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Clock {
    /// Elapsed (monotonic) time: time spent asleep or preempted counts.
    #[default]
    Wall,
    /// Time the thread was on a CPU: time asleep or preempted does not count.
    Cpu,
}

impl Clock {
    pub fn name(self) -> &'static str {
        match self {
            Clock::Wall => "wall",
            Clock::Cpu => "cpu",
        }
    }
}

impl std::str::FromStr for Clock {
    type Err = String;
    fn from_str(s: &str) -> Result<Clock, String> {
        match s {
            "wall" => Ok(Clock::Wall),
            "cpu" => Ok(Clock::Cpu),
            other => Err(format!("unknown clock `{other}` (wall or cpu)")),
        }
    }
}

/// Instances one return point may hold at once unless it says otherwise (kretprobe's
/// `maxactive`): calls in progress at the same time, in every thread together.
pub const DEFAULT_MAXACTIVE: u32 = 256;

/// What the return half of a return point does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReturnConfig {
    /// `void handler(struct trapvec_regs *, struct trapvec_call *)`, or 0 (count or time only).
    pub handler: u64,
    /// Handed to the handler in `trapvec_call.cookie`.
    pub cookie: u64,
    /// Most instances in use at once (calls in progress); more are counted as missed.
    pub maxactive: u32,
    /// Time each call with this clock into a histogram.
    pub clock: Option<Clock>,
}

/// A return point's place in a target's return runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReturnSlot {
    /// The slot's index in the runtime.
    pub index: u32,
    /// The entry half: the handler of the call splice at the function's entry.
    pub entry: u64,
    /// The cookie of that call splice.
    pub cookie: u64,
}

/// Buckets of a [`Histogram`]: bucket 0 holds 0, bucket `k` holds `[2^(k-1), 2^k)`.
pub const HISTOGRAM_BUCKETS: usize = 65;

/// Figures of a return point since it was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ReturnStats {
    /// Returns that ran the return half.
    pub returns: u64,
    /// Calls without their return half: no instance free, `maxactive` reached, reentry, or
    /// left without returning (counted when found).
    pub missed: u64,
    /// Calls in progress now (instances in use).
    pub active: u64,
    /// The timer's figures, for a timed return point.
    pub histogram: Option<Histogram>,
}

/// A log2 histogram of durations in nanoseconds (bpftrace's `hist()`), with the exact sum and
/// maximum.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Histogram {
    /// [`HISTOGRAM_BUCKETS`] counts (see there for the ranges).
    pub buckets: Vec<u64>,
    pub sum: u64,
    pub max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: vec![0; HISTOGRAM_BUCKETS],
            sum: 0,
            max: 0,
        }
    }
}

/// The bucket of a value: 0 for 0, else one more than the index of its highest set bit.
pub fn bucket_of(v: u64) -> usize {
    (u64::BITS - v.leading_zeros()) as usize
}

/// The values bucket `k` holds: `[lo, hi)` (`hi` saturates at `u64::MAX`).
pub fn bucket_range(k: usize) -> (u64, u64) {
    match k {
        0 => (0, 1),
        64.. => (1 << 63, u64::MAX),
        k => (1 << (k - 1), 1 << k),
    }
}

impl Histogram {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Mean in nanoseconds (0 with no calls).
    pub fn mean(&self) -> u64 {
        self.sum.checked_div(self.count()).unwrap_or(0)
    }

    /// The `p`-th percentile (0 < p ≤ 100) as the upper end of the bucket it falls in (the
    /// histogram keeps no finer detail), never above the maximum; 0 with no calls.
    pub fn percentile(&self, p: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        // The rank of the p-th percentile, 1-based (nearest rank).
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a rank between 1 and n, clamped"
        )]
        let rank = ((p / 100.0 * n as f64).ceil().max(1.0) as u64).clamp(1, n);
        let mut seen = 0;
        for (k, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return (bucket_range(k).1 - 1).min(self.max);
            }
        }
        self.max
    }

    /// The histogram as bpftrace prints `hist()`: one line per bucket from the first non-empty
    /// to the last, `[lo, hi)  count |@@@@   |`, with the range in ns, us, ms or s.
    pub fn render(&self) -> String {
        let first = self.buckets.iter().position(|&c| c > 0);
        let last = self.buckets.iter().rposition(|&c| c > 0);
        let (Some(first), Some(last)) = (first, last) else {
            return String::from("(no calls)\n");
        };
        let top = self.buckets.iter().copied().max().unwrap_or(1).max(1);
        let mut out = String::new();
        for k in first..=last {
            let (lo, hi) = bucket_range(k);
            let range = if k == 0 {
                "[0]".to_string()
            } else if k == 1 {
                "[1]".to_string()
            } else {
                format!("[{}, {})", human(lo), human(hi))
            };
            let c = self.buckets[k];
            let bar = "@".repeat(usize::try_from((c * 52).div_ceil(top)).unwrap_or(52));
            out.push_str(&format!("{range:<18} {c:>9} |{bar:<52}|\n"));
        }
        out
    }
}

/// A histogram as reports show it (JSON): the figures, and the non-empty buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HistogramSummary {
    pub count: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub sum_ns: u64,
    /// `[lo, hi)` in ns and the calls that took that long, lowest first, empty ones left out.
    pub buckets: Vec<SummaryBucket>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SummaryBucket {
    pub lo: u64,
    pub hi: u64,
    pub count: u64,
}

impl Histogram {
    pub fn summary(&self) -> HistogramSummary {
        HistogramSummary {
            count: self.count(),
            mean_ns: self.mean(),
            p50_ns: self.percentile(50.0),
            p99_ns: self.percentile(99.0),
            max_ns: self.max,
            sum_ns: self.sum,
            buckets: (0..self.buckets.len())
                .filter(|&k| self.buckets[k] > 0)
                .map(|k| {
                    let (lo, hi) = bucket_range(k);
                    SummaryBucket {
                        lo,
                        hi,
                        count: self.buckets[k],
                    }
                })
                .collect(),
        }
    }
}

/// A duration in ns in bpftrace's short units (`512`, `4K`, `16M`): powers of 1024 as bpftrace
/// writes them, with `ns` understood.
fn human(ns: u64) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = ns;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v}{}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_ranges_that_hold_their_values() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!((bucket_of(2), bucket_of(3)), (2, 2));
        assert_eq!(bucket_of(1_000_000), 20);
        assert_eq!(bucket_of(u64::MAX), 64);
        for v in [
            0u64,
            1,
            2,
            3,
            4,
            1023,
            1024,
            999_999,
            20_000_000,
            u64::MAX / 3,
        ] {
            let (lo, hi) = bucket_range(bucket_of(v));
            assert!(lo <= v && (v < hi || hi == u64::MAX), "{v} in [{lo}, {hi})");
        }
    }

    #[test]
    fn percentiles_mean_and_rendering_come_from_the_buckets() {
        let mut h = Histogram::default();
        // 90 calls of ~1 ms, 10 of ~20 ms.
        for _ in 0..90 {
            h.buckets[bucket_of(1_100_000)] += 1;
            h.sum += 1_100_000;
        }
        for _ in 0..10 {
            h.buckets[bucket_of(20_500_000)] += 1;
            h.sum += 20_500_000;
        }
        h.max = 20_500_000;
        assert_eq!(h.count(), 100);
        assert_eq!(h.mean(), 3_040_000);
        assert_eq!(h.percentile(50.0), (1 << 21) - 1);
        assert_eq!(h.percentile(99.0), 20_500_000, "capped at the max");
        let text = h.render();
        assert!(text.starts_with("[1M, 2M)"), "{text}");
        assert!(text.contains("[16M, 32M)"), "{text}");
        assert_eq!(text.lines().count(), 5, "{text}");
        assert_eq!(Histogram::default().render(), "(no calls)\n");
        let sum = h.summary();
        assert_eq!(
            (sum.count, sum.mean_ns, sum.max_ns),
            (100, 3_040_000, 20_500_000)
        );
        assert_eq!(
            sum.buckets,
            [
                SummaryBucket {
                    lo: 1 << 20,
                    hi: 1 << 21,
                    count: 90
                },
                SummaryBucket {
                    lo: 1 << 24,
                    hi: 1 << 25,
                    count: 10
                }
            ]
        );
    }
}
