//! The agent in programs that do what real programs do: block every signal in worker threads,
//! install their own SIGSEGV and SIGTRAP handlers after the agent, raise SIGTRAP, leave through
//! `_exit`, exec and fork; plus `python3 -X faulthandler`, `sh` and a spliced `malloc`.
//! The C program (`fixtures/program.c`) and the counting component (`fixtures/count.c`) are
//! compiled at test time.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{agent, cc, count_component, python3, spec, Run};

struct Fixture {
    dir: PathBuf,
    program: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let program = dir.join("program");
    cc(&[
        "-O2",
        "-pthread",
        "-o",
        program.to_str().unwrap(),
        src.join("program.c").to_str().unwrap(),
    ]);
    count_component(&dir);
    Fixture { dir, program }
}

impl Run {
    /// Hits of the spec's `i`-th splice in the stats file.
    fn hits(&self, i: usize) -> u64 {
        let stats = self
            .stats
            .as_ref()
            .unwrap_or_else(|| panic!("no stats written; stderr: {}", self.stderr()));
        stats["splices"][i]["hits"].as_u64().unwrap()
    }
}

/// Run `cmd` with the agent, `spec` and `TRAPVEC_STATS` (with `extra` environment); read the
/// stats file the process wrote (the template's `%p` is the process's pid).
fn run_with(
    f: &Fixture,
    spec_text: &str,
    cmd: &mut Command,
    stats_template: &str,
    extra: &[(&str, &str)],
) -> Run {
    let spec_path = f.dir.join("spec.toml");
    std::fs::write(&spec_path, spec_text).unwrap();
    let template = f.dir.join(stats_template);
    for e in std::fs::read_dir(&f.dir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("stats")
        {
            std::fs::remove_file(p).unwrap();
        }
    }
    cmd.env("LD_PRELOAD", agent())
        .env("TRAPVEC_SPEC", &spec_path)
        .env("TRAPVEC_STATS", &template)
        .env("AGENT_PATH", agent());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let path = PathBuf::from(template.to_str().unwrap().replace("%p", &pid.to_string()));
    let stats = std::fs::read_to_string(&path)
        .ok()
        .map(|s| serde_json::from_str(&s).unwrap());
    Run {
        out,
        stats,
        pid: None,
    }
}

fn run(f: &Fixture, spec_text: &str, args: &[&str]) -> Run {
    run_with(
        f,
        spec_text,
        Command::new(&f.program).args(args),
        "stats.json",
        &[],
    )
}

fn work(mech: &str) -> String {
    spec(&[("work", mech)])
}

#[test]
fn workers_that_block_every_signal_count_exactly_when_spliced_by_trap() {
    let f = fixture();
    for mech in ["trap", "jmp"] {
        let r = run(&f, &work(mech), &["threads"]);
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        // 5 workers x sum(3i+1, i<1000); the program sees SIGSEGV blocked when it asked for it.
        assert_eq!(
            r.stdout(),
            "sum 7497500 view blocked 1 unblocked 1\n",
            "{mech}"
        );
        assert_eq!(r.hits(0), 5000, "{mech}");
    }
}

#[test]
fn a_sigsegv_handler_installed_after_the_agent_recovers_real_faults_and_splices_still_count() {
    let f = fixture();
    let three = "recovered 1 faults 1\nrecovered 2 faults 2\nrecovered 3 faults 3\n";
    for (how, query) in [("siginfo", "siginfo"), ("plain", "plain")] {
        let r = run(&f, &work("trap"), &["segv", how]);
        assert!(
            r.out.status.success(),
            "{how}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(r.stdout(), format!("query {query}\n{three}"), "{how}");
        assert_eq!(r.hits(0), 300, "{how}");
    }
}

#[test]
fn sa_resethand_and_no_handler_give_the_default_sigsegv_death() {
    let f = fixture();
    let r = run(&f, &work("trap"), &["segv", "resethand"]);
    assert_eq!(r.out.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr());
    assert_eq!(r.stdout(), "query siginfo\nrecovered 1 faults 1\n");
    let r = run(&f, &work("trap"), &["segv", "none"]);
    assert_eq!(r.out.status.signal(), Some(libc::SIGSEGV), "{}", r.stderr());
    assert_eq!(r.stdout(), "query default\n");
}

#[test]
fn a_programs_own_sigtrap_kills_it_without_a_handler_and_reaches_its_handler_with_one() {
    let f = fixture();
    for how in ["raise", "int3"] {
        let r = run(&f, &work("trap"), &["trap", how]);
        assert_eq!(
            r.out.status.signal(),
            Some(libc::SIGTRAP),
            "{how}: {:?} {}",
            r.out.status,
            r.stderr()
        );
    }
    let r = run(&f, &work("trap"), &["trap", "handler"]);
    assert!(r.out.status.success(), "{:?} {}", r.out.status, r.stderr());
    assert_eq!(r.stdout(), "handled 2\n");
    assert_eq!(r.hits(0), 100);
}

#[test]
fn a_program_that_uses_the_scan_signal_gets_it_and_trapvec_signal_moves_trapvecs() {
    let f = fixture();
    for moved in [None, Some("SIGUSR2")] {
        let extra: Vec<(&str, &str)> = moved.map(|s| ("TRAPVEC_SIGNAL", s)).into_iter().collect();
        let r = run_with(
            &f,
            &work("trap"),
            Command::new(&f.program).args(["rt"]),
            "stats.json",
            &extra,
        );
        assert!(
            r.out.status.success(),
            "{moved:?}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(
            r.stdout(),
            "rt 2\n",
            "{moved:?}: raise and sigqueue both reach the program's handler"
        );
        assert_eq!(r.hits(0), 100, "{moved:?}");
    }
}

#[test]
fn stats_are_written_at_exit_underscore_exit_and_before_exec_with_pid_in_the_path() {
    let f = fixture();
    for (how, code) in [("_exit", 3), ("_Exit", 4)] {
        let r = run_with(
            &f,
            &work("trap"),
            Command::new(&f.program).args(["children", how]),
            "stats-%p.json",
            &[],
        );
        assert_eq!(r.out.status.code(), Some(code), "{how}: {}", r.stderr());
        assert_eq!(r.hits(0), 7, "{how}");
    }
    for how in ["execl", "execve"] {
        let r = run(&f, &work("trap"), &["children", how]);
        assert!(r.out.status.success(), "{how}: {}", r.stderr());
        assert_eq!(r.hits(0), 7, "{how}: stats written before exec");
        // The exec'd shell inherits neither the spec nor the agent.
        assert_eq!(r.stdout(), "spec=[] preload=[]\n", "{how}");
    }
}

#[test]
fn exec_children_inherit_the_spec_only_with_trapvec_inherit() {
    let f = fixture();
    let spec_path = f.dir.join("spec.toml");
    // A spec the shell can apply too (it has no `work`): libc's getpid.
    let spec_text = spec(&[("getpid", "trap")]);
    let r = run_with(
        &f,
        &spec_text,
        Command::new(&f.program).args(["children", "execl"]),
        "stats-%p.json",
        &[("TRAPVEC_INHERIT", "1")],
    );
    assert!(r.out.status.success(), "{}", r.stderr());
    assert_eq!(
        r.stdout(),
        format!(
            "spec=[{}] preload=[{}]\n",
            spec_path.display(),
            agent().display()
        )
    );
}

#[test]
fn sh_leaving_through_underscore_exit_writes_stats() {
    let f = fixture();
    // dash leaves with _exit; getpid is libc's, called by the shell at start ($$).
    let r = run_with(
        &f,
        &spec(&[("getpid", "trap")]),
        Command::new("/bin/sh").args(["-c", "echo $$; exit 5"]),
        "stats-%p.json",
        &[],
    );
    assert_eq!(r.out.status.code(), Some(5), "{}", r.stderr());
    assert!(r.hits(0) >= 1, "{:?}", r.stats);
}

#[test]
fn a_fork_child_keeps_its_splices_and_counts_apart_from_its_parent() {
    let f = fixture();
    for mech in ["trap", "jmp"] {
        let spec_text = work(mech);
        let r = run_with(
            &f,
            &spec_text,
            Command::new(&f.program).args(["children", "fork"]),
            "stats-%p.json",
            &[],
        );
        assert!(r.out.status.success(), "{mech}: {}", r.stderr());
        // child: sum(3i+1, i<5) = 35; parent: sum(3i+1, i<10) = 145.
        assert_eq!(r.stdout(), "child 35\nparent 145 child exit 0\n", "{mech}");
        assert_eq!(r.hits(0), 7 + 10, "{mech}: the parent's own calls");
        let child: Vec<serde_json::Value> = std::fs::read_dir(&f.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("stats-")
            })
            .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
            .filter(|v: &serde_json::Value| v["splices"][0]["hits"] != 17)
            .collect();
        assert_eq!(child.len(), 1, "{mech}: one child stats file");
        assert_eq!(
            child[0]["splices"][0]["hits"],
            7 + 5,
            "{mech}: the child's count starts from the parent's at the fork"
        );
    }
}

#[test]
fn malloc_spliced_by_trap_and_by_jmp_counts_every_call() {
    let f = fixture();
    for mech in ["trap", "jmp"] {
        let spec_text = spec(&[("malloc", mech)]);
        let base = run(&f, &spec_text, &["malloc", "0"]);
        assert!(
            base.out.status.success(),
            "{mech}: {:?} {}",
            base.out.status,
            base.stderr()
        );
        let r = run(&f, &spec_text, &["malloc", "1000"]);
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(r.stdout(), "start\nmallocs 1000 odd 500\n", "{mech}");
        assert_eq!(r.hits(0) - base.hits(0), 1000, "{mech}");
    }
}

#[test]
fn python_with_faulthandler_keeps_running_with_a_spliced_libc_function() {
    let Some(py) = python3() else { return };
    let f = fixture();
    let code = |n: u32| {
        format!("import os, faulthandler; assert faulthandler.is_enabled(); print('ok', sum(os.getpid() > 0 for _ in range({n})))")
    };
    for mech in ["trap", "jmp"] {
        let spec_text = spec(&[("getpid", mech)]);
        let base = run_with(
            &f,
            &spec_text,
            Command::new(&py).args(["-X", "faulthandler", "-c", &code(0)]),
            "stats.json",
            &[],
        );
        assert!(
            base.out.status.success(),
            "{mech}: {:?} {}",
            base.out.status,
            base.stderr()
        );
        let r = run_with(
            &f,
            &spec_text,
            Command::new(&py).args(["-X", "faulthandler", "-c", &code(1000)]),
            "stats.json",
            &[],
        );
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(r.stdout(), "ok 1000\n", "{mech}");
        assert_eq!(r.hits(0) - base.hits(0), 1000, "{mech}");
    }
}

#[test]
fn a_bad_trapvec_signal_is_refused_before_main() {
    let f = fixture();
    let r = run_with(
        &f,
        &work("trap"),
        Command::new(&f.program).args(["threads"]),
        "stats.json",
        &[("TRAPVEC_SIGNAL", "SIGSEGV")],
    );
    assert_eq!(r.out.status.code(), Some(86), "{}", r.stderr());
    assert!(
        r.stderr().contains("TRAPVEC_SIGNAL=SIGSEGV"),
        "{}",
        r.stderr()
    );
    let r = run_with(
        &f,
        &work("trap"),
        Command::new(&f.program).args(["threads"]),
        "stats.json",
        &[("TRAPVEC_SIGNAL", "SIGRTMIN+2")],
    );
    assert!(r.out.status.success(), "{}", r.stderr());
    assert_eq!(r.hits(0), 5000);
}
