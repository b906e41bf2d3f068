//! `trapctl -p PID trace` with a program trapctl reads while it runs (issue 29): a probe's
//! printf lines and its exit() in a running process (tests/fixtures/attach/loop.c: "N" calls
//! work(i) for i in 0..N; a spinner thread calls spin() without end), which goes on afterwards.
//! Needs cc and the built agent.

mod attach_common;
use attach_common::{finished, p_trace, LoopFixture};

#[test]
fn trace_with_p_prints_a_probes_lines_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = LoopFixture::start(dir.path());
    let (t, out, line) = p_trace(
        &f.pid,
        &[
            "-e",
            "work /arg0 % 10 == 3/ { printf(\"work %d -> %d\\n\", arg0, arg0 * 3 + 1) }",
            "--seconds",
            "3",
        ],
    );
    assert!(line.starts_with("tracing 1 probe(s) in process "), "{line}");
    assert_eq!(f.work(100), "done 100");
    let rest = finished(t, out, &line);
    let lines: Vec<&str> = rest.lines().filter(|l| l.starts_with("work ")).collect();
    let want: Vec<String> = (0..10)
        .map(|k| format!("work {0} -> {1}", 10 * k + 3, 3 * (10 * k + 3) + 1))
        .collect();
    assert_eq!(lines, want, "{rest}");
    // The process goes on.
    assert_eq!(f.work(5), "done 105");
}

#[test]
fn trace_with_p_ends_at_a_probes_exit_and_counts_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = LoopFixture::start(dir.path());
    let start = std::time::Instant::now();
    // The spinner thread calls spin() without end: only exit() ends this trace.
    let (t, out, line) = p_trace(&f.pid, &["-e", "spin { @spins = count(); exit() }"]);
    assert!(line.contains("until Ctrl-C"), "{line}");
    let rest = finished(t, out, &line);
    assert!(rest.contains("@spins: 1\n"), "{rest}");
    assert!(start.elapsed().as_secs() < 30, "{:?}", start.elapsed());
    assert_eq!(f.work(5), "done 5");
}
