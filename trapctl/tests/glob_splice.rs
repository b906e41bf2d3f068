//! `trapctl splice 'GLOB' --count`: one splice per matching function in one batch (an `apply`
//! of a generated spec), all or nothing by default, `--best-effort` summing the refusals up by
//! reason and exiting 3. The real binary runs against a daemon on a Unix socket (trapd's own
//! server) whose handler applies the spec on the fake kernel (`trapvec::fake`: f0..f3).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use instr_manager::ops;
use instr_manager::splicer::Splicer;
use instr_manager::{Action, Mechanism, Spec, SpliceRequest};
use serde_json::Value;
use trapd::protocol::{self, Request};
use trapd::server::{self, Access, Handler, RequestCounts};
use trapvec::fake::FakeKernel;

struct FakeDaemon {
    sp: Splicer<FakeKernel>,
}

impl Handler for FakeDaemon {
    fn handle(&mut self, req: Request) -> Value {
        let reply = match req {
            Request::Apply {
                spec, best_effort, ..
            } => Spec::from_path(&spec)
                .map_err(ops::OpError::from)
                .and_then(|s| ops::apply(&mut self.sp, &s, best_effort))
                .map(|(report, _)| serde_json::to_value(report).unwrap()),
            other => return protocol::error(format!("not served by this test: {other:?}")),
        };
        match reply {
            Ok(v) => protocol::ok(v),
            Err(e) => protocol::error(trapvec::error_chain(&e)),
        }
    }
}

/// The fake kernel (`pre` already spliced by count) and its daemon's socket in `dir`.
fn daemon(dir: &Path, pre: &[&str]) -> (FakeKernel, PathBuf) {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let pre: Vec<SpliceRequest> = pre
        .iter()
        .map(|f| SpliceRequest::new(*f, Action::Count, Mechanism::Trap))
        .collect();
    sp.apply(&pre).unwrap();
    let socket = dir.join("trapd.sock");
    let listener = server::bind(&socket).unwrap();
    let d = Arc::new(Mutex::new(FakeDaemon { sp }));
    std::thread::spawn(move || {
        server::serve(
            listener,
            d,
            Access::default(),
            Arc::new(RequestCounts::default()),
        )
    });
    (k, socket)
}

fn trapctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_glob_splices_every_matching_function_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path(), &[]);
    let out = trapctl(&socket, &["splice", "f[0-2]", "--count"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.ends_with("spliced 3 of 3 functions\n"), "{stdout}");
    assert!(k.trapped("f0") && k.trapped("f1") && k.trapped("f2"));
    assert!(!k.trapped("f3"));
}

#[test]
fn a_refusal_splices_nothing_by_default_and_the_rest_with_best_effort() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path(), &["f3"]);
    let out = trapctl(&socket, &["splice", "f*", "--count"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("f*: nothing was spliced"), "{stderr}");
    assert!(stderr.contains("1 of 4 splices refused"), "{stderr}");
    assert!(!k.trapped("f0"));

    let out = trapctl(&socket, &["splice", "f*", "--count", "--best-effort"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("refused 1: the site is already spliced (at f3)\n"),
        "{stderr}"
    );
    assert!(text(&out.stdout).ends_with("spliced 3 of 4 functions\n"));
    assert!(k.trapped("f0") && k.trapped("f1") && k.trapped("f2"));
}

#[test]
fn a_glob_matching_nothing_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path(), &[]);
    let out = trapctl(&socket, &["splice", "tcp_*", "--count"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the glob `tcp_*` matches no function"),
        "{stderr}"
    );
    assert!(k.pristine());
}
