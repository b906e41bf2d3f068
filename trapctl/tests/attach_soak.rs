//! Attach, splice and detach the same busy process many times (`fixtures/attach/loop.c`: a
//! spinning thread, a thread blocked in read() on a FIFO, main blocked in read() on stdin):
//! no crash, the program's results right, the agent mapped once, and the process's descriptors
//! and mappings within a stated bound of what they were after the first attach.
//!
//! CI runs 50 cycles (a few seconds). The 1,000 of issue 30, with the figures printed:
//! `TRAPVEC_SOAK_CYCLES=1000 cargo test --release -p trapctl --test attach_soak -- --nocapture`
//! (after `cargo build --release -p trapvec-agent`).

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

/// Descriptors the process may hold beyond those after the first attach (none are expected:
/// the channel's listening socket is closed by each detach and made again by each attach).
const FD_SLACK: usize = 2;
/// Mapping lines likewise (glibc's allocator may split or add an arena's mapping).
const MAPS_SLACK: usize = 8;

mod attach_common;
use attach_common::{text, trapctl, LoopFixture};

/// The number after `key` in `s` (`key` then digits).
fn number_after(s: &str, key: &str) -> u64 {
    s.split(key)
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `{key}N` in `{s}`"))
}

fn percentile(v: &mut [u64], p: usize) -> u64 {
    v.sort_unstable();
    v[(v.len() - 1) * p / 100]
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn maps(pid: u32) -> (usize, usize) {
    let m = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let agent = m.lines().filter(|l| l.contains("libtrapvec_agent")).count();
    (m.lines().count(), agent)
}

#[test]
fn attach_splice_detach_the_same_busy_process_n_times_leaks_nothing() {
    let cycles: usize = std::env::var("TRAPVEC_SOAK_CYCLES")
        .ok()
        .map_or(50, |n| n.parse().expect("TRAPVEC_SOAK_CYCLES: a number"));
    let dir = tempfile::tempdir().unwrap();
    let mut f = LoopFixture::start(dir.path());
    // Let the threads reach their read() and their loop.
    std::thread::sleep(Duration::from_millis(100));
    let pid = f.child.id();
    let p = f.pid.clone();
    let (mut attach_us, mut held_p50, mut held_p99, mut detach_us) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut after_first = None;
    let mut total = 0;
    let start = Instant::now();
    for i in 0..cycles {
        let o = trapctl(&["-v", "-p", &p, "attach"]);
        assert!(o.status.success(), "cycle {i}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        // Figures printed: this attach loaded (the last detach's channel was gone when it
        // returned, not still accepting).
        assert!(err.contains("attach took "), "cycle {i}: {}", text(&o));
        attach_us.push(number_after(&err, "attach took "));
        held_p50.push(number_after(&err, "held stopped: p50 "));
        held_p99.push(number_after(&err, ", p99 "));
        if after_first.is_none() {
            after_first = Some((fds(pid), maps(pid)));
        }
        let o = trapctl(&["-p", &p, "splice", "work", "--count"]);
        assert!(o.status.success(), "cycle {i}: {}", text(&o));
        total += 3;
        assert_eq!(f.calls(3), total, "cycle {i}: the program's result");
        let t = Instant::now();
        let o = trapctl(&["-p", &p, "detach"]);
        detach_us.push(u64::try_from(t.elapsed().as_micros()).unwrap());
        assert!(o.status.success(), "cycle {i}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("1 splice(s) removed"),
            "cycle {i}: {}",
            text(&o)
        );
    }
    let took = start.elapsed();
    let (fds0, (maps0, agent0)) = after_first.unwrap();
    let (fds1, (maps1, agent1)) = (fds(pid), maps(pid));
    eprintln!(
        "{cycles} cycles in {:.1} s; attach (trapctl's figure) p50 {} µs, p99 {} µs; threads held p50 of p50s {} µs, p99 of p99s {} µs; detach (trapctl run, wall) p50 {} µs, p99 {} µs; fds {fds0} -> {fds1}; maps lines {maps0} -> {maps1}; agent maps lines {agent0} -> {agent1}",
        took.as_secs_f64(),
        percentile(&mut attach_us, 50),
        percentile(&mut attach_us, 99),
        percentile(&mut held_p50, 50),
        percentile(&mut held_p99, 99),
        percentile(&mut detach_us, 50),
        percentile(&mut detach_us, 99),
    );
    assert!(agent0 > 0, "the agent is mapped after the first attach");
    assert_eq!(
        agent1, agent0,
        "the agent mapped once, reused by every attach"
    );
    assert!(fds1 <= fds0 + FD_SLACK, "fds {fds0} -> {fds1}");
    assert!(maps1 <= maps0 + MAPS_SLACK, "maps {maps0} -> {maps1}");
    // Alive and correct: work() still counted right, the blocked reader gets its data whole.
    assert_eq!(f.calls(10), total + 10);
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("fifo"))
        .unwrap()
        .write_all(b"after the soak")
        .unwrap();
    let mut line = String::new();
    f.stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "read 14: after the soak");
    writeln!(f.stdin, "quit").unwrap();
    assert_eq!(f.child.wait().unwrap().code(), Some(0));
}
