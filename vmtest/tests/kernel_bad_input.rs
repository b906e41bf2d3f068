//! Bad input against the real kernel (`vmtest/scenarios/kernel_bad_input.sh`): each is refused
//! with a one-line error naming the culprit and the kernel is unchanged (the function's bytes,
//! entry text, trapctl's list). Also: all-or-nothing and --best-effort batches, the state kept in
//! the module between trapctl commands, the lock that serializes them, and a component's own
//! declared splice, applied by `load` and removed by `unload`.

use std::path::{Path, PathBuf};
use std::process::Command;

use vmtest::testing::{can_boot, repo_root, Scenario};

/// Compiles `source` as `<dir>/<name>.o` for the kernel's code model (no PIC, no red zone, no
/// stack protector), with the components' header on the include path.
fn kernel_component(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let obj = dir.join(format!("{name}.o"));
    let out = Command::new("cc")
        .args([
            "-c",
            "-O2",
            "-ffreestanding",
            "-fno-pic",
            "-mcmodel=kernel",
            "-mno-red-zone",
            "-fno-stack-protector",
        ])
        .args(["-fno-asynchronous-unwind-tables", "-I"])
        .arg(repo_root().join("components/include"))
        .arg("-o")
        .arg(&obj)
        .arg(&src)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc {name}.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    obj
}

/// A component calling a function no kernel has.
fn unresolved_component(dir: &Path) -> PathBuf {
    kernel_component(
        dir,
        "unresolved",
        "extern int trapvec_no_such_kernel_function(int);\n\
         int calls_nothing(int x) { return trapvec_no_such_kernel_function(x) + 1; }\n",
    )
}

/// A component with an empty `call` handler and a declared splice of `__x64_sys_getppid` (its
/// first instruction past the entry: +5 on 6.1, +9 on 6.12).
fn declared_component(dir: &Path) -> PathBuf {
    kernel_component(
        dir,
        "declared",
        "#include <trapvec.h>\n\
         void declared_handler(struct trapvec_regs *regs, void *cookie);\n\
         void declared_handler(struct trapvec_regs *regs, void *cookie) { (void)regs; (void)cookie; }\n\
         TRAPVEC_SPLICE_CALL(getppid, \"__x64_sys_getppid\", declared_handler, \"trap\");\n",
    )
}

#[test]
fn bad_input_is_refused_clearly_and_leaves_the_kernel_unchanged() {
    if !can_boot("kernel scenario") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let obj = unresolved_component(dir.path());
    let declared = declared_component(dir.path());
    let run = Scenario::named("kernel_bad_input.sh")
        .file(&obj)
        .file(&declared)
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();

    let err = |key: &str, words: &[&str]| {
        let msg = run.expect(key);
        assert!(
            msg.starts_with("trapctl: "),
            "{key}: one trapctl error line, got `{msg}`"
        );
        for w in words {
            assert!(msg.contains(w), "{key}: `{msg}` lacks `{w}`");
        }
    };
    err("ERR_NONROOT", &["/dev/trapvec", "Permission denied"]);
    err("ERR_NONROOT_LIST", &["Permission denied"]);
    // The first offset past the entry inside an instruction (tcp_sync_mss+7, inside `mov rdx,
    // rdi`, on 6.1): the refusal names the point and the instruction it falls in.
    let inside = run.expect("BOUNDARY_POINT");
    let insn = run.expect("BOUNDARY_INSN");
    assert!(
        inside.starts_with("tcp_sync_mss+") && !insn.is_empty(),
        "apply --check found an offset inside an instruction (`{inside}` in `{insn}`)"
    );
    err(
        "ERR_BOUNDARY",
        &[inside, "not an instruction boundary", "falls inside", insn],
    );
    err("ERR_ENTRY", &["entry_SYSCALL_64", "entry text"]);
    err(
        "ERR_UNRESOLVED",
        &["unresolved.o", "trapvec_no_such_kernel_function"],
    );
    let branch_point = run.expect("BRANCH_POINT");
    assert!(
        branch_point.starts_with("tcp_sync_mss+"),
        "a point of tcp_sync_mss whose window holds a branch target"
    );
    err("ERR_BRANCH", &[branch_point, "branch target"]);
    assert!(
        run.number("CHECK_OK") > 10 && run.number("CHECK_REFUSED") > 10,
        "apply --check planned every offset"
    );
    assert_eq!(
        run.expect("UNCHANGED"),
        "yes",
        "bytes of tcp_sync_mss and entry_SYSCALL_64, and trapctl list, as before"
    );

    err(
        "ERR_ALL_OR_NOTHING",
        &["entry_SYSCALL_64", "nothing was applied"],
    );
    assert_eq!(run.number("AFTER_ALL_OR_NOTHING"), 0);
    assert_eq!(
        run.number("BEST_EFFORT_STATUS"),
        3,
        "--best-effort exits 3 (partly applied) when a splice was refused"
    );
    assert_eq!(run.number("BEST_EFFORT_APPLIED"), 1);
    assert_eq!(run.number("BEST_EFFORT_REFUSED"), 2);

    assert_eq!(
        run.number("STATE_HITS"),
        10,
        "the next trapctl sees the splice and its hits (2 connections x 5)"
    );
    assert_eq!(
        run.expect("LIST_WAITED"),
        "yes",
        "a trapctl waits for another holder of the lock"
    );
    assert_eq!(
        run.expect("LIST_DURING_COUNT"),
        "yes",
        "a held count does not hold the lock while it waits"
    );
    assert!(
        run.number("LIST_SHOWS_COUNT") >= 1,
        "the list shows the count's splice: {}",
        run.stdout
    );
    assert!(
        run.number("DECLARED_HITS") >= 25,
        "load applied the component's own splice (getppid called 25 times and more)"
    );
    assert_eq!(
        run.expect("END_LIST"),
        "no splices no components ",
        "unload removed the declared splice with its component"
    );
}
