//! What the attach tests share: the agent beside the trapctl under test, trapctl run with it,
//! and an output as text for assertion messages.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
