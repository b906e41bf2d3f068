//! `trapctl -p PID trace` on a packaged server nobody here wrote (issue 30): Debian's lighttpd
//! (installed by .ci/install-deps), run in the foreground (`-D`) with a four-line config,
//! serving a file. A one-liner counts libc's `accept4` by its result (as an int: glibc returns
//! -1 in eax, with rax's upper half zero) while N requests are made one after another: exactly N
//! succeed; then Ctrl-C (SIGINT) ends the trace: the probes are removed, the agent's
//! channel stopped, the text of every mapping byte for byte as before, and the server still
//! answers. Needs lighttpd and the built agent.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod attach_common;
use attach_common::{changed, mappings, p_trace, text};

const BODY: &str = "served by lighttpd under trapvec\n";

/// One request on a connection of its own, read to the end: whether the file came back whole.
fn get(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    s.read_to_string(&mut reply).is_ok()
        && reply.starts_with("HTTP/1.0 200 OK\r\n")
        && reply.ends_with(&format!("\r\n\r\n{BODY}"))
}

/// lighttpd, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `lighttpd -D` serving DIR/www on a free port of 127.0.0.1, once it answers.
fn lighttpd(dir: &Path) -> (Server, u16) {
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), BODY).unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.join("lighttpd.conf");
    std::fs::write(
        &conf,
        format!(
            "server.document-root = \"{}\"\nserver.bind = \"127.0.0.1\"\nserver.port = {port}\nserver.errorlog = \"{}\"\n",
            www.display(),
            dir.join("error.log").display()
        ),
    )
    .unwrap();
    let child = Command::new("lighttpd")
        .arg("-D")
        .arg("-f")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("lighttpd (Debian package lighttpd, installed by .ci/install-deps) is needed");
    let mut server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get(port) {
        assert!(
            server.0.try_wait().unwrap().is_none(),
            "lighttpd exited: {}",
            std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "lighttpd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, port)
}

#[test]
fn trace_with_p_counts_lighttpds_accepts_one_per_request_and_leaves_it_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (server, port) = lighttpd(dir.path());
    let pid = server.0.id();
    // Requests before the trace are not counted.
    for _ in 0..5 {
        assert!(get(port), "a request failed before the trace");
    }
    let before = mappings(pid);
    assert!(
        before.iter().any(|(l, _)| l.contains("/libc.so.6")),
        "libc's text among {:?}",
        before.iter().map(|(l, _)| l).collect::<Vec<_>>()
    );
    let (t, mut out, line) = p_trace(
        &pid.to_string(),
        &[
            "-e",
            "libc.so.6:accept4:return { @accepted[(s32)retval >= 0] = count() }",
        ],
    );
    assert!(
        line.starts_with("tracing 1 probe(s) in process "),
        "trapctl said `{line}`"
    );
    assert!(
        changed(pid, &before).is_some_and(|(r, _)| r.contains("/libc.so.6")),
        "the probe's trap is in libc's text"
    );
    const N: usize = 40;
    for i in 0..N {
        assert!(get(port), "request {i} failed while traced");
    }
    let kill = Command::new("kill")
        .args(["-INT", &t.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = t.wait_with_output().unwrap();
    // Ctrl-C: the maps printed, then trapctl ends by SIGINT, as `trapctl count` does.
    assert_eq!(o.status.signal(), Some(2), "{}\n{line}{rest}", text(&o));
    // Each request is one connection, accepted by one accept4 that returns its descriptor.
    assert!(rest.contains(&format!("@accepted[1]: {N}\n")), "{rest}");
    // lighttpd accepts until the listening socket has no more: each wakeup ends with one accept4
    // that fails (EAGAIN), unless the next request's connection came in meanwhile (the reply
    // is written between two accept4 calls), so there are at most N of those.
    let failed = rest
        .lines()
        .find_map(|l| l.strip_prefix("@accepted[0]: "))
        .map_or(0, |n| n.parse::<usize>().unwrap());
    assert!(failed <= N, "{rest}");
    assert_eq!(
        rest.lines().filter(|l| l.starts_with("@accepted[")).count(),
        1 + usize::from(failed > 0),
        "{rest}"
    );
    // Detached: every mapping's text as before, and the server still answers.
    assert_eq!(changed(pid, &before), None, "the text is not as it was");
    for i in 0..5 {
        assert!(get(port), "request {i} after the trace failed");
    }
    let name = format!("agent-{pid}.sock");
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap();
    assert!(!unix.contains(&name), "{name} still bound after the trace");
    drop(server);
}
