//! `trapctl count` and `trapctl time` hold a splice for a while and end cleanly however they
//! end: SIGINT, SIGTERM and SIGHUP each remove the splice, print the figures, and end trapctl
//! by the same signal (as `perf stat`); `-- COMMAND` holds it while the command runs and exits
//! with the command's status; a trapctl killed by SIGKILL leaves an orphaned splice that
//! `trapctl list` names and `trapctl unsplice --orphans` removes. Ctrl-C on a terminal (a pty
//! whose ^C the kernel turns into SIGINT for the whole process group) reaches the command itself.
//!
//! The real binary runs against a daemon on a Unix socket (trapd's own server) whose handler
//! runs the real operations on the fake kernel (`trapvec::fake`), so the test sees the kernel's
//! side: the trap bytes, the dispatch entries. The fake has no return runtime: a `time` request
//! is made as a count there and its listing row carries a timer's figures. The same commands
//! straight on /dev/trapvec run in the VM (`vmtest/tests/kernel_signals.rs`).

mod fake_daemon;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use instr_manager::ops;
use instr_manager::splicer::Splicer;
use instr_manager::{Action, When};
use nix::sys::signal::{kill, SigHandler, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use trapvec::fake::{func_addr, FakeKernel};
use trapvec::returns::{Histogram, ReturnStats};
use trapvec_proto::protocol::{self, Request};
use trapvec_proto::server::Handler;

/// The fake daemon's handler here (served by `fake_daemon::serve`): splice, list and unsplice
/// by the operations layer, a `time` made as a count whose row carries a timer's figures.
struct HoldDaemon {
    sp: Splicer<FakeKernel>,
    /// Sites of the `time` requests (made as counts).
    timers: Vec<String>,
    /// Mark every owned splice orphaned, as a daemon in another pid namespace than trapctl
    /// would (the owner's pid means nothing there).
    claims_orphans: bool,
    /// How long making a splice takes.
    splice_delay: Duration,
}

/// What a timer's listing row carries: three calls of 1, 2 and 3 us.
fn timer_stats() -> ReturnStats {
    let mut h = Histogram::default();
    for ns in [1000u64, 2000, 3000] {
        h.buckets[trapvec::returns::bucket_of(ns)] += 1;
        h.sum += ns;
        h.max = h.max.max(ns);
    }
    ReturnStats {
        returns: 3,
        missed: 0,
        active: 0,
        histogram: Some(h),
    }
}

impl Handler for HoldDaemon {
    fn handle(&mut self, req: Request) -> Value {
        let reply = match req {
            Request::Splice(mut r) => {
                std::thread::sleep(self.splice_delay);
                let timer = matches!(r.action, Action::Time { .. });
                if timer {
                    r.action = Action::Count;
                    r.options.when = When::Entry;
                    r.options.maxactive = None;
                }
                ops::splice(&mut self.sp, &r).map(|(row, _)| {
                    if timer {
                        self.timers.push(row.site.clone());
                    }
                    serde_json::to_value(row).unwrap()
                })
            }
            Request::List => ops::listing(&self.sp).map(|mut l| {
                for row in l
                    .splices
                    .iter_mut()
                    .filter(|r| self.timers.contains(&r.site))
                {
                    row.returns = Some(timer_stats());
                }
                for row in l
                    .splices
                    .iter_mut()
                    .filter(|r| self.claims_orphans && r.owner.is_some())
                {
                    row.orphaned = true;
                }
                serde_json::to_value(l).unwrap()
            }),
            Request::Unsplice { at: Some(at), .. } => {
                ops::unsplice(&mut self.sp, &at).map(|u| serde_json::to_value(u).unwrap())
            }
            // `unsplice --orphans` removes the orphans in one request.
            req @ Request::Remove { .. } => {
                ops::execute(&mut self.sp, &req).map(|(reply, _)| reply.to_fields())
            }
            other => return protocol::error(format!("not served by this test: {other:?}")),
        };
        match reply {
            Ok(v) => protocol::ok(v),
            Err(e) => protocol::error(e),
        }
    }
}

/// A fake kernel and the daemon serving it on a socket in `dir`.
fn daemon(dir: &Path) -> (FakeKernel, PathBuf) {
    daemon_with(dir, false, Duration::ZERO)
}

fn daemon_with(dir: &Path, claims_orphans: bool, splice_delay: Duration) -> (FakeKernel, PathBuf) {
    let k = FakeKernel::new();
    let socket = fake_daemon::serve(
        dir,
        HoldDaemon {
            sp: Splicer::new(k.clone()),
            timers: Vec::new(),
            claims_orphans,
            splice_delay,
        },
    );
    (k, socket)
}

/// trapctl with `args` on the daemon at `socket`, its stdout piped, SIGINT, SIGTERM and SIGHUP
/// at their default actions whatever this test inherited (trapctl keeps ignored ones ignored).
fn start(socket: &Path, args: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trapctl"));
    cmd.arg("--socket")
        .arg(socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: sigaction (through nix's `signal`) is one, and nothing here allocates or locks.
    unsafe {
        cmd.pre_exec(|| {
            for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
                nix::sys::signal::signal(s, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The first line trapctl prints (the splice is live then).
fn announced(child: &mut Child, out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    if line.is_empty() {
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        panic!("trapctl printed nothing; stderr: {err}");
    }
    line
}

/// Wait for trapctl (at most 20 s); its status and the rest of its stdout.
fn finish(
    mut child: Child,
    mut out: BufReader<ChildStdout>,
) -> (std::process::ExitStatus, String, String) {
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "trapctl did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, rest, err)
}

fn signal(child: &Child, s: Signal) {
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), s).unwrap();
}

/// f0's count site: past its 5-byte ftrace NOP.
fn site(f: &str) -> u64 {
    func_addr(f) + 5
}

fn no_splices_left(k: &FakeKernel) {
    assert!(!k.trapped("f0"), "the trap is gone from f0");
    assert!(
        k.state().dispatch.is_empty(),
        "no dispatch entry left: {:?}",
        k.state().dispatch.keys()
    );
}

#[test]
fn count_until_a_signal_removes_its_splice_prints_the_calls_and_ends_by_that_signal() {
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        let dir = tempfile::tempdir().unwrap();
        let (k, socket) = daemon(dir.path());
        let (mut child, mut out) = start(&socket, &["count", "f0"]);
        let first = announced(&mut child, &mut out);
        assert_eq!(
            first,
            format!(
                "counting f0 at {:#x} until Ctrl-C (SIGINT, SIGTERM or SIGHUP)\n",
                site("f0")
            ),
            "{sig}"
        );
        assert!(k.trapped("f0"), "{sig}: live while counting");
        k.state().hits.insert(site("f0"), 42);
        signal(&child, sig);
        let (status, rest, err) = finish(child, out);
        assert_eq!(
            status.signal(),
            Some(sig as i32),
            "{sig}: trapctl ends by the signal it got ({status}); stderr: {err}"
        );
        assert!(
            rest.starts_with("f0: 42 calls in "),
            "{sig}: the figures are printed: {rest}"
        );
        assert!(rest.ends_with("/s)\n"), "{sig}: {rest}");
        no_splices_left(&k);
    }
}

#[test]
fn time_until_a_signal_removes_its_timer_and_prints_the_histogram() {
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        let dir = tempfile::tempdir().unwrap();
        let (k, socket) = daemon(dir.path());
        let (mut child, mut out) = start(&socket, &["time", "f0", "--json"]);
        let first = announced(&mut child, &mut out);
        assert_eq!(
            first,
            format!(
                "timing f0 at {:#x} until Ctrl-C (SIGINT, SIGTERM or SIGHUP) (wall clock)\n",
                site("f0")
            )
        );
        assert!(k.trapped("f0"));
        signal(&child, sig);
        let (status, rest, err) = finish(child, out);
        assert_eq!(
            status.signal(),
            Some(sig as i32),
            "{sig}: {status}; stderr: {err}"
        );
        let report: Value =
            serde_json::from_str(&rest).unwrap_or_else(|e| panic!("{sig}: {e}: {rest}"));
        assert_eq!(
            (report["count"].as_u64(), report["max_ns"].as_u64()),
            (Some(3), Some(3000)),
            "{sig}: {rest}"
        );
        assert_eq!(report["ended"], sig.as_str(), "{sig}: {rest}");
        no_splices_left(&k);
    }
}

#[test]
fn count_for_seconds_ends_by_time_with_status_0() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path());
    let (mut child, mut out) = start(&socket, &["count", "f0", "--seconds", "0.2"]);
    assert_eq!(
        announced(&mut child, &mut out),
        format!("counting f0 at {:#x} for 0.2 s\n", site("f0"))
    );
    let (status, rest, err) = finish(child, out);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(
        rest.split(" (").next(),
        Some("f0: 0 calls in 0.2 s"),
        "{rest}"
    );
    no_splices_left(&k);
}

#[test]
fn count_of_a_command_holds_the_splice_while_it_runs_and_exits_with_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path());
    let marker = dir.path().join("seen");
    // The command sees the splice live (it checks through the test's marker), then exits 7.
    let script = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; exit 7",
        marker.display()
    );
    let (mut child, mut out) = start(&socket, &["count", "f0", "--", "sh", "-c", &script]);
    assert_eq!(
        announced(&mut child, &mut out),
        format!(
            "counting f0 at {:#x} while `sh -c {script}` runs\n",
            site("f0")
        )
    );
    assert!(k.trapped("f0"), "live while the command runs");
    k.state().hits.insert(site("f0"), 5);
    std::fs::write(&marker, "").unwrap();
    let (status, rest, err) = finish(child, out);
    assert_eq!(status.code(), Some(7), "the command's exit status: {err}");
    assert!(rest.starts_with("f0: 5 calls in "), "{rest}");
    no_splices_left(&k);

    // A command killed by a signal: 128 + its number, as a shell reports it.
    k.state().hits.clear();
    let (mut child, mut out) = start(&socket, &["count", "f0", "--", "sh", "-c", "kill -USR1 $$"]);
    announced(&mut child, &mut out);
    let (status, rest, err) = finish(child, out);
    assert_eq!(status.code(), Some(128 + Signal::SIGUSR1 as i32), "{err}");
    assert!(rest.starts_with("f0: 0 calls in "), "{rest}");
    no_splices_left(&k);

    // A command that fails to start leaves nothing.
    let (mut child, mut out) = start(&socket, &["count", "f0", "--", "/nonexistent/program"]);
    announced(&mut child, &mut out);
    let (status, _, err) = finish(child, out);
    assert_eq!(status.code(), Some(1));
    assert!(
        err.starts_with("trapctl: running `/nonexistent/program`: "),
        "{err}"
    );
    no_splices_left(&k);
}

#[test]
fn a_signal_sent_to_trapctl_is_forwarded_to_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path());
    let (mut child, mut out) = start(&socket, &["count", "f0", "--", "sleep", "30"]);
    announced(&mut child, &mut out);
    let t = Instant::now();
    signal(&child, Signal::SIGTERM);
    let (status, rest, err) = finish(child, out);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the sleep was ended by the forwarded SIGTERM"
    );
    assert_eq!(
        status.signal(),
        Some(Signal::SIGTERM as i32),
        "{status}: {err}"
    );
    assert!(rest.starts_with("f0: 0 calls in "), "{rest}");
    no_splices_left(&k);
}

#[test]
fn a_count_killed_by_sigkill_leaves_an_orphan_that_list_names_and_unsplice_orphans_removes() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path());
    let run = |args: &[&str]| {
        let o = fake_daemon::trapctl(&socket, args);
        (
            o.status.code(),
            String::from_utf8(o.stdout).unwrap(),
            String::from_utf8(o.stderr).unwrap(),
        )
    };
    // A splice no command holds: never an orphan.
    assert_eq!(run(&["splice", "f1", "--count"]).0, Some(0));
    let (mut child, mut out) = start(&socket, &["count", "f0"]);
    announced(&mut child, &mut out);
    let pid = child.id();
    let (_, listed, _) = run(&["list"]);
    assert!(
        listed.contains(&format!("  held by pid {pid} `")),
        "{listed}"
    );
    assert!(!listed.contains("orphaned"), "{listed}");

    signal(&child, Signal::SIGKILL);
    let (status, _, _) = finish(child, out);
    assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    assert!(
        k.trapped("f0"),
        "SIGKILL cannot be caught: the splice stays"
    );
    let (_, listed, _) = run(&["list"]);
    let expected = format!("  orphaned: held by pid {pid} `{} --socket {} count f0`, which is gone; `trapctl unsplice --orphans` removes it", env!("CARGO_BIN_EXE_trapctl"), socket.display());
    assert!(listed.contains(&expected), "{listed}");

    let (code, removed, err) = run(&["unsplice", "--orphans"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        removed,
        format!(
            "unspliced orphan f0 at {:#x}: 0 hits, 0 missed\nunspliced 1 orphaned splice(s)\n",
            site("f0")
        )
    );
    assert!(!k.trapped("f0"));
    assert!(k.trapped("f1"), "the splice without an owner stays");
    assert_eq!(
        run(&["unsplice", "--orphans"]).1,
        "unspliced 0 orphaned splice(s)\n"
    );
}

/// A new pseudo-terminal: its master, and the path of its slave.
fn pty() -> (std::fs::File, PathBuf) {
    // SAFETY: posix_openpt takes flags only and returns a new descriptor or -1, checked.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `master` is an open descriptor this test owns from here on (File::from_raw_fd).
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(master) };
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: `master` is a pty master (posix_openpt); ptsname_r writes at most `name.len()`
    // bytes, NUL included, into `name`, which outlives the call.
    let ok = unsafe {
        libc::grantpt(master) == 0
            && libc::unlockpt(master) == 0
            && libc::ptsname_r(master, name.as_mut_ptr(), name.len()) == 0
    };
    assert!(
        ok,
        "grantpt/unlockpt/ptsname_r: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: ptsname_r succeeded, so `name` holds a NUL-terminated string.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_str()
        .unwrap()
        .into();
    (file, path)
}

/// trapctl as `start` runs it, but in a session of its own whose controlling terminal is the
/// pty `slave` (its stdin), so that ^C written to the master signals its process group (trapctl
/// and its command) as a terminal's Ctrl-C does: a signal the kernel sends.
fn start_on_terminal(
    socket: &Path,
    slave: &Path,
    args: &[&str],
) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trapctl"));
    cmd.arg("--socket").arg(socket).args(args).stdin(
        std::fs::File::options()
            .read(true)
            .write(true)
            .open(slave)
            .unwrap(),
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: runs in the child between fork and exec: setsid, ioctl and sigaction (nix's
    // `signal`) are async-signal-safe, and nothing here allocates or locks. stdin (fd 0) is
    // the pty's slave by then.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            nix::sys::signal::signal(Signal::SIGINT, SigHandler::SigDfl)
                .map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

#[test]
fn ctrl_c_on_a_terminal_reaches_the_command_itself_and_ends_the_count() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon(dir.path());
    let (mut master, slave) = pty();
    let (mut child, mut out) =
        start_on_terminal(&socket, &slave, &["count", "f0", "--", "sleep", "30"]);
    announced(&mut child, &mut out);
    // Let the command start: the terminal signals the processes in its group then.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    master.write_all(b"\x03").unwrap();
    let (status, rest, err) = finish(child, out);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the sleep got the terminal's SIGINT"
    );
    assert_eq!(
        status.signal(),
        Some(Signal::SIGINT as i32),
        "{status}: {err}"
    );
    assert!(rest.starts_with("f0: 0 calls in "), "{rest}");
    no_splices_left(&k);
}

#[test]
fn ctrl_c_while_the_splice_is_made_ends_the_hold_before_the_command_starts() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon_with(dir.path(), false, Duration::from_millis(1500));
    let (mut master, slave) = pty();
    let marker = dir.path().join("ran");
    let script = format!("touch {}; sleep 30", marker.display());
    let (mut child, mut out) =
        start_on_terminal(&socket, &slave, &["count", "f0", "--", "sh", "-c", &script]);
    // trapctl blocks the signals before it asks for the splice; the daemon takes 1.5 s. The
    // terminal's SIGINT cannot reach a command started after it: none may start.
    std::thread::sleep(Duration::from_millis(500));
    master.write_all(b"\x03").unwrap();
    announced(&mut child, &mut out);
    let (status, rest, err) = finish(child, out);
    assert_eq!(
        status.signal(),
        Some(Signal::SIGINT as i32),
        "{status}: {err}"
    );
    assert!(rest.starts_with("f0: 0 calls in "), "{rest}");
    assert!(!marker.exists(), "the command never started");
    no_splices_left(&k);
}

#[test]
fn whether_an_owner_is_gone_is_judged_by_trapctl_not_by_the_daemons_flag() {
    let dir = tempfile::tempdir().unwrap();
    let (k, socket) = daemon_with(dir.path(), true, Duration::ZERO);
    let run = |args: &[&str]| {
        let o = fake_daemon::trapctl(&socket, args);
        (o.status.code(), String::from_utf8(o.stdout).unwrap())
    };
    let (mut child, mut out) = start(&socket, &["count", "f0"]);
    announced(&mut child, &mut out);
    let (_, listed) = run(&["list"]);
    assert!(
        listed.contains(&format!("  held by pid {} `", child.id())) && !listed.contains("orphaned"),
        "{listed}"
    );
    assert_eq!(
        run(&["unsplice", "--orphans"]),
        (Some(0), "unspliced 0 orphaned splice(s)\n".to_string()),
        "a live count is no orphan"
    );
    assert!(k.trapped("f0"));
    signal(&child, Signal::SIGTERM);
    let (status, _, _) = finish(child, out);
    assert_eq!(status.signal(), Some(Signal::SIGTERM as i32));
    no_splices_left(&k);
}

#[test]
fn unsplice_takes_a_point_all_or_orphans_and_only_one_of_them() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trapctl"))
            .args(args)
            .env("TRAPD_SOCKET", "/nonexistent/trapd.sock")
            .output()
            .unwrap()
    };
    for args in [
        &["unsplice", "--orphans", "--all"][..],
        &["unsplice", "f", "--orphans"],
        &["unsplice"],
    ] {
        assert_eq!(run(args).status.code(), Some(2), "{args:?}");
    }
    for args in [
        &["count", "f", "--seconds", "1", "--", "true"][..],
        &["count", "f", "--seconds", "-1"],
        &["time", "f", "--seconds", "soon"],
    ] {
        assert_eq!(run(args).status.code(), Some(2), "{args:?}");
    }
}
