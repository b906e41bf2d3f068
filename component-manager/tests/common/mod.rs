//! Test support: the fake target (trapvec's own, as a repository) and C fixtures compiled at
//! test time.
#![allow(dead_code)] // each test binary uses a different part of it

use std::path::{Path, PathBuf};
use std::process::Command;

pub use trapvec::fake::FakeKernel;
use trapvec::{Symbol, SymbolKind, TargetInfo};

/// A repository of a process defining `symbols` (name, address, kind; 16 bytes each): the one
/// fake target of trapvec's tests ([`FakeKernel::repository`]), which checks what a real backend
/// checks: blocks within ±2 GiB of `near` (and not covering it), writes only inside live blocks
/// and never into a sealed code block, sealing only code, freeing only live blocks; it counts
/// allocations, frees and seals, and records quiescence.
pub fn fake_target(symbols: &[(&str, u64, SymbolKind)]) -> FakeKernel {
    let symbols = symbols
        .iter()
        .map(|&(name, addr, kind)| Symbol {
            name: name.into(),
            addr,
            size: 16,
            kind,
            origin: None,
            version: None,
        })
        .collect();
    FakeKernel::repository(TargetInfo::user("fake target"), symbols)
}

/// Compile fixture `name` (a C file in `tests/fixtures/`) with `cc -c -O2`
/// and `extra` flags; the object's bytes.
pub fn compile(name: &str, extra: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let obj = compile_to(name, extra, dir.path());
    std::fs::read(obj).unwrap()
}

/// Like [`compile`], writing `<stem>.o` into `dir`; its path.
pub fn compile_to(name: &str, extra: &[&str], dir: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = manifest.join("tests/fixtures").join(name);
    let out = dir.join(Path::new(name).with_extension("o").file_name().unwrap());
    let status = Command::new("cc")
        .args(["-c", "-O2"])
        .args(extra)
        .arg("-I")
        .arg(manifest.join("../components/include"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}
