//! Children started while they would share the parent's memory (issue 24, items 9 and 10):
//! `system`, `popen`, `posix_spawn`/`posix_spawnp` (glibc runs their child with
//! `CLONE_VM|CLONE_VFORK`, resetting every handler, trapvec's included), `vfork`, and Python's
//! `subprocess.run` (which uses `vfork`). With a splice on `libc.so.6:execve`, `close` or `dup2`,
//! by trap and by jmp, every command runs and the program's output and exit status are those of
//! an unspliced run; a program's own SIGSEGV handler survives a `vfork` child that resets it.
//! The C program (`fixtures/spawn.c`) and the counting component are compiled at test time.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{agent, cc, count_component, python3, spec, Run};

struct Fixture {
    dir: PathBuf,
    program: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap().keep();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spawn.c");
    let program = dir.join("spawn");
    cc(&[
        "-O2",
        "-o",
        program.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    count_component(&dir);
    Fixture { dir, program }
}

/// Run `cmd`, under the agent with `spec_text` when given; the stats file is read back.
fn run(f: &Fixture, spec_text: Option<&str>, cmd: &mut Command) -> Run {
    let stats = f.dir.join("stats.json");
    let _ = std::fs::remove_file(&stats);
    if let Some(text) = spec_text {
        let spec_path = f.dir.join("spec.toml");
        std::fs::write(&spec_path, text).unwrap();
        cmd.env("LD_PRELOAD", agent())
            .env("TRAPVEC_SPEC", &spec_path)
            .env("TRAPVEC_STATS", &stats);
    }
    let out = cmd.current_dir(&f.dir).output().unwrap();
    let stats = std::fs::read_to_string(&stats)
        .ok()
        .map(|s| serde_json::from_str(&s).unwrap());
    Run {
        out,
        stats,
        pid: None,
    }
}

/// The specs of the issue: one libc function each, by each mechanism.
fn specs() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for at in ["libc.so.6:execve", "libc.so.6:close", "libc.so.6:dup2"] {
        for mech in ["trap", "jmp"] {
            v.push((format!("{at} by {mech}"), spec(&[(at, mech)])));
        }
    }
    v
}

/// `cmd()` under every spec prints what it prints unspliced and exits the same way.
fn same_as_unspliced(f: &Fixture, what: &str, cmd: impl Fn() -> Command, expect: &str) {
    let plain = run(f, None, &mut cmd());
    assert_eq!(
        plain.stdout(),
        expect,
        "{what} unspliced: {}",
        plain.stderr()
    );
    for (name, text) in specs() {
        let r = run(f, Some(&text), &mut cmd());
        assert_eq!(
            r.stdout(),
            plain.stdout(),
            "{what} with {name}: {:?}; stderr: {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(
            r.out.status.code(),
            plain.out.status.code(),
            "{what} with {name}: {:?}",
            r.out.status
        );
        assert_eq!(
            r.out.status.signal(),
            plain.out.status.signal(),
            "{what} with {name}"
        );
        let stats = r
            .stats
            .as_ref()
            .unwrap_or_else(|| panic!("{what} with {name}: no stats; stderr: {}", r.stderr()));
        assert_eq!(
            stats["splices"][0]["state"], "applied",
            "{what} with {name}"
        );
    }
}

#[test]
fn system_popen_and_posix_spawn_run_their_commands_with_libc_execve_close_or_dup2_spliced() {
    let f = fixture();
    let mode = |m: &'static str| {
        let p = f.program.clone();
        move || {
            let mut c = Command::new(&p);
            c.arg(m);
            c
        }
    };
    same_as_unspliced(
        &f,
        "system",
        mode("system"),
        "hi from system\nsystem status 0x300\nsystem(NULL) 1\n",
    );
    same_as_unspliced(
        &f,
        "popen",
        mode("popen"),
        "popen read hi from popen\npclose status 0x400\nWRITTEN THROUGH POPEN\npclose status 0x500\nfclose status 0x700\n",
    );
    same_as_unspliced(
        &f,
        "posix_spawn",
        mode("spawn"),
        "child said: stdin-eof\nspawned from-envp\nposix_spawn status 0x600 own group 1\nspawnp\nposix_spawnp status 0x700\nmissing program: No such file or directory\nSIGTRAP ignored\nstatus 0\n",
    );
}

#[test]
fn python_subprocess_run_runs_its_commands_with_libc_execve_close_or_dup2_spliced() {
    let Some(py) = python3() else { return };
    let f = fixture();
    let code = "import subprocess\n\
                r = subprocess.run(['sh', '-c', 'echo from sh; exit 6'])\n\
                print('returncode', r.returncode, flush=True)\n\
                r = subprocess.run(['sh', '-c', 'tr a-z A-Z; exit 2'], input=b'piped\\n', capture_output=True)\n\
                print(r.stdout, r.returncode)\n";
    let cmd = || {
        let mut c = Command::new(&py);
        c.args(["-c", code]);
        c
    };
    same_as_unspliced(
        &f,
        "subprocess.run",
        cmd,
        "from sh\nreturncode 6\nb'PIPED\\n' 2\n",
    );
}

#[test]
fn a_vfork_child_that_resets_sigsegv_leaves_the_parents_own_handler_in_place() {
    let f = fixture();
    // `raw-vfork-exit` makes the vfork system call itself: its child shares the memory.
    for mode in ["vfork-exec", "vfork-exit", "raw-vfork-exit"] {
        let status = if mode == "vfork-exec" {
            "0x800"
        } else {
            "0x900"
        };
        let expect = format!("vfork child status {status}\nown SIGSEGV handler ran\n");
        let plain = run(&f, None, Command::new(&f.program).arg(mode));
        assert_eq!(plain.stdout(), expect, "{mode} unspliced");
        for mech in ["trap", "jmp"] {
            let r = run(
                &f,
                Some(&spec(&[("libc.so.6:close", mech)])),
                Command::new(&f.program).arg(mode),
            );
            assert_eq!(
                r.stdout(),
                expect,
                "{mode} by {mech}: {:?}; stderr: {}",
                r.out.status,
                r.stderr()
            );
            assert_eq!(
                r.out.status.code(),
                Some(0),
                "{mode} by {mech}: {:?}",
                r.out.status
            );
        }
    }
}

#[test]
fn python_faulthandler_still_reports_a_fault_after_subprocess_run() {
    let Some(py) = python3() else { return };
    let f = fixture();
    // The vfork child of _posixsubprocess resets every handled signal, faulthandler's SIGSEGV
    // handler included, through the interposed sigaction.
    let code = "import subprocess, ctypes\n\
                print('returncode', subprocess.run(['true']).returncode, flush=True)\n\
                ctypes.string_at(0)\n";
    for mech in ["trap", "jmp"] {
        let r = run(
            &f,
            Some(&spec(&[("libc.so.6:close", mech)])),
            Command::new(&py).args(["-X", "faulthandler", "-c", code]),
        );
        assert_eq!(r.stdout(), "returncode 0\n", "{mech}: {}", r.stderr());
        assert_eq!(
            r.out.status.signal(),
            Some(libc::SIGSEGV),
            "{mech}: {:?}",
            r.out.status
        );
        assert!(
            r.stderr()
                .contains("Fatal Python error: Segmentation fault"),
            "{mech}: faulthandler did not run: {}",
            r.stderr()
        );
    }
}

#[test]
fn a_splice_on_glibcs_posix_spawn_is_warned_about_and_the_agents_own_counts_the_calls() {
    let f = fixture();
    let glibc = run(
        &f,
        Some(&spec(&[("libc.so.6:posix_spawn", "trap")])),
        Command::new(&f.program).arg("spawn"),
    );
    assert!(glibc.out.status.success(), "{}", glibc.stderr());
    assert!(
        glibc.stderr().contains("trapvec: warning: libc.so.6:posix_spawn: the agent runs `posix_spawn` itself (its children must not share spliced memory), so the program's calls do not reach glibc's; splice `libtrapvec_agent:posix_spawn` to see them"),
        "{}",
        glibc.stderr()
    );
    for mech in ["trap", "jmp"] {
        let r = run(
            &f,
            Some(&spec(&[
                ("libtrapvec_agent:posix_spawn", mech),
                ("libtrapvec_agent:posix_spawnp", mech),
            ])),
            Command::new(&f.program).arg("spawn"),
        );
        assert!(r.out.status.success(), "{mech}: {}", r.stderr());
        assert!(!r.stderr().contains("warning"), "{mech}: {}", r.stderr());
        let stats = r.stats.as_ref().expect("stats");
        // posix_spawn of /bin/sh twice and of the missing program; posix_spawnp of sh.
        assert_eq!(
            (
                stats["splices"][0]["hits"].as_u64(),
                stats["splices"][1]["hits"].as_u64()
            ),
            (Some(3), Some(1)),
            "{mech}: {stats}"
        );
    }
}
