//! What the agent's test binaries share: where the repository and the built agent are, and
//! compiling a fixture with `cc` at test time. Each binary uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `libtrapvec_agent.so` next to this test's own profile directory (target/<profile>/).
pub fn agent() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let so = profile.join("libtrapvec_agent.so");
    assert!(so.exists(), "{} not built", so.display());
    so
}

/// Runs `cc` with `args`; a failure fails the test with the compiler's message.
pub fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compile the counting component (`fixtures/count.c`, handler `count`) to `dir/count.o`, the
/// path [`spec`] names.
pub fn count_component(dir: &Path) {
    let inc = repo().join("components/include");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/count.c");
    let out = dir.join("count.o");
    cc(&[
        "-c",
        "-O2",
        "-fPIC",
        "-I",
        inc.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
}

/// A spec that counts the calls at each `(point, mechanism)` with `count.o`'s `count` handler.
pub fn spec(points: &[(&str, &str)]) -> String {
    let mut s = String::from("[[component]]\npath = \"count.o\"\n");
    for (at, mech) in points {
        s.push_str(&format!("\n[[splice]]\nat = \"{at}\"\naction = \"call\"\nhandler = \"count\"\nmechanism = \"{mech}\"\n"));
    }
    s
}

/// A program's run under the agent: its output and the stats file it wrote, if any.
pub struct Run {
    pub out: Output,
    pub stats: Option<serde_json::Value>,
    /// The program's pid, where the runner kept it.
    pub pid: Option<u32>,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
}

/// A program built at test time into its own directory (which also holds its spec, stats and
/// components).
pub struct Program {
    pub dir: PathBuf,
    pub path: PathBuf,
}

/// Build `sources` (in `tests/fixtures`) with `g++ -O2` into a new directory's `name`; a missing
/// g++ fails the test (`.ci/install-deps` installs it).
pub fn gxx(name: &str, sources: &[&str]) -> Program {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let path = dir.join(name);
    let out = Command::new("g++")
        .args(["-O2", "-o"])
        .arg(&path)
        .args(sources.iter().map(|s| src.join(s)))
        .output()
        .expect("g++ is needed for this test (.ci/install-deps installs it)");
    assert!(
        out.status.success(),
        "g++: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Program { dir, path }
}

impl Program {
    /// Run with `args`: plain without a spec; with one, under the agent with the spec written
    /// to `spec.toml` and `TRAPVEC_STATS`, whose file is read back.
    pub fn run(&self, spec: Option<&str>, args: &[&str]) -> Run {
        let mut cmd = Command::new(&self.path);
        cmd.args(args);
        let stats = self.dir.join("stats.json");
        let _ = std::fs::remove_file(&stats);
        if let Some(text) = spec {
            let spec_path = self.dir.join("spec.toml");
            std::fs::write(&spec_path, text).unwrap();
            cmd.env("LD_PRELOAD", agent())
                .env("TRAPVEC_SPEC", &spec_path)
                .env("TRAPVEC_STATS", &stats);
        }
        let child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        let stats = std::fs::read_to_string(&stats)
            .ok()
            .map(|s| serde_json::from_str(&s).unwrap());
        Run {
            out,
            stats,
            pid: Some(pid),
        }
    }
}

/// The `python3` interpreter itself (not a wrapper script, such as pyenv's shim, that would exec
/// it without the agent), or `None` when it is missing outside CI (with `CI=true` a missing one
/// fails).
pub fn python3() -> Option<PathBuf> {
    let found = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "python3 is missing (.ci/install-deps installs it)"
        );
        eprintln!("skipped: python3 not installed");
    }
    found
}
