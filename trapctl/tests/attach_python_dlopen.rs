//! GOT hooks against a packaged dlopen (issue 30): Debian's python3 (`/usr/bin/python3 -I`,
//! non-PIE, `dlopen` reached through its PLT) is attached to before it imports `bz2`; a spec
//! with points in libbz2 (which only the `_bz2` extension module needs) and in the extension
//! itself waits for them. `import bz2` makes python3 dlopen `_bz2.cpython-*.so`, which brings
//! libbz2: the agent's hook on python3's `dlopen` GOT slot arms the points before the import
//! goes on, so every call is counted: `PyInit__bz2` once per import, `BZ2_bzCompressInit` once
//! per `bz2.compress` (one BZ2Compressor each), `BZ2_bzDecompressInit` once per
//! `bz2.decompress` of one stream. Detach puts the GOT slot back and the text as it was; python3
//! goes on. Needs /usr/bin/python3 (Debian's python3.11), readelf and the built agent.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

mod attach_common;
use attach_common::{mappings, text, trapctl};

const PYTHON: &str = "/usr/bin/python3";

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
        data = b"trapvec counts the calls of a library python3 dlopens " * 8
        packed = [bz2.compress(data) for _ in range(n)]
        ok = all(bz2.decompress(p) == data for p in packed)
        print("roundtrip", n, ok, flush=True)
"#;

struct Python {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Python {
    fn start() -> Python {
        let mut child = Command::new(PYTHON)
            .args(["-I", "-c", SCRIPT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("Debian's python3 (/usr/bin/python3) is needed");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Python {
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    fn say(&mut self, what: &str) -> String {
        writeln!(self.stdin.as_mut().unwrap(), "{what}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// Whether `object` (a file name's start) is mapped in the process.
    fn maps(&self, object: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{}/maps", self.child.id()))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .any(|p| p.rsplit('/').next().unwrap().starts_with(object))
    }

    /// The 8 bytes at `address` (python3 is not PIE: its addresses are the file's).
    fn word(&self, address: u64) -> [u8; 8] {
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.child.id())).unwrap();
        let mut b = [0u8; 8];
        mem.read_exact_at(&mut b, address).unwrap();
        b
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address of python3's GOT slot for `dlopen` (its `R_X86_64_JUMP_SLOT`), from readelf.
fn dlopen_slot() -> u64 {
    let exe = std::fs::canonicalize(PYTHON).unwrap();
    let o = Command::new("readelf")
        .arg("-rW")
        .arg(&exe)
        .output()
        .expect("readelf (binutils) is needed");
    let relocs = String::from_utf8_lossy(&o.stdout);
    let line = relocs
        .lines()
        .find(|l| l.contains("R_X86_64_JUMP_SLOT") && l.contains(" dlopen@"))
        .unwrap_or_else(|| panic!("{} has no JUMP_SLOT for dlopen:\n{relocs}", exe.display()));
    let elf_type = Command::new("readelf")
        .arg("-hW")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&elf_type.stdout).contains("EXEC (Executable file)"),
        "{} is expected to be non-PIE (Debian's python3.11 is)",
        exe.display()
    );
    u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap()
}

/// `trapctl -p PID list --json`: the hits of each splice by its point.
fn hits(pid: &str) -> Vec<(String, u64)> {
    let o = trapctl(&["-p", pid, "list", "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut out: Vec<(String, u64)> = v["splices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["at"].as_str().unwrap().to_string(),
                s["hits"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn points_in_a_library_python3_dlopens_after_attach_count_every_call() {
    let slot = dlopen_slot();
    let mut py = Python::start();
    let pid = py.pid();
    assert!(!py.maps("libbz2"), "libbz2 is loaded before the import");
    let slot_before = py.word(slot);
    let text_before = mappings(py.child.id());

    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec.toml");
    std::fs::write(
        &spec,
        "[[splice]]\nat = \"libbz2.so.1.0:BZ2_bzCompressInit\"\naction = \"count\"\n\n\
         [[splice]]\nat = \"libbz2.so.1.0:BZ2_bzDecompressInit\"\naction = \"count\"\n\n\
         [[splice]]\nat = \"_bz2:PyInit__bz2\"\naction = \"count\"\n",
    )
    .unwrap();
    let o = trapctl(&["-p", &pid, "apply", spec.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("waits for libbz2.so.1.0"), "{}", text(&o));
    assert!(said.contains("waits for _bz2"), "{}", text(&o));
    assert_ne!(
        py.word(slot),
        slot_before,
        "the agent hooks python3's dlopen GOT slot"
    );

    assert_eq!(py.say("import"), "imported");
    assert!(py.maps("libbz2"), "the import loaded libbz2");
    assert_eq!(py.say("roundtrip 25"), "roundtrip 25 True");
    assert_eq!(
        hits(&pid),
        [
            ("_bz2:PyInit__bz2".to_string(), 1),
            ("libbz2.so.1.0:BZ2_bzCompressInit".to_string(), 25),
            ("libbz2.so.1.0:BZ2_bzDecompressInit".to_string(), 25),
        ]
    );
    // A second import finds the module in sys.modules: no dlopen, no second PyInit.
    assert_eq!(py.say("import"), "imported");
    assert_eq!(py.say("roundtrip 7"), "roundtrip 7 True");
    assert_eq!(
        hits(&pid),
        [
            ("_bz2:PyInit__bz2".to_string(), 1),
            ("libbz2.so.1.0:BZ2_bzCompressInit".to_string(), 32),
            ("libbz2.so.1.0:BZ2_bzDecompressInit".to_string(), 32),
        ]
    );

    let o = trapctl(&["-p", &pid, "detach"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(py.word(slot), slot_before, "detach puts the GOT slot back");
    // The text of every mapping that was there before is as it was, and that of the two
    // objects the import brought is their files' bytes.
    let now = mappings(py.child.id());
    let mut loaded = std::collections::BTreeSet::new();
    for (line, bytes) in &now {
        let f: Vec<&str> = line.split_whitespace().collect();
        let name = f[5].rsplit('/').next().unwrap();
        if !(name.starts_with("libbz2") || name.starts_with("_bz2")) {
            continue;
        }
        let file = std::fs::File::open(f[5]).unwrap();
        let mut want = vec![0u8; bytes.len()];
        let offset = u64::from_str_radix(f[2], 16).unwrap();
        // The last page of the mapping may run past the file's end (zeroes).
        let n = file.read_at(&mut want, offset).unwrap();
        assert!(n > 0, "{line}");
        assert!(
            bytes[..n] == want[..n],
            "{line}: the text is not the file's after detach"
        );
        loaded.insert(name.split('.').next().unwrap().to_string());
    }
    // (A mapping the text writer made writable for a while may now be several.)
    assert_eq!(
        loaded.into_iter().collect::<Vec<_>>(),
        ["_bz2", "libbz2"],
        "libbz2's and _bz2's text after detach"
    );
    for (range, bytes) in &text_before {
        let same = now.iter().find(|(r, _)| r == range);
        assert!(
            same.is_some_and(|(_, b)| b == bytes),
            "{range} differs or is gone after detach"
        );
    }
    assert_eq!(py.say("roundtrip 3"), "roundtrip 3 True");
    drop(py.stdin.take());
    assert_eq!(py.child.wait().unwrap().code(), Some(0));
}
