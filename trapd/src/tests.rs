//! The daemon over a fake kernel (memory, arena, dispatch table and state blob shared between
//! "runs", as the module outlives a killed daemon): profile switches, the journal, and restarts.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use trapvec::fake::{func_addr, FakeKernel, ARENA};
use trapvec::{DispatchEntry, TargetError};

use instr_manager::{Action, Mechanism, SpliceRequest};
use instr_manager::ops;
use crate::client;

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
    list["splices"].as_array().unwrap().iter().map(|s| s["at"].as_str().unwrap().to_string()).collect()
}

#[test]
fn profile_switch_is_one_batch_keeping_shared_splices_and_journaled_before_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    let mut d = start(&k, &journal);
    assert_eq!(d.profile(), Some("clean"));
    assert_eq!(activate(&mut d, "both"), json!({"ok": true, "profile": "both", "previous": "clean", "removed": 0, "added": 2}));
    assert!(k.trapped("f0") && k.trapped("f1"));
    let batches = k.state().batches;
    // both -> other: f0 goes, f2 comes, f1 (in both profiles) stays untouched.
    assert_eq!(activate(&mut d, "other")["removed"], json!(1));
    assert_eq!(k.state().batches, batches + 1, "one text batch for the whole switch");
    assert!(!k.trapped("f0") && k.trapped("f1") && k.trapped("f2"));
    assert_eq!(live_points(&mut d), ["f1", "f2"]);
    // The journal holds intent and done for every change, the done carrying the profile and
    // the module's state generation at that moment.
    let recs = read_records(&journal).unwrap();
    let Some(Record::Done { generation, profile, .. }) = recs.last() else { panic!("{recs:?}") };
    assert_eq!((*generation, profile.as_deref()), (k.blob().0, Some("other")));
    let intents = recs.iter().filter(|r| matches!(r, Record::Intent { .. })).count();
    let dones = recs.iter().filter(|r| matches!(r, Record::Done { .. })).count();
    assert_eq!((intents, dones), (3, 3), "initial clean, both, other: {recs:?}");
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
    assert!(reply["error"].as_str().unwrap().contains("no_such_function"), "{reply}");
    assert_eq!(d.profile(), Some("both"));
    assert!(k.trapped("f0") && k.trapped("f1") && !k.trapped("f3"));
    assert_eq!(k.blob().0, generation, "no state stored for a refused change");
    let recs = read_records(&dir.path().join("journal")).unwrap();
    assert!(matches!(recs.last(), Some(Record::Failed { .. })), "{recs:?}");
    assert_eq!(activate(&mut d, "nope")["error"], json!("profile `nope`: no profile named `nope` in the configuration"));
}

#[test]
fn restart_after_a_kill_takes_over_the_live_splices_without_applying_them_twice() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    let k = FakeKernel::new();
    killed_after_activating(&k, &journal, "both");
    let mut d = start(&k, &journal);
    assert_eq!(d.profile(), Some("both"), "the journal names the active profile");
    assert_eq!(live_points(&mut d), ["f0", "f1"]);
    assert_eq!(d.handle(Request::List)["unrecorded"], json!([]));
    // Re-activating the live profile adds nothing (the fake asserts no site gets a second entry).
    assert_eq!(activate(&mut d, "both")["added"], json!(0));
    activate(&mut d, "clean");
    assert!(k.pristine(), "switching still works after the restart");
    // The journal was compacted at the restart: a checkpoint, then this run's changes.
    assert!(matches!(read_records(&journal).unwrap()[0], Record::Checkpoint { .. }));
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
    k.state().dispatch.insert(site, DispatchEntry { site, dest: ARENA + 0x1000, handler: 0, cookie: 0 });
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
    let r = d.handle(Request::Splice(SpliceRequest { at: "f2".into(), action: Action::Count, mechanism: Mechanism::Trap }));
    assert_eq!(r["site"], json!(format!("{:#x}", func("f2") + 5)), "{r}");
    assert!(k.trapped("f2"));
    assert_eq!(live_points(&mut d), ["f2"]);
    assert_eq!(d.handle(Request::List)["splices"][0]["in_profile"], json!(false));
    assert_eq!(d.handle(Request::Unsplice { at: Some("f2".into()), all: false })["ok"], json!(true));
    assert_eq!(d.handle(Request::Unsplice { at: Some("f2".into()), all: false })["error"], json!("no splice at `f2` (nothing is spliced)"));
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
    assert_eq!(activate(&mut d, "both")["added"], json!(2), "a later activation applies the profile whole");
    assert!(k.trapped("f0") && k.trapped("f1"));
}

/// `d` served on a socket in `dir`, as trapd serves it; returns the socket's path.
fn serve(d: Daemon<FakeKernel>, dir: &Path) -> std::path::PathBuf {
    let path = dir.join("trapd.sock");
    let listener = super::server::bind(&path).unwrap();
    let d = Arc::new(Mutex::new(d));
    std::thread::spawn(move || super::server::serve(listener, d, super::server::Access::default()));
    path
}

fn call<R: serde::de::DeserializeOwned>(socket: &Path, req: &Request) -> anyhow::Result<R> {
    client::call(socket, req).expect("the daemon listens")
}

#[test]
fn trapctl_requests_over_the_socket_come_back_as_the_reports_trapctl_prints() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let socket = serve(start(&k, &dir.path().join("journal")), dir.path());
    let count = |at: &str| Request::Splice(SpliceRequest { at: at.into(), action: Action::Count, mechanism: Mechanism::Trap });

    let row: ops::SpliceRow = call(&socket, &count("f2")).unwrap();
    assert_eq!((row.at.as_str(), row.function.as_str(), row.offset), ("f2", "f2", 5));
    assert_eq!(row.site, format!("{:#x}", func("f2") + 5));
    assert_eq!((row.mechanism.as_str(), row.action.as_str(), row.displaced.as_str()), ("trap", "count", "push rbp; mov rbp, rsp"));
    assert!(k.trapped("f2"));

    let listing: ops::Listing = call(&socket, &Request::List).unwrap();
    assert_eq!(listing.splices, vec![ops::SpliceRow { in_profile: Some(false), ..row.clone() }]);

    let u: ops::Unspliced = call(&socket, &Request::Unsplice { at: Some(row.site.clone()), all: false }).unwrap();
    assert_eq!((u.at.as_str(), u.site.as_str()), ("f2", row.site.as_str()));
    assert!(k.pristine());
    let e = call::<ops::Unspliced>(&socket, &Request::Unsplice { at: Some("f2".into()), all: false }).unwrap_err();
    assert_eq!(e.to_string(), "trapd: no splice at `f2` (nothing is spliced)");

    call::<ops::SpliceRow>(&socket, &count("f2")).unwrap();
    call::<ops::SpliceRow>(&socket, &Request::Splice(SpliceRequest { at: "f3".into(), action: Action::Count, mechanism: Mechanism::Jmp })).unwrap();
    let all: Value = call(&socket, &Request::Unsplice { at: None, all: true }).unwrap();
    let ats: Vec<&str> = all["unspliced"].as_array().unwrap().iter().map(|u| u["at"].as_str().unwrap()).collect();
    assert_eq!(ats, ["f2", "f3"]);
    assert!(k.pristine());
}

#[test]
fn components_through_the_daemon_bring_their_declared_splices_and_their_variables() {
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKernel::new();
    let socket = serve(start(&k, &dir.path().join("journal")), dir.path());
    let object = trapvec::fake::knob_component(dir.path());

    let loaded: ops::Loaded = call(&socket, &Request::Load { path: object, name: None }).unwrap();
    assert_eq!(loaded.component.name, "knob");
    assert_eq!(loaded.spliced.len(), 1);
    assert_eq!((loaded.spliced[0].at.as_str(), loaded.spliced[0].action.as_str()), ("f3", "call on_f"));
    assert!(k.trapped("f3"), "the declared splice is applied with the component");

    let get = Request::Get { symbol: "knob".into(), size: None };
    assert_eq!(call::<ops::Var>(&socket, &get).unwrap(), ops::Var { symbol: "knob".into(), value: 7, size: 2 });
    let set = |v: ops::Value| Request::Set { symbol: "knob".into(), value: v, size: None };
    assert_eq!(call::<ops::Var>(&socket, &set(ops::Value::Text("-1".into()))).unwrap().value, 0xffff);
    assert_eq!(call::<ops::Var>(&socket, &get).unwrap().value, 0xffff);
    let e = call::<ops::Var>(&socket, &set(ops::Value::Number(70_000))).unwrap_err().to_string();
    assert!(e.contains("`70000` does not fit in 2 byte(s)"), "{e}");
    let e = call::<ops::Var>(&socket, &Request::Set { symbol: "knob".into(), value: ops::Value::Number(1), size: Some(4) }).unwrap_err().to_string();
    assert!(e.contains("`knob` is 2 bytes long"), "{e}");
    assert_eq!(call::<ops::Var>(&socket, &get).unwrap().value, 0xffff, "refused writes change nothing");

    // A splice of the user's own keeps the component in use.
    let user = Request::Splice(SpliceRequest { at: "f1".into(), action: Action::Call { handler: "on_f".into(), cookie: 0 }, mechanism: Mechanism::Trap });
    call::<ops::SpliceRow>(&socket, &user).unwrap();
    let e = call::<ops::Unloaded>(&socket, &Request::Unload { name: "knob".into() }).unwrap_err().to_string();
    assert_eq!(e, "trapd: component `knob` is used by the splice(s) at f1: unsplice them first");
    assert!(k.trapped("f3") && k.trapped("f1"));
    call::<ops::Unspliced>(&socket, &Request::Unsplice { at: Some("f1".into()), all: false }).unwrap();
    let u: ops::Unloaded = call(&socket, &Request::Unload { name: "knob".into() }).unwrap();
    assert_eq!(u, ops::Unloaded { name: "knob".into(), declared_removed: 1 });
    assert!(k.pristine());
}
