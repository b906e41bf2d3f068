//! Deferred splices in a program that puts itself under a seccomp filter after start (issue 24,
//! item 12): the filter (`fixtures/seccomp.c`) kills the process on `membarrier`, which a batch
//! of text writes makes and `dlopen` does not. The batch at the `dlopen` is refused with the
//! reason on stderr and in the stats instead of dying of SIGSYS; a splice applied before the
//! filter is left in place at the `dlclose` (the library stays loaded) for the same reason.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

mod common;
use common::{agent, cc, count_component, spec, Run};

#[test]
fn a_deferred_batch_under_a_seccomp_filter_entered_after_start_is_refused_instead_of_dying_of_sigsys(
) {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let d = |f: &str| dir.join(f).to_str().unwrap().to_string();
    cc(&[
        "-O2",
        "-o",
        &d("seccomp"),
        src.join("seccomp.c").to_str().unwrap(),
    ]);
    cc(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-Wl,-soname,libdltest.so.1",
        "-o",
        &d("libdltest.so.1"),
        src.join("dlib.c").to_str().unwrap(),
    ]);
    count_component(&dir);
    let spec_path = dir.join("spec.toml");
    std::fs::write(&spec_path, spec(&[("libdltest.so.1:lib_work", "trap")])).unwrap();
    let run = |mode: &str| {
        let stats = dir.join("stats.json");
        let _ = std::fs::remove_file(&stats);
        let out = Command::new(d("seccomp"))
            .args([&d("libdltest.so.1"), "100", mode])
            .env("LD_PRELOAD", agent())
            .env("TRAPVEC_SPEC", &spec_path)
            .env("TRAPVEC_STATS", &stats)
            .output()
            .unwrap();
        let stats = std::fs::read_to_string(&stats)
            .ok()
            .map(|s| serde_json::from_str::<serde_json::Value>(&s).unwrap());
        Run {
            out,
            stats,
            pid: None,
        }
    };
    let sum = "sum 14950\n"; // sum(3i+1, i<100)
    let why =
        "the process runs under a seccomp filter it entered after trapvec started (Seccomp: 2";

    // Without a filter the deferred splice is applied at the dlopen and counts every call.
    let r = run("none");
    assert_eq!(
        (r.out.status.code(), r.stdout()),
        (Some(0), sum.to_string()),
        "{}",
        r.stderr()
    );
    let s = &r.stats.as_ref().expect("stats")["splices"][0];
    assert_eq!(
        (s["state"].as_str(), s["hits"].as_u64()),
        (Some("removed"), Some(100)),
        "{s}"
    );

    // Filter first: the batch is refused, named on stderr and in the stats; the program runs on.
    let r = run("filter");
    assert_eq!(
        r.out.status.signal(),
        None,
        "killed: {:?}; stderr: {}",
        r.out.status,
        r.stderr()
    );
    assert_eq!(
        (r.out.status.code(), r.stdout()),
        (Some(0), sum.to_string()),
        "{}",
        r.stderr()
    );
    assert!(
        r.stderr().contains(&format!("trapvec: after dlopen({}): cannot apply the deferred splices libdltest.so.1:lib_work: {why}", d("libdltest.so.1"))),
        "{}",
        r.stderr()
    );
    assert!(
        r.stderr()
            .contains("so the batch is refused; the program goes on without them"),
        "{}",
        r.stderr()
    );
    let s = &r.stats.as_ref().expect("stats")["splices"][0];
    assert_eq!(
        (s["state"].as_str(), s["hits"].as_u64()),
        (Some("failed"), Some(0)),
        "{s}"
    );
    assert!(s["error"].as_str().unwrap().starts_with(why), "{s}");

    // Filter after the calls: the splice stays (and so does the library) instead of a removal.
    let r = run("filter-late");
    assert_eq!(
        (r.out.status.code(), r.stdout()),
        (Some(0), sum.to_string()),
        "{:?} {}",
        r.out.status,
        r.stderr()
    );
    assert!(
        r.stderr().contains(&format!(
            "trapvec: dlclose: the deferred splices of the library are not removed: {why}"
        )),
        "{}",
        r.stderr()
    );
    assert!(
        r.stderr().trim_end().ends_with("it stays loaded"),
        "{}",
        r.stderr()
    );
    let s = &r.stats.as_ref().expect("stats")["splices"][0];
    assert_eq!(
        (s["state"].as_str(), s["hits"].as_u64()),
        (Some("applied"), Some(100)),
        "{s}"
    );
}
