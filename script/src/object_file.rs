//! The component as an ELF relocatable, written with `object::write`.

use object::write::{Object, Relocation, StandardSection, Symbol, SymbolSection};
use object::{
    Architecture, BinaryFormat, Endianness, RelocationEncoding, RelocationFlags, RelocationKind,
    SymbolFlags, SymbolKind, SymbolScope,
};

use crate::codegen::{Code, DATA_DISP, PATH_DISP};
use crate::{DATA_SYMBOL, DUMP_SYMBOL};

fn pc32(symbol: object::write::SymbolId, offset: u64) -> Relocation {
    Relocation {
        offset,
        symbol,
        addend: -4,
        flags: RelocationFlags::Generic {
            kind: RelocationKind::Relative,
            encoding: RelocationEncoding::Generic,
            size: 32,
        },
    }
}

/// `R_X86_64_PLT32` of a `call rel32` or `jmp rel32` to `symbol`.
fn plt32(symbol: object::write::SymbolId, offset: u64) -> Relocation {
    Relocation {
        offset,
        symbol,
        addend: -4,
        flags: RelocationFlags::Elf {
            r_type: object::elf::R_X86_64_PLT32,
        },
    }
}

/// `.text` with the handlers and (for a process) the dump function, `.bss` with the data
/// block, `.rodata` with the dump path (a process's); an `R_X86_64_PC32` at each `lea` of the
/// data or the path, an `R_X86_64_PLT32` against an undefined symbol at each call of a kernel
/// function and each jump to an original trampoline (`__trapvec_orig_<fn>`). A kernel component has only `.text` and `.bss`, so that its data block starts
/// with the data symbol.
pub(crate) fn write(
    handlers: &[(String, Code)],
    dump: Option<(&[u8], &str)>,
    data_size: usize,
) -> object::write::Result<Vec<u8>> {
    let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let text = obj.section_id(StandardSection::Text);
    let bss = obj.section_id(StandardSection::UninitializedData);
    let sym = |obj: &mut Object<'_>, name: &str, kind, section, value, size| {
        obj.add_symbol(Symbol {
            name: name.as_bytes().to_vec(),
            value,
            size,
            kind,
            scope: SymbolScope::Dynamic,
            weak: false,
            section: SymbolSection::Section(section),
            flags: SymbolFlags::None,
        })
    };
    let data_off = obj.append_section_bss(bss, data_size as u64, 64);
    let data = sym(
        &mut obj,
        DATA_SYMBOL,
        SymbolKind::Data,
        bss,
        data_off,
        data_size as u64,
    );
    let mut imports = std::collections::HashMap::new();
    for (name, code) in handlers {
        let off = obj.append_section_data(text, &code.bytes, 16);
        sym(
            &mut obj,
            name,
            SymbolKind::Text,
            text,
            off,
            code.bytes.len() as u64,
        );
        obj.add_relocation(text, pc32(data, off + DATA_DISP as u64))?;
        for (at, callee) in &code.calls {
            let id = *imports.entry(callee.clone()).or_insert_with(|| {
                obj.add_symbol(Symbol {
                    name: callee.as_bytes().to_vec(),
                    value: 0,
                    size: 0,
                    kind: SymbolKind::Text,
                    scope: SymbolScope::Unknown,
                    weak: false,
                    section: SymbolSection::Undefined,
                    flags: SymbolFlags::None,
                })
            });
            obj.add_relocation(text, plt32(id, off + *at as u64))?;
        }
    }
    let Some((dump, path)) = dump else {
        return obj.write();
    };
    let rodata = obj.section_id(StandardSection::ReadOnlyData);
    let mut p = path.as_bytes().to_vec();
    p.push(0);
    let path_off = obj.append_section_data(rodata, &p, 1);
    let path_sym = sym(
        &mut obj,
        "trapvec_trace_path",
        SymbolKind::Data,
        rodata,
        path_off,
        p.len() as u64,
    );
    let off = obj.append_section_data(text, dump, 16);
    sym(
        &mut obj,
        DUMP_SYMBOL,
        SymbolKind::Text,
        text,
        off,
        dump.len() as u64,
    );
    obj.add_relocation(text, pc32(data, off + DATA_DISP as u64))?;
    obj.add_relocation(text, pc32(path_sym, off + PATH_DISP as u64))?;
    obj.write()
}
