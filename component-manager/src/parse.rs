//! Parsing: ELF bytes in, an owned [`Object`] out (sections, symbols, relocations, declared
//! splices), or a [`ParseError`] saying what could not be read.
//!
//! This module owns the decision of which sections are loaded at all ([`Placement`]) and the
//! format of `.trapvec.splices`. It reads through `object`'s ELF-specific API
//! (`object::read::elf`: the section table, the symbol table with extended section indices, raw
//! `Elf64_Rela` entries and their `R_X86_64_*` types) and copies what it keeps, so nothing
//! downstream borrows the file. It never panics on malformed input: every read is bounds-checked by `object` and every
//! failure becomes [`ParseError::Malformed`] naming what was being read.
//!
//! Sections that are not loaded, and why:
//! - not `SHF_ALLOC` (debug info, `.comment`, `.note.GNU-stack`, symbol and string tables);
//! - `SHT_NOTE` (`.note.gnu.property`): properties for a static linker, nothing to run;
//! - `.eh_frame` (`SHT_X86_64_UNWIND`): nothing registers a component's unwind tables, so they
//!   are dropped together with their relocations (which point at `.text`). Unwinding through
//!   component code (C++ exceptions, `backtrace()` past it) is therefore not supported;
//! - `.trapvec.splices`: parsed into [`DeclaredSplice`]s instead;
//! - `SHF_TLS` sections: thread-local storage has no home in a repository; any relocation
//!   reaching it is refused by the relocation pass (a TLS access uses a TLS relocation type).
//!
//! `.init_array`/`.fini_array`/`.ctors`/`.dtors` are refused outright: the loader runs no
//! constructors, and loading them silently would leave the component half initialised.

use std::collections::BTreeMap;

use object::elf;
use object::read::elf::{
    FileHeader, Rela as _, SectionHeader as _, SectionTable, Sym as _, SymbolTable,
};
use object::LittleEndian as LE;
use thiserror::Error;

/// The only ELF flavour a component can be.
type Header = elf::FileHeader64<LE>;

/// Name of the section holding declared splices (`components/include/trapvec.h`).
pub const SPLICES_SECTION: &str = ".trapvec.splices";

/// What is wrong with a component's ELF file.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParseError {
    #[error("file is {len} bytes, too short for an ELF identification (16 bytes)")]
    TooShort { len: usize },
    #[error("not an ELF file (first bytes {found})")]
    NotElf { found: String },
    #[error("ELF class is {name} ({value}), expected ELFCLASS64")]
    Class { name: &'static str, value: u8 },
    #[error("data encoding is {name} ({value}), expected ELFDATA2LSB (little endian)")]
    Encoding { name: &'static str, value: u8 },
    #[error("type is {name} ({value}), expected ET_REL (a relocatable object, as `cc -c` makes)")]
    Type { name: &'static str, value: u16 },
    #[error("machine is {name} ({value}), expected EM_X86_64")]
    Machine { name: &'static str, value: u16 },
    #[error("cannot read {what}: {reason}")]
    Malformed { what: String, reason: String },
    #[error("section {section}: {reason}")]
    Section { section: String, reason: String },
    #[error("declared splice {record:?} in {SPLICES_SECTION}: {reason}")]
    Splice { record: String, reason: String },
    #[error("symbol {symbol} (#{index}) is defined in section index {shndx:#x}, which is not a section of this file ({sections} sections)")]
    SymbolSection {
        symbol: String,
        index: usize,
        shndx: u32,
        sections: usize,
    },
    #[error("relocation section {section} (#{index}) applies to section index {target}, which does not exist")]
    RelocationTarget {
        section: String,
        index: usize,
        target: u32,
    },
    #[error("relocation section {section} (#{index}) links section {link} instead of the symbol table (section {symtab})")]
    RelocationLink {
        section: String,
        index: usize,
        link: usize,
        symtab: usize,
    },
    #[error("relocation #{entry} of {section} (at {target}+{offset:#x}) names symbol index {symbol}, past the end of the symbol table ({symbols} symbols)")]
    RelocationSymbol {
        section: String,
        entry: usize,
        target: String,
        offset: u64,
        symbol: u64,
        symbols: usize,
    },
}

fn malformed(what: impl Into<String>, reason: impl ToString) -> ParseError {
    ParseError::Malformed {
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// Where a section goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Into the code block (`SHF_EXECINSTR`).
    Code,
    /// Into the data block, with its contents.
    Data,
    /// Into the data block, zero-filled (`SHT_NOBITS`).
    Bss,
    /// Not loaded; the reason is for messages.
    NotLoaded(&'static str),
}

impl Placement {
    pub fn is_loaded(self) -> bool {
        !matches!(self, Placement::NotLoaded(_))
    }
}

/// A section of the object, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Section {
    /// ELF section index.
    pub index: usize,
    pub name: String,
    pub placement: Placement,
    /// Size in memory (for `Bss`, the zero-filled size).
    pub size: u64,
    /// Alignment as the file says it, 1 when it says 0. [`crate::validate`] refuses one that is
    /// not a power of two or larger than [`crate::validate::Limits::max_align`].
    pub align: u64,
    /// File contents (empty for `Bss` and sections that are not loaded).
    pub data: Vec<u8>,
    /// `sh_type`, `sh_flags` and `sh_info` as in the file, for [`crate::validate`].
    pub sh_type: u32,
    pub flags: u64,
    pub info: u32,
}

/// Where a symbol is defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolDef {
    /// `SHN_UNDEF`: to be resolved elsewhere.
    Undefined,
    /// At `value` bytes into section `index`.
    Section { index: usize, value: u64 },
    /// `SHN_ABS`: an absolute value.
    Absolute(u64),
    /// `SHN_COMMON`: space the linker must allocate (`-fcommon`); `align` as the file says
    /// (1 for 0), checked by [`crate::validate`].
    Common { align: u64 },
}

/// ELF symbol type, reduced to what the loader distinguishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolType {
    Function,
    Object,
    Section,
    File,
    Tls,
    /// `STT_NOTYPE` and anything else.
    Other,
}

/// ELF symbol binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    Local,
    Global,
    Weak,
}

/// A symbol of the object, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// ELF symbol index.
    pub index: usize,
    /// The symbol's name; for a section symbol, the section's name.
    pub name: String,
    pub def: SymbolDef,
    pub size: u64,
    pub ty: SymbolType,
    pub binding: Binding,
    /// `STV_HIDDEN` or `STV_INTERNAL`: not exported to other components.
    pub hidden: bool,
}

impl Symbol {
    /// Visible to other components: global or weak, defined, and not hidden.
    pub fn is_export(&self) -> bool {
        self.binding != Binding::Local
            && !self.hidden
            && !matches!(self.def, SymbolDef::Undefined)
            && !matches!(self.ty, SymbolType::Section | SymbolType::File)
    }
}

/// One `Elf64_Rela` applying to a loaded section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// Index of the section the relocation patches.
    pub section: usize,
    /// Offset of the place inside that section.
    pub offset: u64,
    /// Raw `R_X86_64_*` type.
    pub r_type: u32,
    /// Symbol index (0: no symbol, the value is 0).
    pub symbol: usize,
    pub addend: i64,
}

/// A splice the component declares for itself (`TRAPVEC_SPLICE_*` in `trapvec.h`): the fields of
/// one `.trapvec.splices` record, `key=value` as written. This crate owns the record's text
/// format (which keys, each once) and nothing of its meaning: the instr-manager deserializes the
/// fields into its one splice type (`instr_manager::SpliceRequest::from_declared`). Serialized
/// as a map of the fields (`{"at": .., "action": .., "handler": .., "mechanism": ..}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct DeclaredSplice {
    fields: BTreeMap<String, String>,
}

/// The keys of a `.trapvec.splices` record; each is required, once.
pub const SPLICE_KEYS: [&str; 4] = ["at", "action", "handler", "mechanism"];
/// Keys a record may add (`TRAPVEC_SPLICE_RETURN` writes `when=return`), each at most once.
pub const SPLICE_OPTIONAL_KEYS: [&str; 1] = ["when"];

impl DeclaredSplice {
    /// Parse one record: `at=...;action=...;handler=...;mechanism=...` (all four keys, each
    /// once, in any order), with any of [`SPLICE_OPTIONAL_KEYS`].
    pub fn parse(record: &str) -> Result<DeclaredSplice, ParseError> {
        let err = |reason: String| ParseError::Splice {
            record: record.to_string(),
            reason,
        };
        let mut fields = BTreeMap::new();
        for field in record.split(';') {
            let (key, value) = field
                .split_once('=')
                .ok_or_else(|| err(format!("field {field:?} is not key=value")))?;
            if !SPLICE_KEYS.contains(&key) && !SPLICE_OPTIONAL_KEYS.contains(&key) {
                return Err(err(format!("unknown key {key:?}")));
            }
            if fields.insert(key.to_string(), value.to_string()).is_some() {
                return Err(err(format!("key {key:?} given twice")));
            }
        }
        if let Some(k) = SPLICE_KEYS.iter().find(|k| !fields.contains_key(**k)) {
            return Err(err(format!("key {k:?} missing")));
        }
        Ok(DeclaredSplice { fields })
    }

    /// The value of field `key`, if the record has it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str)
    }

    /// The point as written (empty if the record has none: only a state read back can lack it).
    pub fn at(&self) -> &str {
        self.get("at").unwrap_or_default()
    }

    /// The handler or replacement named by the record.
    pub fn handler(&self) -> &str {
        self.get("handler").unwrap_or_default()
    }

    /// Every field, by key.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.fields.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// An ELF relocatable, owned and checked: little-endian ELF64, `ET_REL`, `EM_X86_64`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    /// Indexed by ELF section index (entry 0 is the null section).
    pub sections: Vec<Section>,
    /// Indexed by ELF symbol index (entry 0 is the null symbol).
    pub symbols: Vec<Symbol>,
    /// Relocations of loaded sections, in file order.
    pub relocations: Vec<Relocation>,
    /// In section order (which is not necessarily source order: compilers may emit the records
    /// of one file in reverse).
    pub declared_splices: Vec<DeclaredSplice>,
}

impl Object {
    /// Name of section `index` for messages (`"section 7"` when out of range).
    pub fn section_name(&self, index: usize) -> String {
        self.sections
            .get(index)
            .map_or_else(|| format!("section {index}"), |s| s.name.clone())
    }

    /// Name of symbol `index` for messages.
    pub fn symbol_name(&self, index: usize) -> String {
        match self.symbols.get(index) {
            Some(s) if !s.name.is_empty() => s.name.clone(),
            Some(_) if index == 0 => "no symbol".to_string(),
            _ => format!("symbol #{index}"),
        }
    }
}

fn class_name(value: u8) -> &'static str {
    match value {
        elf::ELFCLASS32 => "ELFCLASS32",
        elf::ELFCLASS64 => "ELFCLASS64",
        _ => "an unknown class",
    }
}

fn encoding_name(value: u8) -> &'static str {
    match value {
        elf::ELFDATA2LSB => "ELFDATA2LSB",
        elf::ELFDATA2MSB => "ELFDATA2MSB (big endian)",
        _ => "an unknown encoding",
    }
}

fn type_name(value: u16) -> &'static str {
    match value {
        elf::ET_NONE => "ET_NONE",
        elf::ET_REL => "ET_REL",
        elf::ET_EXEC => "ET_EXEC",
        elf::ET_DYN => "ET_DYN",
        elf::ET_CORE => "ET_CORE",
        _ => "an unknown type",
    }
}

fn machine_name(value: u16) -> &'static str {
    match value {
        elf::EM_NONE => "EM_NONE",
        elf::EM_386 => "EM_386",
        elf::EM_ARM => "EM_ARM",
        elf::EM_X86_64 => "EM_X86_64",
        elf::EM_AARCH64 => "EM_AARCH64",
        elf::EM_PPC => "EM_PPC",
        elf::EM_PPC64 => "EM_PPC64",
        elf::EM_S390 => "EM_S390",
        elf::EM_MIPS => "EM_MIPS",
        elf::EM_RISCV => "EM_RISCV",
        elf::EM_LOONGARCH => "EM_LOONGARCH",
        elf::EM_SPARCV9 => "EM_SPARCV9",
        elf::EM_BPF => "EM_BPF",
        _ => "an unknown machine",
    }
}

/// Size of `e_ident`, and the offsets of the class and data-encoding bytes in it.
const EI_NIDENT: usize = 16;
const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;

/// Check the identification and header fields that decide whether this is a component at all,
/// before `object` parses the rest (so the message says *which* field is wrong).
fn check_header(bytes: &[u8]) -> Result<&Header, ParseError> {
    if bytes.len() < EI_NIDENT {
        return Err(ParseError::TooShort { len: bytes.len() });
    }
    if bytes[..4] != elf::ELFMAG {
        return Err(ParseError::NotElf {
            found: trapvec::error::hex(&bytes[..4]),
        });
    }
    let class = bytes[EI_CLASS];
    if class != elf::ELFCLASS64 {
        return Err(ParseError::Class {
            name: class_name(class),
            value: class,
        });
    }
    let encoding = bytes[EI_DATA];
    if encoding != elf::ELFDATA2LSB {
        return Err(ParseError::Encoding {
            name: encoding_name(encoding),
            value: encoding,
        });
    }
    let header = Header::parse(bytes).map_err(|e| malformed("the ELF header (64 bytes)", e))?;
    let e_type = header.e_type.get(LE);
    if e_type != elf::ET_REL {
        return Err(ParseError::Type {
            name: type_name(e_type),
            value: e_type,
        });
    }
    let machine = header.e_machine.get(LE);
    if machine != elf::EM_X86_64 {
        return Err(ParseError::Machine {
            name: machine_name(machine),
            value: machine,
        });
    }
    Ok(header)
}

fn utf8(bytes: &[u8], what: impl FnOnce() -> String) -> Result<String, ParseError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|e| malformed(what(), e))
}

/// Decide where a section goes (see the module docs for the rules).
fn placement(name: &str, sh_type: u32, flags: u64) -> Result<Placement, String> {
    const ALLOC: u64 = elf::SHF_ALLOC as u64;
    const EXEC: u64 = elf::SHF_EXECINSTR as u64;
    const TLS: u64 = elf::SHF_TLS as u64;
    if flags & ALLOC == 0 {
        return Ok(Placement::NotLoaded("not SHF_ALLOC"));
    }
    if name == SPLICES_SECTION {
        return Ok(Placement::NotLoaded(
            "declared splices are parsed, not loaded",
        ));
    }
    if name == ".eh_frame" || sh_type == elf::SHT_X86_64_UNWIND {
        return Ok(Placement::NotLoaded("unwind tables are dropped"));
    }
    if sh_type == elf::SHT_NOTE {
        return Ok(Placement::NotLoaded("notes are dropped"));
    }
    if flags & TLS != 0 {
        return Ok(Placement::NotLoaded(
            "thread-local storage is not supported",
        ));
    }
    let ctor = matches!(
        sh_type,
        elf::SHT_INIT_ARRAY | elf::SHT_FINI_ARRAY | elf::SHT_PREINIT_ARRAY
    ) || [".ctors", ".dtors"]
        .iter()
        .any(|p| name == *p || name.starts_with(&format!("{p}.")));
    if ctor {
        return Err(
            "constructors and destructors are not supported (the loader runs none)".to_string(),
        );
    }
    if flags & EXEC != 0 {
        return Ok(Placement::Code);
    }
    if sh_type == elf::SHT_NOBITS {
        return Ok(Placement::Bss);
    }
    Ok(Placement::Data)
}

/// Parse and check a component's bytes.
pub fn parse(bytes: &[u8]) -> Result<Object, ParseError> {
    let header = check_header(bytes)?;
    let table = header
        .sections(LE, bytes)
        .map_err(|e| malformed("the section headers", e))?;
    let symtab = table
        .symbols(LE, bytes, elf::SHT_SYMTAB)
        .map_err(|e| malformed("the symbol table", e))?;

    let mut sections = Vec::with_capacity(table.len());
    for (index, header) in table.enumerate() {
        let index = index.0;
        let raw_name = table
            .section_name(LE, header)
            .map_err(|e| malformed(format!("the name of section {index}"), e))?;
        let name = utf8(raw_name, || format!("the name of section {index}"))?;
        let sh_type = header.sh_type(LE);
        let flags = header.sh_flags(LE);
        let placement = if index == 0 || sh_type == elf::SHT_NULL {
            Placement::NotLoaded("null section")
        } else {
            placement(&name, sh_type, flags).map_err(|reason| ParseError::Section {
                section: name.clone(),
                reason,
            })?
        };
        let align = header.sh_addralign(LE).max(1);
        let size = header.sh_size(LE);
        let data = match placement {
            Placement::Code | Placement::Data => header
                .data(LE, bytes)
                .map_err(|e| malformed(format!("the contents of section {name}"), e))?
                .to_vec(),
            _ => Vec::new(),
        };
        log::debug!("section {index} {name}: {placement:?}, {size:#x} bytes, align {align}");
        sections.push(Section {
            index,
            name,
            placement,
            size,
            align,
            data,
            sh_type,
            flags,
            info: header.sh_info(LE),
        });
    }

    let symbols = parse_symbols(&symtab, &sections)?;
    let relocations = parse_relocations(&table, symtab.section(), bytes, &sections, symbols.len())?;

    let declared_splices = match sections.iter().find(|s| s.name == SPLICES_SECTION) {
        Some(s) => {
            let header = table
                .section(object::SectionIndex(s.index))
                .map_err(|e| malformed(SPLICES_SECTION, e))?;
            let data = header
                .data(LE, bytes)
                .map_err(|e| malformed(format!("the contents of section {SPLICES_SECTION}"), e))?;
            parse_splices(data)?
        }
        None => Vec::new(),
    };

    Ok(Object {
        sections,
        symbols,
        relocations,
        declared_splices,
    })
}

fn parse_symbols(
    table: &SymbolTable<'_, Header>,
    sections: &[Section],
) -> Result<Vec<Symbol>, ParseError> {
    let mut symbols = Vec::with_capacity(table.len());
    for (index, sym) in table.enumerate() {
        let index = index.0;
        let what = || format!("symbol #{index}");
        let shndx = sym.st_shndx(LE);
        let value = sym.st_value(LE);
        let def = match shndx {
            elf::SHN_UNDEF => SymbolDef::Undefined,
            elf::SHN_ABS => SymbolDef::Absolute(value),
            elf::SHN_COMMON => SymbolDef::Common {
                align: value.max(1),
            },
            _ => {
                let bad = |shndx: u32| {
                    let symbol = table
                        .symbol_name(LE, sym)
                        .ok()
                        .and_then(|n| std::str::from_utf8(n).ok())
                        .filter(|n| !n.is_empty());
                    let symbol = symbol.map_or_else(what, str::to_owned);
                    ParseError::SymbolSection {
                        symbol,
                        index,
                        shndx,
                        sections: sections.len(),
                    }
                };
                match table.symbol_section(LE, sym, object::SymbolIndex(index)) {
                    Ok(Some(s)) if s.0 > 0 && s.0 < sections.len() => {
                        SymbolDef::Section { index: s.0, value }
                    }
                    Ok(Some(s)) => return Err(bad(u32::try_from(s.0).unwrap_or(u32::MAX))),
                    Ok(None) => return Err(bad(u32::from(shndx))),
                    Err(e) => return Err(malformed(what(), e)),
                }
            }
        };
        let ty = match sym.st_type() {
            elf::STT_FUNC | elf::STT_GNU_IFUNC => SymbolType::Function,
            elf::STT_OBJECT | elf::STT_COMMON => SymbolType::Object,
            elf::STT_SECTION => SymbolType::Section,
            elf::STT_FILE => SymbolType::File,
            elf::STT_TLS => SymbolType::Tls,
            _ => SymbolType::Other,
        };
        let binding = match sym.st_bind() {
            elf::STB_LOCAL => Binding::Local,
            elf::STB_WEAK => Binding::Weak,
            _ => Binding::Global,
        };
        let name = match (ty, def) {
            (SymbolType::Section, SymbolDef::Section { index, .. }) => sections[index].name.clone(),
            _ => utf8(
                table
                    .symbol_name(LE, sym)
                    .map_err(|e| malformed(format!("the name of {}", what()), e))?,
                what,
            )?,
        };
        let hidden = matches!(sym.st_visibility(), elf::STV_HIDDEN | elf::STV_INTERNAL);
        symbols.push(Symbol {
            index,
            name,
            def,
            size: sym.st_size(LE),
            ty,
            binding,
            hidden,
        });
    }
    Ok(symbols)
}

fn parse_relocations(
    table: &SectionTable<'_, Header>,
    symtab: object::SectionIndex,
    bytes: &[u8],
    sections: &[Section],
    nsymbols: usize,
) -> Result<Vec<Relocation>, ParseError> {
    let mut relocations = Vec::new();
    for (index, header) in table.enumerate() {
        // `SHT_REL` sections are refused by `validate`, with their name; nothing to read here.
        if header.sh_type(LE) != elf::SHT_RELA {
            continue;
        }
        let index = index.0;
        let name = &sections[index].name;
        let info = header.sh_info(LE);
        let target = usize::try_from(info).unwrap_or(usize::MAX);
        let Some(applies_to) = sections.get(target).filter(|_| target > 0) else {
            return Err(ParseError::RelocationTarget {
                section: name.clone(),
                index,
                target: info,
            });
        };
        if !applies_to.placement.is_loaded() {
            log::debug!(
                "relocation section {name} dropped with {} ({:?})",
                applies_to.name,
                applies_to.placement
            );
            continue;
        }
        let (relas, link) = header
            .rela(LE, bytes)
            .map_err(|e| malformed(format!("relocation section {name}"), e))?
            .ok_or_else(|| malformed(format!("relocation section {name}"), "not SHT_RELA"))?;
        if link != symtab {
            return Err(ParseError::RelocationLink {
                section: name.clone(),
                index,
                link: link.0,
                symtab: symtab.0,
            });
        }
        relocations
            .try_reserve(relas.len())
            .map_err(|e| malformed(format!("relocation section {name}"), e))?;
        for (i, rela) in relas.iter().enumerate() {
            let raw_symbol = rela.r_sym(LE, false);
            let symbol = usize::try_from(raw_symbol).unwrap_or(usize::MAX);
            if symbol >= nsymbols {
                return Err(ParseError::RelocationSymbol {
                    section: name.clone(),
                    entry: i,
                    target: applies_to.name.clone(),
                    offset: rela.r_offset(LE),
                    symbol: u64::from(raw_symbol),
                    symbols: nsymbols,
                });
            }
            relocations.push(Relocation {
                section: target,
                offset: rela.r_offset(LE),
                r_type: rela.r_type(LE, false),
                symbol,
                addend: rela.r_addend(LE),
            });
        }
    }
    Ok(relocations)
}

/// Parse `.trapvec.splices`: NUL-separated records (see [`DeclaredSplice::parse`]). Empty
/// records (padding) are skipped.
pub fn parse_splices(data: &[u8]) -> Result<Vec<DeclaredSplice>, ParseError> {
    let mut out = Vec::new();
    for raw in data.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let record = std::str::from_utf8(raw).map_err(|_| ParseError::Splice {
            record: String::from_utf8_lossy(raw).into_owned(),
            reason: "not UTF-8".to_string(),
        })?;
        out.push(DeclaredSplice::parse(record)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_records_are_split_on_nul_and_padding_is_skipped() {
        let data = b"at=compute+0;action=call;handler=count;mechanism=trap\0\0at=f;action=replace;handler=g;mechanism=jmp\0";
        let got = parse_splices(data).unwrap();
        assert_eq!(
            got,
            vec![
                DeclaredSplice::parse("at=compute+0;action=call;handler=count;mechanism=trap")
                    .unwrap(),
                DeclaredSplice::parse("mechanism=jmp;handler=g;action=replace;at=f").unwrap(),
            ]
        );
        let fields: Vec<(&str, &str)> = got[1].fields().collect();
        assert_eq!(
            fields,
            [
                ("action", "replace"),
                ("at", "f"),
                ("handler", "g"),
                ("mechanism", "jmp")
            ]
        );
        assert_eq!(
            (got[0].at(), got[0].handler(), got[0].get("mechanism")),
            ("compute+0", "count", Some("trap"))
        );
    }

    #[test]
    fn splice_record_missing_or_unknown_keys_is_an_error_naming_the_record() {
        let err = parse_splices(b"at=f;action=call;handler=h\0").unwrap_err();
        assert_eq!(err.to_string(), "declared splice \"at=f;action=call;handler=h\" in .trapvec.splices: key \"mechanism\" missing");
        let err =
            parse_splices(b"at=f;action=call;handler=h;mechanism=trap;colour=red").unwrap_err();
        assert!(err.to_string().contains("unknown key \"colour\""), "{err}");
        let err = parse_splices(b"at=f;at=g;action=call;handler=h;mechanism=trap").unwrap_err();
        assert!(err.to_string().contains("key \"at\" given twice"), "{err}");
    }

    #[test]
    fn header_checks_name_the_wrong_field() {
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(&elf::ELFMAG);
        h[EI_CLASS] = elf::ELFCLASS32;
        assert_eq!(
            check_header(&h).unwrap_err(),
            ParseError::Class {
                name: "ELFCLASS32",
                value: 1
            }
        );
        h[EI_CLASS] = elf::ELFCLASS64;
        h[EI_DATA] = elf::ELFDATA2MSB;
        assert!(check_header(&h)
            .unwrap_err()
            .to_string()
            .starts_with("data encoding is ELFDATA2MSB (big endian) (2)"));
        assert_eq!(
            check_header(&h[..10]).unwrap_err(),
            ParseError::TooShort { len: 10 }
        );
        assert_eq!(
            check_header(b"MZ\x90\0ffffffffffffffff")
                .unwrap_err()
                .to_string(),
            "not an ELF file (first bytes 4d 5a 90 00)"
        );
    }

    #[test]
    fn placement_drops_unwind_notes_and_splices_and_refuses_constructors() {
        let alloc = u64::from(elf::SHF_ALLOC);
        let exec = u64::from(elf::SHF_EXECINSTR);
        assert_eq!(
            placement(".text", elf::SHT_PROGBITS, alloc | exec),
            Ok(Placement::Code)
        );
        assert_eq!(
            placement(".rodata.str1.1", elf::SHT_PROGBITS, alloc),
            Ok(Placement::Data)
        );
        assert_eq!(
            placement(".bss", elf::SHT_NOBITS, alloc),
            Ok(Placement::Bss)
        );
        assert!(!placement(".eh_frame", elf::SHT_X86_64_UNWIND, alloc)
            .unwrap()
            .is_loaded());
        assert!(!placement(".note.gnu.property", elf::SHT_NOTE, alloc)
            .unwrap()
            .is_loaded());
        assert!(!placement(SPLICES_SECTION, elf::SHT_PROGBITS, alloc)
            .unwrap()
            .is_loaded());
        assert!(!placement(".debug_info", elf::SHT_PROGBITS, 0)
            .unwrap()
            .is_loaded());
        assert!(
            !placement(".tbss", elf::SHT_NOBITS, alloc | u64::from(elf::SHF_TLS))
                .unwrap()
                .is_loaded()
        );
        assert!(placement(".init_array", elf::SHT_INIT_ARRAY, alloc).is_err());
        assert!(placement(".ctors.65535", elf::SHT_PROGBITS, alloc).is_err());
        // Kernel components keep `__init` code in `.init.text`: that is ordinary code.
        assert_eq!(
            placement(".init.text", elf::SHT_PROGBITS, alloc | exec),
            Ok(Placement::Code)
        );
    }
}
