//! The module's own suite (`kmod/tests/run.sh`, described in kmod/README.md, "Test") as part of
//! `cargo test`: the C program `kmod/tests/*.c` drives every ioctl of
//! /dev/trapvec directly (the gate, every refusal reason, arena rules, a hand-made trap splice
//! with exact hit and missed counts, DISPATCH_REPLACE, all-or-nothing batches, splice cycles
//! under load, module text, a non-root user), `rmmod` with a splice live and `insmod` again,
//! then the Rust `KernelTarget` tests against the real module, and a clean `dmesg`.

use std::process::Command;

use vmtest::testing::{can_boot, repo_root};

#[test]
fn the_module_suite_passes_in_the_guest() {
    if !can_boot("kernel scenario") {
        return;
    }
    let out = Command::new("sh")
        .arg(repo_root().join("kmod/tests/run.sh"))
        .output()
        .expect("running kmod/tests/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("--- kmod/tests/run.sh stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(
        out.status.success(),
        "kmod/tests/run.sh: {}\n{stderr}",
        out.status
    );
    // The C suite runs twice (with a splice left live, then after rmmod and insmod), each
    // ending in a PASS line with its count; no check failed.
    let passes: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("TRAPVEC-KMOD-TEST: PASS"))
        .collect();
    assert_eq!(passes.len(), 2, "{passes:?}");
    assert!(
        !stdout.lines().any(|l| l.starts_with("not ok")),
        "a check failed"
    );
    assert!(
        stdout.contains("DISPATCH_REPLACE the live site's entry"),
        "the suite reached DISPATCH_REPLACE"
    );
    assert!(stdout.contains("kmod scenario: passed"));
}
