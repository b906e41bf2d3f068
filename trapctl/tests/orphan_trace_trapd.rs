//! A kernel `trapctl trace` killed by SIGKILL leaves its component `trace_PID` and the call
//! splices on its handlers, none with an owner (issue 29). Through trapd, `trapctl list` marks
//! those splices orphaned once no process has that pid (as a dead count's), and `trapctl
//! unsplice --orphans` removes them, in one `remove` request, then unloads the component, by the same
//! rule as the direct path (`instr-manager/tests/orphan_trace.rs`); a live trace's stay.
//!
//! The real binary runs against a daemon on a Unix socket (trapd's own server) whose handler
//! executes every request by the operations layer on the fake kernel (`trapvec::fake`), as
//! `hold.rs` does; the component is the fixture `knob` (a handler `on_f`, a splice it declares
//! at f3) under the name a trace gives it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use instr_manager::ops::{self, Listing};
use instr_manager::splicer::Splicer;
use instr_manager::{Action, Mechanism, SpliceRequest};
use serde_json::Value;
use trapvec::fake::{knob_component, FakeKernel};
use trapvec_proto::protocol::{self, Request};
use trapvec_proto::server::{self, Access, Handler, RequestCounts};

/// The fake daemon: every request executed by the operations layer; the ops of the requests
/// that change something, in order.
struct FakeDaemon {
    sp: Splicer<FakeKernel>,
    changes: Vec<&'static str>,
}

impl Handler for FakeDaemon {
    fn handle(&mut self, req: Request) -> Value {
        if req.changes() {
            self.changes.push(req.op());
        }
        match ops::execute(&mut self.sp, &req) {
            Ok((reply, _)) => protocol::ok(reply.to_fields()),
            Err(e) => protocol::error(e),
        }
    }
}

/// A daemon on a fake kernel in `dir`, with the trace component `trace_{pid}` loaded, its
/// probe `f0` calling `on_f` (and the splice it declares at f3), and a count at f1 that no
/// trace made.
fn daemon_with_trace(dir: &Path, pid: u32) -> (FakeKernel, Arc<Mutex<FakeDaemon>>, PathBuf) {
    let traced = dir.join(format!("trace_{pid}.o"));
    std::fs::copy(knob_component(dir), &traced).unwrap();
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let splice =
        |at: &str, action: Action| Request::Splice(SpliceRequest::new(at, action, Mechanism::Trap));
    for req in [
        Request::Load {
            path: traced,
            name: None,
        },
        splice(
            "f0",
            Action::Call {
                handler: "on_f".into(),
                cookie: 0,
            },
        ),
        splice("f1", Action::Count),
    ] {
        ops::execute(&mut sp, &req).unwrap();
    }
    assert!(k.trapped("f0") && k.trapped("f1") && k.trapped("f3"));
    let socket = dir.join("trapd.sock");
    let listener = server::bind(&socket).unwrap();
    let d = Arc::new(Mutex::new(FakeDaemon {
        sp,
        changes: Vec::new(),
    }));
    let served = Arc::clone(&d);
    std::thread::spawn(move || {
        server::serve(
            listener,
            served,
            Access::default(),
            Arc::new(RequestCounts::default()),
        )
    });
    (k, d, socket)
}

/// trapctl with `args` on the daemon at `socket`: its exit success and stdout.
fn trapctl(socket: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "trapctl {args:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), stdout)
}

/// `trapctl list --json`'s splices as (point, orphaned, component), sorted by point.
fn listed(socket: &Path) -> Vec<(String, bool, Option<String>)> {
    let (_, json) = trapctl(socket, &["list", "--json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    let mut rows: Vec<_> = v["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["at"].as_str().unwrap().to_string(),
                s["orphaned"].as_bool().unwrap_or(false),
                s["component"].as_str().map(str::to_string),
            )
        })
        .collect();
    rows.sort();
    rows
}

/// A pid no process has any more: a child that ran and was reaped (the killed trapctl).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_killed_traces_splices_are_listed_orphaned_and_unsplice_orphans_through_trapd_removes_them_and_its_component(
) {
    let dir = tempfile::tempdir().unwrap();
    let dead = dead_pid();
    let (k, d, socket) = daemon_with_trace(dir.path(), dead);
    let trace = format!("trace_{dead}");

    assert_eq!(
        listed(&socket),
        [
            ("f0".to_string(), true, Some(trace.clone())),
            ("f1".to_string(), false, None),
            ("f3".to_string(), true, Some(trace.clone())),
        ],
        "the trace's probe and its declared splice are orphaned, the count is not"
    );
    let (_, text) = trapctl(&socket, &["list"]);
    let orphaned = format!("  orphaned: its handler is in {trace}, whose `trapctl trace` is gone; `trapctl unsplice --orphans` removes both");
    assert_eq!(text.matches(&orphaned).count(), 2, "{text}");

    let (_, out) = trapctl(&socket, &["unsplice", "--orphans"]);
    assert!(out.contains("unspliced orphan f0 at "), "{out}");
    assert!(out.contains("unspliced orphan f3 at "), "{out}");
    assert!(out.ends_with("unspliced 2 orphaned splice(s)\n"), "{out}");
    assert_eq!(
        d.lock().unwrap().changes,
        ["remove", "unload"],
        "both splices in one request, then the component"
    );
    assert!(!k.trapped("f0") && !k.trapped("f3"), "the trace's sites");
    assert!(k.trapped("f1"), "the count no trace made stays");
    let l: Listing = ops::listing(&d.lock().unwrap().sp).unwrap();
    assert!(l.components.is_empty(), "{trace} unloaded: {l:?}");
    assert_eq!(l.splices.len(), 1, "{l:?}");

    let (_, out) = trapctl(&socket, &["unsplice", "--orphans"]);
    assert_eq!(out, "unspliced 0 orphaned splice(s)\n", "nothing more");
}

#[test]
fn a_live_traces_splices_are_not_orphaned_and_stay_through_trapd() {
    let dir = tempfile::tempdir().unwrap();
    // This test process stands for the trapctl still tracing.
    let (k, d, socket) = daemon_with_trace(dir.path(), std::process::id());
    assert!(listed(&socket).iter().all(|(_, orphaned, _)| !orphaned));
    let (_, text) = trapctl(&socket, &["list"]);
    assert!(!text.contains("orphaned"), "{text}");
    let (_, out) = trapctl(&socket, &["unsplice", "--orphans"]);
    assert_eq!(out, "unspliced 0 orphaned splice(s)\n");
    assert!(k.trapped("f0") && k.trapped("f1") && k.trapped("f3"));
    let l: Listing = ops::listing(&d.lock().unwrap().sp).unwrap();
    assert_eq!(l.components.len(), 1, "the live trace's component stays");
}
