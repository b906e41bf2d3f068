//! Symbols of the running process: the executable and every loaded library, each from its
//! full symbol table (`.symtab` where the file has one, else `.dynsym`), load bias applied.
//! IFUNC symbols are replaced by the implementation the dynamic linker picked for this CPU
//! (`memcpy` is `__memmove_avx_unaligned_erms` here, not its resolver), asked of `dlsym`.

use std::ffi::{CStr, CString};

use crate::elfsyms::read_elf_symbols;
use crate::error::TargetError;
use crate::target::{Symbol, SymbolTable};

struct Object {
    path: String,
    bias: u64,
}

unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: `data` is the `Vec<Object>` passed to dl_iterate_phdr below; `info` is valid for
    // the duration of the callback.
    unsafe {
        let out = &mut *data.cast::<Vec<Object>>();
        let name = if (*info).dlpi_name.is_null() {
            ""
        } else {
            CStr::from_ptr((*info).dlpi_name).to_str().unwrap_or("")
        };
        out.push(Object {
            path: name.to_string(),
            bias: (*info).dlpi_addr,
        });
    }
    0
}

/// Read the symbols of every object loaded in this process. The main executable comes first so
/// that its definitions win name lookups.
pub(crate) fn process_symbols() -> Result<SymbolTable, TargetError> {
    let mut objects: Vec<Object> = Vec::new();
    // SAFETY: `collect` matches the callback signature and only touches `objects`.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&mut objects as *mut Vec<Object>).cast()) };
    let mut all: Vec<Symbol> = Vec::new();
    let mut biases: Vec<(Option<String>, u64)> = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        let (path, origin) = if i == 0 || o.path.is_empty() {
            if i != 0 {
                continue; // the vDSO and other nameless objects
            }
            ("/proc/self/exe".to_string(), None)
        } else {
            (o.path.clone(), Some(o.path.clone()))
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) => {
                log::debug!("symbols of {path}: {e}; skipped");
                continue;
            }
        };
        // SAFETY: the file is mapped read-only and private; a library being rewritten on disk
        // while we read it would at worst give us wrong symbols, which the planners validate.
        let map = match unsafe { memmap2::Mmap::map(&file) } {
            Ok(m) => m,
            Err(e) => {
                log::debug!("symbols of {path}: {e}; skipped");
                continue;
            }
        };
        match read_elf_symbols(&map, o.bias, origin.clone()) {
            Ok(mut syms) => {
                biases.push((origin, o.bias));
                log::debug!("{} symbols from {path} (bias {:#x})", syms.len(), o.bias);
                resolve_ifuncs(&mut syms, (i != 0).then_some(path.as_str()));
                all.extend(syms);
            }
            Err(e) => log::debug!("symbols of {path}: {e}; skipped"),
        }
    }
    Ok(SymbolTable::new(all).with_load_biases(biases))
}

/// What [`loaded_object`] looks for and finds.
struct ObjectQuery {
    addr: u64,
    /// The object's load bias and program headers.
    found: Option<(u64, Vec<libc::Elf64_Phdr>)>,
}

unsafe extern "C" fn find_loaded_object(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: `data` is the `ObjectQuery` passed to dl_iterate_phdr in `loaded_object`; `info`
    // and its `dlpi_phnum` program headers at `dlpi_phdr` are valid for the callback's duration.
    unsafe {
        let q = &mut *data.cast::<ObjectQuery>();
        let info = &*info;
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
        let bias = info.dlpi_addr;
        let holds = phdrs.iter().any(|p| {
            let lo = bias.wrapping_add(p.p_vaddr);
            p.p_type == libc::PT_LOAD
                && p.p_flags & libc::PF_X != 0
                && q.addr >= lo
                && q.addr - lo < p.p_memsz
        });
        if !holds {
            return 0;
        }
        q.found = Some((bias, phdrs.to_vec()));
        1
    }
}

/// The load bias and program headers of the loaded object whose executable segment holds
/// `addr`, asked of the dynamic linker now (objects come and go).
fn loaded_object(addr: u64) -> Option<(u64, Vec<libc::Elf64_Phdr>)> {
    let mut q = ObjectQuery { addr, found: None };
    // SAFETY: `find_loaded_object` matches the callback signature and only touches `q`.
    unsafe {
        libc::dl_iterate_phdr(
            Some(find_loaded_object),
            (&mut q as *mut ObjectQuery).cast(),
        )
    };
    q.found
}

/// The `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`: address, size) of the loaded object whose
/// executable segment holds `addr`.
pub(crate) fn eh_frame_hdr(addr: u64) -> Option<(u64, u64)> {
    let found = loaded_object(addr).and_then(|(bias, phdrs)| {
        phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_GNU_EH_FRAME)
            .map(|p| (bias.wrapping_add(p.p_vaddr), p.p_memsz))
    });
    log::debug!("{addr:#x}: .eh_frame_hdr {found:x?}");
    found
}

/// The executable segments of the loaded object whose code holds `addr`: the file's bytes of
/// each (what lies past them is zero fill), sorted.
pub(crate) fn object_code(addr: u64) -> Option<Vec<(u64, u64)>> {
    let found = loaded_object(addr).and_then(|(bias, phdrs)| {
        let mut code: Vec<(u64, u64)> = phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_X != 0)
            .map(|p| {
                let lo = bias.wrapping_add(p.p_vaddr);
                (lo, lo.saturating_add(p.p_filesz.min(p.p_memsz)))
            })
            .collect();
        code.sort_unstable();
        code.iter()
            .any(|&(lo, hi)| (lo..hi).contains(&addr))
            .then_some(code)
    });
    log::debug!("{addr:#x}: object code {found:x?}");
    found
}

/// Replace each IFUNC symbol of one object (`path`, or the executable for `None`) by the
/// implementation `dlsym` binds its name to; its size is the implementation's symbol's where the
/// object has one at that address, else left 0 (the next function bounds it). A name `dlsym`
/// does not give (a local IFUNC) stays an IFUNC, which points refuse with a reason.
fn resolve_ifuncs(syms: &mut [crate::target::Symbol], path: Option<&str>) {
    use crate::target::SymbolKind;
    if !syms.iter().any(|s| s.kind == SymbolKind::Ifunc) {
        return;
    }
    let cpath = match path.map(CString::new).transpose() {
        Ok(p) => p,
        Err(_) => return,
    };
    // SAFETY: RTLD_NOLOAD only returns a handle to an object that is already loaded (it runs no
    // constructors); the path is a NUL-terminated string that outlives the call, or NULL for the
    // executable.
    let handle = unsafe {
        libc::dlopen(
            cpath.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if handle.is_null() {
        log::debug!(
            "IFUNCs of {}: not open to dlopen; left unresolved",
            path.unwrap_or("the executable")
        );
        return;
    }
    let sized: Vec<(u64, u64)> = syms
        .iter()
        .filter(|s| s.kind == SymbolKind::Function && s.size > 0)
        .map(|s| (s.addr, s.size))
        .collect();
    for sym in syms.iter_mut().filter(|s| s.kind == SymbolKind::Ifunc) {
        let Ok(name) = CString::new(sym.name.as_str()) else {
            continue;
        };
        let version = sym
            .version
            .as_deref()
            .map(|v| CString::new(v.trim_start_matches('@')));
        // SAFETY: `handle` is a live handle from dlopen above; name and version are
        // NUL-terminated and outlive the calls. dlsym runs the IFUNC's resolver, which the
        // dynamic linker already ran for this object's relocations.
        let addr = unsafe {
            match version {
                Some(Ok(v)) => libc::dlvsym(handle, name.as_ptr(), v.as_ptr()),
                Some(Err(_)) => continue,
                None => libc::dlsym(handle, name.as_ptr()),
            }
        } as u64;
        if addr == 0 {
            log::debug!(
                "IFUNC `{}` of {}: dlsym gives nothing; left unresolved",
                sym.versioned_name(),
                path.unwrap_or("the executable")
            );
            continue;
        }
        log::debug!(
            "IFUNC `{}` at {:#x} resolves to {addr:#x}",
            sym.versioned_name(),
            sym.addr
        );
        sym.kind = SymbolKind::Function;
        sym.size = sized
            .iter()
            .find(|&&(a, _)| a == addr)
            .map_or(0, |&(_, size)| size);
        sym.addr = addr;
    }
    // SAFETY: balances the dlopen above; the object stays loaded (it was loaded before).
    unsafe { libc::dlclose(handle) };
}
