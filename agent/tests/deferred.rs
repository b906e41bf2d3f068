//! Deferred points: splices in libraries that the program loads later with `dlopen`, applied at
//! the load, removed before the `dlclose` that unmaps them, applied again at the next load.
//! The program (`fixtures/dlprog.c`), its libraries (`fixtures/dlib.c`) and the counting
//! component (`fixtures/count.c`) are compiled at test time.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{agent, cc, count_component, spec, Run};

struct Fixture {
    dir: PathBuf,
    program: PathBuf,
    /// `libdltest.so.1`, the library dlprog loads and unloads.
    lib: PathBuf,
    /// `libouter.so`, which needs `libinner.so` (found through its RUNPATH).
    outer: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let s = |f: &str| src.join(f).to_str().unwrap().to_string();
    let d = |f: &str| dir.join(f).to_str().unwrap().to_string();
    cc(&[
        "-O2",
        "-pthread",
        "-o",
        &d("dlprog"),
        &s("dlprog.c"),
        "-ldl",
    ]);
    count_component(&dir);
    cc(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-Wl,-soname,libdltest.so.1",
        "-o",
        &d("libdltest.so.1"),
        &s("dlib.c"),
    ]);
    cc(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-DINNER",
        "-o",
        &d("libinner.so"),
        &s("dlib.c"),
    ]);
    let runpath = format!("-Wl,-rpath,{}", dir.display());
    cc(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-DOUTER",
        "-o",
        &d("libouter.so"),
        &s("dlib.c"),
        "-L",
        dir.to_str().unwrap(),
        "-linner",
        &runpath,
    ]);
    Fixture {
        program: dir.join("dlprog"),
        lib: dir.join("libdltest.so.1"),
        outer: dir.join("libouter.so"),
        dir,
    }
}

impl Run {
    fn splice(&self, i: usize) -> &serde_json::Value {
        let stats = self
            .stats
            .as_ref()
            .unwrap_or_else(|| panic!("no stats written; stderr: {}", self.stderr()));
        &stats["splices"][i]
    }
}

fn run(f: &Fixture, spec_text: &str, args: &[&str]) -> Run {
    let spec_path = f.dir.join("spec.toml");
    std::fs::write(&spec_path, spec_text).unwrap();
    let stats = f.dir.join("stats.json");
    let _ = std::fs::remove_file(&stats);
    let out = Command::new(&f.program)
        .args(args)
        .env("LD_PRELOAD", agent())
        .env("TRAPVEC_SPEC", &spec_path)
        .env("TRAPVEC_STATS", &stats)
        .output()
        .unwrap();
    let stats = std::fs::read_to_string(&stats)
        .ok()
        .map(|s| serde_json::from_str(&s).unwrap());
    Run {
        out,
        stats,
        pid: None,
    }
}

/// sum(3i+1, i<n)
fn lib_sum(n: i64) -> i64 {
    (0..n).map(|i| 3 * i + 1).sum()
}

#[test]
fn a_splice_in_a_library_loaded_later_counts_each_load_and_is_removed_at_dlclose() {
    let f = fixture();
    let lib = f.lib.to_str().unwrap();
    // By soname, by file name's start and by path; trap and jmp.
    for object in ["libdltest.so.1", "libdltest", lib] {
        for mech in ["trap", "jmp"] {
            let text = spec(&[
                (&format!("{object}:lib_work"), mech),
                ("libnever.so.9:nothing", mech),
            ]);
            let r = run(&f, &text, &[lib, "300", "200"]);
            assert!(
                r.out.status.success(),
                "{object}/{mech}: {:?} {}",
                r.out.status,
                r.stderr()
            );
            // The library was unmapped by the first dlclose: nothing held it.
            assert_eq!(
                r.stdout(),
                format!(
                    "first {} second {} unmapped 1\n",
                    lib_sum(300),
                    lib_sum(200)
                ),
                "{object}/{mech}"
            );
            let s = r.splice(0);
            assert_eq!(s["hits"], 500, "{object}/{mech}: {s}");
            assert_eq!(s["state"], "removed", "{object}/{mech}: {s}");
            assert_eq!(s["loads"], 2, "{object}/{mech}: {s}");
            assert_eq!(s["mechanism"], mech);
            let never = r.splice(1);
            assert_eq!(
                never,
                &serde_json::json!({"at": "libnever.so.9:nothing", "mechanism": mech, "hits": 0, "state": "pending", "loads": 0})
            );
            assert!(r.stderr().is_empty(), "{object}/{mech}: {}", r.stderr());
        }
    }
}

#[test]
fn dlclose_while_other_threads_run_spliced_code_keeps_every_count_exact() {
    let f = fixture();
    let lib = f.lib.to_str().unwrap();
    for mech in ["trap", "jmp"] {
        let text = spec(&[("work", mech), ("libdltest.so.1:lib_work", mech)]);
        let r = run(&f, &text, &[lib, "1000", "700", "4"]);
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(
            r.stdout(),
            format!(
                "first {} second {} unmapped 1\n",
                lib_sum(1000),
                lib_sum(700)
            ),
            "{mech}"
        );
        let made: u64 = r
            .stderr()
            .trim()
            .strip_prefix("worker calls ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{}", r.stderr()));
        assert!(made > 0, "{mech}: the workers ran");
        assert_eq!(
            r.splice(0)["hits"],
            made,
            "{mech}: the program's own work()"
        );
        assert_eq!(r.splice(0)["state"], "applied");
        // 1000 + 700, then 20 rounds of 10 calls, each round a load and an unload.
        assert_eq!(r.splice(1)["hits"], 1000 + 700 + 200, "{mech}");
        assert_eq!(r.splice(1)["loads"], 22, "{mech}");
        assert_eq!(r.splice(1)["state"], "removed", "{mech}");
    }
}

#[test]
fn a_library_loaded_as_a_dependency_of_a_dlopen_gets_its_splices_and_loses_them_at_the_unload() {
    let f = fixture();
    let outer = f.outer.to_str().unwrap();
    for mech in ["trap", "jmp"] {
        let r = run(
            &f,
            &spec(&[("libinner.so:inner_work", mech)]),
            &["outer", outer, "400"],
        );
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        // sum(2i+1+1, i<400); libinner went with libouter.
        assert_eq!(
            r.stdout(),
            format!(
                "outer {} mapped 0\n",
                (0..400).map(|i| 2 * i + 2).sum::<i64>()
            ),
            "{mech}"
        );
        assert_eq!(r.splice(0)["hits"], 400, "{mech}");
        assert_eq!(r.splice(0)["state"], "removed", "{mech}");
        assert_eq!(r.splice(0)["loads"], 1, "{mech}");
    }
}

#[test]
fn a_deferred_splice_that_cannot_be_applied_is_reported_and_the_program_goes_on_without_it() {
    let f = fixture();
    let lib = f.lib.to_str().unwrap();
    let text = spec(&[
        ("work", "trap"),
        ("libdltest.so.1:no_such_function", "trap"),
    ]);
    let r = run(&f, &text, &[lib, "30", "20"]);
    assert!(r.out.status.success(), "{:?} {}", r.out.status, r.stderr());
    assert_eq!(
        r.stdout(),
        format!("first {} second {} unmapped 1\n", lib_sum(30), lib_sum(20))
    );
    assert!(
        r.stderr()
            .contains("cannot apply the deferred splices libdltest.so.1:no_such_function"),
        "{}",
        r.stderr()
    );
    assert!(r.stderr().contains("no_such_function"), "{}", r.stderr());
    let s = r.splice(1);
    assert_eq!(s["state"], "failed", "{s}");
    assert_eq!(s["hits"], 0);
    assert!(
        s["error"].as_str().unwrap().contains("no_such_function"),
        "{s}"
    );
    // Reported once: a failed splice is not tried again at the second load.
    assert_eq!(
        r.stderr().matches("cannot apply").count(),
        1,
        "{}",
        r.stderr()
    );
}

#[test]
fn a_malformed_deferred_point_still_exits_86_before_main() {
    let f = fixture();
    let lib = f.lib.to_str().unwrap();
    let cases = [
        (
            spec(&[("libdltest.so.1:lib_work", "trap")])
                .replace("\"count\"", "\"no_such_handler\""),
            "no_such_handler",
        ),
        (spec(&[("libdltest.so.1:lib_work+x", "trap")]), "lib_work+x"),
        (spec(&[("libdltest.so.1:lib_work", "teleport")]), "teleport"),
    ];
    for (text, needle) in cases {
        let r = run(&f, &text, &[lib, "3", "2"]);
        assert_eq!(r.out.status.code(), Some(86), "{needle}: {}", r.stderr());
        assert!(
            r.stderr().contains(needle),
            "stderr lacks {needle:?}: {}",
            r.stderr()
        );
        assert!(r.out.stdout.is_empty(), "main ran");
    }
}
