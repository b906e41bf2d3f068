//! The agent's control channel: a Unix stream socket at `$XDG_RUNTIME_DIR/trapvec/agent-PID.sock`
//! (else `/tmp/trapvec-UID/agent-PID.sock`; the directory is made 0700 and must be the process's
//! own), served by one thread of the agent.
//!
//! It speaks trapd's wire format (`trapvec_proto`): one JSON request per line, an
//! [`instr_manager::ops::Request`] run by the one executor [`ops::execute`] on the agent's
//! splicer, answered with `{"ok": true, ...}` and the typed reply's fields, or
//! `{"ok": false, "error": "..."}`. So `list` gives the live figures (hits, keyed counts,
//! timers) while the program runs, `apply` applies a spec file all or nothing, `unsplice` removes
//! one splice or all. One request is the agent's own: `{"op": "detach"}` removes every splice
//! (the splicer's removal waits until no thread is in a trampoline or component), answers, then
//! stops the channel and removes the socket.
//!
//! Only a peer of the process's own uid, or root, is served (`SO_PEERCRED`); another is
//! answered with an error and logged. The channel is started by [`crate::trapvec_agent_attach`]
//! (`trapctl -p PID attach`) or, under `LD_PRELOAD`, by `TRAPVEC_CONTROL=1`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use instr_manager::ops::request::Request;
use instr_manager::ops::{self, ListReply, Reply};
use instr_manager::splicer::Splicer;
use serde_json::{json, Value};
use trapvec::process::ProcessTarget;

/// Whether the channel's thread runs.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// The longest request line served.
const MAX_LINE: usize = 64 * 1024;

/// Why the channel could not start.
#[derive(Debug)]
pub(crate) enum StartError {
    Dir(PathBuf, std::io::Error),
    NotOurs(PathBuf, u32),
    Bind(PathBuf, std::io::Error),
    Thread(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Dir(p, e) => write!(f, "cannot make {}: {e}", p.display()),
            StartError::NotOurs(p, uid) => write!(
                f,
                "{} belongs to uid {uid} or is open to others: not used",
                p.display()
            ),
            StartError::Bind(p, e) => write!(f, "cannot listen on {}: {e}", p.display()),
            StartError::Thread(e) => write!(f, "cannot start the channel's thread: {e}"),
        }
    }
}

/// The directory of the agents' sockets for this process's environment and uid.
fn socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => Path::new(&d).join("trapvec"),
        // SAFETY: geteuid has no preconditions.
        None => PathBuf::from(format!("/tmp/trapvec-{}", unsafe { libc::geteuid() })),
    }
}

/// The socket of this process's agent.
pub(crate) fn socket_path() -> PathBuf {
    socket_dir().join(format!("agent-{}.sock", std::process::id()))
}

/// Start the channel's thread, unless it runs already.
pub(crate) fn start() -> Result<PathBuf, StartError> {
    let path = socket_path();
    if RUNNING.swap(true, SeqCst) {
        return Ok(path);
    }
    let r = listen(&path).and_then(|listener| {
        std::thread::Builder::new()
            .name("trapvec-control".into())
            .spawn(move || serve(listener))
            .map_err(StartError::Thread)
    });
    match r {
        Ok(_) => {
            log::info!("trapvec: control channel on {}", path.display());
            Ok(path)
        }
        Err(e) => {
            RUNNING.store(false, SeqCst);
            Err(e)
        }
    }
}

/// Make the directory (0700, ours) and bind the socket (a stale one of an earlier agent of
/// this pid is replaced).
fn listen(path: &Path) -> Result<UnixListener, StartError> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StartError::Dir(dir.into(), e)),
    }
    let meta = std::fs::metadata(dir).map_err(|e| StartError::Dir(dir.into(), e))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
        return Err(StartError::NotOurs(dir.into(), meta.uid()));
    }
    if path.exists() && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(|e| StartError::Bind(path.into(), e))
}

/// The peer's uid, from `SO_PEERCRED`.
fn peer_uid(s: &impl std::os::fd::AsRawFd) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len =
        libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).expect("a ucred is 12 bytes");
    // SAFETY: `cred` and `len` are valid for writes of a ucred and a socklen_t; the fd is open.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// A socket the channel reads and writes with raw system calls, not libc's functions: a
/// program's splices on `libc.so.6:accept4`, `read` or `write` do not count the channel's own
/// traffic (its requests are still run with libc's functions).
struct Raw(std::os::fd::OwnedFd);

impl Raw {
    /// Accept one connection on `listener` (blocking).
    fn accept(listener: &UnixListener) -> std::io::Result<Raw> {
        use std::os::fd::{AsRawFd as _, FromRawFd as _};
        loop {
            // SAFETY: accept4 with null address pointers writes nothing to this process's memory.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_accept4,
                    listener.as_raw_fd(),
                    std::ptr::null_mut::<libc::sockaddr>(),
                    std::ptr::null_mut::<libc::socklen_t>(),
                    libc::SOCK_CLOEXEC,
                )
            };
            match sys_result(fd).map(libc::c_int::try_from) {
                // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
                Ok(Ok(fd)) => return Ok(Raw(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })),
                Ok(Err(e)) => return Err(std::io::Error::other(e)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// A raw system call's result: its error (in errno) when negative.
fn sys_result(n: libc::c_long) -> std::io::Result<usize> {
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

impl Read for &Raw {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let n = unsafe {
            libc::syscall(
                libc::SYS_read,
                self.0.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        sys_result(n)
    }
}

impl Write for &Raw {
    /// `sendto(.., MSG_NOSIGNAL)`, not `write`: a peer that closed its end (a probe that only
    /// connects, a refused peer gone before it read why) must give EPIPE here, not a SIGPIPE
    /// that kills the process the agent lives in.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes; no address is given.
        let n = unsafe {
            libc::syscall(
                libc::SYS_sendto,
                self.0.as_raw_fd(),
                buf.as_ptr(),
                buf.len(),
                libc::MSG_NOSIGNAL,
                std::ptr::null::<libc::sockaddr>(),
                0 as libc::socklen_t,
            )
        };
        sys_result(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Read what a refused peer sends until it closes its end (having read why), for at most 2 s
/// of silence and 64 KiB, before the connection is closed: closing it with unread data would
/// reset it, and the peer would never read why. (200 ms was too short for a peer on a loaded
/// machine, which then wrote its request after the drain and read a reset.)
fn drain(conn: &Raw) {
    use std::os::fd::AsRawFd as _;
    let tv = libc::timeval {
        tv_sec: 2,
        tv_usec: 0,
    };
    // SAFETY: `tv` is a valid timeval for the length given; the fd is open.
    unsafe {
        libc::setsockopt(
            conn.0.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::addr_of!(tv).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::timeval>())
                .expect("a timeval is 16 bytes"),
        );
        libc::shutdown(conn.0.as_raw_fd(), libc::SHUT_WR);
    }
    let mut buf = [0u8; 4096];
    let mut r = conn;
    for _ in 0..16 {
        if !matches!(r.read(&mut buf), Ok(n) if n > 0) {
            break;
        }
    }
}

/// The channel's thread: one connection at a time, each served line by line until it closes
/// or a `detach` ends the channel.
fn serve(listener: UnixListener) {
    let path = socket_path();
    loop {
        let conn = match Raw::accept(&listener) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("trapvec: control channel: accept: {e}");
                break;
            }
        };
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        match peer_uid(&conn.0) {
            Ok(uid) if uid == me || uid == 0 => {}
            Ok(uid) => {
                log::warn!("trapvec: control channel: refused a peer of uid {uid} (the process's is {me}, or root)");
                let _ = writeln!(
                    &conn,
                    "{}",
                    json!({"ok": false, "error": format!("refused: uid {uid} is not the process's ({me}) nor root")})
                );
                drain(&conn);
                continue;
            }
            Err(e) => {
                log::warn!("trapvec: control channel: refused a peer whose credentials cannot be read: {e}");
                continue;
            }
        }
        if let Some(reply) = serve_connection(&conn) {
            // The channel is gone before the detach is answered: a client that attaches
            // right after its detach returned must not find this listener still accepting
            // (its connection would sit in the backlog of a socket nobody serves).
            let _ = std::fs::remove_file(&path);
            drop(listener);
            RUNNING.store(false, SeqCst);
            log::info!("trapvec: control channel on {} closed", path.display());
            let _ = writeln!(&conn, "{reply}");
            return;
        }
    }
    let _ = std::fs::remove_file(&path);
    RUNNING.store(false, SeqCst);
    log::info!("trapvec: control channel on {} closed", path.display());
}

/// Serve one connection; the reply to a successful detach, unsent, when it asked for one.
fn serve_connection(conn: &Raw) -> Option<Value> {
    let mut out = conn;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE as u64).read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        if !line.ends_with('\n') && line.len() >= MAX_LINE {
            let _ = writeln!(
                out,
                "{}",
                json!({"ok": false, "error": "request line too long"})
            );
            return None;
        }
        let (reply, detach) = answer(line.trim());
        if detach {
            return Some(reply);
        }
        if writeln!(out, "{reply}").is_err() {
            return None;
        }
    }
}

/// The reply to one request line, and whether it was a successful `detach`.
pub(crate) fn answer(line: &str) -> (Value, bool) {
    let op = serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v.get("op").and_then(Value::as_str).map(str::to_string));
    if op.as_deref() == Some("detach") {
        return match detach() {
            Ok(n) => (json!({"ok": true, "unspliced": n}), true),
            Err(e) => (json!({"ok": false, "error": e}), false),
        };
    }
    let request = match Request::parse(line) {
        Ok(r) => r,
        Err(e) => return (error(&e), false),
    };
    (run(&request), false)
}

fn error(e: &dyn std::error::Error) -> Value {
    json!({"ok": false, "error": trapvec::error_chain(e)})
}

fn ok(reply: &Reply) -> Value {
    let mut v = reply.to_fields();
    if let Value::Object(m) = &mut v {
        m.insert("ok".into(), Value::Bool(true));
    }
    v
}

/// Run `request` on the agent's splicer (made on the first request that needs one).
fn run(request: &Request) -> Value {
    crate::with_state_or_new(
        |state| match state {
            None => match request {
                // Nothing applied yet: an empty listing, without installing anything.
                Request::List => ok(&Reply::List(ListReply::default())),
                // No splice is live: no hits, and any id named is unknown.
                Request::Hits { ids, .. } => match ids.as_deref() {
                    None | Some([]) => ok(&Reply::Hits(ops::HitsReply::default())),
                    Some(ids) => {
                        let ids: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
                        error(&ops::OpError::NoSpliceId {
                            ids: ids.into_iter().collect(),
                            live: 0,
                        })
                    }
                },
                _ => {
                    json!({"ok": false, "error": "the agent has no splicer (cannot start the process backend)"})
                }
            },
            Some(state) => {
                // A spec with points in libraries not loaded yet: those wait for their dlopen
                // (its report has whole rows, `brief` or not).
                if let Request::Apply {
                    spec,
                    best_effort,
                    check: false,
                    ..
                } = request
                {
                    match instr_manager::Spec::from_path(spec) {
                        Ok(s) => {
                            if let Some(r) = crate::attached::apply(state, &s, *best_effort) {
                                return r.map_or_else(
                                    |e| json!({"ok": false, "error": e}),
                                    |reply| ok(&reply),
                                );
                            }
                        }
                        Err(e) => return error(&e),
                    }
                }
                match ops::execute(&mut state.splicer, request) {
                    Ok((Reply::List(list), _)) => {
                        ok(&Reply::List(crate::attached::with_pending(state, list)))
                    }
                    Ok((reply, _made)) => ok(&reply),
                    Err(e) => error(&e),
                }
            }
        },
        !matches!(request, Request::List | Request::Hits { .. }),
    )
}

/// Remove every splice (quiescence: the splicer's removal waits for the threads to leave);
/// how many were removed.
fn detach() -> Result<usize, String> {
    crate::with_state_or_new(
        |state| match state {
            None => Ok(0),
            Some(state) => {
                let n = live_unsplice_all(&mut state.splicer)?;
                crate::attached::forget(state);
                Ok(n)
            }
        },
        false,
    )
}

fn live_unsplice_all(splicer: &mut Splicer<ProcessTarget>) -> Result<usize, String> {
    if splicer.live().next().is_none() && splicer.retiring().next().is_none() {
        return Ok(0);
    }
    ops::unsplice_all(splicer)
        .map(|u| u.unspliced.len())
        .map_err(|e| trapvec::error_chain(&e))
}
