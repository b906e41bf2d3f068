//! The process backend on its own: traps redirect through the dispatch table, text batches are
//! all-or-nothing and restore byte for byte, repository blocks are executable and sealed.

use std::ffi::CString;
use std::process::Command;

use trapvec::abi::TRAP_BYTES;
use trapvec::process::ProcessTarget;
use trapvec::{BlockKind, DispatchEntry, Target, TargetError, TargetExt, TextPatch};

/// Assemble and load a shared object; returns the addresses of `names`.
fn load_asm(tag: &str, src: &str, names: &[&str]) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap().keep();
    let s = dir.join(format!("{tag}.S"));
    let so = dir.join(format!("lib{tag}.so"));
    std::fs::write(&s, src).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-nostdlib", "-o"])
        .arg(&so)
        .arg(&s)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = CString::new(so.to_str().unwrap()).unwrap();
    // SAFETY: loading a library we just built; it has no constructors.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null());
    names
        .iter()
        .map(|n| {
            let c = CString::new(*n).unwrap();
            // SAFETY: `h` is a live handle.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            assert!(!p.is_null(), "{n}");
            p as u64
        })
        .collect()
}

const FIXTURE: &str = r#"
    .text
    .globl forty_two, seven
    .type forty_two,@function
forty_two:
    mov $42, %eax
    ret
    .size forty_two, .-forty_two
    .type seven,@function
seven:
    mov $7, %eax
    ret
    .size seven, .-seven
"#;

fn call(addr: u64) -> u32 {
    // SAFETY: `addr` is a function of the fixture with the C signature `unsigned (void)`.
    let f: extern "C" fn() -> u32 = unsafe { std::mem::transmute(usize::try_from(addr).unwrap()) };
    f()
}

#[test]
fn trap_redirects_through_dispatch_table_and_restores_bytes() {
    let fns = load_asm("redirect", FIXTURE, &["forty_two", "seven"]);
    let (f, g) = (fns[0], fns[1]);
    let mut t = ProcessTarget::new().unwrap();
    let before = t.read(f, 2).unwrap();
    assert_eq!(call(f), 42);

    t.add_dispatch(&[DispatchEntry {
        site: f,
        dest: g,
        handler: 0,
        cookie: 0,
        only: None,
    }])
    .unwrap();
    let patch = TextPatch {
        addr: f,
        old: before.clone(),
        new: TRAP_BYTES.to_vec(),
    };
    t.patch_text(std::slice::from_ref(&patch)).unwrap();
    assert_eq!(t.read(f, 2).unwrap(), TRAP_BYTES);
    let redirected = trapvec::process::trap_stats().redirected;
    for _ in 0..100 {
        assert_eq!(call(f), 7);
    }
    assert!(trapvec::process::trap_stats().redirected >= redirected + 100);

    t.patch_text(&[patch.inverse()]).unwrap();
    t.remove_dispatch(&[f]).unwrap();
    assert_eq!(t.read(f, 2).unwrap(), before);
    assert_eq!(call(f), 42);
}

#[test]
fn batch_with_one_stale_expectation_writes_nothing() {
    let fns = load_asm("stale", FIXTURE, &["forty_two", "seven"]);
    let mut t = ProcessTarget::new().unwrap();
    let a = t.read(fns[0], 2).unwrap();
    let b = t.read(fns[1], 2).unwrap();
    let good = TextPatch {
        addr: fns[0],
        old: a.clone(),
        new: vec![0x90, 0x90],
    };
    let bad = TextPatch {
        addr: fns[1],
        old: vec![0xAA, 0xBB],
        new: vec![0x90, 0x90],
    };
    let err = t.patch_text(&[good, bad]).unwrap_err();
    assert!(
        matches!(err, TargetError::TextMismatch { addr, .. } if addr == fns[1]),
        "{err}"
    );
    assert!(err.to_string().contains("aa bb"), "{err}");
    assert_eq!(t.read(fns[0], 2).unwrap(), a);
    assert_eq!(t.read(fns[1], 2).unwrap(), b);
}

#[test]
fn code_blocks_run_near_the_target_and_refuse_writes_once_sealed() {
    let fns = load_asm("blocks", FIXTURE, &["forty_two"]);
    let mut t = ProcessTarget::new().unwrap();
    let blk = t.alloc(fns[0], 64, BlockKind::Code).unwrap();
    assert!(blk.addr.abs_diff(fns[0]) < (1 << 31));
    // mov eax, 99; ret
    t.write(&blk, 0, &[0xB8, 99, 0, 0, 0, 0xC3]).unwrap();
    t.seal(&blk).unwrap();
    assert_eq!(call(blk.addr), 99);
    let err = t.write(&blk, 0, &[0xC3]).unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");
    let data = t.alloc(fns[0], 8, BlockKind::Data).unwrap();
    t.write(&data, 0, &5u64.to_le_bytes()).unwrap();
    assert_eq!(t.read(data.addr, 8).unwrap(), 5u64.to_le_bytes());
    t.free(&blk).unwrap();
    t.free(&data).unwrap();
    assert!(t.free(&data).is_err(), "double free is refused");
}

#[test]
fn reading_unmapped_memory_is_an_error_naming_the_address() {
    let t = ProcessTarget::new().unwrap();
    let err = t.read(0x10, 4).unwrap_err();
    assert!(err.to_string().contains("0x10"), "{err}");
}
