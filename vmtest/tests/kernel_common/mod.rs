//! What the kernel scenario tests share: whether this machine can boot the guest, running a
//! scenario of `vmtest/scenarios/` through the `vmtest` binary, and reading its `KEY=value`
//! lines.
//!
//! Without QEMU, the Debian cloud kernel, its headers or busybox a test says why and passes
//! vacuously; with `CI=true` that is a failure instead (as in `boot.rs`).

#![allow(dead_code)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the guest can boot here; `false` (after saying why) when the test should skip.
pub fn can_boot() -> bool {
    let mut missing = Vec::new();
    if let Err(e) = vmtest::host::find_program("qemu-system-x86_64", "install qemu-system-x86") {
        missing.push(e.to_string());
    }
    if let Err(e) = vmtest::host::KernelInstall::newest() {
        missing.push(e.to_string());
    }
    if let Err(e) = vmtest::host::find_program("busybox", "install busybox-static") {
        missing.push(e.to_string());
    }
    if missing.is_empty() {
        return true;
    }
    let why = missing.join("; ");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true and the kernel scenarios cannot run: {why} (run .ci/install-deps)");
    }
    eprintln!("skipping kernel scenario: {why} (run .ci/install-deps)");
    false
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("vmtest is in the workspace").to_owned()
}

/// What a scenario run produced.
pub struct Run {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The value of the first `KEY=value` line (console carriage returns removed).
    pub fn value(&self, key: &str) -> Option<&str> {
        self.stdout.lines().map(|l| l.trim_end_matches('\r')).find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
    }

    /// [`Run::value`], which must be there.
    pub fn expect(&self, key: &str) -> &str {
        self.value(key).unwrap_or_else(|| panic!("the scenario printed no {key}=...; see its output above"))
    }

    /// [`Run::expect`] as a number.
    pub fn number(&self, key: &str) -> u64 {
        let v = self.expect(key);
        v.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{key}={v} is not a number"))
    }

    /// The scenario ran to its end with status 0 and the kernel reported no problem.
    pub fn assert_passed(&self) {
        assert_eq!(self.status, Some(0), "vmtest failed; stderr:\n{}", self.stderr);
    }
}

/// Run `vmtest/scenarios/<name>` with `--file`s and extra `vmtest run` arguments; prints what it
/// said (the test's output is the log).
pub fn run_scenario(name: &str, files: &[&Path], args: &[&str]) -> Run {
    let scenario = repo().join("vmtest/scenarios").join(name);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vmtest"));
    cmd.arg("run").arg("--scenario").arg(&scenario).arg("--repo").arg(repo()).args(args);
    for f in files {
        cmd.arg("--file").arg(f);
    }
    let out = cmd.output().expect("running vmtest");
    let run = Run {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    println!("--- vmtest stdout ---\n{}", run.stdout);
    println!("--- vmtest stderr ---\n{}", run.stderr);
    run
}
