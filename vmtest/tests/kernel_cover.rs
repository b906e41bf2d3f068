//! `trapctl cover` on the running kernel (`vmtest/scenarios/cover.sh`, issue 27 items 1 and 3),
//! in one boot: a count trap at every basic block of a few syscall functions while a command
//! calls getsid() and getppid() a known number of times. The entry block of the function only
//! that command calls counts exactly its calls, of the other at least its calls; a function
//! never called is at 0%; a noinstr function's blocks are refused with the reason, not fatal;
//! afterwards no site is left and the text is what it was. The oracle: kprobes at the same
//! sites over the same command count what the coverage counted, block by block. A SIGTERM
//! ends a coverage with the report and every site removed; through trapd the same exact count;
//! once mode (direct and through trapd) hits the same blocks, disarms them while the command
//! runs and leaves nothing behind; a glob of over 1,000 functions is armed and disarmed in one
//! batch each, timed. A process too (the oracle of issue 27 for processes): `trapctl cover
//! --process` counts every block of a deterministic C program built here (`-O0 -g`,
//! `fixtures/coverloop.c`), and uprobes at every block that had a site count a second, identical
//! run: equal, block by block.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vmtest::testing::{build_agent, build_trapd, can_boot, Run, Scenario};
use vmtest::uprobe::{file_offset, load_segments};

/// `CALLS=n` of a ppidloop line, which must also say every answer was right.
fn calls(run: &Run, key: &str) -> u64 {
    let line = run.expect(key);
    let word = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{key}: `{line}` has no {k}"))
    };
    assert_eq!(word("WRONG="), 0, "{key}: every answer right: {line}");
    word("CALLS=")
}

/// The blocks of `function` in a report.
fn blocks_of<'a>(report: &'a Value, function: &str) -> Vec<&'a Value> {
    report["blocks"]
        .as_array()
        .expect("blocks is a list")
        .iter()
        .filter(|b| b["function"] == function)
        .collect()
}

/// A report's `stages`: the apply is `arm_ms`, every stage took time, and the batch's own plan,
/// build and commit (reported directly and through trapd alike) fit in the apply.
fn check_stages(report: &Value, route: &str) {
    let st = &report["stages"];
    let f = |k: &str| -> f64 {
        st[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{route}: stages.{k} is a number: {st}"))
    };
    assert_eq!(st["apply_ms"], report["arm_ms"], "{route}: {st}");
    for k in ["open_ms", "decode_ms", "spec_ms", "apply_ms"] {
        assert!(f(k) > 0.0, "{route}: stages.{k} > 0: {st}");
    }
    let batch = f("plan_ms") + f("build_ms") + f("commit_ms");
    assert!(
        batch > 0.0 && batch <= f("apply_ms"),
        "{route}: the batch within the apply: {st}"
    );
}

/// The row of `function` in a report's per-function table.
fn function_row<'a>(report: &'a Value, function: &str) -> &'a Value {
    report["functions"]
        .as_array()
        .expect("functions is a list")
        .iter()
        .find(|f| f["function"] == function)
        .unwrap_or_else(|| panic!("no row for {function}: {report}"))
}

/// `fixtures/coverloop.c` and `coverloop_twin.c` (each with a static `helper`) built into `dir`
/// with `cc -O0 -g`, and beside it `coverloop.segments`:
/// its load segments (`ADDRESS SIZE OFFSET` a line, in hex), with which the guest turns a block's
/// address into the file offset a uprobe takes.
fn coverloop(dir: &Path) -> (PathBuf, PathBuf) {
    let prog = dir.join("coverloop");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cc = Command::new("cc")
        .args(["-O0", "-g", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&prog)
        .arg(fixtures.join("coverloop.c"))
        .arg(fixtures.join("coverloop_twin.c"))
        .output()
        .expect("running cc");
    assert!(
        cc.status.success(),
        "cc coverloop.c: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let segments = dir.join("coverloop.segments");
    let text: String = load_segments(&std::fs::read(&prog).unwrap())
        .unwrap()
        .iter()
        .map(|s| format!("{:#x} {:#x} {:#x}\n", s.address, s.size, s.offset))
        .collect();
    std::fs::write(&segments, text).unwrap();
    (prog, segments)
}

/// The process oracle: every block of coverloop that had a site counted what a uprobe at its
/// file offset counted in the second run; returns (blocks compared, blocks hit more than once).
fn process_oracle(run: &Run, prog: &Path) -> (usize, usize) {
    assert_eq!(
        run.number("PCOVER_STATUS"),
        0,
        "{}",
        run.expect("PCOVER_STDERR")
    );
    let out = run.expect("PCOVER_OUT");
    assert!(out.starts_with("ROUNDS=60 TOTAL="), "{out}");
    assert_eq!(
        run.expect("UPROBE_OUT"),
        out,
        "the uncovered run printed what the covered run did"
    );
    let report: Value = serde_json::from_str(run.expect("PCOVER_JSON"))
        .unwrap_or_else(|e| panic!("PCOVER_JSON is not JSON: {e}"));
    assert_eq!(report["exit"], 0);
    let sites: Vec<&Value> = report["blocks"]
        .as_array()
        .expect("blocks is a list")
        .iter()
        .filter(|b| b["hits"].is_u64())
        .collect();
    assert!(
        sites.len() >= 50,
        "a sample of at least 50 blocks: {}",
        sites.len()
    );
    assert!(run.value("UPROBE_FAILED").is_none(), "{}", run.stdout);
    assert_eq!(run.number("UPROBES"), sites.len() as u64);
    let pairs = |key: &str| -> Vec<(String, String)> {
        let prefix = format!("{key}=");
        run.stdout
            .lines()
            .filter_map(|l| l.trim_end().strip_prefix(prefix.as_str()))
            .map(|l| {
                let (a, b) = l.split_once(' ').unwrap_or((l, ""));
                (a.to_string(), b.to_string())
            })
            .collect()
    };
    // Each uprobe at the offset this side computes for the block's address.
    let elf = std::fs::read(prog).unwrap();
    let at = pairs("UPROBE_AT");
    let hits = pairs("UPROBE_HITS");
    assert_eq!((at.len(), hits.len()), (sites.len(), sites.len()));
    let mut more_than_once = 0;
    for ((b, (addr, off)), (haddr, n)) in sites.iter().zip(&at).zip(&hits) {
        assert_eq!(b["address"], addr.as_str());
        assert_eq!(haddr, addr);
        let a = u64::from_str_radix(addr.trim_start_matches("0x"), 16).unwrap();
        let want = file_offset(&elf, a).unwrap().expect("a block in a segment");
        assert_eq!(off, &format!("{want:#x}"), "the uprobe's offset for {addr}");
        let n: u64 = n
            .parse()
            .unwrap_or_else(|_| panic!("the uprobe at {addr} ({off}) has no count: `{n}`"));
        assert_eq!(
            b["hits"].as_u64(),
            Some(n),
            "the block at {addr} ({} +{}) counted as the uprobe at {off}",
            b["function"],
            b["offset"]
        );
        more_than_once += usize::from(n > 1);
    }
    assert!(more_than_once >= 1, "some block was hit more than once");
    // The two static `helper`s (coverloop.c's, called for every third round: 20 of 60;
    // coverloop_twin.c's, for every odd one: 30), each covered under its own address, and their
    // entry blocks among the blocks the uprobes checked above.
    let mut helpers: Vec<(u64, u64)> = sites
        .iter()
        .filter(|b| b["function"] == "helper" && b["offset"] == 0)
        .map(|b| {
            let a = b["address"].as_str().unwrap().trim_start_matches("0x");
            (
                u64::from_str_radix(a, 16).unwrap(),
                b["hits"].as_u64().unwrap(),
            )
        })
        .collect();
    helpers.sort_by_key(|&(_, hits)| hits);
    assert_eq!(
        helpers.iter().map(|&(_, hits)| hits).collect::<Vec<_>>(),
        [20, 30],
        "the entries of the two helpers, each with its own hits: {helpers:x?}"
    );
    assert_ne!(helpers[0].0, helpers[1].0, "two copies: {helpers:x?}");
    (sites.len(), more_than_once)
}

#[test]
fn cover_counts_every_block_as_kprobes_do_and_leaves_nothing_behind() {
    if !can_boot("kernel scenario") {
        return;
    }
    let trapd = build_trapd();
    let agent = build_agent();
    let dir = tempfile::tempdir().unwrap();
    let (prog, segments) = coverloop(dir.path());
    let run = Scenario::named("cover.sh")
        .file(&trapd)
        .file(&agent)
        .file(&prog)
        .file(&segments)
        .timeout(900)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert!(
        run.stdout.contains("COVER_DONE"),
        "the scenario ran to its end"
    );

    // The coverage itself: trapctl exits with the command's status (0) and its report.
    assert_eq!(
        run.number("COVER_STATUS"),
        0,
        "{}",
        run.expect("COVER_STDERR")
    );
    let report: Value = serde_json::from_str(run.expect("COVER_JSON"))
        .unwrap_or_else(|e| panic!("COVER_JSON is not JSON: {e}"));
    assert_eq!(report["schema"], 1);
    assert_eq!(report["target"], "kernel");
    assert_eq!(report["ended"], "command");
    check_stages(&report, "direct");
    let sid_calls = calls(&run, "SID_LOOP");
    let ppid_calls = calls(&run, "PPID_LOOP");
    assert!(sid_calls > 300 && ppid_calls > 300);

    // The entry block of __x64_sys_getsid: only the command calls getsid().
    let entry = |f: &str| -> u64 {
        let b = blocks_of(&report, f);
        let first = b
            .iter()
            .find(|b| b["offset"] == 0)
            .unwrap_or_else(|| panic!("{f} has no entry block: {b:?}"));
        assert_eq!(first["hit"], true, "{f}'s entry block was hit: {first}");
        first["count"].as_u64().expect("a count")
    };
    assert_eq!(entry("__x64_sys_getsid"), sid_calls, "one hit per getsid()");
    assert!(entry("__x64_sys_getppid") >= ppid_calls);
    // getsid(0) takes one way only (do_getsid() is inlined): covered, not all of it.
    let sid = function_row(&report, "__x64_sys_getsid");
    let (blocks, covered) = (
        sid["blocks"].as_u64().unwrap(),
        sid["covered"].as_u64().unwrap(),
    );
    assert!(blocks >= 3 && covered >= 1 && covered < blocks, "{sid}");
    // Never called in the guest: 0%, every block with a count of 0.
    let pivot = function_row(&report, "__x64_sys_pivot_root");
    assert_eq!(pivot["covered"], 0, "{pivot}");
    assert_eq!(pivot["percent"], 0.0, "{pivot}");
    assert!(blocks_of(&report, "__x64_sys_pivot_root")
        .iter()
        .all(|b| b["count"] == 0 && b["hit"] == false));
    // noinstr text: every block refused with its reason, and the rest armed all the same.
    let int3 = blocks_of(&report, "exc_int3");
    assert!(!int3.is_empty());
    for b in &int3 {
        assert!(b["count"].is_null(), "{b}");
        let reason = b["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("noinstr"), "{b}");
    }
    let total = &report["total"];
    for kind in total["refusals"].as_object().unwrap().keys() {
        assert!(!kind.contains("0x"), "a kind without addresses: {kind}");
    }
    assert_eq!(
        total["refused"].as_u64(),
        Some(int3.len() as u64),
        "{total}"
    );
    // Every block has its fields.
    for b in report["blocks"].as_array().unwrap() {
        for k in ["function", "offset", "address", "length", "hit", "count"] {
            assert!(b.get(k).is_some(), "{k} in {b}");
        }
    }

    // --lcov without vmlinux's debug file: records, the reason, and a note in the report.
    let why = run.expect("LCOV_WHY");
    assert!(
        why.starts_with("# vmlinux: no source lines: no debug file for vmlinux"),
        "{why}"
    );
    assert_eq!(
        run.expect("LCOV_ENTRY"),
        format!(
            "# BLOCK __x64_sys_getsid+0x0 {} {sid_calls}",
            blocks_of(&report, "__x64_sys_getsid")[0]["length"]
        )
    );
    assert!(report["notes"][0]
        .as_str()
        .is_some_and(|n| n.contains("symbol+offset records")));

    // Nothing left behind.
    assert_eq!(run.number("LIST_AFTER"), 0, "no splice listed after");
    assert_eq!(run.expect("TEXT_SAME"), "yes", "do_getsid's bytes are back");

    // The oracle: a kprobe at each armed site counts what the site counted.
    let sites: Vec<&Value> = report["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["site"].is_string())
        .collect();
    assert_eq!(run.number("KPROBES"), sites.len() as u64);
    assert!(sites.len() >= 10, "a sample of blocks: {}", sites.len());
    let probed: Vec<(String, u64)> = run
        .stdout
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix("KPROBE_HITS="))
        .map(|l| {
            let (site, hits) = l.split_once(' ').unwrap();
            (site.to_string(), hits.parse().unwrap_or(u64::MAX))
        })
        .collect();
    assert_eq!(probed.len(), sites.len());
    let mut hit_blocks = 0;
    for (b, (site, hits)) in sites.iter().zip(&probed) {
        assert_eq!(b["site"], site.as_str());
        assert_eq!(
            b["count"].as_u64(),
            Some(*hits),
            "the block at {site} ({} +{}) counted as the kprobe there",
            b["function"],
            b["offset"]
        );
        hit_blocks += usize::from(*hits > 0);
    }
    assert!(hit_blocks >= 3, "the oracle compared hit blocks too");

    // Once mode: the blocks hit are the count run's (the same command, twice over with a
    // second between), each counted from its first hit until the batch that disarmed it, so
    // the second round, after that batch, is not counted; nothing left behind.
    assert_eq!(
        run.number("ONCE_STATUS"),
        0,
        "{}",
        run.expect("ONCE_STDERR")
    );
    let once: Value = serde_json::from_str(run.expect("ONCE_JSON"))
        .unwrap_or_else(|e| panic!("ONCE_JSON is not JSON: {e}"));
    assert_eq!(once["mode"], "once");
    assert!(once["disarm_batches"].as_u64().unwrap_or(0) >= 1, "{once}");
    let hit_set = |r: &Value| -> Vec<(String, u64)> {
        r["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["hit"] == true)
            .map(|b| {
                (
                    b["function"].as_str().unwrap().to_string(),
                    b["offset"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(
        hit_set(&once),
        hit_set(&report),
        "blocks hit: once mode (left), count mode (right)"
    );
    let once_sid = calls(&run, "ONCE_SID_LOOP");
    let once_entry = blocks_of(&once, "__x64_sys_getsid")
        .into_iter()
        .find(|b| b["offset"] == 0)
        .expect("an entry block");
    let n = once_entry["count"].as_u64().expect("a count");
    assert!(
        (1..=once_sid).contains(&n),
        "getsid's entry counted from its first hit to its disarming, not the second round's {once_sid} calls: {once_entry}"
    );
    assert_eq!(once["total"]["refused"], report["total"]["refused"]);
    assert_eq!(run.number("ONCE_LIST_AFTER"), 0);
    assert_eq!(run.expect("ONCE_TEXT_SAME"), "yes");

    // SIGTERM: the report, then trapctl dies by the signal; no site left.
    assert_eq!(run.number("TERM_STATUS"), 128 + 15);
    let total = run.expect("TERM_TOTAL");
    assert!(total.contains("ended by SIGTERM"), "{total}");
    let row: Vec<&str> = run.expect("TERM_ROW").split_whitespace().collect();
    assert!(
        row.len() >= 4 && row[2] != "0",
        "__x64_sys_getsid covered: {row:?}"
    );
    assert_eq!(run.number("TERM_LIST_AFTER"), 0);

    // Without trapd, the covered command ran trapctl itself: its listing showed the sites, its
    // count splice was made and removed meanwhile, and the coverage's removal (after that
    // change of the state) left nothing.
    assert_eq!(
        run.number("INNER_STATUS"),
        0,
        "{}",
        run.expect("INNER_STDERR")
    );
    let armed = run.number("INNER_ARMED");
    assert!(armed >= 2, "{}", run.expect("INNER_STDERR"));
    assert_eq!(
        run.number("INNER_LISTED"),
        armed,
        "the command listed the sites"
    );
    let inner = run.expect("INNER_COUNT");
    let n: u64 = inner
        .strip_prefix("__x64_sys_getppid: ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the command's own count: {inner}"));
    assert!(n >= 51, "ppidloop -n 50 calls getppid 51 times: {inner}");
    assert_eq!(run.number("INNER_LEFT"), 0);
    assert_eq!(run.expect("INNER_TEXT_SAME"), "yes");

    // Through trapd: one apply, one remove; the same exact count, nothing left.
    assert_eq!(
        run.number("TRAPD_STATUS"),
        0,
        "{}",
        run.expect("TRAPD_STDERR")
    );
    let td: Value = serde_json::from_str(run.expect("TRAPD_JSON"))
        .unwrap_or_else(|e| panic!("TRAPD_JSON is not JSON: {e}"));
    check_stages(&td, "through trapd");
    let td_entry = blocks_of(&td, "__x64_sys_getsid")
        .into_iter()
        .find(|b| b["offset"] == 0)
        .expect("an entry block");
    assert_eq!(
        td_entry["count"].as_u64(),
        Some(calls(&run, "TRAPD_SID_LOOP")),
        "{td_entry}"
    );
    assert_eq!(run.number("TRAPD_LEFT"), 0, "trapd lists no splice after");
    assert_eq!(
        run.number("TRAPD_ONCE_STATUS"),
        0,
        "{}",
        run.expect("TRAPD_ONCE_STDERR")
    );
    let tonce: Value = serde_json::from_str(run.expect("TRAPD_ONCE_JSON"))
        .unwrap_or_else(|e| panic!("TRAPD_ONCE_JSON is not JSON: {e}"));
    assert!(
        tonce["disarm_batches"].as_u64().unwrap_or(0) >= 1,
        "{tonce}"
    );
    let t_entry = blocks_of(&tonce, "__x64_sys_getsid")
        .into_iter()
        .find(|b| b["offset"] == 0)
        .expect("an entry block");
    let n = t_entry["count"].as_u64().expect("a count");
    let t_sid = calls(&run, "TRAPD_ONCE_SID_LOOP");
    assert!(
        n >= 1 && n <= t_sid,
        "through trapd, the first round at most: {t_entry}"
    );
    // Disarmed while the command ran: between its rounds trapd's `hits` answered no hit site,
    // and the sites it still read were exactly the blocks never hit (the second round hit no
    // armed site: it takes the first round's blocks); the same blocks hit as in count mode.
    assert!(
        run.value("TRAPD_ONCE_MID_TIMEOUT").is_none(),
        "the sites hit were disarmed while the command ran: {}",
        run.stdout
    );
    let armed = blocks_of(&tonce, "__x64_sys_getsid")
        .iter()
        .filter(|b| b["site"].is_string())
        .count() as u64;
    let hit: Vec<(String, u64)> = hit_set(&tonce);
    assert!(!hit.is_empty() && (hit.len() as u64) < armed, "{tonce}");
    assert_eq!(
        run.number("TRAPD_ONCE_MID_READ"),
        armed - hit.len() as u64,
        "live between the rounds: the {armed} armed less the {} hit",
        hit.len()
    );
    let counted: Vec<(String, u64)> = hit_set(&report)
        .into_iter()
        .filter(|(f, _)| f == "__x64_sys_getsid")
        .collect();
    assert_eq!(hit, counted, "blocks hit: once through trapd, count mode");
    assert_eq!(
        run.number("TRAPD_ONCE_LEFT"),
        0,
        "trapd lists no splice after once mode"
    );
    // A coverage killed by SIGKILL through trapd: its sites stay, orphaned; `unsplice
    // --orphans` removes every one in one `remove` request, and the text is as before.
    let armed = run.number("ORPHAN_ARMED");
    assert!(armed >= 2, "{}", run.stdout);
    assert_eq!(
        run.number("ORPHAN_LIVE"),
        armed,
        "the killed cover's sites stay"
    );
    assert_eq!(
        run.number("ORPHAN_MARKED"),
        armed,
        "each listed as orphaned"
    );
    assert_eq!(run.number("ORPHAN_UNSPLICE_STATUS"), 0, "{}", run.stdout);
    assert_eq!(
        run.expect("ORPHAN_UNSPLICED"),
        format!("unspliced {armed} orphaned splice(s)")
    );
    assert_eq!(
        run.expect("ORPHAN_REQUESTS").trim(),
        "remove",
        "one remove request, not one unsplice per orphan"
    );
    assert_eq!(run.number("ORPHAN_LEFT"), 0);
    assert_eq!(run.expect("ORPHAN_TEXT_SAME"), "yes");

    // Scale: over 1,000 functions, one batch each way.
    assert!(run.number("SCALE_FUNCS") > 1000);
    assert!(run.value("SCALE_FAILED").is_none(), "{}", run.stdout);
    let scale = run.expect("SCALE_TOTAL");
    assert!(
        scale.starts_with(&format!("total: {} function(s)", run.number("SCALE_FUNCS"))),
        "{scale}"
    );
    assert_eq!(run.number("SCALE_LIST_AFTER"), 0);

    let (compared, more_than_once) = process_oracle(&run, &prog);
    yama_refusals(&run);
    eprintln!(
        "cover --process: {compared} blocks of coverloop counted as uprobes there counted ({more_than_once} hit more than once)"
    );
    eprintln!(
        "cover: {} s for the syscall coverage; scale: {scale} ({} s in all); refusals: {}",
        run.number("COVER_SECONDS"),
        run.number("SCALE_SECONDS"),
        run.expect("SCALE_REFUSALS")
    );
}

/// `trapctl -p PID attach` as a user without CAP_SYS_PTRACE against a process of its own that is
/// not its descendant, at each yama `ptrace_scope` (issue 30, item 3): 1, 2 and 3 are refused
/// with yama's reason and what to change, before anything is done (no tracer left); at 0 the
/// same attach gets past yama to the next refusal (busybox's sleep is static), so the refusals
/// above are yama's and no other check's.
fn yama_refusals(run: &Run) {
    assert!(
        run.value("YAMA_MISSING").is_none(),
        "the guest has yama: {}",
        run.stdout
    );
    let refusal = |scope: u32, words: &[&str]| {
        let line = run.expect(&format!("YAMA_{scope}"));
        assert!(line.starts_with("1 "), "scope {scope}: exit 1: {line}");
        for w in words {
            assert!(line.contains(w), "scope {scope}: `{w}` in: {line}");
        }
    };
    refusal(
        1,
        &[
            "yama forbids it: kernel.yama.ptrace_scope is 1",
            "only a parent may trace its descendants",
            "sysctl kernel.yama.ptrace_scope=0",
        ],
    );
    refusal(
        2,
        &[
            "kernel.yama.ptrace_scope is 2 (admin-only attach)",
            "attach as root",
        ],
    );
    refusal(
        3,
        &[
            "kernel.yama.ptrace_scope is 3 (no attach at all, until reboot)",
            "LD_PRELOAD",
        ],
    );
    refusal(0, &["is statically linked"]);
    assert!(
        !run.expect("YAMA_0").contains("yama"),
        "scope 0 is not yama's refusal: {}",
        run.expect("YAMA_0")
    );
    assert_eq!(
        run.number("YAMA_TRACER"),
        0,
        "no tracer left on the process"
    );
}
