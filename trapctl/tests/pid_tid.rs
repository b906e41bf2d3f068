//! `--pid` is the process and `--tid` the thread (issue 28, item 3), on `splice`, `count` and
//! `time`: each flag reaches the predicate field the kernel tests for it (`tgid` for the
//! process, `pid`, the kernel's task->pid, for the thread), `--tgid` keeps its meaning, and
//! `--pid`, which meant a thread before, says on stderr that it now means the process. The real
//! binary runs against a daemon on a Unix socket (trapd's own server) that records the request
//! and runs it on the fake kernel.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use instr_manager::ops;
use instr_manager::splicer::Splicer;
use serde_json::Value;
use trapd::protocol::{self, Request};
use trapd::server::{self, Access, Handler, RequestCounts};
use trapvec::fake::FakeKernel;
use trapvec::predicate::Predicate;

struct FakeDaemon {
    sp: Splicer<FakeKernel>,
    /// The predicate of every splice request served, in order.
    only: Arc<Mutex<Vec<Predicate>>>,
}

impl Handler for FakeDaemon {
    fn handle(&mut self, req: Request) -> Value {
        if let Request::Splice(r) = &req {
            self.only.lock().unwrap().push(r.options.only.clone());
        }
        match ops::execute(&mut self.sp, &req) {
            Ok((reply, _)) => protocol::ok(reply.to_fields()),
            Err(e) => protocol::error(e),
        }
    }
}

fn daemon(dir: &Path) -> (PathBuf, Arc<Mutex<Vec<Predicate>>>) {
    let socket = dir.join("trapd.sock");
    let listener = server::bind(&socket).unwrap();
    let only = Arc::new(Mutex::new(Vec::new()));
    let d = Arc::new(Mutex::new(FakeDaemon {
        sp: Splicer::new(FakeKernel::new()),
        only: only.clone(),
    }));
    std::thread::spawn(move || {
        server::serve(
            listener,
            d,
            Access::default(),
            Arc::new(RequestCounts::default()),
        )
    });
    (socket, only)
}

fn trapctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

const WARNING: &str = "trapctl: warning: --pid N now means the process";

/// `trapctl splice f0 --count FLAGS`: the predicate the daemon got, and trapctl's stderr.
fn splice_with(flags: &[&str]) -> (Predicate, String) {
    let dir = tempfile::tempdir().unwrap();
    let (socket, only) = daemon(dir.path());
    let mut args = vec!["splice", "f0", "--count"];
    args.extend_from_slice(flags);
    let out = trapctl(&socket, &args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{flags:?}: {stderr}");
    let got = only.lock().unwrap().clone();
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
            pid: Some(7),
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
            pid: Some(10),
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
    let (socket, only) = daemon(dir.path());
    let out = trapctl(
        &socket,
        &["splice", "f0", "--count", "--pid", "1", "--tgid", "2"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(only.lock().unwrap().is_empty());
}

#[test]
fn count_takes_pid_as_the_process_too() {
    let dir = tempfile::tempdir().unwrap();
    let (socket, only) = daemon(dir.path());
    let out = trapctl(&socket, &["count", "f1", "--seconds", "0", "--pid", "5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(WARNING), "{stderr}");
    let got = only.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].tgid, got[0].pid), (Some(5), None));
}
