//! Symbols of an ELF file (`.symtab` where present, else `.dynsym`), as owned [`Symbol`]s.

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind as ObjKind};

use crate::target::{Symbol, SymbolKind};

/// Read every defined function and data symbol of `data` (an ELF file), adding `bias` to each
/// address (the load bias of a PIE executable or shared object; 0 for fixed-address files).
///
/// For relocatable objects (`.o`, `.ko`) symbol values are section offsets; they are returned
/// relative to a virtual layout where each section starts at its `sh_addr` (0 for all in a `.o`),
/// so callers that analyse relocatables should use [`section_symbols`] instead.
pub fn read_elf_symbols(data: &[u8], bias: u64, origin: Option<String>) -> Result<Vec<Symbol>, object::Error> {
    let file = object::File::parse(data)?;
    let mut out = Vec::new();
    let mut push = |s: object::Symbol<'_, '_>| {
        if s.is_undefined() || s.name().map_or(true, str::is_empty) {
            return;
        }
        let kind = match s.kind() {
            ObjKind::Text => SymbolKind::Function,
            ObjKind::Data => SymbolKind::Object,
            _ => return,
        };
        let name = s.name().unwrap_or_default();
        // Versioned dynamic names come as "name@@VER"; keep the bare name.
        let name = name.split('@').next().unwrap_or(name).to_string();
        out.push(Symbol { name, addr: s.address().wrapping_add(bias), size: s.size(), kind, origin: origin.clone() });
    };
    let mut any = false;
    for s in file.symbols() {
        any = true;
        push(s);
    }
    if !any {
        for s in file.dynamic_symbols() {
            push(s);
        }
    }
    Ok(out)
}

/// Function symbols of one section of a relocatable object, as offsets into that section.
pub fn section_symbols(data: &[u8], section_name: &str) -> Result<Vec<Symbol>, object::Error> {
    let file = object::File::parse(data)?;
    let Some(section) = file.section_by_name(section_name) else { return Ok(Vec::new()) };
    let idx = section.index();
    Ok(file
        .symbols()
        .filter(|s| s.section_index() == Some(idx) && s.kind() == ObjKind::Text)
        .filter_map(|s| {
            let name = s.name().ok()?.to_string();
            Some(Symbol { name, addr: s.address(), size: s.size(), kind: SymbolKind::Function, origin: None })
        })
        .collect())
}
