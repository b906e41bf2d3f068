//! The text writer of the process backend: all-or-nothing batches written with the int3-first
//! protocol, every core synchronised with
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)` between the steps.
//!
//! 1. Check every patch's expected bytes; any difference aborts the batch before a write.
//! 2. Make the pages writable (keeping them executable), publish the patch addresses as transient.
//! 3. Write `CC` at each patch's first byte; sync. From now on no thread enters a window: it meets
//!    the `CC` and is sent back by the SIGTRAP handler to retry.
//! 4. Wait until no thread is *inside* a window (RIP at an instruction boundary after its first
//!    byte, or anywhere after it when the boundaries are not given): such a thread started the
//!    old instructions before step 3 and must finish them first.
//! 5. Write every tail; sync. Write every first byte; sync. Restore the page protections.
//!
//! From the first `CC` to the last first byte, the writer enters no libc function (raw system
//! calls, buffers prepared beforehand): the batch may be patching `malloc`, `memcpy`, `syscall`,
//! `mprotect` or `readdir`, and a writer that met its own `CC` could never finish. Should it
//! happen anyway, the SIGTRAP handler reports it and kills the process instead of spinning.

use std::time::Duration;

use crate::abi::INT3;
use crate::error::{hex, TargetError};
use crate::process::scan::Scan;
use crate::process::signal::{TEXT_SEQ, TRANSIENT, WRITER_TID, WRITTEN};
use crate::process::sys;
use crate::target::{read_runs, TextPatch};

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 6;

pub(crate) fn register_membarrier() -> Result<(), TargetError> {
    // SAFETY: membarrier takes integer arguments only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
            0,
            0,
        )
    };
    if r != 0 {
        return Err(TargetError::os(
            "membarrier(REGISTER_PRIVATE_EXPEDITED_SYNC_CORE) (needs Linux >= 4.16)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Serialise the instruction stream of every core running a thread of this process; `false` if
/// membarrier failed. A raw system call: this runs while transient CCs may sit in libc's `syscall`.
fn sync_raw() -> bool {
    // SAFETY: integer arguments only; registration was done in `register_membarrier`.
    unsafe {
        sys::syscall6(
            libc::SYS_membarrier,
            [
                MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE as u64,
                0,
                0,
                0,
                0,
                0,
            ],
        ) == 0
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// Protection of every mapping, from /proc/self/maps: `(start, end, PROT_*)`.
fn mappings() -> Result<Vec<(u64, u64, libc::c_int)>, TargetError> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| TargetError::os("reading /proc/self/maps", e))?;
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let p = perms.as_bytes();
        let mut prot = 0;
        if p.first() == Some(&b'r') {
            prot |= libc::PROT_READ;
        }
        if p.get(1) == Some(&b'w') {
            prot |= libc::PROT_WRITE;
        }
        if p.get(2) == Some(&b'x') {
            prot |= libc::PROT_EXEC;
        }
        out.push((a, b, prot));
    }
    Ok(out)
}

/// Read `len` bytes of our own memory, failing cleanly on unmapped addresses.
pub(crate) fn read_memory(addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: process_vm_readv on our own pid with valid iovecs; it reports unmapped memory as
    // an error instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 || n as usize != len {
        return Err(TargetError::Read {
            addr,
            len,
            reason: if n < 0 {
                std::io::Error::last_os_error().to_string()
            } else {
                format!("only {n} bytes readable")
            },
        });
    }
    Ok(buf)
}

/// Check that every patch of `order` (sorted by address, disjoint) finds its `old` bytes, reading
/// neighbouring patches' text together (a batch of thousands of patches in a few reads).
fn check_expected(order: &[&TextPatch]) -> Result<(), TargetError> {
    let ranges: Vec<(u64, u64)> = order
        .iter()
        .map(|p| (p.addr, p.addr + p.old.len() as u64))
        .collect();
    for run in read_runs(&ranges) {
        let (lo, hi) = (ranges[run.start].0, ranges[run.end - 1].1);
        let run = &order[run];
        // A run over unreadable gaps is read patch by patch (then the failing patch is named).
        let text = read_memory(lo, (hi - lo) as usize).ok();
        for p in run {
            let off = (p.addr - lo) as usize;
            let alone;
            let cur = match &text {
                Some(t) => &t[off..off + p.old.len()],
                None => {
                    alone = read_memory(p.addr, p.old.len())?;
                    &alone[..]
                }
            };
            if cur != p.old {
                return Err(TargetError::TextMismatch {
                    addr: p.addr,
                    expected: hex(&p.old),
                    found: hex(cur),
                });
            }
        }
    }
    Ok(())
}

/// # Safety
/// `addr` must be writable for `bytes.len()` bytes (the pages were made writable).
unsafe fn write_bytes(addr: u64, bytes: &[u8]) {
    for (i, &b) in bytes.iter().enumerate() {
        // SAFETY: guaranteed by the caller; volatile: other threads execute these bytes.
        unsafe { std::ptr::write_volatile((addr as *mut u8).add(i), b) };
    }
}

/// Apply `batch` all-or-nothing (see the module docs). `live_interior`: the instruction
/// boundaries strictly inside patches where a thread may be (step 4 waits for those only), or
/// `None` to wait for every byte after each patch's first.
pub(crate) fn patch_batch(
    batch: &[TextPatch],
    live_interior: Option<&[u64]>,
) -> Result<(), TargetError> {
    for p in batch {
        if p.old.len() != p.new.len() || p.new.is_empty() {
            return Err(TargetError::Text {
                addr: p.addr,
                reason: format!(
                    "old ({} bytes) and new ({} bytes) differ in length",
                    p.old.len(),
                    p.new.len()
                ),
            });
        }
    }
    let mut order: Vec<&TextPatch> = batch.iter().filter(|p| p.old != p.new).collect();
    order.sort_by_key(|p| p.addr);
    for w in order.windows(2) {
        if w[0].addr + w[0].old.len() as u64 > w[1].addr {
            return Err(TargetError::Text {
                addr: w[1].addr,
                reason: format!("overlaps the patch at {:#x} in the same batch", w[0].addr),
            });
        }
    }
    check_expected(&order)?;
    if order.is_empty() {
        return Ok(());
    }

    let pages = Pages::of(&order)?;
    pages.unprotect()?;
    let result = publish(&order, live_interior);
    match pages.protect() {
        Ok(()) => result,
        Err(e) => {
            // The pages are still writable (and executable): take the batch back while they are,
            // so that nothing is half published, then try the protections once more.
            let undone = match &result {
                // `protect` went on after the failure: the other pages are read-only again.
                Ok(()) => match pages.unprotect() {
                    Ok(()) => {
                        let inverse: Vec<TextPatch> = order.iter().map(|p| p.inverse()).collect();
                        let inverse: Vec<&TextPatch> = inverse.iter().collect();
                        // Every batch trapvec writes puts one instruction at each site (a trap,
                        // a jmp, a springboard), so no thread can be inside the new bytes.
                        publish(&inverse, Some(&[]))
                            .map(|()| "the batch was taken back".to_string())
                            .unwrap_or_else(|u| format!("taking the batch back failed too: {u}"))
                    }
                    Err(u) => format!("the batch stays written: {u}"),
                },
                Err(_) => "the batch was not written".to_string(),
            };
            match pages.protect() {
                Ok(()) => Err(TargetError::Text {
                    addr: e.addr,
                    reason: format!(
                        "{}; {undone}, protections restored at the second try",
                        e.reason
                    ),
                }),
                Err(again) => Err(TargetError::Text {
                    addr: again.addr,
                    reason: format!(
                        "{}; {undone}; pages {} stay writable and executable",
                        again.reason, again.pages_left
                    ),
                }),
            }
        }
    }
}

/// A failed protection change: where, why, and which pages kept the wrong protection.
struct ProtError {
    addr: u64,
    reason: String,
    pages_left: String,
}

/// The pages a batch writes, with the protection each had before.
struct Pages {
    size: u64,
    pages: Vec<(u64, libc::c_int)>,
}

/// What a protection error means, for the message.
fn refusal_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            " (a W^X policy refuses pages that are writable and executable: SELinux `execmod`, PaX/grsecurity MPROTECT, or a seccomp filter)"
        }
        Some(libc::ENOMEM) => " (the change would split a mapping past vm.max_map_count, or the range is not mapped)",
        _ => "",
    }
}

impl Pages {
    fn of(order: &[&TextPatch]) -> Result<Pages, TargetError> {
        let size = page_size();
        let maps = mappings()?;
        let mut addrs: Vec<u64> = order
            .iter()
            .flat_map(|p| {
                let first = p.addr & !(size - 1);
                let last = (p.addr + p.old.len() as u64 - 1) & !(size - 1);
                (first..=last).step_by(size as usize)
            })
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        let mut pages = Vec::with_capacity(addrs.len());
        for pg in addrs {
            let prot = maps
                .iter()
                .find(|(a, b, _)| *a <= pg && pg < *b)
                .map(|m| m.2)
                .ok_or_else(|| TargetError::Text {
                    addr: pg,
                    reason: "page is not mapped".into(),
                })?;
            pages.push((pg, prot));
        }
        Ok(Pages { size, pages })
    }

    fn set(&self, pg: u64, prot: libc::c_int) -> Result<(), std::io::Error> {
        // SAFETY: `pg` is a page of an existing mapping of text (checked in `of`); changing its
        // protection does not invalidate any Rust reference (text is not borrowed).
        unsafe { sys::mprotect(pg, self.size as usize, prot) }
    }

    /// Make every page writable (keeping it executable), all or none: on a failure the pages
    /// already changed get their protection back.
    fn unprotect(&self) -> Result<(), TargetError> {
        for (i, &(pg, prot)) in self.pages.iter().enumerate() {
            if let Err(e) = self.set(pg, prot | libc::PROT_WRITE | libc::PROT_READ) {
                log::debug!("mprotect of {pg:#x} writable failed ({e}); putting back {i} pages");
                let left: Vec<String> = self.pages[..i]
                    .iter()
                    .filter(|&&(p, old)| self.set(p, old).is_err())
                    .map(|(p, _)| format!("{p:#x}"))
                    .collect();
                let mut reason = format!(
                    "making the page writable to patch text: mprotect: {e}{}",
                    refusal_hint(&e)
                );
                if !left.is_empty() {
                    reason.push_str(&format!(
                        "; pages {} could not be put back and stay writable and executable",
                        left.join(", ")
                    ));
                }
                return Err(TargetError::Text { addr: pg, reason });
            }
        }
        Ok(())
    }

    /// Put every page's protection back; every page is tried, the first failure is reported.
    fn protect(&self) -> Result<(), ProtError> {
        let mut first: Option<(u64, std::io::Error)> = None;
        let mut left = Vec::new();
        for &(pg, prot) in &self.pages {
            if let Err(e) = self.set(pg, prot) {
                left.push(format!("{pg:#x}"));
                first.get_or_insert((pg, e));
            }
        }
        match first {
            None => Ok(()),
            Some((addr, e)) => Err(ProtError {
                addr,
                reason: format!(
                    "restoring the protection of patched text: mprotect: {e}{}",
                    refusal_hint(&e)
                ),
                pages_left: left.join(", "),
            }),
        }
    }
}

/// Steps 2 to 5 of the module docs on pages already writable: publish the transient sites, write
/// the `CC`s, wait for threads inside windows, write the tails and first bytes.
fn publish(order: &[&TextPatch], live_interior: Option<&[u64]>) -> Result<(), TargetError> {
    let mut transient: Vec<u64> = order.iter().map(|p| p.addr).collect();
    transient.sort_unstable();
    let mut written = WRITTEN.snapshot().unwrap_or_default();
    written.extend_from_slice(&transient);
    written.sort_unstable();
    written.dedup();
    WRITTEN.replace(Some(written));
    TRANSIENT.replace(Some(transient));
    let interiors: Vec<(u64, u64)> = match live_interior {
        Some(points) => points.iter().map(|&b| (b, b + 1)).collect(),
        None => order
            .iter()
            .filter(|p| p.old.len() > 1)
            .map(|p| (p.addr + 1, p.addr + p.old.len() as u64))
            .collect(),
    };
    const WINDOW_WAIT: Duration = Duration::from_secs(2);
    let mut scan = match Scan::new(&interiors) {
        Ok(s) => s,
        Err(e) => {
            TRANSIENT.replace(None);
            return Err(e);
        }
    };

    // The window: no libc from here to the last sync (see the module docs).
    WRITER_TID.store(sys::gettid(), std::sync::atomic::Ordering::SeqCst);
    // Odd: CCs may be in place from here until the matching increment below.
    TEXT_SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let result = (|| -> Result<(), Option<crate::process::scan::Stuck>> {
        for p in order {
            // SAFETY: the page was made writable above.
            unsafe { write_bytes(p.addr, &[INT3]) };
        }
        if !sync_raw() {
            return Err(None);
        }
        if let Some(scan) = scan.as_mut() {
            if let Err(stuck) = scan.wait(WINDOW_WAIT) {
                // Put the first bytes back: nothing was written but the CCs.
                for p in order {
                    // SAFETY: as above.
                    unsafe { write_bytes(p.addr, &p.old[..1]) };
                }
                if !sync_raw() {
                    return Err(None);
                }
                return Err(Some(stuck));
            }
        }
        for p in order {
            // SAFETY: as above.
            unsafe { write_bytes(p.addr + 1, &p.new[1..]) };
        }
        if !sync_raw() {
            return Err(None);
        }
        for p in order {
            // SAFETY: as above.
            unsafe { write_bytes(p.addr, &p.new[..1]) };
        }
        if !sync_raw() {
            return Err(None);
        }
        Ok(())
    })();
    // Even: the batch is over (its CCs are gone unless a membarrier failed, reported below).
    TEXT_SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    WRITER_TID.store(0, std::sync::atomic::Ordering::SeqCst);
    drop(scan);
    let result = result.map_err(|stuck| match stuck {
        Some(s) => s.into_error(WINDOW_WAIT),
        None => TargetError::Text {
            addr: order[0].addr,
            reason: "membarrier(PRIVATE_EXPEDITED_SYNC_CORE) failed".into(),
        },
    });

    TRANSIENT.replace(None);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::sys::fake_mprotect;

    /// Three pages of "text" (read+execute, filled with `nop`) this test owns.
    fn text_pages() -> u64 {
        let ps = page_size() as usize;
        // SAFETY: a fresh anonymous mapping, then written through while writable and sealed
        // read+execute; nothing else refers to it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                3 * ps,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            std::ptr::write_bytes(p.cast::<u8>(), 0x90, 3 * ps);
            assert_eq!(
                libc::mprotect(p, 3 * ps, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
            p as u64
        }
    }

    /// Permissions of the mappings covering `[lo, hi)` in /proc/self/maps, and whether any
    /// mapping of the process is writable and executable.
    fn perms(lo: u64, hi: u64) -> (Vec<String>, bool) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mut ours = Vec::new();
        let mut rwx = false;
        for line in maps.lines() {
            let mut f = line.split_whitespace();
            let (range, perm) = (f.next().unwrap(), f.next().unwrap());
            rwx |= perm.starts_with("rwx");
            let (a, b) = range.split_once('-').unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            if a < hi && lo < b {
                ours.push(perm.to_string());
            }
        }
        (ours, rwx)
    }

    #[test]
    fn a_failed_mprotect_at_any_step_leaves_the_text_and_every_protection_as_they_were() {
        register_membarrier().unwrap();
        let ps = page_size();
        let base = text_pages();
        let batch = [
            TextPatch {
                addr: base + 16,
                old: vec![0x90, 0x90],
                new: vec![0xcd, 0xf5],
            },
            TextPatch {
                addr: base + 2 * ps + 32,
                old: vec![0x90; 5],
                new: vec![0xe9, 1, 2, 3, 4],
            },
        ];
        let before = read_memory(base, 3 * ps as usize).unwrap();
        let before_perms = perms(base, base + 3 * ps);
        assert!(
            before_perms.0.iter().all(|p| p.starts_with("r-x")),
            "{before_perms:?}"
        );
        // A successful batch makes 4 calls: 2 pages made writable, 2 put back.
        let calls = {
            let _g = fake_mprotect::fail_call(0, 0);
            patch_batch(&batch, Some(&[])).unwrap();
            fake_mprotect::calls()
        };
        assert_eq!(calls, 4);
        let inverse: Vec<TextPatch> = batch.iter().map(TextPatch::inverse).collect();
        patch_batch(&inverse, Some(&[])).unwrap();
        assert_eq!(read_memory(base, 3 * ps as usize).unwrap(), before);
        for (k, errno, needle) in [
            (1, libc::EACCES, "W^X policy"),
            (2, libc::EACCES, "W^X policy"),
            (3, libc::ENOMEM, "max_map_count"),
            (4, libc::EPERM, "W^X policy"),
        ] {
            let err = {
                let _g = fake_mprotect::fail_call(k, errno);
                patch_batch(&batch, Some(&[])).unwrap_err()
            };
            let msg = err.to_string();
            let os = std::io::Error::from_raw_os_error(errno).to_string();
            assert!(
                msg.contains("mprotect") && msg.contains(&os) && msg.contains(needle),
                "call {k}: {msg}"
            );
            if k >= 3 {
                assert!(
                    msg.contains("taken back") && msg.contains("restored"),
                    "call {k}: {msg}"
                );
            }
            // State after = state before, byte for byte; no page writable and executable.
            assert_eq!(
                read_memory(base, 3 * ps as usize).unwrap(),
                before,
                "call {k}: the text changed"
            );
            let (now, rwx) = perms(base, base + 3 * ps);
            assert_eq!(now, before_perms.0, "call {k}");
            assert!(!rwx, "call {k}: a mapping is writable and executable");
        }
        // And the writer still works afterwards.
        patch_batch(&batch, Some(&[])).unwrap();
        assert_eq!(read_memory(base + 16, 2).unwrap(), [0xcd, 0xf5]);
        patch_batch(&inverse, Some(&[])).unwrap();
        assert_eq!(read_memory(base, 3 * ps as usize).unwrap(), before);
    }
}
