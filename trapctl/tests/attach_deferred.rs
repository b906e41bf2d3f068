//! Deferred points and children of an attached process (issue 30, item 5): a spec applied with
//! `trapctl -p PID apply` whose point is in a library the process has not loaded yet is armed
//! when the process dlopens it (counted live), and a child the process forks afterwards runs
//! with the splice inherited (its text the parent's, its result and exit status those of an
//! unspliced run). Needs cc and the built agent.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command};

mod attach_common;
use attach_common::{dlfork, spawn_ready, text, trapctl};

/// dlfork.c running, told to load dltarget.c's libdltarget.so when asked.
struct Prog {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: tempfile::TempDir,
}

/// What one `go N` printed.
#[derive(Debug, PartialEq, Eq)]
struct Go {
    parent_sum: u64,
    parent_text: String,
    child_sum: u64,
    child_text: String,
    child_exit: i32,
}

impl Prog {
    fn start() -> Prog {
        let dir = tempfile::tempdir().unwrap();
        let (exe, lib) = dlfork(dir.path());
        let (child, stdin, stdout, _) = spawn_ready(Command::new(exe).arg(lib));
        Prog {
            child,
            stdin,
            stdout,
            dir,
        }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn line(&mut self, prefix: &str) -> Vec<String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(
            words.first().map(String::as_str),
            Some(prefix),
            "fixture said `{line}`"
        );
        words
    }

    fn go(&mut self, n: u64) -> Go {
        writeln!(self.stdin, "go {n}").unwrap();
        let p = self.line("parent");
        let c = self.line("child");
        let e = self.line("child-exit");
        Go {
            parent_sum: p[1].parse().unwrap(),
            parent_text: p[2].clone(),
            child_sum: c[1].parse().unwrap(),
            child_text: c[2].clone(),
            child_exit: e[1].parse().unwrap(),
        }
    }

    fn text(&mut self) -> String {
        writeln!(self.stdin, "text").unwrap();
        self.line("text")[1].clone()
    }

    fn quit(mut self) -> Option<i32> {
        writeln!(self.stdin, "quit").unwrap();
        self.child.wait().unwrap().code()
    }
}

impl Drop for Prog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn list(pid: &str) -> serde_json::Value {
    let o = trapctl(&["-p", pid, "list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_point_in_a_library_loaded_after_attach_is_armed_by_its_dlopen_and_a_fork_child_inherits_it() {
    const N: u64 = 57;
    // The same program unspliced: what it computes, its text, its child's exit status.
    let mut plain = Prog::start();
    let reference = plain.go(N);
    assert_eq!(plain.quit(), Some(0));
    assert!(!reference.parent_text.starts_with("cdf5"), "{reference:?}");

    let mut p = Prog::start();
    let pid = p.pid();
    let spec = p.dir.path().join("spec.toml");
    std::fs::write(
        &spec,
        "[[splice]]\nat = \"libdltarget.so:twice\"\naction = \"count\"\n",
    )
    .unwrap();
    let o = trapctl(&["-p", &pid, "apply", spec.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("waits for libdltarget.so"),
        "{}",
        text(&o)
    );
    let before = list(&pid);
    assert_eq!(
        before["splices"].as_array().map(Vec::len),
        Some(0),
        "{before}"
    );
    assert_eq!(
        before["pending"][0]["at"], "libdltarget.so:twice",
        "{before}"
    );

    let got = p.go(N);
    // Armed by the dlopen, before the program's first call: every call counted.
    let after = list(&pid);
    let hits: Vec<u64> = after["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["hits"].as_u64().unwrap())
        .collect();
    assert_eq!(hits, vec![N], "{after}");
    assert!(got.parent_text.starts_with("cdf5"), "{got:?}");
    // The child ran the spliced code it inherited (its calls are its own copy's: the parent's
    // count is N, not 2N) and computed what the unspliced program's child computed.
    assert_eq!(got.child_text, got.parent_text, "{got:?}");
    assert_eq!(got.parent_sum, reference.parent_sum);
    assert_eq!(got.child_sum, reference.child_sum);
    assert_eq!(got.child_exit, reference.child_exit);

    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(p.text(), reference.parent_text, "text restored by detach");
    // A later load (the same library: dlopen again) arms nothing after the detach.
    let again = p.go(N);
    assert_eq!(again.parent_text, reference.parent_text, "{again:?}");
    assert_eq!(again.child_exit, reference.child_exit);
    assert_eq!(p.quit(), Some(0));
}
