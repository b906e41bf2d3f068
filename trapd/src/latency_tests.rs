//! trapd's latency for one splice request with nothing live and with many splices live (issue
//! 26, item 4): the state is a snapshot plus a log of changes, so storing a change does not
//! grow with the live count. Prints p50 and p99 (`--nocapture`; bench/README.md "trapd
//! latency" quotes them) and asserts what the state costs: with many live, no request rewrites
//! the snapshot and each logs about one splice's bytes. That the whole latency grows by at most
//! 2x is asserted by an ignored test: it does not hold yet (see bench/README.md).
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
            s["id"] = id.into();
            s
        })
        .collect();
    state["splices"] = Value::Array(splices);
    state["next_splice"] = n.into();
    k.put_blob(k.blob().0, &serde_json::to_vec(&state).unwrap())
        .unwrap();
    k
}

/// What `rounds` splice requests (each followed by an unsplice, not timed) to a daemon started
/// over `k` took and wrote.
struct Figures {
    p50: Duration,
    p99: Duration,
    /// Snapshots written in the module during the rounds.
    snapshots: u64,
    /// Bytes the state log grew by, per request (splice or unsplice).
    logged_per_request: u64,
    /// Bytes of the module's snapshot.
    snapshot_bytes: u64,
}

fn splice_latency(k: &FakeKernel, journal: &Path, rounds: usize) -> Figures {
    let config = Config::parse(CONFIG, Path::new("trapd.toml")).unwrap();
    let mut d = Daemon::start(k.clone(), config, journal).unwrap();
    let live = d.handle(Request::List)["splices"].as_array().unwrap().len();
    let log = journal.with_extension("state");
    let log_len = || std::fs::metadata(&log).map_or(0, |m| m.len());
    let (generation, logged) = (k.blob().0, log_len());
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        let r = d.handle(Request::Splice(count("f1")));
        times.push(t.elapsed());
        assert!(r.get("error").is_none(), "{r}");
        let r = d.handle(Request::Unsplice {
            at: Some("f1".into()),
            all: false,
        });
        assert_eq!(r["ok"], Value::Bool(true), "{r}");
    }
    let snapshots = k.blob().0 - generation;
    let logged_per_request = log_len().saturating_sub(logged) / (2 * rounds as u64);
    let after = d.handle(Request::List)["splices"].as_array().unwrap().len();
    assert_eq!(after, live, "the live count stayed {live}");
    times.sort_unstable();
    Figures {
        p50: times[rounds / 2],
        p99: times[rounds * 99 / 100],
        snapshots,
        logged_per_request,
        snapshot_bytes: k.blob().1.len() as u64,
    }
}

fn live_count() -> u64 {
    std::env::var("TRAPD_LATENCY_LIVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// The figures with nothing live and with [`live_count`] live, printed.
fn measure(rounds: usize) -> (Figures, Figures, u64) {
    let n = live_count();
    let dir = tempfile::tempdir().unwrap();
    let zero = splice_latency(&kernel_with(0), &dir.path().join("j0"), rounds);
    let big = splice_latency(&kernel_with(n), &dir.path().join("jn"), rounds);
    eprintln!(
        "trapd splice latency, {rounds} requests: 0 live p50 {:?} p99 {:?}; {n} live p50 {:?} p99 {:?}; \
         state written per request at {n} live: {} bytes logged, {} snapshot(s) of {} bytes",
        zero.p50, zero.p99, big.p50, big.p99, big.logged_per_request, big.snapshots, big.snapshot_bytes
    );
    (zero, big, n)
}

#[test]
fn one_splice_request_with_100000_live_logs_one_splice_and_rewrites_no_snapshot() {
    let (_, big, n) = measure(100);
    assert_eq!(big.snapshots, 0, "a request rewrote the whole state");
    assert!(
        (200..4096).contains(&big.logged_per_request),
        "{} bytes logged per request at {n} live",
        big.logged_per_request
    );
    assert!(big.logged_per_request * 1000 < big.snapshot_bytes);
}

/// The goal of issue 26, item 4. Ignored: the planner's walks over the live splices are
/// indexed now, but the p50 still grows 10-40x at 100,000 live from a cost not yet found (see
/// bench/README.md "trapd latency"); run with `--ignored` to see where it stands.
#[test]
#[ignore = "still grows 10-40x with 100,000 live, cause not yet found (bench/README.md, trapd latency)"]
fn one_splice_request_costs_at_most_2x_with_100000_live() {
    let (zero, big, n) = measure(300);
    let (p50_0, p99_0, p50_n, p99_n) = (zero.p50, zero.p99, big.p50, big.p99);
    assert!(
        p50_n <= 2 * p50_0,
        "p50 grew from {p50_0:?} to {p50_n:?} with {n} live"
    );
    assert!(
        p99_n <= 2 * p99_0,
        "p99 grew from {p99_0:?} to {p99_n:?} with {n} live"
    );
}
