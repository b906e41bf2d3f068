//! `trapctl -p PID cover`: block coverage of a running process from the moment its sites are
//! armed until Ctrl-C (SIGINT) or --seconds, then detached with the text restored byte for byte.
//! The lines it finds executed (and their counts) are those `trapctl cover --process -- PROGRAM`
//! finds for the same input; calls made before it attached are not counted; once mode counts a
//! block only until the next look removes its site; the process goes on, its threads (one
//! blocked in read(), one busy) undisturbed. Needs cc and the built agent.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod attach_common;
use attach_common::{agent, cc, spawn_piped, LoopFixture};

/// The bytes of every executable mapping of `exe` in process `pid`, read from /proc/PID/mem.
fn text(pid: u32, exe: &Path) -> Vec<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let exe = exe.canonicalize().unwrap();
    let mut out = Vec::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != exe {
            continue;
        }
        let (lo, hi) = f[0].split_once('-').unwrap();
        let lo = u64::from_str_radix(lo, 16).unwrap();
        let hi = u64::from_str_radix(hi, 16).unwrap();
        let mut b = vec![0u8; usize::try_from(hi - lo).unwrap()];
        mem.read_exact_at(&mut b, lo).unwrap();
        out.extend(b);
    }
    assert!(
        !out.is_empty(),
        "no executable mapping of {}",
        exe.display()
    );
    out
}

/// `n` bytes at `address` in process `pid`.
fn bytes_at(pid: u32, address: u64, n: usize) -> Vec<u8> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; n];
    mem.read_exact_at(&mut b, address).unwrap();
    b
}

/// How a `trapctl -p PID cover` run is ended.
enum End {
    /// `--seconds N` given.
    Seconds(&'static str),
    /// SIGINT sent once `during` is done.
    Interrupt,
}

/// Run `trapctl -p PID cover ARGS --json -o FILE` (ended as `end` says), wait until it says it
/// covers, run `during`, and return its exit status, its stderr and its report.
fn cover(
    pid: u32,
    dir: &Path,
    args: &[&str],
    end: End,
    during: impl FnOnce(),
) -> (ExitStatus, String, Value) {
    let out = dir.join("report.json");
    let _ = std::fs::remove_file(&out);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trapctl"));
    cmd.env("TRAPVEC_AGENT", agent())
        .args(["-p", &pid.to_string(), "cover"])
        .args(args)
        .args(["--json", "-o"])
        .arg(&out)
        .stderr(Stdio::piped());
    if let End::Seconds(s) = end {
        cmd.args(["--seconds", s]);
    }
    let mut t = cmd.spawn().unwrap();
    let mut err = BufReader::new(t.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("trapctl -p cover ended before covering: {said}");
        }
        said.push_str(&line);
        if line.starts_with("covering ") {
            break;
        }
    }
    during();
    if let End::Interrupt = end {
        let status = Command::new("kill")
            .args(["-INT", &t.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let mut rest = String::new();
    let _ = err.read_to_string(&mut rest);
    let status = t.wait().unwrap();
    said.push_str(&rest);
    let report = std::fs::read_to_string(&out)
        .unwrap_or_else(|e| panic!("no report ({e}): {status:?}: {said}"));
    (status, said, serde_json::from_str(&report).unwrap())
}

/// The `DA:` lines (line, count) of the record of the source file ending in `source` in an
/// lcov file.
fn lcov_lines(info: &str, source: &str) -> BTreeMap<u32, u64> {
    let mut ours = false;
    let mut out = BTreeMap::new();
    for l in info.lines() {
        if let Some(sf) = l.strip_prefix("SF:") {
            ours = sf.ends_with(source);
        } else if let (true, Some(da)) = (ours, l.strip_prefix("DA:")) {
            let mut f = da.split(',');
            let line = f.next().unwrap().parse().unwrap();
            let count = f.next().unwrap().parse().unwrap();
            out.insert(line, count);
        }
    }
    out
}

/// `coverloop.c` (-O0 -g) running, said `ready`; answers a line "N" with "done SUM".
struct Classify {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Classify {
    fn start(exe: &Path) -> Classify {
        let (child, stdin, stdout, ready) = spawn_piped(&mut Command::new(exe));
        assert_eq!(ready, "ready\n");
        Classify {
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    fn send(&mut self, n: i64) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{n}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

impl Drop for Classify {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The oracle: `trapctl cover --process classify --lcov FILE -- ./coverloop` fed `input`.
fn cover_from_start(dir: &Path, input: &str) -> String {
    let mut t = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .current_dir(dir)
        .env("TRAPVEC_AGENT", agent())
        .args(["cover", "--process", "classify", "--lcov", "start.info"])
        .args(["-o", "start.txt", "--", "./coverloop"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    t.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let o = t.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", attach_common::text(&o));
    std::fs::read_to_string(dir.join("start.info")).unwrap()
}

#[test]
fn the_lines_covered_while_attached_are_those_a_run_under_cover_finds_for_the_same_input() {
    let dir = tempfile::tempdir().unwrap();
    let exe: PathBuf = cc(dir.path(), "coverloop.c", "coverloop", &["-O0", "-g"]);
    let start = cover_from_start(dir.path(), "30\n");
    let from_start = lcov_lines(&start, "coverloop.c");
    assert!(
        from_start.values().filter(|&&n| n > 0).count() >= 5,
        "{start}"
    );

    let mut p = Classify::start(&exe);
    // Before the coverage: classify(-7), the only call that takes its first branch.
    assert_eq!(p.send(-7), "done -1");
    let pid = p.child.id();
    let before = text(pid, &exe);
    let info = dir.path().join("attached.info");
    let (status, said, report) = cover(
        pid,
        dir.path(),
        &["classify", "--lcov", info.to_str().unwrap()],
        End::Interrupt,
        || assert_eq!(p.send(30), "done 73"),
    );
    // Ctrl-C ends trapctl by SIGINT, as `trapctl count` does, after the report.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(2),
        "{said}"
    );
    assert_eq!(report["mode"], "count", "{report}");
    let attached = std::fs::read_to_string(&info).unwrap();
    let lines = lcov_lines(&attached, "coverloop.c");
    // Line by line, count by count: the 30 calls made while covered, not the one before.
    assert_eq!(
        lines, from_start,
        "attached:\n{attached}\nfrom start:\n{start}"
    );
    // Detached: the text is as it was, and the program goes on.
    assert!(text(pid, &exe) == before, "the text differs after detach");
    assert_eq!(p.send(3), "done 76");
    drop(p.stdin.take());
    assert_eq!(p.child.wait().unwrap().code(), Some(0));
}

/// The hits of `function`'s blocks that took a site, in block order.
fn hits(r: &Value, function: &str) -> Vec<u64> {
    r["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["function"] == function)
        .filter_map(|b| b["hits"].as_u64())
        .collect()
}

#[test]
fn a_running_process_is_covered_from_now_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut l = LoopFixture::start(dir.path());
    let exe = dir.path().join("loop");
    let pid = l.child.id();
    // Calls made before the coverage are not counted.
    assert_eq!(l.work(500), "done 500");
    let before = text(pid, &exe);

    let (status, said, r) = cover(
        pid,
        dir.path(),
        &["--mode", "count", "work", "spin", "reader"],
        End::Interrupt,
        || {
            assert_eq!(l.work(1000), "done 1500");
            // The spinner ran while covered (on a loaded machine it may not have yet).
            l.wait_for_spins();
        },
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(2),
        "{said}"
    );
    assert_eq!(r["mode"], "count");
    // work() is one block, called exactly 1000 times while covered.
    assert_eq!(hits(&r, "work"), [1000], "{r}");
    // The busy thread's spin() ran all along.
    let spin = hits(&r, "spin");
    assert!(!spin.is_empty() && spin.iter().all(|&n| n > 0), "{r}");
    // reader() entered its read() before: none of its blocks ran since.
    let reader = hits(&r, "reader");
    assert!(!reader.is_empty(), "{r}");
    assert!(reader.iter().all(|&n| n == 0), "{r}");
    // Detached: the text is as it was, the program goes on.
    assert!(text(pid, &exe) == before, "the text differs after detach");
    assert_eq!(l.work(5), "done 1505");

    // Once mode, ended by --seconds: the first burst is counted, the second (after the look
    // that removed work()'s site) is not. The ready line's 4th word is work()'s address.
    let work = l.ready.split_whitespace().nth(3).unwrap();
    let work = u64::from_str_radix(work.trim_start_matches("0x"), 16).unwrap();
    let work_bytes = bytes_at(pid, work, 8);
    let (status, said, r) = cover(
        pid,
        dir.path(),
        &["--mode", "once", "work", "spin", "reader"],
        End::Seconds("3"),
        || {
            assert_eq!(l.work(1000), "done 2505");
            // work()'s first bytes are its own again once a look removed its site.
            let deadline = Instant::now() + Duration::from_secs(20);
            while bytes_at(pid, work, 8) != work_bytes {
                assert!(Instant::now() < deadline, "work()'s site is still there");
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(l.work(1000), "done 3505");
        },
    );
    assert!(status.success(), "{said}");
    assert_eq!(r["mode"], "once");
    assert_eq!(hits(&r, "work"), [1000], "{r}");
    let work = r["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["function"] == "work")
        .unwrap();
    assert_eq!(work["disarmed"], true, "{work}");
    assert!(r["disarm_batches"].as_u64().unwrap() >= 1, "{r}");
    assert!(
        text(pid, &exe) == before,
        "the text differs after once mode"
    );

    // The reader thread's read() was not disturbed: it gets its data, and the program quits 0.
    std::fs::write(dir.path().join("fifo"), "hello").unwrap();
    writeln!(l.stdin, "quit").unwrap();
    let mut line = String::new();
    l.stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "read 5: hello\n");
    assert_eq!(l.child.wait().unwrap().code(), Some(0));
}

/// dlfork.c's answer to `go N` (fixtures/attach/dlfork.c): the first 8 bytes of twice() in
/// hex as the parent saw them after the dlopen, once the child has exited.
fn go(stdin: &mut ChildStdin, out: &mut BufReader<ChildStdout>, n: u64) -> String {
    writeln!(stdin, "go {n}").unwrap();
    let mut text = String::new();
    for prefix in ["parent", "child", "child-exit"] {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.starts_with(prefix), "fixture said `{line}`");
        if prefix == "parent" {
            text = line.split_whitespace().nth(2).unwrap().to_string();
        }
    }
    text
}

#[test]
fn a_library_loaded_while_covered_is_counted_from_its_first_call_and_restored() {
    const N: u64 = 57;
    let dir = tempfile::tempdir().unwrap();
    let (exe, lib) = attach_common::dlfork(dir.path());
    // twice()'s own first bytes, from a run nobody covers.
    let (mut plain, mut stdin, mut out, _) =
        attach_common::spawn_ready(Command::new(&exe).arg(&lib));
    let own = go(&mut stdin, &mut out, 1);
    drop(stdin);
    let _ = plain.wait();

    let (mut child, mut stdin, mut out, _) =
        attach_common::spawn_ready(Command::new(&exe).arg(&lib));
    let pid = child.id();
    let glob = format!("{}:tw*", lib.display());
    let mut spliced = String::new();
    let (status, said, r) = cover(
        pid,
        dir.path(),
        &["--mode", "count", &glob],
        End::Interrupt,
        || spliced = go(&mut stdin, &mut out, N),
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(2),
        "{said}"
    );
    // Nothing to arm at first: the library was not loaded.
    assert!(
        said.contains("covering 0 block(s)") && said.contains("more when their library is loaded"),
        "{said}"
    );
    assert_ne!(
        spliced, own,
        "twice() was not spliced when the parent called it"
    );
    // Armed by the dlopen, before the first call: every call of the parent counted (the
    // forked child's hits are its own copy's).
    assert_eq!(hits(&r, "twice").first(), Some(&N), "{r}");
    assert_eq!(r["total"]["covered"], 1, "{r}");
    // Detached: the library's text is its own again, and the program goes on.
    writeln!(stdin, "text").unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("text {own}"));
    writeln!(stdin, "quit").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
