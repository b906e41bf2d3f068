//! trapctl reads trapd's replies back as the typed reply of the request it sent: a `splice`
//! trapd holds as pending (its module not loaded) and an `unsplice` that forgets a pending
//! point are answered with fields unlike a made or removed splice's, and trapctl says what
//! happened instead of failing to read them. The daemon here is a fake on a Unix socket that
//! answers each request line with a canned reply and records the line.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

/// Serve one connection at `socket`, answering its one request with `reply`; the request.
fn fake_trapd(socket: &Path, reply: Value) -> std::thread::JoinHandle<Value> {
    let l = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        writeln!(s, "{reply}").unwrap();
        serde_json::from_str(&line).unwrap()
    })
}

fn trapctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(args)
        .env("TRAPD_SOCKET", socket)
        .output()
        .unwrap()
}

#[test]
fn a_pending_splice_through_trapd_is_reported_as_pending() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("trapd.sock");
    let daemon = fake_trapd(
        &socket,
        json!({"ok": true, "pending": true, "at": "tv_mod:f", "module": "tv_mod"}),
    );
    let out = trapctl(&socket, &["splice", "tv_mod:f", "--count"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "pending tv_mod:f: trapd makes it when module tv_mod loads\n"
    );
    let sent = daemon.join().unwrap();
    assert_eq!(sent["op"], "splice");
    assert_eq!(sent["at"], "tv_mod:f");
}

#[test]
fn unsplicing_a_pending_point_through_trapd_says_it_was_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("trapd.sock");
    let daemon = fake_trapd(
        &socket,
        json!({"ok": true, "at": "tv_mod:f", "pending": true, "hits": 12}),
    );
    let out = trapctl(&socket, &["unsplice", "tv_mod:f"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "forgot pending point tv_mod:f after 12 hits\n");
    assert_eq!(
        daemon.join().unwrap(),
        json!({"op": "unsplice", "at": "tv_mod:f"})
    );
}

#[test]
fn a_reply_missing_its_fields_is_an_error_naming_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("trapd.sock");
    let daemon = fake_trapd(&socket, json!({"ok": true, "symbol": "v"}));
    let out = trapctl(&socket, &["get", "v"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("trapctl: trapd's reply to `get`: missing field"),
        "{stderr}"
    );
    daemon.join().unwrap();
}
