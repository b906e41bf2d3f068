//! `trapctl points --process FILE GLOB...` against an executable compiled at test time from
//! `fixtures/inspect.c`: the functions a glob names, each judged as `trapctl inspect` judges its
//! point, basic blocks with `--blocks`, the JSON schema, and the errors.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{cc, trapctl};
use serde_json::Value;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &EXE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("inspect");
        cc(&[], &exe);
        (dir, exe)
    })
    .1
}

fn points(args: &[&str]) -> Value {
    let mut all = vec!["points", "--json", "--process", exe().to_str().unwrap()];
    all.extend_from_slice(args);
    let out = trapctl(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn inspect(point: &str) -> Value {
    let out = trapctl(&["inspect", "--json", exe().to_str().unwrap(), point]);
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn names(r: &Value) -> Vec<String> {
    r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["point"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_glob_lists_the_functions_it_names_with_inspects_verdicts() {
    let r = points(&["t*", "?ero"]);
    assert_eq!(r["schema"], 1);
    let mut got = names(&r);
    got.sort();
    assert_eq!(got, ["triple", "twice", "zero"]);
    assert_eq!(r["summary"]["functions"], 3);
    for s in r["sites"].as_array().unwrap() {
        let name = s["point"].as_str().unwrap();
        let i = &inspect(&format!("{name}+0"))["sites"][0];
        assert_eq!(s["addr"], i["addr"], "{name}");
        assert_eq!(s["trap"]["possible"], i["trap"]["possible"], "{name}");
        assert_eq!(s["jmp"]["possible"], i["jmp"]["possible"], "{name}");
        assert_eq!(s["jmp"]["form"], i["jmp"]["form"], "{name}");
    }
    // `zero` is `xor eax, eax; ret`: too short for jmp rel32 (inspect's test says why).
    let zero = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["point"] == "zero")
        .unwrap();
    assert_eq!(zero["trap"]["possible"], true);
    assert_ne!(zero["jmp"]["form"], "jmp rel32");
}

#[test]
fn blocks_lists_every_basic_block_as_inspect_finds_them() {
    let r = points(&["--blocks", "loop_sum"]);
    let i = inspect("loop_sum");
    let starts: Vec<&Value> = i["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["start"])
        .collect();
    let sites: Vec<&Value> = r["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["addr"])
        .collect();
    assert!(starts.len() >= 2, "{i}");
    assert_eq!(sites, starts);
    assert_eq!(r["summary"]["sites"], starts.len());
    assert_eq!(r["summary"]["functions"], 1);
}

#[test]
fn the_summary_counts_each_refusal_kind() {
    let r = points(&["--blocks"]);
    let m = &r["summary"];
    let sites = m["sites"].as_u64().unwrap();
    let refused: u64 = m["trap_refusals"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(m["trap"].as_u64().unwrap() + refused, sites, "{m}");
    let out = trapctl(&[
        "points",
        "--summary",
        "--process",
        exe().to_str().unwrap(),
        "--blocks",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!(
            "{} site(s): trap possible at {}",
            sites, m["trap"]
        )),
        "{text}"
    );
    for (kind, n) in m["trap_refusals"].as_object().unwrap() {
        assert!(
            text.contains(&format!("trap refused at {n}: {kind}")),
            "{text}"
        );
    }
}

#[test]
fn no_match_and_bad_globs_are_errors_that_name_them() {
    let out = trapctl(&["points", "--process", exe().to_str().unwrap(), "nothing_*"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no function") && err.contains("nothing_*"),
        "{err}"
    );
    let out = trapctl(&["points", "--process", exe().to_str().unwrap(), "f[a-"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad glob `f[a-`"), "{err}");
}
