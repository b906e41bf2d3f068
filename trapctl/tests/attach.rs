//! `trapctl -p PID ...` against running processes, on the host: `fixtures/attach/loop.c` (a
//! function called on command, a thread blocked in read() on a FIFO, a busy thread) attached,
//! counted live, detached; each refusal that can be produced here; a `python3 -m http.server`
//! counted at `libc.so.6:accept4` while it serves. Needs cc, python3 and the built agent.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod attach_common;
use attach_common::{agent, cc, text, trapctl, try_compile, LoopFixture};

/// The loop fixture, running (`LoopFixture`), with the address of `work` and the FIFO its
/// reader thread is blocked on.
struct Loop {
    f: LoopFixture,
    work: u64,
    fifo: PathBuf,
    _dir: tempfile::TempDir,
}

impl Loop {
    fn start(static_: bool) -> Loop {
        Loop::start_with(static_, false)
    }

    /// Under the LD_PRELOAD agent with `spec` and `TRAPVEC_CONTROL=1`.
    fn start_preloaded(spec: &Path) -> Loop {
        Loop::start_full(false, false, Some(spec))
    }

    fn start_with(static_: bool, slow_lib: bool) -> Loop {
        Loop::start_full(static_, slow_lib, None)
    }

    /// `slow_lib`: a thread dlopens `slowlib.c`, whose constructor holds the loader's lock 3 s.
    fn start_full(static_: bool, slow_lib: bool, preload: Option<&Path>) -> Loop {
        let dir = tempfile::tempdir().unwrap();
        let cc_args: &[&str] = if static_ { &["-static"] } else { &[] };
        let f = LoopFixture::start_with(dir.path(), cc_args, |cmd| {
            if slow_lib {
                cmd.arg(cc(
                    dir.path(),
                    "slowlib.c",
                    "slowlib.so",
                    &["-shared", "-fPIC"],
                ));
            }
            if let Some(spec) = preload {
                cmd.env("LD_PRELOAD", agent())
                    .env("TRAPVEC_SPEC", spec)
                    .env("TRAPVEC_CONTROL", "1");
            }
        });
        // Let the threads reach their read() and their loop.
        std::thread::sleep(Duration::from_millis(100));
        Loop {
            work: f.work_address(),
            fifo: dir.path().join("fifo"),
            f,
            _dir: dir,
        }
    }

    fn pid(&self) -> String {
        self.f.pid.clone()
    }

    /// Call `work` n times; the program's total.
    fn calls(&mut self, n: u64) -> u64 {
        self.f.calls(n)
    }

    fn text_at_work(&self) -> [u8; 16] {
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.f.pid)).unwrap();
        let mut b = [0u8; 16];
        mem.read_exact_at(&mut b, self.work).unwrap();
        b
    }
}

/// The hits of every splice, from `trapctl -p PID list --json`.
fn live_hits(pid: &str) -> Vec<u64> {
    let o = trapctl(&["-p", pid, "list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hits"].as_u64().unwrap())
        .collect()
}

fn count_spec(dir: &Path, at: &str) -> PathBuf {
    let spec = dir.join("spec.toml");
    std::fs::write(
        &spec,
        format!("[[splice]]\nat = \"{at}\"\naction = \"count\"\n"),
    )
    .unwrap();
    spec
}

#[test]
fn attach_counts_live_hits_and_detach_restores_the_text_and_the_blocked_read() {
    let mut p = Loop::start(false);
    let pid = p.pid();
    let before = p.text_at_work();
    let o = trapctl(&["-v", "-p", &pid, "attach"]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("held stopped") && err.contains("3 threads"),
        "-v prints the threads and the time they were held: {err}"
    );
    assert!(
        err.contains("(2 in a restartable system call)"),
        "main in read(stdin), the reader in read(fifo): {err}"
    );
    let spec_dir = tempfile::tempdir().unwrap();
    let spec = count_spec(spec_dir.path(), "work");
    let o = trapctl(&["-p", &pid, "apply", spec.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(&p.text_at_work()[..2], &[0xCD, 0xF5], "the trap is written");
    let total = p.calls(1000);
    assert_eq!(total, 1000);
    assert_eq!(
        live_hits(&pid),
        vec![1000],
        "live hits equal the calls made"
    );
    let total = p.calls(234);
    assert_eq!(live_hits(&pid), vec![total], "and grow while it runs");
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("1 splice(s) removed"),
        "{}",
        text(&o)
    );
    assert_eq!(p.text_at_work(), before, "text byte-identical after detach");
    assert_eq!(p.calls(10), total + 10, "the program goes on");
    // The reader thread was stopped inside read(): the data written now is read whole, and no
    // EINTR was seen (the fixture exits 3 on any read error).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p.fifo)
        .unwrap()
        .write_all(b"hello after detach")
        .unwrap();
    let mut line = String::new();
    p.f.stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "read 18: hello after detach");
    writeln!(p.f.stdin, "quit").unwrap();
    let status = p.f.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the program exits as it would have");
    // The channel is gone with the detach: nothing answers on the agent's socket.
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(!o.status.success());
}

#[test]
fn attach_lets_the_threads_go_when_its_dlopen_waits_for_a_lock_one_of_them_holds() {
    let mut p = Loop::start_with(false, true);
    let pid = p.pid();
    // The loader thread is inside slowlib's constructor, holding the loader's lock, for 3 s.
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    // The other threads are let go before the dlopen (only the calling thread is held for
    // it), so the loader thread finishes its constructor and the dlopen goes on; they were
    // held for the stop alone (before, 1 s at least: until the call had waited that long).
    let o = trapctl(&["-v", "-p", &pid, "attach"]);
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let p50: u64 = stderr
        .split("held stopped: p50 ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figures: {}", text(&o)));
    assert!(p50 < 500_000, "held p50 {p50} µs: {}", text(&o));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let spec_dir = tempfile::tempdir().unwrap();
    let spec = count_spec(spec_dir.path(), "work");
    let o = trapctl(&["-p", &pid, "apply", spec.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(p.calls(77), 77);
    assert_eq!(live_hits(&pid), vec![77]);
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    writeln!(p.f.stdin, "quit").unwrap();
    // The reader never got data: 4, not a crash.
    assert_eq!(p.f.child.wait().unwrap().code(), Some(4));
}

#[test]
fn a_preloaded_agent_with_trapvec_control_serves_live_figures() {
    let spec_dir = tempfile::tempdir().unwrap();
    let spec = count_spec(spec_dir.path(), "work");
    let mut p = Loop::start_preloaded(&spec);
    let pid = p.pid();
    assert_eq!(p.calls(321), 321);
    assert_eq!(
        live_hits(&pid),
        vec![321],
        "the spec's splice, read while it runs"
    );
    assert_eq!(p.calls(9), 330);
    assert_eq!(live_hits(&pid), vec![330]);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert_eq!(
        maps.lines()
            .filter(|l| l.contains("libtrapvec_agent.so") && l.contains(" 00000000 "))
            .count(),
        1,
        "no second agent was loaded: the preloaded one answered"
    );
}

#[test]
fn attach_twice_reuses_the_agent_and_a_second_detach_cycle_works() {
    let mut p = Loop::start(false);
    let pid = p.pid();
    let before = p.text_at_work();
    let spec_dir = tempfile::tempdir().unwrap();
    let spec = count_spec(spec_dir.path(), "work");
    for round in 0..3 {
        // apply attaches by itself when no agent answers.
        let o = trapctl(&["-p", &pid, "apply", spec.to_str().unwrap()]);
        assert!(o.status.success(), "round {round}: {}", text(&o));
        p.calls(100);
        assert_eq!(live_hits(&pid), vec![100], "round {round}");
        let o = trapctl(&["-p", &pid, "detach"]);
        assert!(o.status.success(), "round {round}: {}", text(&o));
        assert_eq!(p.text_at_work(), before, "round {round}");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert_eq!(
        maps.lines()
            .filter(|l| l.contains("libtrapvec_agent.so") && l.contains(" 00000000 "))
            .count(),
        1,
        "the agent is loaded once"
    );
}

#[test]
fn attach_refuses_a_process_another_tracer_holds_and_changes_nothing() {
    let p = Loop::start(false);
    let pid = p.f.child.id().cast_signed();
    // SAFETY: seizing our own child; PTRACE_SEIZE does not stop it.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0usize, 0usize) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let before = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let o = trapctl(&["-p", &pid.to_string(), "attach"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!(
            "process {pid} is already traced by process {}",
            // SAFETY: gettid has no preconditions (TracerPid is the tracing thread).
            unsafe { libc::gettid() }
        )),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap(),
        before,
        "nothing was loaded"
    );
}

#[test]
fn attach_refuses_a_static_binary_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe.c");
    std::fs::write(&probe, "int main(void){return 0;}\n").unwrap();
    if !try_compile("cc", dir.path(), &["-static", "-o", "probe", "probe.c"])
        .status
        .success()
    {
        eprintln!("skipped: this toolchain cannot link -static (no libc.a)");
        return;
    }
    let p = Loop::start(true);
    let o = trapctl(&["-p", &p.pid(), "attach"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is statically linked"),
        "{}",
        text(&o)
    );
}

#[test]
fn attach_refuses_a_process_of_another_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run trapctl as another user (setpriv)");
        return;
    }
    let p = Loop::start(false);
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_trapctl"))
        .args(["-p", &p.pid(), "attach"])
        .env("TRAPVEC_AGENT", agent())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "process {} belongs to uid 0, not to you (uid 65534)",
            p.pid()
        )),
        "{}",
        text(&o)
    );
}

#[test]
fn the_agents_channel_refuses_a_peer_of_another_uid_by_its_credentials() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run trapctl as another user (setpriv)");
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mut p = Loop::start(false);
    let pid = p.pid();
    let o = trapctl(&["-p", &pid, "attach"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let socket = PathBuf::from(out.trim().rsplit(' ').next().unwrap());
    // Open the socket's file to everyone: only the credentials check is left to refuse.
    let dir = socket.parent().unwrap();
    let dir_mode = std::fs::metadata(dir).unwrap().permissions().mode();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let as_nobody = || {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_trapctl"))
            .args(["-p", &pid, "list"])
            .output()
            .unwrap()
    };
    // trapctl's probe of the socket connects and closes at once: the agent's answer to it must
    // not raise SIGPIPE in the process (it did, and killed it: the request after the probe then
    // read a reset, or found the process gone).
    let tries: Vec<Output> = (0..3).map(|_| as_nobody()).collect();
    // Put the directory back before any assertion, so that a failure leaves it usable.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    for o in &tries {
        assert_eq!(o.status.code(), Some(1), "{}", text(o));
        assert!(
            String::from_utf8_lossy(&o.stderr)
                .contains("refused: uid 65534 is not the process's (0) nor root"),
            "{}",
            text(o)
        );
        assert!(o.stdout.is_empty(), "nothing served: {}", text(o));
    }
    // The process's own uid is still served.
    assert_eq!(p.calls(5), 5);
    assert_eq!(live_hits(&pid), Vec::<u64>::new());
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One GET; whether it was answered 200 whole.
fn get(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if s.write_all(b"GET / HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).is_ok() && reply.starts_with(b"HTTP/1.0 200")
}

#[test]
fn attach_to_python_http_server_counts_accept4_while_it_serves_and_no_request_fails() {
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed for this test");
    let python = String::from_utf8(python.stdout).unwrap().trim().to_string();
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    let mut server = Command::new(&python)
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let pid = server.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !get(port) {
        assert!(Instant::now() < deadline, "http.server did not start");
        assert!(server.try_wait().unwrap().is_none(), "http.server exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let server = Kill(server);
    // Requests in a loop, all along: attach, apply, list, detach happen while it serves.
    let stop = Arc::new(AtomicBool::new(false));
    let (made, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load = {
        let (stop, made, failed) = (stop.clone(), made.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                made.fetch_add(1, SeqCst);
                if !get(port) {
                    failed.fetch_add(1, SeqCst);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let o = trapctl(&["-v", "-p", &pid, "attach"]);
    assert!(o.status.success(), "{}", text(&o));
    eprintln!("{}", String::from_utf8_lossy(&o.stderr).trim());
    let spec = count_spec(dir.path(), "libc.so.6:accept4");
    let o = trapctl(&["-p", &pid, "apply", spec.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // Counted while it serves: hits grow.
    std::thread::sleep(Duration::from_millis(300));
    let first = live_hits(&pid)[0];
    std::thread::sleep(Duration::from_millis(300));
    let second = live_hits(&pid)[0];
    assert!(
        second > first && first > 0,
        "hits grow: {first} then {second}"
    );
    // Then exactly: the loop paused, a known number of requests, one accept4 each.
    stop.store(true, SeqCst);
    load.join().unwrap();
    let before = live_hits(&pid)[0];
    for _ in 0..50 {
        assert!(get(port), "a request failed while spliced");
    }
    assert_eq!(live_hits(&pid)[0] - before, 50, "one accept4 per request");
    // Detach under load too.
    stop.store(false, SeqCst);
    let load = {
        let (stop, made, failed) = (stop.clone(), made.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                made.fetch_add(1, SeqCst);
                if !get(port) {
                    failed.fetch_add(1, SeqCst);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, SeqCst);
    load.join().unwrap();
    assert!(get(port), "still serving after detach");
    assert_eq!(
        failed.load(SeqCst),
        0,
        "no request failed (of {})",
        made.load(SeqCst)
    );
    drop(server);
}

/// `trapctl -p PID count AT --seconds N` spawned: its stdout, once it printed its `counting` line.
fn count_for(pid: &str, at: &str, seconds: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["-p", pid, "count", at, "--seconds", seconds])
        .env("TRAPVEC_AGENT", agent())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(
        line.starts_with(&format!("counting {at} at 0x")),
        "first line: `{line}`"
    );
    (c, out)
}

#[test]
fn count_with_p_attaches_counts_for_n_seconds_and_removes_its_splice() {
    let mut p = Loop::start(false);
    let pid = p.pid();
    let before = p.text_at_work();
    let (mut c, mut out) = count_for(&pid, "work", "1.5");
    assert_eq!(&p.text_at_work()[..2], &[0xCD, 0xF5], "the trap is written");
    assert_eq!(p.calls(777), 777);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(c.wait().unwrap().success());
    assert!(
        line.starts_with("work: 777 calls in 1.5 s ("),
        "the hits printed: `{line}`"
    );
    assert_eq!(p.text_at_work(), before, "the splice is removed");
    assert_eq!(live_hits(&pid), Vec::<u64>::new(), "no splice left");
    // `splice --count` leaves it live; `list` reads it.
    let o = trapctl(&["-p", &pid, "splice", "work", "--count"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("spliced work at 0x"),
        "{}",
        text(&o)
    );
    assert_eq!(p.calls(5), 782);
    assert_eq!(live_hits(&pid), vec![5]);
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(p.text_at_work(), before);
    // Without --seconds: refused with its reason.
    let o = trapctl(&["-p", &pid, "count", "work"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("needs --seconds N"),
        "{}",
        text(&o)
    );
}

#[test]
fn attach_to_sqlite3_blocked_in_read_counts_read_while_statements_are_fed_and_loses_none() {
    let mut sqlite = Command::new("sqlite3")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlite3 (/usr/bin/sqlite3) is needed for this test");
    let pid = sqlite.id().to_string();
    let mut stdin = sqlite.stdin.take().unwrap();
    writeln!(stdin, "create table t(x integer);").unwrap();
    stdin.flush().unwrap();
    // Blocked in read(0) on the pipe now.
    std::thread::sleep(Duration::from_millis(300));
    let o = trapctl(&["-v", "-p", &pid, "attach"]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("(1 in a restartable system call)"),
        "sqlite3's one thread held in read(): {err}"
    );
    let (mut c, mut out) = count_for(&pid, "libc.so.6:read", "3");
    let statement =
        |i: u64| format!("insert into t values({i}); select 'row', count(*), sum(x) from t;\n");
    for i in 1..=20 {
        stdin.write_all(statement(i).as_bytes()).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(c.wait().unwrap().success());
    let hits: u64 = line
        .strip_prefix("libc.so.6:read: ")
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("count said `{line}`"));
    assert!(
        hits >= 20,
        "at least one read() per statement written: {hits}"
    );
    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    for i in 21..=30 {
        stdin.write_all(statement(i).as_bytes()).unwrap();
    }
    drop(stdin);
    let o = sqlite.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "", "no error line");
    let want: String = (1..=30u64)
        .map(|i| format!("row|{i}|{}\n", i * (i + 1) / 2))
        .collect();
    assert_eq!(String::from_utf8_lossy(&o.stdout), want);
}
