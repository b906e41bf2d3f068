//! The [`Target`] trait: everything the planners need from the thing being modified.
//!
//! Contract for every backend:
//! - `read` returns the *current* bytes (a text patch is visible as soon as `patch_text` returns).
//! - Repository blocks are allocated within ±2 GiB of `near` so that `rel32` reaches both ways.
//!   `Code` blocks are written, then sealed (executable, never written again); `Data` blocks stay
//!   writable and are never executable.
//! - `patch_text` is all-or-nothing: every patch's `old` bytes are checked first; if one differs,
//!   nothing is written and [`TargetError::TextMismatch`] names it. Text is written only by a
//!   protocol that is safe against CPUs executing it (stop_machine, or int3-first with core sync).
//! - Order used by the splicer: add dispatch entries, then write traps; on removal, restore the
//!   text, remove the dispatch entries, `quiesce`, and only then free blocks.

use crate::error::TargetError;

/// Kind of a symbol, as far as the planners care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum SymbolKind {
    Function,
    Object,
    Other,
}

/// An owned symbol of the target: a name bound to an absolute address.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Symbol {
    pub name: String,
    /// Absolute run-time address (load bias applied).
    pub addr: u64,
    /// Size in bytes; 0 when unknown (then the next symbol bounds it).
    pub size: u64,
    pub kind: SymbolKind,
    /// Where it comes from: a file path (process) or a module name (kernel); `None` for the main
    /// image (executable or vmlinux).
    pub origin: Option<String>,
}

/// A searchable set of symbols: by name, and by address (the function containing an address).
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    /// Sorted by address, then by name.
    by_addr: Vec<Symbol>,
    /// Index into `by_addr`, sorted by name; the first definition of a name wins in `lookup`.
    by_name: Vec<usize>,
}

impl SymbolTable {
    /// Build from a list (any order). Earlier entries win name lookups over later ones with the
    /// same name, so put the main image first.
    pub fn new(mut symbols: Vec<Symbol>) -> Self {
        // Keep the insertion order as the tie-breaker for names.
        let mut order: Vec<(usize, Symbol)> = symbols.drain(..).enumerate().collect();
        order.sort_by(|a, b| a.1.addr.cmp(&b.1.addr).then_with(|| a.1.name.cmp(&b.1.name)));
        let rank: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
        let by_addr: Vec<Symbol> = order.into_iter().map(|(_, s)| s).collect();
        let mut by_name: Vec<usize> = (0..by_addr.len()).collect();
        by_name.sort_by(|&a, &b| by_addr[a].name.cmp(&by_addr[b].name).then(rank[a].cmp(&rank[b])));
        SymbolTable { by_addr, by_name }
    }

    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Symbol> {
        self.by_addr.iter()
    }

    /// The first-listed symbol called `name`.
    pub fn lookup(&self, name: &str) -> Option<&Symbol> {
        let i = self.by_name.partition_point(|&i| self.by_addr[i].name.as_str() < name);
        self.by_name.get(i).map(|&j| &self.by_addr[j]).filter(|s| s.name == name)
    }

    /// The function containing `addr`: the last function symbol starting at or before `addr`
    /// whose extent (its size, or up to the next function when the size is 0) covers `addr`.
    pub fn function_containing(&self, addr: u64) -> Option<Symbol> {
        let end = self.by_addr.partition_point(|s| s.addr <= addr);
        let cand = self.by_addr[..end].iter().rev().find(|s| s.kind == SymbolKind::Function && s.size > 0 && addr < s.addr + s.size);
        if let Some(s) = cand {
            return Some(s.clone());
        }
        let s = self.by_addr[..end].iter().rev().find(|s| s.kind == SymbolKind::Function)?;
        let next = self.by_addr[end..].iter().find(|n| n.addr > s.addr && n.kind == SymbolKind::Function)?;
        (s.size == 0 && addr < next.addr).then(|| Symbol { size: next.addr - s.addr, ..s.clone() })
    }

    /// The extent of function `sym`: its size, or up to the next function symbol when its size is 0.
    pub fn function_extent(&self, sym: &Symbol) -> u64 {
        if sym.size > 0 {
            return sym.size;
        }
        let end = self.by_addr.partition_point(|s| s.addr <= sym.addr);
        self.by_addr[end..]
            .iter()
            .find(|n| n.kind == SymbolKind::Function)
            .map_or(0, |n| n.addr - sym.addr)
    }

    /// Function symbols whose start lies in `[lo, hi)`, in address order.
    pub fn functions_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Symbol> {
        let start = self.by_addr.partition_point(|s| s.addr < lo);
        self.by_addr[start..].iter().take_while(move |s| s.addr < hi).filter(|s| s.kind == SymbolKind::Function)
    }
}

/// Memory kinds of the repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BlockKind {
    /// Written, then sealed read+execute; never written after sealing.
    Code,
    /// Read+write, never executable: component data, GOT slots, counters, indirection slots.
    Data,
}

/// A block of repository memory owned by the caller until freed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RepoBlock {
    /// Backend handle (arena block id, or the address itself).
    pub id: u64,
    pub addr: u64,
    pub size: usize,
    pub kind: BlockKind,
}

impl RepoBlock {
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.addr && addr < self.addr + self.size as u64
    }
}

/// One change of text: `old` must be there, `new` (same length) replaces it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TextPatch {
    pub addr: u64,
    pub old: Vec<u8>,
    pub new: Vec<u8>,
}

impl TextPatch {
    /// The patch that undoes this one.
    pub fn inverse(&self) -> TextPatch {
        TextPatch { addr: self.addr, old: self.new.clone(), new: self.old.clone() }
    }
}

/// Where the trap handler sends a CPU that trapped at `site`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DispatchEntry {
    /// Address of the `CD F5`.
    pub site: u64,
    /// Where execution continues (`regs->ip = dest`).
    pub dest: u64,
    /// A handler `H(struct trapvec_regs *, void *cookie)` the dispatcher runs itself before
    /// redirecting (only for backends with [`TargetInfo::dispatcher_runs_handlers`]); 0 for none.
    pub handler: u64,
    pub cookie: u64,
}

/// Per-site counters kept by the trap dispatcher (kernel backend).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TrapHits {
    pub hits: u64,
    /// Traps taken while a handler was already running on that CPU: the handler was skipped.
    pub missed: u64,
}

/// Static facts about a target that change how code for it is generated.
#[derive(Clone, Debug)]
pub struct TargetInfo {
    /// "process 1234 (/usr/bin/foo)" or "kernel 6.1.0-…".
    pub description: String,
    /// Bytes below the stack pointer that code may use without moving it (128 in user space,
    /// 0 in the kernel, which is built with -mno-red-zone).
    pub red_zone: u32,
    /// Whether trampolines must save and restore xmm0–15 around a C handler (user space: yes,
    /// live float arguments; kernel: no, kernel code does not touch the FPU).
    pub save_vector_regs: bool,
    /// Whether the trap dispatcher runs `call` handlers itself (kernel: like a kprobe
    /// pre-handler, with reentrancy detection) instead of sending the CPU to a saving trampoline.
    pub dispatcher_runs_handlers: bool,
    /// Whether the trap dispatcher counts hits per site (then [`Target::trap_hits`] is `Some`).
    pub dispatcher_counts_hits: bool,
    /// Skip the ftrace `call __fentry__` site (5 bytes) when a point names a function's entry,
    /// and refuse windows overlapping it.
    pub has_fentry: bool,
}

/// The thing being modified.
pub trait Target {
    fn info(&self) -> &TargetInfo;

    /// Symbols of the target (executable and libraries, or kallsyms).
    fn symbols(&self) -> &SymbolTable;

    /// Current bytes at `addr`.
    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError>;

    /// Repository memory within ±2 GiB of `near` (`near` itself excluded from the block).
    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError>;

    /// Write into a block (a `Code` block only before it is sealed). Read back and compared.
    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError>;

    /// Make a `Code` block executable and read-only for good.
    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError>;

    /// Give a block back. The caller has made sure (via `quiesce`) that no CPU can run it.
    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError>;

    /// All-or-nothing batch of text changes (see the module docs).
    fn patch_text(&mut self, batch: &[TextPatch]) -> Result<(), TargetError>;

    /// [`Target::patch_text`] when the caller knows where a CPU may be executing inside the
    /// patched bytes: `live_interior` lists the instruction boundaries of the code being replaced
    /// that lie strictly inside a patch (e.g. the second instruction under a trap written over a
    /// 1-byte `push`). Backends that cannot stop the world wait until no CPU is at one of them;
    /// an empty list says no CPU can be inside (the old bytes are a single instruction each).
    /// The default is the conservative `patch_text`.
    fn patch_text_live(&mut self, batch: &[TextPatch], live_interior: &[u64]) -> Result<(), TargetError> {
        let _ = live_interior;
        self.patch_text(batch)
    }

    /// Add dispatch entries (all or none).
    fn add_dispatch(&mut self, entries: &[DispatchEntry]) -> Result<(), TargetError>;

    /// Remove dispatch entries; unknown sites are an error and nothing is removed.
    fn remove_dispatch(&mut self, sites: &[u64]) -> Result<(), TargetError>;

    /// Wait until no CPU or thread can still be executing in `ranges` (`[start, end)`), nor be
    /// about to be sent there by a dispatch entry that was removed.
    fn quiesce(&mut self, ranges: &[(u64, u64)]) -> Result<(), TargetError>;

    /// Hit counters of a trap site, when the dispatcher keeps them.
    fn trap_hits(&self, _site: u64) -> Option<TrapHits> {
        None
    }

    /// Would the target itself accept a text patch over `[addr, addr + len)` (an instruction
    /// window the planner has already validated)? Backends with rules of their own say no here,
    /// with the reason, so that a refusal comes at planning time instead of failing a batch
    /// (kernel: entry and noinstr text, the kprobes blacklist, exception-table instructions, …).
    /// Changes nothing. The default accepts everything.
    fn check_site(&self, _addr: u64, _len: usize) -> Result<(), TargetError> {
        Ok(())
    }

    /// Every dispatch entry the target holds now, when it can list them (kernel: the module's
    /// table, the truth a saved state is checked against); `None` when it cannot.
    fn dispatch_entries(&self) -> Option<Result<Vec<DispatchEntry>, TargetError>> {
        None
    }
}
