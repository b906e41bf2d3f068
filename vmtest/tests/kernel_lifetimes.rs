//! Lifetimes (`vmtest/scenarios/kernel_lifetimes.sh`, issue 9 item 6), in one boot: module init
//! text refused while init runs; a patch of module text keeps its module loaded until it is
//! reverted *and* a QUIESCE has passed; a replacement that sleeps 2 s outlives `trapctl
//! unsplice`, `trapctl unload` of its component and `rmmod trapvec`, each of which waits for the
//! task to leave: the call returns the replacement's result, the original bytes come back, and
//! no oops (vmtest fails the run on any oops, BUG or WARNING in the kernel log).

use std::path::{Path, PathBuf};
use std::process::Command;

use vmtest::host::KernelInstall;
use vmtest::testing::{can_boot, repo_root, tvraw, Run, Scenario};

/// `slowinit.ko` (vmtest/tests/fixtures/slowinit), built against the guest kernel's headers.
fn slowinit(dir: &Path) -> PathBuf {
    let src = repo_root().join("vmtest/tests/fixtures/slowinit");
    let build = dir.join("slowinit");
    std::fs::create_dir_all(&build).unwrap();
    for f in ["slowinit.c", "Kbuild"] {
        std::fs::copy(src.join(f), build.join(f)).unwrap_or_else(|e| panic!("copying {f}: {e}"));
    }
    let kernel =
        KernelInstall::newest().expect("the guest kernel's install (can_boot said it is there)");
    let mut make = Command::new("make");
    for var in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"] {
        make.env_remove(var);
    }
    let out = make
        .arg("-C")
        .arg(&kernel.headers)
        .arg(format!("M={}", build.display()))
        .arg("modules")
        .output()
        .expect("running make");
    assert!(
        out.status.success(),
        "building slowinit.ko: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    build.join("slowinit.ko")
}

/// `result=N ms=M` of a slowcall line printed as `key`.
fn call(run: &Run, key: &str) -> (i64, u64) {
    let line = run.expect(key);
    let word = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("{key}={line} has no {k}"))
    };
    (
        word("result=").parse().unwrap(),
        word("ms=").parse().unwrap(),
    )
}

fn word<'a>(run: &'a Run, key: &str, w: &str) -> &'a str {
    let line = run.expect(key);
    line.split_whitespace()
        .find_map(|x| x.strip_prefix(w))
        .unwrap_or_else(|| panic!("{key}={line} has no {w}"))
}

#[test]
fn sleeping_replacements_outlive_unsplice_unload_and_rmmod_and_module_references_wait_for_quiescence(
) {
    if !can_boot("kernel scenario") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = Scenario::named("kernel_lifetimes.sh")
        .file(tvraw(dir.path()))
        .file(slowinit(dir.path()))
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert_eq!(run.expect("LIFETIMES"), "done");

    // 1. Module init text.
    assert_eq!(
        run.value("INIT_SYMBOL"),
        None,
        "slowinit_init showed in kallsyms while init ran"
    );
    assert_eq!(run.expect("STATE_COMING"), "coming");
    assert_eq!(
        run.expect("R_INIT"),
        "25",
        "init text of a module whose init runs: MODULE_INIT"
    );
    assert_eq!(
        run.expect("R_CORE_COMING"),
        "2",
        "core text of a module not yet live: NOT_TEXT"
    );
    assert_eq!(
        run.expect("STATE_STILL"),
        "coming",
        "both checks ran while init ran"
    );
    assert_eq!(run.expect("INSMOD_RC"), "0");
    assert_eq!(run.expect("STATE_LIVE"), "live");
    assert_eq!(
        run.expect("R_CORE_LIVE"),
        "0",
        "the same core text once init returned"
    );
    assert_eq!(run.expect("INIT_AFTER"), "gone");

    // 2. Module references.
    let before = run.number("REF_BEFORE");
    assert_eq!(word(&run, "TOUCH_APPLY", "ret="), "0");
    assert_eq!(
        run.number("REF_LIVE"),
        before + 1,
        "a live patch holds a reference"
    );
    assert_eq!(run.expect("RMMOD_LIVE"), "refused");
    assert_eq!(word(&run, "TOUCH_REVERT", "ret="), "0");
    assert_eq!(
        run.number("REF_REVERTED"),
        before + 1,
        "a reverted patch keeps it until quiescence"
    );
    assert_eq!(run.expect("RMMOD_REVERTED"), "refused");
    assert_eq!(word(&run, "QUIESCE", "ret="), "0");
    assert_eq!(run.number("REF_QUIESCED"), before, "QUIESCE drops it");
    assert_eq!(run.expect("RMMOD_QUIESCED"), "removed");
    assert_eq!(
        run.expect("RMMOD_SPLICED"),
        "refused",
        "a trapctl splice in module text"
    );
    assert_eq!(
        run.expect("RMMOD_UNSPLICED"),
        "removed",
        "trapctl unsplice quiesces"
    );

    // 3a. unsplice during the sleep.
    assert_eq!(
        run.value("ENTERED"),
        None,
        "the call entered the replacement"
    );
    assert_eq!(run.expect("UNSPLICE_RC"), "0");
    assert_eq!(
        run.expect("LEFT_AT_UNSPLICE"),
        "1",
        "unsplice returned only after the task left the replacement"
    );
    let waited = run.number("UNSPLICE_MS");
    assert!(
        waited >= 300,
        "unsplice waited for the sleeping task ({waited} ms)"
    );
    let (result, ms) = call(&run, "CALL_UNSPLICE");
    assert_eq!(
        result, 4242,
        "the sleeping call returns the replacement's result"
    );
    assert!(ms >= 2000, "it slept 2 s ({ms} ms)");
    assert_eq!(run.expect("BYTES_UNSPLICE"), "same");
    assert_ne!(
        call(&run, "CALL_AFTER").0,
        4242,
        "getppid is the kernel's again"
    );

    // 3d. A removal that gives up waiting is retried: by unsplice, then by unload.
    assert_eq!(
        run.value("RETRY_ENTERED"),
        None,
        "the calls entered the replacement"
    );
    for round in ["UNSPLICE", "UNLOAD"] {
        let key = |k: &str| format!("RETRY_{round}_{k}");
        assert_eq!(
            run.expect(&key("FIRST_RC")),
            "1",
            "{round}: the first unsplice gives up after 0.5 s"
        );
        let first = run.expect(&key("FIRST"));
        for w in [
            "__x64_sys_getppid: not removed yet: 1 task(s) still inside the replacement sleepy_getppid of __x64_sys_getppid (trampoline block at 0x",
            "after 500ms",
            "the splice is retiring",
            "run the unsplice (or unload) again",
        ] {
            assert!(first.contains(w), "{round}: `{first}` lacks `{w}`");
        }
        assert_eq!(
            run.expect(&key("BYTES_RETIRING")),
            "same",
            "{round}: the original bytes are back while it retires"
        );
        assert_eq!(
            run.expect(&key("LISTED")),
            "1",
            "{round}: trapctl list shows it retiring"
        );
        let (result, ms) = call(&run, &key("CALL"));
        assert_eq!(
            result, 4242,
            "{round}: the call returns the replacement's result"
        );
        assert!(ms >= 5000, "{round}: it slept 5 s ({ms} ms)");
    }
    assert_eq!(
        run.expect("RETRY_UNSPLICE_SECOND_RC"),
        "0",
        "{}",
        run.expect("RETRY_UNSPLICE_SECOND")
    );
    assert!(
        run.expect("RETRY_UNSPLICE_SECOND")
            .starts_with("unspliced __x64_sys_getppid at 0x"),
        "{}",
        run.expect("RETRY_UNSPLICE_SECOND")
    );
    assert_eq!(run.expect("RETRY_UNSPLICE_BYTES"), "same");
    assert_eq!(
        run.expect("RETRY_UNSPLICE_LEFT"),
        "0",
        "nothing retiring any more"
    );
    assert_ne!(
        call(&run, "RETRY_UNSPLICE_CALL_AFTER").0,
        4242,
        "getppid is the kernel's again"
    );
    assert_eq!(
        run.expect("RETRY_UNLOAD_SECOND_RC"),
        "0",
        "{}",
        run.expect("RETRY_UNLOAD_SECOND")
    );
    assert_eq!(run.expect("RETRY_UNLOAD_SECOND"), "unloaded sleepy");
    assert_eq!(run.expect("RETRY_UNLOAD_BYTES"), "same");
    assert_eq!(
        run.expect("RETRY_UNLOAD_LIST").trim(),
        "no splices no components"
    );

    // 3b. unload of the component during the sleep.
    assert_eq!(run.expect("UNLOAD_RC"), "0");
    assert_eq!(call(&run, "CALL_UNLOAD").0, 4343);
    let unload = run.number("UNLOAD_MS");
    assert!(
        unload >= 300,
        "unload waited for the sleeping task ({unload} ms)"
    );
    assert_eq!(run.expect("BYTES_UNLOAD"), "same");

    // 3c. rmmod trapvec during the sleep.
    assert_eq!(run.expect("RMMOD_RC"), "0");
    assert_eq!(
        call(&run, "CALL_RMMOD").0,
        4343,
        "the call came back through the unloading module's arena"
    );
    let rmmod = run.number("RMMOD_MS");
    assert!(
        rmmod >= 300,
        "rmmod waited for the sleeping task ({rmmod} ms)"
    );
    assert_eq!(run.expect("BYTES_RMMOD"), "same");
    assert_ne!(call(&run, "CALL_RELOADED").0, 4343);

    assert_eq!(run.expect("OOPS"), "no");
}
