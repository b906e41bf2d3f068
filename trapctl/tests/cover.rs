//! `trapctl cover --process`, with gcov as the oracle: `fixtures/cover/prog.c` built once with
//! `gcc -O0 --coverage` (gcov's executed lines) and once with `gcc -O0 -g` (run under
//! `trapctl cover`, its lcov file's executed lines); the two sets must be equal but for one named
//! class of lines (below). Needs gcc, gcov, genhtml (lcov) and the built agent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod attach_common;
use attach_common::{agent, compile, libfoo};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cover/prog.c")
}

fn run(dir: &Path, program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A temporary directory holding `prog.c`, built as `prog` with `gcc -O0 FLAGS`.
fn build(flags: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(), dir.path().join("prog.c")).unwrap();
    let mut args = vec!["-O0"];
    args.extend(flags);
    args.extend(["-o", "prog", "prog.c"]);
    compile("gcc", dir.path(), &args);
    dir
}

fn trapctl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .arg("cover")
        .arg("--agent")
        .arg(agent())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// gcov's verdict per line of `prog.c`: its count, `0` for `#####` (never executed); lines
/// without code are absent.
fn gcov_lines(dir: &Path) -> BTreeMap<u32, u64> {
    let text = std::fs::read_to_string(dir.join("prog.c.gcov")).unwrap();
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let mut f = l.splitn(3, ':');
        // `gcov -b`'s `branch`, `call` and `function` lines have no line number.
        let (Some(count), Some(line)) = (f.next(), f.next()) else {
            continue;
        };
        if l.starts_with("function ") {
            continue;
        }
        let (count, line) = (count.trim(), line.trim());
        let line: u32 = line.parse().unwrap();
        if line == 0 || count == "-" {
            continue;
        }
        let n = if count.starts_with('#') || count.starts_with('=') {
            0
        } else {
            count.trim_end_matches('*').parse().unwrap()
        };
        out.insert(line, n);
    }
    out
}

/// The `DA:` lines of `prog.c`'s record in an lcov file.
fn lcov_lines(info: &str) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    let mut ours = false;
    for l in info.lines() {
        if let Some(sf) = l.strip_prefix("SF:") {
            ours = sf.ends_with("/prog.c");
        } else if let (true, Some(da)) = (ours, l.strip_prefix("DA:")) {
            let (line, n) = da.split_once(',').unwrap();
            out.insert(line.parse().unwrap(), n.parse().unwrap());
        }
    }
    out
}

/// The named class gcov and the line table disagree on: a line holding only the `}` that closes
/// a function. The function's epilogue (`leave; ret`, or `pop rbp; ret`) is on it in the line
/// table, so trapvec marks it; gcov gives it no count.
fn closing_braces(source: &str) -> BTreeSet<u32> {
    source
        .lines()
        .enumerate()
        .filter(|(_, l)| *l == "}")
        .map(|(i, _)| u32::try_from(i + 1).unwrap())
        .collect()
}

#[test]
fn gcov_and_cover_find_the_same_lines_executed() {
    let gcov_dir = build(&["--coverage"]);
    run(gcov_dir.path(), "./prog", &["7"]);
    run(gcov_dir.path(), "gcov", &["prog.c"]);
    let gcov = gcov_lines(gcov_dir.path());

    let dir = build(&["-g"]);
    let out = trapctl(
        dir.path(),
        &[
            "--process",
            "*",
            "--lcov",
            "prog.info",
            "--json",
            "-o",
            "report.json",
            "--",
            "./prog",
            "7",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The program's own output is untouched.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "7 91\n");
    let info = std::fs::read_to_string(dir.path().join("prog.info")).unwrap();
    let ours = lcov_lines(&info);
    assert!(!ours.is_empty(), "no DA line for prog.c in:\n{info}");

    let braces = closing_braces(&std::fs::read_to_string(fixture()).unwrap());
    let without = |m: &BTreeMap<u32, u64>, executed: bool| -> BTreeSet<u32> {
        m.iter()
            .filter(|(l, n)| (**n > 0) == executed && !braces.contains(l))
            .map(|(l, _)| *l)
            .collect()
    };
    assert_eq!(
        without(&ours, true),
        without(&gcov, true),
        "executed lines: trapctl cover's (left) against gcov's (right)\n{info}"
    );
    assert_eq!(
        without(&ours, false),
        without(&gcov, false),
        "lines never executed: trapctl cover's (left) against gcov's (right)\n{info}"
    );
    // The named class is there, and only on lines of code trapvec saw: one `}` per C function.
    let ours_braces: BTreeSet<u32> = ours
        .keys()
        .copied()
        .filter(|l| braces.contains(l))
        .collect();
    assert_eq!(ours_braces, braces);
    assert!(braces.iter().all(|l| !gcov.contains_key(l)));
    // Counts: every executed line's count (the most hits of a block over it) is gcov's.
    for (line, n) in &gcov {
        if *n > 0 {
            assert_eq!(ours.get(line), Some(n), "line {line}'s count\n{info}");
        }
    }

    // Per block: the loop of sum_squares(7) tests its condition 8 times and runs its body 7.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report["schema"], 1);
    assert_eq!(report["exit"], 0);
    let hits = |f: &str| -> Vec<u64> {
        let mut v: Vec<u64> = report["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["function"] == f)
            .map(|b| b["hits"].as_u64().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(hits("sum_squares"), [1, 1, 7, 8]);
    assert_eq!(hits("square"), [7]);
    assert!(hits("never_called").iter().all(|h| *h == 0));
    assert!(!hits("never_called").is_empty());

    // genhtml takes the file.
    let html = Command::new("genhtml")
        .args(["-q", "-o", "html", "prog.info"])
        .current_dir(dir.path())
        .output()
        .expect("genhtml (Debian package lcov, installed by .ci/install-deps) is needed");
    assert!(
        html.status.success(),
        "genhtml: {}",
        String::from_utf8_lossy(&html.stderr)
    );
    assert!(dir.path().join("html/index.html").exists());
}

#[test]
fn a_refused_block_is_listed_and_the_command_runs_with_its_exit_status() {
    let dir = build(&["-g"]);
    // `prog 3 x` returns never_called(3) = 3.
    let out = trapctl(
        dir.path(),
        &[
            "--process",
            "tiny",
            "never_called",
            "--",
            "./prog",
            "3",
            "x",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    // The program's output, then the report.
    assert!(stdout.starts_with("3 5\n"), "{stdout}");
    // tiny's `ret` at +6 is one byte before the branch target at +7.
    assert!(
        stdout.contains("  refused: tiny+0x6 ("),
        "no refused block listed:\n{stdout}"
    );
    assert!(
        stdout.contains("contains the branch target"),
        "no reason:\n{stdout}"
    );
    assert!(
        stdout.contains("refused at 1 block(s): branch_target_in_window"),
        "{stdout}"
    );
    assert!(
        stdout.contains("total: 2 function(s), 8 block(s), 7 covered (87.5%), 1 refused; ./prog exited with status 3"),
        "{stdout}"
    );
}

#[test]
fn without_debug_info_the_lcov_file_has_symbol_records_and_says_why() {
    let dir = build(&[]);
    let out = trapctl(
        dir.path(),
        &["--process", "square", "--lcov", "p.info", "--", "./prog"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("symbol+offset records in the lcov file")
            && stdout.contains("no DWARF line table"),
        "{stdout}"
    );
    let info = std::fs::read_to_string(dir.path().join("p.info")).unwrap();
    assert!(info.contains("# BLOCK square+0x0 15 7\n"), "{info}");
}

/// (`--process --mode once` works since 40c02a5: tests/cover_once.rs.)
#[test]
fn the_kernel_path_needs_the_module() {
    let dir = build(&["-g"]);
    // Without --process the globs name kernel functions (in either mode): on a host without
    // trapvec.ko the device is named.
    if !Path::new("/dev/trapvec").exists() {
        for mode in ["count", "once"] {
            let out = trapctl(dir.path(), &["--mode", mode, "main", "--", "./prog"]);
            assert_eq!(out.status.code(), Some(1));
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("/dev/trapvec"),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let out = trapctl(dir.path(), &["--process", "main"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--process needs the command to run"));
}

#[test]
fn a_library_glob_covers_the_library_with_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(fixture().with_file_name("uselib.c"), d.join("uselib.c")).unwrap();
    libfoo(d);
    let rpath = format!("-Wl,-rpath,{}", d.display());
    compile(
        "gcc",
        d,
        &[
            "-O0",
            "-g",
            "-o",
            "uselib",
            "uselib.c",
            "-L.",
            "-l:libfoo.so.1",
            &rpath,
        ],
    );
    let out = trapctl(
        d,
        &[
            "--process",
            "libfoo.so.1:foo_*",
            "--lcov",
            "u.info",
            "--",
            "./uselib",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // foo_add: entry, `return 0` (never), `return a + b`, the epilogue; foo_unused never runs.
    let row = |f: &str| -> Vec<String> {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("libfoo.so.1:{f} ")))
            .unwrap_or_else(|| panic!("no row for {f}:\n{stdout}"))
            .split_whitespace()
            .skip(1)
            .map(String::from)
            .collect()
    };
    assert_eq!(row("foo_add"), ["4", "3", "75.0%", "0"], "{stdout}");
    assert_eq!(row("foo_unused"), ["1", "0", "0.0%", "0"], "{stdout}");
    let info = std::fs::read_to_string(d.join("u.info")).unwrap();
    assert!(
        info.contains(
            "/libfoo.c\nFN:2,foo_add\nFN:8,foo_unused\nFNDA:5,foo_add\nFNDA:0,foo_unused\n"
        ),
        "{info}"
    );
    assert!(info.contains("DA:3,5\nDA:4,0\nDA:5,5\n"), "{info}");
    assert!(
        !info.contains("uselib.c"),
        "the program was not asked for:\n{info}"
    );
}

/// gcov's branches per line of `prog.c` (`gcov -b -c`): each branch's taken count, `None` for
/// `never executed`, sorted.
fn gcov_branches(dir: &Path) -> BTreeMap<u32, Vec<Option<u64>>> {
    let text = std::fs::read_to_string(dir.join("prog.c.gcov")).unwrap();
    let mut out: BTreeMap<u32, Vec<Option<u64>>> = BTreeMap::new();
    let mut line = 0;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("branch ") {
            let n = rest
                .split_once(" taken ")
                .map(|(_, t)| t.split_whitespace().next().unwrap().parse().unwrap());
            out.entry(line).or_default().push(n);
        } else if let Some((_, r)) = l.split_once(':') {
            if let Some(n) = r.split_once(':').and_then(|(n, _)| n.trim().parse().ok()) {
                line = n;
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// The `BRDA:` lines of `prog.c`'s record in an lcov file, as [`gcov_branches`] gives them.
fn lcov_branches(info: &str) -> BTreeMap<u32, Vec<Option<u64>>> {
    let mut out: BTreeMap<u32, Vec<Option<u64>>> = BTreeMap::new();
    let mut ours = false;
    for l in info.lines() {
        if let Some(sf) = l.strip_prefix("SF:") {
            ours = sf.ends_with("/prog.c");
        } else if let (true, Some(br)) = (ours, l.strip_prefix("BRDA:")) {
            let f: Vec<&str> = br.split(',').collect();
            out.entry(f[0].parse().unwrap())
                .or_default()
                .push(f[3].parse().ok());
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// gcov's executed lines, its branches per line, and trapctl's lcov file.
type Both = (BTreeMap<u32, u64>, BTreeMap<u32, Vec<Option<u64>>>, String);

/// `prog 7` under gcov (`--coverage`) and under trapctl cover (`-g`), both built with `opt`:
/// gcov's executed lines and branches, trapctl's lcov file.
fn both(opt: &str) -> Both {
    let build_opt = |flags: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture(), dir.path().join("prog.c")).unwrap();
        let mut args = vec![opt];
        args.extend(flags);
        args.extend(["-o", "prog", "prog.c"]);
        compile("gcc", dir.path(), &args);
        dir
    };
    let g = build_opt(&["--coverage"]);
    run(g.path(), "./prog", &["7"]);
    run(g.path(), "gcov", &["-b", "-c", "prog.c"]);
    let dir = build_opt(&["-g"]);
    let out = trapctl(
        dir.path(),
        &["--process", "*", "--lcov", "p.info", "--", "./prog", "7"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let info = std::fs::read_to_string(dir.path().join("p.info")).unwrap();
    (gcov_lines(g.path()), gcov_branches(g.path()), info)
}

#[test]
fn at_o0_every_branch_trapctl_reports_is_gcovs() {
    let (_, gcov, info) = both("-O0");
    let ours = lcov_branches(&info);
    // Every conditional of prog.c has one jcc at -O0 whose fall-through or target block has it
    // as only predecessor: each of gcov's branch lines is there, with gcov's counts.
    assert_eq!(
        ours, gcov,
        "branches per line: trapctl cover's BRDA (left) against gcov -b -c (right)\n{info}"
    );
    assert!(ours.len() >= 7, "{info}");
    assert!(info.contains("BRF:") && info.contains("BRH:"), "{info}");
}

#[test]
fn at_o2_trapctl_finds_executed_only_lines_gcov_found_executed() {
    // -O2: gcov counts its arcs per source line; trapctl cover sees the code the optimizer left,
    // through the line table. What must hold: a line trapctl finds executed, gcov does too (a
    // block runs only if the code of its lines ran), but for a function's closing brace, and
    // the lines trapctl finds never executed gcov never executed. gcov may find more lines
    // executed (code merged into another line's, or folded away: no address to trap), so
    // trapctl's executed set is a subset of gcov's, not the same set, but for the lines gcov
    // has no code on (below).
    let (gcov, _, info) = both("-O2");
    let ours = lcov_lines(&info);
    assert!(!ours.is_empty(), "{info}");
    let braces = closing_braces(&std::fs::read_to_string(fixture()).unwrap());
    let executed = |m: &BTreeMap<u32, u64>| -> BTreeSet<u32> {
        m.iter()
            .filter(|(l, n)| **n > 0 && !braces.contains(l))
            .map(|(l, _)| *l)
            .collect()
    };
    let (ours_x, gcov_x) = (executed(&ours), executed(&gcov));
    // Lines gcov has no code for at -O2 (`long s = 0;`, main's `return 0;`: a constant the
    // optimizer put in a register on another line's path) can hold instructions in the line
    // table: they are the second class trapctl may add, and are left out here.
    let extra: Vec<&u32> = ours_x
        .difference(&gcov_x)
        .filter(|l| gcov.contains_key(l))
        .collect();
    eprintln!(
        "-O2: executed by gcov, not by trapctl: {:?}; by trapctl on lines gcov has no code on: {:?}",
        gcov_x.difference(&ours_x).collect::<Vec<_>>(),
        ours_x.iter().filter(|l| !gcov.contains_key(l)).collect::<Vec<_>>()
    );
    assert!(
        extra.is_empty(),
        "lines trapctl found executed and gcov did not: {extra:?}\n{info}"
    );
    let never: Vec<u32> = ours
        .iter()
        .filter(|(l, n)| **n == 0 && gcov.get(l).is_some_and(|g| *g > 0))
        .map(|(l, _)| *l)
        .collect();
    assert!(
        never.is_empty(),
        "lines trapctl found never executed and gcov executed: {never:?}\n{info}"
    );
    // The loop's body and main's calls are there at -O2 too.
    assert!(ours_x.len() >= 5, "{ours_x:?}\n{info}");
}

/// `fixtures/cover/cold.c` built as a packaged program is (`gcc -O2
/// -freorder-blocks-and-partition`), stripped to `.dynsym` (`-rdynamic -s`) as Debian's python3
/// is, so that its `.cold` parts have no names, in a new directory.
fn build_cold() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture().with_file_name("cold.c"),
        dir.path().join("cold.c"),
    )
    .unwrap();
    compile(
        "gcc",
        dir.path(),
        &[
            "-O2",
            "-fcf-protection=none",
            "-freorder-blocks-and-partition",
            "-rdynamic",
            "-s",
            "-o",
            "cold",
            "cold.c",
        ],
    );
    dir
}

/// The jumps back into a function of `image` from code outside it (its `.cold` part) that land
/// strictly inside the 5-byte jmp window a block of the function's own analysis would take:
/// `(function, window start, target, the jump's address)`.
fn jumps_into_naive_windows(
    image: &instr_manager::image::CodeImage,
) -> Vec<(String, u64, u64, u64)> {
    use instr_manager::cover::{analyzed, analyzed_in};
    let read = |a: u64, n: usize| image.read(a, n).map(<[u8]>::to_vec);
    let mut out = Vec::new();
    for f in image
        .symbols
        .iter()
        .filter(|s| s.kind == trapvec::SymbolKind::Function)
    {
        let extent = image.symbols.function_extent(f);
        let (Some((_, naive)), Some((_, full))) = (
            analyzed(f, extent, &read),
            analyzed_in(f, extent, &read, image.object_targets()),
        ) else {
            continue;
        };
        for b in &naive.blocks {
            // The instructions a jmp rel32 at the block's start displaces, inside the block.
            let first = naive.insn_index(b.start).unwrap();
            let mut end = b.start;
            for i in &naive.insns[first..] {
                if end >= b.start + 5 || i.addr >= b.end {
                    break;
                }
                end = i.end();
            }
            if end < b.start + 5 {
                continue;
            }
            for (&t, &from) in full.outside_targets.range(b.start + 1..end) {
                // The jump really is one, outside the function, to there.
                let bytes = image.read(from, 5).unwrap();
                let jump = instr_manager::analyze_function("from", from, bytes).unwrap();
                assert_eq!(jump.insns[0].instr.near_branch_target(), t);
                assert!(!(naive.start..naive.end).contains(&from));
                out.push((f.name.clone(), b.start, t, from));
            }
        }
    }
    out
}

#[test]
fn a_cold_part_jumping_back_into_a_window_is_kept_out_of_it_and_the_program_runs_with_exact_hits() {
    let dir = build_cold();
    let d = dir.path();
    let image = instr_manager::image::CodeImage::from_path(&d.join("cold")).unwrap();
    assert!(
        !image.symbols.iter().any(|s| s.name.contains(".cold")),
        "stripped: the cold parts have no names"
    );
    // `mix`: `ja mix.cold; xor eax, esi; (join) rol eax, 7`: the cold part's `jmp` back lands
    // 2 bytes into the block `ja` falls through to, inside the jmp a naive plan put there.
    let found = jumps_into_naive_windows(&image);
    let mix: Vec<_> = found.iter().filter(|f| f.0 == "mix").collect();
    assert_eq!(mix.len(), 1, "{found:x?}");
    let (_, window, join, _) = *mix[0];
    let normal = run(d, "./cold", &[]);
    let expected = "sum 48 len 11 -1 -1 mix 474134800 walk 543 complaints 6\n";
    assert_eq!(String::from_utf8_lossy(&normal.stdout), expected);

    let out = trapctl(
        d,
        &[
            "--process",
            "--mode",
            "count",
            "--json",
            "-o",
            "r.json",
            "*",
            "--",
            "./cold",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout, expected,
        "the program's output, as without coverage"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("r.json")).unwrap()).unwrap();
    assert_eq!(report["exit"], 0);
    assert_eq!(report["total"]["refused"], 0, "{}", report["total"]);
    let hits = |function: &str, addr: u64| -> u64 {
        let b = report["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["function"] == function && b["address"] == format!("{addr:#x}"))
            .unwrap_or_else(|| panic!("no block of {function} at {addr:#x}: {report}"));
        b["hits"].as_u64().unwrap()
    };
    let entry = |function: &str| image.symbols.lookup(function).unwrap().addr;
    // mix(k) for k in 0..10: 8 on the hot path, 2 (k = 8, 9) through mix.cold; both reach the
    // join, now a block of its own.
    assert_eq!(hits("mix", entry("mix")), 10);
    assert_eq!(hits("mix", window), 8);
    assert_eq!(hits("mix", join), 10);
    assert_eq!(hits("complain", entry("complain")), 6);
    assert_eq!(hits("checked_len", entry("checked_len")), 3);
    assert_eq!(hits("sum_list", entry("sum_list")), 1);
    assert_eq!(hits("walk", entry("walk")), 1);
    assert_eq!(hits("main", entry("main")), 1);
}
