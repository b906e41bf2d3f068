//! `trapctl trace --process`: one-liners against `fixtures/trace/prog.c` (built with gcc), whose
//! calls are known: `prog N` calls `compute(i, p)` for i in 0..N (p = a good pointer to 40 for
//! odd i, the bad address 8 for even i), then `compute(3, NULL)` once, whose result it prints.
//! Needs gcc and the built agent (cargo build --release -p trapvec-agent).

use std::path::Path;
use std::process::{Command, Output};

mod attach_common;
use attach_common::{agent, compile};

/// A temporary directory holding `prog`, built with `gcc -O1`.
fn build() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trace/prog.c");
    compile(
        "gcc",
        dir.path(),
        &["-O1", "-o", "prog", src.to_str().unwrap()],
    );
    dir
}

/// `trapctl trace --process [extra] -e PROGRAM -- ./prog N`.
fn trace(dir: &Path, program: &str, extra: &[&str], n: u32) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["trace", "--process", "--agent"])
        .arg(agent())
        .args(extra)
        .args(["-e", program, "--", "./prog", &n.to_string()])
        .current_dir(dir)
        .output()
        .unwrap()
}

/// `out` is a refusal: status 1, `want` in its stderr, and nothing ran (no stdout).
fn assert_refused(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(want), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "status {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn count_equals_the_calls_made_and_sum_adds_the_known_arguments() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute { @calls = count(); @sum = sum(arg0); @by[arg0 % 2] = count() }",
        &[],
        10,
    ));
    // 10 calls in the loop, then compute(3, NULL): 0+1+...+9 + 3 = 48.
    assert!(out.contains("@calls: 11\n"), "{out}");
    assert!(out.contains("@sum: 48\n"), "{out}");
    assert!(out.contains("@by[0]: 5\n@by[1]: 6\n"), "{out}");
    // The program's own output is untouched.
    assert!(out.contains("compute(3) = 6\ntotal = 90\n"), "{out}");
}

#[test]
fn hist_buckets_known_values_as_bars() {
    let dir = build();
    let out = ok(&trace(dir.path(), "compute { @h = hist(arg0) }", &[], 8));
    // 0..7 and 3: [0] 1, [1] 1, [2, 4) 3 (2, 3, 3), [4, 8) 4.
    let bar = |n: usize| "@".repeat(n * 52 / 4);
    let want = format!(
        "@h:\n{:<16}{:>8} |{:<52}|\n{:<16}{:>8} |{:<52}|\n{:<16}{:>8} |{:<52}|\n{:<16}{:>8} |{:<52}|\n",
        "[0]", 1, bar(1), "[1]", 1, bar(1), "[2, 4)", 3, bar(3), "[4, 8)", 4, bar(4)
    );
    assert!(out.contains(&want), "{out}\nwant:\n{want}");
}

#[test]
fn a_predicate_selects_half_the_calls() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute /(arg0 & 1) == 0/ { @even = count() }",
        &[],
        10,
    ));
    assert!(out.contains("@even: 5\n"), "{out}");
}

#[test]
fn if_else_if_else_picks_one_branch_per_call_and_an_unassigned_variable_reads_zero() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute { if (arg0 > 5) { @big = count(); $k = 1 } else if (arg0 == 0) { @zero = count() } else { @small = count(); $k = 2 } @k[$k] = count() }",
        &[],
        10,
    ));
    // Arguments 0..9 and 3: 6..9 are big, 0 is zero, 1..5 and 3 small; the zero branch
    // assigns no $k, which reads 0.
    assert!(
        out.contains(
            "@big: 4
"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "@zero: 1
"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "@small: 6
"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "@k[0]: 1
@k[1]: 4
@k[2]: 6
"
        ),
        "{out}"
    );
    assert!(out.contains("compute(3) = 6\ntotal = 90\n"), "{out}");
}

#[test]
fn failed_reads_are_counted_per_probe_and_good_ones_read() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute { @v[*(u32 *)(arg1)] = count() }",
        &[],
        10,
    ));
    // Odd i read 40; even i (address 8) and the NULL of the last call fail, and key 0.
    assert!(out.contains("@v[40]: 5\n@v[0]: 6\n"), "{out}");
    assert!(
        out.contains("6 read(s) failed at compute: bad address\n"),
        "{out}"
    );
}

#[test]
fn a_retval_change_is_seen_by_the_program_only_with_allow_changes() {
    let dir = build();
    let program = "compute:return /arg0 == 3 && arg1 == 0/ { retval = 1000 }";
    let out = ok(&trace(dir.path(), program, &["--allow-changes"], 10));
    assert!(out.contains("compute(3) = 1000\n"), "{out}");
    // The loop's compute(3, &v) kept its value: total is 90.
    assert!(out.contains("total = 90\n"), "{out}");
    let refused = trace(dir.path(), program, &[], 10);
    assert_refused(
        &refused,
        "error at 1:43: changing retval needs --allow-changes",
    );
}

#[test]
fn json_reports_the_maps_and_the_exit_status() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "BEGIN { printf(\"start %d\\n\", 7) } compute { @c[func] = count() }",
        &["--json"],
        4,
    ));
    let v: serde_json::Value = serde_json::from_str(&out[out.find("{\n").unwrap()..]).unwrap();
    assert_eq!(v["exit"], 0);
    assert_eq!(v["begin"][0], "start 7\n");
    assert_eq!(v["maps"][0]["name"], "c");
    assert_eq!(v["maps"][0]["entries"][0]["key"][0], "compute");
    assert_eq!(v["maps"][0]["entries"][0]["value"], 5);
}

#[test]
fn a_glob_probe_expands_to_the_programs_functions_and_func_names_them() {
    let dir = build();
    let out = ok(&trace(dir.path(), "comp* { @[func] = count() }", &[], 10));
    assert!(out.contains("@[compute]: 11\n"), "{out}");
    let missing = trace(dir.path(), "nosuch_* { @ = count() }", &[], 1);
    assert_refused(
        &missing,
        "error at 1:1: probe 'nosuch_*' matches no function",
    );
}

#[test]
fn return_at_an_entry_replaces_the_function_and_the_program_sees_its_value() {
    let dir = build();
    let program = "compute { @[arg0 == 3] = count(); return arg0 * 3 }";
    let out = ok(&trace(dir.path(), program, &["--allow-changes"], 4));
    // compute(3) runs as 3 * 3, the loop's four calls sum to (0 + 1 + 2 + 3) * 3, not * 2.
    assert!(out.contains("compute(3) = 9\n"), "{out}");
    assert!(out.contains("total = 18\n"), "{out}");
    // The replacement still counts: arg0 == 3 twice (the loop's last and the printed call).
    assert!(out.contains("@[1]: 2\n@[0]: 3\n"), "{out}");
    let refused = trace(dir.path(), program, &[], 4);
    assert_refused(
        &refused,
        "error at 1:35: return (skipping the function) needs --allow-changes",
    );
}

#[test]
fn return_under_a_predicate_replaces_only_the_selected_calls_the_others_run_the_function() {
    let dir = build();
    let program =
        "compute /arg0 == 3/ { @three = count(); return 7 } compute:return { @r = count() }";
    // An entry replacement and compute:return cannot go together.
    let refused = trace(dir.path(), program, &["--allow-changes"], 5);
    assert_refused(&refused, "its entry cannot also skip it with return");
    let program = "compute /arg0 == 3/ { @three = count(); return 7 }";
    let out = ok(&trace(dir.path(), program, &["--allow-changes"], 5));
    // compute(3) returns 7 (twice: the loop's and the printed one); the others run and
    // return 2 x: 0 + 2 + 4 + 7 + 8.
    assert!(out.contains("compute(3) = 7\n"), "{out}");
    assert!(out.contains("total = 21\n"), "{out}");
    assert!(out.contains("@three: 2\n"), "{out}");
    let refused = trace(dir.path(), program, &[], 5);
    assert_refused(
        &refused,
        "error at 1:41: return (skipping the function) needs --allow-changes",
    );
}

#[test]
fn mechanism_jmp_splices_the_probes_by_jmp_and_counts_the_same() {
    let dir = build();
    let run = |mechanism: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_trapctl"))
            .args(["trace", "--process", "--agent"])
            .arg(agent())
            .args(["--mechanism", mechanism])
            .args(["-e", "compute { @calls = count() }", "--", "./prog", "10"])
            .env("TRAPVEC_LOG", "instr_manager::plan=debug")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (ok(&out), stderr)
    };
    let (trap, trap_log) = run("trap");
    let (jmp, jmp_log) = run("jmp");
    for out in [&trap, &jmp] {
        assert!(out.contains("@calls: 11\n"), "{out}");
    }
    // compute is 4 bytes long: the planner says why a jmp rel32 cannot go there and takes a
    // jmp rel8 to a springboard; a trap splice never plans a jmp.
    assert!(
        jmp_log.contains("jmp rel32 at") && jmp_log.contains("function `compute`"),
        "{jmp_log}"
    );
    assert!(!trap_log.contains("jmp rel32 at"), "{trap_log}");
}

/// The lines of `out` that start with `prefix`, in order.
fn lines_with<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn printf_in_a_probe_prints_one_line_per_call_in_order() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute /arg0 != 1/ { printf(\"hit %s(%d) %x\\n\", func, arg0, arg0 * 255) }",
        &[],
        4,
    ));
    assert_eq!(
        lines_with(&out, "hit "),
        vec![
            "hit compute(0) 0",
            "hit compute(2) 1fe",
            "hit compute(3) 2fd",
            "hit compute(3) 2fd"
        ],
        "{out}"
    );
    assert!(!out.contains("lost"), "{out}");
}

#[test]
fn exit_in_a_probe_ends_the_trace_prints_the_maps_and_kills_the_command() {
    let dir = build();
    let start = std::time::Instant::now();
    // Two hundred million traced calls would take many minutes: exit() ends it at the 1001st.
    let out = ok(&trace(
        dir.path(),
        "compute /arg0 == 1000/ { @at = arg0; printf(\"exit at %d\\n\", arg0); exit() }",
        &[],
        200_000_000,
    ));
    assert_eq!(lines_with(&out, "exit at"), vec!["exit at 1000"], "{out}");
    assert!(out.contains("@at: 1000\n"), "{out}");
    // Killed: the program never printed its results.
    assert!(!out.contains("total ="), "{out}");
    assert!(start.elapsed().as_secs() < 60, "{:?}", start.elapsed());
}

#[test]
fn delete_removes_one_key_and_clear_empties_a_map() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute { @c[arg0 % 3] = count(); delete(@c[0]); @seen[arg0] = count(); clear(@seen) }",
        &[],
        10,
    ));
    // arg0 % 3 of 0..9 and 3: 1 three times, 2 three times; key 0 deleted after each count.
    assert!(out.contains("@c[1]: 3\n@c[2]: 3\n"), "{out}");
    assert!(!out.contains("@c[0]") && !out.contains("@seen"), "{out}");
}

#[test]
fn a_map_read_in_a_predicate_selects_the_first_call_per_key() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute /@seen[arg0] == 0/ { @seen[arg0] = count(); @first = count() }",
        &[],
        4,
    ));
    // 0, 1, 2, 3 and 3 again: four first calls.
    assert!(out.contains("@first: 4\n"), "{out}");
    assert!(
        out.contains("@seen[0]: 1\n@seen[1]: 1\n@seen[2]: 1\n@seen[3]: 1\n"),
        "{out}"
    );
}

#[test]
fn an_interval_prints_a_map_clears_it_and_exits() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute /arg0 < 3/ { @small[arg0] = count() } interval:ms:300 { printf(\"tick\\n\"); print(@small); clear(@small); exit() }",
        &[],
        200_000_000,
    ));
    // The interval's print, then nothing at the end: the map was cleared and arg0 only grows.
    let want = "tick\n@small[0]: 1\n@small[1]: 1\n@small[2]: 1\n\n";
    assert!(out.contains(want), "{out}");
    assert_eq!(out.matches("@small[0]").count(), 1, "{out}");
    assert!(!out.contains("total ="), "{out}");
}

#[test]
fn printf_lines_the_ring_could_not_hold_are_counted_lost_never_silently() {
    let dir = build();
    let out = ok(&trace(
        dir.path(),
        "compute { printf(\"%d\\n\", arg0) }",
        &[],
        100_000,
    ));
    // 100,001 calls: far more than 256 records come between two of trapctl's reads.
    let printed: Vec<u64> = out.lines().filter_map(|l| l.parse().ok()).collect();
    let lost: u64 = out
        .lines()
        .find_map(|l| l.strip_suffix(" printf line(s) lost: the ring's 256 records were overwritten before trapctl read them"))
        .unwrap_or_else(|| panic!("no lost line: {}", &out[out.len().saturating_sub(2000)..]))
        .parse()
        .unwrap();
    assert!(lost > 0);
    assert_eq!(printed.len() as u64 + lost, 100_001);
    // What was printed is in call order: the loop's arguments rise, then compute(3, NULL).
    assert!(printed[..printed.len() - 1].windows(2).all(|w| w[0] < w[1]));
    assert_eq!(printed.last(), Some(&3));
}

/// A temporary directory holding `libfx.so` (fixtures/trace/libfx.c) and `fxprog` linked
/// against it (fixtures/trace/fxprog.c), both built with `gcc -O1`.
fn build_fx() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/trace");
    let gcc = |args: &[&str]| compile("gcc", dir.path(), args);
    let lib = src.join("libfx.c");
    let prog = src.join("fxprog.c");
    gcc(&[
        "-O1",
        "-fPIC",
        "-shared",
        "-Wl,-soname,libfx.so",
        "-o",
        "libfx.so",
        lib.to_str().unwrap(),
    ]);
    gcc(&["-O1", "-o", "fxprog", prog.to_str().unwrap(), "-L.", "-lfx"]);
    dir
}

/// `trapctl trace --process [extra] -e PROGRAM -- ./fxprog N`, libfx.so found through
/// `$LD_LIBRARY_PATH` (by the program's loader and by trapctl's glob expansion).
fn trace_fx(dir: &Path, program: &str, extra: &[&str], n: u32) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["trace", "--process", "--agent"])
        .arg(agent())
        .args(extra)
        .args(["-e", program, "--", "./fxprog", &n.to_string()])
        .env("LD_LIBRARY_PATH", dir)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// fxprog's line for N: what fx_a, fx_b and fy returned, fz's sum and the string lengths.
fn fx_line(n: i64) -> String {
    let total: i64 =
        (0..n).map(|i| 3 * i + 1).sum::<i64>() + (0..2 * n).map(|i| i + 100).sum::<i64>() - n;
    let z: i64 = (0..n).map(|i| 7 * i).sum();
    format!(
        "total = {total} z = {z} len = {}\n",
        // strlen("./fxprog") + strnlen(.., 1), n times.
        n * 9
    )
}

#[test]
fn a_library_glob_counts_each_matching_function_of_the_library_exactly() {
    let dir = build_fx();
    let out = ok(&trace_fx(
        dir.path(),
        "libfx.so:fx_* { @[func] = count(); @args[func] = sum(arg0) }",
        &[],
        5,
    ));
    // fx_a(0..5), fx_b(0..10); fy matches not.
    assert!(out.contains("@[fx_a]: 5\n@[fx_b]: 10\n"), "{out}");
    assert!(out.contains("@args[fx_a]: 10\n@args[fx_b]: 45\n"), "{out}");
    assert!(!out.contains("fy"), "{out}");
    assert!(out.contains(&fx_line(5)), "{out}");
    // A glob over one function and a glob over all three, in one program.
    let out = ok(&trace_fx(
        dir.path(),
        "libfx.so:f?_[ab] { @ab = count() } libfx.so:fy* { @[probe] = count() }",
        &[],
        3,
    ));
    assert!(out.contains("@ab: 9\n"), "{out}");
    assert!(out.contains("@[libfx.so:fy]: 1\n"), "{out}");
}

#[test]
fn a_library_glob_matching_nothing_is_refused_naming_the_glob_and_the_library() {
    let dir = build_fx();
    let out = trace_fx(dir.path(), "libfx.so:nosuch_* { @ = count() }", &[], 1);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lib = dir.path().join("libfx.so");
    assert!(
        err.contains(&format!(
            "error at 1:1: probe 'libfx.so:nosuch_*' matches no function of libfx.so ({})",
            lib.display()
        )),
        "{err}"
    );
    // Nothing ran.
    assert!(out.stdout.is_empty());
    let out = trace_fx(dir.path(), "libnosuch.so.9:f* { @ = count() }", &[], 1);
    assert_refused(&out, "library libnosuch.so.9 is not found");
}

#[test]
fn a_libc_glob_counts_at_least_the_programs_own_calls() {
    let dir = build_fx();
    let out = ok(&trace_fx(
        dir.path(),
        "libc.so.6:str*len { @[func] = count() }",
        &[],
        50,
    ));
    // fxprog calls each 50 times; libc may call them more itself.
    let count = |f: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("@[{f}]: ")))
            .unwrap_or_else(|| panic!("no @[{f}]: {out}"))
            .parse()
            .unwrap()
    };
    assert!(count("strlen") >= 50, "{out}");
    assert!(count("strnlen") >= 50, "{out}");
    assert!(out.contains(&fx_line(50)), "{out}");
}

#[test]
fn an_entry_and_a_return_probe_of_one_function_both_count_every_call() {
    let dir = build_fx();
    for mechanism in ["trap", "jmp"] {
        let out = ok(&trace_fx(
            dir.path(),
            "fz { @e = count(); @args = sum(arg0); @start[tid] = nsecs } \
             fz:return { @r = count(); @ret = sum(retval); @d = hist(nsecs - @start[tid]) } \
             libfx.so:fx_a { @le = count() } \
             libfx.so:fx_a:return { @lr = count(); @lret[arg0] = max(retval) }",
            &["--mechanism", mechanism],
            6,
        ));
        // fz(0..6) returns 7 i; fx_a(0..6) returns 3 i + 1, arg0 as it was at the entry.
        for want in [
            "@e: 6\n",
            "@r: 6\n",
            "@args: 15\n",
            "@ret: 105\n",
            "@le: 6\n",
            "@lr: 6\n",
        ] {
            assert!(out.contains(want), "{mechanism}: {want}\n{out}");
        }
        for i in 0..6 {
            assert!(
                out.contains(&format!("@lret[{i}]: {}\n", 3 * i + 1)),
                "{mechanism}: {out}"
            );
        }
        // Six durations, each in one bucket of the histogram.
        let d = &out[out.find("@d:\n").unwrap_or_else(|| panic!("{out}"))..];
        let total: u64 = d
            .lines()
            .skip(1)
            .take_while(|l| l.contains('|'))
            .map(|l| {
                let count = l.split(" |").next().unwrap().split_whitespace().last();
                count.unwrap().parse::<u64>().unwrap()
            })
            .sum();
        assert_eq!(total, 6, "{mechanism}: {out}");
        assert!(out.contains(&fx_line(6)), "{mechanism}: {out}");
    }
    // libc's strlen is an IFUNC: its code is picked at run time, so the entry probe's place
    // after the return point's window cannot be read from the file. Refused, nothing run.
    let out = trace_fx(
        dir.path(),
        "libc.so.6:strlen { @e = count() } libc.so.6:strlen:return { @r = count() }",
        &[],
        1,
    );
    assert_refused(&out, "probe libc.so.6:strlen: strlen is an IFUNC in");
}

#[test]
fn return_under_a_predicate_over_a_library_glob_replaces_each_functions_selected_call() {
    let dir = build_fx();
    let out = ok(&trace_fx(
        dir.path(),
        "libfx.so:fx_* /arg0 == 2/ { @[func] = count(); return 1000 }",
        &["--allow-changes"],
        4,
    ));
    // fx_a(2) returns 1000 instead of 7, fx_b(2) 1000 instead of 102; every other call runs
    // its function (through its own original trampoline).
    let plain = fx_line(4);
    let total: i64 = plain["total = ".len()..plain.find(" z").unwrap()]
        .parse()
        .unwrap();
    let want = plain.replacen(
        &format!("total = {total}"),
        &format!("total = {}", total + (1000 - 7) + (1000 - 102)),
        1,
    );
    assert!(out.contains(&want), "{out}\nwant {want}");
    assert!(out.contains("@[fx_a]: 1\n@[fx_b]: 1\n"), "{out}");
}
