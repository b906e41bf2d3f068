//! What trapctl's tests share at the bottom: the C compiler for their fixtures and the trapctl
//! runner (without the agent). The file-level CLI tests use it as it is; `attach_common` builds
//! on it. Each test binary uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// `COMPILER ARGS` run in `dir` (`cc`; `gcc` where gcov reads what it builds): its output,
/// whether it succeeded or not.
pub fn try_compile(compiler: &str, dir: &Path, args: &[&str]) -> Output {
    Command::new(compiler)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("a C compiler (`{compiler}`) is needed for these tests: {e}"))
}

/// [`try_compile`], which must succeed: else the test fails with the compiler's stderr.
pub fn compile(compiler: &str, dir: &Path, args: &[&str]) {
    let out = try_compile(compiler, dir, args);
    assert!(
        out.status.success(),
        "{compiler} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cc -O2 -fcf-protection=none ARGS SRC -o OUT` in `dir`, which must succeed: a fixture with
/// no CET notes (the splices' text is plain).
pub fn cc_fixture(dir: &Path, src: &Path, out: &Path, args: &[&str]) {
    let mut all = vec!["-O2", "-fcf-protection=none"];
    all.extend(args);
    all.extend([src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    compile("cc", dir, &all);
}

/// Compile `fixtures/inspect.c` with `cc -O2 -fcf-protection=none ARGS -o OUT`.
pub fn cc(args: &[&str], out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inspect.c");
    cc_fixture(out.parent().unwrap(), &src, out, args);
}

/// Run the trapctl under test.
pub fn trapctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(args)
        .output()
        .unwrap()
}
