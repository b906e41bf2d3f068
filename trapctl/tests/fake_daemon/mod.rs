//! The fake daemon the CLI tests run the real trapctl against: trapd's own server
//! (`trapvec_proto::server`) on a Unix socket in the test's temporary directory, whose handler
//! is the one executor, `ops::execute`, over the fake kernel (`trapvec::fake`: f0..f3), and
//! which records every request it serves, so that a test checks both what the daemon was asked
//! and what the kernel saw. A test that needs a handler of its own (`hold.rs`) serves it with
//! [`serve`]. Each test binary uses part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use instr_manager::ops;
use instr_manager::splicer::Splicer;
use instr_manager::{Action, Mechanism, SpliceRequest};
use serde_json::Value;
use trapvec::fake::FakeKernel;
use trapvec_proto::protocol::{self, Request};
use trapvec_proto::server::{self, Access, Handler, RequestCounts};

/// The handler: every request recorded, then executed on the splicer.
struct Executor {
    sp: Splicer<FakeKernel>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Handler for Executor {
    fn handle(&mut self, req: Request) -> Value {
        self.requests.lock().unwrap().push(req.clone());
        match ops::execute(&mut self.sp, &req) {
            Ok((reply, _)) => protocol::ok(reply.to_fields()),
            Err(e) => protocol::error(e),
        }
    }
}

/// A running fake daemon.
pub struct FakeDaemon {
    /// The kernel it changes (a handle on the same state).
    pub k: FakeKernel,
    /// Its socket, for `trapctl --socket`.
    pub socket: PathBuf,
    /// Every request served, in order.
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl FakeDaemon {
    /// The `op` of every request served, in order.
    pub fn ops(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.op().to_string())
            .collect()
    }

    /// The real trapctl with `args` on this daemon.
    pub fn trapctl(&self, args: &[&str]) -> Output {
        trapctl(&self.socket, args)
    }
}

/// What the fake kernel starts with.
#[derive(Clone, Copy, Default)]
pub struct Setup<'a> {
    /// Return and keyed slots (`trapctl time`, `--by`): `FakeState::runtime_slots`.
    pub runtime_slots: bool,
    /// Functions already spliced by count, before the daemon serves.
    pub pre: &'a [&'a str],
}

/// A fake daemon in `dir` over a fresh fake kernel.
pub fn daemon(dir: &Path) -> FakeDaemon {
    daemon_with(dir, Setup::default())
}

/// A fake daemon in `dir` over a fake kernel set up as `setup` says.
pub fn daemon_with(dir: &Path, setup: Setup<'_>) -> FakeDaemon {
    let k = FakeKernel::new();
    k.state().runtime_slots = setup.runtime_slots;
    let mut sp = Splicer::new(k.clone());
    let pre: Vec<SpliceRequest> = setup
        .pre
        .iter()
        .map(|f| SpliceRequest::new(*f, Action::Count, Mechanism::Trap))
        .collect();
    sp.apply(&pre).unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let socket = serve(
        dir,
        Executor {
            sp,
            requests: requests.clone(),
        },
    );
    FakeDaemon {
        k,
        socket,
        requests,
    }
}

/// trapd's server on `dir/trapd.sock` serving `handler` on a thread of its own; the socket.
pub fn serve<H: Handler>(dir: &Path, handler: H) -> PathBuf {
    let socket = dir.join("trapd.sock");
    let listener = server::bind(&socket).unwrap();
    let handler = Arc::new(Mutex::new(handler));
    std::thread::spawn(move || {
        server::serve(
            listener,
            handler,
            Access::default(),
            Arc::new(RequestCounts::default()),
        )
    });
    socket
}

/// The real trapctl with `args` on the daemon at `socket`.
pub fn trapctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

/// Bytes of an output as text, for assertions and their messages.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
