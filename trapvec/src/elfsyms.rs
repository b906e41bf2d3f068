//! Symbols of an ELF file (`.symtab` where present, else `.dynsym`), as owned [`Symbol`]s.
//!
//! Read the way real binaries have them, not only the way a C compiler writes them:
//! - a `NOTYPE` symbol defined in an executable section is a function (hand-written assembly
//!   without `.type`), and `IFUNC` symbols are [`SymbolKind::Ifunc`] (their address is the
//!   resolver's, not the implementation's);
//! - a function of size 0 gets the size up to the next symbol of its section or the section's
//!   end, whichever comes first, so that it never runs into the padding between sections;
//! - versions are kept: `@@VER` (the default a link binds to) or `@VER` (hidden, kept for old
//!   binaries), from the name in `.symtab` or from the version table for `.dynsym`.

use object::read::elf::{ElfFile, FileHeader, SectionHeader, Sym};
use object::{elf, Endianness, Object, ObjectSection, SectionIndex, SymbolIndex};

use crate::target::{Symbol, SymbolKind};

/// Read every defined function and data symbol of `data` (an ELF file), adding `bias` to each
/// address (the load bias of a PIE executable or shared object; 0 for fixed-address files).
///
/// For relocatable objects (`.o`, `.ko`) symbol values are section offsets, returned as they
/// are (every section at address 0); callers analysing relocatables lay the sections out first.
pub fn read_elf_symbols(
    data: &[u8],
    bias: u64,
    origin: Option<String>,
) -> Result<Vec<Symbol>, object::Error> {
    // x86-64 only: a 32-bit or non-ELF file is refused by the ELF64 parser with its reason.
    read::<elf::FileHeader64<Endianness>>(data, bias, origin)
}

/// One symbol as read, before sizes are completed.
struct Raw {
    symbol: Symbol,
    section: SectionIndex,
}

fn read<H: FileHeader<Endian = Endianness>>(
    data: &[u8],
    bias: u64,
    origin: Option<String>,
) -> Result<Vec<Symbol>, object::Error> {
    let file = ElfFile::<H>::parse(data)?;
    let endian = file.endian();
    let dynamic = file.elf_symbol_table().is_empty();
    let table = if dynamic {
        file.elf_dynamic_symbol_table()
    } else {
        file.elf_symbol_table()
    };
    let versions = if dynamic {
        file.elf_section_table().versions(endian, data)?
    } else {
        None
    };

    let mut raw: Vec<Raw> = Vec::new();
    for (index, sym) in table.enumerate() {
        let shndx = sym.st_shndx(endian);
        if shndx == elf::SHN_UNDEF || shndx == elf::SHN_ABS || shndx == elf::SHN_COMMON {
            continue;
        }
        let Some(section) = table.symbol_section(endian, sym, index)? else {
            continue;
        };
        let Ok(header) = file.elf_section_table().section(section) else {
            continue;
        };
        let executable = header.sh_flags(endian).into() & u64::from(elf::SHF_EXECINSTR) != 0;
        let kind = match sym.st_type() {
            elf::STT_FUNC => SymbolKind::Function,
            elf::STT_GNU_IFUNC => SymbolKind::Ifunc,
            elf::STT_NOTYPE if executable => SymbolKind::Function,
            elf::STT_OBJECT | elf::STT_COMMON => SymbolKind::Object,
            _ => continue,
        };
        let full = String::from_utf8_lossy(table.symbol_name(endian, sym)?);
        if full.is_empty() {
            continue;
        }
        let (name, version) = match (full.find('@'), &versions) {
            // .symtab spells the version into the name: `memcpy@@GLIBC_2.14`, `memcpy@GLIBC_2.2.5`.
            (Some(at), _) => (full[..at].to_string(), Some(full[at..].to_string())),
            (None, Some(v)) => (full.into_owned(), dynamic_version(v, endian, index)?),
            (None, None) => (full.into_owned(), None),
        };
        let addr = sym.st_value(endian).into().wrapping_add(bias);
        let size = sym.st_size(endian).into();
        raw.push(Raw {
            symbol: Symbol {
                name,
                addr,
                size,
                kind,
                origin: origin.clone(),
                version,
            },
            section,
        });
    }
    complete_sizes(&mut raw, |section| {
        let s = file.section_by_index(section).ok()?;
        Some(s.address().wrapping_add(bias) + s.size())
    });
    Ok(raw.into_iter().map(|r| r.symbol).collect())
}

/// The version of `.dynsym` entry `index`, as `.symtab` would spell it (`@@VER` or `@VER`).
fn dynamic_version(
    versions: &object::read::elf::VersionTable<'_, impl FileHeader<Endian = Endianness>>,
    endian: Endianness,
    index: SymbolIndex,
) -> Result<Option<String>, object::Error> {
    let vi = versions.version_index(endian, index);
    let Some(version) = versions.version(vi)? else {
        return Ok(None);
    };
    let at = if vi.is_hidden() { "@" } else { "@@" };
    Ok(Some(format!(
        "{at}{}",
        String::from_utf8_lossy(version.name())
    )))
}

/// Give each size-0 function the size up to the next symbol starting after it in its section, or
/// up to the end of its section (`section_end`, run-time address) when none follows.
fn complete_sizes(raw: &mut [Raw], section_end: impl Fn(SectionIndex) -> Option<u64>) {
    let mut order: Vec<usize> = (0..raw.len()).collect();
    order.sort_by_key(|&i| (raw[i].section.0, raw[i].symbol.addr));
    for (k, &i) in order.iter().enumerate() {
        let r = &raw[i];
        if r.symbol.size != 0 || !matches!(r.symbol.kind, SymbolKind::Function | SymbolKind::Ifunc)
        {
            continue;
        }
        let next = order[k + 1..]
            .iter()
            .map(|&j| &raw[j])
            .take_while(|n| n.section == r.section)
            .find(|n| n.symbol.addr > r.symbol.addr)
            .map(|n| n.symbol.addr);
        let end = match (next, section_end(r.section)) {
            (Some(n), Some(e)) => n.min(e),
            (Some(n), None) => n,
            (None, Some(e)) => e,
            (None, None) => continue,
        };
        raw[i].symbol.size = end.saturating_sub(raw[i].symbol.addr);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;

    /// Assemble `source` into an object and link it as a shared object with no libc; returns the
    /// linked file's bytes.
    fn link(dir: &Path, source: &str) -> Vec<u8> {
        let src = dir.join("t.S");
        std::fs::write(&src, source).unwrap();
        let script = dir.join("t.map");
        std::fs::write(&script, "V1 { global: *; };\nV2 { global: *; } V1;\n").unwrap();
        let so = dir.join("t.so");
        let out = Command::new("cc")
            .args(["-shared", "-nostdlib"])
            .arg(format!("-Wl,--version-script={}", script.display()))
            .arg("-o")
            .arg(&so)
            .arg(&src)
            .output()
            .expect("running cc");
        assert!(
            out.status.success(),
            "cc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read(&so).unwrap()
    }

    fn by<'a>(syms: &'a [Symbol], name: &str) -> &'a Symbol {
        syms.iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no symbol {name} in {syms:#?}"))
    }

    #[test]
    fn notype_labels_in_text_are_functions_ending_at_the_next_symbol_or_the_section_end() {
        let dir = tempfile::tempdir().unwrap();
        // No .type or .size: what hand-written assembly often looks like. `last` is the last
        // symbol of .text, followed by another section's bytes after the section's padding.
        let data = link(
            dir.path(),
            ".text\n.globl first\nfirst:\n  mov $1, %eax\n  ret\n.globl last\nlast:\n  xor %eax, %eax\n  ret\n\
             .data\n.globl value\nvalue: .quad 7\n",
        );
        let syms = read_elf_symbols(&data, 0x1000_0000, None).unwrap();
        let first = by(&syms, "first");
        let last = by(&syms, "last");
        assert_eq!(first.kind, SymbolKind::Function);
        assert_eq!(first.size, 6, "mov $1,%eax (5) + ret (1), up to `last`");
        assert_eq!(last.kind, SymbolKind::Function);
        let file = object::File::parse(&*data).unwrap();
        let text = file.section_by_name(".text").unwrap();
        assert_eq!(
            last.addr + last.size,
            0x1000_0000 + text.address() + text.size(),
            "up to the end of .text"
        );
        assert!(
            syms.iter().all(|s| s.name != "value"),
            "NOTYPE outside executable sections is no function"
        );
    }

    #[test]
    fn ifunc_symbols_are_marked_and_symtab_versions_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let data = link(
            dir.path(),
            ".text\n.type impl, @function\nimpl: ret\n.size impl, 1\n\
             .globl pick\n.type pick, @gnu_indirect_function\npick:\n  lea impl(%rip), %rax\n  ret\n.size pick, 8\n\
             .globl old_api\n.type old_api, @function\nold_api: ret\n.size old_api, 1\n\
             .symver old_api, api@V1\n\
             .globl new_api\n.type new_api, @function\nnew_api: ret\n.size new_api, 1\n\
             .symver new_api, api@@V2\n",
        );
        let syms = read_elf_symbols(&data, 0, None).unwrap();
        assert_eq!(by(&syms, "pick").kind, SymbolKind::Ifunc);
        let mut apis: Vec<_> = syms
            .iter()
            .filter(|s| s.name == "api")
            .map(|s| s.version.as_deref())
            .collect();
        apis.sort();
        assert_eq!(apis, [Some("@@V2"), Some("@V1")], "{syms:#?}");
        assert_eq!(by(&syms, "impl").version, None);
        // The same through .dynsym and its version table once .symtab is gone.
        let stripped = dir.path().join("stripped.so");
        let out = Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(dir.path().join("t.so"))
            .output()
            .expect("running strip");
        assert!(
            out.status.success(),
            "strip: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let syms = read_elf_symbols(&std::fs::read(&stripped).unwrap(), 0, None).unwrap();
        let mut apis: Vec<_> = syms
            .iter()
            .filter(|s| s.name == "api")
            .map(|s| s.version.as_deref())
            .collect();
        apis.sort();
        assert_eq!(apis, [Some("@@V2"), Some("@V1")], "{syms:#?}");
        assert_eq!(by(&syms, "pick").kind, SymbolKind::Ifunc);
    }

    #[test]
    fn libc_dynamic_versions_distinguish_the_default_from_compatibility_symbols() {
        // Debian's libc has no .symtab: its versions come from the version table, and memcpy
        // exists twice (GLIBC_2.14 is the default, GLIBC_2.2.5 the old one).
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        let data = std::fs::read(path).expect("libc");
        let syms = read_elf_symbols(&data, 0, Some(path.into())).unwrap();
        let memcpys: Vec<_> = syms.iter().filter(|s| s.name == "memcpy").collect();
        assert!(memcpys.len() >= 2, "{memcpys:#?}");
        assert!(
            memcpys
                .iter()
                .any(|s| s.version.as_deref() == Some("@@GLIBC_2.14")),
            "{memcpys:#?}"
        );
        assert!(
            memcpys
                .iter()
                .any(|s| s.version.as_deref() == Some("@GLIBC_2.2.5")),
            "{memcpys:#?}"
        );
        let default = memcpys
            .iter()
            .find(|s| s.version.as_deref() == Some("@@GLIBC_2.14"))
            .unwrap();
        assert_eq!(default.kind, SymbolKind::Ifunc, "{default:#?}");
        assert_eq!(by(&syms, "getpid").kind, SymbolKind::Function);
    }
}
