//! The conventions every command shares: documented exit statuses (`--help`, the man pages),
//! usage errors exit 2, and the completions and man pages are visible commands.

use std::process::{Command, Output};

fn trapctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn help_documents_the_exit_statuses_and_lists_completions_and_man() {
    let out = trapctl(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for want in [
        "Exit status: 0 done; 1 an error",
        "2 usage",
        "3 partly applied",
        "exits 86",
        "\n  completions ",
        "\n  man ",
        "\n  doctor ",
    ] {
        assert!(help.contains(want), "--help lacks {want:?}: {help}");
    }
}

#[test]
fn a_usage_error_exits_2() {
    let out = trapctl(&["splice"]);
    assert_eq!(out.status.code(), Some(2));
    let out = trapctl(&["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("bash") && err.contains("zsh"),
        "the shells are listed: {err}"
    );
}

#[test]
fn man_pages_have_examples_and_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let out = trapctl(&["man", dir.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let apply = page("trapctl-apply.1");
    assert!(
        apply.contains(".SH EXAMPLES\n.TP\n\\fBtrapctl apply \\-\\-check spec.toml\\fR"),
        "{apply}"
    );
    assert!(
        apply.contains(".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\ndone\n"),
        "{apply}"
    );
    assert!(apply.contains("\\fB3\\fR\npartly applied"), "{apply}");
    let main = page("trapctl.1");
    assert!(main.contains("\\fBtrapctl doctor\\fR"), "{main}");
    // Every visible command has a page, each with its exit statuses.
    for cmd in [
        "count",
        "cover",
        "doctor",
        "points",
        "splice",
        "completions",
        "man",
    ] {
        let p = page(&format!("trapctl-{cmd}.1"));
        assert!(p.contains(".SH \"EXIT STATUS\""), "trapctl-{cmd}.1: {p}");
    }
}

#[test]
fn completions_are_printed_for_a_shell() {
    let out = trapctl(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("complete -F _trapctl"), "{script}");
    assert!(script.contains("doctor"), "{script}");
}
