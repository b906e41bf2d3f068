//! Relocations: which kinds are supported ([`check`]), which symbols need a GOT slot or a far-call
//! stub ([`indirections`]), and the bytes of the linked images once the blocks' addresses are
//! known ([`link`]). Pure: images are computed in memory; the manager writes them.
//!
//! Supported (`S` symbol, `A` addend, `P` place, `G` the symbol's GOT slot, `L` its stub):
//!
//! | type | value | width, range |
//! |---|---|---|
//! | `R_X86_64_NONE` | nothing | |
//! | `R_X86_64_64` | `S + A` | 64 |
//! | `R_X86_64_PC64` | `S + A - P` | 64 |
//! | `R_X86_64_32` | `S + A` | 32, zero-extended |
//! | `R_X86_64_32S` | `S + A` | 32, sign-extended |
//! | `R_X86_64_PC32` | `S + A - P`; to a far *function*: `L + A - P` | 32, signed |
//! | `R_X86_64_PLT32` | `S + A - P`; when that does not reach: `L + A - P` | 32, signed |
//! | `R_X86_64_GOTPCREL`, `GOTPCRELX`, `REX_GOTPCRELX` | `G + A - P` | 32, signed |
//!
//! `GOTPCRELX` loads are not relaxed into `lea`: the slot always exists and holds `S`, which is
//! correct whatever the instruction. A stub is `jmp qword ptr [rip+G]` in the code block; it is
//! reserved for every PLT32/PC32 target whose address is fixed before allocation (imports and
//! absolute symbols) and written only when a place cannot reach the target directly.

use std::collections::BTreeSet;
use std::fmt;

use object::elf;
use thiserror::Error;
use trapvec::{BlockKind, SymbolKind};

use crate::layout::{Layout, SLOT_SIZE, STUB_SIZE};
use crate::parse::{Object, Placement, Relocation, SymbolDef};
use crate::resolve::Import;

/// A raw `R_X86_64_*` type, displayed as `R_X86_64_PC32 (2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RelocType(pub u32);

impl RelocType {
    /// The ELF name of the type, when it is an x86-64 relocation type.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            elf::R_X86_64_NONE => "R_X86_64_NONE",
            elf::R_X86_64_64 => "R_X86_64_64",
            elf::R_X86_64_PC32 => "R_X86_64_PC32",
            elf::R_X86_64_GOT32 => "R_X86_64_GOT32",
            elf::R_X86_64_PLT32 => "R_X86_64_PLT32",
            elf::R_X86_64_COPY => "R_X86_64_COPY",
            elf::R_X86_64_GLOB_DAT => "R_X86_64_GLOB_DAT",
            elf::R_X86_64_JUMP_SLOT => "R_X86_64_JUMP_SLOT",
            elf::R_X86_64_RELATIVE => "R_X86_64_RELATIVE",
            elf::R_X86_64_GOTPCREL => "R_X86_64_GOTPCREL",
            elf::R_X86_64_32 => "R_X86_64_32",
            elf::R_X86_64_32S => "R_X86_64_32S",
            elf::R_X86_64_16 => "R_X86_64_16",
            elf::R_X86_64_PC16 => "R_X86_64_PC16",
            elf::R_X86_64_8 => "R_X86_64_8",
            elf::R_X86_64_PC8 => "R_X86_64_PC8",
            elf::R_X86_64_DTPMOD64 => "R_X86_64_DTPMOD64",
            elf::R_X86_64_DTPOFF64 => "R_X86_64_DTPOFF64",
            elf::R_X86_64_TPOFF64 => "R_X86_64_TPOFF64",
            elf::R_X86_64_TLSGD => "R_X86_64_TLSGD",
            elf::R_X86_64_TLSLD => "R_X86_64_TLSLD",
            elf::R_X86_64_DTPOFF32 => "R_X86_64_DTPOFF32",
            elf::R_X86_64_GOTTPOFF => "R_X86_64_GOTTPOFF",
            elf::R_X86_64_TPOFF32 => "R_X86_64_TPOFF32",
            elf::R_X86_64_PC64 => "R_X86_64_PC64",
            elf::R_X86_64_GOTOFF64 => "R_X86_64_GOTOFF64",
            elf::R_X86_64_GOTPC32 => "R_X86_64_GOTPC32",
            elf::R_X86_64_GOT64 => "R_X86_64_GOT64",
            elf::R_X86_64_GOTPCREL64 => "R_X86_64_GOTPCREL64",
            elf::R_X86_64_GOTPC64 => "R_X86_64_GOTPC64",
            elf::R_X86_64_GOTPLT64 => "R_X86_64_GOTPLT64",
            elf::R_X86_64_PLTOFF64 => "R_X86_64_PLTOFF64",
            elf::R_X86_64_SIZE32 => "R_X86_64_SIZE32",
            elf::R_X86_64_SIZE64 => "R_X86_64_SIZE64",
            elf::R_X86_64_GOTPC32_TLSDESC => "R_X86_64_GOTPC32_TLSDESC",
            elf::R_X86_64_TLSDESC_CALL => "R_X86_64_TLSDESC_CALL",
            elf::R_X86_64_TLSDESC => "R_X86_64_TLSDESC",
            elf::R_X86_64_IRELATIVE => "R_X86_64_IRELATIVE",
            elf::R_X86_64_RELATIVE64 => "R_X86_64_RELATIVE64",
            elf::R_X86_64_GOTPCRELX => "R_X86_64_GOTPCRELX",
            elf::R_X86_64_REX_GOTPCRELX => "R_X86_64_REX_GOTPCRELX",
            _ => return None,
        })
    }

    /// Bytes patched at the place, for the supported types.
    fn width(self) -> Option<u64> {
        match self.0 {
            elf::R_X86_64_NONE => Some(0),
            elf::R_X86_64_64 | elf::R_X86_64_PC64 => Some(8),
            elf::R_X86_64_32
            | elf::R_X86_64_32S
            | elf::R_X86_64_PC32
            | elf::R_X86_64_PLT32
            | elf::R_X86_64_GOTPCREL
            | elf::R_X86_64_GOTPCRELX
            | elf::R_X86_64_REX_GOTPCRELX => Some(4),
            _ => None,
        }
    }

    fn uses_got(self) -> bool {
        matches!(
            self.0,
            elf::R_X86_64_GOTPCREL | elf::R_X86_64_GOTPCRELX | elf::R_X86_64_REX_GOTPCRELX
        )
    }
}

impl fmt::Display for RelocType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "of unknown type {}", self.0),
        }
    }
}

/// A relocation that cannot be applied.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RelocError {
    #[error("relocation {kind} at {section}+{offset:#x} is not supported")]
    Unsupported {
        kind: RelocType,
        section: String,
        offset: u64,
    },
    #[error(
        "relocation {kind} at {section}+{offset:#x} lies outside the section ({size:#x} bytes)"
    )]
    OutOfBounds {
        kind: RelocType,
        section: String,
        offset: u64,
        size: u64,
    },
    #[error("relocation {kind} at {section}+{offset:#x} patches a section without contents")]
    NoContents {
        kind: RelocType,
        section: String,
        offset: u64,
    },
    #[error("relocation {kind} at {section}+{offset:#x} refers to {symbol} in section {symbol_section}, which is not loaded ({why})")]
    NotLoaded {
        kind: RelocType,
        section: String,
        offset: u64,
        symbol: String,
        symbol_section: String,
        why: &'static str,
    },
    #[error(
        "relocation {kind} at {section}+{offset:#x} refers to {symbol}, which has no definition"
    )]
    Undefined {
        kind: RelocType,
        section: String,
        offset: u64,
        symbol: String,
    },
    #[error("relocation {kind} at {section}+{offset:#x} against {symbol}: value {value} does not fit in {width}")]
    Overflow {
        kind: RelocType,
        section: String,
        offset: u64,
        symbol: String,
        value: String,
        width: &'static str,
    },
    #[error("relocation {kind} at {section}+{offset:#x} against data symbol {symbol} at {target:#x}: out of rel32 reach of the place {place:#x}")]
    FarData {
        kind: RelocType,
        section: String,
        offset: u64,
        symbol: String,
        target: u64,
        place: u64,
    },
    #[error("call stub of {symbol} at {stub:#x} cannot reach its GOT slot at {slot:#x}")]
    StubReach {
        symbol: String,
        stub: u64,
        slot: u64,
    },
    #[error("relocation {kind} at {section}+{offset:#x} against {symbol} with addend {addend}: the instruction would reach outside {bound}")]
    TargetOutside {
        kind: RelocType,
        section: String,
        offset: u64,
        symbol: String,
        addend: i64,
        bound: String,
    },
    #[error("relocation {kind} at {section}+{offset:#x} is a call or jump to {symbol}, which is {what}, not code")]
    CallToData {
        kind: RelocType,
        section: String,
        offset: u64,
        symbol: String,
        what: String,
    },
    #[error("cannot allocate the {kind:?} image ({size:#x} bytes): {reason}")]
    NoMemory {
        kind: BlockKind,
        size: usize,
        reason: String,
    },
}

/// Bytes from a rel32 field to the end of its instruction: the field itself, then at most a
/// 4-byte immediate (`addl $imm32, x(%rip)`). The instruction reaches `S + A + k` for one `k`
/// of these; the loader does not decode instructions, so it accepts any.
const REL32_TAIL: std::ops::RangeInclusive<i128> = 4..=8;

/// Whether an instruction whose rel32 field holds `t - P` (`t = S + A` relative to the start of
/// an object of `size` bytes) reaches into `[0, size]` (its end included, for `&a[n]`).
fn reaches_inside(t: i128, size: u64) -> bool {
    t + REL32_TAIL.end() >= 0 && t + REL32_TAIL.start() <= i128::from(size)
}

/// Refuse RIP-relative relocations whose addend sends the instruction outside what the symbol
/// designates, before anything is allocated:
/// - `PC32`/`PLT32` in code against a symbol the component defines (a section symbol, a local
///   or global definition, a common): the instruction's target lies in the symbol's section
///   (for a common, inside the common), allowing [`REL32_TAIL`];
/// - against an import that is a function: exactly at it (`A` is `-4`, to `-8` with an
///   immediate after the field), against an import of known size: inside it; imports of unknown
///   size (kernel symbols, extra symbols that are not functions) cannot be bounded;
/// - GOT-relative kinds: exactly at the symbol's GOT slot;
/// - `PLT32` (what compilers emit for `call`/`jmp` only) never reaches data: not an import
///   known to be an object, not a definition in a section loaded as data.
///
/// `PC32` in data sections (`.long a - b` tables, the kernel's exception and alternatives
/// tables) is a difference between two places, not an instruction's target, and is not
/// bounded here.
pub fn check_targets(obj: &Object, imports: &[Option<Import>]) -> Result<(), RelocError> {
    for r in &obj.relocations {
        let kind = RelocType(r.r_type);
        let a = i128::from(r.addend);
        let outside = |bound: String| RelocError::TargetOutside {
            kind,
            section: obj.section_name(r.section),
            offset: r.offset,
            symbol: obj.symbol_name(r.symbol),
            addend: r.addend,
            bound,
        };
        let exactly = |a: i128| REL32_TAIL.contains(&-a);
        if kind.uses_got() {
            if !exactly(a) {
                return Err(outside("its GOT slot".to_string()));
            }
            continue;
        }
        let in_code = obj
            .sections
            .get(r.section)
            .is_some_and(|s| s.placement == Placement::Code);
        if !matches!(r.r_type, elf::R_X86_64_PC32 | elf::R_X86_64_PLT32)
            || !in_code
            || r.symbol == 0
        {
            continue;
        }
        let Some(sym) = obj.symbols.get(r.symbol) else {
            continue;
        };
        if r.r_type == elf::R_X86_64_PLT32 {
            let data = match sym.def {
                SymbolDef::Section { index, .. } => obj
                    .sections
                    .get(index)
                    .filter(|s| s.placement != Placement::Code)
                    .map(|s| format!("in section {} (#{index})", s.name)),
                SymbolDef::Common { .. } => Some("a common symbol".to_string()),
                SymbolDef::Undefined => imports
                    .get(r.symbol)
                    .and_then(Option::as_ref)
                    .filter(|i| i.kind == SymbolKind::Object)
                    .map(|i| format!("a data symbol at {:#x}", i.addr)),
                SymbolDef::Absolute(_) => None,
            };
            if let Some(what) = data {
                return Err(RelocError::CallToData {
                    kind,
                    section: obj.section_name(r.section),
                    offset: r.offset,
                    symbol: obj.symbol_name(r.symbol),
                    what,
                });
            }
        }
        match sym.def {
            SymbolDef::Section { index, value } => {
                let size = obj.sections.get(index).map_or(0, |s| s.size);
                if !reaches_inside(i128::from(value) + a, size) {
                    return Err(outside(format!(
                        "section {} ({size:#x} bytes)",
                        obj.section_name(index)
                    )));
                }
            }
            SymbolDef::Common { .. } => {
                if !reaches_inside(a, sym.size) {
                    return Err(outside(format!(
                        "common symbol {} ({:#x} bytes)",
                        sym.name, sym.size
                    )));
                }
            }
            SymbolDef::Undefined => match imports.get(r.symbol).and_then(Option::as_ref) {
                Some(i) if i.kind == SymbolKind::Function && !exactly(a) => {
                    return Err(outside(format!("function {} at {:#x}", i.name, i.addr)));
                }
                Some(i)
                    if i.kind != SymbolKind::Function
                        && i.size > 0
                        && !reaches_inside(a, i.size) =>
                {
                    return Err(outside(format!(
                        "{} at {:#x} ({:#x} bytes)",
                        i.name, i.addr, i.size
                    )));
                }
                _ => {}
            },
            SymbolDef::Absolute(_) => {}
        }
    }
    Ok(())
}

/// A buffer of `len` bytes of `fill`, or an error if the memory cannot be had (never an abort).
fn filled(kind: BlockKind, len: usize, fill: u8) -> Result<Vec<u8>, RelocError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|e| RelocError::NoMemory {
        kind,
        size: len,
        reason: e.to_string(),
    })?;
    v.resize(len, fill);
    Ok(v)
}

/// Refuse what cannot be linked, before anything is allocated: unsupported types, places outside
/// their section or in a section without contents, targets in sections that are not loaded.
pub fn check(obj: &Object) -> Result<(), RelocError> {
    for r in &obj.relocations {
        let kind = RelocType(r.r_type);
        let section = &obj.sections[r.section];
        let at = || (section.name.clone(), r.offset);
        let Some(width) = kind.width() else {
            let (section, offset) = at();
            return Err(RelocError::Unsupported {
                kind,
                section,
                offset,
            });
        };
        if section.placement == Placement::Bss {
            let (section, offset) = at();
            return Err(RelocError::NoContents {
                kind,
                section,
                offset,
            });
        }
        if !matches!(r.offset.checked_add(width), Some(end) if end <= section.size) {
            let (section_name, offset) = at();
            return Err(RelocError::OutOfBounds {
                kind,
                section: section_name,
                offset,
                size: section.size,
            });
        }
        if let SymbolDef::Section { index, .. } = obj.symbols[r.symbol].def {
            if let Placement::NotLoaded(why) = obj.sections[index].placement {
                let (section, offset) = at();
                return Err(RelocError::NotLoaded {
                    kind,
                    section,
                    offset,
                    symbol: obj.symbol_name(r.symbol),
                    symbol_section: obj.sections[index].name.clone(),
                    why,
                });
            }
        }
    }
    Ok(())
}

/// Symbols needing a GOT slot (GOT-relative relocations), and symbols for which a far-call stub
/// is reserved (PLT32 targets, and PC32 targets that are functions, whose address is fixed
/// before allocation: imports and absolute symbols).
pub fn indirections(
    obj: &Object,
    imports: &[Option<Import>],
) -> (BTreeSet<usize>, BTreeSet<usize>) {
    let mut got = BTreeSet::new();
    let mut stubs = BTreeSet::new();
    for r in obj.relocations.iter().filter(|r| r.symbol != 0) {
        let kind = RelocType(r.r_type);
        if kind.uses_got() {
            got.insert(r.symbol);
            continue;
        }
        let fixed_function = match (
            &obj.symbols[r.symbol].def,
            imports.get(r.symbol).and_then(Option::as_ref),
        ) {
            (SymbolDef::Undefined, Some(import)) => Some(import.kind == SymbolKind::Function),
            (SymbolDef::Absolute(_), _) => {
                Some(obj.symbols[r.symbol].ty == crate::parse::SymbolType::Function)
            }
            _ => None,
        };
        match (r.r_type, fixed_function) {
            (elf::R_X86_64_PLT32, Some(_)) | (elf::R_X86_64_PC32, Some(true)) => {
                stubs.insert(r.symbol);
            }
            _ => {}
        }
    }
    (got, stubs)
}

/// The linked contents of both blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// Code block contents (padding is `int3`).
    pub code: Vec<u8>,
    /// Data block contents (bss and padding are zero).
    pub data: Vec<u8>,
    /// Symbols whose stub some place actually uses (the others stay `int3`).
    pub stubs_used: BTreeSet<usize>,
}

/// A value computed exactly (in `i128`) reduced to the 64 bits the CPU works with: addresses
/// wrap modulo 2^64, so `0xffff_ffff_a000_0000` and `-0x6000_0000` are the same word.
fn wrap64(value: i128) -> u64 {
    u64::try_from(value.rem_euclid(1i128 << 64)).unwrap_or(0)
}

/// A 64-bit field (`R_X86_64_64`, `R_X86_64_PC64`).
fn word64(value: i128) -> [u8; 8] {
    wrap64(value).to_le_bytes()
}

/// A 32-bit field that the CPU sign-extends (`PC32`, `PLT32`, `32S`, the GOT-relative kinds):
/// the 64-bit word must be the sign extension of its low 32 bits.
fn signed32(value: i128) -> Option<[u8; 4]> {
    let word = i64::from_le_bytes(wrap64(value).to_le_bytes());
    i32::try_from(word).ok().map(i32::to_le_bytes)
}

/// A 32-bit field that the CPU zero-extends (`R_X86_64_32`).
fn unsigned32(value: i128) -> Option<[u8; 4]> {
    u32::try_from(wrap64(value)).ok().map(u32::to_le_bytes)
}

/// `jmp qword ptr [rip+disp32]` at `stub`, reading the slot at `slot`.
fn stub_bytes(stub: u64, slot: u64) -> Option<[u8; STUB_SIZE]> {
    let disp = signed32(i128::from(slot) - i128::from(stub) - 6)?;
    let mut bytes = [0xCC; STUB_SIZE];
    bytes[..2].copy_from_slice(&[0xFF, 0x25]);
    bytes[2..6].copy_from_slice(&disp);
    Some(bytes)
}

/// The value as the 64-bit word it would be, in hex (negative words shown as such).
fn show(value: i128) -> String {
    let word = i64::from_le_bytes(wrap64(value).to_le_bytes());
    if word < 0 && value < 0 {
        format!("-{:#x}", word.unsigned_abs())
    } else {
        format!("{:#x}", wrap64(value))
    }
}

/// Addresses of the linked blocks and of everything in them.
struct Addresses<'a> {
    obj: &'a Object,
    layout: &'a Layout,
    imports: &'a [Option<Import>],
    code_base: u64,
    data_base: u64,
}

impl Addresses<'_> {
    fn base(&self, kind: BlockKind) -> u64 {
        match kind {
            BlockKind::Code => self.code_base,
            BlockKind::Data => self.data_base,
        }
    }

    fn at(&self, kind: BlockKind, offset: usize) -> u64 {
        self.base(kind) + offset as u64
    }

    /// Address of section `index` (loaded sections only).
    fn section(&self, index: usize) -> Option<u64> {
        self.layout
            .sections
            .get(index)
            .copied()
            .flatten()
            .map(|s| self.at(s.kind, s.offset))
    }

    /// `S` of symbol `index`; `None` for an undefined symbol without a resolution.
    fn symbol(&self, index: usize) -> Option<u64> {
        if index == 0 {
            return Some(0);
        }
        match self.obj.symbols.get(index)?.def {
            SymbolDef::Undefined => self.imports.get(index)?.as_ref().map(|i| i.addr),
            SymbolDef::Section { index: s, value } => {
                self.section(s).map(|a| a.wrapping_add(value))
            }
            SymbolDef::Absolute(v) => Some(v),
            SymbolDef::Common { .. } => self
                .layout
                .commons
                .get(&index)
                .map(|&o| self.at(BlockKind::Data, o)),
        }
    }

    fn slot(&self, symbol: usize) -> Option<u64> {
        self.layout
            .got
            .get(&symbol)
            .map(|&o| self.at(BlockKind::Data, o))
    }

    fn stub(&self, symbol: usize) -> Option<u64> {
        self.layout
            .stubs
            .get(&symbol)
            .map(|&o| self.at(BlockKind::Code, o))
    }
}

/// Compute both images with every relocation applied, for blocks whose first bytes are at
/// `code_base` and `data_base`. [`check`] must have accepted `obj` (and [`check_targets`] its
/// imports); the images are allocated fallibly.
pub fn link(
    obj: &Object,
    layout: &Layout,
    imports: &[Option<Import>],
    code_base: u64,
    data_base: u64,
) -> Result<Images, RelocError> {
    let addrs = Addresses {
        obj,
        layout,
        imports,
        code_base,
        data_base,
    };
    let mut code = filled(BlockKind::Code, layout.code.size, 0xCC)?;
    let mut data = filled(BlockKind::Data, layout.data.size, 0)?;

    for s in &obj.sections {
        if let (Some(slot), Placement::Code | Placement::Data) =
            (layout.sections[s.index], s.placement)
        {
            let image = if slot.kind == BlockKind::Code {
                &mut code
            } else {
                &mut data
            };
            if let Some(dst) = image.get_mut(slot.offset..slot.offset + s.data.len()) {
                dst.copy_from_slice(&s.data);
            }
        }
    }

    for (&sym, &offset) in &layout.got {
        let value = addrs.symbol(sym).unwrap_or(0);
        if let Some(dst) = data.get_mut(offset..offset + SLOT_SIZE) {
            dst.copy_from_slice(&value.to_le_bytes());
        }
    }

    let mut stubs_used = BTreeSet::new();
    for r in &obj.relocations {
        let Some(slot) = layout.sections[r.section] else {
            continue;
        };
        let place = addrs.at(slot.kind, slot.offset).wrapping_add(r.offset);
        let bytes = apply(&addrs, r, place, &mut stubs_used)?;
        let image = if slot.kind == BlockKind::Code {
            &mut code
        } else {
            &mut data
        };
        let start = usize::try_from(r.offset)
            .ok()
            .and_then(|o| o.checked_add(slot.offset));
        if let Some(dst) = start.and_then(|s| image.get_mut(s..s + bytes.len())) {
            dst.copy_from_slice(&bytes);
        }
    }

    for &sym in &stubs_used {
        let (Some(stub), Some(slot)) = (addrs.stub(sym), addrs.slot(sym)) else {
            continue;
        };
        let bytes = stub_bytes(stub, slot).ok_or_else(|| RelocError::StubReach {
            symbol: obj.symbol_name(sym),
            stub,
            slot,
        })?;
        let offset = layout.stubs[&sym];
        code[offset..offset + STUB_SIZE].copy_from_slice(&bytes);
        log::debug!(
            "stub for {} at {stub:#x} through slot {slot:#x}",
            obj.symbol_name(sym)
        );
    }

    Ok(Images {
        code,
        data,
        stubs_used,
    })
}

/// The bytes one relocation writes at `place`.
fn apply(
    addrs: &Addresses<'_>,
    r: &Relocation,
    place: u64,
    stubs_used: &mut BTreeSet<usize>,
) -> Result<Vec<u8>, RelocError> {
    let obj = addrs.obj;
    let kind = RelocType(r.r_type);
    let section = || obj.section_name(r.section);
    let symbol = || obj.symbol_name(r.symbol);
    let s = addrs
        .symbol(r.symbol)
        .ok_or_else(|| RelocError::Undefined {
            kind,
            section: section(),
            offset: r.offset,
            symbol: symbol(),
        })?;
    let (s, a, p) = (i128::from(s), i128::from(r.addend), i128::from(place));
    let overflow = |value: i128, width: &'static str| RelocError::Overflow {
        kind,
        section: section(),
        offset: r.offset,
        symbol: symbol(),
        value: show(value),
        width,
    };
    match r.r_type {
        elf::R_X86_64_NONE => Ok(Vec::new()),
        elf::R_X86_64_64 => Ok(word64(s + a).to_vec()),
        elf::R_X86_64_PC64 => Ok(word64(s + a - p).to_vec()),
        elf::R_X86_64_32 => unsigned32(s + a)
            .map(|b| b.to_vec())
            .ok_or_else(|| overflow(s + a, "32 bits (zero-extended)")),
        elf::R_X86_64_32S => signed32(s + a)
            .map(|b| b.to_vec())
            .ok_or_else(|| overflow(s + a, "32 bits (sign-extended)")),
        elf::R_X86_64_GOTPCREL | elf::R_X86_64_GOTPCRELX | elf::R_X86_64_REX_GOTPCRELX => {
            let g = addrs
                .slot(r.symbol)
                .map(i128::from)
                .ok_or_else(|| overflow(s, "a GOT slot (none was laid out)"))?;
            signed32(g + a - p)
                .map(|b| b.to_vec())
                .ok_or_else(|| overflow(g + a - p, "32 bits (signed, GOT slot)"))
        }
        elf::R_X86_64_PC32 | elf::R_X86_64_PLT32 => {
            if let Some(b) = signed32(s + a - p) {
                return Ok(b.to_vec());
            }
            if let Some(stub) = addrs.stub(r.symbol) {
                let l = i128::from(stub);
                log::debug!(
                    "{kind} at {}+{:#x}: {} is out of rel32 reach, going through its stub",
                    section(),
                    r.offset,
                    symbol()
                );
                stubs_used.insert(r.symbol);
                return signed32(l + a - p)
                    .map(|b| b.to_vec())
                    .ok_or_else(|| overflow(l + a - p, "32 bits (signed, to the stub)"));
            }
            let is_code = |sym: usize| match obj.symbols[sym].def {
                SymbolDef::Undefined => addrs
                    .imports
                    .get(sym)
                    .and_then(Option::as_ref)
                    .is_some_and(|i| i.kind == SymbolKind::Function),
                _ => obj.symbols[sym].ty == crate::parse::SymbolType::Function,
            };
            if r.r_type == elf::R_X86_64_PC32 && !is_code(r.symbol) {
                return Err(RelocError::FarData {
                    kind,
                    section: section(),
                    offset: r.offset,
                    symbol: symbol(),
                    target: addrs.symbol(r.symbol).unwrap_or(0),
                    place,
                });
            }
            Err(overflow(s + a - p, "32 bits (signed)"))
        }
        _ => Err(RelocError::Unsupported {
            kind,
            section: section(),
            offset: r.offset,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout;
    use crate::parse::{Binding, Section, Symbol, SymbolType};
    use crate::resolve::ImportSource;

    const CODE: u64 = 0x5555_0000_0000;
    const DATA: u64 = 0x5555_0001_0000;
    const NEAR_FN: u64 = 0x5555_4000_0000;
    const FAR_FN: u64 = 0x7fff_f7a0_0000;
    const FAR_VAR: u64 = 0x7fff_f7e0_0010;

    fn sym(index: usize, name: &str, def: SymbolDef, ty: SymbolType) -> Symbol {
        Symbol {
            index,
            name: name.into(),
            def,
            size: 0,
            ty,
            binding: Binding::Global,
            hidden: false,
        }
    }

    fn rela(offset: u64, r_type: u32, symbol: usize, addend: i64) -> Relocation {
        Relocation {
            section: 1,
            offset,
            r_type,
            symbol,
            addend,
        }
    }

    #[rustfmt::skip]
    const TEXT: &[u8] = &[
        /*0000*/ 0xE8, 0, 0, 0, 0,                   // call near_fn            PLT32 -4
        /*0005*/ 0xE8, 0, 0, 0, 0,                   // call far_fn             PLT32 -4 (stub)
        /*000a*/ 0x48, 0x8B, 0x05, 0, 0, 0, 0,       // mov rax,[rip+far_var]   REX_GOTPCRELX -4
        /*0011*/ 0x48, 0x8D, 0x3D, 0, 0, 0, 0,       // lea rdi,[rip+.rodata+2] PC32 (2-4)
        /*0018*/ 0x48, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, // movabs rax,.rodata+1    64 +1
        /*0022*/ 0xC3,                               // ret
    ];

    fn object() -> Object {
        let section = |index, name: &str, placement, data: &[u8], align| Section {
            index,
            name: name.into(),
            placement,
            size: data.len() as u64,
            align,
            data: data.to_vec(),
            sh_type: if placement == Placement::NotLoaded("null section") {
                elf::SHT_NULL
            } else {
                elf::SHT_PROGBITS
            },
            flags: 0,
            info: 0,
        };
        Object {
            sections: vec![
                section(0, "", Placement::NotLoaded("null section"), &[], 1),
                section(1, ".text", Placement::Code, TEXT, 16),
                section(2, ".rodata", Placement::Data, b"hello\0", 8),
                section(
                    3,
                    ".eh_frame",
                    Placement::NotLoaded("unwind tables are dropped"),
                    &[],
                    8,
                ),
            ],
            symbols: vec![
                sym(0, "", SymbolDef::Undefined, SymbolType::Other),
                sym(1, "near_fn", SymbolDef::Undefined, SymbolType::Other),
                sym(2, "far_fn", SymbolDef::Undefined, SymbolType::Other),
                sym(3, "far_var", SymbolDef::Undefined, SymbolType::Other),
                sym(
                    4,
                    ".rodata",
                    SymbolDef::Section { index: 2, value: 0 },
                    SymbolType::Section,
                ),
                sym(
                    5,
                    ".eh_frame",
                    SymbolDef::Section { index: 3, value: 0 },
                    SymbolType::Section,
                ),
            ],
            relocations: vec![
                rela(0x01, elf::R_X86_64_PLT32, 1, -4),
                rela(0x06, elf::R_X86_64_PLT32, 2, -4),
                rela(0x0d, elf::R_X86_64_REX_GOTPCRELX, 3, -4),
                rela(0x14, elf::R_X86_64_PC32, 4, -2),
                rela(0x1a, elf::R_X86_64_64, 4, 1),
            ],
            declared_splices: vec![],
        }
    }

    fn imports(obj: &Object) -> Vec<Option<Import>> {
        let import = |name: &str, addr, kind| {
            Some(Import {
                name: name.into(),
                addr,
                kind,
                size: 8,
                source: ImportSource::Target,
            })
        };
        let mut v = vec![None; obj.symbols.len()];
        v[1] = import("near_fn", NEAR_FN, SymbolKind::Function);
        v[2] = import("far_fn", FAR_FN, SymbolKind::Function);
        v[3] = import("far_var", FAR_VAR, SymbolKind::Object);
        v
    }

    fn link_all(obj: &Object) -> Result<(Layout, Images), RelocError> {
        check(obj)?;
        let imports = imports(obj);
        check_targets(obj, &imports)?;
        let (got, stubs) = indirections(obj, &imports);
        let layout = layout::plan(obj, &got, &stubs).unwrap();
        let images = link(obj, &layout, &imports, CODE, DATA)?;
        Ok((layout, images))
    }

    fn rel32_target(code: &[u8], field: usize) -> u64 {
        let disp = i32::from_le_bytes(code[field..field + 4].try_into().unwrap());
        (CODE + field as u64 + 4).wrapping_add_signed(i64::from(disp))
    }

    #[test]
    fn byte_table_links_calls_got_loads_pc32_and_abs64_to_their_targets() {
        let obj = object();
        let (layout, images) = link_all(&obj).unwrap();
        let code = &images.code;
        // call near_fn: direct.
        assert_eq!(rel32_target(code, 0x01), NEAR_FN);
        // call far_fn: through the stub, which jumps through far_fn's slot holding FAR_FN.
        let stub = CODE + layout.stubs[&2] as u64;
        assert_eq!(rel32_target(code, 0x06), stub);
        let stub_off = layout.stubs[&2];
        assert_eq!(&code[stub_off..stub_off + 2], &[0xFF, 0x25]);
        let slot = (stub + 6).wrapping_add_signed(i64::from(i32::from_le_bytes(
            code[stub_off + 2..stub_off + 6].try_into().unwrap(),
        )));
        assert_eq!(slot, DATA + layout.got[&2] as u64);
        assert_eq!(
            &images.data[layout.got[&2]..layout.got[&2] + 8],
            &FAR_FN.to_le_bytes()
        );
        // mov rax,[rip+slot]: far_var's slot holds FAR_VAR.
        assert_eq!(rel32_target(code, 0x0d), DATA + layout.got[&3] as u64);
        assert_eq!(
            &images.data[layout.got[&3]..layout.got[&3] + 8],
            &FAR_VAR.to_le_bytes()
        );
        // lea rdi,[rip+.rodata+2] -> "llo".
        let rodata = DATA + layout.sections[2].unwrap().offset as u64;
        assert_eq!(rel32_target(code, 0x14), rodata + 2);
        // movabs rax, .rodata+1.
        assert_eq!(&code[0x1a..0x22], &(rodata + 1).to_le_bytes());
        // Everything else is the original bytes; the rodata is in place.
        assert_eq!(code[0x22], 0xC3);
        assert_eq!(&images.data[..6], b"hello\0");
        assert_eq!(images.stubs_used, BTreeSet::from([2]));
    }

    #[test]
    fn a_near_plt32_target_reserves_a_stub_but_does_not_use_it() {
        let obj = object();
        let (layout, images) = link_all(&obj).unwrap();
        // near_fn got a stub reserved (its address was fixed) but the call reached directly.
        let off = layout.stubs[&1];
        assert_eq!(&images.code[off..off + STUB_SIZE], &[0xCC; STUB_SIZE]);
    }

    #[test]
    fn pc32_to_far_data_is_an_error_naming_symbol_section_and_offset() {
        let mut obj = object();
        obj.relocations[2].r_type = elf::R_X86_64_PC32;
        let err = link_all(&obj).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("relocation R_X86_64_PC32 (2) at .text+0xd against data symbol far_var at {FAR_VAR:#x}: out of rel32 reach of the place {:#x}", CODE + 0xd)
        );
    }

    #[test]
    fn abs32_and_abs32s_refuse_values_out_of_range() {
        let mut obj = object();
        obj.relocations[4] = rela(0x1a, elf::R_X86_64_32, 4, 0);
        let err = link_all(&obj).unwrap_err();
        let rodata = DATA; // .rodata is the first thing in the data block
        assert_eq!(
            err.to_string(),
            format!("relocation R_X86_64_32 (10) at .text+0x1a against .rodata: value {rodata:#x} does not fit in 32 bits (zero-extended)")
        );
        obj.relocations[4].r_type = elf::R_X86_64_32S;
        assert!(matches!(
            link_all(&obj).unwrap_err(),
            RelocError::Overflow {
                width: "32 bits (sign-extended)",
                ..
            }
        ));
    }

    #[test]
    fn unsupported_types_are_named_with_number_section_and_offset() {
        let mut obj = object();
        obj.relocations[3].r_type = elf::R_X86_64_TPOFF32;
        assert_eq!(
            check(&obj).unwrap_err().to_string(),
            "relocation R_X86_64_TPOFF32 (23) at .text+0x14 is not supported"
        );
        obj.relocations[3].r_type = 200;
        assert_eq!(
            check(&obj).unwrap_err().to_string(),
            "relocation of unknown type 200 at .text+0x14 is not supported"
        );
    }

    #[test]
    fn relocations_against_dropped_sections_and_past_the_end_are_refused() {
        let mut obj = object();
        obj.relocations[3].symbol = 5;
        assert_eq!(
            check(&obj).unwrap_err().to_string(),
            "relocation R_X86_64_PC32 (2) at .text+0x14 refers to .eh_frame in section .eh_frame, which is not loaded (unwind tables are dropped)"
        );
        let mut obj = object();
        obj.relocations[4].offset = 0x1f;
        assert!(matches!(
            check(&obj).unwrap_err(),
            RelocError::OutOfBounds {
                offset: 0x1f,
                size: 0x23,
                ..
            }
        ));
    }

    #[test]
    fn image_buffers_of_an_impossible_size_are_an_error_not_an_abort() {
        assert!(matches!(
            filled(BlockKind::Data, usize::MAX, 0),
            Err(RelocError::NoMemory {
                kind: BlockKind::Data,
                size: usize::MAX,
                ..
            })
        ));
        assert_eq!(filled(BlockKind::Code, 3, 0xCC).unwrap(), vec![0xCC; 3]);
    }

    #[test]
    fn rel32_targets_may_reach_anywhere_from_the_start_to_the_end_of_their_object() {
        // `S + A` relative to a 16-byte object: -8 (`cmpl $imm32` at its start) to 12 (`call`
        // to its end, `&a[n]`).
        for (t, inside) in [
            (-9, false),
            (-8, true),
            (-4, true),
            (0, true),
            (12, true),
            (13, false),
        ] {
            assert_eq!(reaches_inside(t, 16), inside, "{t}");
        }
        let mut obj = object();
        check_targets(&obj, &imports(&obj)).unwrap();
        obj.relocations[3].addend = 6 - 4 + 1; // lea rdi,[rip+.rodata+7]: .rodata is 6 bytes
        let err = check_targets(&obj, &imports(&obj)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "relocation R_X86_64_PC32 (2) at .text+0x14 against .rodata with addend 3: the instruction would reach outside section .rodata (0x6 bytes)"
        );
        let mut obj = object();
        obj.relocations[0].addend = -12;
        assert!(
            matches!(check_targets(&obj, &imports(&obj)).unwrap_err(), RelocError::TargetOutside { symbol, .. } if symbol == "near_fn")
        );
        // A call into data: an object import, or the component's own data.
        let mut obj = object();
        obj.relocations[0].symbol = 3;
        assert_eq!(
            check_targets(&obj, &imports(&obj)).unwrap_err().to_string(),
            format!("relocation R_X86_64_PLT32 (4) at .text+0x1 is a call or jump to far_var, which is a data symbol at {FAR_VAR:#x}, not code")
        );
        obj.relocations[0].symbol = 4;
        assert!(
            matches!(check_targets(&obj, &imports(&obj)).unwrap_err(), RelocError::CallToData { what, .. } if what == "in section .rodata (#2)")
        );
        // far_var is an 8-byte import: a GOT load from it is refused with a shifted addend.
        let mut obj = object();
        obj.relocations[2].addend = 0;
        assert!(
            matches!(check_targets(&obj, &imports(&obj)).unwrap_err(), RelocError::TargetOutside { bound, .. } if bound == "its GOT slot")
        );
    }

    #[test]
    fn field_encoders_check_their_ranges() {
        assert_eq!(signed32(-1), Some([0xFF; 4]));
        assert_eq!(signed32(i128::from(i32::MAX) + 1), None);
        // A kernel address in the top 2 GiB is a sign-extended 32-bit value.
        assert_eq!(
            signed32(0xffff_ffff_8100_0010),
            Some(0x8100_0010u32.to_le_bytes())
        );
        assert_eq!(signed32(0xffff_ffff_7fff_ffff), None);
        assert_eq!(unsigned32(i128::from(u32::MAX)), Some([0xFF; 4]));
        assert_eq!(unsigned32(-1), None);
        assert_eq!(unsigned32(0xffff_ffff_8100_0010), None);
        assert_eq!(word64(-1), [0xFF; 8]);
        assert_eq!(word64(1i128 << 64 | 5), 5u64.to_le_bytes());
        assert_eq!(
            stub_bytes(0x1000, 0x2000),
            Some([0xFF, 0x25, 0xFA, 0x0F, 0, 0, 0xCC, 0xCC])
        );
        assert_eq!(stub_bytes(0, 1 << 40), None);
    }
}
