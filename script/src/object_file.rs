//! The component as an ELF relocatable, written with `object::write`.

use object::write::{Object, Relocation, StandardSection, Symbol, SymbolSection};
use object::{
    Architecture, BinaryFormat, Endianness, RelocationEncoding, RelocationFlags, RelocationKind,
    SymbolFlags, SymbolKind, SymbolScope,
};

use crate::codegen::{DATA_DISP, PATH_DISP};
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

/// `.text` with the handlers and the dump function, `.bss` with the data block, `.rodata`
/// with the dump path; an `R_X86_64_PC32` at each `lea` of the data or the path.
pub(crate) fn write(
    handlers: &[(String, Vec<u8>)],
    dump: &[u8],
    data_size: usize,
    path: &str,
) -> object::write::Result<Vec<u8>> {
    let mut obj = Object::new(BinaryFormat::Elf, Architecture::X86_64, Endianness::Little);
    let text = obj.section_id(StandardSection::Text);
    let bss = obj.section_id(StandardSection::UninitializedData);
    let rodata = obj.section_id(StandardSection::ReadOnlyData);
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
    for (name, code) in handlers {
        let off = obj.append_section_data(text, code, 16);
        sym(
            &mut obj,
            name,
            SymbolKind::Text,
            text,
            off,
            code.len() as u64,
        );
        obj.add_relocation(text, pc32(data, off + DATA_DISP as u64))?;
    }
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
