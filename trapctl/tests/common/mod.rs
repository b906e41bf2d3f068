//! What the file-level CLI tests share: the fixture compiler and the trapctl runner.

use std::path::Path;
use std::process::{Command, Output};

/// Compile `fixtures/inspect.c` with `cc -O2 -fcf-protection=none ARGS -o OUT`.
pub fn cc(args: &[&str], out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/inspect.c");
    let status = Command::new("cc")
        .args(["-O2", "-fcf-protection=none"])
        .args(args)
        .arg(&src)
        .arg("-o")
        .arg(out)
        .status()
        .expect("a C compiler (`cc`) is needed for these tests");
    assert!(status.success(), "cc {args:?} failed");
}

/// Run the trapctl under test.
pub fn trapctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(args)
        .output()
        .unwrap()
}
