//! Talking to a running trapd: what `trapctl` uses to go through the daemon when one is
//! listening (and straight to `/dev/trapvec` otherwise), and what `trapd send` uses.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::protocol::{Reply, Request};

/// The socket trapd listens on unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/trapd.sock";

/// `$TRAPD_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    std::env::var_os("TRAPD_SOCKET").map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from)
}

/// Whether a daemon accepts connections at `path`.
pub fn is_listening(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

/// Send `request` to the daemon at `path` and read its reply as an `R` (the reply's fields;
/// `"ok"` is not part of it); `None` when no daemon listens there, so the caller goes to the
/// module itself. A reply with `"ok": false` is an error carrying the daemon's message.
pub fn call<R: serde::de::DeserializeOwned>(
    path: &Path,
    request: &Request,
) -> Option<anyhow::Result<R>> {
    let request = match serde_json::to_value(request) {
        Ok(r) => r,
        Err(e) => return Some(Err(e.into())),
    };
    let reply = try_daemon_at(path, &request)?;
    Some(reply.and_then(|v| {
        serde_json::from_value(v)
            .map_err(|e| anyhow::anyhow!("trapd's reply to `{}`: {e}", request["op"]))
    }))
}

/// Send `request` to the daemon at `path` and read its reply back as the [`Reply`] to that
/// request; `None` when no daemon listens there. A reply with `"ok": false` is an error
/// carrying the daemon's message.
pub fn ask(path: &Path, request: &Request) -> Option<anyhow::Result<Reply>> {
    let reply = call::<Value>(path, request)?;
    Some(reply.and_then(|mut fields| {
        if let Value::Object(m) = &mut fields {
            m.remove("ok");
        }
        Reply::from_fields(request, fields)
            .map_err(|e| anyhow::anyhow!("trapd's reply to `{}`: {e}", request.op()))
    }))
}

/// Send `request` to the daemon at `path` and return its reply; `None` when no daemon is
/// listening there (no socket, or nobody accepting), so the caller goes to the module itself.
/// A reply with `"ok": false` is returned as an error carrying the daemon's message.
pub fn try_daemon_at(path: &Path, request: &Value) -> Option<anyhow::Result<Value>> {
    let stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            log::debug!("no trapd at {}: {e}", path.display());
            return None;
        }
        Err(e) => {
            return Some(Err(anyhow::anyhow!(
                "connecting to trapd at {}: {e}",
                path.display()
            )))
        }
    };
    log::debug!("going through trapd at {}", path.display());
    Some(exchange_one(stream, request).and_then(|reply| {
        if reply["ok"] == Value::Bool(true) {
            Ok(reply)
        } else {
            Err(anyhow::anyhow!(
                "trapd: {}",
                reply["error"].as_str().unwrap_or("request refused")
            ))
        }
    }))
}

/// Whether `error`, trapd's answer to a request, says it does not know the request's `op` (a
/// trapd older than the request: it answers an unknown op as any malformed line, with an
/// error naming it, and serves on), so a client can fall back to an older request.
pub fn is_unknown_op(error: &anyhow::Error, op: &str) -> bool {
    format!("{error:#}").contains(&format!("unknown variant `{op}`"))
}

/// Whether `error`, trapd's answer to a request, says it does not know the request's field
/// `field` (a trapd older than that field refuses the request whole, changing nothing).
pub fn is_unknown_field(error: &anyhow::Error, field: &str) -> bool {
    format!("{error:#}").contains(&format!("unknown field `{field}`"))
}

fn exchange_one(mut stream: UnixStream, request: &Value) -> anyhow::Result<Value> {
    // The line whole, then one write: `writeln!` on the socket wrote each piece the serializer
    // made (a quote, a string, a comma) with a syscall of its own, some 40,000 for a `remove`
    // of 10,000 sites, seconds under emulation.
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    if line.is_empty() {
        anyhow::bail!("trapd closed the connection without a reply");
    }
    Ok(serde_json::from_str(&line)?)
}

/// Send `bytes` as they are (request lines; a last line without a newline is a request cut off),
/// close the sending side, and return every reply line until the daemon closes.
pub fn exchange(path: &Path, bytes: &[u8]) -> std::io::Result<Vec<String>> {
    let mut stream = UnixStream::connect(path)?;
    let reader_stream = stream.try_clone()?;
    // Read replies while writing, so neither side's buffer fills up waiting for the other.
    // A reset after some replies (the daemon gave up on the connection) keeps those replies.
    let reader = std::thread::spawn(move || -> std::io::Result<Vec<String>> {
        let mut replies = Vec::new();
        for line in BufReader::new(reader_stream).lines() {
            match line {
                Ok(l) => replies.push(l),
                Err(e) if replies.is_empty() => return Err(e),
                Err(e) => {
                    log::debug!("reading from trapd: {e}");
                    break;
                }
            }
        }
        Ok(replies)
    });
    // The daemon may close early (a refusal, an overlong line): then a write fails; the replies
    // received so far are still returned.
    if let Err(e) = stream.write_all(bytes) {
        log::debug!("sending to trapd: {e}");
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    reader
        .join()
        .map_err(|_| std::io::Error::other("reply reader panicked"))?
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use serde_json::json;

    use super::*;

    /// A one-connection daemon that answers the first line with `reply`; returns the line.
    fn fake_daemon(path: &Path, reply: Value) -> std::thread::JoinHandle<String> {
        let l = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            writeln!(s, "{reply}").unwrap();
            line
        })
    }

    #[test]
    fn no_daemon_means_none_so_the_caller_goes_to_the_module() {
        let dir = tempfile::tempdir().unwrap();
        assert!(try_daemon_at(&dir.path().join("absent.sock"), &json!({"op": "list"})).is_none());
        // A socket file nobody listens on (a daemon that was killed) is no daemon either.
        let path = dir.path().join("stale.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(try_daemon_at(&path, &json!({"op": "list"})).is_none());
    }

    #[test]
    fn the_request_goes_as_one_line_and_ok_false_becomes_the_daemons_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let t = fake_daemon(&path, json!({"ok": true, "value": 1000}));
        let reply = try_daemon_at(&path, &json!({"op": "get", "symbol": "mss_clamp_mtu"}))
            .unwrap()
            .unwrap();
        assert_eq!(reply["value"], json!(1000));
        assert_eq!(
            serde_json::from_str::<Value>(&t.join().unwrap()).unwrap(),
            json!({"op": "get", "symbol": "mss_clamp_mtu"})
        );
        let path = dir.path().join("b.sock");
        let t = fake_daemon(
            &path,
            json!({"ok": false, "error": "no live splice at `f`"}),
        );
        let err = try_daemon_at(&path, &json!({"op": "unsplice", "at": "f"}))
            .unwrap()
            .unwrap_err();
        assert_eq!(err.to_string(), "trapd: no live splice at `f`");
        assert!(!is_unknown_op(&err, "unsplice"));
        t.join().unwrap();
    }

    #[test]
    fn an_op_the_daemon_does_not_know_is_told_from_other_refusals() {
        // What a trapd without `frob` answers: the parser's error for an unknown op.
        let unknown = crate::protocol::Request::parse(r#"{"op":"frob","min_hits":1}"#)
            .map(|_| ())
            .unwrap_err();
        let reply = crate::protocol::error(unknown);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sock");
        let t = fake_daemon(&path, reply);
        let err = try_daemon_at(&path, &json!({"op": "frob", "min_hits": 1}))
            .unwrap()
            .unwrap_err();
        t.join().unwrap();
        assert!(is_unknown_op(&err, "frob"), "{err:#}");
        assert!(!is_unknown_op(&err, "hits"), "another op: {err:#}");
        // A known op refused for another reason is not an unknown op.
        let e = anyhow::anyhow!("trapd: no live splice has id 9 (0 live); nothing was read");
        assert!(!is_unknown_op(&e, "hits"));
    }

    #[test]
    fn a_field_the_daemon_does_not_know_is_told_from_other_refusals() {
        // What a trapd without apply's `later` answers: the parser's error for the field.
        let line = r#"{"op":"apply","spec":"/s.json","later":true}"#;
        let unknown = crate::protocol::Request::parse(line)
            .map(|_| ())
            .unwrap_err();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sock");
        let t = fake_daemon(&path, crate::protocol::error(unknown));
        let err = try_daemon_at(&path, &serde_json::from_str(line).unwrap())
            .unwrap()
            .unwrap_err();
        t.join().unwrap();
        assert!(is_unknown_field(&err, "later"), "{err:#}");
        assert!(!is_unknown_field(&err, "brief"), "another field: {err:#}");
        assert!(!is_unknown_op(&err, "apply"), "the op is known: {err:#}");
        let e = anyhow::anyhow!("trapd: spec /s.json: no such file");
        assert!(!is_unknown_field(&e, "later"));
    }
}
