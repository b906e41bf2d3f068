//! Globs beyond `splice`: `trapctl unsplice 'GLOB'` removes every live splice in a matching
//! function in one batch, and `trapctl count 'GLOB'` / `trapctl time 'GLOB'` make one splice per
//! matching function in one batch, hold them, and remove them in one batch (a `remove` request
//! of their sites). The real binary runs against a daemon on a Unix socket (trapd's own
//! server) whose handler is the one executor, `ops::execute`, over the fake kernel
//! (`trapvec::fake`: f0..f3), so what the daemon is asked and what the kernel saw are both
//! checked.

mod fake_daemon;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use fake_daemon::{daemon_with, text, FakeDaemon, Setup};
use trapvec::fake::func_addr;

/// The fake kernel with runtime slots (`pre` already spliced by count) and its daemon in `dir`.
fn daemon(dir: &Path, pre: &[&str]) -> FakeDaemon {
    daemon_with(
        dir,
        Setup {
            runtime_slots: true,
            pre,
        },
    )
}

/// The site a count at `f`'s entry takes: past the fake's 5-byte fentry NOP.
fn site(f: &str) -> u64 {
    func_addr(f) + 5
}

#[test]
fn unsplice_of_a_glob_removes_every_matching_splice_in_one_request_and_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &["f0", "f1", "f3"]);
    let batches = d.k.state().batches;
    let out = d.trapctl(&["unsplice", "f[0-2]"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.ends_with("unspliced 2 splice(s) matching f[0-2]\n"),
        "{stdout}"
    );
    assert!(stdout.contains("unspliced f0 at "), "{stdout}");
    assert!(!d.k.trapped("f0") && !d.k.trapped("f1"));
    assert!(d.k.trapped("f3"), "f3 does not match");
    assert_eq!(d.k.state().batches, batches + 1, "one text batch");
    assert_eq!(d.ops(), ["unsplice"]);
}

#[test]
fn unsplice_of_a_glob_matching_no_splice_fails_naming_it_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &["f3"]);
    let out = d.trapctl(&["unsplice", "f[0-2]"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no splice at `f[0-2]`"), "{stderr}");
    assert!(d.k.trapped("f3"));
}

#[test]
fn count_of_a_glob_counts_each_function_in_one_batch_and_removes_them_in_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &[]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["count", "f[0-2]", "--seconds", "0.5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert_eq!(first, "counting f[0-2] at 3 functions for 0.5 s\n");
    // The calls, while the splices are live: f1 most, f0 some, f2 none.
    {
        let mut st = d.k.state();
        assert_eq!(st.batches, 1, "made in one batch");
        st.hits.insert(site("f0"), 3);
        st.hits.insert(site("f1"), 40);
    }
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child.stderr.unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "{rest}{stderr}");
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines[..3], ["f1: 40", "f0: 3", "f2: 0"], "{rest}");
    assert!(
        lines[3].starts_with("f[0-2]: 43 calls to 3 functions in 0.5 s ("),
        "{rest}"
    );
    assert!(d.k.pristine(), "every splice removed");
    assert_eq!(d.k.state().batches, 2, "removed in one batch");
    assert_eq!(d.ops(), ["apply", "list", "remove"]);
}

#[test]
fn count_of_a_glob_with_best_effort_counts_the_rest_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &["f3"]);
    let out = d.trapctl(&["count", "f*", "--seconds", "0"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 of 4 splices refused"), "{stderr}");
    let out = d.trapctl(&["count", "f*", "--seconds", "0", "--best-effort"]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert!(
        stderr.contains("refused 1: the site is already spliced (at f3)\n"),
        "{stderr}"
    );
    assert!(
        stdout.contains("f*: 0 calls to 3 functions in 0 s"),
        "{stdout}"
    );
    assert!(
        d.k.trapped("f3") && !d.k.trapped("f0"),
        "only its own removed"
    );
}

#[test]
fn time_of_a_glob_times_each_function_and_frees_every_timer() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &[]);
    let out = d.trapctl(&["time", "f[01]", "--seconds", "0"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("timing f[01] at 2 functions for 0 s (wall clock)\n"),
        "{stdout}"
    );
    assert!(stdout.contains("\nf0: 0 calls, "), "{stdout}");
    assert!(stdout.contains("\nf1: 0 calls, "), "{stdout}");
    assert!(
        stdout.contains("f[01]: 0 calls to 2 functions, mean 0"),
        "{stdout}"
    );
    assert!(d.k.pristine());
    let st = d.k.state();
    assert!(st.slots.is_empty(), "{:?}", st.slots);
    assert_eq!(st.slots_freed.len(), 2);
    assert_eq!(st.batches, 2);
}
