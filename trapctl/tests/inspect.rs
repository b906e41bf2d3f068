//! `trapctl inspect` against real files compiled at test time from `fixtures/inspect.c`: an
//! executable (`cc -O2`), a relocatable object (`cc -c -O2`) and a kernel-style object
//! (`-pg -mfentry -fno-pic`, so every function starts with `call __fentry__`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{cc, trapctl};

use serde_json::Value;

struct Fixture {
    _dir: tempfile::TempDir,
    exe: PathBuf,
    obj: PathBuf,
    kobj: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("inspect");
        let obj = dir.path().join("inspect.o");
        let kobj = dir.path().join("kinspect.o");
        cc(&[], &exe);
        cc(&["-c"], &obj);
        cc(&["-c", "-pg", "-mfentry", "-fno-pic"], &kobj);
        Fixture {
            _dir: dir,
            exe,
            obj,
            kobj,
        }
    })
}

fn text(file: &Path, point: &str) -> String {
    let out = trapctl(&["inspect", file.to_str().unwrap(), point]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(file: &Path, point: &str) -> Value {
    let out = trapctl(&["inspect", "--json", file.to_str().unwrap(), point]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn hex(v: &Value) -> u64 {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("{v} is not a hex string"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// `xor eax, eax; ret`: trap yes at 0 (displacing the xor), jmp rel32 no, with the reason.
fn check_zero(r: &Value) {
    let f = &r["function"];
    assert_eq!(hex(&f["end"]) - hex(&f["start"]), 3, "{r}");
    let s0 = &r["sites"][0];
    assert_eq!(hex(&s0["addr"]), hex(&f["start"]));
    assert_eq!(s0["asm"], "xor eax, eax");
    assert_eq!(s0["trap"]["possible"], true);
    assert_eq!(strings(&s0["trap"]["displaced"]), vec!["xor eax, eax"]);
    assert_eq!(s0["trap"]["displaced_len"], 2);
    let rel32 = s0["jmp"]["rel32_reason"].as_str().unwrap();
    assert!(
        rel32.contains("function `zero` is only 3 byte(s) long; a jmp rel32 needs 5 bytes"),
        "{rel32}"
    );
    // A jmp can still go through a springboard in the alignment padding after `ret`.
    if s0["jmp"]["possible"] == true {
        assert_eq!(s0["jmp"]["form"], "jmp rel8 + springboard");
        assert!(hex(&s0["jmp"]["springboard"]) >= hex(&f["end"]));
    }
    let ret = &r["sites"][1];
    assert_eq!(
        (ret["asm"].as_str(), ret["trap"]["possible"].as_bool()),
        (Some("ret"), Some(false))
    );
    assert!(ret["trap"]["reason"]
        .as_str()
        .unwrap()
        .contains("past the end of `zero`"));
}

#[test]
fn zero_in_an_executable_traps_at_entry_but_refuses_jmp_rel32() {
    let r = json(&fixture().exe, "zero");
    assert_eq!(r["addresses"], "virtual");
    assert_eq!(r["kernel"], false);
    check_zero(&r);
}

#[test]
fn zero_in_an_object_file_uses_section_offsets() {
    let r = json(&fixture().obj, "zero");
    assert_eq!(r["kind"], "relocatable");
    assert_eq!(r["addresses"], "offsets in .text");
    check_zero(&r);
}

#[test]
fn text_output_shows_the_listing_and_the_verdicts() {
    let out = text(&fixture().exe, "zero");
    assert!(
        out.contains("ELF position-independent executable") || out.contains("ELF executable"),
        "{out}"
    );
    assert!(out.contains("function `zero` ["), "{out}");
    let xor = out
        .lines()
        .position(|l| l.contains("31 c0") && l.ends_with("xor eax, eax"))
        .expect("xor line");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[xor + 1].trim(),
        "trap: yes, displaces `xor eax, eax` (2 bytes)"
    );
    assert!(
        lines[xor + 2].contains("jmp rel32: no, function `zero` is only 3 byte(s) long"),
        "{}",
        lines[xor + 2]
    );
    assert!(lines[xor - 1].starts_with("block ["), "{out}");
}

#[test]
fn loop_has_several_blocks_and_a_backward_branch_target() {
    let r = json(&fixture().exe, "loop_sum");
    let blocks = r["blocks"].as_array().unwrap();
    assert!(blocks.len() >= 3, "{r}");
    // Some block lists its own start (or an earlier one) as a successor: the loop's back edge.
    let back = blocks.iter().any(|b| {
        strings(&b["succs"])
            .iter()
            .any(|s| hex(&Value::from(s.as_str())) <= hex(&b["start"]))
    });
    assert!(back, "no back edge in {r}");
    // Every block start is an instruction that a trap can take unless the window leaves the block.
    let sites = r["sites"].as_array().unwrap();
    assert_eq!(
        sites.len() as u64,
        r["function"]["instructions"].as_u64().unwrap()
    );
    assert!(sites.iter().filter(|s| s["block_start"] == true).count() == blocks.len());
}

#[test]
fn switch_jump_table_is_found_and_its_cases_are_branch_targets() {
    let r = json(&fixture().exe, "dispatch");
    let f = &r["function"];
    assert_eq!(f["indirect_jumps"].as_array().unwrap().len(), 1, "{r}");
    assert!(
        f["unresolved_indirect_jumps"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{r}"
    );
    let table_block = r["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["succs"].as_array().unwrap().len() >= 7);
    assert!(
        table_block.is_some(),
        "no block with the 7 cases as successors: {r}"
    );
}

#[test]
fn one_point_is_examined_alone_and_a_non_boundary_is_refused() {
    let r = json(&fixture().exe, "zero+1");
    let sites = r["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 1);
    assert_eq!(hex(&r["site"]), hex(&r["function"]["start"]) + 1);
    assert_eq!(sites[0]["asm"], "");
    for m in ["trap", "jmp"] {
        assert_eq!(sites[0][m]["possible"], false);
        let reason = sites[0][m]["reason"].as_str().unwrap();
        assert!(
            reason.contains(
                "is not an instruction boundary of `zero`: it falls inside `xor eax, eax`"
            ),
            "{reason}"
        );
    }
    let r = json(&fixture().obj, "zero+0");
    assert_eq!(r["sites"].as_array().unwrap().len(), 1);
    assert_eq!(r["sites"][0]["trap"]["possible"], true);
}

#[test]
fn kernel_style_object_refuses_the_fentry_site_and_moves_entry_points_past_it() {
    let k = &fixture().kobj;
    let r = json(k, "zero");
    assert_eq!(r["kernel"], true);
    assert_eq!(r["function"]["fentry_site"], true);
    let s0 = &r["sites"][0];
    // Shown as it runs: the kernel turns `call __fentry__` into a 5-byte NOP at boot.
    assert_eq!(s0["bytes"], "0f 1f 44 00 00", "{s0}");
    assert!(
        s0["trap"]["reason"]
            .as_str()
            .unwrap()
            .contains("ftrace site"),
        "{s0}"
    );
    assert_eq!(r["sites"][1]["asm"], "xor eax, eax");
    assert_eq!(r["sites"][1]["trap"]["possible"], true);

    let r = json(k, "zero+0");
    assert_eq!(hex(&r["site"]), hex(&r["function"]["start"]) + 5);
    assert!(
        strings(&r["notes"]).iter().any(|n| n.contains("moved")),
        "{r}"
    );

    // The same object planned as user code: the NOP at the entry is an ordinary instruction.
    let out = trapctl(&[
        "inspect",
        "--json",
        "--mode",
        "user",
        k.to_str().unwrap(),
        "zero",
    ]);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["sites"][0]["trap"]["possible"], true);
}

#[test]
fn unknown_symbol_and_bad_point_fail_naming_them() {
    let out = trapctl(&["inspect", fixture().exe.to_str().unwrap(), "no_such_fn"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no symbol `no_such_fn`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = trapctl(&["inspect", fixture().obj.to_str().unwrap(), "zero+zz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("zero+zz"));
    let out = trapctl(&["inspect", "/nonexistent/file", "zero"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/file"));
}

#[test]
fn help_explains_the_subcommand() {
    let out = trapctl(&["inspect", "--help"]);
    let help = String::from_utf8(out.stdout).unwrap();
    for words in ["trap splice", "springboard", "offsets", "--json", "kernel"] {
        assert!(help.contains(words), "--help lacks `{words}`:\n{help}");
    }
}

/// The agent's C++ exception fixture (`eh.cc`, with `eh_pad.S`), built with g++ once.
fn cxx_fixture() -> &'static Path {
    static F: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("eh");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fixtures");
        let out = Command::new("g++")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(src.join("eh.cc"))
            .arg(src.join("eh_pad.S"))
            .output()
            .expect("g++ is needed for this test (.ci/install-deps installs it)");
        assert!(
            out.status.success(),
            "g++: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, exe)
    })
    .1
}

#[test]
fn exception_landing_pads_are_listed_and_a_window_over_one_is_refused_naming_it() {
    let exe = cxx_fixture();
    let r = json(exe, "padded_catch");
    let start = hex(&r["function"]["start"]);
    assert_eq!(
        strings(&r["function"]["landing_pads"]),
        [format!("{:#x}", start + 0xf)]
    );
    let site = |addr: u64| {
        r["sites"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| hex(&s["addr"]) == addr)
            .unwrap()
            .clone()
    };
    // The nop between the `ret` and the landing pad: both windows run over it.
    let nop = site(start + 0xe);
    assert_eq!(nop["asm"], "nop");
    for m in ["trap", "jmp"] {
        assert_eq!(nop[m]["possible"], false, "{m}");
        let reason = nop[m]["reason"].as_str().unwrap();
        assert!(
            reason.contains("covers the exception landing pad at padded_catch+0xf"),
            "{m}: {reason}"
        );
    }
    let pad = site(start + 0xf);
    assert_eq!(
        (&pad["trap"]["possible"], &pad["jmp"]["possible"]),
        (&Value::Bool(true), &Value::Bool(true)),
        "at the pad itself"
    );
    let t = text(exe, "padded_catch");
    assert!(t.contains(&format!("note: exception landing pads (from .gcc_except_table; only the unwinder jumps there): {:#x}", start + 0xf)), "{t}");
    // g++'s own: a destructor's cleanup and a catch, each one landing pad.
    for f in ["with_cleanup", "catcher"] {
        assert_eq!(
            strings(&json(exe, f)["function"]["landing_pads"]).len(),
            1,
            "{f}"
        );
    }
}
