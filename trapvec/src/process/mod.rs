//! The process backend: the running process modifies its own code.
//!
//! - [`signal`]: the SIGSEGV trap handler, the SIGTRAP handler of the int3-first protocol and the
//!   thread-scan handler (everything that runs in signal context);
//! - [`text`]: the text writer (all-or-nothing, int3-first, `membarrier` core sync);
//! - [`keyed`]: keyed counts (hits by thread, process or CPU);
//! - `tcb`: where the thread id lies in a thread's control block (task predicates);
//! - [`returns`]: the return runtime (return points and timers: stubs, instances, unwind data);
//! - [`memory`]: the repository (code through a writable memfd alias, data), within ±2 GiB;
//! - [`scan`]: finding out whether another thread is executing in given ranges;
//! - [`symbols`]: the executable's and libraries' symbols;
//! - [`chain`]: the program's own dispositions of trapvec's signals, recorded and called;
//! - `fork`: a child's private copy of the code repository;
//! - `sys`: raw system calls for the code that must not enter libc.
//!
//! One process has one dispatch table and one set of handlers, shared by every
//! [`ProcessTarget`]; handlers are installed on the first [`ProcessTarget::new`] and stay.
//! trapvec uses `SIGRTMAX - 1` for its thread scans (`TRAPVEC_SIGNAL` names another): a program
//! that blocks it in some thread makes quiescence time out with an error naming that thread.

// This backend exists only on x86-64 Linux: `usize` is 64 bits, so `u64`/`usize` casts are exact,
// and the saved registers (`i64` greg slots) hold addresses reinterpreted bit for bit.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

pub mod chain;
mod epoch;
mod fork;
pub mod keyed;
mod memory;
pub mod returns;
mod scan;
pub(crate) mod signal;
mod symbols;
mod sys;
mod tcb;
mod text;

pub use signal::{parse_scan_signal, SignalError};

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::TargetError;
use crate::target::{
    BlockKind, DispatchChange, DispatchEntry, RepoBlock, SymbolTable, Target, TargetInfo,
    TaskFields, TextPatch, TrapHits,
};

/// Serialises text batches and dispatch changes across all targets of the process.
pub(crate) static WRITER: Mutex<()> = Mutex::new(());

/// The running process as a [`Target`].
pub struct ProcessTarget {
    info: TargetInfo,
    symbols: SymbolTable,
    repo: memory::Repository,
}

/// Counters of the trap handler, for tests and statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapStats {
    /// Traps redirected through the dispatch table.
    pub redirected: u64,
    /// Traps at sites removed meanwhile, sent back to run the original instruction.
    pub retried: u64,
}

/// Process-wide trap statistics.
pub fn trap_stats() -> TrapStats {
    TrapStats {
        redirected: signal::TRAPS_REDIRECTED.load(SeqCst),
        retried: signal::TRAPS_RETRIED.load(SeqCst),
    }
}

impl ProcessTarget {
    /// Install the handlers (once per process), register for core-serialising membarriers and
    /// read the symbols of everything loaded.
    pub fn new() -> Result<Self, TargetError> {
        signal::install()?;
        fork::register();
        text::register_membarrier()?;
        let symbols = symbols::process_symbols()?;
        let exe = std::fs::read_link("/proc/self/exe")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Ok(ProcessTarget {
            info: TargetInfo {
                // `tid` only: the guard compares `dword fs:[offset]` (the control block's
                // thread id).
                task_fields: TaskFields::OnFirstUse(tcb::layout),
                unwind_tables: Some(symbols::eh_frame_hdr),
                object_code: Some(symbols::object_code),
                ..TargetInfo::user(format!("process {} ({exe})", std::process::id()))
            },
            symbols,
            repo: memory::Repository::default(),
        })
    }

    /// Re-read symbols (after `dlopen`).
    pub fn refresh_symbols(&mut self) -> Result<(), TargetError> {
        self.symbols = symbols::process_symbols()?;
        Ok(())
    }

    /// Live repository blocks (a leak check for tests).
    pub fn live_blocks(&self) -> usize {
        self.repo.live_blocks()
    }
}

impl Target for ProcessTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        text::read_memory(addr, len)
    }

    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError> {
        self.repo.alloc(near, size, kind)
    }

    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError> {
        self.repo.write(block, offset, bytes)
    }

    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        self.repo.seal(block)
    }

    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        self.repo.free(block)
    }

    /// Both kinds live in this process's runtimes: [`returns`] and [`keyed`].
    fn alloc_slot(
        &mut self,
        spec: &crate::slots::SlotSpec,
    ) -> Result<crate::slots::Slot, TargetError> {
        use crate::slots::{Slot, SlotSpec};
        match spec {
            SlotSpec::Return(cfg) => returns::alloc_slot(cfg).map(Slot::Return),
            SlotSpec::Keyed(by) => keyed::alloc_slot(*by).map(Slot::Keyed),
        }
    }

    fn free_slot(&mut self, slot: &crate::slots::Slot) -> Result<(), TargetError> {
        use crate::slots::Slot;
        match slot {
            Slot::Return(s) => returns::free_slot(s),
            Slot::Keyed(s) => {
                keyed::free_slot(s);
                Ok(())
            }
        }
    }

    fn read_slot(&self, slot: &crate::slots::Slot) -> Option<crate::slots::SlotReading> {
        use crate::slots::{Slot, SlotReading};
        match slot {
            Slot::Return(s) => returns::stats(s).map(SlotReading::Return),
            Slot::Keyed(s) => keyed::counts(s).map(SlotReading::Keyed),
        }
    }

    fn write_text(
        &mut self,
        batch: &[TextPatch],
        live_interior: Option<&[u64]>,
    ) -> Result<(), TargetError> {
        let _w = WRITER.lock().unwrap_or_else(|e| e.into_inner());
        text::patch_batch(batch, live_interior)
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
        // Dispatch readers were drained by the table replacement; a thread redirected just before
        // that has its RIP at the destination by the time it can take the scan signal.
        scan::wait_until_outside(ranges, Duration::from_secs(5))
    }
}

/// The dispatch changes of [`Target::change_dispatch`].
impl ProcessTarget {
    fn dispatch_add(&mut self, entries: &[DispatchEntry]) -> Result<(), TargetError> {
        let _w = WRITER.lock().unwrap_or_else(|e| e.into_inner());
        signal::DISPATCH.update(|cur| {
            let mut pairs: Vec<(u64, u64)> = cur
                .map(|t| {
                    t.sites
                        .iter()
                        .copied()
                        .zip(t.dests.iter().copied())
                        .collect()
                })
                .unwrap_or_default();
            // The current table's sites are sorted: a batch of n entries costs O(n log n).
            let existing = cur.map_or(&[][..], |t| t.sites.as_slice());
            for e in entries {
                if e.handler != 0 {
                    return Err(TargetError::Dispatch {
                        site: e.site,
                        reason: "the process dispatcher does not run handlers; use a trampoline"
                            .into(),
                    });
                }
                if existing.binary_search(&e.site).is_ok() {
                    return Err(TargetError::Dispatch {
                        site: e.site,
                        reason: "site already has a dispatch entry".into(),
                    });
                }
                pairs.push((e.site, e.dest));
            }
            pairs.sort_unstable();
            if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(TargetError::Dispatch {
                    site: w[0].0,
                    reason: "given twice in one batch".into(),
                });
            }
            Ok(Some(signal::DispatchTable {
                sites: pairs.iter().map(|p| p.0).collect(),
                dests: pairs.iter().map(|p| p.1).collect(),
            }))
        })
    }

    fn dispatch_remove(&mut self, sites: &[u64]) -> Result<(), TargetError> {
        let _w = WRITER.lock().unwrap_or_else(|e| e.into_inner());
        signal::DISPATCH.update(|cur| {
            let t = cur.cloned().unwrap_or_default();
            for s in sites {
                if t.sites.binary_search(s).is_err() {
                    return Err(TargetError::Dispatch {
                        site: *s,
                        reason: "no dispatch entry for this site".into(),
                    });
                }
            }
            let mut gone = sites.to_vec();
            gone.sort_unstable();
            let (sites2, dests2): (Vec<u64>, Vec<u64>) = t
                .sites
                .iter()
                .zip(&t.dests)
                .filter(|(s, _)| gone.binary_search(s).is_err())
                .map(|(s, d)| (*s, *d))
                .unzip();
            Ok(if sites2.is_empty() {
                None
            } else {
                Some(signal::DispatchTable {
                    sites: sites2,
                    dests: dests2,
                })
            })
        })
    }

    /// One new table with the sites' new destinations, published as every table is: a thread
    /// in the SIGSEGV handler reads the old table or the new. The trampolines count the hits,
    /// so the old counts returned are zero.
    fn dispatch_replace(
        &mut self,
        entries: &[DispatchEntry],
        _start: &[TrapHits],
    ) -> Result<Vec<TrapHits>, TargetError> {
        let _w = WRITER.lock().unwrap_or_else(|e| e.into_inner());
        signal::DISPATCH.update(|cur| {
            let mut t = cur.cloned().unwrap_or_default();
            let mut seen = std::collections::HashSet::new();
            for e in entries {
                if e.handler != 0 {
                    return Err(TargetError::Dispatch {
                        site: e.site,
                        reason: "the process dispatcher does not run handlers; use a trampoline"
                            .into(),
                    });
                }
                if !seen.insert(e.site) {
                    return Err(TargetError::Dispatch {
                        site: e.site,
                        reason: "given twice in one batch".into(),
                    });
                }
                match t.sites.binary_search(&e.site) {
                    Ok(i) => t.dests[i] = e.dest,
                    Err(_) => {
                        return Err(TargetError::Dispatch {
                            site: e.site,
                            reason: "no dispatch entry for this site".into(),
                        })
                    }
                }
            }
            Ok(Some(t))
        })?;
        Ok(vec![TrapHits::default(); entries.len()])
    }
}
