//! `--json` on every command that changes or reads a splice, a component or a variable, each
//! output one JSON object with `"schema": 1` as its first key (issue 28, item 3). The real
//! binary runs against a daemon on a Unix socket (trapd's own server) whose handler is the one
//! executor, `ops::execute`, over the fake kernel (`trapvec::fake`: f0..f3, and the `knob`
//! component compiled from C). `read` needs the module itself (it reads through
//! /dev/trapvec, never through trapd) and `status`/`activate` a real daemon's profiles: their
//! JSON goes through the same helper and is not run here.

mod fake_daemon;

use std::path::{Path, PathBuf};
use std::process::Command;

use fake_daemon::{daemon_with, trapctl, Setup};
use serde_json::Value;
use trapvec::fake::knob_component;

/// The socket of a fake daemon in `dir` whose kernel has runtime slots (`time` needs them).
fn daemon(dir: &Path) -> PathBuf {
    daemon_with(
        dir,
        Setup {
            runtime_slots: true,
            ..Setup::default()
        },
    )
    .socket
}

/// `args`' stdout as one JSON object whose first key is `"schema": 1`; `status` its exit status.
fn json_of(socket: &Path, args: &[&str], status: i32) -> Value {
    let out = trapctl(socket, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // `count` and `time` announce the live splice on a line of its own first (a script waits
    // for it before it drives the function); the JSON follows.
    let stdout = match args[0] {
        "count" | "time" => stdout.split_once('\n').map_or("", |(_, json)| json).into(),
        _ => stdout,
    };
    assert_eq!(
        out.status.code(),
        Some(status),
        "{args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("{\n  \"schema\": 1,\n"),
        "{args:?}: the schema first: {stdout}"
    );
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{args:?}: one JSON object: {e}: {stdout}"));
    assert_eq!(v["schema"], 1);
    v
}

#[test]
fn every_verb_prints_one_json_object_with_the_schema_first() {
    let dir = tempfile::tempdir().unwrap();
    let socket = daemon(dir.path());
    let knob = knob_component(dir.path());
    let knob = knob.to_str().unwrap();

    let v = json_of(&socket, &["load", knob, "--json"], 0);
    assert_eq!(v["component"]["name"], "knob");
    assert_eq!(v["spliced"][0]["at"], "f3");
    let v = json_of(&socket, &["set", "knob", "9", "--json"], 0);
    assert_eq!(
        (v["symbol"].as_str(), v["value"].as_u64()),
        (Some("knob"), Some(9))
    );
    let v = json_of(&socket, &["get", "knob", "--json"], 0);
    assert_eq!(v["value"], 9);

    let v = json_of(&socket, &["splice", "f0", "--count", "--json"], 0);
    assert_eq!(
        (v["at"].as_str(), v["action"].as_str()),
        (Some("f0"), Some("count"))
    );
    let v = json_of(&socket, &["unsplice", "f0", "--json"], 0);
    assert_eq!(v["at"], "f0");
    let v = json_of(&socket, &["splice", "f[01]", "--count", "--json"], 0);
    assert_eq!(v["spliced"].as_array().map(Vec::len), Some(2));
    let v = json_of(&socket, &["unsplice", "f[01]", "--json"], 0);
    assert_eq!(v["unspliced"].as_array().map(Vec::len), Some(2));
    // f3 is the knob's: refused, the rest spliced, exit 3 after the JSON.
    let v = json_of(
        &socket,
        &["splice", "f*", "--count", "--best-effort", "--json"],
        3,
    );
    assert_eq!(v["refused"].as_array().map(Vec::len), Some(1));
    // Grouped by cause: its name and its sentence, each refusal's reason beside its error.
    assert_eq!(v["refusals"][0]["cause"], "already_spliced");
    assert_eq!(v["refusals"][0]["reason"], "the site is already spliced");
    assert_eq!(v["refusals"][0]["count"], 1);
    assert_eq!(v["refused_reasons"][0], "the site is already spliced");
    // Each refusal's cause, the kind `points` and `cover` group by too.
    assert_eq!(v["refused_causes"], serde_json::json!(["already_spliced"]));
    let v = json_of(&socket, &["unsplice", "--all", "--json"], 0);
    assert_eq!(v["unspliced"].as_array().map(Vec::len), Some(4));

    let spec = dir.path().join("spec.toml");
    std::fs::write(&spec, "[[splice]]\nat = \"f1\"\naction = \"count\"\n").unwrap();
    let spec = spec.to_str().unwrap();
    // A check comes back through trapd (its list was once named `ok`, over the envelope's).
    let v = json_of(&socket, &["apply", spec, "--check", "--json"], 0);
    assert_eq!(v["possible"][0]["at"], "f1");
    let v = json_of(&socket, &["apply", spec, "--json"], 0);
    assert_eq!(v["spliced"][0]["at"], "f1");
    json_of(&socket, &["unsplice", "f1", "--json"], 0);

    let v = json_of(&socket, &["time", "f1", "--seconds", "0", "--json"], 0);
    assert_eq!(
        (v["function"].as_str(), v["count"].as_u64()),
        (Some("f1"), Some(0))
    );
    let v = json_of(&socket, &["unload", "knob", "--json"], 0);
    assert_eq!(v["name"], "knob");

    // The reading verbs, and count without --by (one point, then a glob).
    assert!(trapctl(&socket, &["splice", "f2", "--count"])
        .status
        .success());
    let v = json_of(&socket, &["list", "--json"], 0);
    assert_eq!(v["splices"][0]["at"], "f2", "{v}");
    assert!(trapctl(&socket, &["unsplice", "f2"]).status.success());
    let v = json_of(&socket, &["count", "f1", "--seconds", "0", "--json"], 0);
    assert_eq!(
        (
            v["function"].as_str(),
            v["hits"].as_u64(),
            v["ended"].as_str()
        ),
        (Some("f1"), Some(0), Some("time"))
    );
    let v = json_of(&socket, &["count", "f[01]", "--seconds", "0", "--json"], 0);
    assert_eq!(v["functions"].as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!(v["total"], 0);
    // doctor exits 1 when the machine is not ready (no trapvec.ko here): its JSON all the same.
    let out = trapctl(&socket, &["doctor", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("{\n  \"schema\": 1,\n"), "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["checks"].as_array().is_some_and(|c| !c.is_empty()), "{v}");
    let exe = env!("CARGO_BIN_EXE_trapctl");
    let v = json_of(&socket, &["points", "--process", exe, "main", "--json"], 0);
    assert!(v.as_object().is_some_and(|o| o.len() > 1), "{v}");
    let v = json_of(&socket, &["inspect", exe, "main", "--json"], 0);
    assert!(v.as_object().is_some_and(|o| o.len() > 1), "{v}");
}

/// Every verb `trapctl --help` lists offers --json, but those that print no report of their
/// own: `completions` (a script), `man` (files), `help`. `attach` and `detach` have theirs
/// (tests/attach_json.rs runs them on a process).
#[test]
fn every_listed_verb_offers_json() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    let verbs: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(verbs.len() > 15, "{top}");
    let without = ["completions", "man", "help"];
    let missing: Vec<&String> = verbs
        .iter()
        .filter(|v| !without.contains(&v.as_str()))
        .filter(|v| !help(&[v.as_str(), "--help"]).contains("--json"))
        .collect();
    assert!(missing.is_empty(), "verbs without --json: {missing:?}");
}
