//! `--json` on every command that changes or reads a splice, a component or a variable, each
//! output one JSON object with `"schema": 1` as its first key (issue 28, item 3). The real
//! binary runs against a daemon on a Unix socket (trapd's own server) whose handler is the one
//! executor, `ops::execute`, over the fake kernel (`trapvec::fake`: f0..f3, and the `knob`
//! component compiled from C). `read` needs the module itself (it reads through
//! /dev/trapvec, never through trapd) and `status`/`activate` a real daemon's profiles: their
//! JSON goes through the same helper and is not run here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use instr_manager::ops;
use instr_manager::splicer::Splicer;
use serde_json::Value;
use trapd::protocol::{self, Request};
use trapd::server::{self, Access, Handler, RequestCounts};
use trapvec::fake::{knob_component, FakeKernel};

struct FakeDaemon {
    sp: Splicer<FakeKernel>,
}

impl Handler for FakeDaemon {
    fn handle(&mut self, req: Request) -> Value {
        match ops::execute(&mut self.sp, &req) {
            Ok((reply, _)) => protocol::ok(reply.to_fields()),
            Err(e) => protocol::error(e),
        }
    }
}

fn daemon(dir: &Path) -> PathBuf {
    let k = FakeKernel::new();
    k.state().runtime_slots = true;
    let socket = dir.join("trapd.sock");
    let listener = server::bind(&socket).unwrap();
    let d = Arc::new(Mutex::new(FakeDaemon {
        sp: Splicer::new(k),
    }));
    std::thread::spawn(move || {
        server::serve(
            listener,
            d,
            Access::default(),
            Arc::new(RequestCounts::default()),
        )
    });
    socket
}

fn trapctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
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
}
