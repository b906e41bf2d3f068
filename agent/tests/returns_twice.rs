//! Return points refuse functions that return twice (issue 24, item 11): `setjmp`, `_setjmp`,
//! `__sigsetjmp`, `getcontext` and `vfork` of the real libc, each named in the refusal with the
//! reason; a count at the entry of the same functions is still accepted.

use std::process::Command;

mod common;
use common::{agent, cc};

#[test]
fn return_points_on_setjmp_getcontext_and_vfork_are_refused_naming_the_function_and_why() {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spawn.c");
    let program = dir.join("spawn");
    cc(&[
        "-O2",
        "-o",
        program.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let run = |at: &str, when: &str| {
        let spec = dir.join("spec.toml");
        std::fs::write(&spec, format!("[[splice]]\nat = \"libc.so.6:{at}\"\naction = \"count\"\nwhen = \"{when}\"\nmechanism = \"trap\"\n")).unwrap();
        Command::new(&program)
            .arg("vfork-exit")
            .env("LD_PRELOAD", agent())
            .env("TRAPVEC_SPEC", &spec)
            .output()
            .unwrap()
    };
    for (at, why) in [
        (
            "setjmp",
            "it returns again at every longjmp to the context it saved",
        ),
        (
            "_setjmp",
            "it returns again at every longjmp to the context it saved",
        ),
        (
            "__sigsetjmp",
            "it returns again at every longjmp to the context it saved",
        ),
        (
            "getcontext",
            "it returns again at every setcontext to the context it saved",
        ),
        (
            "vfork",
            "its child returns through the parent's own stack frame before the parent does",
        ),
    ] {
        let out = run(at, "return");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(86), "{at}: {stderr}");
        assert!(
            stderr.contains(&format!("libc.so.6:{at}: `{at}` returns twice ({why}): a return point keeps one return per call")),
            "{at}: {stderr}"
        );
        // The same function counted at its entry is fine.
        let out = run(at, "entry");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{at} at entry: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
