//! Writes the seed inputs the campaign started from into fuzz/corpus/<harness>/seed-* (run by
//! hand: `cargo test --release -p trapvec-fuzz --test seeds -- --ignored`; needs `cc` and
//! `gzip`). Real objects compiled from the component-manager's fixtures, the example spec and
//! trapd configuration, the README's protocol examples, a fake kernel's state blob, small kernel
//! images and kallsyms, and function bytes from the fixtures.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn put(harness: &str, name: &str, data: &[u8]) {
    let dir = root().join("corpus").join(harness);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
}

fn cc(src: &Path, extra: &[&str], out: &Path) -> Vec<u8> {
    let status = Command::new("cc")
        .args(["-O2"])
        .args(extra)
        .arg("-I")
        .arg(root().join("../components/include"))
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed on {}", src.display());
    std::fs::read(out).unwrap()
}

/// The bytes of each sized function symbol of an object's `.text`.
fn functions(obj: &[u8]) -> Vec<(String, Vec<u8>)> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let file = object::File::parse(obj).unwrap();
    let mut out = Vec::new();
    for s in file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
    {
        let Some(idx) = s.section_index() else {
            continue;
        };
        let sec = file.section_by_index(idx).unwrap();
        let data = sec.data().unwrap();
        let off = usize::try_from(s.address() - sec.address()).unwrap();
        let len = usize::try_from(s.size()).unwrap();
        out.push((s.name().unwrap().to_string(), data[off..off + len].to_vec()));
    }
    out
}

#[test]
#[ignore = "writes the seed corpora; run by hand"]
fn write_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = root().join("../component-manager/tests/fixtures");

    // loader and analysis: the fixtures, plain and PIC.
    let mut names: Vec<_> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for src in names {
        let stem = src.file_stem().unwrap().to_str().unwrap().to_string();
        for (tag, extra) in [("", &["-c"][..]), ("-pic", &["-c", "-fPIC"][..])] {
            let out = tmp.path().join(format!("{stem}{tag}.o"));
            let Ok(obj) = std::panic::catch_unwind(|| cc(&src, extra, &out)) else {
                continue;
            };
            put("loader", &format!("{stem}{tag}"), &obj);
            if tag.is_empty() {
                for (i, (name, bytes)) in functions(&obj).into_iter().enumerate() {
                    // flags: user or kernel target, trampoline known; address; site.
                    let flags = if i % 2 == 0 { 0x10 } else { 0x1a };
                    let mut input = vec![flags];
                    input.extend(0x1000u64.to_le_bytes());
                    input.push(u8::try_from(i % 4).unwrap());
                    input.extend(bytes);
                    put("analysis", &format!("{stem}-{name}"), &input);
                }
            }
        }
    }

    // spec: the demo spec, a spec with sets and every key, a splice record.
    put(
        "spec",
        "demo.toml",
        &std::fs::read(root().join("../components/demo/spec.toml")).unwrap(),
    );
    put(
        "spec",
        "all.toml",
        b"[[component]]\npath = \"/c/a.o\"\ncrc32 = 0x1234abcd\n\n[[splice]]\nat = \"libc:puts@@GLIBC_2.2.5+0x4\"\naction = \"replace\"\nhandler = \"h\"\nmechanism = \"jmp\"\ncookie = 7\n\n[[set]]\nsymbol = \"v\"\nvalue = -1\nsize = 2\n\nat=0x401000;action=call;handler=h;mechanism=trap;cookie=0x10\n",
    );

    // protocol: the README's examples.
    for (i, line) in [
        r#"{"op":"status"}"#,
        r#"{"op":"list"}"#,
        r#"{"op":"load","path":"/components/mss_clamp.o","name":"m"}"#,
        r#"{"op":"unload","name":"mss_clamp"}"#,
        r#"{"op":"splice","at":"tcp_sync_mss","action":"replace","handler":"mss_clamp_tcp_sync_mss","mechanism":"jmp","cookie":3}"#,
        r#"{"op":"splice","at":"f+0x5","action":"count"}"#,
        r#"{"op":"unsplice","at":"tcp_sync_mss"}"#,
        r#"{"op":"unsplice","all":true}"#,
        r#"{"op":"apply","spec":"/etc/trapvec/spec.toml","best_effort":true}"#,
        r#"{"op":"set","symbol":"mss_clamp_mtu","value":"0x578","size":2}"#,
        r#"{"op":"get","symbol":"mss_clamp_mtu"}"#,
        r#"{"op":"activate","profile":"lossy"}"#,
    ]
    .iter()
    .enumerate()
    {
        put("protocol", &format!("{i:02}"), line.as_bytes());
    }

    // state: the blob of the prepared fake kernel, and an empty one.
    put(
        "state",
        "two-splices.json",
        &trapvec_fuzz::state::prepared().1,
    );
    put("state", "empty.json", br#"{"version":1,"next_splice":0,"components":{"components":{},"exports":{}},"splices":[],"orig":{}}"#);

    // bench: a small executable as the "vmlinux", gzip'd behind a header; its kallsyms.
    let src = tmp.path().join("k.c");
    std::fs::write(
        &src,
        "int a(int x){return x+1;}\nint b(int x){return a(x)*2;}\nint main(void){return b(1);}\n",
    )
    .unwrap();
    let elf = cc(
        &src,
        &[
            "-nostdlib",
            "-static",
            "-Wl,-e,main",
            "-Wl,--build-id=none",
            "-s",
        ],
        &tmp.path().join("k"),
    );
    let text_addr = {
        use object::{Object, ObjectSection};
        object::File::parse(&*elf)
            .unwrap()
            .section_by_name(".text")
            .unwrap()
            .address()
    };
    let kallsyms = format!(
        "{:016x} T _text\n{:016x} T a\n{:016x} T b\n{:016x} T _etext\n{:016x} t helper\t[mod]\n",
        text_addr,
        text_addr,
        text_addr + 0x10,
        text_addr + 0x30,
        0xffff_ffff_c000_0000u64
    );
    let gz = {
        let mut child = Command::new("gzip")
            .arg("-9c")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&elf).unwrap();
        child.wait_with_output().unwrap().stdout
    };
    let mut image = vec![0u8];
    image.extend(b"MZ\0\0HdrS bzImage header\0\0\0\0");
    image.extend(&gz);
    image.extend([0u8; 16]);
    put("bench", "0-gzip-image", &image);
    let mut k1 = vec![1u8];
    k1.extend(kallsyms.as_bytes());
    put("bench", "1-kallsyms", &k1);
    let mut k2 = vec![2u8];
    k2.extend(u16::try_from(elf.len()).unwrap().to_le_bytes());
    k2.extend(&elf);
    k2.extend(kallsyms.as_bytes());
    put("bench", "2-elf-kallsyms", &k2);
    let dump = {
        let mut child = Command::new("gzip")
            .arg("-9c")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(kallsyms.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap().stdout
    };
    let b64 = Command::new("base64")
        .arg("-w")
        .arg("76")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let b64 = {
        use std::io::Write;
        let mut b64 = b64;
        b64.stdin.take().unwrap().write_all(&dump).unwrap();
        String::from_utf8(b64.wait_with_output().unwrap().stdout).unwrap()
    };
    let md5 = bench::kernel::md5_hex(kallsyms.as_bytes());
    let console = format!("[    1.0] booting\r\nBENCH-KALLSYMS-MD5 {md5}\r\nBENCH-KALLSYMS-BEGIN\r\n{b64}BENCH-KALLSYMS-END\r\n");
    let mut k3 = vec![3u8];
    k3.extend(console.as_bytes());
    put("bench", "3-console", &k3);
}

/// The `landing` seeds: the agent's C++ exception fixture (built with g++) as memory from its
/// `.eh_frame_hdr` to the end of its `.gcc_except_table`, asked about each function with landing
/// pads, and LSDAs alone (`.gcc_except_table` from each of its LSDAs on).
#[test]
#[ignore = "writes the seed corpus; run by hand (needs g++)"]
fn write_landing_seeds() {
    use object::{Object, ObjectSection, ObjectSymbol};
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("eh");
    let fixtures = root().join("../agent/tests/fixtures");
    let status = Command::new("g++")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(fixtures.join("eh.cc"))
        .arg(fixtures.join("eh_pad.S"))
        .status()
        .expect("running g++");
    assert!(status.success());
    let data = std::fs::read(&exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let hdr = file.section_by_name(".eh_frame_hdr").unwrap();
    let except = file.section_by_name(".gcc_except_table").unwrap();
    let (lo, hi) = (
        hdr.file_range().unwrap().0,
        except.file_range().map(|(o, n)| o + n).unwrap(),
    );
    assert_eq!(
        hdr.file_range().unwrap().0,
        hdr.address(),
        "file offsets are addresses in that segment"
    );
    let image = &data[usize::try_from(lo).unwrap()..usize::try_from(hi).unwrap()];
    for name in ["with_cleanup", "catcher", "padded_catch", "thrower.cold"] {
        let sym = file.symbols().find(|s| s.name() == Ok(name)).unwrap();
        let mut input = vec![1u8];
        input.extend(hdr.address().to_le_bytes());
        input.extend(sym.address().to_le_bytes());
        input.extend(hdr.size().to_le_bytes());
        input.extend(image);
        put("landing", &format!("image-{name}"), &input);
    }
    // LSDAs start 4-byte aligned in .gcc_except_table; each one's first bytes, from its start.
    let table = except.data().unwrap();
    for (i, off) in (0..table.len())
        .step_by(4)
        .filter(|&o| table[o] == 0xff)
        .take(6)
        .enumerate()
    {
        let mut input = vec![0u8];
        input.extend((except.address() + off as u64).to_le_bytes());
        input.extend(0x1000u64.to_le_bytes());
        input.extend(0u64.to_le_bytes());
        input.extend(&table[off..]);
        put("landing", &format!("lsda-{i}"), &input);
    }
}
