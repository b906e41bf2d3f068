use super::*;

fn requests() -> [SpliceRequest; 3] {
    [
        SpliceRequest::new(
            "f",
            Action::Call {
                handler: "h".into(),
                cookie: 7,
            },
            Mechanism::Jmp,
        ),
        SpliceRequest::new(
            "f+0x9",
            Action::Replace { with: "g".into() },
            Mechanism::Trap,
        ),
        SpliceRequest::new("0xffffffff81000000", Action::Count, Mechanism::Trap),
    ]
}

#[test]
fn splices_serialize_flat_and_read_back_the_same() {
    let json: Vec<String> = requests()
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    assert_eq!(
        json,
        [
            r#"{"at":"f","action":"call","handler":"h","mechanism":"jmp","cookie":7}"#,
            r#"{"at":"f+0x9","action":"replace","handler":"g","mechanism":"trap","cookie":0}"#,
            r#"{"at":"0xffffffff81000000","action":"count","handler":null,"mechanism":"trap","cookie":0}"#,
        ]
    );
    for (r, j) in requests().iter().zip(&json) {
        assert_eq!(&serde_json::from_str::<SpliceRequest>(j).unwrap(), r);
    }
}

#[test]
fn the_flat_form_has_defaults_and_refusals_that_name_the_point() {
    let read = |j: &str| serde_json::from_str::<SpliceRequest>(j);
    let r =
        read(r#"{"at":"f","action":"count","handler":null,"mechanism":null,"cookie":0}"#).unwrap();
    assert_eq!(r, SpliceRequest::new("f", Action::Count, Mechanism::Trap));
    let r = read(r#"{"at":"f","action":"call","handler":"h"}"#).unwrap();
    assert_eq!(
        r.action,
        Action::Call {
            handler: "h".into(),
            cookie: 0
        }
    );
    let e = |j: &str| read(j).unwrap_err().to_string();
    assert!(e(r#"{"at":"f","action":"call"}"#).starts_with("f: action `call` needs a `handler`"));
    assert!(e(r#"{"at":"f","action":"replace","handler":" "}"#)
        .starts_with("f: action `replace` needs a `handler`"));
    assert!(e(r#"{"at":"f","action":"jump"}"#)
        .starts_with("f: unknown action `jump` (call, replace, count or time)"));
    assert!(e(r#"{"at":"f","action":"count","colour":"red"}"#).contains("colour"));
    assert!(e(r#"{"at":"f","action":"count","mechanism":"int3"}"#).contains("int3"));
}

#[test]
fn return_points_and_timers_have_a_flat_form_with_checked_options() {
    let read = |j: &str| serde_json::from_str::<SpliceRequest>(j);
    let r =
        read(r#"{"at":"f","action":"call","handler":"h","when":"return","maxactive":8}"#).unwrap();
    assert_eq!(
        r.options,
        SpliceOptions {
            when: When::Return,
            maxactive: Some(8),
            by: None,
            only: Predicate::default(),
            owner: None
        }
    );
    assert!(r.at_return());
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"at":"f","action":"call","handler":"h","mechanism":"trap","cookie":0,"when":"return","maxactive":8}"#
    );
    let t = read(r#"{"at":"f","action":"time","clock":"cpu"}"#).unwrap();
    assert_eq!(
        (t.action.clone(), t.options.when),
        (Action::Time { clock: Clock::Cpu }, When::Return)
    );
    assert_eq!(
        serde_json::from_str::<SpliceRequest>(&serde_json::to_string(&t).unwrap()).unwrap(),
        t
    );
    assert_eq!(
        read(r#"{"at":"f","action":"time"}"#).unwrap().action,
        Action::Time { clock: Clock::Wall }
    );
    let c = read(r#"{"at":"f","action":"count","when":"return"}"#).unwrap();
    assert!(c.at_return() && c.action == Action::Count);
    assert!(!read(r#"{"at":"f","action":"count","when":"entry"}"#)
        .unwrap()
        .at_return());
    let e = |j: &str| read(j).unwrap_err().to_string();
    assert!(e(r#"{"at":"f","action":"time","when":"entry"}"#)
        .starts_with("f: action `time` measures from the entry to the return"));
    assert!(
        e(r#"{"at":"f","action":"replace","handler":"g","when":"return"}"#)
            .starts_with("f: action `replace` has no `when = return`")
    );
    assert!(e(r#"{"at":"f","action":"count","clock":"cpu"}"#)
        .starts_with("f: `clock` belongs to action `time`"));
    assert!(e(r#"{"at":"f","action":"count","maxactive":4}"#)
        .starts_with("f: `maxactive` belongs to return points"));
    assert!(e(r#"{"at":"f","action":"time","maxactive":0}"#)
        .starts_with("f: `maxactive` must be at least 1"));
    assert!(e(r#"{"at":"f","action":"time","clock":"tsc"}"#).contains("tsc"));
    assert!(e(r#"{"at":"f","action":"count","when":"exit"}"#).contains("exit"));
    let d = SpliceRequest::from_record(
        "at=compute;action=call;handler=on_ret;mechanism=jmp;when=return",
    )
    .unwrap();
    assert_eq!(
        (d.options.when, d.mechanism),
        (When::Return, Mechanism::Jmp)
    );
}

#[test]
fn keyed_counts_are_counts_at_the_point_with_a_key() {
    let read = |j: &str| serde_json::from_str::<SpliceRequest>(j);
    let r = read(r#"{"at":"f","action":"count","by":"tid"}"#).unwrap();
    assert_eq!(r.options.by, Some(KeyBy::Tid));
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"at":"f","action":"count","handler":null,"mechanism":"trap","cookie":0,"by":"tid"}"#
    );
    let e = |j: &str| read(j).unwrap_err().to_string();
    assert!(e(r#"{"at":"f","action":"call","handler":"h","by":"cpu"}"#)
        .starts_with("f: `by` keys the hits of action `count` at the point (not `call`)"));
    assert!(
        e(r#"{"at":"f","action":"count","when":"return","by":"cpu"}"#)
            .contains("(not `count` at the return)")
    );
    assert!(e(r#"{"at":"f","action":"count","by":"uid"}"#)
        .starts_with("f: unknown key `uid` (tid: the thread, pid: the process"));
}

#[test]
fn key_pid_is_the_process_tgid_its_old_spelling_and_an_old_states_pid_the_thread() {
    let read = |j: &str| serde_json::from_str::<SpliceRequest>(j).unwrap();
    let by = |j: &str| read(j).options.by;
    assert_eq!(
        by(r#"{"at":"f","action":"count","by":"pid"}"#),
        Some(KeyBy::Pid)
    );
    assert_eq!(
        by(r#"{"at":"f","action":"count","by":"tgid"}"#),
        Some(KeyBy::Pid)
    );
    let r = read(r#"{"at":"f","action":"count","by":"pid"}"#);
    assert!(
        serde_json::to_string(&r)
            .unwrap()
            .ends_with(r#""by":"pid"}"#),
        "written as `pid`"
    );
    let tgid = read(r#"{"at":"f","action":"count","by":"tgid"}"#);
    assert!(
        serde_json::to_string(&tgid)
            .unwrap()
            .ends_with(r#""by":"pid"}"#),
        "the old spelling is written anew as `pid`"
    );
    // A spec in TOML too.
    let spec: SpliceRequest =
        toml::from_str("at = \"f\"\naction = \"count\"\nby = \"tid\"\n").unwrap();
    assert_eq!(spec.options.by, Some(KeyBy::Tid));
    // Saved before version 5: `pid` was the thread, `tgid` the process.
    {
        let _old = OldKeys::when(true);
        assert_eq!(
            by(r#"{"at":"f","action":"count","by":"pid"}"#),
            Some(KeyBy::Tid)
        );
        assert_eq!(
            by(r#"{"at":"f","action":"count","by":"tgid"}"#),
            Some(KeyBy::Pid)
        );
        assert_eq!(
            by(r#"{"at":"f","action":"count","by":"tid"}"#),
            Some(KeyBy::Tid)
        );
    }
    assert_eq!(
        by(r#"{"at":"f","action":"count","by":"pid"}"#),
        Some(KeyBy::Pid),
        "the old reading ends with its guard"
    );
}

#[test]
fn predicates_go_with_any_action_and_name_a_bad_comm() {
    let read = |j: &str| serde_json::from_str::<SpliceRequest>(j);
    let r = read(r#"{"at":"f","action":"count","pid":42,"comm":"nginx"}"#).unwrap();
    assert_eq!(
        r.options.only,
        Predicate {
            tgid: Some(42),
            comm: Some("nginx".into()),
            ..Predicate::default()
        },
        "`pid` is the process"
    );
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"at":"f","action":"count","handler":null,"mechanism":"trap","cookie":0,"pid":42,"comm":"nginx"}"#
    );
    let t = read(r#"{"at":"f","action":"time","tid":7,"tgid":8}"#).unwrap();
    assert_eq!(
        (t.options.only.tid, t.options.only.tgid),
        (Some(7), Some(8)),
        "the old `tgid` is read as the process"
    );
    assert_eq!(
        serde_json::from_str::<SpliceRequest>(&serde_json::to_string(&t).unwrap()).unwrap(),
        t
    );
    let e = read(r#"{"at":"f","action":"count","comm":"systemd-journald"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("f: comm `systemd-journald`: a task name has 1 to 15 bytes"),
        "{e}"
    );
    assert!(read(r#"{"at":"f","action":"count","pid":-1}"#).is_err());
}

#[test]
fn pid_is_the_process_and_tid_the_thread_read_and_written_so() {
    let read = |j: &str| serde_json::from_str::<SpliceRequest>(j);
    // New spellings, read and written back the same.
    let j = r#"{"at":"f","action":"count","handler":null,"mechanism":"trap","cookie":0,"tid":7,"pid":8}"#;
    let r = read(j).unwrap();
    assert_eq!(
        (r.options.only.tid, r.options.only.pid, r.options.only.tgid),
        (Some(7), None, Some(8))
    );
    assert_eq!(serde_json::to_string(&r).unwrap(), j);
    // The old spelling: `tgid` read as `pid`, written as `pid`.
    let old = read(r#"{"at":"f","action":"count","tgid":8}"#).unwrap();
    assert_eq!(old.options.only.tgid, Some(8));
    let out = serde_json::to_string(&old).unwrap();
    assert!(
        out.ends_with(r#""pid":8}"#) && !out.contains("tgid"),
        "{out}"
    );
    // A kernel thread made by the library (task->pid) is written as `tid`.
    let mut k = SpliceRequest::new("f", Action::Count, Mechanism::Trap);
    k.options.only.pid = Some(5);
    let out = serde_json::to_string(&k).unwrap();
    assert!(out.ends_with(r#""tid":5}"#), "{out}");
    // Two different processes.
    let e = read(r#"{"at":"f","action":"count","pid":1,"tgid":2}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("f: `pid` 1 and `tgid` 2: both name the process"),
        "{e}"
    );
}

#[test]
fn states_saved_with_nested_actions_are_still_read() {
    let r: SpliceRequest = serde_json::from_str(
        r#"{"at":"f","action":{"call":{"handler":"h","cookie":7}},"mechanism":"jmp"}"#,
    )
    .unwrap();
    assert_eq!(r, requests()[0]);
    let r: SpliceRequest = serde_json::from_str(
        r#"{"at":"f+0x9","action":{"replace":{"with":"g"}},"mechanism":"trap"}"#,
    )
    .unwrap();
    assert_eq!(r, requests()[1]);
}

#[test]
fn section_records_parse_like_the_header_macros_write_them() {
    let s =
        SpliceRequest::from_record("at=compute+0;action=call;handler=count_compute;mechanism=trap")
            .unwrap();
    assert_eq!(s.at, "compute+0");
    assert_eq!(
        (s.action, s.mechanism),
        (
            Action::Call {
                handler: "count_compute".into(),
                cookie: 0
            },
            Mechanism::Trap
        )
    );
    let s = SpliceRequest::from_record(
        "at=tcp_sync_mss;action=replace;handler=my_tcp_sync_mss;mechanism=jmp",
    )
    .unwrap();
    assert_eq!(
        (s.action, s.mechanism),
        (
            Action::Replace {
                with: "my_tcp_sync_mss".into()
            },
            Mechanism::Jmp
        )
    );
    for bad in [
        "action=call;handler=h;mechanism=trap",
        "at=f;action=call;handler=h;mechanism=trap;colour=red",
        "at=f;action=kill;handler=h;mechanism=trap",
        "at=f;handler=h;mechanism=trap",
        "at=f;action=call;handler=h;mechanism=int3",
    ] {
        let e = SpliceRequest::from_record(bad).unwrap_err().to_string();
        assert!(!e.is_empty(), "{bad}");
    }
    let e = SpliceRequest::from_record("at=f;action=kill;handler=h;mechanism=trap")
        .unwrap_err()
        .to_string();
    assert_eq!(e, "f: unknown action `kill` (call, replace, count or time)");
}
