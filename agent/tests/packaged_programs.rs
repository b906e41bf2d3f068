//! The agent in packaged Debian programs and libraries nobody here wrote, with kernel uprobes as
//! the oracle: for each program, a point in it or in a real shared library, spliced by trap and
//! by jmp; the hits must equal what a uprobe on the same address counts in an unspliced run of
//! the same work, and the output must be byte-identical to the unspliced run's.
//!
//! Programs: `xz -T4` and `pigz -p4` (worker threads created with every signal blocked; liblzma's
//! `lzma_block_header_encode` and zlib's `crc32`), `python3 -X faulthandler` (its own SIGSEGV handler), `dash`
//! running external commands (fork and exec), `make` running recipes (fork and exec),
//! `sqlite3` (libsqlite3's `sqlite3_step`), `bash`.
//!
//! The uprobe comparison needs tracefs (`/sys/kernel/tracing`, mounted, writable: root). Where
//! it is missing the comparison is skipped with a message on stderr, also under `CI=true`: CI
//! containers often have no tracefs, and the splice counts are still checked against the work's
//! own figures where it has them. Where tracefs is there, a uprobe that does not fire (0 hits)
//! fails the test. A missing program fails under `CI=true` (`.ci/install-deps` installs them)
//! and is skipped with a message otherwise.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use object::{Object, ObjectSegment};

mod common;
use common::{agent, count_component};

fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// One program run: its command line, its input and the point to splice.
struct Case {
    name: &'static str,
    argv: Vec<String>,
    stdin: Vec<u8>,
    /// The spec's point (`object:symbol`).
    point: &'static str,
    /// The file defining the symbol, for the uprobe.
    file: String,
    symbol: &'static str,
    /// Hits the work makes, where the test knows them beforehand.
    expected: Option<u64>,
}

/// Deterministic, compressible input of `n` bytes.
fn data(n: usize) -> Vec<u8> {
    let mut x: u32 = 12345;
    (0..n)
        .map(|i| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            if i % 3 == 0 {
                b'a' + u8::try_from((x >> 16) % 16).unwrap()
            } else {
                b"the quick brown fox "[i % 20]
            }
        })
        .collect()
}

fn lib(name: &str) -> String {
    std::fs::canonicalize(Path::new("/usr/lib/x86_64-linux-gnu").join(name))
        .unwrap()
        .display()
        .to_string()
}

/// The file offset of `symbol`'s code in `file` (its default version, `sym@@VER`, as the
/// dynamic linker binds it), as uprobes want it; read with binutils' `readelf`.
fn file_offset(file: &str, symbol: &str) -> u64 {
    let out = Command::new("readelf")
        .args(["-W", "--dyn-syms", file])
        .output()
        .expect("readelf (binutils) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let addr = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[3] == "FUNC" && f[6] != "UND").then(|| (f[1], f[7]))
        })
        .find(|(_, name)| {
            *name == symbol
                || name
                    .strip_prefix(symbol)
                    .is_some_and(|v| v.starts_with("@@"))
        })
        .map(|(a, _)| u64::from_str_radix(a, 16).unwrap())
        .unwrap_or_else(|| panic!("{file} exports no function {symbol}"));
    let bytes = std::fs::read(file).unwrap();
    let obj = object::File::parse(&*bytes).unwrap();
    let seg = obj
        .segments()
        .find(|s| s.address() <= addr && addr < s.address() + s.size())
        .unwrap_or_else(|| panic!("{file}: {symbol} at {addr:#x} lies in no segment"));
    addr - seg.address() + seg.file_range().0
}

fn which(prog: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!p.is_empty()).then(|| {
        std::fs::canonicalize(&p)
            .map(|p| p.display().to_string())
            .unwrap_or(p)
    })
}

struct Out {
    stdout: Vec<u8>,
    stderr: String,
    code: Option<i32>,
    pid: u32,
}

fn run(dir: &Path, c: &Case, agent_spec: Option<&str>) -> Out {
    let mut cmd = Command::new(&c.argv[0]);
    cmd.args(&c.argv[1..])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let stats = dir.join("stats.json");
    let _ = std::fs::remove_file(&stats);
    if let Some(spec) = agent_spec {
        let spec_path = dir.join("spec.toml");
        std::fs::write(&spec_path, spec).unwrap();
        cmd.env("LD_PRELOAD", agent())
            .env("TRAPVEC_SPEC", &spec_path)
            .env("TRAPVEC_STATS", &stats);
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let input = c.stdin.clone();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    Out {
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code(),
        pid,
    }
}

/// A uprobe on one file offset, counted per process in a tracing instance of its own.
struct Uprobe {
    root: PathBuf,
    group: String,
}

const TRACEFS: &str = "/sys/kernel/tracing";

impl Uprobe {
    /// `Err(reason)` when the machine offers no uprobes.
    fn new(file: &str, offset: u64) -> Result<Uprobe, String> {
        let root = PathBuf::from(TRACEFS);
        let events = root.join("uprobe_events");
        if !events.exists() {
            return Err(format!(
                "{} does not exist (tracefs not mounted, or no CONFIG_UPROBE_EVENTS)",
                events.display()
            ));
        }
        let group = format!("trapvec_pp{}", std::process::id());
        let def = format!("p:{group}/hit {file}:{offset:#x}\n");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&events)
            .map_err(|e| format!("{}: {e}", events.display()))?;
        std::io::Write::write_all(&mut f, def.as_bytes())
            .map_err(|e| format!("adding {def:?} to {}: {e}", events.display()))?;
        let u = Uprobe { root, group };
        std::fs::create_dir(u.instance())
            .map_err(|e| format!("{}: {e}", u.instance().display()))?;
        std::fs::write(u.instance().join("options/record-tgid"), "1")
            .map_err(|e| format!("record-tgid: {e}"))?;
        std::fs::write(u.instance().join("buffer_size_kb"), "16384")
            .map_err(|e| format!("buffer_size_kb: {e}"))?;
        std::fs::write(
            u.instance().join(format!("events/{}/hit/enable", u.group)),
            "1",
        )
        .map_err(|e| format!("enabling the uprobe: {e}"))?;
        Ok(u)
    }

    fn instance(&self) -> PathBuf {
        self.root.join("instances").join(&self.group)
    }

    /// Hits by threads of process `tgid` since the last call (the buffer is cleared).
    fn take(&self, tgid: u32) -> u64 {
        let trace = std::fs::read_to_string(self.instance().join("trace")).unwrap();
        let lost = trace
            .lines()
            .find(|l| l.contains("entries-in-buffer"))
            .map(str::to_string);
        std::fs::write(self.instance().join("trace"), "").unwrap();
        let tag = format!("({tgid:>7})");
        let n = trace
            .lines()
            .filter(|l| {
                !l.starts_with('#') && l.contains(&tag) && l.contains(&format!("{}: (", "hit"))
            })
            .count() as u64;
        // `entries-in-buffer/entries-written: a/b`: a < b means the buffer overflowed.
        if let Some(l) = lost {
            let nums: Vec<&str> = l
                .split(':')
                .nth(1)
                .unwrap_or("")
                .split_whitespace()
                .next()
                .unwrap_or("")
                .split('/')
                .collect();
            assert!(
                nums.len() != 2 || nums[0] == nums[1],
                "the trace buffer lost events: {l}"
            );
        }
        n
    }
}

impl Drop for Uprobe {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.instance()
                .join(format!("events/{}/hit/enable", self.group)),
            "0",
        );
        let _ = std::fs::remove_dir(self.instance());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .append(true)
            .open(self.root.join("uprobe_events"))
        {
            let _ = std::io::Write::write_all(&mut f, format!("-:{}/hit\n", self.group).as_bytes());
        }
    }
}

fn cases(dir: &Path) -> Vec<Case> {
    let mut v = Vec::new();
    let need = |prog: &str| {
        let p = which(prog);
        if p.is_none() {
            assert!(!ci(), "{prog} is missing (.ci/install-deps installs it)");
            eprintln!("skipped: {prog} is not installed");
        }
        p
    };
    // Compressors read a file, not a pipe: how much a read from a pipe returns depends on timing,
    // and they checksum what each read returns.
    let input = dir.join("input.txt");
    std::fs::write(&input, data(6 << 20)).unwrap();
    let input = input.display().to_string();
    if let Some(xz) = need("xz") {
        v.push(Case {
            name: "xz -T4",
            argv: vec![
                xz,
                "-T4".into(),
                "--block-size=262144".into(),
                "-c".into(),
                input.clone(),
            ],
            stdin: Vec::new(),
            // Once per block, in the worker threads (lzma_crc64 is called per chunk handed over
            // between threads, which depends on timing).
            point: "liblzma:lzma_block_header_encode",
            file: lib("liblzma.so.5"),
            symbol: "lzma_block_header_encode",
            expected: Some(24),
        });
    }
    if let Some(pigz) = need("pigz") {
        v.push(Case {
            name: "pigz -p4",
            argv: vec![pigz, "-p4".into(), "-c".into(), input.clone()],
            stdin: Vec::new(),
            point: "libz:crc32",
            file: lib("libz.so.1"),
            symbol: "crc32",
            expected: None,
        });
    }
    if let Some(py) = need("/usr/bin/python3") {
        v.push(Case {
            name: "python3 -X faulthandler",
            argv: vec![py, "-X".into(), "faulthandler".into(), "-c".into(),
                "import os, faulthandler; assert faulthandler.is_enabled(); print(sum(os.getppid() > 0 for _ in range(1000)))".into()],
            stdin: Vec::new(),
            // Not getpid: the agent calls that itself.
            point: "libc:getppid",
            file: lib("libc.so.6"),
            symbol: "getppid",
            expected: Some(1000),
        });
    }
    if let Some(dash) = need("dash") {
        v.push(Case {
            name: "dash (fork+exec)",
            argv: vec![
                dash,
                "-c".into(),
                "i=0; while [ $i -lt 25 ]; do /bin/true; i=$((i+1)); done; echo $i | cat".into(),
            ],
            stdin: Vec::new(),
            point: "libc:fork",
            file: lib("libc.so.6"),
            symbol: "fork",
            expected: None,
        });
    }
    if let Some(bash) = need("bash") {
        v.push(Case {
            name: "bash",
            argv: vec![
                bash,
                "--norc".into(),
                "-c".into(),
                "for i in $(seq 1 40); do x=$(printf '%s' $i); done; echo $x".into(),
            ],
            stdin: Vec::new(),
            point: "libc:fork",
            file: lib("libc.so.6"),
            symbol: "fork",
            expected: None,
        });
    }
    if let Some(make) = need("make") {
        let mk = dir.join("Makefile");
        let mut text = String::from("all:");
        for i in 0..12 {
            text.push_str(&format!(" t{i}"));
        }
        text.push('\n');
        for i in 0..12 {
            text.push_str(&format!("t{i}:\n\t@echo target {i} | tr a-z A-Z\n"));
        }
        std::fs::write(&mk, text).unwrap();
        v.push(Case {
            name: "make (recipes)",
            argv: vec![
                make,
                "-s".into(),
                "-j1".into(),
                "-f".into(),
                mk.display().to_string(),
            ],
            stdin: Vec::new(),
            // make 4.3 starts its recipes with posix_spawn (not getenv: the agent calls that).
            // Under the agent the calls reach the agent's posix_spawn, which starts the child
            // itself (glibc's would share the spliced memory): that is where they are counted;
            // the uprobe of the unspliced run counts glibc's.
            point: "libtrapvec_agent:posix_spawn",
            file: lib("libc.so.6"),
            symbol: "posix_spawn",
            expected: Some(12),
        });
    }
    if let Some(sqlite3) = need("sqlite3") {
        let mut sql = String::from("create table t(a, b);\nbegin;\n");
        for i in 0..500 {
            sql.push_str(&format!("insert into t values({i}, 'row {i}');\n"));
        }
        sql.push_str("commit;\nselect count(*), sum(a) from t;\n");
        v.push(Case {
            name: "sqlite3 (libsqlite3)",
            argv: vec![sqlite3, ":memory:".into()],
            stdin: sql.into_bytes(),
            point: "libsqlite3:sqlite3_step",
            file: lib("libsqlite3.so.0"),
            symbol: "sqlite3_step",
            expected: None,
        });
    }
    v
}

#[test]
fn packaged_programs_count_as_uprobes_do_and_their_output_does_not_change() {
    let dir = tempfile::tempdir().unwrap();
    count_component(dir.path());
    let mut table = Vec::new();
    for c in cases(dir.path()) {
        let offset = file_offset(&c.file, c.symbol);
        // The unspliced run, with the uprobe when the machine has them.
        let probe = Uprobe::new(&c.file, offset);
        if let Err(why) = &probe {
            eprintln!("{}: uprobe comparison skipped: {why}", c.name);
        }
        let base = run(dir.path(), &c, None);
        assert_eq!(
            base.code,
            Some(0),
            "{}: unspliced run failed: {}",
            c.name,
            base.stderr
        );
        let uprobe_hits = probe.as_ref().ok().map(|u| u.take(base.pid));
        drop(probe);
        if let Some(u) = uprobe_hits {
            assert!(
                u > 0,
                "{}: the uprobe on {}:{offset:#x} did not fire",
                c.name,
                c.file
            );
        }
        for mech in ["trap", "jmp"] {
            let spec = format!(
                "[[component]]\npath = \"count.o\"\n\n[[splice]]\nat = \"{}\"\naction = \"call\"\nhandler = \"count\"\nmechanism = \"{mech}\"\n",
                c.point
            );
            let r = run(dir.path(), &c, Some(&spec));
            assert_eq!(r.code, Some(0), "{} by {mech}: {}", c.name, r.stderr);
            let stats: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(dir.path().join("stats.json")).unwrap_or_else(|e| {
                    panic!("{} by {mech}: no stats: {e}; {}", c.name, r.stderr)
                }),
            )
            .unwrap();
            let hits = stats["splices"][0]["hits"].as_u64().unwrap();
            let identical = r.stdout == base.stdout;
            assert!(
                identical,
                "{} by {mech}: output differs from the unspliced run ({} vs {} bytes)",
                c.name,
                r.stdout.len(),
                base.stdout.len()
            );
            assert!(hits > 0, "{} by {mech}: no hits", c.name);
            if let Some(u) = uprobe_hits {
                assert_eq!(
                    hits, u,
                    "{} by {mech}: {} hits, the uprobe counted {u}",
                    c.name, c.point
                );
            }
            if let Some(e) = c.expected {
                assert_eq!(hits, e, "{} by {mech}", c.name);
            }
            table.push(format!(
                "| {} | {} ({}:{offset:#x}) | {mech} | {hits} | {} | {} |",
                c.name,
                c.point,
                Path::new(&c.file).file_name().unwrap().to_string_lossy(),
                uprobe_hits.map_or("skipped".to_string(), |u| u.to_string()),
                if identical { "yes" } else { "no" }
            ));
        }
    }
    eprintln!("| program | point | mechanism | hits | uprobe hits | output identical |\n|---|---|---|---|---|---|\n{}", table.join("\n"));
}
