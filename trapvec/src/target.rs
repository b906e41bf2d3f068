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
    /// An ELF `STT_GNU_IFUNC` symbol: its address is the resolver's, which returns the
    /// implementation the dynamic linker binds the name to. The process backend replaces it by
    /// that implementation; elsewhere a point naming it is refused.
    Ifunc,
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
    /// The symbol version, spelled as `.symtab` does after the name: `@@VER` for the default
    /// version a link binds to, `@VER` for a hidden (compatibility) one; `None` when unversioned.
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub version: Option<String>,
}

impl Symbol {
    /// Whether the symbol has a hidden (compatibility) version, `name@VER`: a link never binds
    /// an unversioned reference to it.
    pub fn is_hidden_version(&self) -> bool {
        self.version
            .as_deref()
            .is_some_and(|v| !v.starts_with("@@"))
    }

    /// The name with its version, as `nm` prints it (`memcpy@@GLIBC_2.14`).
    pub fn versioned_name(&self) -> String {
        format!("{}{}", self.name, self.version.as_deref().unwrap_or(""))
    }
}

/// A searchable set of symbols: by name, and by address (the function containing an address).
#[derive(Clone, Debug, Default)]
pub struct SymbolTable {
    /// Sorted by address, then by name, then in the order given to [`SymbolTable::new`].
    by_addr: Vec<Symbol>,
    /// Each name's first-listed symbol, as an index into `by_addr`.
    by_name: NameIndex,
    /// A process's objects' load biases (run-time address minus the address in the file), by
    /// [`Symbol::origin`]; empty for a kernel, whose `name@0xADDRESS` is the run-time address.
    biases: Vec<(Option<String>, u64)>,
    /// Per `by_addr` index: the furthest end of the sized function symbols up to it (0 for
    /// none), so that [`SymbolTable::function_containing`] stops looking back where no earlier
    /// sized function reaches the address (kallsyms sizes none: without this, each lookup
    /// walked back over every symbol below the address, 75% of planning 10,000 kernel points).
    sized_reach: Vec<u64>,
}

impl SymbolTable {
    /// Build from a list (any order). Earlier entries win name lookups over later ones with the
    /// same name, so put the main image first.
    ///
    /// A kernel has ~90,000 symbols and each kernel target (each trapctl command) builds this
    /// table, so it is built without comparing names except to order symbols at the same
    /// address, and without a second copy of the symbols: a permutation is sorted by address
    /// (stable, so ties keep the given order; kallsyms and ELF symbol tables arrive mostly in
    /// address order, which the sort takes in one pass) and applied in place, and the names go
    /// into a hash index.
    pub fn new(mut symbols: Vec<Symbol>) -> Self {
        let mut order: Vec<usize> = (0..symbols.len()).collect();
        order.sort_by(|&a, &b| {
            symbols[a]
                .addr
                .cmp(&symbols[b].addr)
                .then_with(|| symbols[a].name.cmp(&symbols[b].name))
        });
        permute_in_place(&mut symbols, &order);
        let by_name = NameIndex::build(&symbols, &order);
        let sized_reach = symbols
            .iter()
            .scan(0u64, |reach, s| {
                if s.kind == SymbolKind::Function && s.size > 0 {
                    *reach = (*reach).max(s.addr.saturating_add(s.size));
                }
                Some(*reach)
            })
            .collect();
        SymbolTable {
            by_addr: symbols,
            by_name,
            biases: Vec::new(),
            sized_reach,
        }
    }

    /// The same table, knowing each object's load bias (by [`Symbol::origin`]), so that
    /// [`SymbolTable::file_address`] can say where a symbol is in its file.
    pub fn with_load_biases(mut self, biases: Vec<(Option<String>, u64)>) -> Self {
        self.biases = biases;
        self
    }

    /// Where `sym` is in its object's file (its symbol table's value, as `nm` prints it): its
    /// run-time address less its object's load bias; `None` when the bias is not known (a
    /// kernel, or an object the table was not told of).
    pub fn file_address(&self, sym: &Symbol) -> Option<u64> {
        self.biases
            .iter()
            .find(|(origin, _)| *origin == sym.origin)
            .map(|&(_, bias)| sym.addr.wrapping_sub(bias))
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
        self.by_name
            .get(&self.by_addr, name)
            .map(|i| &self.by_addr[i])
    }

    /// Every symbol called `name` (any object, any version), in the order they were listed.
    pub fn lookup_all(&self, name: &str) -> Vec<&Symbol> {
        self.by_name
            .get_all(&self.by_addr, name)
            .into_iter()
            .map(|i| &self.by_addr[i])
            .collect()
    }

    /// The function containing `addr`: the last function symbol starting at or before `addr`
    /// whose extent (its size, or up to the next function when the size is 0) covers `addr`.
    pub fn function_containing(&self, addr: u64) -> Option<Symbol> {
        let end = self.by_addr.partition_point(|s| s.addr <= addr);
        // Looking back stops where no sized function at or before reaches past `addr`.
        let cand = self.by_addr[..end]
            .iter()
            .zip(&self.sized_reach[..end])
            .rev()
            .take_while(|&(_, &reach)| reach > addr)
            .map(|(s, _)| s)
            .find(|s| s.kind == SymbolKind::Function && s.size > 0 && addr < s.addr + s.size);
        if let Some(s) = cand {
            return Some(s.clone());
        }
        let s = self.by_addr[..end]
            .iter()
            .rev()
            .find(|s| s.kind == SymbolKind::Function)?;
        let next = self.by_addr[end..]
            .iter()
            .find(|n| n.addr > s.addr && n.kind == SymbolKind::Function)?;
        let size = (next.addr - s.addr).min(UNSIZED_EXTENT_MAX);
        (s.size == 0 && addr < s.addr + size).then(|| Symbol { size, ..s.clone() })
    }

    /// The extent of function `sym`: its size, or up to the next function symbol when its size is
    /// 0, at most [`UNSIZED_EXTENT_MAX`].
    pub fn function_extent(&self, sym: &Symbol) -> u64 {
        if sym.size > 0 {
            return sym.size;
        }
        let end = self.by_addr.partition_point(|s| s.addr <= sym.addr);
        self.by_addr[end..]
            .iter()
            .find(|n| n.kind == SymbolKind::Function)
            .map_or(0, |n| (n.addr - sym.addr).min(UNSIZED_EXTENT_MAX))
    }

    /// Function symbols whose start lies in `[lo, hi)`, in address order.
    pub fn functions_in(&self, lo: u64, hi: u64) -> impl Iterator<Item = &Symbol> {
        let start = self.by_addr.partition_point(|s| s.addr < lo);
        self.by_addr[start..]
            .iter()
            .take_while(move |s| s.addr < hi)
            .filter(|s| s.kind == SymbolKind::Function)
    }
}

/// Rearrange `items` so that `items[k]` becomes the item now at `order[k]` (`order` is a
/// permutation), following each of its cycles with swaps.
fn permute_in_place<T>(items: &mut [T], order: &[usize]) {
    let mut placed = vec![false; items.len()];
    for start in 0..items.len() {
        let mut k = start;
        while !placed[k] {
            placed[k] = true;
            let from = order[k];
            if from == start {
                break;
            }
            items.swap(k, from);
            k = from;
        }
    }
}

/// Names to symbols: every symbol of a [`SymbolTable`] as its index into `by_addr` and the
/// position it was given in, hashed by name. Built in one pass without copying names (the
/// entries point into `by_addr`), which matters for a kernel's ~90,000 symbols per command;
/// `hashbrown`'s `HashTable` is the std `HashMap`'s own table with the key kept outside it.
#[derive(Clone, Default)]
struct NameIndex {
    /// `(index into by_addr, rank)`; a name given several times has one entry each.
    entries: hashbrown::HashTable<(u32, u32)>,
}

impl NameIndex {
    /// Index every name of `by_addr`; `rank[i]` is the position symbol `i` was given in.
    fn build(by_addr: &[Symbol], rank: &[usize]) -> Self {
        assert!(
            u32::try_from(by_addr.len()).is_ok(),
            "{} symbols: a name index holds at most 2^32",
            by_addr.len()
        );
        let mut entries = hashbrown::HashTable::with_capacity(by_addr.len());
        for (i, sym) in by_addr.iter().enumerate() {
            let entry = (
                u32::try_from(i).expect("checked above"),
                u32::try_from(rank[i]).expect("a permutation of by_addr"),
            );
            entries.insert_unique(name_hash(&sym.name), entry, |&(j, _)| {
                name_hash(&by_addr[j as usize].name)
            });
        }
        NameIndex { entries }
    }

    /// The indices into `by_addr` (the table this was built from) of the symbols called `name`,
    /// in the order they were given.
    fn get_all(&self, by_addr: &[Symbol], name: &str) -> Vec<usize> {
        let mut found: Vec<(u32, u32)> = self
            .entries
            .iter_hash(name_hash(name))
            .filter(|&&(i, _)| by_addr[i as usize].name == name)
            .copied()
            .collect();
        found.sort_unstable_by_key(|&(_, rank)| rank);
        found.into_iter().map(|(i, _)| i as usize).collect()
    }

    /// The index of the first-given symbol called `name`.
    fn get(&self, by_addr: &[Symbol], name: &str) -> Option<usize> {
        self.entries
            .iter_hash(name_hash(name))
            .filter(|&&(i, _)| by_addr[i as usize].name == name)
            .min_by_key(|&&(_, rank)| rank)
            .map(|&(i, _)| i as usize)
    }
}

impl std::fmt::Debug for NameIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameIndex")
            .field("entries", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// FNV-1a of `name`: short names, no adversary (symbols come from the target), no per-table seed.
fn name_hash(name: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    name.bytes()
        .fold(OFFSET_BASIS, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
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
        TextPatch {
            addr: self.addr,
            old: self.new.clone(),
            new: self.old.clone(),
        }
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
    /// Only for tasks that match (kernel dispatcher, [`crate::predicate::TaskMatch`]); a
    /// non-matching trap goes to its `skip`, uncounted, without the handler.
    pub only: Option<crate::predicate::TaskMatch>,
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
    /// Whether a site's dispatch entry can be replaced in one step while its trap stays
    /// ([`DispatchChange::Replace`]): both backends can; a target that cannot refuses the change.
    pub replaces_dispatch: bool,
    /// Skip the ftrace `call __fentry__` site (5 bytes) when a point names a function's entry,
    /// and refuse windows overlapping it.
    pub has_fentry: bool,
    /// The vector of the trap written at sites (`CD <vector>`): the kernel module's (its
    /// `vector` parameter, read from INFO), [`crate::abi::TRAP_VECTOR`] in a process (a
    /// user-mode `int` of any system vector raises #GP; the signal handler expects 0xF5's).
    pub trap_vector: u8,
    /// Where the target counts the tasks inside `replace` replacements itself (the kernel
    /// module, which waits for that count before it reuses freed code or unloads); `None`: a
    /// splice counts in its own data block and leaves with a plain `ret` (the process backend,
    /// which scans threads). Read once when the target is opened.
    pub replace_counters: Option<ReplaceCounters>,
    /// Where code finds the fields of the task running it, for the guard of a task predicate
    /// ([`TargetInfo::predicate_test`]).
    pub task_fields: TaskFields,
    /// How to find the unwind tables of the target's code ([`TargetInfo::eh_frame_hdr`]): a
    /// process asks its dynamic linker (`dl_iterate_phdr`) at the time; `None` for the kernel,
    /// whose code throws no exceptions.
    pub unwind_tables: Option<UnwindTables>,
    /// How to find the code of the object holding an address ([`TargetInfo::object_code`]): a
    /// process asks its dynamic linker at the time; `None` for the kernel, whose split-off
    /// `.cold` parts kallsyms names.
    pub object_code: Option<ObjectCode>,
}

/// Finds the unwind tables covering an address: `(address, length)` of its `.eh_frame_hdr`.
pub type UnwindTables = fn(u64) -> Option<(u64, u64)>;

/// Finds the executable segments (`[start, end)`, sorted) of the loaded object whose code
/// holds an address.
pub type ObjectCode = fn(u64) -> Option<Vec<(u64, u64)>>;

/// Where a target's code finds the running task's fields ([`TargetInfo::task_fields`]).
#[derive(Clone, Copy, Debug)]
pub enum TaskFields {
    /// The target has no such fields: a task predicate is refused, naming the target.
    None,
    /// Known when the target was opened (the kernel: `current_task` and the offsets INFO gives).
    Known(crate::predicate::TaskLayout),
    /// Found by this function when a predicate first needs them (a process: the thread id's
    /// place in the thread control block, which takes a helper thread to find; not done at
    /// open, where the agent may be inside a library constructor).
    OnFirstUse(fn() -> Result<crate::predicate::TaskLayout, String>),
}

impl TargetInfo {
    /// User-space code (a process): a 128-byte red zone, the vector state saved around handlers,
    /// handlers run and hits counted by trampolines (the signal handler only redirects), no
    /// fentry sites, and the process backend's vector.
    pub fn user(description: impl Into<String>) -> Self {
        TargetInfo {
            description: description.into(),
            red_zone: 128,
            save_vector_regs: true,
            dispatcher_runs_handlers: false,
            dispatcher_counts_hits: false,
            replaces_dispatch: true,
            has_fentry: false,
            trap_vector: crate::abi::TRAP_VECTOR,
            replace_counters: None,
            task_fields: TaskFields::None,
            unwind_tables: None,
            object_code: None,
        }
    }

    /// Kernel code (trapvec.ko with its trap at `trap_vector`): no red zone, no vector state, the
    /// dispatcher runs `call` handlers and counts hits, and functions begin with an fentry site.
    pub fn kernel(description: impl Into<String>, trap_vector: u8) -> Self {
        TargetInfo {
            description: description.into(),
            red_zone: 0,
            save_vector_regs: false,
            dispatcher_runs_handlers: true,
            dispatcher_counts_hits: true,
            replaces_dispatch: true,
            has_fentry: true,
            trap_vector,
            replace_counters: None,
            task_fields: TaskFields::None,
            unwind_tables: None,
            object_code: None,
        }
    }

    /// [`TargetInfo::kernel`] (at the default vector) for kernel code, else [`TargetInfo::user`]:
    /// for analysing code read from a file, where no module says which vector it uses.
    pub fn for_code(kernel: bool, description: impl Into<String>) -> Self {
        if kernel {
            Self::kernel(description, crate::abi::TRAP_VECTOR)
        } else {
            Self::user(description)
        }
    }

    /// How code tests predicate `p` on the task running it ([`crate::predicate`]): the guard
    /// the splicer puts in front of a trampoline. Refused (naming the field) where the target
    /// has no such field.
    pub fn predicate_test(
        &self,
        p: &crate::predicate::Predicate,
    ) -> Result<crate::predicate::PredicateTest, TargetError> {
        use crate::predicate::TaskBase;
        let err = |reason: String| TargetError::Predicate {
            predicate: p.to_string(),
            reason,
        };
        let layout = match self.task_fields {
            TaskFields::None => {
                return Err(err(format!(
                    "task predicates are not supported on {}",
                    self.description
                )))
            }
            TaskFields::Known(layout) => layout,
            TaskFields::OnFirstUse(find) => find().map_err(err)?,
        };
        match layout.base {
            TaskBase::CurrentTask { .. } => {
                if let (Some(t), Some(pid)) = (p.tid, p.pid) {
                    if t != pid {
                        return Err(err(
                            "in the kernel tid and pid both name task->pid".into()
                        ));
                    }
                }
                layout.test(p, |f| format!("trapvec.ko gives no offset of `{f}`"))
            }
            TaskBase::ThreadPointer => layout.test(p, |f| {
                format!("`{f}` names a kernel task's field; in a process a predicate names a thread with `tid`")
            }),
        }
        .map_err(err)
    }

    /// The `.eh_frame_hdr` (address and size: the `PT_GNU_EH_FRAME` segment) of the loaded
    /// object whose code contains `addr`, where the unwinder finds that code's frame information
    /// and, through it, its exception landing pads. `None` when no object holds `addr`, it has
    /// none, or the target has no unwind tables ([`TargetInfo::unwind_tables`]).
    pub fn eh_frame_hdr(&self, addr: u64) -> Option<(u64, u64)> {
        self.unwind_tables.and_then(|find| find(addr))
    }

    /// The executable segments (`[start, end)`, sorted) of the loaded object whose code
    /// contains `addr`, where the planner looks for branches into a function from outside it
    /// (a stripped binary's unnamed `.cold` parts). `None` when no object holds `addr` or the
    /// target cannot say ([`TargetInfo::object_code`]).
    pub fn object_code(&self, addr: u64) -> Option<Vec<(u64, u64)>> {
        self.object_code.and_then(|find| find(addr))
    }

    /// Where a `replace` trampoline written into `code` counts the tasks inside its
    /// replacement, when the target keeps that count itself ([`TargetInfo::replace_counters`]).
    pub fn replace_counter(&self, code: &RepoBlock) -> Option<ReplaceCounter> {
        self.replace_counters.and_then(|c| c.of(code))
    }
}

/// The in-flight counters a target keeps for `replace` trampolines: one 8-byte counter per
/// `grain` bytes of its code arena (the kernel module's `TRAPVEC_ARENA_GRAIN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplaceCounters {
    /// The code arena, `[code_base, code_base + code_size)`.
    pub code_base: u64,
    pub code_size: u64,
    /// Bytes of the arena per counter.
    pub grain: u64,
    /// The first counter (the arena's first granule's).
    pub counters: u64,
    /// Where a trampoline goes after the replacement returns ([`ReplaceCounter::exit`]).
    pub exit: u64,
}

impl ReplaceCounters {
    /// The counter of the granule `code` starts in; `None` for a block outside the arena.
    pub fn of(&self, code: &RepoBlock) -> Option<ReplaceCounter> {
        let off = code.addr.checked_sub(self.code_base)?;
        (off < self.code_size && self.grain > 0).then(|| ReplaceCounter {
            counter: self.counters + 8 * (off / self.grain),
            exit: self.exit,
        })
    }
}

/// A target-owned in-flight counter of a `replace` trampoline ([`TargetInfo::replace_counter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplaceCounter {
    /// The 8-byte counter: `lock inc` before the replacement is called.
    pub counter: u64,
    /// Where the trampoline goes after the replacement returns, with `r11` = `counter`: it
    /// decrements the counter and returns to the replaced function's caller.
    pub exit: u64,
}

/// A change of the dispatch table ([`Target::change_dispatch`]), made all or none.
#[derive(Clone, Copy, Debug)]
pub enum DispatchChange<'a> {
    /// Entries for sites that have none.
    Add(&'a [DispatchEntry]),
    /// Remove the entries of these sites.
    Remove(&'a [u64]),
    /// Give sites that have a dispatch entry the entries `entries` instead, each in one step:
    /// the trap stays in the text and a trap taken at a site meets the old entry or the new,
    /// never neither. `start[i]`: what the new entry's counters start from, where the
    /// dispatcher counts. The change returns the old entries' final counters (zero where the
    /// dispatcher does not count), read once no trap can still be on its way through the old
    /// entries; what they sent the CPU to is the caller's to quiesce. Putting the old entries
    /// back with those counts undoes a replacement.
    Replace {
        entries: &'a [DispatchEntry],
        start: &'a [TrapHits],
    },
}

/// What [`Target::read_dispatch`] reads.
#[derive(Clone, Copy, Debug)]
pub enum DispatchRead<'a> {
    /// Every dispatch entry.
    Table,
    /// The dispatcher's counters of these sites.
    Hits(&'a [u64]),
    /// The sites whose dispatcher counted at least one hit, with their counters: what a reader
    /// of thousands of counters wants when few moved ([`TargetExt::trap_sites_hit`]).
    Hit,
}

/// What [`Target::read_dispatch`] read, the variant asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchReading {
    Table(Vec<DispatchEntry>),
    /// One per site asked about, in that order: `None` for a site without a dispatch entry.
    Hits(Vec<Option<TrapHits>>),
    /// Every site hit at least once, ordered by site.
    Hit(Vec<(u64, TrapHits)>),
}

/// What callers say to any [`Target`] in its own words, written once over the trait's
/// methods (implemented for every target; a backend writes none of these).
pub trait TargetExt: Target {
    /// [`Target::check_sites`] of one window.
    fn check_site(&self, addr: u64, len: usize) -> Result<(), TargetError> {
        self.check_sites(&[(addr, len)]).pop().unwrap_or(Ok(()))
    }

    /// [`Target::write_text`] knowing nothing of where CPUs are.
    fn patch_text(&mut self, batch: &[TextPatch]) -> Result<(), TargetError> {
        self.write_text(batch, None)
    }

    /// [`Target::write_text`] with the boundaries a CPU may be at inside the patched bytes.
    fn patch_text_live(
        &mut self,
        batch: &[TextPatch],
        live_interior: &[u64],
    ) -> Result<(), TargetError> {
        self.write_text(batch, Some(live_interior))
    }

    /// Add dispatch entries (all or none).
    fn add_dispatch(&mut self, entries: &[DispatchEntry]) -> Result<(), TargetError> {
        self.change_dispatch(DispatchChange::Add(entries)).map(drop)
    }

    /// Remove dispatch entries; unknown sites are an error and nothing is removed.
    fn remove_dispatch(&mut self, sites: &[u64]) -> Result<(), TargetError> {
        self.change_dispatch(DispatchChange::Remove(sites))
            .map(drop)
    }

    /// [`DispatchChange::Replace`]: the old entries' final counters.
    fn replace_dispatch(
        &mut self,
        entries: &[DispatchEntry],
        start: &[TrapHits],
    ) -> Result<Vec<TrapHits>, TargetError> {
        self.change_dispatch(DispatchChange::Replace { entries, start })
    }

    /// [`TargetInfo::replaces_dispatch`].
    fn replaces_dispatch(&self) -> bool {
        self.info().replaces_dispatch
    }

    /// Every dispatch entry the target holds now, when it can list them; `None` when it cannot.
    fn dispatch_entries(&self) -> Option<Result<Vec<DispatchEntry>, TargetError>> {
        Some(match self.read_dispatch(DispatchRead::Table)? {
            Ok(DispatchReading::Table(entries)) => Ok(entries),
            Ok(DispatchReading::Hits(_) | DispatchReading::Hit(_)) => {
                Err(TargetError::Other(format!(
                    "{} answered a read of its dispatch table with counters",
                    self.info().description
                )))
            }
            Err(e) => Err(e),
        })
    }

    /// Hit counters of a trap site, when the dispatcher keeps them and the site has an entry.
    fn trap_hits(&self, site: u64) -> Option<TrapHits> {
        self.trap_hits_many(&[site]).pop().flatten()
    }

    /// [`TargetExt::trap_hits`] of many sites, read together (one read of the target, which
    /// may answer from one pass over its table): one per site, in order, `None` for a site
    /// without an entry or when the dispatcher counts nothing (or could not be read, which is
    /// logged).
    /// The sites whose dispatcher counted a hit, with their counters, ordered by site; `None`
    /// where the target has no such reading (or it failed, which is logged): the caller then
    /// reads the sites it wants ([`TargetExt::trap_hits_many`]).
    fn trap_sites_hit(&self) -> Option<Vec<(u64, TrapHits)>> {
        match self.read_dispatch(DispatchRead::Hit) {
            Some(Ok(DispatchReading::Hit(mut hit))) => {
                hit.sort_unstable_by_key(|h| h.0);
                Some(hit)
            }
            Some(Ok(_)) | None => None,
            Some(Err(e)) => {
                log::warn!("the hit sites: {}", crate::error_chain(&e));
                None
            }
        }
    }

    fn trap_hits_many(&self, sites: &[u64]) -> Vec<Option<TrapHits>> {
        let none = || vec![None; sites.len()];
        if sites.is_empty() {
            return Vec::new();
        }
        match self.read_dispatch(DispatchRead::Hits(sites)) {
            Some(Ok(DispatchReading::Hits(hits))) if hits.len() == sites.len() => hits,
            Some(Ok(_)) | None => none(),
            Some(Err(e)) => {
                match sites {
                    [site] => log::warn!("hits of site {site:#x}: {}", crate::error_chain(&e)),
                    _ => log::warn!("hits of {} sites: {}", sites.len(), crate::error_chain(&e)),
                }
                none()
            }
        }
    }

    /// [`TargetInfo::predicate_test`].
    fn predicate_test(
        &self,
        p: &crate::predicate::Predicate,
    ) -> Result<crate::predicate::PredicateTest, TargetError> {
        self.info().predicate_test(p)
    }

    /// [`TargetInfo::replace_counter`].
    fn replace_counter(&self, code: &RepoBlock) -> Option<ReplaceCounter> {
        self.info().replace_counter(code)
    }
}

impl<T: Target + ?Sized> TargetExt for T {}

/// The thing being modified: what a backend implements. Callers also have [`TargetExt`].
pub trait Target {
    fn info(&self) -> &TargetInfo;

    /// Symbols of the target (executable and libraries, or kallsyms).
    fn symbols(&self) -> &SymbolTable;

    /// Current bytes at `addr`.
    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError>;

    /// The code at `addr` as a decoder must see it to find its instruction boundaries: without
    /// the patches of other tools that the target can undo in the copy it returns (the kernel
    /// backend puts back what armed kprobes replaced: an int3 read as the function's own
    /// instruction would end its basic block there). Planning decodes functions from these
    /// bytes; whatever must be compared with the text as it is uses [`Target::read`]. The
    /// default is [`Target::read`].
    fn read_code(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        self.read(addr, len)
    }

    /// Repository memory within ±2 GiB of `near` (`near` itself excluded from the block).
    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError>;

    /// Write into a block (a `Code` block only before it is sealed). Read back and compared.
    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError>;

    /// Make a `Code` block executable and read-only for good.
    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError>;

    /// Give a block back. The caller has made sure (via `quiesce`) that no CPU can run it.
    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError>;

    /// All-or-nothing batch of text changes (see the module docs). `live_interior`, when the
    /// caller knows it, lists the instruction boundaries of the code being replaced that lie
    /// strictly inside a patch (e.g. the second instruction under a trap written over a 1-byte
    /// `push`): backends that cannot stop the world wait until no CPU is at one of them, and an
    /// empty list says no CPU can be inside (the old bytes are a single instruction each).
    /// `None`: nothing is known, be conservative. Callers use [`TargetExt::patch_text`] and
    /// [`TargetExt::patch_text_live`].
    fn write_text(
        &mut self,
        batch: &[TextPatch],
        live_interior: Option<&[u64]>,
    ) -> Result<(), TargetError>;

    /// Change the dispatch table, all or none ([`DispatchChange`]): add entries, remove them
    /// (an unknown site is an error and nothing is removed), or replace them in place where
    /// [`TargetInfo::replaces_dispatch`] says the target can. Returns the old entries' final
    /// counters for a replacement, nothing otherwise. Callers use [`TargetExt::add_dispatch`],
    /// [`TargetExt::remove_dispatch`] and [`TargetExt::replace_dispatch`].
    fn change_dispatch(&mut self, change: DispatchChange<'_>)
        -> Result<Vec<TrapHits>, TargetError>;

    /// Wait until no CPU or thread can still be executing in `ranges` (`[start, end)`), nor be
    /// about to be sent there by a dispatch entry that was removed.
    fn quiesce(&mut self, ranges: &[(u64, u64)]) -> Result<(), TargetError>;

    /// Would the target itself accept a text patch over each window `[addr, addr + len)` of
    /// `windows` (instruction windows the planner has already validated; any order)? One answer
    /// per window, in the order given. Backends with rules of their own say no here, with the
    /// reason, so that a refusal comes at planning time instead of failing a batch (kernel:
    /// entry and noinstr text, the kprobes blacklist, exception-table instructions, …; the
    /// module checks a batch at once, each function decoded once for all its windows). Changes
    /// nothing. The default accepts everything. One window: [`TargetExt::check_site`].
    fn check_sites(&self, windows: &[(u64, usize)]) -> Vec<Result<(), TargetError>> {
        windows.iter().map(|_| Ok(())).collect()
    }

    /// Read the dispatch table as the target holds it now ([`DispatchRead`]): every entry (the
    /// kernel module's table, the truth a saved state is checked against) or the dispatcher's
    /// counters of some sites. `None` when the target cannot (it keeps no such table, or its
    /// dispatcher counts nothing). Callers use [`TargetExt::dispatch_entries`] and
    /// [`TargetExt::trap_hits`].
    fn read_dispatch(
        &self,
        what: DispatchRead<'_>,
    ) -> Option<Result<DispatchReading, TargetError>> {
        let _ = what;
        None
    }

    /// A slot of kind `spec` in the target's runtime ([`crate::slots`]): the splicer makes the
    /// splice a call of the slot's `entry` with its `cookie`. Targets without that kind of
    /// runtime refuse, naming it.
    fn alloc_slot(
        &mut self,
        spec: &crate::slots::SlotSpec,
    ) -> Result<crate::slots::Slot, TargetError> {
        Err(TargetError::Unsupported {
            what: spec.what(),
            target: self.info().description.clone(),
        })
    }

    /// Give a slot back once its splice can no longer reach it (text restored, quiescence
    /// reached). A return point's slot also waits until no thread runs its return handler
    /// (then its component may go); calls still inside the function return safely without the
    /// handler, and an error leaves the slot draining: calling again waits again. A slot
    /// already given back is not an error.
    fn free_slot(&mut self, _slot: &crate::slots::Slot) -> Result<(), TargetError> {
        Ok(())
    }

    /// What a live slot holds now (a return point's figures, a keyed count's table); `None`
    /// when the target has no such slot (any more).
    fn read_slot(&self, _slot: &crate::slots::Slot) -> Option<crate::slots::SlotReading> {
        None
    }
}

/// The most a symbol without a size (kallsyms gives none) is taken to extend towards the next
/// function symbol. Markers such as `_etext` or `_einittext` are followed by gaps of megabytes to
/// a gigabyte (the init text, the module area): read whole, one would exhaust a small machine's
/// memory. No kernel function comes near 1 MiB (the largest are tens of KiB).
pub const UNSIZED_EXTENT_MAX: u64 = 1 << 20;

/// Largest gap between two ranges that one read covers rather than reading them apart.
pub const READ_GAP_MAX: u64 = 4096;
/// Largest span read at once.
pub const READ_SPAN_MAX: u64 = 1 << 20;

/// Group `[lo, hi)` ranges sorted by `lo` into runs that one read of target memory covers, so
/// that a batch of thousands of sites or counters costs a few reads: each range starts at most
/// [`READ_GAP_MAX`] bytes after the run's end so far, and a run spans at most
/// [`READ_SPAN_MAX`] bytes (a single longer range is a run of its own). Returns index ranges
/// into `ranges`.
pub fn read_runs(ranges: &[(u64, u64)]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < ranges.len() {
        let (lo, mut end) = ranges[i];
        let mut j = i + 1;
        while let Some(&(a, b)) = ranges.get(j) {
            if a > end.saturating_add(READ_GAP_MAX) || b.max(end) - lo > READ_SPAN_MAX {
                break;
            }
            end = end.max(b);
            j += 1;
        }
        out.push(i..j);
        i = j;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The methods a backend writes, as this file declares them: `fn` items of `pub trait
    /// Target`.
    fn target_methods() -> Vec<String> {
        let src = include_str!("target.rs");
        let start = src.find("\npub trait Target {").expect("the trait");
        let body = &src[start..start + src[start..].find("\n}\n").expect("its end")];
        body.lines()
            .filter_map(|l| l.strip_prefix("    fn "))
            .map(|l| l.split(['(', '<']).next().unwrap_or(l).to_string())
            .collect()
    }

    #[test]
    fn a_backend_writes_at_most_sixteen_methods_and_none_of_the_callers_conveniences() {
        let methods = target_methods();
        // Issue 25's bound: the dispatch table, text writes and slots are one concept each,
        // what a target knows once is a TargetInfo fact (replace counters, task fields, unwind
        // tables), and the table and its counters are one read (see docs/internals.md).
        assert!(
            methods.len() <= 16,
            "{} methods: {methods:?}",
            methods.len()
        );
        for convenience in [
            "patch_text",
            "patch_text_live",
            "add_dispatch",
            "remove_dispatch",
            "replace_dispatch",
            "replaces_dispatch",
            "trap_hits",
            "dispatch_entries",
            "predicate_test",
            "replace_counter",
            "eh_frame_hdr",
        ] {
            assert!(
                !methods.iter().any(|m| m == convenience),
                "`{convenience}` is TargetExt's, written once over the trait"
            );
        }
        assert!(
            methods.iter().any(|m| m == "change_dispatch"),
            "{methods:?}"
        );
    }

    #[test]
    fn a_predicate_is_tested_with_the_task_fields_the_info_gives_or_refused_naming_why() {
        use crate::predicate::{Predicate, TaskBase, TaskLayout};
        let p = |tid, pid| Predicate {
            tid,
            pid,
            ..Predicate::default()
        };
        let none = TargetInfo::user("process 7");
        let e = none.predicate_test(&p(Some(1), None)).unwrap_err();
        assert!(
            e.to_string()
                .contains("task predicates are not supported on process 7"),
            "{e}"
        );
        let kernel = TargetInfo {
            task_fields: TaskFields::Known(TaskLayout {
                base: TaskBase::CurrentTask { per_cpu: 0x1000 },
                tid: Some(0x590),
                pid: Some(0x590),
                tgid: None,
                comm: None,
            }),
            ..TargetInfo::kernel("kernel", 0xf5)
        };
        let t = kernel.predicate_test(&p(None, Some(42))).unwrap();
        assert_eq!(t.base, TaskBase::CurrentTask { per_cpu: 0x1000 });
        assert_eq!((t.tests[0].offset, t.tests[0].value), (0x590, 42));
        let e = kernel.predicate_test(&p(Some(1), Some(2))).unwrap_err();
        assert!(
            e.to_string().contains("tid and pid both name task->pid"),
            "{e}"
        );
        let e = kernel
            .predicate_test(&Predicate {
                tgid: Some(3),
                ..Predicate::default()
            })
            .unwrap_err();
        assert!(e.to_string().contains("gives no offset of `tgid`"), "{e}");
        fn thread() -> Result<TaskLayout, String> {
            Ok(TaskLayout {
                base: TaskBase::ThreadPointer,
                tid: Some(0x2d0),
                pid: None,
                tgid: None,
                comm: None,
            })
        }
        let process = TargetInfo {
            task_fields: TaskFields::OnFirstUse(thread),
            ..TargetInfo::user("process 8")
        };
        let t = process.predicate_test(&p(Some(9), None)).unwrap();
        assert_eq!(
            (t.base, t.tests[0].offset, t.tests[0].value),
            (TaskBase::ThreadPointer, 0x2d0, 9)
        );
        let e = process.predicate_test(&p(None, Some(9))).unwrap_err();
        assert!(
            e.to_string().contains("`pid` names a kernel task's field"),
            "{e}"
        );
    }

    #[test]
    fn replace_counters_give_a_blocks_granule_and_nothing_outside_the_arena() {
        let c = ReplaceCounters {
            code_base: 0x10_0000,
            code_size: 0x1000,
            grain: 16,
            counters: 0x20_0000,
            exit: 0x30_0000,
        };
        let block = |addr| RepoBlock {
            id: 1,
            addr,
            size: 64,
            kind: BlockKind::Code,
        };
        assert_eq!(
            c.of(&block(0x10_0020)),
            Some(ReplaceCounter {
                counter: 0x20_0010,
                exit: 0x30_0000
            })
        );
        assert_eq!(c.of(&block(0x10_1000)), None);
        assert_eq!(c.of(&block(0xf_fff0)), None);
        let info = TargetInfo {
            replace_counters: Some(c),
            ..TargetInfo::kernel("k", 0xf5)
        };
        assert_eq!(
            info.replace_counter(&block(0x10_0000)).map(|r| r.counter),
            Some(0x20_0000)
        );
        assert_eq!(
            TargetInfo::user("p").replace_counter(&block(0x10_0000)),
            None
        );
    }

    #[test]
    fn read_runs_join_neighbours_and_split_at_gaps_and_the_span_limit() {
        let r = [
            (0x1000, 0x1010),
            (0x1010, 0x1020),
            (0x1800, 0x1808),
            (0x1808 + READ_GAP_MAX + 1, 0x3000),
        ];
        assert_eq!(read_runs(&r), vec![0..3, 3..4]);
        // Overlapping and nested ranges stay in one run.
        assert_eq!(
            read_runs(&[(0x100, 0x200), (0x150, 0x160), (0x180, 0x300)]),
            vec![0..3]
        );
        // A run stops before passing READ_SPAN_MAX; one range longer than that is a run alone.
        let (s, g) = (READ_SPAN_MAX, READ_GAP_MAX);
        let big = [(0, s - 8), (s - 8, s), (s, s + 8), (s + 16, 3 * s)];
        assert_eq!(read_runs(&big), vec![0..2, 2..3, 3..4]);
        assert_eq!(
            read_runs(&[(0, 8), (8 + g, 16 + g)]),
            vec![0..2],
            "a gap of exactly the limit is read over"
        );
        assert!(read_runs(&[]).is_empty());
    }

    fn sym(name: &str, addr: u64, kind: SymbolKind, origin: Option<&str>) -> Symbol {
        Symbol {
            name: name.into(),
            addr,
            size: 0,
            kind,
            origin: origin.map(Into::into),
            version: None,
        }
    }

    fn func(name: &str, addr: u64) -> Symbol {
        sym(name, addr, SymbolKind::Function, None)
    }

    #[test]
    fn lookup_finds_each_of_ten_thousand_names_and_nothing_else() {
        // Names alike but for a counter, given in reverse address order.
        let symbols: Vec<Symbol> = (0..10_000u64)
            .rev()
            .map(|i| func(&format!("fn_{i}"), 0x1000 + i * 16))
            .collect();
        let table = SymbolTable::new(symbols);
        assert_eq!(table.len(), 10_000);
        for i in 0..10_000u64 {
            assert_eq!(
                table.lookup(&format!("fn_{i}")).map(|s| s.addr),
                Some(0x1000 + i * 16),
                "fn_{i}"
            );
        }
        for absent in ["fn_10000", "fn_", "", "fn_0 ", "Fn_1"] {
            assert!(table.lookup(absent).is_none(), "{absent:?}");
        }
    }

    #[test]
    fn lookup_returns_the_first_listed_of_a_repeated_name_wherever_it_lies() {
        let table = SymbolTable::new(vec![
            sym("dup", 0x3000, SymbolKind::Function, None),
            sym("dup", 0x1000, SymbolKind::Function, Some("libfoo.so")),
            sym("dup", 0x3000, SymbolKind::Object, Some("mod")),
            func("other", 0x2000),
        ]);
        let dup = table.lookup("dup").unwrap();
        assert_eq!(
            (dup.addr, dup.kind, dup.origin.as_deref()),
            (0x3000, SymbolKind::Function, None)
        );
        assert_eq!(table.lookup("other").unwrap().addr, 0x2000);
    }

    #[test]
    fn iteration_is_by_address_then_name_then_given_order() {
        let table = SymbolTable::new(vec![
            func("b", 0x20),
            sym("a", 0x20, SymbolKind::Object, Some("second")),
            func("c", 0x10),
            sym("a", 0x20, SymbolKind::Object, Some("third")),
            func("a", 0x30),
        ]);
        let got: Vec<(u64, &str, Option<&str>)> = table
            .iter()
            .map(|s| (s.addr, s.name.as_str(), s.origin.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (0x10, "c", None),
                (0x20, "a", Some("second")),
                (0x20, "a", Some("third")),
                (0x20, "b", None),
                (0x30, "a", None)
            ]
        );
        assert_eq!(
            table.lookup("a").unwrap().origin.as_deref(),
            Some("second"),
            "given before `a` at 0x30"
        );
    }

    #[test]
    fn permuting_in_place_moves_each_item_where_the_order_says() {
        // Cycles of every length, fixed points and one long cycle.
        let order = [3, 0, 1, 2, 4, 6, 5, 9, 7, 8, 10];
        let mut items: Vec<String> = (0..order.len()).map(|i| format!("item{i}")).collect();
        let expected: Vec<String> = order.iter().map(|&i| items[i].clone()).collect();
        permute_in_place(&mut items, &order);
        assert_eq!(items, expected);
        let reversed: Vec<usize> = (0..1000).rev().collect();
        let mut numbers: Vec<usize> = (0..1000).collect();
        permute_in_place(&mut numbers, &reversed);
        assert_eq!(numbers, reversed);
    }

    #[test]
    fn small_tables_answer_absent_names_too() {
        for n in 1..=8u64 {
            let table = SymbolTable::new(
                (0..n)
                    .map(|i| func(&format!("f{i}"), 0x1000 * (i + 1)))
                    .collect(),
            );
            assert!(table.lookup("absent").is_none(), "{n} symbols");
            assert_eq!(
                table.lookup(&format!("f{}", n - 1)).map(|s| s.addr),
                Some(0x1000 * n)
            );
        }
    }

    #[test]
    fn empty_tables_find_nothing() {
        for table in [SymbolTable::default(), SymbolTable::new(Vec::new())] {
            assert!(table.is_empty());
            assert!(table.lookup("anything").is_none());
            assert!(table.function_containing(0x1000).is_none());
        }
    }

    #[test]
    fn sizeless_function_runs_to_the_next_function_not_the_next_object() {
        let table = SymbolTable::new(vec![
            func("f", 0x1000),
            sym("data_in_between", 0x1010, SymbolKind::Object, None),
            func("g", 0x1040),
        ]);
        let f = table.lookup("f").unwrap();
        assert_eq!(table.function_extent(f), 0x40);
        let containing = table.function_containing(0x1030).unwrap();
        assert_eq!((containing.name.as_str(), containing.size), ("f", 0x40));
        assert!(
            table.function_containing(0x1040 + 1).is_none(),
            "g is last: nothing bounds it"
        );
        assert_eq!(
            table
                .functions_in(0x1000, 0x1041)
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["f", "g"]
        );
    }

    #[test]
    fn a_sizeless_marker_before_a_gigabyte_gap_extends_one_mib_at_most() {
        // `_einittext` and the module area: kallsyms puts 1 GiB between them.
        let table = SymbolTable::new(vec![func("_einittext", 0x1000), func("far", 0x4000_1000)]);
        let e = table.lookup("_einittext").unwrap();
        assert_eq!(table.function_extent(e), UNSIZED_EXTENT_MAX);
        let c = table
            .function_containing(0x1000 + UNSIZED_EXTENT_MAX - 1)
            .unwrap();
        assert_eq!(
            (c.name.as_str(), c.size),
            ("_einittext", UNSIZED_EXTENT_MAX)
        );
        assert!(table
            .function_containing(0x1000 + UNSIZED_EXTENT_MAX)
            .is_none());
    }

    #[test]
    fn function_containing_finds_a_sized_function_past_the_unsized_symbols_inside_it() {
        // A sized function reaching over later ones (sized and not, objects too), as a
        // process's outlined parts do: the lookup looks back past every symbol it covers, and
        // answers as the plain backward scan it replaced.
        let sized = |name: &str, addr: u64, size: u64| Symbol {
            size,
            ..func(name, addr)
        };
        let table = SymbolTable::new(vec![
            sized("big", 0x1000, 0x1000),
            func("inner", 0x1100),
            sym("obj", 0x1200, SymbolKind::Object, None),
            sized("small", 0x1300, 0x10),
            func("unsized_after", 0x2100),
            sized("last", 0x2200, 0x20),
        ]);
        let plain = |addr: u64| {
            table
                .iter()
                .filter(|s| s.addr <= addr)
                .filter(|s| s.kind == SymbolKind::Function && s.size > 0)
                .filter(|s| addr < s.addr + s.size)
                .last()
                .map(|s| s.name.clone())
        };
        for addr in (0xff0..0x2300).step_by(8) {
            let got = table.function_containing(addr);
            if let Some(name) = plain(addr) {
                assert_eq!(got.map(|s| s.name), Some(name), "{addr:#x}");
            }
        }
        let at = |a: u64| table.function_containing(a).map(|s| s.name);
        assert_eq!(at(0x1308).as_deref(), Some("small"));
        assert_eq!(at(0x1400).as_deref(), Some("big"));
        assert_eq!(at(0x2180).as_deref(), Some("unsized_after"));
    }
}
