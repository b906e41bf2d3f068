//! Validation: the whole object checked before anything is allocated, as a kernel module
//! loader checks an untrusted `.ko`. The input is treated as hostile: a component that passes
//! can be laid out within [`Limits`], every symbol it defines lies inside its section, and every
//! relocation section that applies to loaded code or data is read and applied.
//!
//! The checks, in order (each refusal a [`ValidateError`] naming the culprit):
//! 1. **Section types**: a `SHF_ALLOC` section must be of a type the loader knows how to load or
//!    drop (`PROGBITS`, `NOBITS`, `NOTE`, `X86_64_UNWIND`, the constructor arrays, which
//!    [`crate::parse`] refuses); `SHT_REL` (implicit addends) is not used on x86-64 and refused
//!    wherever it is; a section that is not `SHT_RELA` but looks like the relocations of a
//!    loaded section (its name is `.rela<target>`/`.rel<target>`, or it has `SHF_INFO_LINK`
//!    and its `sh_info` names a loaded section) is refused, since its relocations would
//!    silently not be applied; an `SHT_RELA` section named `.rela<name>` must apply to a section
//!    called `<name>` (a changed `sh_info` would apply them to the wrong section, or drop them).
//! 2. **Sizes and alignments**: every loaded section and common symbol at most
//!    [`Limits::max_image`] bytes, aligned to a power of two at most [`Limits::max_align`];
//!    their sum, padded to each alignment, at most [`Limits::max_image`] (the manager checks the
//!    final layout, with GOT slots and stubs, against the same ceiling); a section with contents
//!    has as many bytes in the file as in memory (an executable `SHT_NOBITS` has none).
//! 3. **Symbols**: each defined symbol's `[value, value + size]` lies inside its section
//!    (`SHT_NOBITS` included; sections that are not loaded too, since a compiler never puts a
//!    symbol outside its section). Bad section indices are refused by [`crate::parse`].
//! 4. **Declared handlers**: a `.trapvec.splices` handler defined by the component itself is an
//!    entry point ([`entry_problem`]).
//!
//! Relocation places, widths and kinds are checked by [`crate::reloc::check`], and their
//! targets against the resolved imports by [`crate::reloc::check_targets`], both before
//! allocation too.

use object::elf;
use thiserror::Error;

use crate::parse::{Object, Placement, Section, Symbol, SymbolDef, SymbolType};

/// Default [`Limits::max_image`]: 16 MiB, the size of a kernel component arena's worth.
pub const DEFAULT_MAX_IMAGE: u64 = 16 << 20;
/// Default [`Limits::max_align`]: a page.
pub const DEFAULT_MAX_ALIGN: u64 = 4096;

/// Bounds on what one component may ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Largest image (code and data blocks together, with alignment padding, GOT slots and
    /// stubs) a component may need, in bytes. Default [`DEFAULT_MAX_IMAGE`].
    pub max_image: u64,
    /// Largest alignment of a section or common symbol. Default [`DEFAULT_MAX_ALIGN`]; the
    /// manager may pad a block by up to this many bytes.
    pub max_align: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_image: DEFAULT_MAX_IMAGE,
            max_align: DEFAULT_MAX_ALIGN,
        }
    }
}

/// What makes a component unsafe to load.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ValidateError {
    #[error("section {section} (#{index}) is SHF_ALLOC but of type {sh_type:#x}, which the loader does not know how to load")]
    UnknownAllocType {
        section: String,
        index: usize,
        sh_type: u32,
    },
    #[error("section {section} (#{index}) is SHF_EXECINSTR but of type {sh_type:#x} ({what}), which would not be loaded as code")]
    DroppedCode {
        section: String,
        index: usize,
        sh_type: u32,
        what: &'static str,
    },
    #[error("section {section} (#{index}) is SHT_REL: implicit-addend relocations are not used on x86-64 and are not supported")]
    RelSection { section: String, index: usize },
    #[error("section {section} (#{index}) looks like the relocations of loaded section {target} ({why}) but is of type {sh_type:#x}, not SHT_RELA: they would not be applied")]
    NotRelocations {
        section: String,
        index: usize,
        target: String,
        why: &'static str,
        sh_type: u32,
    },
    #[error("relocation section {section} (#{index}) applies to section {target} (#{target_index}), not to the section its name says")]
    RelocationTargetMismatch {
        section: String,
        index: usize,
        target: String,
        target_index: usize,
    },
    #[error("section {section} (#{index}) has alignment {align}, which is not a power of two")]
    AlignmentNotPowerOfTwo {
        section: String,
        index: usize,
        align: u64,
    },
    #[error(
        "section {section} (#{index}) has alignment {align:#x}, more than the limit {limit:#x}"
    )]
    AlignmentTooLarge {
        section: String,
        index: usize,
        align: u64,
        limit: u64,
    },
    #[error(
        "section {section} (#{index}) is {size:#x} bytes, more than the image limit {limit:#x}"
    )]
    SectionTooLarge {
        section: String,
        index: usize,
        size: u64,
        limit: u64,
    },
    #[error("section {section} (#{index}) is {size:#x} bytes in memory but has {in_file:#x} bytes of contents in the file")]
    ContentsSize {
        section: String,
        index: usize,
        size: u64,
        in_file: u64,
    },
    #[error("common symbol {symbol} (#{index}): {reason}")]
    Common {
        symbol: String,
        index: usize,
        reason: String,
    },
    #[error("the component's image needs {size:#x} bytes, more than the limit {limit:#x}")]
    ImageTooLarge { size: u128, limit: u64 },
    #[error("symbol {symbol} (#{index}) at {section}+{value:#x} ({size:#x} bytes) lies outside its section #{section_index} ({section_size:#x} bytes)")]
    SymbolOutside {
        symbol: String,
        index: usize,
        section: String,
        section_index: usize,
        value: u64,
        size: u64,
        section_size: u64,
    },
    #[error("declared splice at {at}: handler {handler} (#{index}) {reason}")]
    DeclaredHandler {
        at: String,
        handler: String,
        index: usize,
        reason: String,
    },
}

fn is_alloc(s: &Section) -> bool {
    s.flags & u64::from(elf::SHF_ALLOC) != 0
}

fn is_exec(s: &Section) -> bool {
    s.flags & u64::from(elf::SHF_EXECINSTR) != 0
}

/// The section a relocation section's name designates: `.rela.text` -> `.text`.
fn named_target(name: &str) -> Option<&str> {
    name.strip_prefix(".rela")
        .or_else(|| name.strip_prefix(".rel"))
        .filter(|t| !t.is_empty())
}

/// Check everything about `obj` that does not need the target (see the module docs).
pub fn validate(obj: &Object, limits: &Limits) -> Result<(), ValidateError> {
    for s in obj.sections.iter().skip(1) {
        section_type(s)?;
    }
    for s in obj.sections.iter().skip(1) {
        relocation_section(obj, s)?;
    }
    sizes(obj, limits)?;
    for sym in &obj.symbols {
        symbol_inside(obj, sym)?;
    }
    for d in &obj.declared_splices {
        let Some(sym) = obj
            .symbols
            .iter()
            .find(|s| s.name == d.handler() && !matches!(s.def, SymbolDef::Undefined))
        else {
            continue; // defined elsewhere: the caller resolves it through `ComponentManager::entry`
        };
        if let Some(reason) = entry_problem(obj, sym) {
            return Err(ValidateError::DeclaredHandler {
                at: d.at().to_string(),
                handler: d.handler().to_string(),
                index: sym.index,
                reason,
            });
        }
    }
    Ok(())
}

fn section_type(s: &Section) -> Result<(), ValidateError> {
    let (section, index, sh_type) = (s.name.clone(), s.index, s.sh_type);
    if s.sh_type == elf::SHT_REL {
        return Err(ValidateError::RelSection { section, index });
    }
    if !is_alloc(s) {
        return Ok(());
    }
    let dropped = match s.sh_type {
        elf::SHT_PROGBITS
        | elf::SHT_NOBITS
        | elf::SHT_INIT_ARRAY
        | elf::SHT_FINI_ARRAY
        | elf::SHT_PREINIT_ARRAY => None,
        elf::SHT_NOTE => Some("a note"),
        elf::SHT_X86_64_UNWIND => Some("unwind tables"),
        _ => {
            return Err(ValidateError::UnknownAllocType {
                section,
                index,
                sh_type,
            })
        }
    };
    // Code that the placement rules would drop (a note, unwind tables) or that has no contents.
    if is_exec(s) {
        if let Some(what) = dropped.or((s.sh_type == elf::SHT_NOBITS).then_some("no contents")) {
            return Err(ValidateError::DroppedCode {
                section,
                index,
                sh_type,
                what,
            });
        }
    }
    Ok(())
}

fn relocation_section(obj: &Object, s: &Section) -> Result<(), ValidateError> {
    let loaded = |i: usize| {
        obj.sections
            .get(i)
            .filter(|t| i > 0 && t.placement.is_loaded())
    };
    if s.sh_type == elf::SHT_RELA {
        let target = usize::try_from(s.info).unwrap_or(usize::MAX);
        if let (Some(want), Some(t)) = (named_target(&s.name), obj.sections.get(target)) {
            if t.name != want
                && (t.placement.is_loaded()
                    || obj
                        .sections
                        .iter()
                        .any(|o| o.name == want && o.placement.is_loaded()))
            {
                return Err(ValidateError::RelocationTargetMismatch {
                    section: s.name.clone(),
                    index: s.index,
                    target: t.name.clone(),
                    target_index: t.index,
                });
            }
        }
        return Ok(());
    }
    let not_relocations = |target: &Section, why| ValidateError::NotRelocations {
        section: s.name.clone(),
        index: s.index,
        target: target.name.clone(),
        why,
        sh_type: s.sh_type,
    };
    if let Some(want) = named_target(&s.name) {
        if let Some(t) = obj
            .sections
            .iter()
            .find(|t| t.name == want && t.placement.is_loaded())
        {
            return Err(not_relocations(t, "by its name"));
        }
    }
    if s.flags & u64::from(elf::SHF_INFO_LINK) != 0 {
        if let Some(t) = loaded(usize::try_from(s.info).unwrap_or(usize::MAX)) {
            return Err(not_relocations(t, "by SHF_INFO_LINK and sh_info"));
        }
    }
    Ok(())
}

fn sizes(obj: &Object, limits: &Limits) -> Result<(), ValidateError> {
    let mut total: u128 = 0;
    let mut add = |size: u64, align: u64| {
        total = total.next_multiple_of(u128::from(align)) + u128::from(size);
    };
    for s in obj.sections.iter().filter(|s| s.placement.is_loaded()) {
        let (section, index) = (s.name.clone(), s.index);
        if !s.align.is_power_of_two() {
            return Err(ValidateError::AlignmentNotPowerOfTwo {
                section,
                index,
                align: s.align,
            });
        }
        if s.align > limits.max_align {
            return Err(ValidateError::AlignmentTooLarge {
                section,
                index,
                align: s.align,
                limit: limits.max_align,
            });
        }
        if s.size > limits.max_image {
            return Err(ValidateError::SectionTooLarge {
                section,
                index,
                size: s.size,
                limit: limits.max_image,
            });
        }
        if s.placement != Placement::Bss && s.data.len() as u64 != s.size {
            return Err(ValidateError::ContentsSize {
                section,
                index,
                size: s.size,
                in_file: s.data.len() as u64,
            });
        }
        add(s.size, s.align);
    }
    for sym in &obj.symbols {
        let SymbolDef::Common { align } = sym.def else {
            continue;
        };
        let common = |reason: String| ValidateError::Common {
            symbol: sym.name.clone(),
            index: sym.index,
            reason,
        };
        if !align.is_power_of_two() || align > limits.max_align {
            return Err(common(format!(
                "alignment {align:#x} is not a power of two at most {:#x}",
                limits.max_align
            )));
        }
        if sym.size > limits.max_image {
            return Err(common(format!(
                "size {:#x} is more than the image limit {:#x}",
                sym.size, limits.max_image
            )));
        }
        add(sym.size, align);
    }
    if total > u128::from(limits.max_image) {
        return Err(ValidateError::ImageTooLarge {
            size: total,
            limit: limits.max_image,
        });
    }
    Ok(())
}

fn symbol_inside(obj: &Object, sym: &Symbol) -> Result<(), ValidateError> {
    let SymbolDef::Section { index, value } = sym.def else {
        return Ok(());
    };
    let Some(s) = obj.sections.get(index) else {
        // `parse` only makes section definitions with an index into the table.
        return Err(ValidateError::SymbolOutside {
            symbol: obj.symbol_name(sym.index),
            index: sym.index,
            section: obj.section_name(index),
            section_index: index,
            value,
            size: sym.size,
            section_size: 0,
        });
    };
    let inside = value.checked_add(sym.size).is_some_and(|end| end <= s.size);
    if inside {
        return Ok(());
    }
    Err(ValidateError::SymbolOutside {
        symbol: obj.symbol_name(sym.index),
        index: sym.index,
        section: s.name.clone(),
        section_index: index,
        value,
        size: sym.size,
        section_size: s.size,
    })
}

/// Why `sym` cannot be executed, or `None` when it is an entry point: a function (`STT_FUNC`)
/// or an untyped symbol (`STT_NOTYPE`, what `as` makes of an assembly label without
/// `.type f, @function`), defined inside a loaded executable section.
pub fn entry_problem(obj: &Object, sym: &Symbol) -> Option<String> {
    if !matches!(sym.ty, SymbolType::Function | SymbolType::Other) {
        return Some(format!("is not a function (its type is {:?})", sym.ty));
    }
    let SymbolDef::Section { index, .. } = sym.def else {
        return Some("is not defined in a section".to_string());
    };
    let s = obj.sections.get(index)?;
    if s.placement != Placement::Code {
        return Some(format!(
            "is in section {} (#{index}), which is not loaded as code",
            s.name
        ));
    }
    if sym.ty == SymbolType::Other {
        log::debug!(
            "entry point {} is STT_NOTYPE (an assembly label?), accepted in {}",
            sym.name,
            s.name
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relocation_section_names_designate_their_target() {
        assert_eq!(named_target(".rela.text"), Some(".text"));
        assert_eq!(named_target(".rel.data.rel.ro"), Some(".data.rel.ro"));
        assert_eq!(named_target(".rela__jump_table"), Some("__jump_table"));
        assert_eq!(named_target(".rela"), None);
        assert_eq!(named_target(".text"), None);
    }

    #[test]
    fn default_limits_are_a_16_mib_image_and_page_alignment() {
        assert_eq!(
            Limits::default(),
            Limits {
                max_image: 16 << 20,
                max_align: 4096
            }
        );
    }
}
