//! What the tests that run programs under the agent share (the attach tests, `cover` and
//! `trace --process`): the agent beside the trapctl under test, trapctl run with it, the C
//! compiler for their fixtures, and an output as text for assertion messages. Each test binary
//! uses part of it.
#![allow(dead_code)]

#[path = "../common/mod.rs"]
mod common;
// Each test binary uses part of it (as `dead_code` above).
#[allow(unused_imports)]
pub use common::{compile, try_compile};

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

/// `libtrapvec_agent.so` beside the trapctl under test.
pub fn agent() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_trapctl"));
    let so = exe.parent().unwrap().join("libtrapvec_agent.so");
    assert!(
        so.exists(),
        "{} not built (cargo build --release -p trapvec-agent)",
        so.display()
    );
    so
}

/// `trapctl cover --agent AGENT --process ARGS` run in `dir` (ARGS: the globs, options and
/// `-- COMMAND`): its output, and the report `r.json` there when ARGS write one (`-o r.json`).
pub fn cover_process(dir: &Path, args: &[&str]) -> (Output, Option<serde_json::Value>) {
    let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["cover", "--agent"])
        .arg(agent())
        .arg("--process")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let report = args.contains(&"r.json").then(|| {
        let text = std::fs::read_to_string(dir.join("r.json"))
            .unwrap_or_else(|e| panic!("no report r.json ({e}): {}", text(&out)));
        serde_json::from_str(&text).unwrap()
    });
    (out, report)
}

pub fn trapctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(args)
        .env("TRAPVEC_AGENT", agent())
        .output()
        .unwrap()
}

pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `cc` of `tests/fixtures/attach/SRC` into DIR/OUT with `args` (e.g. `-shared -fPIC`): -O2,
/// no CET notes (the splices' text is plain), -pthread.
pub fn cc(dir: &Path, src: &str, out: &str, args: &[&str]) -> PathBuf {
    let exe = dir.join(out);
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/attach")
        .join(src);
    let mut all = vec!["-pthread"];
    all.extend(args);
    common::cc_fixture(dir, &src, &exe, &all);
    exe
}

/// `tests/fixtures/attach/dlfork.c` built as DIR/dlfork and `dltarget.c` as
/// DIR/libdltarget.so: the program and the library it dlopens (given as its argument).
pub fn dlfork(dir: &Path) -> (PathBuf, PathBuf) {
    let exe = cc(dir, "dlfork.c", "dlfork", &[]);
    let lib = cc(dir, "dltarget.c", "libdltarget.so", &["-shared", "-fPIC"]);
    (exe, lib)
}

/// `tests/fixtures/cover/libfoo.c` copied into `dir` and built there as `libfoo.so.1` (its
/// soname) with `gcc -O0 -g`: the cover tests' library, its line table naming `libfoo.c`.
pub fn libfoo(dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover/libfoo.c");
    std::fs::copy(src, dir.join("libfoo.c")).unwrap();
    compile(
        "gcc",
        dir,
        &[
            "-O0",
            "-g",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libfoo.so.1",
            "-o",
            "libfoo.so.1",
            "libfoo.c",
        ],
    );
}

/// Start a fixture program (`cmd`) with its stdin and stdout piped and read its first line:
/// the child, its pipes and that line.
pub fn spawn_piped(cmd: &mut Command) -> (Child, ChildStdin, BufReader<ChildStdout>, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    (child, stdin, stdout, first)
}

/// [`spawn_piped`] of a fixture whose first line must start with `ready `.
pub fn spawn_ready(cmd: &mut Command) -> (Child, ChildStdin, BufReader<ChildStdout>, String) {
    let (child, stdin, stdout, ready) = spawn_piped(cmd);
    assert!(ready.starts_with("ready "), "fixture said `{ready}`");
    (child, stdin, stdout, ready)
}

/// `trapctl -p PID trace ARGS` with the agent beside trapctl, started: it, its stdout past the
/// first line (printed once the probes are live), and that line.
pub fn p_trace(pid: &str, args: &[&str]) -> (Child, BufReader<ChildStdout>, String) {
    let mut t = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["-p", pid, "trace"])
        .args(args)
        .env("TRAPVEC_AGENT", agent())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(t.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    (t, out, line)
}

/// The rest of a trapctl's output after `line` (its first), once it has ended with status 0.
pub fn finished(t: Child, mut out: BufReader<ChildStdout>, line: &str) -> String {
    use std::io::Read;
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = t.wait_with_output().unwrap();
    assert!(o.status.success(), "{}\n{line}{rest}", text(&o));
    rest
}

/// `tests/fixtures/attach/loop.c` built and running: it said its `ready` line (pid, and the
/// address of work() as its 4th word), reads "N" on stdin to call work() N times and answers
/// "done TOTAL", and has a thread blocked reading the fifo. Killed when dropped.
pub struct LoopFixture {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
    pub pid: String,
    pub ready: String,
}

impl LoopFixture {
    pub fn start(dir: &Path) -> LoopFixture {
        LoopFixture::start_with(dir, &[], |_| {})
    }

    /// As [`LoopFixture::start`], loop.c built with `cc_args` too (`-static`), its command
    /// given more by `setup` (arguments after the fifo, environment) before it starts.
    pub fn start_with(
        dir: &Path,
        cc_args: &[&str],
        setup: impl FnOnce(&mut Command),
    ) -> LoopFixture {
        let exe = cc(dir, "loop.c", "loop", cc_args);
        let fifo = dir.join("fifo");
        assert!(Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let mut cmd = Command::new(&exe);
        cmd.arg(&fifo);
        setup(&mut cmd);
        let (child, stdin, stdout, ready) = spawn_ready(&mut cmd);
        let pid = child.id().to_string();
        LoopFixture {
            child,
            stdin,
            stdout,
            pid,
            ready,
        }
    }

    /// Call work() `n` times; the fixture's answer ("done TOTAL").
    pub fn work(&mut self, n: u64) -> String {
        writeln!(self.stdin, "{n}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// Call work() `n` times; the total the fixture answers (all calls so far).
    pub fn calls(&mut self, n: u64) -> u64 {
        let line = self.work(n);
        line.strip_prefix("done ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("fixture said `{line}`"))
    }

    /// How often the spinner thread's spin() has returned so far.
    pub fn spins(&mut self) -> u64 {
        writeln!(self.stdin, "spins").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("spins ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("fixture said `{line}`"))
    }

    /// Wait (up to 20 s) until spin() has returned again: on a loaded machine the busy thread
    /// may not have run at all in a short window.
    pub fn wait_for_spins(&mut self) {
        let from = self.spins();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while self.spins() == from {
            assert!(
                std::time::Instant::now() < deadline,
                "spin() did not run for 20 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The address of work(), from the ready line.
    pub fn work_address(&self) -> u64 {
        self.ready
            .split_whitespace()
            .nth(3)
            .and_then(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok())
            .unwrap_or_else(|| panic!("fixture said `{}`", self.ready))
    }
}

impl Drop for LoopFixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every executable mapping of process `pid` (its program, libc, the loader...), by its maps
/// line, with its bytes: what an attached command must leave exactly as it found it. The agent's
/// own and the components' mappings are left out: they are not the process's text.
pub fn mappings(pid: impl std::fmt::Display) -> Vec<(String, Vec<u8>)> {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    maps.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("r-xp"))
        .filter(|l| {
            let path = l.split_whitespace().nth(5).unwrap_or("");
            path.starts_with('/') && !path.contains("trapvec")
        })
        .map(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let a = u64::from_str_radix(a, 16).unwrap();
            let b = u64::from_str_radix(b, 16).unwrap();
            let mut bytes = vec![0u8; usize::try_from(b - a).unwrap()];
            mem.read_exact_at(&mut bytes, a).unwrap();
            (l.to_string(), bytes)
        })
        .collect()
}

/// The first of `before`'s mappings (from [`mappings`]) whose bytes are not as they were, read
/// again now (the agent may have brought libraries of its own, which are not compared), and the
/// offset of the first changed byte.
pub fn changed(
    pid: impl std::fmt::Display,
    before: &[(String, Vec<u8>)],
) -> Option<(String, usize)> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    before.iter().find_map(|(range, bytes)| {
        let a = u64::from_str_radix(range.split('-').next().unwrap(), 16).unwrap();
        let mut now = vec![0u8; bytes.len()];
        mem.read_exact_at(&mut now, a).unwrap();
        let at = now.iter().zip(bytes).position(|(x, y)| x != y)?;
        Some((range.clone(), at))
    })
}
