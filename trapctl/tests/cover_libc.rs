//! `trapctl cover --process 'libc.so.6:*'`: every block of the C library the program runs on,
//! under `sort` (a packaged program: malloc, qsort, string and stdio functions). Three faults
//! it found, each checked here:
//! - the text writer ran libc's `__libc_current_sigrtmax` (through `SIGRTMAX`) while a
//!   transient `CC` sat in it, and killed the program ("the text writer executed the site it
//!   is writing at");
//! - a name with two versions at one address (`lio_listio@GLIBC_2.4` and
//!   `lio_listio@@GLIBC_2.34`) and a third copy elsewhere was refused as ambiguous in the
//!   program;
//! - `memcpy@GLIBC_2.2.5`, a function beside the IFUNC `memcpy@@GLIBC_2.14`, was named by
//!   its bare name, which the process binds to the IFUNC's implementation: its points fell
//!   inside that implementation's instructions.
//!
//! Also: a script is covered in its interpreter, and C++ exceptions unwind through covered
//! frames of a program, libstdc++ and libgcc_s (a `+` in `libstdc++.so.6` was read as a
//! point's offset). Needs the built agent, g++ and the host's glibc (2.34 or later, x86-64).

use std::path::Path;

use serde_json::Value;

mod attach_common;
use attach_common::{compile, cover_process, text};

/// `trapctl cover --process --mode count 'libc.so.6:*' ARGS -- sort in` in a new directory,
/// which must succeed: its stdout and stderr, and the report when ARGS ask for one.
fn cover_libc(args: &[&str]) -> (String, String, Option<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let words: String = (0..200)
        .map(|i| format!("w{:03}\n", (i * 37) % 200))
        .collect();
    std::fs::write(dir.path().join("in"), words).unwrap();
    let mut all = vec!["--mode", "count", "libc.so.6:*"];
    all.extend(args);
    all.extend(["--", "sort", "in"]);
    let (out, report) = cover_process(dir.path(), &all);
    assert!(out.status.success(), "{}", text(&out));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        report,
    )
}

/// The `functions` rows of `name` in `report`: (blocks, refused).
fn rows(report: &Value, name: &str) -> Vec<(u64, u64)> {
    report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["function"] == name)
        .map(|f| {
            (
                f["blocks"].as_u64().unwrap(),
                f["refused"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn every_block_of_libc_is_covered_under_a_packaged_program_without_a_wrong_refusal() {
    let (_, stderr, report) = cover_libc(&["--json", "-o", "r.json"]);
    assert!(!stderr.contains("text writer"), "{stderr}");
    let report = report.unwrap();
    assert_eq!(report["exit"], 0, "sort exited 0");
    let total = &report["total"];
    assert!(
        total["functions"].as_u64().unwrap() > 1000 && total["covered"].as_u64().unwrap() > 100,
        "{total}"
    );
    // Refused blocks are the planner's (a window, a branch target), never the agent's.
    let refusals = total["refusals"].as_object().unwrap();
    assert!(!refusals.contains_key("agent_refused"), "{total}");
    assert!(!report.to_string().contains("ambiguous"), "{total}");
    // lio_listio: the default and GLIBC_2.4 names of one function, and the GLIBC_2.2.5 copy.
    let lio = rows(&report, "lio_listio");
    assert_eq!(lio.len(), 2, "{lio:?}");
    assert!(
        lio.iter()
            .all(|&(blocks, refused)| blocks > 0 && refused == 0),
        "{lio:?}"
    );
    // memcpy: the GLIBC_2.2.5 function (the IFUNC is not a function of the file's).
    let memcpy = rows(&report, "memcpy");
    assert!(
        !memcpy.is_empty() && memcpy.iter().all(|&(_, refused)| refused == 0),
        "{memcpy:?}"
    );
}

#[test]
fn the_table_prints_two_functions_of_one_name_by_their_addresses() {
    let (stdout, _, _) = cover_libc(&[]);
    // The program's own output first (sort's, in order), then the table.
    assert!(stdout.starts_with("w000\nw001\nw002\n"), "{stdout}");
    let lio: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("libc.so.6:lio_listio"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(lio.len(), 2, "{lio:?}");
    assert!(
        lio.iter().all(|n| n.starts_with("libc.so.6:lio_listio@0x")) && lio[0] != lio[1],
        "{lio:?}"
    );
}

#[test]
fn a_script_is_covered_in_its_interpreter() {
    // `#!/bin/sh`: the process is the shell's, and so are the program and the libraries it
    // links. Before, trapctl read the script as the program: "not an ELF file".
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.sh");
    std::fs::write(&script, "#!/bin/sh\necho from-the-script\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (out, report) = cover_process(
        dir.path(),
        &["libc.so.6:str*", "--json", "-o", "r.json", "--", "./s.sh"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-the-script\n");
    let report = report.unwrap();
    assert_eq!(report["exit"], 0);
    assert_eq!(
        report["objects"][0]["path"], "/bin/sh",
        "{}",
        report["objects"]
    );
    assert!(
        report["total"]["covered"].as_u64().unwrap() > 0,
        "{}",
        report["total"]
    );
}

#[test]
fn cpp_exceptions_unwind_through_covered_frames_of_the_program_and_its_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover/throw.cc");
    std::fs::copy(src, dir.path().join("throw.cc")).unwrap();
    compile("g++", dir.path(), &["-O0", "-g", "-o", "throw", "throw.cc"]);
    let (out, report) = cover_process(
        dir.path(),
        &[
            "--mode",
            "count",
            "*",
            "libstdc++.so.6:*",
            "libgcc_s.so.1:*",
            "--json",
            "-o",
            "r.json",
            "--",
            "./throw",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "total=12899 caught=14\n",
        "what the program prints uncovered"
    );
    let report = report.unwrap();
    let entry = |f: &str| -> u64 {
        report["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["function"] == f && b["offset"] == 0)
            .and_then(|b| b["hits"].as_u64())
            .unwrap_or_else(|| panic!("no counted entry block of {f}"))
    };
    // Every call counted, the ones that threw too; the throw itself ran in libstdc++.
    assert_eq!(entry("_ZL6depth1i"), 100);
    assert_eq!(entry("_ZL6depth3i"), 100);
    assert_eq!(entry("__cxa_throw"), 14);
}
