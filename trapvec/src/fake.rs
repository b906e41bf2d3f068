//! The one fake target of the tests of the crates above trapvec (feature `fake`): the
//! splicer's, trapd's and trapctl's tests, the component manager's and the fuzz loader's. Four
//! traced functions `f0`..`f3` in "kernel text", repository blocks, a dispatch table with
//! per-site hit counters, site refusals as the module's checks would give them, and the state
//! blob the module keeps, and (when asked for: [`FakeState::runtime_slots`]) runtime slots
//! ([`crate::slots`]) as bookkeeping only (their routines are addresses below the arena, never
//! run). Clones share one machine (two splicers, or a daemon and its restart,
//! over one kernel), as the real module outlives the programs that use it.
//!
//! [`FakeKernel::new`] places blocks as the module's arena does ([`Placement::Arena`]);
//! [`FakeKernel::repository`] is a target a component is loaded into, with the symbols it
//! imports, blocks placed near the code that asked ([`Placement::Near`]) and filled with
//! garbage, and limits that refuse an allocation as a real repository would
//! ([`FakeState::refused_allocs`] keeps each refusal, for a harness that must never see one).
//!
//! Misuse a real target would not survive fails loudly: writing a freed or sealed block or
//! through a stale handle, sealing a data block, freeing twice, adding a site's dispatch entry
//! twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::kernel::SiteRefusal;
use crate::slots::{Slot, SlotReading, SlotSpec};
use crate::{
    BlockKind, DispatchChange, DispatchEntry, DispatchRead, DispatchReading, RepoBlock, Symbol,
    SymbolKind, SymbolTable, Target, TargetError, TargetInfo, TextPatch, TrapHits,
};

/// Where the fake kernel's text starts.
pub const TEXT: u64 = 0xffff_ffff_8100_0000;
/// Where its repository blocks are allocated.
pub const ARENA: u64 = 0xffff_ffff_c000_0000;

/// Each function: the ftrace NOP, then `push rbp; mov rbp,rsp; mov rax,rdi; pop rbp; ret`,
/// padded with int3 to 32 bytes.
#[rustfmt::skip]
pub const FUNC: [u8; 32] = [
    /*00*/ 0x0F, 0x1F, 0x44, 0x00, 0x00, // nop dword [rax+rax]   (fentry)
    /*05*/ 0x55,                         // push rbp
    /*06*/ 0x48, 0x89, 0xE5,             // mov rbp,rsp
    /*09*/ 0x48, 0x89, 0xF8,             // mov rax,rdi
    /*0c*/ 0x5D,                         // pop rbp
    /*0d*/ 0xC3,                         // ret
    0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC,
];

/// The routine of runtime slot `i` ([`Target::alloc_slot`]): `SLOT_ENTRY + 16 * i`.
pub const SLOT_ENTRY: u64 = ARENA - 0x1000;

/// The functions, 32 bytes apart from [`TEXT`].
pub const FUNCS: [&str; 4] = ["f0", "f1", "f2", "f3"];

/// The address of function `name` (one of [`FUNCS`]).
pub fn func_addr(name: &str) -> u64 {
    let i = FUNCS
        .iter()
        .position(|f| *f == name)
        .unwrap_or_else(|| panic!("the fake kernel has no function `{name}`"));
    TEXT + 32 * i as u64
}

/// Where [`Target::alloc`] puts a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// One after another from [`ARENA`], 16-byte aligned, whatever `near` says, never reused;
    /// a block's id is its address (the module's arena, as the splicer sees it).
    #[default]
    Arena,
    /// The first page boundary 64 KiB past `near`, plus [`FakeState::misalign`], that overlaps
    /// no live block, and within ±2 GiB of `near` or refused; freed room is reused and ids
    /// count from 1 (a process's mapping near its code, as the component loader sees it).
    Near,
}

/// The fake machine's state; tests reach in through [`FakeKernel::state`].
pub struct FakeState {
    pub memory: BTreeMap<u64, u8>,
    pub next_block: u64,
    /// Live blocks by id.
    pub blocks: BTreeMap<u64, RepoBlock>,
    pub sealed: BTreeSet<u64>,
    /// Where blocks go.
    pub placement: Placement,
    /// Bytes a [`Placement::Near`] block starts past its page boundary (0: page-aligned).
    pub misalign: u64,
    /// What a fresh block holds (0 in the arena; garbage, 0xAA, in a repository, so that a
    /// loader that forgets to clear its bss is seen).
    pub fill: u8,
    /// Largest block handed out.
    pub max_block: usize,
    /// Set: allocations of this kind are refused (to test the clean-up of half-done work).
    pub refuse_alloc: Option<BlockKind>,
    /// Every allocation refused, with the reason.
    pub refused_allocs: Vec<String>,
    /// Blocks allocated, freed and sealed so far.
    pub allocs: usize,
    pub frees: usize,
    pub seals: usize,
    /// The ranges of every [`Target::quiesce`].
    pub quiesced: Vec<Vec<(u64, u64)>>,
    pub dispatch: BTreeMap<u64, DispatchEntry>,
    /// Hits the fake dispatcher reports per site.
    pub hits: BTreeMap<u64, u64>,
    /// Windows the module's rules refuse, by start address.
    pub refuse: BTreeMap<u64, SiteRefusal>,
    /// Every `(addr, len)` put to [`Target::check_sites`].
    pub checked: Vec<(u64, usize)>,
    /// The number of windows of every [`Target::check_sites`].
    pub check_batches: Vec<usize>,
    /// Text batches written.
    pub batches: usize,
    /// Every read: `(addr, len)`.
    pub reads: Vec<(u64, usize)>,
    /// The module's state blob: `(generation, bytes)`.
    pub blob: (u64, Vec<u8>),
    /// Set: QUIESCE fails with this (a task stays inside a replacement).
    pub quiesce_busy: Option<String>,
    /// Set: the next text batch is refused with this reason (as the module refuses a batch
    /// no planning check foresaw), and the setting is cleared.
    pub refuse_next_batch: Option<String>,
    /// DISPATCH_REPLACE calls made.
    pub replaced: usize,
    /// Bytes text batches changed, with what they held before (gone once restored).
    pub patched: BTreeMap<u64, u8>,
    /// Armed kprobes of another tool: [`Target::read`] shows an `int3` (`CC`) at each of these
    /// addresses, [`Target::read_code`] the byte the probe saved (as the module's READ_ORIGINAL).
    pub probed: BTreeSet<u64>,
    /// Set: the fake has a runtime and takes slots; unset (the default), it refuses them as a
    /// target without one does.
    pub runtime_slots: bool,
    /// Runtime slots taken and not given back, by index.
    pub slots: BTreeMap<u32, SlotSpec>,
    /// Every slot given back, in order (one given back twice is here twice).
    pub slots_freed: Vec<Slot>,
    /// Set: giving back a return point's slot fails with this (a thread still in its return
    /// handler, as RETURN_REMOVE's EBUSY) and the slot stays taken, until cleared.
    pub return_slot_busy: Option<String>,
}

impl Default for FakeState {
    fn default() -> Self {
        FakeState {
            memory: BTreeMap::new(),
            next_block: ARENA,
            blocks: BTreeMap::new(),
            sealed: BTreeSet::new(),
            placement: Placement::Arena,
            misalign: 0,
            fill: 0,
            max_block: usize::MAX,
            refuse_alloc: None,
            refused_allocs: Vec::new(),
            allocs: 0,
            frees: 0,
            seals: 0,
            quiesced: Vec::new(),
            dispatch: BTreeMap::new(),
            hits: BTreeMap::new(),
            refuse: BTreeMap::new(),
            checked: Vec::new(),
            check_batches: Vec::new(),
            batches: 0,
            reads: Vec::new(),
            blob: (0, Vec::new()),
            quiesce_busy: None,
            refuse_next_batch: None,
            replaced: 0,
            patched: BTreeMap::new(),
            probed: BTreeSet::new(),
            runtime_slots: false,
            slots: BTreeMap::new(),
            slots_freed: Vec::new(),
            return_slot_busy: None,
        }
    }
}

/// A kernel-like target; clones share the same machine.
#[derive(Clone)]
pub struct FakeKernel {
    info: TargetInfo,
    symbols: SymbolTable,
    inner: Arc<Mutex<FakeState>>,
}

impl Default for FakeKernel {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeKernel {
    /// As the module's CHECK: a window over text that a live patch changed is refused, and a
    /// window at an address of `refuse` for its reason.
    fn check_one(&self, addr: u64, len: usize) -> Result<(), TargetError> {
        let mut inner = self.state();
        inner.checked.push((addr, len));
        if inner
            .patched
            .range(addr..addr + len as u64)
            .next()
            .is_some()
        {
            return Err(TargetError::SiteRefused {
                addr,
                reason: SiteRefusal::LivePatch,
            });
        }
        match inner.refuse.get(&addr) {
            Some(reason) => Err(TargetError::SiteRefused {
                addr,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    pub fn new() -> Self {
        let mut inner = FakeState::default();
        let mut symbols = Vec::new();
        for name in FUNCS {
            let at = func_addr(name);
            for (i, b) in FUNC.iter().enumerate() {
                inner.memory.insert(at + i as u64, *b);
            }
            symbols.push(Symbol {
                name: name.into(),
                addr: at,
                size: 0,
                kind: SymbolKind::Function,
                origin: None,
                version: None,
            });
        }
        let end = TEXT + 32 * FUNCS.len() as u64;
        symbols.push(Symbol {
            name: "_etext".into(),
            addr: end,
            size: 0,
            kind: SymbolKind::Function,
            origin: None,
            version: None,
        });
        let info = TargetInfo::kernel("fake kernel", crate::abi::TRAP_VECTOR);
        FakeKernel {
            info,
            symbols: SymbolTable::new(symbols),
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    /// A fake kernel with only `symbols` and no text of its own (a real kernel's symbols, its
    /// text [`FakeKernel::poke`]d in by the caller): host-side reproductions of a kernel batch.
    pub fn with_only_symbols(symbols: Vec<Symbol>) -> Self {
        FakeKernel {
            info: TargetInfo::kernel("fake kernel", crate::abi::TRAP_VECTOR),
            symbols: SymbolTable::new(symbols),
            inner: Arc::new(Mutex::new(FakeState::default())),
        }
    }

    /// The fake kernel with `symbols` listed besides its own (aliases of its functions, a name
    /// two of them share, `__init_begin`/`__init_end` around some), its text unchanged.
    pub fn with_symbols(symbols: Vec<Symbol>) -> Self {
        let mut k = Self::new();
        let mut all: Vec<Symbol> = k.symbols.iter().cloned().collect();
        all.extend(symbols);
        k.symbols = SymbolTable::new(all);
        k
    }

    /// A repository for components: `info` (a process's, say) and, after the fake's own
    /// functions, `symbols` (what components import); blocks placed [`Placement::Near`] and
    /// filled with 0xAA, at most 16 MiB each (a kernel arena is a few MiB too).
    pub fn repository(info: TargetInfo, symbols: Vec<Symbol>) -> Self {
        let mut k = Self::new();
        let mut all: Vec<Symbol> = k.symbols.iter().cloned().collect();
        all.extend(symbols);
        k.symbols = SymbolTable::new(all);
        k.info = info;
        {
            let mut inner = k.state();
            inner.placement = Placement::Near;
            inner.next_block = 1;
            inner.fill = 0xAA;
            inner.max_block = 16 << 20;
        }
        k
    }

    /// The machine's state (a test that panicked holding it does not poison the others' view).
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `len` bytes at `addr`, which must be mapped.
    pub fn text(&self, addr: u64, len: usize) -> Vec<u8> {
        self.read(addr, len).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Repository blocks allocated and not freed.
    pub fn live_blocks(&self) -> usize {
        self.state().blocks.len()
    }

    /// Blocks allocated so far ([`FakeState::allocs`]).
    pub fn allocs(&self) -> usize {
        self.state().allocs
    }

    /// Blocks freed so far.
    pub fn frees(&self) -> usize {
        self.state().frees
    }

    /// Blocks sealed so far.
    pub fn seals(&self) -> usize {
        self.state().seals
    }

    /// The 8 bytes at `addr`, little-endian.
    pub fn text_u64(&self, addr: u64) -> u64 {
        u64::from_le_bytes(self.text(addr, 8).try_into().expect("8 bytes"))
    }

    /// Change bytes behind the target's back, sealed or not (to simulate corruption); `addr`
    /// must be mapped.
    pub fn poke(&self, addr: u64, bytes: &[u8]) {
        let mut inner = self.state();
        for (i, b) in bytes.iter().enumerate() {
            let at = addr + i as u64;
            let byte = inner
                .memory
                .get_mut(&at)
                .unwrap_or_else(|| panic!("poke of unmapped {at:#x}"));
            *byte = *b;
        }
    }

    /// Whether a live block holding `addr` has been sealed.
    pub fn is_sealed(&self, addr: u64) -> bool {
        let inner = self.state();
        inner
            .blocks
            .values()
            .any(|b| b.contains(addr) && inner.sealed.contains(&b.id))
    }

    /// Whether function `f`'s entry past the ftrace NOP holds the trap `int 0xF5`.
    pub fn trapped(&self, f: &str) -> bool {
        self.text(func_addr(f) + 5, 2) == [0xCD, 0xF5]
    }

    /// Whether every function has its original bytes, and no dispatch entry or block is left.
    pub fn pristine(&self) -> bool {
        FUNCS.iter().all(|f| self.text(func_addr(f), 32) == FUNC)
            && self.state().dispatch.is_empty()
            && self.state().blocks.is_empty()
    }

    /// The module's state blob and its generation.
    pub fn blob(&self) -> (u64, Vec<u8>) {
        self.state().blob.clone()
    }

    /// Store `bytes` as the blob if its generation is still `expected` (the module's
    /// compare-and-swap); returns the new generation.
    pub fn put_blob(&self, expected: u64, bytes: &[u8]) -> Result<u64, TargetError> {
        let mut inner = self.state();
        if inner.blob.0 != expected {
            return Err(TargetError::StateStale {
                expected,
                current: inner.blob.0,
            });
        }
        inner.blob = (expected + 1, bytes.to_vec());
        Ok(expected + 1)
    }
}

/// Compile `source` (C, with `components/include` on the include path) into `dir/NAME.o`, as a
/// kernel component is built: the tests' way to a component that declares splices or holds
/// variables.
pub fn cc_component(dir: &std::path::Path, name: &str, source: &str) -> std::path::PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap_or_else(|e| panic!("writing {}: {e}", c.display()));
    let o = dir.join(format!("{name}.o"));
    let include = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../components/include");
    let out = std::process::Command::new("cc")
        .args([
            "-c",
            "-O2",
            "-fno-pic",
            "-mcmodel=kernel",
            "-ffreestanding",
            "-fno-asynchronous-unwind-tables",
            "-I",
        ])
        .arg(&include)
        .arg("-o")
        .arg(&o)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| panic!("running cc: {e}"));
    assert!(
        out.status.success(),
        "cc {}: {}",
        c.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    o
}

/// A component with a 2-byte variable `knob` (7), a handler `on_f` (which increments it), and
/// a splice it declares at `f3` (trap, call `on_f`), compiled into `dir/knob.o`.
pub fn knob_component(dir: &std::path::Path) -> std::path::PathBuf {
    const KNOB: &str = "#include <trapvec.h>\n\
        unsigned short knob = 7;\n\
        void on_f(struct trapvec_regs *regs, void *cookie) { knob++; }\n\
        TRAPVEC_SPLICE_CALL(f3, \"f3\", on_f, \"trap\");\n";
    cc_component(dir, "knob", KNOB)
}

impl Target for FakeKernel {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        let mut bytes = self.read_code(addr, len)?;
        let inner = self.state();
        for &at in inner.probed.range(addr..addr + len as u64) {
            bytes[usize::try_from(at - addr).expect("inside the read")] = 0xCC;
        }
        Ok(bytes)
    }

    fn read_code(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        let mut inner = self.state();
        inner.reads.push((addr, len));
        (0..len as u64)
            .map(|i| inner.memory.get(&(addr + i)).copied())
            .collect::<Option<Vec<u8>>>()
            .ok_or(TargetError::Read {
                addr,
                len,
                reason: "unmapped".into(),
            })
    }

    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError> {
        let mut inner = self.state();
        let refused = if size == 0 {
            Some("empty block")
        } else if size > inner.max_block {
            Some("larger than the arena")
        } else if inner.refuse_alloc == Some(kind) {
            Some("refused by the test")
        } else {
            None
        };
        let (id, addr) = match (refused, inner.placement) {
            (Some(reason), _) => return Err(refuse_alloc(&mut inner, near, size, reason)),
            (None, Placement::Arena) => {
                let addr = inner.next_block;
                inner.next_block += size.next_multiple_of(16) as u64;
                (addr, addr)
            }
            (None, Placement::Near) => {
                let misalign = inner.misalign;
                let mut addr = (near + 0x1_0000).next_multiple_of(0x1000) + misalign;
                while let Some(b) = inner
                    .blocks
                    .values()
                    .find(|b| addr < b.addr + b.size as u64 && b.addr < addr + size as u64)
                {
                    addr = (b.addr + b.size as u64).next_multiple_of(0x1000) + misalign;
                }
                if addr + size as u64 - near > 1 << 31 {
                    return Err(refuse_alloc(&mut inner, near, size, "out of reach"));
                }
                let id = inner.next_block;
                inner.next_block += 1;
                (id, addr)
            }
        };
        let fill = inner.fill;
        for i in 0..size as u64 {
            inner.memory.insert(addr + i, fill);
        }
        let block = RepoBlock {
            id,
            addr,
            size,
            kind,
        };
        inner.blocks.insert(id, block.clone());
        inner.allocs += 1;
        Ok(block)
    }

    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError> {
        let mut inner = self.state();
        assert!(
            inner.blocks.contains_key(&block.id),
            "write to a freed block at {:#x}",
            block.addr
        );
        assert_eq!(
            inner.blocks.get(&block.id),
            Some(block),
            "write through a stale handle"
        );
        assert!(
            !inner.sealed.contains(&block.id),
            "write to a sealed block at {:#x}",
            block.addr
        );
        assert!(
            offset + bytes.len() <= block.size,
            "write past the block at {:#x}",
            block.addr
        );
        for (i, b) in bytes.iter().enumerate() {
            inner.memory.insert(block.addr + (offset + i) as u64, *b);
        }
        Ok(())
    }

    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        let mut inner = self.state();
        assert_eq!(
            inner.blocks.get(&block.id),
            Some(block),
            "seal of a block that is not live"
        );
        assert_eq!(
            block.kind,
            BlockKind::Code,
            "seal of a data block at {:#x}",
            block.addr
        );
        inner.sealed.insert(block.id);
        inner.seals += 1;
        Ok(())
    }

    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        let mut inner = self.state();
        assert!(
            inner.blocks.remove(&block.id).is_some(),
            "double free of {:#x}",
            block.addr
        );
        inner.sealed.remove(&block.id);
        inner.frees += 1;
        Ok(())
    }

    fn write_text(
        &mut self,
        batch: &[TextPatch],
        _live_interior: Option<&[u64]>,
    ) -> Result<(), TargetError> {
        if let Some(reason) = self.state().refuse_next_batch.take() {
            return Err(TargetError::Text {
                addr: batch.first().map_or(0, |p| p.addr),
                reason,
            });
        }
        for p in batch {
            let found = self.read(p.addr, p.old.len())?;
            if found != p.old {
                return Err(TargetError::TextMismatch {
                    addr: p.addr,
                    expected: crate::error::hex(&p.old),
                    found: crate::error::hex(&found),
                });
            }
        }
        let mut inner = self.state();
        inner.batches += 1;
        for p in batch {
            for (i, (old, new)) in p.old.iter().zip(&p.new).enumerate() {
                let at = p.addr + i as u64;
                inner.memory.insert(at, *new);
                let original = *inner.patched.entry(at).or_insert(*old);
                if original == *new {
                    inner.patched.remove(&at);
                }
            }
        }
        Ok(())
    }

    fn change_dispatch(
        &mut self,
        change: DispatchChange<'_>,
    ) -> Result<Vec<TrapHits>, TargetError> {
        match change {
            DispatchChange::Add(entries) => self.dispatch_add(entries).map(|()| Vec::new()),
            DispatchChange::Remove(sites) => self.dispatch_remove(sites).map(|()| Vec::new()),
            DispatchChange::Replace { entries, start } => self.dispatch_replace(entries, start),
        }
    }

    fn quiesce(&mut self, ranges: &[(u64, u64)]) -> Result<(), TargetError> {
        let mut inner = self.state();
        inner.quiesced.push(ranges.to_vec());
        match &inner.quiesce_busy {
            Some(why) => Err(TargetError::Quiesce(why.clone())),
            None => Ok(()),
        }
    }

    fn read_dispatch(
        &self,
        what: DispatchRead<'_>,
    ) -> Option<Result<DispatchReading, TargetError>> {
        let inner = self.state();
        Some(Ok(match what {
            DispatchRead::Table => {
                DispatchReading::Table(inner.dispatch.values().copied().collect())
            }
            DispatchRead::Hits(sites) => DispatchReading::Hits(
                sites
                    .iter()
                    .map(|site| {
                        inner.dispatch.contains_key(site).then(|| TrapHits {
                            hits: inner.hits.get(site).copied().unwrap_or(0),
                            missed: 0,
                        })
                    })
                    .collect(),
            ),
            DispatchRead::Hit => DispatchReading::Hit(
                inner
                    .dispatch
                    .keys()
                    .filter_map(|site| {
                        let hits = inner.hits.get(site).copied().unwrap_or(0);
                        (hits > 0).then_some((*site, TrapHits { hits, missed: 0 }))
                    })
                    .collect(),
            ),
        }))
    }

    /// As the module's CHECK_MANY: each window answered on its own ([`FakeKernel::check_one`]).
    fn check_sites(&self, windows: &[(u64, usize)]) -> Vec<Result<(), TargetError>> {
        self.state().check_batches.push(windows.len());
        windows
            .iter()
            .map(|&(addr, len)| self.check_one(addr, len))
            .collect()
    }

    /// The lowest free index; the cookie is `index + 1` (never 0, like the module's).
    fn alloc_slot(&mut self, spec: &SlotSpec) -> Result<Slot, TargetError> {
        let mut inner = self.state();
        if !inner.runtime_slots {
            return Err(TargetError::Unsupported {
                what: spec.what(),
                target: self.info.description.clone(),
            });
        }
        let index = (0..).find(|i| !inner.slots.contains_key(i)).unwrap_or(0);
        inner.slots.insert(index, *spec);
        let (entry, cookie) = (SLOT_ENTRY + 16 * u64::from(index), u64::from(index) + 1);
        Ok(match spec {
            SlotSpec::Return(_) => Slot::Return(crate::returns::ReturnSlot {
                index,
                entry,
                cookie,
            }),
            SlotSpec::Keyed(_) => Slot::Keyed(crate::keyed::KeySlot {
                index,
                entry,
                cookie,
            }),
        })
    }

    /// As the module: giving back a slot that is not taken (any more) is not an error.
    fn free_slot(&mut self, slot: &Slot) -> Result<(), TargetError> {
        let mut inner = self.state();
        if let (Slot::Return(s), Some(why)) = (slot, &inner.return_slot_busy) {
            return Err(TargetError::Quiesce(format!(
                "return-point slot {}: {why}",
                s.index
            )));
        }
        inner.slots_freed.push(*slot);
        inner.slots.remove(&slot.index());
        Ok(())
    }

    /// Nothing counted: an empty table, figures of no calls.
    fn read_slot(&self, slot: &Slot) -> Option<SlotReading> {
        let inner = self.state();
        inner.slots.get(&slot.index())?;
        Some(match slot {
            Slot::Return(_) => SlotReading::Return(crate::returns::ReturnStats::default()),
            Slot::Keyed(_) => SlotReading::Keyed(crate::keyed::KeyCounts::default()),
        })
    }
}

/// The dispatch changes of [`Target::change_dispatch`].
impl FakeKernel {
    fn dispatch_add(&mut self, entries: &[DispatchEntry]) -> Result<(), TargetError> {
        let mut inner = self.state();
        for e in entries {
            assert!(
                inner.dispatch.insert(e.site, *e).is_none(),
                "site {:#x} twice: applied twice",
                e.site
            );
        }
        Ok(())
    }

    fn dispatch_remove(&mut self, sites: &[u64]) -> Result<(), TargetError> {
        let mut inner = self.state();
        for s in sites {
            inner.dispatch.remove(s).ok_or(TargetError::Dispatch {
                site: *s,
                reason: "no entry".into(),
            })?;
        }
        Ok(())
    }

    /// The old entries' counts are [`FakeState::hits`] of their sites, which then hold `start`.
    fn dispatch_replace(
        &mut self,
        entries: &[DispatchEntry],
        start: &[TrapHits],
    ) -> Result<Vec<TrapHits>, TargetError> {
        let mut inner = self.state();
        if let Some(e) = entries
            .iter()
            .find(|e| !inner.dispatch.contains_key(&e.site))
        {
            return Err(TargetError::Dispatch {
                site: e.site,
                reason: "no entry".into(),
            });
        }
        inner.replaced += 1;
        let mut old = Vec::with_capacity(entries.len());
        for (e, h) in entries.iter().zip(start) {
            inner.dispatch.insert(e.site, *e);
            old.push(TrapHits {
                hits: inner.hits.insert(e.site, h.hits).unwrap_or(0),
                missed: 0,
            });
        }
        Ok(old)
    }
}

/// Refuse an allocation, keeping the reason in [`FakeState::refused_allocs`].
fn refuse_alloc(inner: &mut FakeState, near: u64, size: usize, reason: &str) -> TargetError {
    inner
        .refused_allocs
        .push(format!("{size} bytes near {near:#x}: {reason}"));
    TargetError::Alloc {
        near,
        size,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TargetExt;

    #[test]
    fn clones_share_one_machine_and_text_batches_check_the_old_bytes() {
        let mut k = FakeKernel::new();
        let other = k.clone();
        let site = func_addr("f2") + 5;
        let trap = TextPatch {
            addr: site,
            old: vec![0x55, 0x48],
            new: vec![0xCD, 0xF5],
        };
        k.patch_text(std::slice::from_ref(&trap)).unwrap();
        assert!(other.trapped("f2") && !other.trapped("f1"));
        let e = k.patch_text(&[trap]).unwrap_err().to_string();
        assert!(e.contains(&format!("{site:#x}")), "{e}");
        assert!(!other.pristine());
        assert_eq!(other.put_blob(0, b"s").unwrap(), 1);
        assert!(matches!(
            k.put_blob(0, b"t"),
            Err(TargetError::StateStale {
                expected: 0,
                current: 1
            })
        ));
        assert_eq!(k.blob(), (1, b"s".to_vec()));
    }
}
