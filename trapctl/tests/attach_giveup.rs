//! The give-up of an attach (issue 30): when the agent's `dlopen` waits longer than
//! `--attach-timeout` for the loader's lock (a thread of the process is inside a library's
//! constructor), the call is undone and the process is left as it was: the agent not loaded,
//! the calling thread's registers back and its glibc state intact (a symbol lookup error later
//! in that thread is still reported by the loader, exit status 127, not a jump into the
//! abandoned call's frames), and a later attach works. Needs cc and the built agent.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod attach_common;
use attach_common::{cc, text, trapctl};

fn agent_mapped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .contains("libtrapvec_agent")
}

#[test]
fn an_attach_that_gives_up_on_the_loader_lock_undoes_its_dlopen_and_leaves_the_process_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "stuck.c", "stuck", &[]);
    let stuck = cc(
        dir.path(),
        "stucklib.c",
        "stucklib.so",
        &["-shared", "-fPIC"],
    );
    let lazy = cc(
        dir.path(),
        "lazylib.c",
        "lazylib.so",
        &["-shared", "-fPIC", "-Wl,-z,lazy"],
    );
    let started = Instant::now();
    let mut child = Command::new(exe)
        .args([&stuck, &lazy])
        .env_remove("LD_BIND_NOW")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("ready"), "{line}");
    // The loader thread is inside stucklib's constructor (4 s), holding the loader's lock.
    std::thread::sleep(Duration::from_millis(300));

    let t = Instant::now();
    let o = trapctl(&["-p", &pid.to_string(), "attach", "--attach-timeout", "1"]);
    let took = t.elapsed();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("it was undone"), "{}", text(&o));
    assert!(err.contains("waited for the mutex"), "{}", text(&o));
    assert!(took < Duration::from_secs(3), "gave up after {took:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the constructor was over before the give-up: the test proves nothing ({:?})",
        started.elapsed()
    );
    assert!(!agent_mapped(pid), "the agent was loaded after the give-up");
    writeln!(stdin, "ping").unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "pong\n");

    // Once the constructor is over the loader's lock is free, and the agent was never loaded:
    // the abandoned dlopen did not complete later either.
    std::thread::sleep(
        Duration::from_secs(4).saturating_sub(started.elapsed()) + Duration::from_millis(500),
    );
    assert!(
        !agent_mapped(pid),
        "the abandoned dlopen completed after all"
    );
    let o = trapctl(&["-p", &pid.to_string(), "attach"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = trapctl(&["-p", &pid.to_string(), "detach"]);
    assert!(o.status.success(), "{}", text(&o));

    // A symbol lookup error in the thread the call was made in is the loader's, as in any
    // process: its message and exit status 127.
    writeln!(stdin, "lazy").unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains("undefined symbol: trapvec_test_defined_nowhere"),
        "{stderr}"
    );
}
