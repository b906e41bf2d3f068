//! Code images to analyse without a target: the sections of an ELF file laid out at addresses,
//! with the extents of its functions. `trapctl inspect` examines one function of one, `bench`
//! every function of many (coverage, lengths, analysis speed), and both ask the same planner.
//! Three sources:
//!
//! - a `vmlinux` (no symbols: Debian strips it) with symbols from a kernel's `/proc/kallsyms`,
//!   KASLR undone through `_text` (the ELF's `.text` starts at `_text`);
//! - a relocatable object or kernel module (`.o`, `.ko`): its executable sections are laid out one
//!   after another, either from [`RELOC_BASE`] in file order or, when one symbol is examined, with
//!   the section holding it at 0 (so that addresses are offsets in that section, as `objdump -d`
//!   prints them) and the others after it; their PC-relative relocations are applied so that
//!   branches decode to their real targets; references to anything else (data, undefined
//!   symbols, GOT slots) point at a far stand-in ([`EXTERNAL`]);
//! - any other ELF (executable, shared object) at its own virtual addresses, with its `.symtab`
//!   and every allocated section (data too: jump tables are read from `.rodata`).
//!
//! Kernel code starts traced functions with `call __fentry__`, which the running kernel turns
//! into a 5-byte NOP at boot: an image of kernel code gets the NOP written over every such call
//! at a function entry, so that it is analysed as it runs ([`CodeImage::fentry_nops`] counts
//! them). Pure: bytes in, an owned image out.

use std::collections::HashMap;
use std::path::Path;

use object::elf::{
    R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_REX_GOTPCRELX,
};
use object::{
    Object, ObjectKind, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget,
    SectionFlags, SectionIndex,
};
use trapvec::{Symbol, SymbolKind, SymbolTable};

pub use crate::point::NOP5;

mod error;
pub use error::ImageError;

/// Where a relocatable file's first executable section is laid out when no section is anchored
/// at 0.
pub const RELOC_BASE: u64 = 0x10_0000;
/// Where references that leave a relocatable file's code point (far from every laid-out
/// section, within rel32 reach).
pub const EXTERNAL: u64 = 0x4000_0000;

/// What kind of ELF file an image was made from.
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

/// One section at its address.
#[derive(Clone, Debug)]
pub struct Region {
    pub name: String,
    pub addr: u64,
    pub bytes: Vec<u8>,
    /// An executable section (functions lie only in these).
    pub exec: bool,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.addr + self.bytes.len() as u64
    }
}

/// A function's extent in an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncExtent {
    /// The name reported: the first at this address that does not start with `_` (linker
    /// markers such as `_text` or `__entry_text_start` share addresses with real functions),
    /// else the first.
    pub name: String,
    /// Every name at this address (aliases share the extent).
    pub names: Vec<String>,
    pub start: u64,
    /// Exclusive.
    pub end: u64,
}

/// The code of one ELF file, ready to decode.
#[derive(Clone, Debug)]
pub struct CodeImage {
    /// The file (or `vmlinux`).
    pub name: String,
    pub kind: ElfKind,
    /// Sections, sorted by address, non-overlapping: the executable ones, and for linked files
    /// the other allocated ones with contents.
    pub regions: Vec<Region>,
    /// Functions sorted by start, unique starts, each inside one executable region.
    pub functions: Vec<FuncExtent>,
    /// The file's symbols (aliases included), for point resolution and the planner's
    /// neighbour lookups.
    pub symbols: SymbolTable,
    /// Kernel code (has ftrace sites): a module, a vmlinux, or code calling `__fentry__`.
    pub kernel: bool,
    /// `call __fentry__` sites at function entries, turned into NOPs as the running kernel does.
    pub fentry_nops: usize,
    /// For a relocatable laid out around one symbol: the section at 0, whose offsets are the
    /// addresses.
    pub section: Option<String>,
    /// `(address, size)` of `.eh_frame_hdr` in a linked file, where the unwinder's search for
    /// exception landing pads starts.
    pub eh_frame_hdr: Option<(u64, u64)>,
    /// A relocatable file with a `.gcc_except_table` (landing pads that are not read).
    pub has_except_table: bool,
    /// The direct branch targets of every executable region, scanned the first time they are
    /// asked for ([`CodeImage::object_targets`]).
    targets: std::sync::OnceLock<crate::analysis::ObjectTargets>,
}

impl CodeImage {
    /// `len` bytes at `addr`, when they lie in one region.
    pub fn read(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let i = self
            .regions
            .partition_point(|r| r.addr <= addr)
            .checked_sub(1)?;
        let r = &self.regions[i];
        let off = usize::try_from(addr - r.addr).ok()?;
        r.bytes.get(off..off.checked_add(len)?)
    }

    /// The direct branch and call targets of the image's executable regions, each decoded
    /// linearly once (the first call scans, later ones reuse it): what a function's analysis is
    /// given ([`crate::AnalysisOptions::object_targets`]) so that no window covers an address
    /// code outside the function jumps to.
    pub fn object_targets(&self) -> &crate::analysis::ObjectTargets {
        self.targets.get_or_init(|| {
            let t0 = std::time::Instant::now();
            let t = crate::analysis::ObjectTargets::scan(
                self.regions
                    .iter()
                    .filter(|r| r.exec)
                    .map(|r| (r.addr, r.bytes.as_slice())),
            );
            log::debug!(
                "{}: {} direct branches to {} targets in {} bytes of code, scanned in {:?}",
                self.name,
                t.branches,
                t.len(),
                t.code_bytes,
                t0.elapsed()
            );
            t
        })
    }

    /// The bytes of a function.
    pub fn bytes_of(&self, f: &FuncExtent) -> &[u8] {
        usize::try_from(f.end - f.start)
            .ok()
            .and_then(|n| self.read(f.start, n))
            .unwrap_or(&[])
    }

    /// The names of the image's functions `glob` matches, sorted, each once: what a trace's
    /// probe glob stands for in a program.
    pub fn functions_matching(&self, glob: &crate::glob::FunctionGlob) -> Vec<String> {
        let mut names: Vec<String> = self
            .symbols
            .iter()
            .filter(|s| s.kind == SymbolKind::Function && glob.matches(&s.name, None))
            .map(|s| s.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Total bytes of executable sections.
    pub fn code_bytes(&self) -> usize {
        self.regions
            .iter()
            .filter(|r| r.exec)
            .map(|r| r.bytes.len())
            .sum()
    }

    /// `vmlinux` (an ELF, symbols or not) with function symbols from `kallsyms` text. Module
    /// symbols (`[name]`) are ignored: their code is not in vmlinux.
    pub fn vmlinux(elf: &[u8], kallsyms: &str, name: &str) -> Result<CodeImage, ImageError> {
        let file = parse(elf, name)?;
        let text = file
            .section_by_name(".text")
            .ok_or_else(|| ImageError::NoText {
                file: name.to_string(),
            })?;
        let syms = trapvec::kernel::kallsyms::parse(kallsyms)?;
        let ktext = syms
            .iter()
            .find(|s| s.name == "_text" && s.origin.is_none())
            .ok_or(ImageError::NoTextSymbol)?;
        let bias = ktext.addr.wrapping_sub(text.address());
        log::debug!(
            "kallsyms: _text at {:#x}, the ELF's .text at {:#x}: KASLR offset {bias:#x}",
            ktext.addr,
            text.address()
        );
        let regions = linked_regions(&file, name)?;
        let symbols: Vec<Symbol> = syms
            .into_iter()
            .filter(|s| s.origin.is_none() && s.kind == SymbolKind::Function)
            .map(|s| Symbol {
                addr: s.addr.wrapping_sub(bias),
                ..s
            })
            .collect();
        let mut img = CodeImage::assemble(name, ElfKind::Executable, regions, symbols, true);
        if img.functions.is_empty() {
            return Err(ImageError::NoFunctions {
                file: name.to_string(),
            });
        }
        img.nop_calls_to_fentry();
        Ok(img)
    }

    /// Any x86-64 ELF file: relocatables (`.o`, `.ko`) laid out from [`RELOC_BASE`], others at
    /// their own addresses.
    pub fn elf_file(data: &[u8], name: &str) -> Result<CodeImage, ImageError> {
        CodeImage::elf_file_around(data, name, None)
    }

    /// [`CodeImage::elf_file`], except that a relocatable is laid out with the section holding
    /// `symbol` (when given) at 0 and the other executable sections after it.
    pub fn elf_file_around(
        data: &[u8],
        name: &str,
        symbol: Option<&str>,
    ) -> Result<CodeImage, ImageError> {
        let file = parse(data, name)?;
        let kind = elf_kind(&file, name)?;
        let kernel = kind == ElfKind::KernelModule
            || file.symbols().any(|s| s.name() == Ok("__fentry__"))
            || Path::new(name)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinux"));
        log::debug!("{name}: {} (kernel code: {kernel})", kind.describe());
        if kind.is_relocatable() {
            return relocatable(&file, name, kind, kernel, symbol);
        }
        let regions = linked_regions(&file, name)?;
        let symbols = trapvec::elfsyms::read_elf_symbols(data, 0, None).map_err(|source| {
            ImageError::Parse {
                file: name.to_string(),
                source,
            }
        })?;
        let mut img = CodeImage::assemble(name, kind, regions, symbols, kernel);
        img.eh_frame_hdr = file
            .section_by_name(".eh_frame_hdr")
            .map(|s| (s.address(), s.size()))
            .filter(|&(a, n)| a != 0 && n != 0);
        if kernel {
            img.nop_calls_to_fentry();
        }
        Ok(img)
    }

    /// Read a file and build its image ([`CodeImage::elf_file`]).
    pub fn from_path(path: &Path) -> Result<CodeImage, ImageError> {
        CodeImage::from_path_around(path, None)
    }

    /// Read a file and build its image ([`CodeImage::elf_file_around`]).
    pub fn from_path_around(path: &Path, symbol: Option<&str>) -> Result<CodeImage, ImageError> {
        let data = std::fs::read(path).map_err(|source| ImageError::Io {
            path: path.display().to_string(),
            source,
        })?;
        CodeImage::elf_file_around(&data, &path.display().to_string(), symbol)
    }

    /// Sort the regions and derive function extents: a function runs to its size when it has
    /// one, else to the next function start, and never past its region's end.
    fn assemble(
        name: &str,
        kind: ElfKind,
        mut regions: Vec<Region>,
        symbols: Vec<Symbol>,
        kernel: bool,
    ) -> CodeImage {
        regions.sort_by_key(|r| r.addr);
        // Sections of a linked file do not overlap; a malformed one that does is left out.
        let mut end = 0u64;
        regions.retain(|r| {
            let keep = r.addr >= end;
            if keep {
                end = r.end();
            } else {
                log::debug!(
                    "{name}: section {} at {:#x} overlaps the one before it: left out",
                    r.name,
                    r.addr
                );
            }
            keep
        });
        let in_code = |a: u64| {
            let i = regions.partition_point(|r| r.addr <= a).checked_sub(1)?;
            (a < regions[i].end() && regions[i].exec).then_some(i)
        };
        let mut starts: Vec<(u64, u64, &str)> = symbols
            .iter()
            .filter(|s| s.kind == SymbolKind::Function && in_code(s.addr).is_some())
            .map(|s| (s.addr, s.size, s.name.as_str()))
            .collect();
        // Same address: the sized symbol first, then by name (kallsyms aliases have no size).
        starts.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
        let mut aliases: HashMap<u64, Vec<String>> = HashMap::new();
        for &(addr, _, n) in &starts {
            aliases.entry(addr).or_default().push(n.to_string());
        }
        starts.dedup_by_key(|s| s.0);
        let mut functions = Vec::with_capacity(starts.len());
        for (i, &(start, size, fname)) in starts.iter().enumerate() {
            let Some(r) = in_code(start) else { continue };
            let reg = &regions[r];
            let region_end = reg.end();
            let next = starts
                .get(i + 1)
                .map_or(region_end, |n| n.0)
                .min(region_end);
            let end = if size > 0 {
                start.saturating_add(size).min(region_end)
            } else {
                next
            };
            let bytes = &reg.bytes[usize::try_from(start - reg.addr).unwrap_or(0)
                ..usize::try_from(end - reg.addr).unwrap_or(0)];
            // Marker symbols over alignment fill (`__kprobes_text_end` spans 2 MiB of int3) are
            // no functions.
            if bytes.iter().all(|&b| b == 0xCC) {
                log::debug!(
                    "{name}: `{fname}` at {start:#x} covers only int3 fill ({} bytes): not a function",
                    bytes.len()
                );
                continue;
            }
            if end > start {
                let names = aliases
                    .remove(&start)
                    .unwrap_or_else(|| vec![fname.to_string()]);
                let name = names
                    .iter()
                    .find(|n| !n.starts_with('_'))
                    .unwrap_or(&names[0])
                    .clone();
                functions.push(FuncExtent {
                    name,
                    names,
                    start,
                    end,
                });
            }
        }
        log::debug!(
            "{name}: {} code bytes in {} sections, {} functions",
            regions
                .iter()
                .filter(|r| r.exec)
                .map(|r| r.bytes.len())
                .sum::<usize>(),
            regions.len(),
            functions.len()
        );
        CodeImage {
            name: name.to_string(),
            kind,
            regions,
            functions,
            symbols: SymbolTable::new(symbols),
            kernel,
            fentry_nops: 0,
            section: None,
            eh_frame_hdr: None,
            has_except_table: false,
            targets: Default::default(),
        }
    }

    /// Where a function's ftrace site may be: its entry, or behind the `endbr64` that starts it
    /// where the kernel has IBT (6.12).
    fn fentry_slot(&self, entry: u64) -> u64 {
        let endbr = self
            .read(entry, crate::point::ENDBR64.len())
            .is_some_and(crate::point::starts_with_endbr);
        entry
            + if endbr {
                crate::point::ENDBR64.len() as u64
            } else {
                0
            }
    }

    /// NOP the function entries that `call` the image's own `__fentry__` symbol.
    fn nop_calls_to_fentry(&mut self) {
        let Some(fentry) = self.symbols.lookup("__fentry__").map(|s| s.addr) else {
            log::debug!("{}: no `__fentry__` symbol: no ftrace sites", self.name);
            return;
        };
        let sites: Vec<u64> = self
            .functions
            .iter()
            .map(|f| self.fentry_slot(f.start))
            .filter(|&e| {
                self.read(e, 5)
                    .is_some_and(|b| call_target(b, e) == Some(fentry))
            })
            .collect();
        self.nop_fentry_calls(&sites);
    }

    /// Write NOP5 over the 5 bytes at each of `sites` (function entries, or the byte behind their
    /// `endbr64`, holding `call __fentry__`).
    fn nop_fentry_calls(&mut self, sites: &[u64]) {
        for &site in sites {
            let i = self.regions.partition_point(|r| r.addr <= site) - 1;
            let r = &mut self.regions[i];
            let off = usize::try_from(site - r.addr).unwrap_or(usize::MAX);
            if let Some(b) = r.bytes.get_mut(off..off.saturating_add(5)) {
                b.copy_from_slice(&NOP5);
            }
        }
        self.fentry_nops = sites.len();
        log::debug!(
            "{}: {} `call __fentry__` sites turned into NOPs",
            self.name,
            sites.len()
        );
    }
}

/// Target of a `call rel32` (`E8 xx xx xx xx`) at `site`.
fn call_target(bytes: &[u8], site: u64) -> Option<u64> {
    match *bytes {
        [0xE8, a, b, c, d] => {
            Some((site + 5).wrapping_add_signed(i64::from(i32::from_le_bytes([a, b, c, d]))))
        }
        _ => None,
    }
}

fn parse<'d>(data: &'d [u8], name: &str) -> Result<object::File<'d>, ImageError> {
    let file = object::File::parse(data).map_err(|source| ImageError::Parse {
        file: name.to_string(),
        source,
    })?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err(ImageError::Machine {
            file: name.to_string(),
            machine: file.architecture(),
        });
    }
    Ok(file)
}

fn elf_kind(file: &object::File<'_>, name: &str) -> Result<ElfKind, ImageError> {
    Ok(match file.kind() {
        ObjectKind::Relocatable => {
            let module = file.section_by_name(".gnu.linkonce.this_module").is_some()
                || file.section_by_name(".modinfo").is_some()
                || name.ends_with(".ko");
            if module {
                ElfKind::KernelModule
            } else {
                ElfKind::Relocatable
            }
        }
        ObjectKind::Executable => ElfKind::Executable,
        ObjectKind::Dynamic if file.section_by_name(".interp").is_some() => ElfKind::PieExecutable,
        ObjectKind::Dynamic => ElfKind::SharedObject,
        kind => {
            return Err(ImageError::Kind {
                file: name.to_string(),
                kind,
            })
        }
    })
}

fn sh_flags(s: &object::Section<'_, '_>) -> u64 {
    match s.flags() {
        SectionFlags::Elf { sh_flags } => sh_flags,
        _ => 0,
    }
}

fn is_exec(s: &object::Section<'_, '_>) -> bool {
    let f = sh_flags(s);
    f & u64::from(object::elf::SHF_EXECINSTR) != 0 && f & u64::from(object::elf::SHF_ALLOC) != 0
}

fn region(s: &object::Section<'_, '_>, name: &str) -> Result<Region, ImageError> {
    let sname = s.name().unwrap_or("?").to_string();
    let bytes = s.data().map_err(|source| ImageError::Section {
        file: name.to_string(),
        section: sname.clone(),
        source,
    })?;
    Ok(Region {
        name: sname,
        addr: s.address(),
        bytes: bytes.to_vec(),
        exec: is_exec(s),
    })
}

/// The allocated sections with contents of a linked file, at their own addresses (sections at
/// 0, such as the kernel's per-CPU data, are not part of the running image).
fn linked_regions(file: &object::File<'_>, name: &str) -> Result<Vec<Region>, ImageError> {
    let mut out = Vec::new();
    for s in file.sections() {
        let alloc = sh_flags(&s) & u64::from(object::elf::SHF_ALLOC) != 0;
        if !alloc || s.address() == 0 || s.kind() == object::SectionKind::UninitializedData {
            continue;
        }
        let r = region(&s, name)?;
        if !r.bytes.is_empty() {
            out.push(r);
        }
    }
    Ok(out)
}

/// A relocatable file: executable sections laid out 16-byte aligned, from [`RELOC_BASE`] in
/// file order, or with the section of `anchor` at 0 and the others after it; `PC32`/`PLT32`
/// relocations applied (GOT slots and everything outside the laid-out code point at
/// [`EXTERNAL`]); `call __fentry__` at a function entry becomes NOP5.
fn relocatable(
    file: &object::File<'_>,
    name: &str,
    kind: ElfKind,
    kernel: bool,
    anchor: Option<&str>,
) -> Result<CodeImage, ImageError> {
    let err = |section: &str, offset: u64, reason: String| ImageError::Relocation {
        file: name.to_string(),
        section: section.to_string(),
        offset,
        reason,
    };
    let mut sections: Vec<object::Section<'_, '_>> = file.sections().filter(is_exec).collect();
    let mut next = RELOC_BASE;
    let mut anchored = None;
    if let Some(symbol) = anchor {
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(symbol) && s.is_definition())
            .ok_or_else(|| ImageError::NoSymbol {
                file: name.to_string(),
                symbol: symbol.to_string(),
            })?;
        let not_code = || ImageError::NotInCode {
            file: name.to_string(),
            symbol: symbol.to_string(),
        };
        let si = sym.section_index().ok_or_else(not_code)?;
        let pos = sections
            .iter()
            .position(|s| s.index() == si)
            .ok_or_else(not_code)?;
        let s = sections.remove(pos);
        anchored = Some(s.name().unwrap_or("?").to_string());
        sections.insert(0, s);
        next = 0;
    }
    let mut base: HashMap<SectionIndex, u64> = HashMap::new();
    let mut regions = Vec::new();
    for s in &sections {
        let mut r = region(s, name)?;
        base.insert(s.index(), next);
        r.addr = next;
        next = (next + r.bytes.len() as u64 + 15) & !15;
        regions.push(r);
    }
    let mut fentry_sites = Vec::new();
    for (ri, s) in sections.iter().enumerate() {
        let sbase = base[&s.index()];
        let sname = regions[ri].name.clone();
        for (offset, reloc) in s.relocations() {
            let RelocationFlags::Elf { r_type } = reloc.flags() else {
                continue;
            };
            let got = matches!(
                r_type,
                R_X86_64_GOTPCREL | R_X86_64_GOTPCRELX | R_X86_64_REX_GOTPCRELX
            );
            if !(got || matches!(r_type, R_X86_64_PC32 | R_X86_64_PLT32)) {
                continue; // absolute relocations: the zeros stay, lengths are unchanged
            }
            let (target, is_fentry) = match reloc.target() {
                _ if got => (EXTERNAL, false),
                RelocationTarget::Symbol(i) => {
                    let t = file
                        .symbol_by_index(i)
                        .map_err(|e| err(&sname, offset, e.to_string()))?;
                    let fentry = t.name() == Ok("__fentry__");
                    match t.section_index().and_then(|si| base.get(&si)) {
                        Some(b) => (b + t.address(), fentry),
                        None => (EXTERNAL, fentry),
                    }
                }
                RelocationTarget::Section(si) => {
                    (base.get(&si).copied().unwrap_or(EXTERNAL), false)
                }
                _ => (EXTERNAL, false),
            };
            let place = sbase + offset;
            let value = i128::from(target) + i128::from(reloc.addend()) - i128::from(place);
            let value = i32::try_from(value).map_err(|_| {
                err(
                    &sname,
                    offset,
                    format!("{value:#x} does not fit in 32 bits"),
                )
            })?;
            let off = usize::try_from(offset).map_err(|e| err(&sname, offset, e.to_string()))?;
            let bytes = &mut regions[ri].bytes;
            let slot = off
                .checked_add(4)
                .and_then(|e| bytes.get_mut(off..e))
                .ok_or_else(|| err(&sname, offset, "outside the section".into()))?;
            slot.copy_from_slice(&value.to_le_bytes());
            if is_fentry && off >= 1 && bytes[off - 1] == 0xE8 {
                fentry_sites.push(place - 1);
            }
        }
    }
    let mut symbols = Vec::new();
    for s in file.symbols() {
        let (Some(si), Ok(sname)) = (s.section_index(), s.name()) else {
            continue;
        };
        if s.kind() != object::SymbolKind::Text || sname.is_empty() || !s.is_definition() {
            continue;
        }
        if let Some(b) = base.get(&si) {
            symbols.push(Symbol {
                name: sname.to_string(),
                addr: b + s.address(),
                size: s.size(),
                kind: SymbolKind::Function,
                origin: None,
                version: None,
            });
        }
    }
    let mut img = CodeImage::assemble(name, kind, regions, symbols, kernel);
    img.section = anchored;
    img.has_except_table = file.section_by_name(".gcc_except_table").is_some();
    fentry_sites.sort_unstable();
    let entries: Vec<u64> = img
        .functions
        .iter()
        .map(|f| img.fentry_slot(f.start))
        .filter(|e| fentry_sites.binary_search(e).is_ok())
        .collect();
    img.nop_fentry_calls(&entries);
    Ok(img)
}
