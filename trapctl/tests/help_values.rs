//! Enumerated flags list their values (issue 28, item 3): `--help` shows `[possible values:
//! ...]` for --mechanism, --by and --clock, and the shell completions offer them, while a value
//! outside the list is still a usage error (exit 2) naming it and the choices.

use std::process::{Command, Output};

fn trapctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(args: &[&str]) -> String {
    let out = trapctl(args);
    assert!(out.status.success(), "{args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn help_lists_the_values_of_every_enumerated_flag() {
    let mechanisms = "[possible values: trap, jmp]";
    let keys = "[possible values: tid, pid, comm, cpu]";
    for (cmd, want) in [
        ("splice", &[mechanisms, keys][..]),
        ("count", &[mechanisms, keys]),
        ("time", &[mechanisms, "[possible values: wall, cpu]"]),
        ("cycle", &["[possible values: trap, jmp, both]"]),
    ] {
        let help = stdout(&[cmd, "--help"]);
        for w in want {
            assert!(help.contains(w), "trapctl {cmd} --help lacks {w}:\n{help}");
        }
    }
}

#[test]
fn completions_offer_the_values() {
    let bash = stdout(&["completions", "bash"]);
    assert!(bash.contains("trap jmp"), "mechanisms");
    assert!(bash.contains("tid pid comm cpu"), "keys");
    assert!(bash.contains("wall cpu"), "clocks");
}

#[test]
fn a_value_outside_the_list_is_a_usage_error_naming_it_and_the_choices() {
    let out = trapctl(&["time", "f", "--seconds", "1", "--clock", "sun"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown clock `sun` (wall or cpu)"),
        "{stderr}"
    );
    assert!(stderr.contains("--clock"), "{stderr}");
}

#[test]
fn trace_help_summarizes_the_language_with_if_else_and_return() {
    let help = stdout(&["trace", "--help"]);
    for w in [
        "if (E) { ... } else if (E) { ... } else { ... }",
        "Changes need --allow-changes",
        "and `return E`, the last statement of an entry probe at offset 0",
        "its caller gets E",
        "{ return 5 }",
    ] {
        assert!(help.contains(w), "trapctl trace --help lacks {w}:\n{help}");
    }
    // The short help stays short: the summary is in the long one only.
    let short = stdout(&["trace", "-h"]);
    assert!(!short.contains("return E"), "{short}");
}
