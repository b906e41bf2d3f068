//! trapctl's kernel commands as a user meets them on a machine without trapvec.ko (the host):
//! argument rules, help that explains, and one clear error line naming the device. Their work
//! against the real kernel is tested in the VM (`vmtest/tests/kernel_*.rs`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::{json, Value};

fn trapctl(args: &[&str]) -> Output {
    // No daemon: a socket path where nothing listens.
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .env("TRAPD_SOCKET", "/nonexistent/trapd.sock")
        .args(args)
        .output()
        .expect("running trapctl")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn kernel_commands_without_the_module_fail_with_one_line_naming_the_device() {
    if std::path::Path::new("/dev/trapvec").exists() {
        eprintln!("/dev/trapvec exists here: this test is for machines without the module");
        return;
    }
    for args in [
        &["list"][..],
        &["load", env!("CARGO_MANIFEST_DIR")],
        &["splice", "tcp_sync_mss", "--count"],
        &["unsplice", "--all"],
        &["set", "mss_clamp_mtu", "1400"],
        &["count", "tcp_sync_mss", "--seconds", "1"],
        &["read", "tcp_sync_mss"],
    ] {
        let out = trapctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, got {err}");
        assert!(
            err.starts_with("trapctl: opening /dev/trapvec"),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("(os error 2): No such file"),
            "{args:?}: the cause is not repeated: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn splice_takes_exactly_one_action() {
    let none = trapctl(&["splice", "tcp_sync_mss"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        stderr(&none).contains("--call <SYM>|--replace <SYM>|--count"),
        "{}",
        stderr(&none)
    );
    let two = trapctl(&["splice", "tcp_sync_mss", "--call", "h", "--replace", "r"]);
    assert_eq!(two.status.code(), Some(2));
    let cookie_without_call =
        trapctl(&["splice", "tcp_sync_mss", "--replace", "r", "--cookie", "3"]);
    assert_eq!(
        cookie_without_call.status.code(),
        Some(2),
        "{}",
        stderr(&cookie_without_call)
    );
    let bad_mech = trapctl(&["splice", "tcp_sync_mss", "--count", "--mechanism", "int3"]);
    assert!(
        stderr(&bad_mech).contains("unknown mechanism `int3`"),
        "{}",
        stderr(&bad_mech)
    );
}

#[test]
fn keyed_counts_refuse_an_unknown_key_and_key_options_without_a_key() {
    let bad = trapctl(&["count", "tcp_sync_mss", "--seconds", "1", "--by", "uid"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("unknown key `uid` (tid: the thread, pid: the process, comm or cpu)"),
        "{}",
        stderr(&bad)
    );
    // `--top` needs `--by`; `--json` without `--by` is a plain count's report since issue 28
    // (json_schema.rs).
    let args = ["count", "f", "--seconds", "1", "--top", "3"];
    let out = trapctl(&args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    assert!(
        stderr(&out).contains("--by <KEY>"),
        "{args:?}: {}",
        stderr(&out)
    );
    let by_without_count = trapctl(&["splice", "f", "--call", "h", "--by", "comm"]);
    assert_eq!(
        by_without_count.status.code(),
        Some(2),
        "{}",
        stderr(&by_without_count)
    );
    let by_at_return = trapctl(&["splice", "f", "--count", "--return", "--by", "comm"]);
    assert_eq!(
        by_at_return.status.code(),
        Some(2),
        "{}",
        stderr(&by_at_return)
    );
}

#[test]
fn set_and_get_refuse_sizes_other_than_1_2_4_8() {
    let out = trapctl(&["set", "v", "1", "--size", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("size `3` is not 1, 2, 4 or 8"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn help_explains_each_kernel_command() {
    let help = |cmd: &str| String::from_utf8(trapctl(&[cmd, "--help"]).stdout).unwrap();
    let expect = [
        (
            "splice",
            &[
                "ftrace site",
                "arguments are",
                "--replace",
                "__trapvec_orig_",
                "kprobes",
            ][..],
        ),
        (
            "apply",
            &[
                "--best-effort",
                "status is then 3",
                "all or nothing",
                "--check",
            ],
        ),
        (
            "count",
            &[
                "entry",
                "counting",
                "calls in",
                "SIGTERM",
                "-- COMMAND",
                "orphaned",
            ],
        ),
        ("time", &["SIGINT", "ended"]),
        ("list", &["missed", "CRC32", "--json"]),
        ("set", &["one store", "size"]),
        ("get", &["decimal"]),
        ("unsplice", &["--all", "hit counts", "--orphans", "SIGKILL"]),
        ("load", &["kallsyms", "TRAPVEC_SPLICE"]),
        ("read", &["kernel memory"]),
        ("status", &["trapd", "profile", "metric"]),
        ("activate", &["one all-or-nothing batch", "[profile.NAME]"]),
        (
            "require",
            &["EINVAL", "pending points", "loads all the same"],
        ),
    ];
    for (cmd, words) in expect {
        let text = help(cmd);
        for w in words {
            assert!(
                text.contains(w),
                "trapctl {cmd} --help lacks `{w}`:\n{text}"
            );
        }
    }
    let top = String::from_utf8(trapctl(&["--help"]).stdout).unwrap();
    assert!(!top.contains("cycle"), "the stress aid is hidden");
}

/// A daemon on `socket` that answers each connection's one request line with the reply
/// `answer` gives for it; returns the requests it received once `n` connections were served.
fn fake_daemon(
    socket: &Path,
    n: usize,
    answer: impl Fn(&Value) -> Value + Send + 'static,
) -> std::thread::JoinHandle<Vec<Value>> {
    let listener = UnixListener::bind(socket).unwrap();
    std::thread::spawn(move || {
        let mut requests = Vec::new();
        for _ in 0..n {
            let (mut s, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let req: Value = serde_json::from_str(&line).unwrap();
            writeln!(s, "{}", answer(&req)).unwrap();
            requests.push(req);
        }
        requests
    })
}

fn row(at: &str) -> Value {
    json!({"ok": true, "id": 3, "at": at, "site": "0xffffffff81a2b3c5", "function": "tcp_sync_mss", "offset": 5,
           "mechanism": "trap", "action": "count", "symbol": null, "displaced": "push rbp; mov rbp, rsp",
           "hits": 0, "missed": 0})
}

#[test]
fn with_trapd_listening_the_kernel_commands_go_to_it_and_print_its_reports() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("trapd.sock");
    let daemon = fake_daemon(&socket, 6, |req| match req["op"].as_str().unwrap() {
        "splice" => row(req["at"].as_str().unwrap()),
        "unsplice" => json!({"ok": false, "error": "no splice at `nope` (nothing is spliced)"}),
        "set" => json!({"ok": true, "symbol": "mss_clamp_mtu", "value": 4294967295u64, "size": 4}),
        "get" => json!({"ok": true, "symbol": "mss_clamp_mtu", "value": 1400, "size": 4}),
        "apply" => {
            json!({"ok": true, "components": [], "spliced": [row("tcp_sync_mss")], "refused": ["f: refused"],
                          "requested": 2, "timings": null})
        }
        _ => {
            let mut listed = row("tcp_sync_mss");
            listed["hits"] = json!(12);
            listed["in_profile"] = json!(true);
            json!({"ok": true, "profile": "lossy", "unrecorded": [], "components": [], "splices": [listed]})
        }
    });
    let spec = dir.path().join("spec.toml");
    std::fs::write(
        &spec,
        "[[splice]]\nat = \"tcp_sync_mss\"\naction = \"call\"\nhandler = \"h\"\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout.clone()).unwrap(),
            stderr(&out),
        )
    };

    let (code, out, _) = run(&["splice", "tcp_sync_mss", "--count"]);
    assert_eq!(code, Some(0));
    assert_eq!(out, "spliced tcp_sync_mss at 0xffffffff81a2b3c5 (tcp_sync_mss+0x5) by trap: count; displaced `push rbp; mov rbp, rsp`\n");
    let (code, _, err) = run(&["unsplice", "nope"]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(1),
            "trapctl: trapd: no splice at `nope` (nothing is spliced)\n"
        )
    );
    let (code, out, _) = run(&["set", "mss_clamp_mtu", "-1"]);
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "mss_clamp_mtu = -1 (4 bytes)\n")
    );
    let (_, out, _) = run(&["get", "mss_clamp_mtu"]);
    assert_eq!(out, "1400\n");
    let (code, out, err) = run(&["apply", "--best-effort", "spec.toml"]);
    assert_eq!(
        code,
        Some(3),
        "a refused splice makes the exit status 3 (partly applied)"
    );
    assert_eq!(
        out,
        "spliced tcp_sync_mss at 0xffffffff81a2b3c5 by trap: count\n"
    );
    assert_eq!(
        err,
        "refused: f: refused\ntrapctl: 1 of 2 splices refused (1 applied)\n"
    );
    let (_, out, _) = run(&["list"]);
    assert!(out.starts_with("trapd profile: lossy\nPOINT"), "{out}");
    assert!(
        out.lines().nth(2).unwrap().split_whitespace().eq([
            "tcp_sync_mss",
            "0xffffffff81a2b3c5",
            "trap",
            "count",
            "12",
            "0"
        ]),
        "{out}"
    );

    let requests = daemon.join().unwrap();
    assert_eq!(
        requests[0],
        json!({"op": "splice", "at": "tcp_sync_mss", "action": "count", "handler": null, "mechanism": "trap", "cookie": 0})
    );
    assert_eq!(requests[1], json!({"op": "unsplice", "at": "nope"}));
    assert_eq!(
        requests[2],
        json!({"op": "set", "symbol": "mss_clamp_mtu", "value": "-1", "size": null})
    );
    assert_eq!(
        requests[3],
        json!({"op": "get", "symbol": "mss_clamp_mtu", "size": null})
    );
    // The daemon runs elsewhere: paths go absolute.
    let spec_abs = std::fs::canonicalize(&spec).unwrap();
    assert_eq!(
        requests[4],
        json!({"op": "apply", "spec": spec_abs, "best_effort": true})
    );
    assert_eq!(requests[5], json!({"op": "list"}));
}

#[test]
fn status_activate_and_require_need_trapd_and_say_so() {
    for args in [
        &["status"][..],
        &["activate", "lossy"],
        &["require", "tv_modcalls"],
    ] {
        let out = trapctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(stderr(&out).lines().next().unwrap(), "trapctl: no trapd is listening on /nonexistent/trapd.sock (start trapd, or give its --socket)");
    }
}

#[test]
fn require_sends_the_module_to_trapd_and_says_what_it_means() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("trapd.sock");
    let daemon = fake_daemon(
        &socket,
        2,
        |req| json!({"ok": true, "require": req["module"].clone()}),
    );
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trapctl"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .output()
            .unwrap()
    };
    let out = run(&["require", "tv_modcalls"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "module tv_modcalls is required: its load is refused if a pending point in it cannot be made\n"
    );
    let out = run(&["require", "tv_other", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["schema"].as_u64(), v["require"].as_str()),
        (Some(1), Some("tv_other"))
    );
    assert_eq!(
        daemon.join().unwrap(),
        [
            json!({"op": "require", "module": "tv_modcalls"}),
            json!({"op": "require", "module": "tv_other"})
        ]
    );
}
