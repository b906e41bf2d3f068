//! The process repository: arenas of memory within ±2 GiB of the code they serve.
//!
//! Code arenas are a `memfd` mapped twice: read+execute near the target code (what runs) and
//! read+write anywhere (the writable alias through which blocks are filled), the user-space twin
//! of the kernel module writing its arena through a `vmap` alias. Code is therefore never mapped
//! writable and executable at one address. Data arenas are plain read+write anonymous memory.
//! Blocks are carved first-fit at 16-byte granularity.

use std::collections::HashMap;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;

use crate::error::TargetError;
use crate::target::{BlockKind, RepoBlock};

const ARENA_SIZE: u64 = 4 << 20;
const GRANULE: u64 = 16;
/// Keep blocks this far inside the ±2 GiB reach so that rel32 from anywhere in a block works.
const REACH: u64 = (1 << 31) - (64 << 20);

struct Arena {
    kind: BlockKind,
    /// Address where the memory runs / is used.
    base: u64,
    /// Writable alias (code arenas); equal to `base` for data arenas.
    alias: u64,
    size: u64,
    /// Free extents `(offset, len)`, sorted, coalesced.
    free: Vec<(u64, u64)>,
}

impl Arena {
    fn take(&mut self, size: u64) -> Option<u64> {
        let i = self.free.iter().position(|&(_, len)| len >= size)?;
        let (off, len) = self.free[i];
        if len == size {
            self.free.remove(i);
        } else {
            self.free[i] = (off + size, len - size);
        }
        Some(off)
    }

    fn give(&mut self, off: u64, size: u64) {
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, size));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

/// A code arena's two views, registered for `fork` (see [`fork`](super::fork)).
#[derive(Clone, Copy)]
pub(crate) struct CodeArena {
    base: u64,
    alias: u64,
    size: u64,
}

/// Every code arena of the process (arenas are never unmapped).
pub(crate) static CODE_ARENAS: Mutex<Vec<CodeArena>> = Mutex::new(Vec::new());

/// In a fork child: put a private memfd, a copy of `a`'s contents, under both of its views at
/// the same addresses. `false` if that failed (the views may then be shared, or mixed).
pub(crate) fn make_private(a: &CodeArena) -> bool {
    let Ok(fd) = code_memfd() else { return false };
    let ok = (|| {
        // SAFETY: `fd` is the memfd just created.
        if unsafe { libc::ftruncate(fd, a.size as libc::off_t) } != 0 {
            return false;
        }
        let mut done = 0u64;
        while done < a.size {
            // SAFETY: the alias view is readable for `size` bytes.
            let n = unsafe {
                libc::pwrite(
                    fd,
                    (a.alias + done) as *const libc::c_void,
                    (a.size - done) as usize,
                    done as libc::off_t,
                )
            };
            if n <= 0 {
                return false;
            }
            done += n as u64;
        }
        // SAFETY: MAP_FIXED over our own views of the arena, same size, same contents; the child
        // has one thread, which is in this handler and not executing in the arena.
        unsafe {
            let p = libc::mmap(
                a.alias as *mut libc::c_void,
                a.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            );
            if p as u64 != a.alias {
                return false;
            }
            let p = libc::mmap(
                a.base as *mut libc::c_void,
                a.size as usize,
                libc::PROT_READ | libc::PROT_EXEC,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            );
            p as u64 == a.base
        }
    })();
    // SAFETY: closing our fd; the mappings keep the memory.
    unsafe { libc::close(fd) };
    ok
}

fn shared_with_parent(near: u64, size: usize) -> Result<(), TargetError> {
    if super::fork::SHARED_WITH_PARENT.load(SeqCst) {
        return Err(TargetError::Alloc {
            near,
            size,
            reason: "this fork child could not get a private copy of the code repository, which it shares with its parent; it cannot change it".into(),
        });
    }
    Ok(())
}

struct Live {
    arena: usize,
    offset: u64,
    size: u64,
    sealed: bool,
}

#[derive(Default)]
pub(crate) struct Repository {
    arenas: Vec<Arena>,
    live: HashMap<u64, Live>,
    next_id: u64,
}

fn within(addr: u64, near: u64) -> bool {
    addr.abs_diff(near) < REACH
}

/// Free gaps of the address space `[start, end)`, from /proc/self/maps.
fn gaps() -> Result<Vec<(u64, u64)>, TargetError> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| TargetError::os("reading /proc/self/maps", e))?;
    let mut used: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    used.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0x10000u64; // stay above mmap_min_addr
    for (a, b) in used {
        if a > prev {
            out.push((prev, a));
        }
        prev = prev.max(b);
    }
    // Top of the user address space (47-bit).
    let top = 0x7fff_ffff_f000u64;
    if top > prev {
        out.push((prev, top));
    }
    Ok(out)
}

/// Candidate addresses for a mapping of `size` bytes wholly within reach of `near`, nearest first.
fn candidates(near: u64, size: u64) -> Result<Vec<u64>, TargetError> {
    let lo_limit = near.saturating_sub(REACH);
    let hi_limit = near.saturating_add(REACH);
    let mut c = Vec::new();
    for (a, b) in gaps()? {
        // Leave a guard page on each side.
        let (a, b) = (a + 0x1000, b.saturating_sub(0x1000));
        if b < a + size {
            continue;
        }
        // Closest placement in this gap: just above `near` or just below it.
        let want = if near < a {
            a
        } else if near > b - size {
            b - size
        } else {
            (near + 0x1000) & !0xfff
        };
        let want = want.clamp(a, b - size) & !0xfff;
        if want >= a && want + size <= b && want >= lo_limit && want + size <= hi_limit {
            c.push(want);
        }
    }
    c.sort_by_key(|&x| x.abs_diff(near));
    Ok(c)
}

/// `MFD_EXEC` (Linux >= 6.3): ask for an executable memfd explicitly, which `vm.memfd_noexec=1`
/// would otherwise make non-executable.
const MFD_EXEC: libc::c_uint = 0x10;

/// A memfd for a code arena, executable: with `MFD_EXEC` where the kernel knows it (an older one
/// answers EINVAL, and all its memfds are executable). A refusal names the errno and the sysctl.
fn code_memfd() -> Result<libc::c_int, String> {
    // SAFETY: memfd_create with a static NUL-terminated name.
    let mut fd =
        unsafe { libc::memfd_create(c"trapvec-repository".as_ptr(), libc::MFD_CLOEXEC | MFD_EXEC) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(c"trapvec-repository".as_ptr(), libc::MFD_CLOEXEC) };
    }
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        let hint = match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => {
                "; vm.memfd_noexec=2 forbids executable memfds, which the process backend needs for its trampolines"
            }
            _ => "",
        };
        return Err(format!(
            "memfd_create(MFD_EXEC) for the code repository: {e}{hint}"
        ));
    }
    Ok(fd)
}

/// As [`map_fixed`], but a refusal by policy (EACCES, EPERM) is an error, not a taken address.
fn map_fixed_or_refused(
    addr: u64,
    size: u64,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
) -> Result<Option<u64>, std::io::Error> {
    match map_fixed(addr, size, prot, flags, fd) {
        Some(a) => Ok(Some(a)),
        None => {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => Err(e),
                _ => Ok(None),
            }
        }
    }
}

fn map_fixed(
    addr: u64,
    size: u64,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
) -> Option<u64> {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            size as usize,
            prot,
            flags | libc::MAP_FIXED_NOREPLACE,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    if p as u64 != addr {
        // Old kernels ignore NOREPLACE and treat it as a hint.
        // SAFETY: unmapping exactly what this call mapped.
        unsafe { libc::munmap(p, size as usize) };
        return None;
    }
    Some(addr)
}

impl Repository {
    fn new_arena(&mut self, near: u64, size: u64, kind: BlockKind) -> Result<usize, TargetError> {
        let size = size.max(ARENA_SIZE).next_multiple_of(0x1000);
        let fail = |reason: String| TargetError::Alloc {
            near,
            size: size as usize,
            reason,
        };
        let (base, alias) = match kind {
            BlockKind::Data => {
                let base = candidates(near, size)?
                    .into_iter()
                    .find_map(|a| {
                        map_fixed(
                            a,
                            size,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                        )
                    })
                    .ok_or_else(|| fail("no free address range within reach".into()))?;
                (base, base)
            }
            BlockKind::Code => {
                let fd = code_memfd().map_err(&fail)?;
                // SAFETY: `fd` is the memfd just created.
                if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
                    let e = std::io::Error::last_os_error();
                    // SAFETY: closing our own fd.
                    unsafe { libc::close(fd) };
                    return Err(fail(format!("ftruncate: {e}")));
                }
                // A refusal to map the memfd executable (not "this address is taken") is the
                // same at every address: report it with its errno instead of trying the others.
                let mut refused = None;
                let base = candidates(near, size)?.into_iter().find_map(|a| {
                    if refused.is_some() {
                        return None;
                    }
                    match map_fixed_or_refused(
                        a,
                        size,
                        libc::PROT_READ | libc::PROT_EXEC,
                        libc::MAP_SHARED,
                        fd,
                    ) {
                        Ok(found) => found,
                        Err(e) => {
                            refused = Some(e);
                            None
                        }
                    }
                });
                if let Some(e) = refused {
                    // SAFETY: closing our own fd.
                    unsafe { libc::close(fd) };
                    return Err(fail(format!(
                        "mapping the code repository (a memfd) read+execute: {e}; a W^X or noexec policy refuses it \
                         (vm.memfd_noexec, SELinux `execmem`, or a seccomp filter)"
                    )));
                }
                // SAFETY: mapping the memfd read+write at an address the kernel chooses.
                let alias = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        size as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        fd,
                        0,
                    )
                };
                // SAFETY: the mappings keep the memory alive; the fd is no longer needed.
                unsafe { libc::close(fd) };
                let Some(base) = base else {
                    if alias != libc::MAP_FAILED {
                        // SAFETY: unmapping the alias we just mapped.
                        unsafe { libc::munmap(alias, size as usize) };
                    }
                    return Err(fail("no free address range within reach".into()));
                };
                if alias == libc::MAP_FAILED {
                    // SAFETY: unmapping the executable view we just mapped.
                    unsafe { libc::munmap(base as *mut libc::c_void, size as usize) };
                    return Err(fail(format!(
                        "mmap of the writable alias: {}",
                        std::io::Error::last_os_error()
                    )));
                }
                (base, alias as u64)
            }
        };
        if kind == BlockKind::Code {
            super::fork::register();
            CODE_ARENAS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(CodeArena { base, alias, size });
        }
        log::debug!("new {kind:?} arena at {base:#x} ({size:#x} bytes) for code near {near:#x}");
        self.arenas.push(Arena {
            kind,
            base,
            alias,
            size,
            free: vec![(0, size)],
        });
        Ok(self.arenas.len() - 1)
    }

    pub(crate) fn alloc(
        &mut self,
        near: u64,
        size: usize,
        kind: BlockKind,
    ) -> Result<RepoBlock, TargetError> {
        shared_with_parent(near, size)?;
        let want = (size.max(1) as u64).next_multiple_of(GRANULE);
        let mut found = None;
        for (i, a) in self.arenas.iter_mut().enumerate() {
            if a.kind != kind || !within(a.base, near) || !within(a.base + a.size, near) {
                continue;
            }
            if let Some(off) = a.take(want) {
                found = Some((i, off));
                break;
            }
        }
        let (arena, offset) = match found {
            Some(f) => f,
            None => {
                let i = self.new_arena(near, want, kind)?;
                let off = self.arenas[i]
                    .take(want)
                    .expect("a new arena fits the request");
                (i, off)
            }
        };
        self.next_id += 1;
        let id = self.next_id;
        let addr = self.arenas[arena].base + offset;
        self.live.insert(
            id,
            Live {
                arena,
                offset,
                size: want,
                sealed: false,
            },
        );
        Ok(RepoBlock {
            id,
            addr,
            size: want as usize,
            kind,
        })
    }

    fn live(&self, block: &RepoBlock) -> Result<&Live, TargetError> {
        self.live
            .get(&block.id)
            .filter(|l| self.arenas[l.arena].base + l.offset == block.addr)
            .ok_or_else(|| TargetError::Block {
                addr: block.addr,
                offset: 0,
                len: block.size,
                reason: "not a live block of this repository".into(),
            })
    }

    pub(crate) fn write(
        &mut self,
        block: &RepoBlock,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), TargetError> {
        shared_with_parent(block.addr, block.size)?;
        let l = self.live(block)?;
        let err = |reason: &str| TargetError::Block {
            addr: block.addr,
            offset,
            len: bytes.len(),
            reason: reason.into(),
        };
        if offset as u64 + bytes.len() as u64 > l.size {
            return Err(err("write past the end of the block"));
        }
        if l.sealed {
            return Err(err("block is sealed"));
        }
        let a = &self.arenas[l.arena];
        let dst = a.alias + l.offset + offset as u64;
        if bytes.len() == 8 && dst.is_multiple_of(8) {
            // One store: user code may be reading this slot (indirection slots, variables).
            let v = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            // SAFETY: `dst` is 8-aligned, inside a live block of a mapping we own.
            unsafe {
                (*(dst as *const std::sync::atomic::AtomicU64))
                    .store(v, std::sync::atomic::Ordering::SeqCst)
            };
        } else {
            // SAFETY: `dst..dst+len` lies inside a live block of a writable mapping we own.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len()) };
        }
        // Read back through the address that runs.
        let run = a.base + l.offset + offset as u64;
        // SAFETY: same memory, readable through the executable or data view.
        let back = unsafe { std::slice::from_raw_parts(run as *const u8, bytes.len()) };
        if back != bytes {
            return Err(err("read-back differs from what was written"));
        }
        Ok(())
    }

    pub(crate) fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        self.live(block)?;
        if block.kind != BlockKind::Code {
            return Err(TargetError::Block {
                addr: block.addr,
                offset: 0,
                len: block.size,
                reason: "only code blocks are sealed".into(),
            });
        }
        self.live.get_mut(&block.id).expect("checked").sealed = true;
        Ok(())
    }

    pub(crate) fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        shared_with_parent(block.addr, block.size)?;
        self.live(block)?;
        let l = self.live.remove(&block.id).expect("checked");
        let a = &mut self.arenas[l.arena];
        // Fill freed code with int3 so that a stale jump into it stops loudly.
        let fill = if a.kind == BlockKind::Code { 0xCC } else { 0 };
        // SAFETY: the extent is inside the arena's writable view and no longer handed out.
        unsafe { std::ptr::write_bytes((a.alias + l.offset) as *mut u8, fill, l.size as usize) };
        a.give(l.offset, l.size);
        Ok(())
    }

    /// Number of live blocks (for tests and leak checks).
    pub(crate) fn live_blocks(&self) -> usize {
        self.live.len()
    }
}
