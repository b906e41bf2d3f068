//! trapd's latency for one splice request with nothing live and with many splices live (issue
//! 26, item 4): the state is a snapshot plus a log of changes, so storing a change does not
//! grow with the live count, and the planner asks indexes, so planning does not either.
//! Prints p50 and p99 (`--nocapture`; bench/README.md "trapd latency" quotes them) and asserts
//! what the state costs (with many live, no request rewrites the snapshot and each logs about
//! one splice's bytes) and that the latency grows by at most 2x.
//!
//! The fake kernel has four functions, so the live splices are copies of one real splice at
//! `f0` under fresh ids, stored as the module's snapshot before the daemon starts: the daemon
//! imports them as it would a big state (every one checked against the kernel) and keeps them
//! live while `f1` is spliced and unspliced again and again.

use std::path::Path;
use std::time::{Duration, Instant};

use instr_manager::plan::Mechanism;
use instr_manager::splicer::{Action, SpliceRequest, Splicer};
use serde_json::Value;
use trapvec::fake::FakeKernel;

use super::config::Config;
use super::daemon::Daemon;
use super::protocol::Request;

const CONFIG: &str = "initial_profile = \"clean\"\n[profile.clean]\n";

fn count(at: &str) -> SpliceRequest {
    SpliceRequest::new(at, Action::Count, Mechanism::Trap)
}

/// A fake kernel whose module holds a snapshot of `n` live splices (one real, at f0, and
/// copies of it); `n == 0`: nothing.
fn kernel_with(n: u64) -> FakeKernel {
    let k = FakeKernel::new();
    if n == 0 {
        return k;
    }
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f0")]).unwrap();
    let mut state: Value = serde_json::from_slice(&sp.export_state()).unwrap();
    let model = state["splices"][0].clone();
    let splices: Vec<Value> = (1..=n)
        .map(|id| {
            let mut s = model.clone();
            // A count splice is saved as a compact array, its id first.
            s[0] = id.into();
            s
        })
        .collect();
    state["splices"] = Value::Array(splices);
    state["next_splice"] = n.into();
    k.put_blob(k.blob().0, &serde_json::to_vec(&state).unwrap())
        .unwrap();
    k
}

/// What the splice requests (each followed by an unsplice, not timed) to one daemon took and
/// wrote.
struct Figures {
    p50: Duration,
    /// A tail that one burst of the machine's other load does not decide (the p99 of 300
    /// requests is the third slowest).
    p90: Duration,
    p99: Duration,
    /// Snapshots written in the module during the rounds.
    snapshots: u64,
    /// Bytes the state log grew by, per request (splice or unsplice).
    logged_per_request: u64,
    /// Bytes of the module's snapshot.
    snapshot_bytes: u64,
}

/// A daemon started over `k`, with what the rounds need to measure it.
struct Subject {
    k: FakeKernel,
    d: Daemon<FakeKernel>,
    live: usize,
    log: std::path::PathBuf,
    generation: u64,
    logged: u64,
    times: Vec<Duration>,
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

impl Subject {
    fn start(k: FakeKernel, journal: &Path) -> Self {
        let config = Config::parse(CONFIG, Path::new("trapd.toml")).unwrap();
        let mut d = Daemon::start(k.clone(), config, journal).unwrap();
        let live = d.handle(Request::List)["splices"].as_array().unwrap().len();
        let log = journal.with_extension("state");
        Subject {
            generation: k.blob().0,
            logged: file_len(&log),
            k,
            d,
            live,
            log,
            times: Vec::new(),
        }
    }

    /// One timed splice of `f1`, then its unsplice.
    fn round(&mut self) {
        let t = Instant::now();
        let r = self.d.handle(Request::Splice(count("f1")));
        self.times.push(t.elapsed());
        assert!(r.get("error").is_none(), "{r}");
        let r = self.d.handle(Request::Unsplice {
            at: Some("f1".into()),
            all: false,
        });
        assert_eq!(r["ok"], Value::Bool(true), "{r}");
    }

    fn figures(mut self) -> Figures {
        let rounds = self.times.len();
        let after = self.d.handle(Request::List)["splices"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(after, self.live, "the live count stayed {}", self.live);
        Figures {
            p50: percentile(&mut self.times, 50),
            p90: percentile(&mut self.times, 90),
            p99: percentile(&mut self.times, 99),
            snapshots: self.k.blob().0 - self.generation,
            logged_per_request: file_len(&self.log).saturating_sub(self.logged)
                / (2 * rounds as u64),
            snapshot_bytes: self.k.blob().1.len() as u64,
        }
    }
}

/// The `pct`th percentile of `times` (sorted in place).
fn percentile(times: &mut [Duration], pct: usize) -> Duration {
    times.sort_unstable();
    times[(times.len() * pct / 100).min(times.len() - 1)]
}

fn live_count() -> u64 {
    std::env::var("TRAPD_LATENCY_LIVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// The figures with nothing live and with [`live_count`] live, printed. The two daemons take
/// turns, one round each, so that the machine's other load falls on both alike.
fn measure(rounds: usize) -> (Figures, Figures, u64) {
    let n = live_count();
    let dir = tempfile::tempdir().unwrap();
    let mut zero = Subject::start(kernel_with(0), &dir.path().join("j0"));
    let mut big = Subject::start(kernel_with(n), &dir.path().join("jn"));
    for _ in 0..rounds {
        zero.round();
        big.round();
    }
    let (zero, big) = (zero.figures(), big.figures());
    eprintln!(
        "trapd splice latency, {rounds} requests each, interleaved: 0 live p50 {:?} p90 {:?} \
         p99 {:?}; {n} live p50 {:?} p90 {:?} p99 {:?}; state written per request at {n} \
         live: {} bytes logged, {} snapshot(s) of {} bytes",
        zero.p50,
        zero.p90,
        zero.p99,
        big.p50,
        big.p90,
        big.p99,
        big.logged_per_request,
        big.snapshots,
        big.snapshot_bytes
    );
    (zero, big, n)
}

#[test]
fn one_splice_request_with_100000_live_logs_one_splice_and_rewrites_no_snapshot() {
    let (_, big, n) = measure(100);
    assert_eq!(big.snapshots, 0, "a request rewrote the whole state");
    assert!(
        // A compact count splice's line (~240 bytes) and an unsplice's (~50), on average.
        (100..4096).contains(&big.logged_per_request),
        "{} bytes logged per request at {n} live",
        big.logged_per_request
    );
    assert!(big.logged_per_request * 1000 < big.snapshot_bytes);
}

/// The goal of issue 26, item 4, as checked where it is measured: with `n` live, a splice
/// request's median and p90 are at most 2x what they are with none. An error names each figure
/// that grew more. The p99 is printed, not judged: of 300 requests it is the third slowest, an
/// `fsync` stalled by the other load on the 2 shared cores, which falls on either daemon (runs
/// here gave 0 live 60 ms against 100,000 live 28 ms, and the reverse).
fn within_2x(zero: &Figures, big: &Figures, n: u64) -> Result<(), String> {
    let grew: Vec<String> = [("p50", zero.p50, big.p50), ("p90", zero.p90, big.p90)]
        .into_iter()
        .filter(|(_, z, b)| *b > 2 * *z)
        .map(|(what, z, b)| {
            format!(
                "{what} grew {:.2}x, from {z:?} with 0 live to {b:?} with {n} live",
                b.as_secs_f64() / z.as_secs_f64().max(1e-9)
            )
        })
        .collect();
    if grew.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "trapd's splice latency grew by more than 2x: {}",
            grew.join("; ")
        ))
    }
}

/// One splice request costs at most 2x with 100,000 live what it costs with none, for
/// requests interleaved between the two daemons ([`within_2x`]).
#[test]
fn one_splice_request_costs_at_most_2x_with_100000_live() {
    let (zero, big, n) = measure(300);
    within_2x(&zero, &big, n).unwrap();
}

/// The check passes at 2x, fails on a figure over 2x and names it: a p50 of 2.1x, then a p90 of
/// 3x; a p99 of 20x is not judged.
#[test]
fn the_2x_check_fails_on_a_figure_that_grew_more() {
    let ms = Duration::from_millis;
    let figures = |p50, p90, p99| Figures {
        p50: ms(p50),
        p90: ms(p90),
        p99: ms(p99),
        snapshots: 0,
        logged_per_request: 200,
        snapshot_bytes: 1 << 20,
    };
    let zero = figures(10, 20, 30);
    assert_eq!(within_2x(&zero, &figures(20, 40, 60), 100_000), Ok(()));
    // The p99 is not judged.
    assert_eq!(within_2x(&zero, &figures(20, 40, 600), 100_000), Ok(()));
    let e = within_2x(&zero, &figures(21, 40, 60), 100_000).unwrap_err();
    assert!(
        e.contains("p50 grew 2.10x, from 10ms with 0 live to 21ms with 100000 live"),
        "{e}"
    );
    assert!(!e.contains("p90"), "{e}");
    let e = within_2x(&zero, &figures(20, 60, 60), 100_000).unwrap_err();
    assert!(e.contains("p90 grew 3.00x"), "{e}");
    assert!(!e.contains("p50"), "{e}");
}
