//! Symbols of the running process: the executable and every loaded library, each from its
//! full symbol table (`.symtab` where the file has one, else `.dynsym`), load bias applied.

use std::ffi::CStr;

use crate::elfsyms::read_elf_symbols;
use crate::error::TargetError;
use crate::target::{Symbol, SymbolTable};

struct Object {
    path: String,
    bias: u64,
}

unsafe extern "C" fn collect(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `data` is the `Vec<Object>` passed to dl_iterate_phdr below; `info` is valid for
    // the duration of the callback.
    unsafe {
        let out = &mut *data.cast::<Vec<Object>>();
        let name = if (*info).dlpi_name.is_null() { "" } else { CStr::from_ptr((*info).dlpi_name).to_str().unwrap_or("") };
        out.push(Object { path: name.to_string(), bias: (*info).dlpi_addr });
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
        match read_elf_symbols(&map, o.bias, origin) {
            Ok(syms) => {
                log::debug!("{} symbols from {path} (bias {:#x})", syms.len(), o.bias);
                all.extend(syms);
            }
            Err(e) => log::debug!("symbols of {path}: {e}; skipped"),
        }
    }
    Ok(SymbolTable::new(all))
}
