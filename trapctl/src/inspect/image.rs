//! An ELF file loaded for inspection: what kind it is, its function symbols, and its bytes by
//! address.
//!
//! Addresses: for linked files (executables, shared objects, vmlinux) they are the file's virtual
//! addresses (no load bias). For relocatable files (`.o`, `.ko`) they are offsets in the section
//! that holds the requested symbol (a symbol's value *is* its offset there); the section's bytes
//! get their PC-relative relocations applied first, so that branches and RIP-relative operands
//! decode to their real targets inside the section and to a far stand-in address
//! ([`EXTERNAL`]) outside it (other sections, undefined symbols, GOT slots).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use object::elf::{R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_REX_GOTPCRELX};
use object::{Object, ObjectKind, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionKind};
use trapvec::{Symbol, SymbolKind, SymbolTable};

/// Where PC-relative references that leave the section point after relocation, in a
/// relocatable file (far from every section offset, within rel32 reach).
pub const EXTERNAL: u64 = 0x4000_0000;

/// What kind of ELF file was loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ElfKind {
    Executable,
    PieExecutable,
    SharedObject,
    Relocatable,
    KernelModule,
}

impl ElfKind {
    pub fn describe(self) -> &'static str {
        match self {
            ElfKind::Executable => "ELF executable",
            ElfKind::PieExecutable => "ELF position-independent executable",
            ElfKind::SharedObject => "ELF shared object",
            ElfKind::Relocatable => "ELF relocatable object",
            ElfKind::KernelModule => "Linux kernel module",
        }
    }

    pub fn is_relocatable(self) -> bool {
        matches!(self, ElfKind::Relocatable | ElfKind::KernelModule)
    }
}

/// A loaded file.
pub struct Image {
    pub kind: ElfKind,
    /// Kernel code: a module, a vmlinux, or an object with `__fentry__` calls.
    pub kernel: bool,
    pub symbols: SymbolTable,
    /// For relocatables: the section whose offsets are the addresses.
    pub section: Option<String>,
    /// `(address, size)` of `.eh_frame_hdr` in a linked file, where the unwinder's search for
    /// exception landing pads starts.
    pub eh_frame_hdr: Option<(u64, u64)>,
    /// A relocatable file with a `.gcc_except_table` (landing pads that are not read).
    pub has_except_table: bool,
    /// `(address, bytes)` of every loaded region, sorted by address.
    regions: Vec<(u64, Vec<u8>)>,
}

impl Image {
    /// `len` bytes at `addr`, when they all lie in one region.
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let i = self.regions.partition_point(|(a, _)| *a <= addr).checked_sub(1)?;
        let (base, bytes) = &self.regions[i];
        let off = usize::try_from(addr - base).ok()?;
        bytes.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
    }
}

/// Load `path`; `symbol` picks the section of a relocatable file.
pub fn load(path: &Path, symbol: Option<&str>) -> Result<Image> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = object::File::parse(&*data).with_context(|| format!("{} is not an ELF file object can parse", path.display()))?;
    if file.architecture() != object::Architecture::X86_64 {
        bail!("{} is for {:?}, not x86-64", path.display(), file.architecture());
    }
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let has_fentry = file.symbols().any(|s| s.name() == Ok("__fentry__"));
    let kind = match file.kind() {
        ObjectKind::Relocatable => {
            let module = file.section_by_name(".gnu.linkonce.this_module").is_some()
                || file.section_by_name(".modinfo").is_some()
                || file_name.ends_with(".ko");
            if module {
                ElfKind::KernelModule
            } else {
                ElfKind::Relocatable
            }
        }
        ObjectKind::Executable => ElfKind::Executable,
        ObjectKind::Dynamic if file.section_by_name(".interp").is_some() => ElfKind::PieExecutable,
        ObjectKind::Dynamic => ElfKind::SharedObject,
        other => bail!("{}: unsupported ELF file kind {other:?}", path.display()),
    };
    let kernel = kind == ElfKind::KernelModule || file_name.starts_with("vmlinux") || has_fentry;
    log::debug!("{}: {} (kernel code: {kernel})", path.display(), kind.describe());

    if kind.is_relocatable() {
        let name = symbol.ok_or_else(|| anyhow!("a relocatable file needs a symbol to pick its section"))?;
        return load_relocatable(path, &file, kind, kernel, name);
    }

    let symbols = trapvec::elfsyms::read_elf_symbols(&data, 0, None)
        .with_context(|| format!("cannot read the symbols of {}", path.display()))?;
    let mut regions = Vec::new();
    for s in file.sections() {
        if s.address() == 0 || s.kind() == SectionKind::UninitializedData {
            continue;
        }
        if let Ok(bytes) = s.data() {
            if !bytes.is_empty() {
                regions.push((s.address(), bytes.to_vec()));
            }
        }
    }
    regions.sort_by_key(|r| r.0);
    let eh_frame_hdr = file.section_by_name(".eh_frame_hdr").map(|s| (s.address(), s.size())).filter(|&(a, n)| a != 0 && n != 0);
    Ok(Image { kind, kernel, symbols: SymbolTable::new(symbols), section: None, eh_frame_hdr, has_except_table: false, regions })
}

fn load_relocatable(path: &Path, file: &object::File<'_>, kind: ElfKind, kernel: bool, name: &str) -> Result<Image> {
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name) && s.is_definition())
        .ok_or_else(|| anyhow!("no symbol `{name}` is defined in {}", path.display()))?;
    let sec_idx = sym.section_index().ok_or_else(|| anyhow!("symbol `{name}` of {} is in no section", path.display()))?;
    let section = file.section_by_index(sec_idx)?;
    let sec_name = section.name().unwrap_or("?").to_string();
    let mut bytes = section.data().with_context(|| format!("cannot read section {sec_name} of {}", path.display()))?.to_vec();

    for (offset, reloc) in section.relocations() {
        let RelocationFlags::Elf { r_type } = reloc.flags() else { continue };
        let got = matches!(r_type, R_X86_64_GOTPCREL | R_X86_64_GOTPCRELX | R_X86_64_REX_GOTPCRELX);
        if !(got || matches!(r_type, R_X86_64_PC32 | R_X86_64_PLT32)) {
            continue; // absolute relocations: the zeros stay (an absolute 0 is harmless here)
        }
        let target = match reloc.target() {
            RelocationTarget::Symbol(i) if !got => {
                let t = file.symbol_by_index(i)?;
                if t.section_index() == Some(sec_idx) {
                    t.address()
                } else {
                    EXTERNAL
                }
            }
            RelocationTarget::Section(i) if !got && i == sec_idx => 0,
            _ => EXTERNAL,
        };
        let value = i128::from(target) + i128::from(reloc.addend()) - i128::from(offset);
        let value = i32::try_from(value).with_context(|| format!("relocation at {sec_name}+{offset:#x} does not fit in 32 bits"))?;
        let off = usize::try_from(offset)?;
        let place = bytes
            .get_mut(off..off + 4)
            .ok_or_else(|| anyhow!("relocation at {sec_name}+{offset:#x} is outside the section"))?;
        place.copy_from_slice(&value.to_le_bytes());
    }

    let symbols: Vec<Symbol> = file
        .symbols()
        .filter(|s| s.section_index() == Some(sec_idx) && s.kind() == object::SymbolKind::Text && s.is_definition())
        .filter_map(|s| {
            let name = s.name().ok().filter(|n| !n.is_empty())?;
            Some(Symbol { name: name.to_string(), addr: s.address(), size: s.size(), kind: SymbolKind::Function, origin: None, version: None })
        })
        .collect();
    log::debug!("{}: `{name}` is in section {sec_name} ({} bytes, {} functions)", path.display(), bytes.len(), symbols.len());
    Ok(Image {
        kind,
        kernel,
        symbols: SymbolTable::new(symbols),
        section: Some(sec_name),
        eh_frame_hdr: None,
        has_except_table: file.section_by_name(".gcc_except_table").is_some(),
        regions: vec![(0, bytes)],
    })
}
