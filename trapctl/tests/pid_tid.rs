//! `--pid` is the process and `--tid` the thread (issue 28, item 3), on `splice`, `count` and
//! `time`: each flag reaches the predicate field the kernel tests for it (`tgid` for the
//! process, `tid`, which the kernel reads from task->pid, for the thread), `--tgid` keeps its meaning, and
//! `--pid`, which meant a thread before, says on stderr that it now means the process. The real
//! binary runs against a daemon on a Unix socket (trapd's own server) that records the request
//! and runs it on the fake kernel (`fake_daemon`). Keyed counts too: `--by pid` (and a spec's
//! `by = "pid"`) is the process, `--by tid` the thread, `--by tgid` is read as `pid` with a
//! warning.

mod fake_daemon;

use fake_daemon::{daemon, daemon_with, FakeDaemon, Setup};
use serde_json::Value;
use trapvec::keyed::KeyBy;
use trapvec::predicate::Predicate;
use trapvec_proto::protocol::Request;

/// The predicate of every splice request `d` served, in order.
fn predicates(d: &FakeDaemon) -> Vec<Predicate> {
    d.requests
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| match r {
            Request::Splice(s) => Some(s.options.only.clone()),
            _ => None,
        })
        .collect()
}

const WARNING: &str = "trapctl: warning: --pid N now means the process";

/// `trapctl splice f0 --count FLAGS`: the predicate the daemon got, and trapctl's stderr.
fn splice_with(flags: &[&str]) -> (Predicate, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let mut args = vec!["splice", "f0", "--count"];
    args.extend_from_slice(flags);
    let out = d.trapctl(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{flags:?}: {stderr}");
    let got = predicates(&d);
    assert_eq!(got.len(), 1, "{flags:?}: one splice request");
    (got[0].clone(), stderr)
}

#[test]
fn pid_is_the_process_and_says_so_once() {
    let (p, stderr) = splice_with(&["--pid", "42"]);
    assert_eq!(
        p,
        Predicate {
            tgid: Some(42),
            ..Predicate::default()
        }
    );
    assert_eq!(stderr.matches(WARNING).count(), 1, "{stderr}");
}

#[test]
fn tid_is_the_thread_the_kernels_task_pid_without_a_warning() {
    let (p, stderr) = splice_with(&["--tid", "7"]);
    assert_eq!(
        p,
        Predicate {
            tid: Some(7),
            ..Predicate::default()
        }
    );
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn tgid_keeps_its_meaning_without_a_warning_and_fields_combine() {
    let (p, stderr) = splice_with(&["--tgid", "9", "--tid", "10", "--comm", "sh"]);
    assert_eq!(
        p,
        Predicate {
            tid: Some(10),
            tgid: Some(9),
            comm: Some("sh".into()),
            ..Predicate::default()
        }
    );
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn pid_and_tgid_together_are_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let out = d.trapctl(&["splice", "f0", "--count", "--pid", "1", "--tgid", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(predicates(&d).is_empty());
}

#[test]
fn count_takes_pid_as_the_process_too() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let out = d.trapctl(&["count", "f1", "--seconds", "0", "--pid", "5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(WARNING), "{stderr}");
    let got = predicates(&d);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].tgid, got[0].pid), (Some(5), None));
}

/// What a spec's old `tgid` prints on stderr (once however many splices use it).
const OLD_TGID: &str = "`tgid` is the old spelling of `pid` (the process";

#[test]
fn a_specs_pid_is_the_process_tid_the_thread_and_tgid_warns_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    let spec = dir.path().join("spec.toml");
    let run = |text: &str| {
        std::fs::write(&spec, text).unwrap();
        let out = d.trapctl(&["apply", spec.to_str().unwrap(), "--check", "--json"]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{text}: {stderr}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        (v, stderr)
    };
    let (v, stderr) = run("[[splice]]\nat = \"f0\"\naction = \"count\"\npid = 42\n\n\
         [[splice]]\nat = \"f1\"\naction = \"count\"\ntid = 7\n");
    assert_eq!(v["possible"].as_array().map(Vec::len), Some(2), "{v}");
    assert!(
        !stderr.contains("tgid"),
        "the new spellings: no warning: {stderr}"
    );
    let (_, stderr) = run("[[splice]]\nat = \"f0\"\naction = \"count\"\ntgid = 42\n\n\
         [[splice]]\nat = \"f1\"\naction = \"count\"\ntgid = 43\n");
    assert_eq!(stderr.matches(OLD_TGID).count(), 1, "{stderr}");
}

/// What `--by tgid` (and a spec's `by = "tgid"`) prints on stderr, once.
const OLD_TGID_KEY: &str = "trapvec: warning: key `tgid` is the old spelling of `pid` (the process), read as `pid`; `tid` is the thread";

/// The key of every splice request `d` served, in order.
fn keys(d: &FakeDaemon) -> Vec<Option<KeyBy>> {
    d.requests
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| match r {
            Request::Splice(s) => Some(s.options.by),
            _ => None,
        })
        .collect()
}

#[test]
fn by_pid_is_the_process_by_tid_the_thread_and_by_tgid_warns_that_it_is_pid() {
    for (key, want, warns) in [
        ("pid", KeyBy::Pid, false),
        ("tid", KeyBy::Tid, false),
        ("tgid", KeyBy::Pid, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon_with(
            dir.path(),
            Setup {
                runtime_slots: true,
                ..Setup::default()
            },
        );
        let out = d.trapctl(&["splice", "f0", "--count", "--by", key]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "--by {key}: {stderr}");
        assert_eq!(keys(&d), [Some(want)], "--by {key}");
        assert_eq!(
            stderr.matches(OLD_TGID_KEY).count(),
            usize::from(warns),
            "--by {key}: {stderr}"
        );
        // The listing names the key as it is now.
        let out = d.trapctl(&["list", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["splices"][0]["by"], want.name(), "--by {key}: {v}");
    }
}

#[test]
fn a_specs_by_pid_is_the_process_and_by_tgid_warns_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon_with(
        dir.path(),
        Setup {
            runtime_slots: true,
            ..Setup::default()
        },
    );
    let spec = dir.path().join("spec.toml");
    let run = |text: &str| {
        std::fs::write(&spec, text).unwrap();
        let out = d.trapctl(&["apply", spec.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{text}: {stderr}");
        stderr
    };
    let stderr = run(
        "[[splice]]\nat = \"f0\"\naction = \"count\"\nby = \"pid\"\n\n\
         [[splice]]\nat = \"f1\"\naction = \"count\"\nby = \"tid\"\n",
    );
    assert!(
        !stderr.contains("tgid"),
        "the new spellings: no warning: {stderr}"
    );
    let stderr = run(
        "[[splice]]\nat = \"f2\"\naction = \"count\"\nby = \"tgid\"\n\n\
         [[splice]]\nat = \"f3\"\naction = \"count\"\nby = \"tgid\"\n",
    );
    assert_eq!(stderr.matches(OLD_TGID_KEY).count(), 1, "{stderr}");
    let out = d.trapctl(&["list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut by: Vec<(String, String)> = v["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["at"].as_str().unwrap().into(),
                r["by"].as_str().unwrap().into(),
            )
        })
        .collect();
    by.sort();
    let want = [("f0", "pid"), ("f1", "tid"), ("f2", "pid"), ("f3", "pid")];
    assert_eq!(by, want.map(|(a, b)| (a.to_string(), b.to_string())), "{v}");
}
