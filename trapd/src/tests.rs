//! The daemon over a fake kernel (memory, arena, dispatch table and state blob shared between
//! "runs", as the module outlives a killed daemon): profile switches, the journal, and restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use trapvec::fake::{func_addr, FakeKernel, ARENA};
use trapvec::{DispatchEntry, TargetError};

use crate::client;
use instr_manager::ops;
use instr_manager::{Action, Mechanism, SpliceRequest};

use super::config::Config;
use super::daemon::{Daemon, StateHome};
use super::journal::{read_records, Record};
use super::protocol::Request;

impl StateHome for FakeKernel {
    fn load_state(&self) -> Result<(u64, Vec<u8>), TargetError> {
        Ok(self.blob())
    }
    fn store_state(&self, expected: u64, bytes: &[u8]) -> Result<u64, TargetError> {
        self.put_blob(expected, bytes)
    }
}

/// Where the stored state is: the module snapshot's generation and the lines of the state log
/// after it (kept beside the journal for the fake kernel).
fn state_position(k: &FakeKernel, journal: &Path) -> (u64, usize) {
    let log = std::fs::read_to_string(journal.with_extension("state")).unwrap_or_default();
    (k.blob().0, log.lines().count())
}

fn func(name: &str) -> u64 {
    func_addr(name)
}

const CONFIG: &str = r#"
initial_profile = "clean"
[profile.both]
splice = [{ at = "f0", action = "count" }, { at = "f1", action = "count" }]
[profile.other]
splice = [{ at = "f1", action = "count" }, { at = "f2", action = "count" }]
[profile.bad]
splice = [{ at = "f3", action = "count" }, { at = "no_such_function", action = "count" }]
[profile.clean]
"#;

fn start(k: &FakeKernel, journal: &Path) -> Daemon<FakeKernel> {
    let config = Config::parse(CONFIG, Path::new("trapd.toml")).unwrap();
    Daemon::start(k.clone(), config, journal).unwrap()
}

/// A daemon on `k` that activated `profile` and was then killed (`kill -9`: gone without any
/// clean-up; the module keeps everything).
fn killed_after_activating(k: &FakeKernel, journal: &Path, profile: &str) {
    let mut d = start(k, journal);
    activate(&mut d, profile);
    std::mem::forget(d);
}

fn activate(d: &mut Daemon<FakeKernel>, p: &str) -> Value {
    d.handle(Request::Activate { profile: p.into() })
}

fn live_points(d: &mut Daemon<FakeKernel>) -> Vec<String> {
    let list = d.handle(Request::List);
    list["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["at"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn profile_switch_is_one_batch_keeping_shared_splices_and_journaled_before_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    let mut d = start(&k, &journal);
    assert_eq!(d.profile(), Some("clean"));
    assert_eq!(
        activate(&mut d, "both"),
        json!({"ok": true, "profile": "both", "previous": "clean", "removed": 0, "added": 2, "in_place": 0, "handed_over": 0, "removed_hits": 0})
    );
    assert!(k.trapped("f0") && k.trapped("f1"));
    let batches = k.state().batches;
    // both -> other: f0 goes, f2 comes, f1 (in both profiles) stays untouched.
    assert_eq!(activate(&mut d, "other")["removed"], json!(1));
    assert_eq!(
        k.state().batches,
        batches + 1,
        "one text batch for the whole switch"
    );
    assert!(!k.trapped("f0") && k.trapped("f1") && k.trapped("f2"));
    assert_eq!(live_points(&mut d), ["f1", "f2"]);
    // The journal holds intent and done for every change, the done carrying the profile and
    // the module's state generation at that moment.
    let recs = read_records(&journal).unwrap();
    let Some(Record::Done {
        generation,
        profile,
        ..
    }) = recs.last()
    else {
        panic!("{recs:?}")
    };
    assert_eq!(
        (*generation, profile.as_deref()),
        (k.blob().0, Some("other"))
    );
    let intents = recs
        .iter()
        .filter(|r| matches!(r, Record::Intent { .. }))
        .count();
    let dones = recs
        .iter()
        .filter(|r| matches!(r, Record::Done { .. }))
        .count();
    assert_eq!(
        (intents, dones),
        (3, 3),
        "initial clean, both, other: {recs:?}"
    );
    activate(&mut d, "clean");
    assert!(k.pristine());
}

#[test]
fn refused_profile_changes_nothing_and_is_journaled_failed() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut d = start(&k, &dir.path().join("journal"));
    activate(&mut d, "both");
    let generation = k.blob().0;
    let reply = activate(&mut d, "bad");
    assert_eq!(reply["ok"], json!(false));
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("no_such_function"),
        "{reply}"
    );
    assert_eq!(d.profile(), Some("both"));
    assert!(k.trapped("f0") && k.trapped("f1") && !k.trapped("f3"));
    assert_eq!(
        k.blob().0,
        generation,
        "no state stored for a refused change"
    );
    let recs = read_records(&dir.path().join("journal")).unwrap();
    assert!(
        matches!(recs.last(), Some(Record::Failed { .. })),
        "{recs:?}"
    );
    assert_eq!(
        activate(&mut d, "nope")["error"],
        json!("profile `nope`: no profile named `nope` in the configuration")
    );
}

#[test]
fn restart_after_a_kill_takes_over_the_live_splices_without_applying_them_twice() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    killed_after_activating(&k, &journal, "both");
    let mut d = start(&k, &journal);
    assert_eq!(
        d.profile(),
        Some("both"),
        "the journal names the active profile"
    );
    assert_eq!(live_points(&mut d), ["f0", "f1"]);
    assert_eq!(d.handle(Request::List)["unrecorded"], json!([]));
    // Re-activating the live profile adds nothing (the fake asserts no site gets a second entry).
    assert_eq!(activate(&mut d, "both")["added"], json!(0));
    activate(&mut d, "clean");
    assert!(k.pristine(), "switching still works after the restart");
    // The journal was compacted at the restart: a checkpoint, then this run's changes.
    assert!(matches!(
        read_records(&journal).unwrap()[0],
        Record::Checkpoint { .. }
    ));
}

#[test]
fn interrupted_switch_whose_state_reached_the_module_is_taken_as_done() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    killed_after_activating(&k, &journal, "both");
    // The crash came after the state was stored and before `done` was journaled.
    let text = std::fs::read_to_string(&journal).unwrap();
    let kept: Vec<&str> = text.lines().collect();
    assert!(kept.last().unwrap().contains("\"done\""));
    std::fs::write(&journal, kept[..kept.len() - 1].join("\n") + "\n").unwrap();
    let mut d = start(&k, &journal);
    assert_eq!(d.profile(), Some("both"));
    assert_eq!(live_points(&mut d), ["f0", "f1"]);
}

#[test]
fn dispatch_entries_no_stored_state_describes_are_listed_as_unrecorded() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let site = func("f3") + 5;
    k.state().dispatch.insert(
        site,
        DispatchEntry {
            site,
            dest: ARENA + 0x1000,
            handler: 0,
            cookie: 0,
            only: None,
        },
    );
    let mut d = start(&k, &dir.path().join("journal"));
    let list = d.handle(Request::List);
    assert_eq!(list["unrecorded"][0]["site"], json!(format!("{site:#x}")));
    assert_eq!(d.handle(Request::Status)["unrecorded"], json!(1));
}

#[test]
fn reads_are_answered_without_journaling_and_splice_requests_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    let mut d = start(&k, &journal);
    let before = read_records(&journal).unwrap().len();
    assert_eq!(d.handle(Request::Status)["profile"], json!("clean"));
    assert_eq!(read_records(&journal).unwrap().len(), before);
    let r = d.handle(Request::Splice(SpliceRequest {
        at: "f2".into(),
        action: Action::Count,
        mechanism: Mechanism::Trap,
        options: Default::default(),
    }));
    assert_eq!(r["site"], json!(format!("{:#x}", func("f2") + 5)), "{r}");
    assert!(k.trapped("f2"));
    assert_eq!(live_points(&mut d), ["f2"]);
    assert_eq!(
        d.handle(Request::List)["splices"][0]["in_profile"],
        json!(false)
    );
    assert_eq!(
        d.handle(Request::Unsplice {
            at: Some("f2".into()),
            all: false
        })["ok"],
        json!(true)
    );
    assert_eq!(
        d.handle(Request::Unsplice {
            at: Some("f2".into()),
            all: false
        })["error"],
        json!("no splice at `f2` (nothing is spliced)")
    );
    assert!(k.pristine());
}

#[test]
fn a_splice_request_with_a_task_predicate_reaches_the_dispatch_entry_and_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut d = start(&k, &dir.path().join("journal"));
    let req: Request = serde_json::from_str(
        r#"{"op":"splice","at":"f2","action":"count","tgid":42,"comm":"nginx"}"#,
    )
    .unwrap();
    let r = d.handle(req);
    assert_eq!(
        r["action"],
        json!("count (only tgid 42, comm nginx)"),
        "{r}"
    );
    let site = func("f2") + 5;
    let e = k.state().dispatch[&site];
    let only = e.only.expect("the dispatcher tests the task");
    assert_eq!((only.pid, only.tgid, only.skip), (None, Some(42), e.dest));
    assert_eq!(&only.comm.unwrap()[..6], b"nginx\0");
    let bad: Request = serde_json::from_str(
        r#"{"op":"splice","at":"f3","action":"count","comm":"a-very-long-name"}"#,
    )
    .unwrap_or(Request::Status);
    assert!(
        matches!(bad, Request::Status),
        "a bad name is refused when the request is read"
    );
    assert_eq!(
        d.handle(Request::Unsplice {
            at: Some("f2".into()),
            all: false
        })["ok"],
        json!(true)
    );
    assert!(k.pristine());
}

#[test]
fn journal_profile_whose_splices_are_gone_is_dropped_and_the_initial_profile_applies() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    killed_after_activating(&FakeKernel::new(), &journal, "both");
    // rmmod + insmod: every splice reverted, the module's state empty.
    let k = FakeKernel::new();
    let mut d = start(&k, &journal);
    assert_eq!(d.profile(), Some("clean"));
    assert!(live_points(&mut d).is_empty());
    assert_eq!(
        activate(&mut d, "both")["added"],
        json!(2),
        "a later activation applies the profile whole"
    );
    assert!(k.trapped("f0") && k.trapped("f1"));
}

/// `d` served on a socket in `dir`, as trapd serves it; returns the socket's path.
fn serve(d: Daemon<FakeKernel>, dir: &Path) -> std::path::PathBuf {
    serve_with_metrics(d, dir).0
}

/// `d` served on a socket in `dir` and its Prometheus endpoint on a free loopback port, as
/// trapd serves them with `listen`; returns the socket's path and the endpoint's address.
fn serve_with_metrics(
    d: Daemon<FakeKernel>,
    dir: &Path,
) -> (std::path::PathBuf, std::net::SocketAddr) {
    let path = dir.join("trapd.sock");
    let listener = super::server::bind(&path).unwrap();
    let http = super::prometheus::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = http.local_addr().unwrap();
    let d = Arc::new(Mutex::new(d));
    let counts = Arc::new(super::server::RequestCounts::default());
    let (d2, c2) = (Arc::clone(&d), Arc::clone(&counts));
    std::thread::spawn(move || super::prometheus::serve(&http, &d2, &c2));
    std::thread::spawn(move || {
        super::server::serve(listener, d, super::server::Access::default(), counts)
    });
    (path, addr)
}

/// One HTTP exchange with the endpoint: the status line, the headers (lower-cased names) and
/// the body.
fn http(addr: std::net::SocketAddr, request: &str) -> (String, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().to_string();
    let headers = lines
        .map(|l| {
            l.split_once(": ")
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                .unwrap()
        })
        .collect();
    (status, headers, body.to_string())
}

fn call<R: serde::de::DeserializeOwned>(socket: &Path, req: &Request) -> anyhow::Result<R> {
    client::call(socket, req).expect("the daemon listens")
}

#[test]
fn trapctl_requests_over_the_socket_come_back_as_the_reports_trapctl_prints() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let socket = serve(start(&k, &dir.path().join("journal")), dir.path());
    let count = |at: &str| {
        Request::Splice(SpliceRequest {
            at: at.into(),
            action: Action::Count,
            mechanism: Mechanism::Trap,
            options: Default::default(),
        })
    };

    let row: ops::SpliceRow = call(&socket, &count("f2")).unwrap();
    assert_eq!(
        (row.at.as_str(), row.function.as_str(), row.offset),
        ("f2", "f2", 5)
    );
    assert_eq!(row.site, format!("{:#x}", func("f2") + 5));
    assert_eq!(
        (
            row.mechanism.as_str(),
            row.action.as_str(),
            row.displaced.as_str()
        ),
        ("trap", "count", "push rbp; mov rbp, rsp")
    );
    assert!(k.trapped("f2"));

    let listing: ops::Listing = call(&socket, &Request::List).unwrap();
    assert_eq!(
        listing.splices,
        vec![ops::SpliceRow {
            in_profile: Some(false),
            ..row.clone()
        }]
    );

    let u: ops::Unspliced = call(
        &socket,
        &Request::Unsplice {
            at: Some(row.site.clone()),
            all: false,
        },
    )
    .unwrap();
    assert_eq!((u.at.as_str(), u.site.as_str()), ("f2", row.site.as_str()));
    assert!(k.pristine());
    let e = call::<ops::Unspliced>(
        &socket,
        &Request::Unsplice {
            at: Some("f2".into()),
            all: false,
        },
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "trapd: no splice at `f2` (nothing is spliced)"
    );

    call::<ops::SpliceRow>(&socket, &count("f2")).unwrap();
    call::<ops::SpliceRow>(
        &socket,
        &Request::Splice(SpliceRequest {
            at: "f3".into(),
            action: Action::Count,
            mechanism: Mechanism::Jmp,
            options: Default::default(),
        }),
    )
    .unwrap();
    let all: Value = call(
        &socket,
        &Request::Unsplice {
            at: None,
            all: true,
        },
    )
    .unwrap();
    let ats: Vec<&str> = all["unspliced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["at"].as_str().unwrap())
        .collect();
    assert_eq!(ats, ["f2", "f3"]);
    assert!(k.pristine());
}

#[test]
fn components_through_the_daemon_bring_their_declared_splices_and_their_variables() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let socket = serve(start(&k, &dir.path().join("journal")), dir.path());
    let object = trapvec::fake::knob_component(dir.path());

    let loaded: ops::Loaded = call(
        &socket,
        &Request::Load {
            path: object,
            name: None,
        },
    )
    .unwrap();
    assert_eq!(loaded.component.name, "knob");
    assert_eq!(loaded.spliced.len(), 1);
    assert_eq!(
        (
            loaded.spliced[0].at.as_str(),
            loaded.spliced[0].action.as_str()
        ),
        ("f3", "call on_f")
    );
    assert!(
        k.trapped("f3"),
        "the declared splice is applied with the component"
    );

    let get = Request::Get {
        symbol: "knob".into(),
        size: None,
    };
    assert_eq!(
        call::<ops::Var>(&socket, &get).unwrap(),
        ops::Var {
            symbol: "knob".into(),
            value: 7,
            size: 2
        }
    );
    let set = |v: ops::Value| Request::Set {
        symbol: "knob".into(),
        value: v,
        size: None,
    };
    assert_eq!(
        call::<ops::Var>(&socket, &set(ops::Value::Text("-1".into())))
            .unwrap()
            .value,
        0xffff
    );
    assert_eq!(call::<ops::Var>(&socket, &get).unwrap().value, 0xffff);
    let e = call::<ops::Var>(&socket, &set(ops::Value::Number(70_000)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`70000` does not fit in 2 byte(s)"), "{e}");
    let e = call::<ops::Var>(
        &socket,
        &Request::Set {
            symbol: "knob".into(),
            value: ops::Value::Number(1),
            size: Some(4),
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`knob` is 2 bytes long"), "{e}");
    assert_eq!(
        call::<ops::Var>(&socket, &get).unwrap().value,
        0xffff,
        "refused writes change nothing"
    );

    // A splice of the user's own keeps the component in use.
    let user = Request::Splice(SpliceRequest {
        at: "f1".into(),
        action: Action::Call {
            handler: "on_f".into(),
            cookie: 0,
        },
        mechanism: Mechanism::Trap,
        options: Default::default(),
    });
    call::<ops::SpliceRow>(&socket, &user).unwrap();
    let e = call::<ops::Unloaded>(
        &socket,
        &Request::Unload {
            name: "knob".into(),
        },
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "trapd: component `knob` is used by the splice(s) at f1: unsplice them first"
    );
    assert!(k.trapped("f3") && k.trapped("f1"));
    call::<ops::Unspliced>(
        &socket,
        &Request::Unsplice {
            at: Some("f1".into()),
            all: false,
        },
    )
    .unwrap();
    let u: ops::Unloaded = call(
        &socket,
        &Request::Unload {
            name: "knob".into(),
        },
    )
    .unwrap();
    assert_eq!(
        u,
        ops::Unloaded {
            name: "knob".into(),
            declared_removed: 1
        }
    );
    assert!(k.pristine());
}

#[test]
fn the_metrics_endpoint_serves_splices_profile_switches_and_request_counts_a_parser_reads() {
    use prometheus_parse::{Scrape, Value as Sample};
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let (socket, addr) = serve_with_metrics(start(&k, &dir.path().join("journal")), dir.path());
    call::<Value>(
        &socket,
        &Request::Activate {
            profile: "both".into(),
        },
    )
    .unwrap();
    call::<Value>(
        &socket,
        &Request::Activate {
            profile: "nope".into(),
        },
    )
    .unwrap_err();
    call::<ops::Listing>(&socket, &Request::List).unwrap();
    let jmp = Request::Splice(SpliceRequest {
        at: "f2".into(),
        action: Action::Count,
        mechanism: Mechanism::Jmp,
        options: Default::default(),
    });
    let f2: ops::SpliceRow = call(&socket, &jmp).unwrap();
    assert_eq!(client::exchange(&socket, b"not json\n").unwrap().len(), 1);
    k.state().hits.insert(func("f0") + 5, 42);

    let (status, headers, body) = http(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains(&(
            "content-type".into(),
            "text/plain; version=0.0.4; charset=utf-8".into()
        )),
        "{headers:?}"
    );
    assert!(
        headers.contains(&("content-length".into(), body.len().to_string())),
        "{headers:?}"
    );
    let lines: Vec<std::io::Result<String>> = body.lines().map(|l| Ok(l.to_string())).collect();
    let scrape = Scrape::parse(lines.into_iter()).unwrap();
    assert_eq!(
        scrape.samples.len(),
        body.lines().filter(|l| !l.starts_with('#')).count(),
        "every sample parsed:\n{body}"
    );
    let get = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        let found: Vec<f64> = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            })
            .map(|s| match s.value {
                Sample::Counter(v) | Sample::Gauge(v) => v,
                ref other => panic!("{metric}: {other:?}"),
            })
            .collect();
        assert_eq!(found.len(), 1, "{metric}{labels:?} in\n{body}");
        found[0]
    };
    assert_eq!(
        get(
            "trapvec_splice_hits_total",
            &[("point", "f0"), ("mechanism", "trap"), ("action", "count")]
        ),
        42.0
    );
    assert_eq!(get("trapvec_splice_hits_total", &[("point", "f1")]), 0.0);
    assert_eq!(
        get(
            "trapvec_splice_missed_total",
            &[
                ("point", "f2"),
                ("mechanism", "jmp"),
                ("off", f2.offset.to_string().as_str())
            ]
        ),
        0.0
    );
    assert_eq!(get("trapvec_splices", &[]), 3.0);
    assert_eq!(get("trapd_profile_active", &[("profile", "both")]), 1.0);
    for other in ["bad", "clean", "other"] {
        assert_eq!(get("trapd_profile_active", &[("profile", other)]), 0.0);
    }
    assert_eq!(
        get("trapd_profile_switches_total", &[]),
        2.0,
        "the initial clean, then both"
    );
    assert_eq!(get("trapd_requests_total", &[("op", "activate")]), 2.0);
    assert_eq!(
        get("trapd_request_errors_total", &[("op", "activate")]),
        1.0,
        "the unknown profile"
    );
    assert_eq!(
        get("trapd_requests_total", &[("op", "list")]),
        1.0,
        "scrapes are not requests"
    );
    assert_eq!(get("trapd_requests_total", &[("op", "splice")]), 1.0);
    assert_eq!(get("trapd_request_errors_total", &[("op", "invalid")]), 1.0);
    assert_eq!(get("trapd_unrecorded_dispatch_entries", &[]), 0.0);

    let (status, _, body) = http(addr, "GET /other HTTP/1.1\r\n\r\n");
    assert_eq!(
        (status.as_str(), body.as_str()),
        (
            "HTTP/1.1 404 Not Found",
            "/other: the metrics are at /metrics\n"
        )
    );
    let (status, headers, _) = http(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    assert!(headers.contains(&("allow".into(), "GET".into())));
    let (status, _, _) = http(
        addr,
        &format!(
            "GET /metrics HTTP/1.1\r\nX-Long: {}\r\n\r\n",
            "x".repeat(10_000)
        ),
    );
    assert_eq!(status, "HTTP/1.1 400 Bad Request", "a head over 8 KiB");
    // A scrape changed nothing: the splices are still those of `both` and f2.
    assert_eq!(
        call::<ops::Listing>(&socket, &Request::List)
            .unwrap()
            .splices
            .len(),
        3
    );
}

/// Profiles take the splice form's return points, timers, keyed counts and task predicates,
/// checked when the configuration is read (a contradiction names its point); activated, a
/// predicate reaches the dispatch entry. A switch that hands f0 over to a jmp splice and is
/// then refused (the fake kernel has no return slots) makes f0's old splice again and stores
/// that in the module, so a daemon started after a kill finds it recorded. Trap to trap, f0
/// changes hands in place.
#[test]
fn profiles_take_return_points_timers_keyed_counts_and_predicates() {
    use instr_manager::When;
    use trapvec::keyed::KeyBy;
    use trapvec::returns::Clock;

    let text = r#"
[profile.only]
splice = [{ at = "f0", action = "count", tgid = 42, comm = "nginx" }, { at = "f1", action = "count" }]
[profile.plain]
splice = [{ at = "f0", action = "count" }, { at = "f1", action = "count" }]
[profile.watch]
splice = [
  { at = "f0", action = "count", when = "return", maxactive = 8, tid = 7, mechanism = "jmp" },
  { at = "f1", action = "time", clock = "cpu" },
  { at = "f2", action = "count", by = "comm" },
]
"#;
    let config = Config::parse(text, Path::new("trapd.toml")).unwrap();
    let w = config.profiles["watch"].requests();
    assert_eq!(
        (
            w[0].options.when,
            w[0].options.maxactive,
            w[0].options.only.tid
        ),
        (When::Return, Some(8), Some(7))
    );
    assert_eq!(
        (&w[1].action, w[1].options.when),
        (&Action::Time { clock: Clock::Cpu }, When::Return)
    );
    assert_eq!(
        (&w[2].action, w[2].options.by),
        (&Action::Count, Some(KeyBy::Comm))
    );
    let err = |t: &str| trapvec::error_chain(&Config::parse(t, Path::new("t.toml")).unwrap_err());
    let e = err("[profile.p]\nsplice = [{ at = \"f4\", action = \"time\", by = \"pid\" }]\n");
    assert!(
        e.contains("f4: `by` keys the hits of action `count`"),
        "{e}"
    );
    let e = err("[profile.p]\nsplice = [{ at = \"f4\", action = \"count\", comm = \"a-very-long-name\" }]\n");
    assert!(e.contains("f4") && e.contains("comm"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut d = Daemon::start(k.clone(), config, &dir.path().join("journal")).unwrap();
    let reply = activate(&mut d, "only");
    assert_eq!(reply["added"], json!(2), "{reply}");
    let e = k.state().dispatch[&(func("f0") + 5)];
    let only = e.only.expect("the dispatcher tests the task");
    assert_eq!((only.pid, only.tgid, only.skip), (None, Some(42), e.dest));
    assert_eq!(&only.comm.unwrap()[..6], b"nginx\0");
    assert_eq!(k.state().dispatch[&(func("f1") + 5)].only, None);
    let rows = d.handle(Request::List);
    assert_eq!(
        rows["splices"][0]["action"],
        json!("count (only tgid 42, comm nginx)"),
        "{rows}"
    );

    let stored = state_position(&k, &dir.path().join("journal"));
    let reply = activate(&mut d, "watch");
    assert_eq!(reply["ok"], json!(false), "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("return points and timers"),
        "{reply}"
    );
    assert_eq!(d.profile(), Some("only"));
    assert!(k.trapped("f0") && k.trapped("f1") && !k.trapped("f2"));
    assert_eq!(
        k.state().dispatch[&(func("f0") + 5)].only.map(|o| o.tgid),
        Some(Some(42))
    );
    assert_ne!(
        state_position(&k, &dir.path().join("journal")),
        stored,
        "f0 made again, in new code: stored"
    );
    std::mem::forget(d);
    let mut d = Daemon::start(
        k.clone(),
        Config::parse(text, Path::new("trapd.toml")).unwrap(),
        &dir.path().join("journal"),
    )
    .unwrap();
    assert_eq!(d.profile(), Some("only"));
    let mut points = live_points(&mut d);
    points.sort();
    assert_eq!(points, ["f0", "f1"]);
    assert_eq!(d.handle(Request::List)["unrecorded"], json!([]));
    // A refusal that changed nothing stores nothing.
    let generation = k.blob().0;
    assert_eq!(activate(&mut d, "nope")["ok"], json!(false));
    assert_eq!(k.blob().0, generation);
    // To a profile that keeps f1 and counts f0 for every task: f0's trap stays and its dispatch
    // entry is replaced, with no batch of text.
    let batches = k.state().batches;
    let reply = activate(&mut d, "plain");
    assert_eq!(
        reply,
        json!({"ok": true, "profile": "plain", "previous": "only", "removed": 1, "added": 1, "in_place": 1, "handed_over": 0, "removed_hits": 0})
    );
    assert_eq!(k.state().batches, batches, "no text written");
    assert_eq!(k.state().dispatch[&(func("f0") + 5)].only, None);
    assert!(k.trapped("f0") && k.trapped("f1"));
    assert_eq!(
        d.handle(Request::Unsplice {
            at: None,
            all: true
        })["ok"],
        json!(true)
    );
    assert!(k.pristine());
}

/// The `at` of every pending point in the daemon's listing.
fn pending_points(d: &mut Daemon<FakeKernel>) -> Vec<String> {
    let list = d.handle(Request::List);
    list["pending"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| r["at"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn unsplice(d: &mut Daemon<FakeKernel>, at: &str) -> Value {
    d.handle(Request::Unsplice {
        at: Some(at.into()),
        all: false,
    })
}

#[test]
fn unsplice_glob_forgets_the_pending_points_it_matches_and_removes_only_its_live_splices() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let mut d = start(&k, &dir.path().join("journal"));
    // The fake kernel has no modules: a point in one is pending.
    for at in ["modx:work_a", "modx:work_b+4", "mody:work_c", "f1"] {
        let r = d.handle(Request::Splice(SpliceRequest::new(
            at,
            Action::Count,
            Mechanism::Trap,
        )));
        assert_eq!(r["ok"], json!(true), "{at}: {r}");
    }
    assert_eq!(
        pending_points(&mut d),
        ["modx:work_a", "modx:work_b+4", "mody:work_c"]
    );

    // A module-qualified glob: that module's pending points, no live splice (not an error).
    let r = unsplice(&mut d, "modx:*");
    assert_eq!(r["ok"], json!(true), "{r}");
    assert_eq!(r["unspliced"], json!([]), "{r}");
    let forgot: Vec<&str> = r["forgot"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["at"].as_str().unwrap())
        .collect();
    assert_eq!(forgot, ["modx:work_a", "modx:work_b+4"]);
    assert_eq!(pending_points(&mut d), ["mody:work_c"]);
    assert!(k.trapped("f1"), "the live splice outside the glob stays");

    // A glob over names: the pending point it matches; the live f1 is not its.
    let r = unsplice(&mut d, "*_c");
    assert_eq!(r["forgot"][0]["at"], json!("mody:work_c"), "{r}");
    assert!(pending_points(&mut d).is_empty());
    assert_eq!(live_points(&mut d), ["f1"]);

    // With nothing pending, a glob is the splicer's as before: its live splices, or an error.
    let r = unsplice(&mut d, "work_*");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .starts_with("no splice at `work_*`"),
        "{r}"
    );
    let r = unsplice(&mut d, "f*");
    assert_eq!(r["unspliced"][0]["at"], json!("f1"), "{r}");
    assert!(r.get("forgot").is_none(), "{r}");
    assert!(k.pristine());
}

/// `d.handle(req)` read back as the typed reply a client gets.
fn typed<R: TryFrom<ops::Reply, Error = ops::WrongReply>>(
    d: &mut Daemon<FakeKernel>,
    req: Request,
) -> R {
    let mut v = d.handle(req.clone());
    assert_eq!(v["ok"], json!(true), "{v}");
    v.as_object_mut().unwrap().remove("ok");
    R::try_from(ops::Reply::from_fields(&req, v).unwrap()).unwrap()
}

#[test]
fn hits_answers_only_the_splices_hit_enough_with_their_exact_counts() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    let mut d = start(&k, &journal);
    let mut id = BTreeMap::new();
    for f in ["f0", "f1", "f2", "f3"] {
        let r = d.handle(Request::Splice(SpliceRequest::new(
            f,
            Action::Count,
            Mechanism::Trap,
        )));
        assert_eq!(r["ok"], json!(true), "{f}: {r}");
        id.insert(f, r["id"].as_u64().unwrap());
    }
    let site = |f: &str| format!("{:#x}", func(f) + 5);
    let row = |f: &str, hits: u64| ops::HitsRow {
        id: id[f],
        site: site(f),
        hits,
    };
    // f3 is never hit.
    for (f, n) in [("f0", 42), ("f1", 7), ("f2", 1)] {
        k.state().hits.insert(func(f) + 5, n);
    }
    let hits = |ids: Option<Vec<u64>>, min_hits| Request::Hits { ids, min_hits };
    let journaled = read_records(&journal).unwrap().len();

    // Every live splice hit at least once: exactly those, with their counts, by id.
    let r: ops::HitsReply = typed(&mut d, hits(None, 1));
    assert_eq!(
        r,
        ops::HitsReply {
            splices: vec![row("f0", 42), row("f1", 7), row("f2", 1)],
            read: 4
        }
    );
    let r: ops::HitsReply = typed(&mut d, hits(None, 10));
    assert_eq!(r.splices, vec![row("f0", 42)]);
    // No minimum: every live splice, the one never hit with 0.
    let r: ops::HitsReply = typed(&mut d, hits(None, 0));
    assert_eq!(r.splices.len(), 4);
    assert_eq!(r.splices[3], row("f3", 0));
    // The wire form: only id, site and hits per splice.
    let v = d.handle(hits(None, 40));
    assert_eq!(
        v,
        json!({"ok": true, "read": 4, "splices": [{"id": id["f0"], "site": site("f0"), "hits": 42}]})
    );

    // Named splices (a repeated id once): only those, and still only the hit ones.
    let named = vec![id["f3"], id["f2"], id["f3"]];
    let r: ops::HitsReply = typed(&mut d, hits(Some(named.clone()), 1));
    assert_eq!(
        r,
        ops::HitsReply {
            splices: vec![row("f2", 1)],
            read: 2
        }
    );
    let r: ops::HitsReply = typed(&mut d, hits(Some(named), 0));
    assert_eq!(r.splices, vec![row("f2", 1), row("f3", 0)]);

    // Counts move on between two looks.
    k.state().hits.insert(func("f3") + 5, 3);
    let r: ops::HitsReply = typed(&mut d, hits(None, 2));
    assert_eq!(r.splices, vec![row("f0", 42), row("f1", 7), row("f3", 3)]);

    // An id that is not live (never made, or unspliced): refused, naming each such id.
    assert_eq!(unsplice(&mut d, "f1")["ok"], json!(true));
    let gone = id["f1"];
    let r = d.handle(hits(Some(vec![id["f0"], 999, gone]), 1));
    assert_eq!(r["ok"], json!(false), "{r}");
    let (a, b) = (gone.min(999), gone.max(999));
    assert_eq!(
        r["error"],
        json!(format!(
            "no live splice has id {a}, {b} (3 live); nothing was read"
        ))
    );
    // Reads: nothing journaled (the unsplice was), nothing changed.
    assert_eq!(read_records(&journal).unwrap().len(), journaled + 2);
    assert!(k.trapped("f0") && k.trapped("f2") && k.trapped("f3") && !k.trapped("f1"));
    // With nothing live, an empty answer.
    assert_eq!(
        d.handle(Request::Unsplice {
            at: None,
            all: true
        })["ok"],
        json!(true)
    );
    let r: ops::HitsReply = typed(&mut d, hits(None, 0));
    assert_eq!(r, ops::HitsReply::default());
}
