//! `trapctl -p PID trace -e PROGRAM` (issue 30) and `--seconds N` on process traces (issue 29):
//! a program run in a running process (tests/fixtures/attach/loop.c: "N" calls work() N times),
//! its maps printed when the time is up or when the process exits, the process's text exactly
//! as before afterwards; and a command started under the agent whose maps are read after N
//! seconds before it is killed. Needs cc and the built agent.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

mod attach_common;
use attach_common::{
    agent, cc, changed, finished, mappings, p_trace, text, LoopFixture as Fixture,
};

#[test]
fn trace_with_p_counts_the_calls_made_while_it_holds_and_leaves_the_text_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::start(dir.path());
    let before = mappings(&f.pid);
    assert!(
        before.iter().any(|(l, _)| l.contains("libc")),
        "libc's text among {:?}",
        before.iter().map(|(l, _)| l).collect::<Vec<_>>()
    );
    assert_eq!(
        f.work(7),
        "done 7",
        "calls before the trace are not counted"
    );
    let (t, out, line) = p_trace(
        &f.pid,
        &[
            "-e",
            "work { @calls = count(); @sum = sum(arg0); @odd[arg0 & 1] = count() }",
            "--seconds",
            "3",
        ],
    );
    assert!(
        line.starts_with("tracing 1 probe(s) in process ") && line.contains(&f.pid),
        "{line}"
    );
    assert!(
        changed(&f.pid, &before).is_some_and(|(r, _)| r.contains("/loop")),
        "the probes' traps are in the program's text"
    );
    // work(i) for i in 0..100: the arguments add up to 4950, half of them odd.
    assert_eq!(f.work(100), "done 107");
    let rest = finished(t, out, &line);
    assert!(rest.contains("@calls: 100\n"), "{rest}");
    assert!(rest.contains("@sum: 4950\n"), "{rest}");
    assert!(rest.contains("@odd[0]: 50\n"), "{rest}");
    assert!(rest.contains("@odd[1]: 50\n"), "{rest}");
    // The process goes on, its text byte for byte as before, its agent's channel stopped.
    assert_eq!(changed(&f.pid, &before), None, "the text is not as it was");
    assert_eq!(f.work(5), "done 112");
    let name = format!("agent-{}.sock", f.pid);
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap();
    assert!(
        !unix.contains(&name),
        "{name} still bound: the channel this trace opened is stopped"
    );
}

#[test]
fn trace_with_p_prints_the_maps_when_the_process_exits() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fixture::start(dir.path());
    let (t, out, line) = p_trace(&f.pid, &["-e", "work { @calls = count() }"]);
    assert!(line.contains("until Ctrl-C"), "{line}");
    assert_eq!(f.work(40), "done 40");
    // quit: main returns (exit status 4: the reader thread got nothing), through exit().
    writeln!(f.stdin, "quit").unwrap();
    assert_eq!(f.child.wait().unwrap().code(), Some(4));
    let rest = finished(t, out, &line);
    assert!(rest.contains("@calls: 40\n"), "{rest}");
}

#[test]
fn process_trace_with_seconds_prints_the_maps_then_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "loop.c", "loop", &[]);
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let mut t = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["trace", "--process", "--seconds", "3", "-e"])
        .arg("work { @calls = count(); @sum = sum(arg0) }")
        .arg("--")
        .arg(&exe)
        .arg(&fifo)
        .env("TRAPVEC_AGENT", agent())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = t.stdin.take().unwrap();
    let mut out = BufReader::new(t.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = line
        .strip_prefix("ready ")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("the command said `{line}`"))
        .to_string();
    // The command shares trapctl's stdin and stdout.
    writeln!(stdin, "20").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done 20");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = t.wait_with_output().unwrap();
    assert!(o.status.success(), "{}\n{rest}", text(&o));
    assert!(rest.contains("@calls: 20\n"), "{rest}");
    assert!(rest.contains("@sum: 190\n"), "{rest}");
    // Killed (and reaped by trapctl): no process has its pid, or another one does.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(!stat.contains("loop"), "the command still runs: {stat}");
    drop(stdin);
}
