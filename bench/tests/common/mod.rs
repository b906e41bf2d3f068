//! Builds the hand-assembled fixture (tests/fixtures/known.S) with `cc` at test time.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn fixture_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/known.S")
}

/// Run `cc args`, panicking with its stderr on failure.
pub fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("running cc");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct Built {
    pub dir: tempfile::TempDir,
}

impl Built {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// `known.o` (kernel-style object), `known.elf` (linked at 0x1000000, __fentry__ defined) and
/// `libknown.so` (user-space, no f_traced).
pub fn build() -> Built {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_source();
    let s = src.to_str().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    cc(&["-c", "-DKERNEL_OBJECT", "-o", &p("known.o"), s]);
    cc(&[
        "-nostdlib",
        "-static",
        "-no-pie",
        "-DLINKED",
        "-Wl,-Ttext=0x1000000",
        "-Wl,-e,f_lengths",
        "-o",
        &p("known.elf"),
        s,
    ]);
    cc(&["-shared", "-nostdlib", "-o", &p("libknown.so"), s]);
    Built { dir }
}
