//! `trapctl splice 'GLOB' --count`: one splice per matching function in one batch (an `apply`
//! of a generated spec), all or nothing by default, `--best-effort` summing the refusals up by
//! reason and exiting 3. The real binary runs against a daemon on a Unix socket (trapd's own
//! server) whose handler runs the one executor on the fake kernel (`trapvec::fake`: f0..f3;
//! `fake_daemon`).

mod fake_daemon;

use fake_daemon::{daemon_with, text, Setup};

/// The fake kernel (`pre` already spliced by count) and its daemon in `dir`.
fn daemon(dir: &std::path::Path, pre: &[&str]) -> fake_daemon::FakeDaemon {
    daemon_with(
        dir,
        Setup {
            pre,
            ..Setup::default()
        },
    )
}

#[test]
fn a_glob_splices_every_matching_function_in_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &[]);
    let out = d.trapctl(&["splice", "f[0-2]", "--count"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.ends_with("spliced 3 of 3 functions\n"), "{stdout}");
    assert!(d.k.trapped("f0") && d.k.trapped("f1") && d.k.trapped("f2"));
    assert!(!d.k.trapped("f3"));
}

#[test]
fn a_refusal_splices_nothing_by_default_and_the_rest_with_best_effort() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &["f3"]);
    let out = d.trapctl(&["splice", "f*", "--count"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("f*: nothing was spliced"), "{stderr}");
    assert!(stderr.contains("1 of 4 splices refused"), "{stderr}");
    assert!(!d.k.trapped("f0"));

    let out = d.trapctl(&["splice", "f*", "--count", "--best-effort"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("refused 1: the site is already spliced (at f3)\n"),
        "{stderr}"
    );
    assert!(text(&out.stdout).ends_with("spliced 3 of 4 functions\n"));
    assert!(d.k.trapped("f0") && d.k.trapped("f1") && d.k.trapped("f2"));
}

#[test]
fn a_glob_matching_nothing_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), &[]);
    let out = d.trapctl(&["splice", "tcp_*", "--count"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the glob `tcp_*` matches no function"),
        "{stderr}"
    );
    assert!(d.k.pristine());
}
