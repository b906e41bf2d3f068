//! `trapctl list --by pid` (issue 28): the process backend's live splices grouped by the process
//! they live in. Two `fixtures/attach/loop.c` processes, each attached and counted at `work`
//! a different number of times, are listed each under its own pid with its own hits, in text
//! and in `--json`; once one is detached (its agent still mapped, its channel stopped) it is
//! named as not answering and the other is listed as before. Other processes with the agent
//! (tests running beside this one) may be listed too: only these two are checked. Needs cc and
//! the built agent (`cargo build --release -p trapvec-agent`).

use serde_json::Value;

mod attach_common;
use attach_common::{text, trapctl, LoopFixture};

/// `trapctl list --by pid --json`, checked to succeed.
fn by_pid_json() -> Value {
    let o = trapctl(&["list", "--by", "pid", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(v["schema"], 1, "{v}");
    v
}

/// The group of `pid` in `list` (its `processes` or `unanswered`), if any.
fn group<'a>(v: &'a Value, list: &str, pid: &str) -> Option<&'a Value> {
    let pid: i64 = pid.parse().unwrap();
    v[list]
        .as_array()
        .unwrap_or_else(|| panic!("no `{list}` array: {v}"))
        .iter()
        .find(|g| g["pid"] == pid)
}

#[test]
fn list_by_pid_groups_each_processes_splices_under_its_pid() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = LoopFixture::start(da.path());
    let mut b = LoopFixture::start(db.path());
    for (f, n) in [(&mut a, 3), (&mut b, 5)] {
        let o = trapctl(&["-p", &f.pid, "splice", "work", "--count"]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(f.calls(n), n, "the program's result");
    }

    let v = by_pid_json();
    for (f, n) in [(&a, 3), (&b, 5)] {
        let g = group(&v, "processes", &f.pid).unwrap_or_else(|| panic!("{} listed: {v}", f.pid));
        assert_eq!(g["comm"], "loop", "{g}");
        let splices = g["splices"].as_array().unwrap();
        assert_eq!(splices.len(), 1, "its one splice: {g}");
        assert_eq!(splices[0]["function"], "work", "{g}");
        assert_eq!(splices[0]["hits"], n, "its own hits: {g}");
    }

    let o = trapctl(&["list", "--by", "pid"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    for (f, n) in [(&a, 3), (&b, 5)] {
        let head = format!("process {} (loop): 1 splice(s)\n", f.pid);
        let at = out
            .find(&head)
            .unwrap_or_else(|| panic!("`{head}` in: {out}"));
        let row = out[at + head.len()..].lines().next().unwrap_or_default();
        assert!(
            row.contains(" work at 0x") && row.ends_with(&format!(": count, {n} hits")),
            "the row under {}'s header: `{row}` in: {out}",
            f.pid
        );
    }
    assert!(
        out.lines()
            .last()
            .is_some_and(|l| l.ends_with("process(es) with the agent")),
        "{out}"
    );

    // Detached: the agent stays mapped, its channel is gone.
    let o = trapctl(&["-p", &a.pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    let v = by_pid_json();
    assert!(group(&v, "processes", &a.pid).is_none(), "{v}");
    let u = group(&v, "unanswered", &a.pid).unwrap_or_else(|| panic!("{} named: {v}", a.pid));
    assert!(
        u["reason"].as_str().unwrap().contains("does not answer"),
        "{u}"
    );
    let g = group(&v, "processes", &b.pid).unwrap_or_else(|| panic!("{} listed: {v}", b.pid));
    assert_eq!(g["splices"][0]["hits"], 5, "{g}");
    let o = trapctl(&["-p", &b.pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
}
