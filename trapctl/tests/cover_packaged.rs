//! Coverage of a packaged library a packaged program loads while covered (issue 27, item 4):
//! Debian's python3 (`/usr/bin/python3 -I`) loads libbz2 only at `import bz2`, when it dlopens
//! the `_bz2` extension module, which links libbz2.so.1.0. `trapctl cover --process
//! 'libbz2.so.1.0:*'` finds the library as the loader would, lists its blocks, and the agent arms
//! them at that dlopen: libbz2's compression and decompression functions are reported covered,
//! their entry blocks with one hit per stream, and the functions the script never reaches at 0;
//! python3 prints what an uncovered run prints. `trapctl -p PID cover` does the same for a
//! python3 that is already running and imports bz2 only after the coverage began, and python3
//! goes on afterwards. And python3's own code, whose unnamed cold parts jump back into the middle
//! of its functions, is covered with python3 running as it does uncovered. Needs /usr/bin/python3 (with libbz2-1.0, `.ci/install-deps`) and the built
//! agent.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

mod attach_common;
use attach_common::{agent, spawn_piped, text};

const PYTHON: &str = "/usr/bin/python3";

/// Compresses a fixed buffer `n` times (one `BZ2Compressor`, so one `BZ2_bzCompressInit`, each),
/// decompresses each result (one `BZ2_bzDecompressInit` each) and prints a digest of the bytes.
fn roundtrip_script(n: u32) -> String {
    format!(
        "import bz2, hashlib\n\
         data = b'trapvec covers a library python3 loads with dlopen ' * 64\n\
         packed = [bz2.compress(data) for _ in range({n})]\n\
         ok = all(bz2.decompress(p) == data for p in packed)\n\
         print(len(packed[0]), ok, hashlib.sha256(packed[0]).hexdigest())\n"
    )
}

/// The blocks of libbz2's `function` in a report.
fn blocks_of<'a>(report: &'a Value, function: &str) -> Vec<&'a Value> {
    report["blocks"]
        .as_array()
        .expect("blocks is a list")
        .iter()
        .filter(|b| b["function"] == function)
        .inspect(|b| {
            let object = b["object"].as_str().unwrap_or_default();
            assert!(object.contains("/libbz2.so.1.0"), "{b}");
        })
        .collect()
}

/// The row of `function` in a report's per-function table.
fn row<'a>(report: &'a Value, function: &str) -> &'a Value {
    report["functions"]
        .as_array()
        .expect("functions is a list")
        .iter()
        .find(|f| f["function"] == function)
        .unwrap_or_else(|| panic!("no row for {function}"))
}

/// The hits of `function`'s entry block (offset 0).
fn entry_hits(report: &Value, function: &str) -> u64 {
    let b = blocks_of(report, function);
    let entry = b
        .iter()
        .find(|b| b["offset"] == 0)
        .unwrap_or_else(|| panic!("{function} has no entry block: {b:?}"));
    entry["hits"]
        .as_u64()
        .unwrap_or_else(|| panic!("{function}'s entry block had no site: {entry}"))
}

/// What both forms must report of libbz2 after `n` round trips made while covered.
fn assert_libbz2_covered(report: &Value, n: u64) {
    for f in ["BZ2_bzCompress", "BZ2_bzCompressInit", "BZ2_bzDecompress"] {
        let r = row(report, f);
        assert!(
            r["blocks"].as_u64().unwrap() > 0 && r["covered"].as_u64().unwrap() > 0,
            "{f} covered: {r}"
        );
    }
    assert_eq!(
        entry_hits(report, "BZ2_bzCompressInit"),
        n,
        "one per stream"
    );
    assert_eq!(
        entry_hits(report, "BZ2_bzDecompressInit"),
        n,
        "one per stream"
    );
    // The stdio interface (BZ2_bzopen and its kin) is never reached from _bz2.
    let open = row(report, "BZ2_bzopen");
    assert_eq!(open["covered"], 0, "{open}");
    assert!(blocks_of(report, "BZ2_bzopen")
        .iter()
        .all(|b| b["hit"] == false));
}

#[test]
fn a_library_python3_dlopens_at_import_is_covered_and_python3_prints_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let script = roundtrip_script(5);
    let plain = Command::new(PYTHON)
        .args(["-I", "-c", &script])
        .output()
        .expect("Debian's python3 (/usr/bin/python3) is needed");
    assert!(plain.status.success(), "{}", text(&plain));
    let report_path = dir.path().join("report.json");
    let covered = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .args(["cover", "--agent"])
        .arg(agent())
        .args(["--process", "libbz2.so.1.0:*", "--json", "-o"])
        .arg(&report_path)
        .args(["--", PYTHON, "-I", "-c", &script])
        .output()
        .unwrap();
    assert!(covered.status.success(), "{}", text(&covered));
    assert_eq!(
        String::from_utf8_lossy(&covered.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "python3's output under coverage is that of the uncovered run"
    );
    assert!(String::from_utf8_lossy(&plain.stdout).contains(" True "));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["exit"], 0);
    assert_libbz2_covered(&report, 5);
    let total = &report["total"];
    assert!(
        total["covered"].as_u64().unwrap() > 50,
        "many blocks of libbz2 covered: {total}"
    );
}

#[test]
fn a_running_python3_that_imports_bz2_after_the_cover_began_is_covered_and_goes_on() {
    const SCRIPT: &str = r#"
import sys
print("ready", flush=True)
for line in sys.stdin:
    w = line.split()
    if w[0] == "import":
        import bz2
        print("imported", flush=True)
    elif w[0] == "roundtrip":
        n = int(w[1])
        data = b"trapvec covers a library python3 loads with dlopen " * 64
        packed = [bz2.compress(data) for _ in range(n)]
        print("roundtrip", n, all(bz2.decompress(p) == data for p in packed), flush=True)
"#;
    let (mut py, mut stdin, mut stdout, ready) =
        spawn_piped(Command::new(PYTHON).args(["-I", "-c", SCRIPT]));
    assert_eq!(ready, "ready\n");
    let mut say = |what: &str| -> String {
        writeln!(stdin, "{what}").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    };
    let maps = || std::fs::read_to_string(format!("/proc/{}/maps", py.id())).unwrap();
    assert!(
        !maps().contains("libbz2"),
        "libbz2 is loaded before the import"
    );

    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("report.json");
    let mut t = Command::new(env!("CARGO_BIN_EXE_trapctl"))
        .env("TRAPVEC_AGENT", agent())
        .args(["-p", &py.id().to_string(), "cover", "libbz2.so.1.0:*"])
        .args(["--json", "-o"])
        .arg(&report_path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(t.stderr.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let _ = t.wait();
            panic!("trapctl -p cover ended before covering: {said}");
        }
        said.push_str(&line);
        if line.starts_with("covering ") {
            break;
        }
    }
    assert_eq!(say("import"), "imported");
    assert!(maps().contains("libbz2"), "the import loaded libbz2");
    assert_eq!(say("roundtrip 7"), "roundtrip 7 True");
    let status = Command::new("kill")
        .args(["-INT", &t.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut rest = String::new();
    let _ = err.read_to_string(&mut rest);
    said.push_str(&rest);
    let status = t.wait().unwrap();
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(&report_path)
            .unwrap_or_else(|e| panic!("no report ({e}): {status:?}: {said}")),
    )
    .unwrap();
    assert_libbz2_covered(&report, 7);

    // python3 goes on, libbz2 uncounted and working.
    assert_eq!(say("roundtrip 3"), "roundtrip 3 True");
    drop(stdin);
    assert!(py.wait().unwrap().success());
}

/// python3 itself: Debian's is built with PGO/LTO and stripped to `.dynsym`, and its functions'
/// cold parts, which have no names, jump back into their middles (`_Py_wreadlink`'s at
/// 0x44fbd9 to `_Py_wreadlink+0x55`, inside the jmp a block at +0x52 took before, where
/// python3 died of SIGSEGV as it started). Every block of the function and then of the whole
/// program is covered, and python3 prints what it prints uncovered.
#[test]
fn python3_s_cold_parts_jump_back_beside_the_windows_not_into_them() {
    assert!(
        std::path::Path::new(PYTHON).exists(),
        "Debian's python3 ({PYTHON}) is needed"
    );
    let image = instr_manager::image::CodeImage::from_path(std::path::Path::new(PYTHON)).unwrap();
    let f = image.symbols.lookup("_Py_wreadlink").unwrap();
    let read = |a: u64, n: usize| image.read(a, n).map(<[u8]>::to_vec);
    let (_, func) = instr_manager::cover::analyzed_in(
        f,
        image.symbols.function_extent(f),
        &read,
        image.object_targets(),
    )
    .unwrap();
    assert!(
        !func.outside_targets.is_empty(),
        "jumps into _Py_wreadlink from its cold part: {func:?}"
    );
    for (glob, script, say) in [
        ("_Py_wreadlink", "print(1)", "1\n"),
        (
            "*",
            "import json; print(json.dumps(list(range(10))))",
            "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let report_path = dir.path().join("report.json");
        let covered = Command::new(env!("CARGO_BIN_EXE_trapctl"))
            .args(["cover", "--agent"])
            .arg(agent())
            .args(["--process", "--mode", "count", glob, "--json", "-o"])
            .arg(&report_path)
            .args(["--", PYTHON, "-c", script])
            .output()
            .unwrap();
        assert!(covered.status.success(), "{glob}: {}", text(&covered));
        assert_eq!(String::from_utf8_lossy(&covered.stdout), say, "{glob}");
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
        assert_eq!(report["exit"], 0);
        let total = &report["total"];
        let refusals = total["refusals"].as_object().unwrap();
        assert!(!refusals.contains_key("agent_refused"), "{glob}: {total}");
        // Each address the cold part jumps to starts a block, which the run reached.
        let blocks: Vec<&Value> = report["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["function"] == "_Py_wreadlink")
            .collect();
        for t in func.outside_targets.keys() {
            assert!(
                blocks
                    .iter()
                    .any(|b| b["address"] == format!("{t:#x}") && b["hits"].as_u64() > Some(0)),
                "{glob}: no block hit at {t:#x}: {blocks:?}"
            );
        }
        if glob == "*" {
            assert!(
                total["functions"].as_u64().unwrap() > 1000
                    && total["covered"].as_u64().unwrap() > 5000,
                "{total}"
            );
        }
    }
}
