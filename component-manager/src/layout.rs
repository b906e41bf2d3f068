//! Layout: where each loaded section, common symbol, GOT slot and far-call stub lives inside the
//! component's two repository blocks, as offsets. Pure: no addresses are known yet.
//!
//! - Code block: every `Placement::Code` section in section order, each at its alignment, then
//!   the stubs (`jmp qword ptr [rip+slot]`, [`STUB_SIZE`] bytes each, 8-aligned).
//! - Data block: `Placement::Data` sections, then `Placement::Bss` sections, then common
//!   symbols, then the GOT slots (8 bytes each, 8-aligned, one per distinct symbol).
//!
//! Offsets assume the block starts at an address aligned to the block's alignment (the largest
//! alignment placed in it); the manager guarantees that when it allocates. Each block is at
//! least one byte, so every component owns both, and at most [`MAX_BLOCK`] bytes, so that a
//! `rel32` always reaches from one end of a block to the other (the manager holds the whole
//! image to a much lower ceiling, [`crate::validate::Limits::max_image`]).

use std::collections::{BTreeMap, BTreeSet};

use thiserror::Error;
use trapvec::BlockKind;

use crate::parse::{Object, Placement, SymbolDef};

/// Bytes reserved per far-call stub: `ff 25 <disp32>` and two `int3` of padding.
pub const STUB_SIZE: usize = 8;
/// Bytes of a GOT slot.
pub const SLOT_SIZE: usize = 8;
/// Largest block a component may need (1 GiB).
pub const MAX_BLOCK: usize = 1 << 30;

/// A layout that cannot be made.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LayoutError {
    #[error("{what} ({size:#x} bytes) makes the {kind:?} block larger than {MAX_BLOCK:#x} bytes")]
    TooLarge {
        what: String,
        size: u64,
        kind: BlockKind,
    },
}

/// Size and alignment of one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockPlan {
    pub size: usize,
    pub align: u64,
}

/// Where something lives: a block and an offset inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub kind: BlockKind,
    pub offset: usize,
}

/// The offsets of everything the component puts into the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub code: BlockPlan,
    pub data: BlockPlan,
    /// Indexed by section index; `None` for sections that are not loaded.
    pub sections: Vec<Option<Slot>>,
    /// Common symbols (by symbol index) to their offset in the data block.
    pub commons: BTreeMap<usize, usize>,
    /// GOT slots: symbol index to offset in the data block.
    pub got: BTreeMap<usize, usize>,
    /// Far-call stubs: symbol index to offset in the code block (each uses the symbol's GOT slot).
    pub stubs: BTreeMap<usize, usize>,
}

struct Cursor {
    kind: BlockKind,
    next: usize,
    align: u64,
}

impl Cursor {
    fn new(kind: BlockKind) -> Self {
        Cursor {
            kind,
            next: 0,
            align: 1,
        }
    }

    /// Reserve `size` bytes at `align`; the offset, or the error naming `what`.
    fn place(
        &mut self,
        what: impl Fn() -> String,
        size: u64,
        align: u64,
    ) -> Result<usize, LayoutError> {
        let too_large = |what: String| LayoutError::TooLarge {
            what,
            size,
            kind: self.kind,
        };
        let (Ok(size_us), Ok(align_us)) = (usize::try_from(size), usize::try_from(align)) else {
            return Err(too_large(what()));
        };
        let start = self
            .next
            .checked_next_multiple_of(align_us)
            .ok_or_else(|| too_large(what()))?;
        let end = start
            .checked_add(size_us)
            .filter(|&e| e <= MAX_BLOCK)
            .ok_or_else(|| too_large(what()))?;
        self.next = end;
        self.align = self.align.max(align);
        Ok(start)
    }

    fn finish(self) -> BlockPlan {
        BlockPlan {
            size: self.next.max(1),
            align: self.align,
        }
    }
}

impl Layout {
    /// Bytes of both images together, with the padding the manager may add to align the blocks.
    pub fn image_size(&self) -> u128 {
        let block = |b: BlockPlan| b.size as u128 + u128::from(b.align) - 1;
        block(self.code) + block(self.data)
    }
}

/// Lay out `obj`, with GOT slots for `got_symbols` and stubs for `stub_symbols` (every stub
/// symbol also gets a slot: the stub jumps through it).
pub fn plan(
    obj: &Object,
    got_symbols: &BTreeSet<usize>,
    stub_symbols: &BTreeSet<usize>,
) -> Result<Layout, LayoutError> {
    let mut code = Cursor::new(BlockKind::Code);
    let mut data = Cursor::new(BlockKind::Data);
    let mut sections = vec![None; obj.sections.len()];

    for pass in [Placement::Code, Placement::Data, Placement::Bss] {
        for s in obj.sections.iter().filter(|s| s.placement == pass) {
            let cursor = if pass == Placement::Code {
                &mut code
            } else {
                &mut data
            };
            let offset = cursor.place(|| format!("section {}", s.name), s.size, s.align)?;
            log::debug!(
                "{} -> {:?} block +{offset:#x} ({:#x} bytes)",
                s.name,
                cursor.kind,
                s.size
            );
            sections[s.index] = Some(Slot {
                kind: cursor.kind,
                offset,
            });
        }
    }

    let mut commons = BTreeMap::new();
    for sym in &obj.symbols {
        if let SymbolDef::Common { align } = sym.def {
            let offset = data.place(|| format!("common symbol {}", sym.name), sym.size, align)?;
            log::debug!("common {} -> data block +{offset:#x}", sym.name);
            commons.insert(sym.index, offset);
        }
    }

    let mut got = BTreeMap::new();
    for &sym in got_symbols.union(stub_symbols) {
        let offset = data.place(
            || format!("GOT slot of {}", obj.symbol_name(sym)),
            SLOT_SIZE as u64,
            SLOT_SIZE as u64,
        )?;
        got.insert(sym, offset);
    }

    let mut stubs = BTreeMap::new();
    for &sym in stub_symbols {
        let offset = code.place(
            || format!("call stub of {}", obj.symbol_name(sym)),
            STUB_SIZE as u64,
            8,
        )?;
        stubs.insert(sym, offset);
    }

    Ok(Layout {
        code: code.finish(),
        data: data.finish(),
        sections,
        commons,
        got,
        stubs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{Binding, Section, Symbol, SymbolType};

    fn section(index: usize, name: &str, placement: Placement, size: u8, align: u64) -> Section {
        let data = if placement == Placement::Bss {
            vec![]
        } else {
            vec![0; usize::from(size)]
        };
        Section {
            index,
            name: name.into(),
            placement,
            size: u64::from(size),
            align,
            data,
            sh_type: 0,
            flags: 0,
            info: 0,
        }
    }

    fn object() -> Object {
        Object {
            sections: vec![
                section(0, "", Placement::NotLoaded("null section"), 0, 1),
                section(1, ".text", Placement::Code, 0x13, 16),
                section(2, ".bss", Placement::Bss, 4, 4),
                section(3, ".text.hot", Placement::Code, 5, 16),
                section(4, ".rodata", Placement::Data, 6, 32),
                section(5, ".comment", Placement::NotLoaded("not SHF_ALLOC"), 9, 1),
            ],
            symbols: vec![
                Symbol {
                    index: 0,
                    name: String::new(),
                    def: SymbolDef::Undefined,
                    size: 0,
                    ty: SymbolType::Other,
                    binding: Binding::Local,
                    hidden: false,
                },
                Symbol {
                    index: 1,
                    name: "shared".into(),
                    def: SymbolDef::Common { align: 8 },
                    size: 12,
                    ty: SymbolType::Object,
                    binding: Binding::Global,
                    hidden: false,
                },
                Symbol {
                    index: 2,
                    name: "puts".into(),
                    def: SymbolDef::Undefined,
                    size: 0,
                    ty: SymbolType::Other,
                    binding: Binding::Global,
                    hidden: false,
                },
            ],
            relocations: vec![],
            declared_splices: vec![],
        }
    }

    #[test]
    fn sections_are_packed_by_kind_at_their_alignment_with_slots_and_stubs_last() {
        let obj = object();
        let layout = plan(&obj, &BTreeSet::from([1]), &BTreeSet::from([2])).unwrap();
        let code = |offset| {
            Some(Slot {
                kind: BlockKind::Code,
                offset,
            })
        };
        let data = |offset| {
            Some(Slot {
                kind: BlockKind::Data,
                offset,
            })
        };
        // .text at 0 (0x13 bytes), .text.hot at the next 16-byte boundary.
        assert_eq!(
            layout.sections,
            vec![None, code(0), data(8), code(0x20), data(0), None]
        );
        // .rodata 0..6, .bss 8..0xc, the common 0x10..0x1c, slots at 0x20 and 0x28.
        assert_eq!(layout.commons, BTreeMap::from([(1, 0x10)]));
        assert_eq!(layout.got, BTreeMap::from([(1, 0x20), (2, 0x28)]));
        // The stub follows .text.hot (0x20..0x25) at the next 8-byte boundary.
        assert_eq!(layout.stubs, BTreeMap::from([(2, 0x28)]));
        assert_eq!(
            layout.code,
            BlockPlan {
                size: 0x30,
                align: 16
            }
        );
        assert_eq!(
            layout.data,
            BlockPlan {
                size: 0x30,
                align: 32
            }
        );
    }

    #[test]
    fn empty_blocks_still_take_one_byte() {
        let mut obj = object();
        obj.sections.truncate(1);
        obj.symbols.truncate(1);
        let layout = plan(&obj, &BTreeSet::new(), &BTreeSet::new()).unwrap();
        assert_eq!(layout.code, BlockPlan { size: 1, align: 1 });
        assert_eq!(layout.data, BlockPlan { size: 1, align: 1 });
    }

    #[test]
    fn a_huge_bss_is_refused_naming_the_section() {
        let mut obj = object();
        obj.sections[2].size = 1 << 40;
        let err = plan(&obj, &BTreeSet::new(), &BTreeSet::new()).unwrap_err();
        assert_eq!(
            err,
            LayoutError::TooLarge {
                what: "section .bss".into(),
                size: 1 << 40,
                kind: BlockKind::Data
            }
        );
    }
}
