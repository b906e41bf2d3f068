//! The Unix socket: who may connect (`SO_PEERCRED`: root, or a member of an allowed group),
//! reading request lines, and answering each under the daemon's lock.
//!
//! Each connection has its own thread. A request is acted on only once its whole line (up to
//! the newline) has arrived, and it is applied completely under the lock before the reply is
//! written, so a client that disconnects mid-line changes nothing and one that disconnects
//! before reading its reply cannot leave a change half-made. A line longer than
//! [`MAX_LINE`](crate::protocol::MAX_LINE) is answered with an error and the connection closed.
//!
//! This is trapd's server; it lives here so that tests of trapctl can run a fake daemon behind
//! the same server without trapctl linking trapd.
//!
//! Every answer is counted in [`RequestCounts`], by `op` and whether it was an error (a line
//! that is no request counts as `invalid`, a refused client as `denied`): trapd's Prometheus
//! endpoint exposes the counts.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use crate::exposition::RequestCount;

use crate::protocol::{self, Request, MAX_LINE};

/// Requests answered on the socket, by `op` (`invalid`: a line that is not a request;
/// `denied`: a client refused by [`Access`]), and how many of each were errors.
#[derive(Debug, Default)]
pub struct RequestCounts(Mutex<BTreeMap<&'static str, RequestCount>>);

impl RequestCounts {
    /// Count one answer to `op`; `ok` is the reply's `ok`.
    pub fn record(&self, op: &'static str, ok: bool) {
        let mut m = lock(&self.0);
        let c = m.entry(op).or_default();
        c.total += 1;
        if !ok {
            c.errors += 1;
        }
    }

    /// The counts now.
    pub fn snapshot(&self) -> BTreeMap<String, RequestCount> {
        lock(&self.0)
            .iter()
            .map(|(k, v)| ((*k).to_string(), *v))
            .collect()
    }
}

/// Who may use the socket besides root.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub gids: Vec<u32>,
}

/// A group of `allow_groups` that cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("allow_groups: no group named `{group}`")]
    NoGroup { group: String },
    #[error("allow_groups: looking up `{group}`")]
    Lookup {
        group: String,
        #[source]
        source: nix::Error,
    },
}

impl Access {
    /// Resolve group names (or numeric ids) from the configuration.
    pub fn from_groups(groups: &[String]) -> Result<Access, AccessError> {
        let mut gids = Vec::new();
        for g in groups {
            if let Ok(n) = g.parse::<u32>() {
                gids.push(n);
                continue;
            }
            match nix::unistd::Group::from_name(g) {
                Ok(Some(grp)) => gids.push(grp.gid.as_raw()),
                Ok(None) => return Err(AccessError::NoGroup { group: g.clone() }),
                Err(source) => {
                    return Err(AccessError::Lookup {
                        group: g.clone(),
                        source,
                    })
                }
            }
        }
        Ok(Access { gids })
    }

    /// Whether a peer with `uid` and groups `groups` may talk to the daemon.
    pub fn allows(&self, uid: u32, groups: &[u32]) -> bool {
        uid == 0 || groups.iter().any(|g| self.gids.contains(g))
    }
}

/// The groups of process `pid`: its `Gid`s and supplementary `Groups` from `/proc/PID/status`.
pub fn groups_of(pid: i32, primary: u32) -> Vec<u32> {
    let mut out = vec![primary];
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in text.lines() {
            if let Some(rest) = line
                .strip_prefix("Groups:")
                .or_else(|| line.strip_prefix("Gid:"))
            {
                out.extend(
                    rest.split_whitespace()
                        .filter_map(|g| g.parse::<u32>().ok()),
                );
            }
        }
    }
    out
}

/// What the server serves: one request at a time.
pub trait Handler: Send + 'static {
    fn handle(&mut self, req: Request) -> serde_json::Value;
}

/// Lock `m`, taking it over from a thread that panicked while holding it (every request leaves
/// the daemon consistent before returning; a panic mid-request is a bug that is logged).
pub fn lock<H>(m: &Mutex<H>) -> MutexGuard<'_, H> {
    m.lock().unwrap_or_else(|poisoned| {
        log::error!("a request handler panicked; serving on");
        poisoned.into_inner()
    })
}

/// Bind `path`: a stale socket (nobody answers) is replaced; a live one means another daemon.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(std::io::Error::other(format!(
                "{} exists and is not a socket",
                path.display()
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::other(format!(
                "another daemon is listening on {}",
                path.display()
            )));
        }
        log::info!("removing the stale socket {}", path.display());
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let l = UnixListener::bind(path)?;
    // Everyone may connect; SO_PEERCRED decides who is served (and the refused get a reply).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// Accept connections for ever, one thread each.
pub fn serve<H: Handler>(
    listener: UnixListener,
    handler: Arc<Mutex<H>>,
    access: Access,
    counts: Arc<RequestCounts>,
) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let h = Arc::clone(&handler);
                let a = access.clone();
                let c = Arc::clone(&counts);
                std::thread::spawn(move || connection(stream, &h, &a, &c));
            }
            Err(e) => log::warn!("accept: {e}"),
        }
    }
}

/// End a connection the server gives up on after its last reply. Closing a Unix socket with
/// unread input resets it, and the peer may then lose the reply it has not read yet: so stop
/// sending, and read (and drop) what the client still sends, for at most a second and 1 MiB.
fn close_after_reply(mut stream: UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(1)));
    let _ = std::io::copy(&mut (&mut stream).take(1 << 20), &mut std::io::sink());
}

/// Serve one connection until the client closes it.
pub fn connection<H: Handler>(
    mut stream: UnixStream,
    handler: &Mutex<H>,
    access: &Access,
    counts: &RequestCounts,
) {
    let cred = match getsockopt(&stream, PeerCredentials) {
        Ok(c) => c,
        Err(e) => {
            log::warn!("SO_PEERCRED: {e}; closing the connection");
            return;
        }
    };
    let groups = groups_of(cred.pid(), cred.gid());
    if !access.allows(cred.uid(), &groups) {
        log::warn!(
            "refused a client: pid {} uid {} gid {} is not root and not in an allowed group",
            cred.pid(),
            cred.uid(),
            cred.gid()
        );
        let reply = protocol::error(format!(
            "permission denied: uid {} is not root and not in a group trapd allows",
            cred.uid()
        ));
        counts.record("denied", false);
        let _ = writeln!(stream, "{reply}");
        close_after_reply(stream);
        return;
    }
    log::debug!("client pid {} uid {} connected", cred.pid(), cred.uid());
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX) + 1;
        let n = match reader.by_ref().take(limit).read_until(b'\n', &mut buf) {
            Ok(n) => n,
            Err(e) => {
                log::debug!("client pid {}: read: {e}", cred.pid());
                return;
            }
        };
        if n == 0 {
            return;
        }
        if buf.last() != Some(&b'\n') {
            if buf.len() > MAX_LINE {
                counts.record("invalid", false);
                let _ = writeln!(
                    stream,
                    "{}",
                    protocol::error(format!("request line longer than {MAX_LINE} bytes"))
                );
                close_after_reply(stream);
            } else {
                log::debug!(
                    "client pid {} closed mid-request ({} bytes); nothing done",
                    cred.pid(),
                    buf.len()
                );
            }
            return;
        }
        // Where a request's time goes (`trapd -v`): waiting for the daemon, handling it,
        // encoding and sending the reply.
        let started = std::time::Instant::now();
        let mut waited = std::time::Duration::ZERO;
        let mut handled = std::time::Duration::ZERO;
        let (op, reply) = match std::str::from_utf8(&buf) {
            Err(_) => ("invalid", protocol::error("bad request: not UTF-8")),
            Ok(line) => match Request::parse(line.trim_end()) {
                Err(e) => ("invalid", protocol::error(e)),
                Ok(req) => {
                    log::debug!("request from pid {}: {line}", cred.pid());
                    let op = req.op();
                    let mut h = lock(handler);
                    waited = started.elapsed();
                    let reply = h.handle(req);
                    handled = started.elapsed() - waited;
                    (op, reply)
                }
            },
        };
        counts.record(op, reply["ok"] == serde_json::Value::Bool(true));
        let before_reply = started.elapsed();
        let text = format!("{reply}\n");
        if stream.write_all(text.as_bytes()).is_err() {
            log::debug!("client pid {} left before its reply", cred.pid());
            return;
        }
        log::debug!(
            "timing: {op} from pid {}: parse {:.3} ms, waited {:.3} ms for the daemon, handled {:.3} ms, reply {:.3} ms ({} bytes)",
            cred.pid(),
            (before_reply - waited - handled).as_secs_f64() * 1e3,
            waited.as_secs_f64() * 1e3,
            handled.as_secs_f64() * 1e3,
            (started.elapsed() - before_reply).as_secs_f64() * 1e3,
            text.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// Records every request it is given and answers with its count.
    #[derive(Default)]
    struct Recorder(Vec<Request>);

    impl Handler for Recorder {
        fn handle(&mut self, req: Request) -> Value {
            self.0.push(req);
            protocol::ok(json!({ "n": self.0.len() }))
        }
    }

    fn exchange(input: &[u8]) -> (Vec<Value>, Vec<Request>) {
        exchange_counted(input, &Arc::new(RequestCounts::default()))
    }

    fn exchange_counted(input: &[u8], counts: &Arc<RequestCounts>) -> (Vec<Value>, Vec<Request>) {
        let (mut client, server) = UnixStream::pair().unwrap();
        let h = Arc::new(Mutex::new(Recorder::default()));
        let h2 = Arc::clone(&h);
        let c = Arc::clone(counts);
        let t = std::thread::spawn(move || connection(server, &h2, &Access::default(), &c));
        client.write_all(input).unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let mut out = String::new();
        client.read_to_string(&mut out).unwrap();
        t.join().unwrap();
        let replies = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let reqs = std::mem::take(&mut lock(&h).0);
        (replies, reqs)
    }

    #[test]
    fn each_line_gets_one_reply_and_malformed_lines_do_not_reach_the_handler() {
        let (replies, reqs) = exchange(
            b"{\"op\":\"list\"}\nnot json\n\xff\xfe\n{\"op\":\"nope\"}\n{\"op\":\"status\"}\n",
        );
        assert_eq!(replies.len(), 5);
        assert_eq!(replies[0], json!({"ok": true, "n": 1}));
        for r in &replies[1..4] {
            assert_eq!(r["ok"], json!(false));
            assert!(
                r["error"].as_str().unwrap().starts_with("bad request"),
                "{r}"
            );
        }
        assert_eq!(replies[4], json!({"ok": true, "n": 2}));
        assert_eq!(reqs, vec![Request::List, Request::Status]);
    }

    #[test]
    fn every_answer_is_counted_by_op_and_errors_are_counted_apart() {
        let counts = Arc::new(RequestCounts::default());
        exchange_counted(b"{\"op\":\"list\"}\nnot json\n{\"op\":\"list\"}\n{\"op\":\"nope\"}\n{\"op\":\"status\"}\n{\"op\":\"stat", &counts);
        let snap = counts.snapshot();
        assert_eq!(
            snap["list"],
            RequestCount {
                total: 2,
                errors: 0
            }
        );
        assert_eq!(
            snap["status"],
            RequestCount {
                total: 1,
                errors: 0
            }
        );
        assert_eq!(
            snap["invalid"],
            RequestCount {
                total: 2,
                errors: 2
            },
            "the cut-off line is no answer"
        );
        assert_eq!(snap.len(), 3);
        // A reply with "ok": false from the handler is an error of its op.
        counts.record("activate", false);
        assert_eq!(
            counts.snapshot()["activate"],
            RequestCount {
                total: 1,
                errors: 1
            }
        );
    }

    #[test]
    fn a_request_cut_off_by_the_client_closing_is_never_handled() {
        let (replies, reqs) =
            exchange(b"{\"op\":\"list\"}\n{\"op\":\"activate\",\"profile\":\"lossy\"}");
        assert_eq!(replies.len(), 1);
        assert_eq!(reqs, vec![Request::List]);
    }

    #[test]
    fn an_overlong_line_is_refused_and_ends_the_connection() {
        let mut input = vec![b'x'; MAX_LINE + 10];
        input.extend_from_slice(b"\n{\"op\":\"list\"}\n");
        let (replies, reqs) = exchange(&input);
        assert_eq!(replies.len(), 1);
        assert!(replies[0]["error"]
            .as_str()
            .unwrap()
            .contains("longer than"));
        assert!(reqs.is_empty());
    }

    #[test]
    fn a_reply_before_closing_on_unread_input_still_reaches_the_client() {
        let (mut client, mut server) = UnixStream::pair().unwrap();
        // The client sends before reading, as `trapd send` does; the server never reads it.
        let sender = {
            let mut c = client.try_clone().unwrap();
            std::thread::spawn(move || {
                let _ = c.write_all(&vec![b'x'; 200_000]);
                let _ = c.shutdown(std::net::Shutdown::Write);
            })
        };
        writeln!(server, "{}", protocol::error("permission denied")).unwrap();
        close_after_reply(server);
        let mut out = String::new();
        client.read_to_string(&mut out).unwrap();
        assert_eq!(
            out.trim_end(),
            r#"{"error":"permission denied","ok":false}"#
        );
        sender.join().unwrap();
    }

    #[test]
    fn root_and_allowed_groups_pass_others_are_refused() {
        let a = Access { gids: vec![1234] };
        assert!(a.allows(0, &[0]));
        assert!(a.allows(1000, &[1000, 1234]));
        assert!(!a.allows(65534, &[65534]));
        assert!(!Access::default().allows(1000, &[1000]));
        assert_eq!(Access::from_groups(&["42".into()]).unwrap().gids, vec![42]);
        let e = Access::from_groups(&["no-such-group-trapd".into()]).unwrap_err();
        assert!(
            matches!(&e, AccessError::NoGroup { group } if group == "no-such-group-trapd"),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "allow_groups: no group named `no-such-group-trapd`"
        );
    }

    #[test]
    fn groups_of_this_process_include_its_gid() {
        let gid = nix::unistd::getgid().as_raw();
        let pid = i32::try_from(std::process::id()).unwrap();
        assert!(groups_of(pid, gid).contains(&gid));
    }
}
