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

#[test]
fn trace_with_p_expands_a_library_glob_over_the_library_the_process_maps() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = LoopFixture::start(dir.path());
    // main parses each command with strtoul. The glob stands for strtoul and strtoul_l
    // (strtoull, strtoumax and strtouq are strtoul's aliases: one function, one probe);
    // work(99) of the third command ends the trace.
    let (t, out, line) = p_trace(
        &f.pid,
        &[
            "-e",
            "libc.so.6:strtou* { @[func] = count() } work /arg0 == 99/ { exit() }",
        ],
    );
    assert!(line.starts_with("tracing 3 probe(s) in process "), "{line}");
    assert_eq!(f.work(5), "done 5");
    assert_eq!(f.work(5), "done 10");
    assert_eq!(f.work(100), "done 110");
    let rest = finished(t, out, &line);
    assert!(rest.contains("@[strtoul]: 3\n"), "{rest}");
    assert!(!rest.contains("strtoull"), "{rest}");
    // A library the process does not map is refused, named.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["-p", &f.pid, "trace", "-e", "libfx.so:fx_* { @ = count() }"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("process {} has no library libfx.so mapped", f.pid)),
        "{err}"
    );
    assert_eq!(f.work(5), "done 115");
}
