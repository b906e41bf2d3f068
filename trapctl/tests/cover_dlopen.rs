//! `trapctl cover --process 'libfoo.so.1:foo_*' -- PROGRAM` where PROGRAM loads libfoo.so.1 with
//! `dlopen` after `main` starts (`fixtures/cover/dlopen.c`): the library's file is found before
//! the run ($LD_LIBRARY_PATH here), its blocks listed, and the agent arms them when the library
//! is mapped (its deferred splices). Needs gcc and the built agent.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod attach_common;
use attach_common::{agent, compile, libfoo};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover")
}

/// A directory holding libfoo.so.1 and the program `dlopen` (which does not link it).
fn build() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(fixtures().join("dlopen.c"), d.join("dlopen.c")).unwrap();
    libfoo(d);
    compile("gcc", d, &["-O0", "-g", "-o", "dlopen", "dlopen.c", "-ldl"]);
    dir
}

fn cover(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("cover")
        .arg("--agent")
        .arg(agent())
        .args(args)
        .current_dir(dir)
        .env("LD_LIBRARY_PATH", dir)
        .output()
        .unwrap()
}

#[test]
fn a_library_loaded_by_dlopen_is_covered_from_its_mapping() {
    let dir = build();
    let d = dir.path();
    let out = cover(
        d,
        &[
            "--process",
            "libfoo.so.1:foo_*",
            "--lcov",
            "d.info",
            "--json",
            "-o",
            "report.json",
            "--",
            "./dlopen",
        ],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The program's own output, untouched.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3\n");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("report.json")).unwrap()).unwrap();
    let hits = |f: &str| -> Vec<u64> {
        let mut v: Vec<u64> = report["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["function"] == f)
            .map(|b| {
                assert!(
                    b["object"].as_str().unwrap().ends_with("/libfoo.so.1"),
                    "{b}"
                );
                b["hits"].as_u64().unwrap()
            })
            .collect();
        v.sort();
        v
    };
    // foo_add(s, i) three times: entry, `return a + b`, epilogue 3 each, `return 0` never.
    assert_eq!(hits("foo_add"), [0, 3, 3, 3], "{report:#}");
    assert_eq!(hits("foo_unused"), [0], "{report:#}");
    assert_eq!(report["total"]["refused"], 0, "{report:#}");
    let info = std::fs::read_to_string(d.join("d.info")).unwrap();
    assert!(info.contains("FNDA:3,foo_add\n"), "{info}");
    assert!(info.contains("DA:3,3\nDA:4,0\nDA:5,3\n"), "{info}");
}

#[test]
fn a_library_that_is_never_found_is_said_so() {
    let dir = build();
    let out = cover(
        dir.path(),
        &["--process", "libnothere.so.7:*", "--", "./dlopen"],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no function of") && stderr.contains("libnothere.so.7:*"),
        "{stderr}"
    );
}
