//! `trapctl cover --process` over a name two static functions share (`helper` of
//! `fixtures/cover/shared_{a,b}.c`, one program, built as a PIE at -O0 -g): both copies are
//! covered, each named by its address in the file (the run-time address moves with ASLR), with
//! its own hits, rows and lines. Before, both were refused as ambiguous. Needs gcc and the
//! built agent.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod attach_common;
use attach_common::{compile, cover_process, text};

/// A temporary directory holding the program `shared` (a PIE, as gcc builds by default here).
fn build() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover");
    for f in ["shared_a.c", "shared_b.c"] {
        std::fs::copy(fixtures.join(f), dir.path().join(f)).unwrap();
    }
    compile(
        "gcc",
        dir.path(),
        &[
            "-O0",
            "-g",
            "-fPIE",
            "-pie",
            "-o",
            "shared",
            "shared_a.c",
            "shared_b.c",
        ],
    );
    dir
}

/// `nm`'s addresses of the program's `helper`s, as `shared_a.c`'s and `shared_b.c`'s (the
/// linker puts the files' text in command-line order).
fn helpers(dir: &Path) -> (u64, u64) {
    let out = Command::new("nm")
        .arg("shared")
        .current_dir(dir)
        .output()
        .unwrap();
    let mut at: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "helper").then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .collect();
    at.sort_unstable();
    assert_eq!(
        at.len(),
        2,
        "two static helpers in:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    (at[0], at[1])
}

/// One count-mode run of `./shared ARGS`: its stdout, JSON report and lcov file.
fn cover(dir: &Path, args: &[&str]) -> (String, Value, String) {
    let mut all = vec![
        "--mode", "count", "helper", "call_b", "--json", "-o", "r.json", "--lcov", "r.info", "--",
        "./shared",
    ];
    all.extend(args);
    let (out, report) = cover_process(dir, &all);
    assert!(
        out.status.success(),
        "cover ./shared {args:?}: {}",
        text(&out)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        report.unwrap(),
        std::fs::read_to_string(dir.join("r.info")).unwrap(),
    )
}

/// Per `helper` copy (by its address in the file): (blocks, refused, hits of its entry block,
/// hits of all its blocks).
fn copies(report: &Value) -> BTreeMap<u64, (usize, usize, u64, u64)> {
    let mut out = BTreeMap::new();
    for b in report["blocks"].as_array().unwrap() {
        if b["function"] != "helper" {
            continue;
        }
        let offset = b["offset"].as_u64().unwrap();
        let addr = u64::from_str_radix(b["address"].as_str().unwrap().trim_start_matches("0x"), 16)
            .unwrap();
        let hits = b["hits"].as_u64().unwrap_or(0);
        let e = out.entry(addr - offset).or_insert((0, 0, 0, 0));
        e.0 += 1;
        e.1 += usize::from(b.get("refusal").is_some());
        if offset == 0 {
            e.2 = hits;
        }
        e.3 += hits;
    }
    out
}

/// The hits lcov gives `line` of `file` (`DA:line,hits` under `SF:.../file`).
fn line_hits(info: &str, file: &str, line: u32) -> Option<u64> {
    let mut ours = false;
    for l in info.lines() {
        if let Some(sf) = l.strip_prefix("SF:") {
            ours = sf.ends_with(&format!("/{file}"));
        } else if let (true, Some(da)) = (ours, l.strip_prefix("DA:")) {
            let (n, hits) = da.split_once(',').unwrap();
            if n.parse::<u32>().unwrap() == line {
                return Some(hits.parse().unwrap());
            }
        }
    }
    None
}

#[test]
fn both_copies_of_a_shared_static_name_are_covered_each_with_its_own_hits() {
    let dir = build();
    let d = dir.path();
    let (a, b) = helpers(d);

    // `./shared 5`: shared_a.c's helper 5 times (i = 0..4; `x * 2` for 3 and 4), shared_b.c's
    // never.
    let (stdout, report, info) = cover(d, &["5"]);
    assert!(stdout.starts_with("20\n"), "{stdout}");
    let c = copies(&report);
    assert_eq!(c.keys().copied().collect::<Vec<_>>(), [a, b], "{c:?}");
    let (blocks_a, refused_a, entry_a, _) = c[&a];
    let (blocks_b, refused_b, entry_b, all_b) = c[&b];
    assert!(blocks_a >= 3 && blocks_b >= 1, "{c:?}");
    assert_eq!(
        (refused_a, refused_b),
        (0, 0),
        "nothing refused as ambiguous: {c:?}"
    );
    assert_eq!((entry_a, entry_b, all_b), (5, 0, 0), "{c:?}");
    // The table: a row per copy, one covered, one not.
    let rows: Vec<(u64, u64)> = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["function"] == "helper")
        .map(|f| {
            (
                f["blocks"].as_u64().unwrap(),
                f["covered"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 2, "{report}");
    assert!(rows.contains(&(blocks_b as u64, 0)), "{rows:?}");
    assert!(
        rows.contains(&(blocks_a as u64, blocks_a as u64)),
        "{rows:?}"
    );
    assert!(!report.to_string().contains("ambiguous"), "{report}");
    // Lines: `return x * 2;` (shared_a.c:12) twice, `return x - 1;` (shared_b.c:4) never.
    assert_eq!(line_hits(&info, "shared_a.c", 12), Some(2), "{info}");
    assert_eq!(line_hits(&info, "shared_b.c", 4), Some(0), "{info}");

    // `./shared 5 b`: shared_b.c's helper once more, through call_b.
    let (stdout, report, info) = cover(d, &["5", "b"]);
    assert!(stdout.starts_with("24\n"), "{stdout}");
    let c = copies(&report);
    assert_eq!((c[&a].2, c[&b].2), (5, 1), "{c:?}");
    assert_eq!(line_hits(&info, "shared_b.c", 4), Some(1), "{info}");
}

#[test]
fn code_two_functions_share_is_counted_once_and_refused_in_the_second_with_the_reason() {
    // `inner` begins inside `outer` (fixtures/cover/shared_code.c): its entry is outer's block
    // at +4, and outer's jump to `1:` makes inner+2 (outer+6) a block of both. Before, both functions' points were sent to the agent, which refused the second as
    // "already spliced" (counted as `agent_refused`, with an error on stderr).
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover");
    std::fs::copy(
        fixtures.join("shared_code.c"),
        dir.path().join("shared_code.c"),
    )
    .unwrap();
    compile(
        "cc",
        dir.path(),
        &["-O0", "-g", "-o", "shared_code", "shared_code.c"],
    );
    let (out, report) = cover_process(
        dir.path(),
        &[
            "--mode",
            "count",
            "outer",
            "inner",
            "--json",
            "-o",
            "r.json",
            "--",
            "./shared_code",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "61\n");
    assert!(!stderr.contains("already spliced"), "{stderr}");
    let report = report.unwrap();
    let rows: Vec<(String, u64, Option<u64>, Option<String>)> = report["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["function"].as_str().unwrap().to_string(),
                b["offset"].as_u64().unwrap(),
                b["hits"].as_u64(),
                b["refusal"].as_str().map(str::to_string),
            )
        })
        .collect();
    let row = |f: &str, o: u64, h: Option<u64>, r: Option<&str>| {
        (f.to_string(), o, h, r.map(str::to_string))
    };
    assert_eq!(
        rows,
        [
            row("outer", 0, Some(3), None),
            row("outer", 4, Some(5), None),
            row("outer", 6, Some(8), None),
            row("inner", 0, None, Some("already_patched")),
            // outer's `jmp 1f` enters inner at +2: a block of inner's too, outer's at +6.
            row("inner", 2, None, Some("already_patched")),
        ]
    );
    assert!(report["total"]["refusals"].get("agent_refused").is_none());
}
