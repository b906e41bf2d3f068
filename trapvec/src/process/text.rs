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
use crate::target::TextPatch;

const MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 5;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE: libc::c_int = 1 << 6;

pub(crate) fn register_membarrier() -> Result<(), TargetError> {
    // SAFETY: membarrier takes integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, 0, 0) };
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
    unsafe { sys::syscall6(libc::SYS_membarrier, [MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE as u64, 0, 0, 0, 0, 0]) == 0 }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// Protection of every mapping, from /proc/self/maps: `(start, end, PROT_*)`.
fn mappings() -> Result<Vec<(u64, u64, libc::c_int)>, TargetError> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| TargetError::os("reading /proc/self/maps", e))?;
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        let Some((a, b)) = range.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
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
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    // SAFETY: process_vm_readv on our own pid with valid iovecs; it reports unmapped memory as
    // an error instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if n < 0 || n as usize != len {
        return Err(TargetError::Read {
            addr,
            len,
            reason: if n < 0 { std::io::Error::last_os_error().to_string() } else { format!("only {n} bytes readable") },
        });
    }
    Ok(buf)
}

/// Check that every patch of `order` (sorted by address, disjoint) finds its `old` bytes, reading
/// neighbouring patches' text together (a batch of thousands of patches in a few reads).
fn check_expected(order: &[&TextPatch]) -> Result<(), TargetError> {
    /// Patches at most this far apart, within this span, are read together.
    const GAP: u64 = 4096;
    const SPAN: u64 = 1 << 20;
    let end = |p: &TextPatch| p.addr + p.old.len() as u64;
    let mut rest = order;
    while let Some(first) = rest.first() {
        let n = 1 + rest[1..].iter().zip(rest).take_while(|(p, prev)| p.addr - end(prev) <= GAP && end(p) - first.addr <= SPAN).count();
        let (run, tail) = rest.split_at(n);
        rest = tail;
        let (lo, hi) = (first.addr, end(run[n - 1]));
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
                return Err(TargetError::TextMismatch { addr: p.addr, expected: hex(&p.old), found: hex(cur) });
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
pub(crate) fn patch_batch(batch: &[TextPatch], live_interior: Option<&[u64]>) -> Result<(), TargetError> {
    for p in batch {
        if p.old.len() != p.new.len() || p.new.is_empty() {
            return Err(TargetError::Text { addr: p.addr, reason: format!("old ({} bytes) and new ({} bytes) differ in length", p.old.len(), p.new.len()) });
        }
    }
    let mut order: Vec<&TextPatch> = batch.iter().filter(|p| p.old != p.new).collect();
    order.sort_by_key(|p| p.addr);
    for w in order.windows(2) {
        if w[0].addr + w[0].old.len() as u64 > w[1].addr {
            return Err(TargetError::Text { addr: w[1].addr, reason: format!("overlaps the patch at {:#x} in the same batch", w[0].addr) });
        }
    }
    check_expected(&order)?;
    if order.is_empty() {
        return Ok(());
    }

    // Pages to unprotect, with the protection to put back.
    let ps = page_size();
    let maps = mappings()?;
    let mut pages: Vec<u64> = order
        .iter()
        .flat_map(|p| {
            let first = p.addr & !(ps - 1);
            let last = (p.addr + p.old.len() as u64 - 1) & !(ps - 1);
            (first..=last).step_by(ps as usize)
        })
        .collect();
    pages.dedup();
    pages.sort_unstable();
    pages.dedup();
    let mut prots = Vec::with_capacity(pages.len());
    for &pg in &pages {
        let prot = maps
            .iter()
            .find(|(a, b, _)| *a <= pg && pg < *b)
            .map(|m| m.2)
            .ok_or_else(|| TargetError::Text { addr: pg, reason: "page is not mapped".into() })?;
        prots.push(prot);
    }
    let set_prot = |restore: bool| -> Result<(), TargetError> {
        for (&pg, &prot) in pages.iter().zip(&prots) {
            let want = if restore { prot } else { prot | libc::PROT_WRITE | libc::PROT_READ };
            // SAFETY: `pg` is a page of an existing mapping (checked above); changing its
            // protection does not invalidate any Rust reference (text is not borrowed).
            if unsafe { libc::mprotect(pg as *mut libc::c_void, ps as usize, want) } != 0 {
                return Err(TargetError::Text { addr: pg, reason: format!("mprotect: {}", std::io::Error::last_os_error()) });
            }
        }
        Ok(())
    };
    set_prot(false)?;

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
        None => order.iter().filter(|p| p.old.len() > 1).map(|p| (p.addr + 1, p.addr + p.old.len() as u64)).collect(),
    };
    const WINDOW_WAIT: Duration = Duration::from_secs(2);
    let mut scan = match Scan::new(&interiors) {
        Ok(s) => s,
        Err(e) => {
            TRANSIENT.replace(None);
            set_prot(true)?;
            return Err(e);
        }
    };

    // The window: no libc from here to the last sync (see the module docs).
    WRITER_TID.store(sys::gettid(), std::sync::atomic::Ordering::SeqCst);
    // Odd: CCs may be in place from here until the matching increment below.
    TEXT_SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let result = (|| -> Result<(), Option<crate::process::scan::Stuck>> {
        for p in &order {
            // SAFETY: the page was made writable above.
            unsafe { write_bytes(p.addr, &[INT3]) };
        }
        if !sync_raw() {
            return Err(None);
        }
        if let Some(scan) = scan.as_mut() {
            if let Err(stuck) = scan.wait(WINDOW_WAIT) {
                // Put the first bytes back: nothing was written but the CCs.
                for p in &order {
                    // SAFETY: as above.
                    unsafe { write_bytes(p.addr, &p.old[..1]) };
                }
                if !sync_raw() {
                    return Err(None);
                }
                return Err(Some(stuck));
            }
        }
        for p in &order {
            // SAFETY: as above.
            unsafe { write_bytes(p.addr + 1, &p.new[1..]) };
        }
        if !sync_raw() {
            return Err(None);
        }
        for p in &order {
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
        None => TargetError::Text { addr: order[0].addr, reason: "membarrier(PRIVATE_EXPEDITED_SYNC_CORE) failed".into() },
    });

    TRANSIENT.replace(None);
    set_prot(true)?;
    result
}
