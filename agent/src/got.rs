//! The `dlopen`, `dlmopen` and `dlclose` hooks of an agent loaded into a running process
//! (`trapctl -p PID`), which was not preloaded: its exported functions of those names interpose
//! nothing, so the program's own calls are sent to them by their GOT slots instead.
//!
//! Every loaded object but libc, the dynamic linker and the agent has its relocations read
//! (`DT_JMPREL` and `DT_RELA`, `R_X86_64_JUMP_SLOT` and `R_X86_64_GLOB_DAT`); a slot of one of
//! those three symbols gets the agent's function, its old value kept. A slot inside the
//! object's `PT_GNU_RELRO` is made writable for the one store and read-only again. A slot
//! is written with one aligned 8-byte store, so a thread calling through it meanwhile goes to
//! the old function or to the new one, both of which load the library. Objects loaded later
//! are hooked after each hooked load. [`unhook_all`] (detach) puts every old value back in the
//! objects that are still loaded (the same name at the same base).
//!
//! Limits: a call through a pointer taken before (`dlsym(RTLD_DEFAULT, "dlopen")`, a slot
//! copied elsewhere), or from an object loaded by a load the hooks did not see, is not seen.

// x86-64 only: ELF addresses and sizes (u64) are usize, and a relocation's symbol index is its
// info's high 32 bits.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

/// One hooked slot.
struct Slot {
    /// The object's load bias and name, to tell whether it is still the same object.
    base: usize,
    object: String,
    slot: usize,
    old: usize,
    relro: bool,
}

static HOOKED: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const R_X86_64_GLOB_DAT: u64 = 6;
const R_X86_64_JUMP_SLOT: u64 = 7;

/// `Elf64_Rela`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Rela {
    r_offset: u64,
    r_info: u64,
    r_addend: i64,
}

/// `Elf64_Sym`'s first field (the rest is not read).
#[repr(C)]
struct Sym {
    st_name: u32,
}
const SYM_SIZE: usize = 24;

/// The agent's function for a hooked symbol name.
fn replacement(name: &[u8]) -> Option<usize> {
    let f: usize = match name {
        b"dlopen" => crate::deferred::hook::dlopen as *const () as usize,
        b"dlmopen" => crate::deferred::hook::dlmopen as *const () as usize,
        b"dlclose" => crate::deferred::hook::dlclose as *const () as usize,
        _ => return None,
    };
    Some(f)
}

/// Objects whose slots are left alone: libc's own calls (and the dynamic linker's) are not the
/// program's, and the agent calls libc directly.
fn skipped(name: &str) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name);
    file.starts_with("libc.so")
        || file.starts_with("ld-linux")
        || file.starts_with("libdl.so")
        || file.starts_with("linux-vdso")
        || file.starts_with("libtrapvec_agent")
}

/// A slot to hook found in one object.
struct Found {
    slot: usize,
    new: usize,
    relro: bool,
}

/// Read the relocations of the object `info` describes: its slots of the hooked symbols.
///
/// # Safety
/// `info` is the live `dl_phdr_info` of a loaded object, inside `dl_iterate_phdr`'s callback.
unsafe fn slots_of(info: &libc::dl_phdr_info) -> Vec<Found> {
    let base = info.dlpi_addr as usize;
    // SAFETY: the program headers of a loaded object, dlpi_phnum of them (caller's contract).
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let mut dynamic = None;
    let mut relro = (0usize, 0usize);
    for p in phdrs {
        match p.p_type {
            PT_DYNAMIC => dynamic = Some(base + p.p_vaddr as usize),
            PT_GNU_RELRO => {
                relro = (
                    base + p.p_vaddr as usize,
                    base + (p.p_vaddr + p.p_memsz) as usize,
                )
            }
            _ => {}
        }
    }
    let Some(dynamic) = dynamic else {
        return Vec::new();
    };
    let (mut strtab, mut symtab) = (0usize, 0usize);
    let (mut rela, mut relasz, mut jmprel, mut pltrelsz) = (0usize, 0usize, 0usize, 0usize);
    let mut i = 0;
    loop {
        // SAFETY: the dynamic section of a loaded object, which ends with DT_NULL; each entry
        // is two 8-byte words.
        let (tag, val) = unsafe {
            let d = (dynamic as *const [u64; 2]).add(i);
            ((*d)[0] as i64, (*d)[1] as usize)
        };
        i += 1;
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = val,
            DT_SYMTAB => symtab = val,
            DT_RELA => rela = val,
            DT_RELASZ => relasz = val,
            DT_JMPREL => jmprel = val,
            DT_PLTRELSZ => pltrelsz = val,
            _ => {}
        }
    }
    // glibc relocates the pointers of a writable dynamic section in place; a read-only one
    // keeps link-time values (see deferred.rs).
    let fix = |p: usize| if p != 0 && p < base { p + base } else { p };
    let (strtab, symtab, rela, jmprel) = (fix(strtab), fix(symtab), fix(rela), fix(jmprel));
    if strtab == 0 || symtab == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (table, size) in [(rela, relasz), (jmprel, pltrelsz)] {
        if table == 0 {
            continue;
        }
        for k in 0..size / std::mem::size_of::<Rela>() {
            // SAFETY: the object's relocation table, `size` bytes of Elf64_Rela.
            let r = unsafe { *(table as *const Rela).add(k) };
            let kind = r.r_info & 0xffff_ffff;
            if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
                continue;
            }
            let sym = (r.r_info >> 32) as usize;
            // SAFETY: a relocation's symbol index is within the object's symbol table, whose
            // names are C strings of its string table.
            let name = unsafe {
                let s = &*((symtab + sym * SYM_SIZE) as *const Sym);
                CStr::from_ptr((strtab + s.st_name as usize) as *const c_char)
            };
            if let Some(new) = replacement(name.to_bytes()) {
                let slot = base + r.r_offset as usize;
                out.push(Found {
                    slot,
                    new,
                    relro: slot >= relro.0 && slot < relro.1,
                });
            }
        }
    }
    out
}

/// Store `value` in `slot` (8 bytes, aligned), making a RELRO page writable for the store.
///
/// # Safety
/// `slot` is a GOT slot of a loaded object (mapped, 8-byte aligned).
unsafe fn store(slot: usize, value: usize, relro: bool) -> std::io::Result<()> {
    let page = slot & !4095;
    if relro {
        // SAFETY: the page of a loaded object's GOT; made read-only again below.
        if unsafe {
            libc::mprotect(
                page as *mut c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: an aligned, mapped, writable 8-byte slot (caller's contract, made writable above).
    unsafe { std::ptr::write_volatile(slot as *mut usize, value) };
    if relro {
        // SAFETY: as above: back to what RELRO made it.
        unsafe { libc::mprotect(page as *mut c_void, 4096, libc::PROT_READ) };
    }
    Ok(())
}

/// The loaded objects: (base, name, slots to hook).
fn objects() -> Vec<(usize, String, Vec<Found>)> {
    unsafe extern "C" fn collect(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the Vec passed below; `info` is valid during the callback and its
        // name, when not null, a C string.
        unsafe {
            let out = &mut *data.cast::<Vec<(usize, String, Vec<Found>)>>();
            let info = &*info;
            let name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(info.dlpi_name)
                    .to_string_lossy()
                    .into_owned()
            };
            if !skipped(&name) {
                out.push((info.dlpi_addr as usize, name, slots_of(info)));
            }
        }
        0
    }
    let mut out: Vec<(usize, String, Vec<Found>)> = Vec::new();
    // SAFETY: `collect` has the callback's signature and only touches `out`.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&mut out as *mut Vec<_>).cast()) };
    out
}

/// Hook the slots of every loaded object not hooked yet; how many slots were hooked now.
pub(crate) fn hook_all() -> usize {
    let mut hooked = HOOKED.lock().unwrap_or_else(|e| e.into_inner());
    let mut n = 0;
    for (base, object, found) in objects() {
        for f in found {
            // SAFETY: `f.slot` is a GOT slot of a loaded object (read from its relocations).
            let old = unsafe { std::ptr::read_volatile(f.slot as *const usize) };
            if old == f.new {
                continue;
            }
            // SAFETY: as above.
            match unsafe { store(f.slot, f.new, f.relro) } {
                Ok(()) => {
                    log::debug!(
                        "GOT slot {:#x} of `{object}` (was {old:#x}) now calls the agent",
                        f.slot
                    );
                    hooked.retain(|s| s.slot != f.slot);
                    hooked.push(Slot {
                        base,
                        object: object.clone(),
                        slot: f.slot,
                        old,
                        relro: f.relro,
                    });
                    n += 1;
                }
                Err(e) => log::warn!(
                    "trapvec: cannot hook the GOT slot {:#x} of {object}: {e}",
                    f.slot
                ),
            }
        }
    }
    log::debug!("dlopen hooks: {n} GOT slots hooked");
    n
}

/// Put every hooked slot of the objects still loaded back as it was; how many were.
pub(crate) fn unhook_all() -> usize {
    let mut hooked = HOOKED.lock().unwrap_or_else(|e| e.into_inner());
    let now = objects();
    let mut n = 0;
    for s in hooked.drain(..) {
        let loaded = now.iter().any(|(b, o, _)| *b == s.base && *o == s.object);
        if !loaded {
            continue;
        }
        // SAFETY: the slot of an object still loaded at the same base (checked above).
        match unsafe { store(s.slot, s.old, s.relro) } {
            Ok(()) => n += 1,
            Err(e) => log::warn!(
                "trapvec: cannot put back the GOT slot {:#x} of {}: {e}",
                s.slot,
                s.object
            ),
        }
    }
    n
}
