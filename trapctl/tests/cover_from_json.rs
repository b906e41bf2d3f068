//! `trapctl cover --from-json FILE`: a report saved with `--json` made again without covering
//! anything. On `fixtures/cover/prog.c` (gcc -O0 -g, as tests/cover.rs builds it): the lcov
//! file made from the saved report is byte for byte the live run's, and so is the JSON; the
//! text is the live run's table. Refused, naming the culprit and writing nothing: a file that
//! is not a cover report, a report of another schema, one whose rows disagree with its blocks,
//! and a debug file that is not the covered program's (another build-id, or, without
//! build-ids, a function that is not where the report had it). Needs gcc and the built agent.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod attach_common;
use attach_common::{agent, compile};

/// A temporary directory holding `prog.c` built as `prog` with `gcc -O0 -g FLAGS`.
fn build(flags: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover/prog.c");
    std::fs::copy(src, dir.path().join("prog.c")).unwrap();
    let mut args = vec!["-O0", "-g"];
    args.extend(flags);
    args.extend(["-o", "prog", "prog.c"]);
    compile("gcc", dir.path(), &args);
    dir
}

fn trapctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("cover")
        .args(args)
        .current_dir(dir)
        .env("TRAPVEC_AGENT", agent())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}stderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A live count-mode run of `./prog 7` over every function: its JSON and lcov file in `dir`
/// (`live.json`, `live.info`), and its text report from a second, identical run.
fn live(dir: &Path) -> String {
    let out = trapctl(
        dir,
        &[
            "--process",
            "*",
            "--lcov",
            "live.info",
            "--json",
            "-o",
            "live.json",
            "--",
            "./prog",
            "7",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = trapctl(
        dir,
        &["--process", "*", "-o", "live.txt", "--", "./prog", "7"],
    );
    assert!(out.status.success(), "{}", text(&out));
    std::fs::read_to_string(dir.join("live.txt")).unwrap()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn a_saved_report_gives_the_live_runs_lcov_file_json_and_table() {
    let dir = build(&[]);
    let d = dir.path();
    let table = live(d);
    let info = read(d, "live.info");
    // The run the file is compared with has lines, counts and branches.
    assert!(
        info.contains("SF:") && info.contains("DA:") && info.contains("BRDA:"),
        "{info}"
    );

    let out = trapctl(d, &["--from-json", "live.json", "--lcov", "again.info"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(d, "again.info"), info, "the lcov file made again");
    // The text is the live run's table, to its last words.
    assert_eq!(String::from_utf8_lossy(&out.stdout), table);
    assert!(table.contains("./prog exited with status 0\n"), "{table}");

    let out = trapctl(d, &["--from-json", "live.json", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), read(d, "live.json"));

    // The report names the program's build-id, and each block's CFG.
    let report: Value = serde_json::from_str(&read(d, "live.json")).unwrap();
    let id = &report["objects"][0];
    assert!(id["path"].as_str().unwrap().ends_with("prog"), "{id}");
    assert_eq!(id["build_id"].as_str().map(str::len), Some(40), "{id}");
    assert!(report["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|b| b["succs"].is_array()));

    // The same debug file given as --debuginfo: the same lines.
    let out = trapctl(
        d,
        &[
            "--from-json",
            "live.json",
            "--debuginfo",
            "prog",
            "--lcov",
            "d.info",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read(d, "d.info"), info);
}

/// `--from-json` with `edit` applied to the live report: trapctl fails naming `culprit`, and
/// writes no lcov file.
fn refused(d: &Path, edit: impl Fn(&mut Value), extra: &[&str], culprit: &str) {
    let mut v: Value = serde_json::from_str(&read(d, "live.json")).unwrap();
    edit(&mut v);
    std::fs::write(d.join("edited.json"), serde_json::to_string(&v).unwrap()).unwrap();
    let _ = std::fs::remove_file(d.join("bad.info"));
    let mut args = vec!["--from-json", "edited.json", "--lcov", "bad.info"];
    args.extend(extra);
    let out = trapctl(d, &args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(culprit),
        "not named: {culprit}\n{}",
        text(&out)
    );
    assert!(out.stdout.is_empty(), "{}", text(&out));
    assert!(!d.join("bad.info").exists(), "an lcov file was written");
}

#[test]
fn bad_reports_and_debug_files_are_refused_naming_the_culprit() {
    let dir = build(&[]);
    let d = dir.path();
    live(d);
    // Not a cover report, not JSON, another schema.
    refused(
        d,
        |v| *v = serde_json::json!({"schema": 1, "splices": []}),
        &[],
        "edited.json: not a `trapctl cover --json` report",
    );
    std::fs::write(d.join("text.json"), "FUNCTION BLOCKS\n").unwrap();
    let out = trapctl(d, &["--from-json", "text.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("text.json is not JSON"),
        "{}",
        text(&out)
    );
    refused(
        d,
        |v| v["schema"] = 2.into(),
        &[],
        "a report of schema 2; this trapctl reads cover reports of schema 1",
    );
    // A block's row that lost a field, one whose hit flag disagrees with its hits, a total
    // that disagrees with the blocks.
    refused(
        d,
        |v| {
            v["blocks"][0].as_object_mut().unwrap().remove("address");
        },
        &[],
        "missing field `address`",
    );
    refused(
        d,
        |v| {
            let b = v["blocks"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|b| b["function"] == "square")
                .unwrap();
            b["hit"] = false.into();
        },
        &[],
        "block square+0x0 says hit false with 7 hit(s)",
    );
    refused(
        d,
        |v| v["total"]["covered"] = 1.into(),
        &[],
        "its total says",
    );
    // A debug file of another build: its build-id is named.
    let other = build(&["-DOTHER_BUILD=1", "-fno-inline", "-O1"]);
    let other_prog = other.path().join("prog");
    let want = serde_json::from_str::<Value>(&read(d, "live.json")).unwrap()["objects"][0]
        ["build_id"]
        .as_str()
        .unwrap()
        .to_string();
    refused(
        d,
        |_| {},
        &["--debuginfo", other_prog.to_str().unwrap()],
        &format!(", ./prog had {want}: not its debug file"),
    );
    // Without a build-id in the report: the first function not where the report had it.
    refused(
        d,
        |v| v["objects"][0]["build_id"] = Value::Null,
        &["--debuginfo", other_prog.to_str().unwrap()],
        "not its debug file",
    );
    // A --debuginfo that cannot be read is named too.
    refused(
        d,
        |_| {},
        &["--debuginfo", "missing.debug"],
        "missing.debug",
    );
}

/// --from-json covers nothing: it takes no GLOB, command or mode, and not -p.
#[test]
fn from_json_takes_no_globs_command_or_pid() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for args in [
        &["--from-json", "r.json", "tcp_*"][..],
        &["--from-json", "r.json", "--mode", "once"],
        &["--from-json", "r.json", "--", "true"],
    ] {
        let out = trapctl(d, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
            "{args:?}: {}",
            text(&out)
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["-p", "1", "cover", "--from-json", "r.json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("give it without -p"),
        "{}",
        text(&out)
    );
}
