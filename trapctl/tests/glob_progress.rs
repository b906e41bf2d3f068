//! The spinner of a glob's batch (issue 28, item 3): on a terminal `trapctl splice 'GLOB'` and
//! `trapctl unsplice 'GLOB'` say on stderr what they are doing while the batch runs; with
//! `--json`, or when stderr is not a terminal (a pipe, as scripts read it), nothing of it is
//! drawn. The terminal is a pty given by util-linux's `script`; the daemon is trapd's server
//! over the one executor and the fake kernel (f0..f3; `fake_daemon`).

mod fake_daemon;

use std::path::Path;
use std::process::{Command, Output};

use fake_daemon::{daemon, text};

/// `trapctl --socket SOCKET ARGS` on a pty (stdout and stderr both the terminal, merged), with
/// `TERM=xterm`.
fn on_a_terminal(socket: &Path, args: &str) -> Output {
    on_a_terminal_named(socket, args, "xterm")
}

fn on_a_terminal_named(socket: &Path, args: &str, term: &str) -> Output {
    let line = format!(
        "{} --socket {} {args}",
        env!("CARGO_BIN_EXE_trapctl"),
        socket.display()
    );
    Command::new("script")
        .env("TERM", term)
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .output()
        .expect("util-linux script(1) gives the test its terminal")
}

/// What a drawn spinner leaves in the bytes: its message, carriage returns, escape sequences.
fn has_a_bar(out: &str) -> bool {
    out.contains("(one batch)") || out.contains('\r') && out.contains("\x1b[")
}

#[test]
fn a_glob_batch_shows_its_spinner_on_a_terminal_only_and_never_with_json() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());

    let out = on_a_terminal(&d.socket, "splice 'f[0-2]' --count");
    let tty = text(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(
        tty.contains("splicing 'f[0-2]' (one batch)"),
        "the spinner said what it was doing: {tty:?}"
    );
    assert!(tty.contains("spliced 3 of 3 functions"), "{tty:?}");
    assert!(d.k.trapped("f0") && d.k.trapped("f2"));
    let out = on_a_terminal(&d.socket, "unsplice 'f[0-2]'");
    let tty = text(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(tty.contains("unsplicing 'f[0-2]' (one batch)"), "{tty:?}");
    assert!(d.k.pristine());

    // A terminal that cannot draw (TERM=dumb: vmtest's serial console, read back as a log):
    // the lines alone, each at a line start (indicatif hides on TERM=dumb too; progress.rs
    // checks it itself rather than count on that).
    let out = on_a_terminal_named(&d.socket, "splice 'f[0-2]' --count", "dumb");
    let tty = text(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(!has_a_bar(&tty), "TERM=dumb: {tty:?}");
    assert!(
        tty.lines()
            .any(|l| l.starts_with("spliced 3 of 3 functions")),
        "{tty:?}"
    );
    let out = on_a_terminal_named(&d.socket, "unsplice 'f[0-2]'", "dumb");
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(!has_a_bar(&text(&out.stdout)), "{}", text(&out.stdout));
    assert!(d.k.pristine());

    // --json on a terminal: the object alone.
    let out = on_a_terminal(&d.socket, "splice 'f[0-2]' --count --json");
    let tty = text(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(!has_a_bar(&tty), "no spinner with --json: {tty:?}");
    let out = on_a_terminal(&d.socket, "unsplice 'f[0-2]' --json");
    assert!(!has_a_bar(&text(&out.stdout)), "{}", text(&out.stdout));
    assert!(d.k.pristine());

    // Not a terminal: nothing drawn on stderr, stdout the report alone.
    let out = d.trapctl(&["splice", "f[0-2]", "--count"]);
    assert!(out.status.success());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(stderr, "", "nothing on a piped stderr");
    assert!(!has_a_bar(&stdout), "{stdout:?}");
    let out = d.trapctl(&["unsplice", "f[0-2]"]);
    assert_eq!(text(&out.stderr), "");
    assert!(!has_a_bar(&text(&out.stdout)));
    assert!(d.k.pristine());
}
