//! The LD_PRELOAD agent against a real, unmodified, dynamically linked program: the demo's
//! `program.c` and `policy.c`, compiled at test time.

use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::{agent, cc, repo};

struct Demo {
    dir: PathBuf,
    program: PathBuf,
}

fn demo() -> Demo {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = repo().join("components/demo");
    let program = dir.join("program");
    cc(&[
        "-O2",
        "-o",
        program.to_str().unwrap(),
        src.join("program.c").to_str().unwrap(),
    ]);
    let inc = repo().join("components/include");
    let policy = dir.join("spec-dir/policy.o");
    std::fs::create_dir_all(policy.parent().unwrap()).unwrap();
    cc(&[
        "-c",
        "-O2",
        "-fPIC",
        "-I",
        inc.to_str().unwrap(),
        "-o",
        policy.to_str().unwrap(),
        src.join("policy.c").to_str().unwrap(),
    ]);
    Demo { dir, program }
}

fn run(d: &Demo, spec: &str) -> (Output, Option<serde_json::Value>) {
    let spec_path = d.dir.join("spec-dir/spec.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let stats = d.dir.join("stats.json");
    let _ = std::fs::remove_file(&stats);
    // Run from another directory: component paths are relative to the spec file.
    let out = Command::new(&d.program)
        .current_dir("/")
        .env("LD_PRELOAD", agent())
        .env("TRAPVEC_SPEC", &spec_path)
        .env("TRAPVEC_STATS", &stats)
        .output()
        .unwrap();
    let json = std::fs::read_to_string(&stats)
        .ok()
        .map(|s| serde_json::from_str(&s).unwrap());
    (out, json)
}

const UNPATCHED: &str = "  sync_mss(1500) = 1448\n  sync_mss(9000) = 8948\n  sync_mss(65536) = 65484\n  sum of compute(0..999) = 1499500\n";

fn spec(compute_mech: &str, mss_mech: &str) -> String {
    format!(
        r#"
[[component]]
path = "policy.o"

[[splice]]
at = "compute+0"
action = "call"
handler = "count_compute"
mechanism = "{compute_mech}"

[[splice]]
at = "sync_mss"
action = "replace"
handler = "clamped_sync_mss"
mechanism = "{mss_mech}"
"#
    )
}

#[test]
fn program_runs_unpatched_without_a_spec() {
    let d = demo();
    let out = Command::new(&d.program)
        .env("LD_PRELOAD", agent())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), UNPATCHED);
}

#[test]
fn agent_applies_the_spec_before_main_and_writes_exact_hit_counts() {
    let d = demo();
    for (cm, mm) in [
        ("trap", "trap"),
        ("jmp", "jmp"),
        ("trap", "jmp"),
        ("jmp", "trap"),
    ] {
        let (out, stats) = run(&d, &spec(cm, mm));
        assert!(
            out.status.success(),
            "{cm}/{mm}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        // compute() is unchanged by a call splice; sync_mss sees the MTU clamped to 1000.
        assert_eq!(
            stdout,
            "  sync_mss(1500) = 948\n  sync_mss(9000) = 948\n  sync_mss(65536) = 948\n  sum of compute(0..999) = 1499500\n",
            "{cm}/{mm}"
        );
        let stats = stats.expect("stats written");
        assert_eq!(
            stats,
            serde_json::json!({"splices": [
                {"at": "compute+0", "mechanism": cm, "hits": 1000, "state": "applied"},
                {"at": "sync_mss", "mechanism": mm, "hits": 3, "state": "applied"},
            ]}),
            "{cm}/{mm}"
        );
    }
}

#[test]
fn a_spec_component_brings_the_splices_it_declares_listed_after_the_specs_own() {
    let d = demo();
    let inc = repo().join("components/include");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/declaring.c");
    let obj = d.dir.join("spec-dir/declaring.o");
    cc(&[
        "-c",
        "-O2",
        "-fPIC",
        "-I",
        inc.to_str().unwrap(),
        "-o",
        obj.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let spec = "[[component]]\npath = \"declaring.o\"\n\n[[splice]]\nat = \"sync_mss\"\naction = \"count\"\n";
    let (out, stats) = run(&d, spec);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        UNPATCHED,
        "counting changes no result"
    );
    assert_eq!(
        stats.expect("stats written"),
        serde_json::json!({"splices": [
            {"at": "sync_mss", "mechanism": "trap", "hits": 3, "state": "applied"},
            {"at": "compute+0", "mechanism": "jmp", "hits": 1000, "state": "applied"},
        ]})
    );
}

#[test]
fn a_spec_that_cannot_be_applied_exits_86_before_main_with_the_reason() {
    let d = demo();
    let cases = [
        (
            spec("trap", "jmp").replace("count_compute", "no_such_handler"),
            "no_such_handler",
        ),
        (
            spec("trap", "jmp").replace("compute+0", "compute+1"),
            "not an instruction boundary",
        ),
        (
            spec("trap", "jmp").replace("policy.o", "missing.o"),
            "missing.o",
        ),
        (
            spec("trap", "jmp").replace("sync_mss\"\naction", "no_such_function\"\naction"),
            "no_such_function",
        ),
        (
            spec("trap", "jmp").replace("mechanism = \"jmp\"", "mechanism = \"teleport\""),
            "teleport",
        ),
    ];
    for (text, needle) in cases {
        let (out, stats) = run(&d, &text);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(86), "{needle}: {stderr}");
        assert!(stderr.contains(needle), "stderr lacks {needle:?}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "main ran: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(stats.is_none(), "no stats for a failed spec");
    }
}

/// Run the demo program with the agent and `spec` in a new PID namespace whose `vm.memfd_noexec` is
/// `level` (the sysctl is per PID namespace); `None` when the namespace cannot be made here.
fn demo_under_memfd_noexec(d: &Demo, level: u32, spec: &str) -> Option<Output> {
    let spec_path = d.dir.join("spec-dir/nx.toml");
    std::fs::write(&spec_path, spec).unwrap();
    // The agent goes to the program only (unshare and sh would apply the spec themselves).
    let script = format!(
        "echo {level} > /proc/sys/vm/memfd_noexec || exit 99; LD_PRELOAD={} TRAPVEC_SPEC={} exec {}",
        agent().display(),
        spec_path.display(),
        d.program.display()
    );
    let out = Command::new("unshare")
        .args(["-pf", "--mount-proc", "sh", "-c", &script])
        .output()
        .ok()?;
    let sh_failed =
        out.status.code() == Some(99) || String::from_utf8_lossy(&out.stderr).contains("unshare:");
    (!sh_failed).then_some(out)
}

#[test]
fn memfd_noexec_1_is_met_with_mfd_exec_and_2_is_refused_before_main_with_the_errno() {
    let d = demo();
    let spec = spec("trap", "jmp");
    let spec = spec.as_str();
    let Some(ok) = demo_under_memfd_noexec(&d, 1, spec) else {
        eprintln!("skipped: cannot make a PID namespace with its own vm.memfd_noexec here (needs root and Linux >= 6.3)");
        return;
    };
    assert!(
        ok.status.success(),
        "memfd_noexec=1: {:?} {}",
        ok.status,
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "  sync_mss(1500) = 948\n  sync_mss(9000) = 948\n  sync_mss(65536) = 948\n  sum of compute(0..999) = 1499500\n");
    let refused = demo_under_memfd_noexec(&d, 2, spec).unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(86), "{stderr}");
    assert!(
        stderr.contains("memfd_create(MFD_EXEC)")
            && stderr.contains("os error 13")
            && stderr.contains("vm.memfd_noexec=2"),
        "{stderr}"
    );
}
