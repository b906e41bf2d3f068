//! The repository's bookkeeping: which components are loaded where, the index of their exports,
//! who imports from whom, reference counts, and the effectful steps of loading (allocate, write,
//! seal), verifying and unloading, all through `&mut dyn Target`.
//!
//! Loading runs the pure passes first (CRC, parse, validation against the manager's [`Limits`],
//! relocation checks, symbol resolution, relocation targets, layout), so a malformed component is
//! refused before any repository memory is allocated; what can still fail afterwards (the
//! target's allocation, a relocation out of reach of where the blocks landed) frees whatever
//! was allocated.
//!
//! Names are resolved for execution through [`ComponentManager::entry`] (a function in a code
//! section) and for reading and writing through [`ComponentManager::variable`] (an object in a
//! data or bss section, as large as the access), never through a bare address lookup.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use trapvec::{BlockKind, RepoBlock, SymbolKind, Target, TargetError};

use crate::error::ComponentError;
use crate::layout::{self, BlockPlan, Layout};
use crate::parse::{self, DeclaredSplice, Object, Placement, SymbolDef, SymbolType};
use crate::reloc::{self, Images};
use crate::resolve::{self, Export, ExtraSymbols, Import, ImportSource};
use crate::rethunk;
use crate::validate::{self, Limits, ValidateError};

/// Identifies a loaded component for as long as the manager lives (ids are never reused).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ComponentId(pub u32);

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// How to load a component.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// The code block is allocated within ±2 GiB of this address (the code the component's
    /// splices will patch); the data block within ±2 GiB of the code block.
    pub near: u64,
    /// Refuse the file unless its CRC32 is this.
    pub expected_crc32: Option<u32>,
    /// Name to register the component under, instead of the file stem (or the given name).
    pub name: Option<String>,
}

/// The kind of memory a component symbol lies in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SymbolPlace {
    /// Not recorded (state saved before places were kept): the symbol's address range and kind
    /// decide whether it is an entry or a variable.
    #[default]
    Unknown,
    /// A section loaded as code.
    Code,
    /// A section with contents in the data block.
    Data,
    /// A zero-filled section in the data block.
    Bss,
    /// A common symbol, in the data block.
    Common,
}

/// A symbol a loaded component defines, at its run-time address.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ComponentSymbol {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    pub kind: SymbolKind,
    /// Exported to other components and to [`ComponentManager::lookup`].
    pub global: bool,
    /// Where it lies; `[addr, addr + size]` is inside that section of the image (validated).
    #[serde(default)]
    pub place: SymbolPlace,
}

/// A component in the repository.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LoadedComponent {
    pub id: ComponentId,
    /// The file stem (`handler` for `handler.o`), or the name given.
    pub name: String,
    /// What messages call it: the file name, or the name.
    pub label: String,
    pub path: Option<PathBuf>,
    /// CRC32 of the file's bytes.
    pub file_crc32: u32,
    pub code: RepoBlock,
    pub data: RepoBlock,
    /// Address of the code image (the code block's address, or past alignment padding).
    pub code_addr: u64,
    /// Length of the code image, the range [`ComponentManager::verify`] checks.
    pub code_len: usize,
    /// CRC32 of the code image as written.
    pub code_crc32: u32,
    /// Address of the data image.
    pub data_addr: u64,
    /// Length of the data image (sections, commons and GOT slots).
    #[serde(default)]
    pub data_len: usize,
    pub symbols: Vec<ComponentSymbol>,
    /// Each undefined symbol and the address it was bound to.
    pub imports: Vec<(String, u64)>,
    /// Components this one imports from (they cannot be unloaded before it).
    pub depends_on: BTreeSet<ComponentId>,
    /// Far-call stubs written: symbol and stub address.
    pub stubs: Vec<(String, u64)>,
    pub declared_splices: Vec<DeclaredSplice>,
    refs: usize,
}

impl LoadedComponent {
    /// Number of outstanding [`ComponentManager::acquire`]s.
    pub fn refs(&self) -> usize {
        self.refs
    }

    /// A symbol defined by this component, global or local (globals win a name clash), e.g. a
    /// `static` handler named by one of its declared splices.
    pub fn symbol(&self, name: &str) -> Option<&ComponentSymbol> {
        let mut found = self.symbols.iter().filter(|s| s.name == name);
        let first = found.next()?;
        if first.global {
            return Some(first);
        }
        Some(found.find(|s| s.global).unwrap_or(first))
    }

    /// Whether `[addr, addr + len)` lies inside the code image.
    pub fn in_code_image(&self, addr: u64, len: u64) -> bool {
        inside(addr, len, self.code_addr, self.code_len)
    }

    /// Whether `[addr, addr + len)` lies inside the data image (the data block past the image's
    /// start, for state saved before the image's length was kept).
    pub fn in_data_image(&self, addr: u64, len: u64) -> bool {
        let data_len = match self.data_len {
            0 => self.data.size.saturating_sub(
                usize::try_from(self.data_addr.saturating_sub(self.data.addr))
                    .unwrap_or(usize::MAX),
            ),
            n => n,
        };
        inside(addr, len, self.data_addr, data_len)
    }

    /// Code and data ranges `[start, end)` of the blocks.
    fn ranges(&self) -> [(u64, u64); 2] {
        let range = |b: &RepoBlock| (b.addr, b.addr + b.size as u64);
        [range(&self.code), range(&self.data)]
    }
}

/// Loaded components, the index of their exports, and their reference counts.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ComponentManager {
    components: BTreeMap<ComponentId, LoadedComponent>,
    exports: BTreeMap<String, Export>,
    next_id: u32,
    /// What one component may ask for ([`Limits::default`]: a 16 MiB image, page alignment).
    #[serde(default)]
    limits: Limits,
}

/// A block allocated for an image, and where the image starts in it.
struct Placed {
    block: RepoBlock,
    base: u64,
}

impl Placed {
    fn offset(&self) -> usize {
        usize::try_from(self.base - self.block.addr).unwrap_or(0)
    }
}

impl ComponentManager {
    /// A manager with the default [`Limits`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A manager refusing components beyond `limits`.
    pub fn with_limits(limits: Limits) -> Self {
        ComponentManager {
            limits,
            ..Self::default()
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Change the limits for the next loads (loaded components stay).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Load the ELF relocatable at `path` (mapped, not read): see [`Self::load_bytes`].
    pub fn load_path(
        &mut self,
        target: &mut dyn Target,
        path: &Path,
        opts: &LoadOptions,
        extra: &mut dyn ExtraSymbols,
    ) -> Result<ComponentId, ComponentError> {
        let io = |error| ComponentError::Io {
            path: path.display().to_string(),
            error,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let map;
        let bytes: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: the map is private and read-only, and lives only for this call. The bytes
            // are treated as untrusted input (every read is bounds-checked) and copied out by the
            // parser; the one hazard left is another process truncating the file while it is
            // mapped (SIGBUS), the documented caveat of mapping files, as for any ELF loader.
            map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
            &map
        };
        let name = opts.name.clone().unwrap_or_else(|| {
            path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            )
        });
        let label = path.file_name().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        self.load(
            target,
            name,
            label,
            Some(path.to_path_buf()),
            bytes,
            opts,
            extra,
        )
    }

    /// Load a component from its bytes, registered as `name` (unless `opts.name` says otherwise).
    ///
    /// Checks the CRC, parses, checks the relocations, lets `extra` make what it will answer
    /// ([`ExtraSymbols::make`]), resolves imports (loaded components, `extra`, then the target;
    /// pure), lays out, allocates the code block near `opts.near` and the data block near the
    /// code, links, writes both blocks and seals the code. On any error nothing of the component
    /// stays allocated (what `extra` made is `extra`'s to keep or free).
    pub fn load_bytes(
        &mut self,
        target: &mut dyn Target,
        name: &str,
        bytes: &[u8],
        opts: &LoadOptions,
        extra: &mut dyn ExtraSymbols,
    ) -> Result<ComponentId, ComponentError> {
        let name = opts.name.clone().unwrap_or_else(|| name.to_string());
        self.load(target, name.clone(), name, None, bytes, opts, extra)
    }

    #[allow(clippy::too_many_arguments)]
    fn load(
        &mut self,
        target: &mut dyn Target,
        name: String,
        label: String,
        path: Option<PathBuf>,
        bytes: &[u8],
        opts: &LoadOptions,
        extra: &mut dyn ExtraSymbols,
    ) -> Result<ComponentId, ComponentError> {
        let file_crc32 = crc32fast::hash(bytes);
        if let Some(expected) = opts.expected_crc32 {
            if expected != file_crc32 {
                return Err(ComponentError::CrcMismatch {
                    component: label,
                    expected,
                    actual: file_crc32,
                });
            }
        }
        if let Some(existing) = self.by_name(&name) {
            return Err(ComponentError::DuplicateName {
                component: label,
                name,
                existing,
            });
        }
        let obj = parse::parse(bytes).map_err(|error| ComponentError::Parse {
            component: label.clone(),
            error,
        })?;
        let invalid = |error| ComponentError::Validate {
            component: label.clone(),
            error,
        };
        validate::validate(&obj, &self.limits).map_err(invalid)?;
        self.check_exports(&obj, &label)?;
        let reloc_err = |error| ComponentError::Reloc {
            component: label.clone(),
            error: Box::new(error),
        };
        reloc::check(&obj).map_err(reloc_err)?;
        let resolve_err = |error| ComponentError::Resolve {
            component: label.clone(),
            error,
        };
        extra
            .make(target, &resolve::unexported_imports(&obj, &self.exports))
            .map_err(resolve_err)?;
        let imports =
            resolve::resolve_imports(&obj, &self.exports, extra, target).map_err(resolve_err)?;
        reloc::check_targets(&obj, &imports).map_err(reloc_err)?;
        let (got, stubs) = reloc::indirections(&obj, &imports);
        let layout = layout::plan(&obj, &got, &stubs).map_err(|error| ComponentError::Layout {
            component: label.clone(),
            error,
        })?;
        let size = layout.image_size();
        if size > u128::from(self.limits.max_image) {
            return Err(invalid(ValidateError::ImageTooLarge {
                size,
                limit: self.limits.max_image,
            }));
        }

        let mut allocated = Vec::new();
        let placed = Self::place(
            target,
            &label,
            &obj,
            &layout,
            &imports,
            opts.near,
            &mut allocated,
        );
        let (code, data, images) = match placed {
            Ok(p) => p,
            Err(e) => {
                for block in allocated.iter().rev() {
                    if let Err(fe) = target.free(block) {
                        log::warn!(
                            "component {label}: freeing block at {:#x} after a failed load: {fe}",
                            block.addr
                        );
                    }
                }
                return Err(e);
            }
        };

        let id = ComponentId(self.next_id);
        self.next_id += 1;
        let component = Self::record(
            id, name, label, path, file_crc32, &obj, &layout, &imports, code, data, &images,
        );
        for s in obj
            .symbols
            .iter()
            .filter(|s| s.is_export() && section_loaded(&obj, s.def))
        {
            let Some(sym) = component
                .symbols
                .iter()
                .find(|c| c.global && c.name == s.name)
            else {
                continue;
            };
            let weak = s.binding == parse::Binding::Weak;
            self.exports.entry(s.name.clone()).or_insert(Export {
                component: id,
                addr: sym.addr,
                kind: sym.kind,
                size: sym.size,
                weak,
            });
        }
        log::debug!(
            "component {} loaded as {id}: code {:#x}+{:#x}, data {:#x}+{:#x}, {} imports, {} stubs",
            component.label,
            component.code_addr,
            component.code_len,
            component.data_addr,
            component.data.size,
            component.imports.len(),
            component.stubs.len()
        );
        self.components.insert(id, component);
        Ok(id)
    }

    /// Refuse a component whose strong global definitions clash with a loaded component's.
    fn check_exports(&self, obj: &Object, label: &str) -> Result<(), ComponentError> {
        for s in obj
            .symbols
            .iter()
            .filter(|s| s.is_export() && section_loaded(obj, s.def))
        {
            let Some(existing) = self.exports.get(&s.name) else {
                continue;
            };
            if !existing.weak && s.binding != parse::Binding::Weak {
                let existing = self
                    .components
                    .get(&existing.component)
                    .map_or_else(|| existing.component.to_string(), |c| c.label.clone());
                return Err(ComponentError::DuplicateSymbol {
                    component: label.to_string(),
                    symbol: s.name.clone(),
                    existing,
                });
            }
            log::debug!(
                "component {label}: weak clash on {}, the definition loaded first stays exported",
                s.name
            );
        }
        Ok(())
    }

    /// Allocate both blocks, link, write, seal. Every block allocated is pushed to `allocated`
    /// (for the caller to free on error).
    fn place(
        target: &mut dyn Target,
        label: &str,
        obj: &Object,
        layout: &Layout,
        imports: &[Option<Import>],
        near: u64,
        allocated: &mut Vec<RepoBlock>,
    ) -> Result<(Placed, Placed, Images), ComponentError> {
        let terr = |what: String| {
            move |error| ComponentError::Target {
                component: label.to_string(),
                what,
                error,
            }
        };
        let code = alloc_aligned(target, near, layout.code, BlockKind::Code, allocated).map_err(
            terr(format!(
                "allocating the code block ({} bytes near {near:#x})",
                layout.code.size
            )),
        )?;
        let data = alloc_aligned(target, code.base, layout.data, BlockKind::Data, allocated)
            .map_err(terr(format!(
                "allocating the data block ({} bytes near {:#x})",
                layout.data.size, code.base
            )))?;
        let mut images =
            reloc::link(obj, layout, imports, code.base, data.base).map_err(|error| {
                ComponentError::Reloc {
                    component: label.to_string(),
                    error: Box::new(error),
                }
            })?;
        rethunk::apply(
            obj,
            layout,
            rethunk::Returns::of(&*target),
            &mut images.code,
            code.base,
        );
        target
            .write(&code.block, code.offset(), &images.code)
            .map_err(terr(format!("writing the code block at {:#x}", code.base)))?;
        target
            .write(&data.block, data.offset(), &images.data)
            .map_err(terr(format!("writing the data block at {:#x}", data.base)))?;
        target.seal(&code.block).map_err(terr(format!(
            "sealing the code block at {:#x}",
            code.block.addr
        )))?;
        Ok((code, data, images))
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        id: ComponentId,
        name: String,
        label: String,
        path: Option<PathBuf>,
        file_crc32: u32,
        obj: &Object,
        layout: &Layout,
        imports: &[Option<Import>],
        code: Placed,
        data: Placed,
        images: &Images,
    ) -> LoadedComponent {
        let base = |kind| {
            if kind == BlockKind::Code {
                code.base
            } else {
                data.base
            }
        };
        let mut symbols = Vec::new();
        for s in &obj.symbols {
            if s.name.is_empty() || matches!(s.ty, SymbolType::Section | SymbolType::File) {
                continue;
            }
            let (addr, place) = match s.def {
                SymbolDef::Section { index, value } => {
                    match layout.sections.get(index).copied().flatten() {
                        Some(slot) => {
                            let place = match obj.sections[index].placement {
                                Placement::Code => SymbolPlace::Code,
                                Placement::Bss => SymbolPlace::Bss,
                                _ => SymbolPlace::Data,
                            };
                            (base(slot.kind) + slot.offset as u64 + value, place)
                        }
                        None => continue,
                    }
                }
                SymbolDef::Common { .. } => match layout.commons.get(&s.index) {
                    Some(&offset) => (data.base + offset as u64, SymbolPlace::Common),
                    None => continue,
                },
                SymbolDef::Undefined | SymbolDef::Absolute(_) => continue,
            };
            let kind = match s.ty {
                SymbolType::Function => SymbolKind::Function,
                SymbolType::Object => SymbolKind::Object,
                _ => SymbolKind::Other,
            };
            symbols.push(ComponentSymbol {
                name: s.name.clone(),
                addr,
                size: s.size,
                kind,
                global: s.is_export(),
                place,
            });
        }
        let mut depends_on = BTreeSet::new();
        let mut import_list = Vec::new();
        for import in imports.iter().flatten() {
            if let ImportSource::Component(from) = import.source {
                depends_on.insert(from);
            }
            import_list.push((import.name.clone(), import.addr));
        }
        let stubs = images
            .stubs_used
            .iter()
            .map(|&s| (obj.symbol_name(s), code.base + layout.stubs[&s] as u64))
            .collect();
        LoadedComponent {
            id,
            name,
            label,
            path,
            file_crc32,
            code_addr: code.base,
            code_len: images.code.len(),
            code_crc32: crc32fast::hash(&images.code),
            data_addr: data.base,
            data_len: images.data.len(),
            code: code.block,
            data: data.block,
            symbols,
            imports: import_list,
            depends_on,
            stubs,
            declared_splices: obj.declared_splices.clone(),
            refs: 0,
        }
    }

    /// Unload: refused while splices use it ([`Self::acquire`]) or another component imports from
    /// it; then waits for quiescence of both blocks and frees them. If quiescence fails the
    /// component stays loaded; once quiesced it is forgotten even if a free fails (the error
    /// names the block).
    pub fn unload(
        &mut self,
        target: &mut dyn Target,
        id: ComponentId,
    ) -> Result<(), ComponentError> {
        let c = self
            .components
            .get(&id)
            .ok_or(ComponentError::UnknownId(id))?;
        if c.refs > 0 {
            return Err(ComponentError::InUse {
                component: c.label.clone(),
                refs: c.refs,
            });
        }
        let importers: Vec<String> = self
            .components
            .values()
            .filter(|o| o.depends_on.contains(&id))
            .map(|o| o.label.clone())
            .collect();
        if !importers.is_empty() {
            return Err(ComponentError::Imported {
                component: c.label.clone(),
                importers,
            });
        }
        let terr = |what: String, error| ComponentError::Target {
            component: c.label.clone(),
            what,
            error,
        };
        target
            .quiesce(&c.ranges())
            .map_err(|e| terr("waiting for quiescence before unloading".into(), e))?;
        let c = self
            .components
            .remove(&id)
            .ok_or(ComponentError::UnknownId(id))?;
        self.exports.retain(|_, e| e.component != id);
        log::debug!("component {} ({id}) unloaded", c.label);
        let mut result = Ok(());
        for block in [&c.code, &c.data] {
            if let Err(error) = target.free(block) {
                log::warn!(
                    "component {}: freeing {:?} block at {:#x}: {error}",
                    c.label,
                    block.kind,
                    block.addr
                );
                if result.is_ok() {
                    result = Err(ComponentError::Target {
                        component: c.label.clone(),
                        what: format!("freeing the {:?} block at {:#x}", block.kind, block.addr),
                        error,
                    });
                }
            }
        }
        result
    }

    pub fn get(&self, id: ComponentId) -> Option<&LoadedComponent> {
        self.components.get(&id)
    }

    pub fn by_name(&self, name: &str) -> Option<ComponentId> {
        self.components
            .values()
            .find(|c| c.name == name)
            .map(|c| c.id)
    }

    /// Loaded components in load order.
    pub fn iter(&self) -> impl Iterator<Item = &LoadedComponent> {
        self.components.values()
    }

    /// A global symbol of any loaded component: who defines it, and where. To execute it use
    /// [`Self::entry`], to read or write it [`Self::variable`]: they check what it is.
    pub fn lookup(&self, symbol: &str) -> Option<(ComponentId, u64)> {
        self.exports.get(symbol).map(|e| (e.component, e.addr))
    }

    /// The exported symbol `name` and its component.
    fn exported(&self, name: &str) -> Result<(&LoadedComponent, &ComponentSymbol), ComponentError> {
        let unknown = || ComponentError::UnknownSymbol {
            symbol: name.to_string(),
        };
        let e = self.exports.get(name).ok_or_else(unknown)?;
        let c = self.components.get(&e.component).ok_or_else(unknown)?;
        let s = c
            .symbols
            .iter()
            .find(|s| s.global && s.name == name && s.addr == e.addr)
            .ok_or_else(unknown)?;
        Ok((c, s))
    }

    /// A global symbol to execute (a handler, a replacement): a function (or an untyped
    /// assembly label) inside a code section of its component, inside the code image.
    pub fn entry(&self, name: &str) -> Result<(ComponentId, u64), ComponentError> {
        let (c, s) = self.exported(name)?;
        let refuse = |reason: String| ComponentError::NotAnEntry {
            component: c.label.clone(),
            symbol: name.to_string(),
            addr: s.addr,
            reason,
        };
        // `Unknown`: state saved before places were kept; the address range decides below.
        if !matches!(s.place, SymbolPlace::Code | SymbolPlace::Unknown) {
            return Err(refuse(format!(
                "it lies in {:?} memory, not in a code section",
                s.place
            )));
        }
        if !matches!(s.kind, SymbolKind::Function | SymbolKind::Other) {
            return Err(refuse(format!("it is {:?}, not a function", s.kind)));
        }
        if !c.in_code_image(s.addr, s.size.max(1)) {
            return Err(refuse(format!(
                "it lies outside the code image {:#x}+{:#x}",
                c.code_addr, c.code_len
            )));
        }
        Ok((c.id, s.addr))
    }

    /// A global symbol to read or write `size` bytes of: an object (or an untyped label) in a
    /// data, bss or common section, at least `size` bytes long, inside the data image.
    pub fn variable(&self, name: &str, size: u64) -> Result<(ComponentId, u64), ComponentError> {
        let (c, s) = self.exported(name)?;
        let refuse = |reason: String| ComponentError::NotAVariable {
            component: c.label.clone(),
            symbol: name.to_string(),
            addr: s.addr,
            size,
            reason,
        };
        if !matches!(
            s.place,
            SymbolPlace::Data | SymbolPlace::Bss | SymbolPlace::Common | SymbolPlace::Unknown
        ) {
            return Err(refuse(format!(
                "it lies in {:?} memory, not in a data or bss section",
                s.place
            )));
        }
        if s.kind == SymbolKind::Function {
            return Err(refuse("it is a function".to_string()));
        }
        if size > s.size {
            return Err(refuse(format!("it is {} bytes long", s.size)));
        }
        if !c.in_data_image(s.addr, size) {
            return Err(refuse(format!(
                "it lies outside the data image {:#x}+{:#x}",
                c.data_addr, c.data_len
            )));
        }
        Ok((c.id, s.addr))
    }

    /// The component whose code or data block contains `addr`.
    pub fn owner_of(&self, addr: u64) -> Option<ComponentId> {
        self.components
            .values()
            .find(|c| c.code.contains(addr) || c.data.contains(addr))
            .map(|c| c.id)
    }

    /// Count one more user (a splice) of the component; returns the new count.
    pub fn acquire(&mut self, id: ComponentId) -> Result<usize, ComponentError> {
        let c = self
            .components
            .get_mut(&id)
            .ok_or(ComponentError::UnknownId(id))?;
        c.refs += 1;
        Ok(c.refs)
    }

    /// Count one user less; returns the new count.
    pub fn release(&mut self, id: ComponentId) -> Result<usize, ComponentError> {
        let c = self
            .components
            .get_mut(&id)
            .ok_or(ComponentError::UnknownId(id))?;
        c.refs = c
            .refs
            .checked_sub(1)
            .ok_or_else(|| ComponentError::NotAcquired {
                component: c.label.clone(),
            })?;
        Ok(c.refs)
    }

    /// Re-read the component's code image from the target and compare its CRC32 with the one
    /// recorded when it was written (done before each apply).
    pub fn verify(&self, target: &dyn Target, id: ComponentId) -> Result<(), ComponentError> {
        let c = self
            .components
            .get(&id)
            .ok_or(ComponentError::UnknownId(id))?;
        let bytes =
            target
                .read(c.code_addr, c.code_len)
                .map_err(|error| ComponentError::Target {
                    component: c.label.clone(),
                    what: format!("reading back the code at {:#x}", c.code_addr),
                    error,
                })?;
        let actual = crc32fast::hash(&bytes);
        if actual != c.code_crc32 {
            return Err(ComponentError::CodeModified {
                component: c.label.clone(),
                addr: c.code_addr,
                len: c.code_len,
                expected: c.code_crc32,
                actual,
            });
        }
        Ok(())
    }
}

/// Whether `[addr, addr + len)` lies inside `[start, start + size)`.
fn inside(addr: u64, len: u64, start: u64, size: usize) -> bool {
    let end = start.checked_add(size as u64);
    addr >= start && addr.checked_add(len).zip(end).is_some_and(|(a, e)| a <= e)
}

/// Whether a symbol definition lies in memory the component owns.
fn section_loaded(obj: &Object, def: SymbolDef) -> bool {
    match def {
        SymbolDef::Section { index, .. } => obj
            .sections
            .get(index)
            .is_some_and(|s| s.placement.is_loaded()),
        SymbolDef::Common { .. } => true,
        SymbolDef::Undefined | SymbolDef::Absolute(_) => false,
    }
}

/// Allocate a block for an image of `plan.size` bytes whose start must be aligned to
/// `plan.align`. Backends give page- or cache-line-aligned blocks in practice; if this one is
/// not aligned enough, it is given back and a block padded by `align - 1` bytes is taken.
fn alloc_aligned(
    target: &mut dyn Target,
    near: u64,
    plan: BlockPlan,
    kind: BlockKind,
    allocated: &mut Vec<RepoBlock>,
) -> Result<Placed, TargetError> {
    let block = target.alloc(near, plan.size, kind)?;
    if block.addr % plan.align == 0 {
        allocated.push(block.clone());
        return Ok(Placed {
            base: block.addr,
            block,
        });
    }
    log::debug!(
        "{kind:?} block at {:#x} is not {}-aligned: allocating a padded one",
        block.addr,
        plan.align
    );
    target.free(&block)?;
    let pad = usize::try_from(plan.align - 1).map_err(|_| TargetError::Alloc {
        near,
        size: plan.size,
        reason: format!("alignment {} cannot be padded", plan.align),
    })?;
    let padded = plan
        .size
        .checked_add(pad)
        .ok_or_else(|| TargetError::Alloc {
            near,
            size: plan.size,
            reason: format!("alignment {} cannot be padded", plan.align),
        })?;
    let block = target.alloc(near, padded, kind)?;
    allocated.push(block.clone());
    let base = block.addr.next_multiple_of(plan.align);
    Ok(Placed { base, block })
}
