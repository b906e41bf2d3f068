//! `trapctl -p PID time FUNCTION --seconds N` (issue 30): a timer made in a running process by
//! its agent, held N seconds while the process calls the function, its histogram read from the
//! agent and printed, the timer removed (the text as before). Needs cc and the built agent.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};

mod attach_common;
use attach_common::{agent, text, trapctl, LoopFixture};

#[test]
fn time_with_p_times_every_call_made_while_it_holds_and_removes_its_timer() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = LoopFixture::start(dir.path());
    let LoopFixture {
        ref mut child,
        ref mut stdin,
        ref mut stdout,
        ref pid,
        ref ready,
    } = f;
    let pid: &str = pid;
    let mut line = String::new();
    let work = ready
        .split_whitespace()
        .nth(3)
        .and_then(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| panic!("fixture said `{ready}`"));
    let text_at_work = || {
        let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
        let mut b = [0u8; 16];
        mem.read_exact_at(&mut b, work).unwrap();
        b
    };
    let before = text_at_work();

    let mut t = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["-p", pid, "time", "work", "--seconds", "3", "--json"])
        .env("TRAPVEC_AGENT", agent())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut tout = BufReader::new(t.stdout.take().unwrap());
    let mut announce = String::new();
    tout.read_line(&mut announce).unwrap();
    assert!(
        announce.starts_with("timing work at 0x") && announce.contains(pid),
        "{announce}"
    );
    assert_ne!(text_at_work(), before, "the timer's trap in work");
    writeln!(stdin, "321").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done 321");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut tout, &mut rest).unwrap();
    let o = t.wait_with_output().unwrap();
    assert!(o.status.success(), "{}\n{announce}{rest}", text(&o));
    let v: serde_json::Value =
        serde_json::from_str(&rest).unwrap_or_else(|e| panic!("{e}: {rest}"));
    assert_eq!(v["count"], 321, "{v}");
    assert_eq!(v["function"], "work", "{v}");
    assert!(v["max_ns"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(text_at_work(), before, "the timer removed");
    let o = trapctl(&["-p", pid, "list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let l: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(l["splices"].as_array().map(Vec::len), Some(0), "{l}");
    // Calls after the removal are not timed, and the process goes on.
    writeln!(stdin, "5").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "done 326");
    let _ = child.kill();
    let _ = child.wait();
}
