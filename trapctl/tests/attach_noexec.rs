//! `trapctl -p PID` refuses a process that may not gain executable mappings (issue 30, item 3):
//! systemd's `MemoryDenyWriteExecute=yes` is either the kernel's own switch
//! (`prctl(PR_SET_MDWE)`, Linux 6.3) or a seccomp filter failing `mprotect(PROT_EXEC)`. The
//! agent's `dlopen` and every splice need such a mapping, so the attach must stop before it
//! loads anything: exit 1 with the reason, the process's text and mappings as they were, no
//! tracer left on it, and the process still serving calls.
//!
//! The fixture (`tests/fixtures/attach/noexec.c`) sets the restriction on itself, then serves
//! `work()` calls; each test first shows that the restriction holds (the same fixture refuses
//! an `mprotect(PROT_EXEC)` of its own), so a refusal cannot come from somewhere else.

mod attach_common;
use attach_common::{cc, mappings, spawn_piped, text, trapctl};

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command};

/// The fixture running under `mode`, or `None` when this kernel cannot set it (exit 3).
struct NoExec {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: String,
}

impl NoExec {
    fn start(dir: &std::path::Path, mode: &str) -> Option<NoExec> {
        let exe = cc(dir, "noexec.c", "noexec", &[]);
        let (mut child, stdin, stdout, first) = spawn_piped(Command::new(exe).arg(mode));
        if !first.starts_with("ready ") {
            let status = child.wait().unwrap();
            assert_eq!(status.code(), Some(3), "fixture said `{first}`: {status}");
            return None;
        }
        let pid = first.split_whitespace().nth(1).unwrap().to_string();
        Some(NoExec {
            child,
            stdin,
            stdout,
            pid,
        })
    }

    /// Calls of work(), `n` more: the fixture's running total.
    fn calls(&mut self, n: u64) -> u64 {
        writeln!(self.stdin, "{n}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("done ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("fixture said `{line}`"))
    }
}

impl Drop for NoExec {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn maps(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
}

fn tracer(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .unwrap()
        .trim()
        .to_string()
}

/// Attach to the fixture under `mode` and check the refusal: its message names the process and
/// contains `why`, and nothing about the process changed.
fn refused(mode: &str, why: &str) {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut p) = NoExec::start(dir.path(), mode) else {
        eprintln!("skipped: this kernel cannot set `{mode}` (PR_SET_MDWE is Linux 6.3+)");
        return;
    };
    assert_eq!(p.calls(10), 10);
    let pid = p.pid.clone();
    let text_before = mappings(&pid);
    let maps_before = maps(&pid);

    let o = trapctl(&["-p", &pid, "count", "work", "--seconds", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "executable mappings are forbidden in process {pid}"
        )) && err.contains(why)
            && err.contains("nothing was changed"),
        "{}",
        text(&o)
    );

    // Nothing changed: the same mappings (no agent, no component), the same text bytes, no
    // tracer, and work() still runs, unspliced.
    assert_eq!(maps(&pid), maps_before, "the mappings changed");
    assert!(!maps(&pid).contains("trapvec"), "{}", maps(&pid));
    assert_eq!(mappings(&pid), text_before, "the text changed");
    assert_eq!(tracer(&pid), "0", "a tracer is left on the process");
    assert_eq!(p.calls(5), 15);
}

#[test]
fn attach_refuses_a_process_under_mdwe_and_leaves_it_as_it_was() {
    refused("mdwe", "PR_SET_MDWE");
}

#[test]
fn attach_refuses_a_process_whose_seccomp_filter_forbids_prot_exec_and_leaves_it_as_it_was() {
    refused(
        "seccomp",
        "a seccomp filter refuses mprotect(PROT_EXEC) with Operation not permitted",
    );
}
