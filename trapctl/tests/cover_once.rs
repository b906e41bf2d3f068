//! `trapctl cover --process --mode once`: the agent removes hit sites in batches while the
//! program runs. On `fixtures/cover/once.c` (phase 1 runs every block of `step` and `run`, the
//! program sleeps past the next batch, phase 2 runs the same blocks N times): the blocks and
//! lines covered are count mode's, and every block's hits are the same for N = 0 and
//! N = 1,000,000 (the loop-heavy phase takes no trap), while count mode counts the million.
//! Needs gcc and the built agent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod attach_common;
use attach_common::{agent, compile};

/// A temporary directory holding `once.c` built as `once` with `gcc -O0 -g`.
fn build() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover/once.c");
    std::fs::copy(src, dir.path().join("once.c")).unwrap();
    compile("gcc", dir.path(), &["-O0", "-g", "-o", "once", "once.c"]);
    dir
}

/// One `trapctl cover` run: its JSON report and its lcov file's executed lines of once.c.
fn cover(dir: &Path, mode: &str, n: &str) -> (Value, BTreeSet<u32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["cover", "--agent"])
        .arg(agent())
        .args([
            "--process",
            "--mode",
            mode,
            "step",
            "run",
            "--json",
            "-o",
            "report.json",
            "--lcov",
            "once.info",
            "--",
            "./once",
            n,
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cover --mode {mode} ./once {n}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let info = std::fs::read_to_string(dir.join("once.info")).unwrap();
    let mut ours = false;
    let mut lines = BTreeSet::new();
    for l in info.lines() {
        if let Some(sf) = l.strip_prefix("SF:") {
            ours = sf.ends_with("/once.c");
        } else if let (true, Some(da)) = (ours, l.strip_prefix("DA:")) {
            let (line, hits) = da.split_once(',').unwrap();
            if hits != "0" {
                lines.insert(line.parse().unwrap());
            }
        }
    }
    assert!(!lines.is_empty(), "no executed line of once.c in:\n{info}");
    (report, lines)
}

/// Hits per block, by (function, offset).
fn hits(report: &Value) -> BTreeMap<(String, u64), u64> {
    report["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                (
                    b["function"].as_str().unwrap().to_string(),
                    b["offset"].as_u64().unwrap(),
                ),
                b["hits"]
                    .as_u64()
                    .expect("every block of once.c takes a site"),
            )
        })
        .collect()
}

fn covered(h: &BTreeMap<(String, u64), u64>) -> BTreeSet<(String, u64)> {
    h.iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, _)| k.clone())
        .collect()
}

#[test]
fn once_mode_covers_count_modes_blocks_and_the_loop_heavy_phase_takes_no_trap() {
    let dir = build();
    let (count, count_lines) = cover(dir.path(), "count", "1000000");
    let (once, once_lines) = cover(dir.path(), "once", "1000000");
    let (once0, _) = cover(dir.path(), "once", "0");
    assert_eq!(count["mode"], "count");
    assert_eq!(once["mode"], "once");

    let (count_hits, once_hits, once0_hits) = (hits(&count), hits(&once), hits(&once0));
    // Count mode really counted phase 2: step ran a million times more.
    assert!(
        count_hits.values().sum::<u64>() >= 3_000_000,
        "count mode: {count_hits:?}"
    );
    // The same blocks and the same source lines covered.
    assert_eq!(covered(&once_hits), covered(&count_hits));
    assert_eq!(once_lines, count_lines);
    // Every block's traps in once mode are phase 1's: a million more calls took none.
    assert_eq!(
        once_hits, once0_hits,
        "once mode, N = 1,000,000 (left) and 0"
    );
    let traps: u64 = once_hits.values().sum();
    assert!(traps <= 20, "{traps} traps in once mode: {once_hits:?}");
    // Every block hit was disarmed (all in phase 1, before the sleep ended), in a batch or more.
    for b in once["blocks"].as_array().unwrap() {
        assert_eq!(b["disarmed"], b["hit"], "{b}");
    }
    let batches = once["disarm_batches"].as_u64().unwrap();
    assert!(batches >= 1, "{once}");
    // Count mode reports neither.
    assert!(count["disarm_batches"].is_null());
    assert!(count["blocks"][0]["disarmed"].is_null());
}
