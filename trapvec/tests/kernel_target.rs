//! `KernelTarget` against the real module: runs where `/dev/trapvec` exists (the VM of
//! `kmod/tests/run.sh`, which builds this test statically and runs it as root in the guest);
//! elsewhere each test says why it does nothing.
//!
//! The splice is the one the C test builds: a trap at `__x64_sys_getppid+5` (+9 on 6.12, whose
//! functions begin with `endbr64`), over
//! `push rbx; call rel32`, with a replay trampoline `push rbx; call <callee>; jmp +11` written
//! into a code block of the module's arena; then the trap is reverted and everything freed.

use std::path::Path;

use trapvec::abi::TRAP_BYTES;
use trapvec::kernel::{KernelTarget, SiteRefusal, DEVICE_PATH};
use trapvec::{BlockKind, DispatchEntry, Target, TargetError, TargetExt, TextPatch, TrapHits};

const CALLS: u64 = 500;

fn target() -> Option<KernelTarget> {
    if !Path::new(DEVICE_PATH).exists() {
        eprintln!("{DEVICE_PATH} does not exist: this test runs in the VM of kmod/tests/run.sh");
        return None;
    }
    Some(KernelTarget::open().expect("opening the kernel target"))
}

fn rel32(from_next: u64, to: u64) -> [u8; 4] {
    i32::try_from(i128::from(to) - i128::from(from_next))
        .expect("rel32 in reach")
        .to_le_bytes()
}

/// The bytes a function's entry takes before its first instruction of its own: `endbr64` where
/// the kernel is built for IBT (6.12), then the 5-byte ftrace site (a NOP, or its call).
fn entry_len(text: &[u8]) -> u64 {
    let endbr = if text.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) {
        4
    } else {
        0
    };
    endbr + 5
}

fn getppid() -> i64 {
    // SAFETY: getppid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_getppid) }
}

#[test]
fn kernel_target_splices_getppid_through_the_trap_and_restores_it() {
    let Some(mut t) = target() else { return };
    let info = t.module_info().unwrap();
    assert_eq!(info.vector, 0xf5);
    assert_eq!(
        info.gate_handler, info.entry,
        "the module's gate is installed"
    );

    let func = t
        .symbols()
        .lookup("__x64_sys_getppid")
        .expect("__x64_sys_getppid in kallsyms")
        .addr;
    let orig = t.read(func, 16).unwrap();
    let e = entry_len(&orig);
    let site = func + e;
    let at = usize::try_from(e).unwrap();
    assert_eq!(
        orig[at..at + 2],
        [0x53, 0xe8],
        "push rbx; call rel32 at +{e}"
    );
    // The call is at site + 1; its rel32 counts from site + 6.
    let callee = (site + 6).wrapping_add_signed(i64::from(i32::from_le_bytes(
        orig[at + 2..at + 6].try_into().unwrap(),
    )));

    let fentry = site - 5;
    assert_eq!(
        t.check_site_with_kprobe(fentry, 2),
        Err(SiteRefusal::Ftrace)
    );
    assert_eq!(t.check_site_with_kprobe(site, 2), Ok(()));
    assert_eq!(
        t.check_site_with_kprobe(site + 2, 2),
        Err(SiteRefusal::NotBoundary)
    );
    assert_eq!(t.precheck_site(site, 2), Ok(()));
    assert_eq!(t.precheck_site(fentry + 1, 2), Err(SiteRefusal::Ftrace));

    let block = t.alloc(site, 16, BlockKind::Code).unwrap();
    assert!(info.code_arena.contains(&block.addr));
    let mut tramp = vec![0x53, 0xe8];
    tramp.extend(rel32(block.addr + 6, callee));
    tramp.push(0xe9);
    tramp.extend(rel32(block.addr + 11, site + 6));
    t.write(&block, 0, &tramp).unwrap();
    assert_eq!(t.read(block.addr, tramp.len()).unwrap(), tramp);
    t.seal(&block).unwrap();
    let err = t.write(&block, 0, &[0xcc]).unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");

    let ppid = getppid();
    let entry = DispatchEntry {
        site,
        dest: block.addr,
        handler: 0,
        cookie: 0,
        only: None,
    };
    t.add_dispatch(&[entry]).unwrap();
    let trap = TextPatch {
        addr: site,
        old: orig[at..at + 2].to_vec(),
        new: TRAP_BYTES.to_vec(),
    };
    t.patch_text(std::slice::from_ref(&trap)).unwrap();
    assert_eq!(t.read(site, 2).unwrap(), TRAP_BYTES);

    for _ in 0..CALLS {
        assert_eq!(getppid(), ppid);
    }
    assert_eq!(
        t.trap_hits(site),
        Some(TrapHits {
            hits: CALLS,
            missed: 0
        })
    );
    let listed = t.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].entry, entry);
    assert_eq!(listed[0].hits.hits, CALLS);

    // Applying it again overlaps the live patch.
    let err = t.patch_text(std::slice::from_ref(&trap)).unwrap_err();
    assert!(
        matches!(&err, TargetError::SiteRefused { addr, reason: SiteRefusal::LivePatch } if *addr == site),
        "{err}"
    );

    t.patch_text(&[trap.inverse()]).unwrap();
    assert_eq!(t.read(func, 16).unwrap(), orig, "every byte restored");
    t.remove_dispatch(&[site]).unwrap();
    assert_eq!(t.trap_hits(site), None);
    t.quiesce(&[(block.addr, block.addr + 16)]).unwrap();
    t.free(&block).unwrap();
    assert_eq!(t.module_info().unwrap().live_patches, 0);
}

#[test]
fn kernel_target_refuses_the_fentry_site_and_changes_nothing() {
    let Some(mut t) = target() else { return };
    let func = t.symbols().lookup("__x64_sys_getppid").unwrap().addr;
    let before = t.read(func, 16).unwrap();
    let fentry = func + entry_len(&before) - 5;
    let at = usize::try_from(fentry - func).unwrap();
    let patch = TextPatch {
        addr: fentry,
        old: before[at..at + 2].to_vec(),
        new: TRAP_BYTES.to_vec(),
    };
    let err = t.patch_text(&[patch]).unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::SiteRefused {
                reason: SiteRefusal::Ftrace,
                ..
            }
        ),
        "{err}"
    );
    // A jmp rel8 (never written): a trap would be refused first, for having no dispatch entry.
    let wrong = TextPatch {
        addr: fentry + 5,
        old: vec![0x90, 0x90],
        new: vec![0xEB, 0x00],
    };
    let err = t.patch_text(&[wrong]).unwrap_err();
    assert!(
        matches!(&err, TargetError::TextMismatch { found, .. } if found == "53 e8"),
        "{err}"
    );
    assert_eq!(t.read(func, 16).unwrap(), before);
}

#[test]
fn kernel_target_keeps_a_state_blob_with_compare_and_swap() {
    let Some(t) = target() else { return };
    t.lock_exclusive().unwrap();
    let start = t.state().unwrap();
    let blob: Vec<u8> = (0..300_000u32)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    let next = t.put_state(start.generation, &blob).unwrap();
    assert_eq!(next, start.generation + 1);
    assert_eq!(
        t.state().unwrap().bytes,
        blob,
        "300 kB through the module, byte for byte"
    );
    let err = t.put_state(start.generation, b"late").unwrap_err();
    assert!(
        matches!(err, TargetError::StateStale { current, .. } if current == next),
        "{err}"
    );
    // A second opener waits for the lock: try it without blocking from another descriptor.
    let other = std::fs::File::open(DEVICE_PATH).unwrap();
    // SAFETY: flock() on a descriptor `other` keeps open.
    let r = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&other),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    assert_eq!(r, -1, "the first target holds LOCK_EX");
    t.put_state(next, &start.bytes).unwrap();
}
