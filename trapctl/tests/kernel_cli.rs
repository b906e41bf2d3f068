//! trapctl's kernel commands as a user meets them on a machine without trapvec.ko (the host):
//! argument rules, help that explains, and one clear error line naming the device. Their work
//! against the real kernel is tested in the VM (`vmtest/tests/kernel_*.rs`).

use std::process::{Command, Output};

fn trapctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl")).args(args).output().expect("running trapctl")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn kernel_commands_without_the_module_fail_with_one_line_naming_the_device() {
    if std::path::Path::new("/dev/trapvec").exists() {
        eprintln!("/dev/trapvec exists here: this test is for machines without the module");
        return;
    }
    for args in [
        &["list"][..],
        &["load", "/components/mss_clamp.o"],
        &["splice", "tcp_sync_mss", "--count"],
        &["unsplice", "--all"],
        &["set", "mss_clamp_mtu", "1400"],
        &["count", "tcp_sync_mss", "--seconds", "1"],
        &["read", "tcp_sync_mss"],
    ] {
        let out = trapctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: one line, got {err}");
        assert!(err.starts_with("trapctl: opening /dev/trapvec"), "{args:?}: {err}");
        assert!(!err.contains("(os error 2): No such file"), "{args:?}: the cause is not repeated: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn splice_takes_exactly_one_action() {
    let none = trapctl(&["splice", "tcp_sync_mss"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(stderr(&none).contains("--call <SYM>|--replace <SYM>|--count"), "{}", stderr(&none));
    let two = trapctl(&["splice", "tcp_sync_mss", "--call", "h", "--replace", "r"]);
    assert_eq!(two.status.code(), Some(2));
    let cookie_without_call = trapctl(&["splice", "tcp_sync_mss", "--replace", "r", "--cookie", "3"]);
    assert_eq!(cookie_without_call.status.code(), Some(2), "{}", stderr(&cookie_without_call));
    let bad_mech = trapctl(&["splice", "tcp_sync_mss", "--count", "--mechanism", "int3"]);
    assert!(stderr(&bad_mech).contains("unknown mechanism `int3`"), "{}", stderr(&bad_mech));
}

#[test]
fn set_and_get_refuse_sizes_other_than_1_2_4_8() {
    let out = trapctl(&["set", "v", "1", "--size", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("size `3` is not 1, 2, 4 or 8"), "{}", stderr(&out));
}

#[test]
fn help_explains_each_kernel_command() {
    let help = |cmd: &str| String::from_utf8(trapctl(&[cmd, "--help"]).stdout).unwrap();
    let expect = [
        ("splice", &["ftrace site", "arguments are", "--replace", "__trapvec_orig_", "kprobes"][..]),
        ("apply", &["--best-effort", "non-zero", "all or nothing", "--check"]),
        ("count", &["entry", "counting", "calls in"]),
        ("list", &["missed", "CRC32", "--json"]),
        ("set", &["one store", "size"]),
        ("get", &["decimal"]),
        ("unsplice", &["--all", "hit counts"]),
        ("load", &["kallsyms", "TRAPVEC_SPLICE"]),
        ("read", &["kernel memory"]),
    ];
    for (cmd, words) in expect {
        let text = help(cmd);
        for w in words {
            assert!(text.contains(w), "trapctl {cmd} --help lacks `{w}`:\n{text}");
        }
    }
    let top = String::from_utf8(trapctl(&["--help"]).stdout).unwrap();
    assert!(!top.contains("cycle"), "the stress aid is hidden");
}
