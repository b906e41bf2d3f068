//! What a batch learns once and uses many times, so that a batch of thousands of splices costs
//! little more per splice than the bytes it writes:
//! - [`BatchCache`]: the text of every function the batch splices, read in as few target reads
//!   as the functions' addresses allow; each function analysed once, however many of its points
//!   the batch holds (the analysis is kept only for functions with more than one), with its jump
//!   tables read from the target, the jumps back from its cold parts (by name, and every
//!   direct branch into it from elsewhere in its object, each object's code scanned once) and
//!   its exception landing pads (each object's `.eh_frame_hdr` read once); each handler's lean-leaf check made once.
//! - [`read_words`]: counters of many splices read in a few target reads, not one each.
//!
//! A cache lives for one call (`apply`, `apply_best_effort`, `switch`, `plan`, `plan_each`):
//! the text it holds cannot change under it, since the splicer writes text only at the end of a
//! batch, after the last use of the cache.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

use trapvec::target::read_runs;
use trapvec::{Symbol, SymbolKind, Target};

use crate::analysis::landing::{landing_pads, EhFrameHdr, HdrTable};
use crate::analysis::parts::{part_names, targets_into};
use crate::analysis::{analyze_function_with, AnalysisOptions, Function, ObjectTargets};

use super::SpliceError;

/// Most symbols of one name taken as a function's cold part.
const MAX_PARTS: usize = 8;
/// Largest cold part decoded.
const MAX_PART_SIZE: u64 = 64 * 1024;

/// Analyses of one batch (see the module docs).
#[derive(Default)]
pub(super) struct BatchCache {
    /// Text read ahead: `(start, bytes)`, sorted by start, disjoint.
    text: Vec<(u64, Vec<u8>)>,
    /// Functions (by `(start, size)` of the symbol) with more than one point in the batch.
    shared: BTreeSet<(u64, u64)>,
    /// Their analyses, once made.
    functions: BTreeMap<(u64, u64), Rc<Function>>,
    /// By handler address: the handler's code range when it is a lean leaf.
    lean: HashMap<u64, Option<(u64, u64)>>,
    /// Each object's `.eh_frame_hdr`, by address, once read.
    eh_frame_hdrs: HashMap<u64, Rc<HdrTable>>,
    /// Each object's direct branch targets ([`ObjectTargets`]), by its code segments, once
    /// scanned (`None`: its code could not be read).
    object_targets: HashMap<Vec<(u64, u64)>, Option<Rc<ObjectTargets>>>,
    /// The bytes live splices replaced (`(addr, old)`, sorted): a function is analysed as it
    /// was, not as its patches left it (the rest of a longer instruction a trap covered, or the
    /// bytes behind a jmp, decode as other instructions and would hide its real boundaries).
    originals: Vec<(u64, Vec<u8>)>,
    /// Originals of splices taken out of the live set for the batch ([`Splicer::switch`]'s
    /// leaving splices, whose text the same batch restores), kept beside the live ones'.
    ///
    /// [`Splicer::switch`]: super::Splicer::switch
    leaving: Vec<(u64, Vec<u8>)>,
    /// The windows (`(site, displaced length)`) of trap splices a switch takes out: a trap
    /// planned on exactly such a window takes the site over in place, with no text written.
    leaving_traps: BTreeSet<(u64, usize)>,
    /// Time spent in the target's checks of the windows while planning ([`Target::check_sites`]).
    pub(super) check_time: std::time::Duration,
}

impl BatchCache {
    /// Read the code of `functions` ([`Target::read_code`], one per point of the batch) ahead,
    /// neighbours together (a span the target refuses is left out: its functions are read on
    /// their own later, and fail with their own error).
    pub(super) fn prefetch<'a, T: Target>(
        &mut self,
        target: &T,
        functions: impl IntoIterator<Item = &'a Symbol>,
    ) {
        let mut keys: Vec<(u64, u64)> = functions.into_iter().map(|f| (f.addr, f.size)).collect();
        keys.sort_unstable();
        self.shared = keys
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        keys.dedup();
        let ranges: Vec<(u64, u64)> = keys
            .iter()
            .map(|&(addr, size)| (addr, addr.saturating_add(size)))
            .collect();
        for run in read_runs(&ranges) {
            let (lo, hi) = (
                ranges[run.start].0,
                ranges[run.start..run.end]
                    .iter()
                    .map(|r| r.1)
                    .max()
                    .unwrap_or(0),
            );
            match usize::try_from(hi - lo).map(|len| target.read_code(lo, len)) {
                Ok(Ok(bytes)) => self.text.push((lo, bytes)),
                Ok(Err(e)) => log::debug!(
                    "reading text [{lo:#x}, {hi:#x}) ahead: {}",
                    trapvec::error_chain(&e)
                ),
                Err(_) => {}
            }
        }
        log::debug!(
            "text of {} function(s) read ahead in {} span(s)",
            ranges.len(),
            self.text.len()
        );
    }

    /// `len` bytes at `addr` from the text read ahead, if it holds them.
    fn text_at(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let i = self
            .text
            .partition_point(|(start, _)| *start <= addr)
            .checked_sub(1)?;
        let (start, bytes) = &self.text[i];
        let off = usize::try_from(addr - start).ok()?;
        bytes.get(off..off.checked_add(len)?)
    }

    /// Analyse functions with `patches`' old bytes in place of their new ones (the live
    /// splices' site and springboard patches).
    pub(super) fn set_originals<'a>(
        &mut self,
        patches: impl IntoIterator<Item = &'a trapvec::TextPatch>,
    ) {
        self.originals = patches
            .into_iter()
            .map(|p| (p.addr, p.old.clone()))
            .chain(self.leaving.iter().cloned())
            .collect();
        self.originals.sort_unstable_by_key(|(a, _)| *a);
    }

    /// Analyse functions with `patches`' old bytes in place too, whatever the live set is when
    /// [`BatchCache::set_originals`] runs (the patches of splices a switch takes out).
    pub(super) fn keep_originals<'a>(
        &mut self,
        patches: impl IntoIterator<Item = &'a trapvec::TextPatch>,
    ) {
        self.leaving
            .extend(patches.into_iter().map(|p| (p.addr, p.old.clone())));
    }

    /// Note the windows of trap splices a switch takes out ([`BatchCache::leaving_trap`]).
    pub(super) fn keep_trap_windows(&mut self, windows: impl IntoIterator<Item = (u64, usize)>) {
        self.leaving_traps.extend(windows);
    }

    /// Whether `(site, displaced length)` is the window of a trap splice the batch takes out.
    pub(super) fn leaving_trap(&self, site: u64, displaced_len: usize) -> bool {
        self.leaving_traps.contains(&(site, displaced_len))
    }

    /// `bytes` of `[addr, addr + len)` with every overlapping original put back, if any overlaps.
    fn unpatched(&self, addr: u64, bytes: &[u8]) -> Option<Vec<u8>> {
        let end = addr.saturating_add(bytes.len() as u64);
        // Patches are at most a few bytes long: one that overlaps starts less than 16 before.
        let first = self.originals.partition_point(|(a, _)| *a + 16 <= addr);
        let overlapping: Vec<&(u64, Vec<u8>)> = self.originals[first..]
            .iter()
            .take_while(|(a, _)| *a < end)
            .filter(|(a, old)| *a + old.len() as u64 > addr)
            .collect();
        if overlapping.is_empty() {
            return None;
        }
        let mut out = bytes.to_vec();
        for (a, old) in overlapping {
            for (i, b) in old.iter().enumerate() {
                let at = *a + i as u64;
                if (addr..end).contains(&at) {
                    out[usize::try_from(at - addr).unwrap_or(usize::MAX)] = *b;
                }
            }
        }
        Some(out)
    }

    /// The function `f` (as resolved for the point `at`, which errors name), decoded from the
    /// target's bytes the first time the batch asks for it, as they were before the live
    /// splices patched them and without the probes of other tools ([`Target::read_code`]: an
    /// armed kprobe's int3 would end a basic block in the middle of the function).
    pub(super) fn function<T: Target>(
        &mut self,
        target: &T,
        at: &str,
        f: &Symbol,
    ) -> Result<Rc<Function>, SpliceError> {
        let key = (f.addr, f.size);
        if let Some(func) = self.functions.get(&key) {
            return Ok(func.clone());
        }
        // Jumps into the function from elsewhere in its object (a stripped binary's `.cold`
        // parts have no names): their targets are branch targets too.
        let object_targets = self.object_targets(target, f.addr);
        let size = usize::try_from(f.size).unwrap_or(usize::MAX);
        let read;
        let bytes = match self.text_at(f.addr, size) {
            Some(b) => b,
            None => {
                read = target
                    .read_code(f.addr, size)
                    .map_err(|e| SpliceError::Target {
                        at: at.to_string(),
                        source: e,
                    })?;
                &read
            }
        };
        let unpatched = self.unpatched(f.addr, bytes);
        if unpatched.is_some() {
            log::debug!(
                "{at}: `{}` analysed with the original bytes of the live splices in it",
                f.name
            );
        }
        let bytes = unpatched.as_deref().unwrap_or(bytes);
        // Jump tables are read from the target: their entries are branch targets, which a jmp
        // window must not cover (`trapctl inspect` reads them the same way).
        let read = |a: u64, n: usize| target.read(a, n).ok();
        let opts = AnalysisOptions {
            read: Some(&read),
            lenient: false,
            object_targets: object_targets.as_deref(),
        };
        let mut func = analyze_function_with(&f.name, f.addr, bytes, &opts).map_err(|e| {
            SpliceError::Point {
                at: at.to_string(),
                source: e.into(),
            }
        })?;
        let parts = add_part_targets(target, &mut func);
        self.add_landing_pads(target, &mut func, &parts)
            .map_err(|e| SpliceError::Point {
                at: at.to_string(),
                source: e.into(),
            })?;
        let func = Rc::new(func);
        log::debug!(
            "{at}: `{}` analysed: {} instructions, {} blocks",
            f.name,
            func.insns.len(),
            func.blocks.len()
        );
        if self.shared.contains(&key) {
            self.functions.insert(key, func.clone());
        }
        Ok(func)
    }

    /// The direct branch targets of the whole object whose code holds `addr`
    /// ([`trapvec::TargetInfo::object_code`]), its code segments read as they were before the
    /// live splices patched them and scanned once per batch (objects come and go between
    /// batches). `None` when the target cannot say which object holds `addr` (the kernel,
    /// whose `.cold` parts have names) or its code cannot be read.
    fn object_targets<T: Target>(&mut self, target: &T, addr: u64) -> Option<Rc<ObjectTargets>> {
        let segments = target.info().object_code(addr)?;
        if let Some(t) = self.object_targets.get(&segments) {
            return t.clone();
        }
        let t0 = std::time::Instant::now();
        let mut code = Vec::with_capacity(segments.len());
        let mut unreadable = false;
        for &(lo, hi) in &segments {
            match usize::try_from(hi - lo).map(|len| target.read_code(lo, len)) {
                Ok(Ok(bytes)) => {
                    let bytes = self.unpatched(lo, &bytes).unwrap_or(bytes);
                    code.push((lo, bytes));
                }
                Ok(Err(e)) => {
                    log::debug!(
                        "the code [{lo:#x}, {hi:#x}) of the object holding {addr:#x}: {}",
                        trapvec::error_chain(&e)
                    );
                    unreadable = true;
                }
                Err(_) => unreadable = true,
            }
        }
        let t = (!unreadable).then(|| {
            let t = ObjectTargets::scan(code.iter().map(|(a, b)| (*a, b.as_slice())));
            log::debug!(
                "the object holding {addr:#x}: {} direct branches to {} targets in {} bytes of code, read and scanned in {:?}",
                t.branches,
                t.len(),
                t.code_bytes,
                t0.elapsed()
            );
            Rc::new(t)
        });
        self.object_targets.insert(segments, t.clone());
        t
    }

    /// Add to `func` the exception landing pads inside it that the LSDAs of its FDEs and of its
    /// cold parts' (`parts`) name (see [`crate::analysis::landing`]). Code of an object with no
    /// `.eh_frame_hdr`, or with no FDE, has none; unwind data that cannot be read is an error,
    /// since the landing pads it may name are unknown.
    fn add_landing_pads<T: Target>(
        &mut self,
        target: &T,
        func: &mut Function,
        parts: &[(u64, u64)],
    ) -> Result<(), crate::analysis::landing::LandingError> {
        let read = |a: u64, n: usize| target.read(a, n).ok();
        let mut pads = Vec::new();
        for &(lo, hi) in std::iter::once(&(func.start, func.end)).chain(parts) {
            let Some((addr, len)) = target.info().eh_frame_hdr(lo) else {
                log::debug!(
                    "`{}`: no .eh_frame_hdr holds {lo:#x}: no landing pads there",
                    func.name
                );
                continue;
            };
            let table = match self.eh_frame_hdrs.get(&addr) {
                Some(t) => t.clone(),
                None => {
                    let t = Rc::new(HdrTable::read(&read, &func.name, EhFrameHdr { addr, len })?);
                    self.eh_frame_hdrs.insert(addr, t.clone());
                    t
                }
            };
            pads.extend(landing_pads(&read, &func.name, &table, lo, hi)?);
        }
        let added = func.add_landing_pads(pads.iter().map(|p| p.addr));
        if !func.landing_pads.is_empty() {
            log::debug!(
                "`{}`: {} exception landing pad(s) {:x?} ({added} new branch targets)",
                func.name,
                func.landing_pads.len(),
                func.landing_pads
            );
        }
        Ok(())
    }

    /// Whether the handler at `handler` is a lean leaf (its code range if so), computed by
    /// `check` the first time the batch asks.
    pub(super) fn lean_leaf(
        &mut self,
        handler: u64,
        check: impl FnOnce() -> Option<(u64, u64)>,
    ) -> Option<(u64, u64)> {
        *self.lean.entry(handler).or_insert_with(check)
    }
}

/// Add to `func` the direct branch targets inside it of its cold parts (`foo.cold`, found by
/// name), or of the function it was split from when it is a cold part itself (see
/// [`crate::analysis::parts`]). A part that cannot be read or decoded adds nothing. Returns the
/// parts' ranges.
fn add_part_targets<T: Target>(target: &T, func: &mut Function) -> Vec<(u64, u64)> {
    let symbols = target.symbols();
    let mut parts = Vec::new();
    for name in part_names(&func.name) {
        // Static functions of several files may share a name: each candidate's jumps that land
        // inside this function count (over-approximating only makes planning stricter).
        for sym in symbols.lookup_all(&name).into_iter().take(MAX_PARTS) {
            if sym.kind != SymbolKind::Function || sym.addr == func.start {
                continue;
            }
            let size = symbols.function_extent(sym);
            let Some(len) = usize::try_from(size)
                .ok()
                .filter(|&n| n > 0 && size <= MAX_PART_SIZE)
            else {
                continue;
            };
            parts.push((sym.addr, sym.addr + size));
            let Ok(bytes) = target.read(sym.addr, len) else {
                continue;
            };
            let opts = AnalysisOptions {
                read: None,
                lenient: true,
                object_targets: None,
            };
            let Ok(part) = analyze_function_with(&sym.name, sym.addr, &bytes, &opts) else {
                continue;
            };
            let targets = targets_into(&part, func.start, func.end);
            let added = func.add_outside_targets(targets.iter().copied());
            if !targets.is_empty() {
                log::debug!(
                    "`{}`: {} branch target(s) from `{}` at {:#x} ({added} new)",
                    func.name,
                    targets.len(),
                    sym.name,
                    sym.addr
                );
            }
        }
    }
    parts
}

/// The little-endian 8-byte words at `addrs` (in that order), read in as few target reads as
/// they allow: words close to one another (counters in consecutive data blocks) are read as one
/// span. A span the target cannot read is read word by word; an unreadable word reads as 0.
pub(super) fn read_words<T: Target>(target: &T, addrs: &[u64]) -> Vec<u64> {
    let word = |b: &[u8]| b.try_into().map_or(0, u64::from_le_bytes);
    let mut order: Vec<usize> = (0..addrs.len()).collect();
    order.sort_unstable_by_key(|&i| addrs[i]);
    let ranges: Vec<(u64, u64)> = order
        .iter()
        .map(|&i| (addrs[i], addrs[i].saturating_add(8)))
        .collect();
    let mut out = vec![0u64; addrs.len()];
    let groups = read_runs(&ranges);
    for run in &groups {
        let (lo, hi) = (ranges[run.start].0, ranges[run.end - 1].1);
        let span = usize::try_from(hi - lo).unwrap_or(usize::MAX);
        match target.read(lo, span) {
            Ok(bytes) => {
                for &i in &order[run.clone()] {
                    let off = usize::try_from(addrs[i] - lo).unwrap_or(usize::MAX);
                    out[i] = bytes.get(off..off.saturating_add(8)).map_or(0, word);
                }
            }
            Err(e) => {
                log::debug!(
                    "reading counters [{lo:#x}, {hi:#x}) at once: {}; reading them one by one",
                    trapvec::error_chain(&e)
                );
                for &i in &order[run.clone()] {
                    out[i] = target.read(addrs[i], 8).map_or(0, |b| word(&b));
                }
            }
        }
    }
    log::debug!(
        "read {} counter(s) in {} span(s)",
        addrs.len(),
        groups.len()
    );
    out
}
