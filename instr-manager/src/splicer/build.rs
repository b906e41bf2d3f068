//! Step 2 of a splice's life, building: allocate a data block (hit counter, in-flight counter)
//! where the splice counts in one ([`SpliceAction::needs_data`]), a code block near the site
//! and the runtime slot its action needs, write the trampoline (an optional task guard, then
//! the body its kind of action makes: [`super::actions`]), seal it, and make the text patches
//! (site, springboard). Nothing built is visible to running code
//! until it is published ([`super::publish`]); a failure gives back everything this step took,
//! by one unwind ([`Held`]).

use component_manager::ComponentId;
use trapvec::predicate::TaskMatch;
use trapvec::slots::Slot;
use trapvec::target::{BlockKind, RepoBlock, Target, TargetExt, TextPatch};
use trapvec::TargetError;

use crate::analysis::analyze_function;
use crate::analysis::liveness::is_lean_leaf;
use crate::plan::Mechanism;
use crate::trampoline::{jmp_bytes, springboard_bytes, trap_bytes, GuardShape, TrampolineOptions};

use super::actions::{self, Body, BodyCx, SpliceAction};
use super::batch::BatchCache;
use super::plan::Planned;
use super::{LiveSplice, PlanSummary, SpliceError, SpliceId, SpliceRequest, Splicer};

/// Something a splice being built took from the target: given back, last taken first, if the
/// splice is never published.
enum Held {
    Block(RepoBlock),
    Slot(Slot),
}

/// What [`Splicer::fill`] made of a splice's blocks.
struct Filled {
    site_patch: TextPatch,
    springboard_patch: Option<TextPatch>,
    entry: u64,
    replay: Option<u64>,
    dispatch: Option<trapvec::target::DispatchEntry>,
    handler_range: Option<(u64, u64)>,
    inflight: Option<u64>,
    /// The displaced window's original bytes.
    displaced_bytes: Vec<u8>,
}

impl<T: Target> Splicer<T> {
    /// Build the repository side of every planned request (in the order of `requests`); on the
    /// first failure free everything built so far and return that failure.
    #[allow(
        clippy::vec_box,
        reason = "the boxes move into the live map as they are"
    )]
    pub(super) fn build_all(
        &mut self,
        requests: &[SpliceRequest],
        plans: Vec<Planned>,
        cache: &mut BatchCache,
    ) -> Result<Vec<Box<LiveSplice>>, SpliceError> {
        let mut built: Vec<Box<LiveSplice>> = Vec::with_capacity(plans.len());
        for (r, planned) in requests.iter().zip(plans) {
            match self.build(r, planned, cache) {
                Ok(s) => built.push(s),
                Err(e) => {
                    self.discard(&built);
                    return Err(e);
                }
            }
        }
        Ok(built)
    }

    /// Allocate and fill the repository side of one splice (nothing visible to running code
    /// yet); on failure give back what was taken.
    pub(super) fn build(
        &mut self,
        r: &SpliceRequest,
        planned: Planned,
        cache: &mut BatchCache,
    ) -> Result<Box<LiveSplice>, SpliceError> {
        let mut held = Vec::new();
        let built = self.build_holding(r, planned, cache, &mut held);
        if built.is_err() {
            self.give_back(held);
        }
        built
    }

    /// [`Splicer::build`], recording in `held` what it takes as it takes it.
    fn build_holding(
        &mut self,
        r: &SpliceRequest,
        mut planned: Planned,
        cache: &mut BatchCache,
        held: &mut Vec<Held>,
    ) -> Result<Box<LiveSplice>, SpliceError> {
        let action = actions::kind_of(r);
        let (dest_fn, component) = match r.action.symbol() {
            Some(name) => self.resolve_dest(&r.at, name)?,
            None => (0, None),
        };
        let terr = |e: TargetError| SpliceError::Target {
            at: r.at.clone(),
            source: e,
        };
        let site = planned.point.site;
        let data = match action.needs_data(planned.plan.mechanism, self.target.info()) {
            true => {
                let data = self.target.alloc(site, 16, BlockKind::Data).map_err(terr)?;
                held.push(Held::Block(data.clone()));
                Some(data)
            }
            false => None,
        };
        let code = self.alloc_code(action, r, &planned, data.as_ref(), held)?;
        // A return point's entry half, a keyed count: a call of the slot's routine.
        let slot = match action.slot(r, dest_fn) {
            Some(spec) => {
                let slot = self.target.alloc_slot(&spec).map_err(terr)?;
                held.push(Held::Slot(slot));
                log::debug!("{}: {} slot {}", r.at, action.name(), slot.index());
                Some(slot)
            }
            None => None,
        };
        let parts = Parts {
            action,
            code: &code,
            data: data.as_ref(),
            dest_fn,
            component,
            slot: slot.as_ref(),
        };
        let filled = self.fill(r, &mut planned, &parts, cache)?;
        self.next += 1;
        let mut live = Box::new(LiveSplice {
            id: SpliceId(self.next),
            request: r.clone(),
            plan: PlanSummary::of(&planned.plan, filled.displaced_bytes),
            point: planned.point,
            dest_fn,
            component,
            site_patch: filled.site_patch,
            springboard_patch: filled.springboard_patch,
            code,
            data,
            entry: filled.entry,
            replay: filled.replay,
            dispatch: filled.dispatch,
            handler_range: filled.handler_range,
            inflight: filled.inflight,
            ret: None,
            keyed: None,
        });
        live.set_slot(slot);
        Ok(live)
    }

    /// Allocate the code block of a splice: sized to its trampoline where
    /// [`compact_code_size`] can tell, else [`TRAMPOLINE_BLOCK`]. The size is measured at a
    /// trial address as near the site as the block will be: the data block's, or, for a splice
    /// without one, a block of one grain allocated first, which is the code block itself when
    /// the trampoline fits it (a count trap's replay mostly does) and is given back otherwise.
    fn alloc_code(
        &mut self,
        action: &dyn SpliceAction,
        r: &SpliceRequest,
        planned: &Planned,
        data: Option<&RepoBlock>,
        held: &mut Vec<Held>,
    ) -> Result<RepoBlock, SpliceError> {
        let site = planned.point.site;
        let terr = |e: TargetError| SpliceError::Target {
            at: r.at.clone(),
            source: e,
        };
        let size_at = |info: &trapvec::TargetInfo, trial: u64| {
            compact_code_size(action, r, planned, info, trial)
                .map(|size| size.unwrap_or(TRAMPOLINE_BLOCK))
                .map_err(|refusal| SpliceError::Refused {
                    at: r.at.clone(),
                    site,
                    mechanism: planned.plan.mechanism,
                    refusal,
                })
        };
        let probe = match data {
            Some(data) => {
                let size = size_at(self.target.info(), data.addr)?;
                let code = self
                    .target
                    .alloc(site, size, BlockKind::Code)
                    .map_err(terr)?;
                held.push(Held::Block(code.clone()));
                return Ok(code);
            }
            None => self
                .target
                .alloc(site, CODE_GRAIN, BlockKind::Code)
                .map_err(terr)?,
        };
        held.push(Held::Block(probe.clone()));
        let size = size_at(self.target.info(), probe.addr)?;
        if size <= probe.size {
            return Ok(probe);
        }
        let code = self
            .target
            .alloc(site, size, BlockKind::Code)
            .map_err(terr)?;
        held.push(Held::Block(code.clone()));
        // The probe, taken just before the block: give it back now, not with the splice.
        let probe = held.remove(held.len() - 2);
        self.give_back(vec![probe]);
        Ok(code)
    }

    /// Write the trampoline of one splice into its freshly allocated blocks and make its text
    /// patches (taking the site's bytes from `planned`); the caller gives the blocks back if
    /// this fails.
    fn fill(
        &mut self,
        r: &SpliceRequest,
        planned: &mut Planned,
        parts: &Parts<'_>,
        cache: &mut BatchCache,
    ) -> Result<Filled, SpliceError> {
        let site_text = planned.site_text.take();
        let Planned {
            point,
            plan,
            flags_dead,
            ..
        } = &*planned;
        let at = &r.at;
        let site = point.site;
        let (code, data) = (parts.code, parts.data);
        let terr = |e: TargetError| SpliceError::Target {
            at: at.clone(),
            source: e,
        };
        let refused = |refusal| SpliceError::Refused {
            at: at.clone(),
            site,
            mechanism: plan.mechanism,
            refusal,
        };
        if let Some(data) = data {
            self.target.write(data, 0, &[0u8; 16]).map_err(terr)?;
        }
        let info = self.target.info();
        let trap = plan.mechanism == Mechanism::Trap;
        // A task predicate: tested by the kernel's dispatcher for the traps it handles (a
        // non-matching trap goes to the replay), else by a guard in front of the trampoline.
        let only = &r.options.only;
        let in_dispatcher = trap && info.dispatcher_runs_handlers && info.dispatcher_counts_hits;
        let guard_test = match only.is_empty() || in_dispatcher {
            true => None,
            false => Some(self.target.predicate_test(only).map_err(terr)?),
        };
        let guard = guard_test.as_ref().map(|test| GuardShape {
            test,
            red_zone: info.red_zone,
            keep_flags: !*flags_dead,
        });
        let base = match &guard {
            Some(g) => code.addr + g.len(code.addr).map_err(refused)? as u64,
            None => code.addr,
        };
        let this = &*self;
        let mut options = |handler, component, flags_dead| {
            this.trampoline_options(site, flags_dead, handler, component, cache)
        };
        let mut cx = BodyCx {
            r,
            plan,
            info,
            code,
            data,
            base,
            dest_fn: parts.dest_fn,
            component: parts.component,
            slot: parts.slot,
            flags_dead: *flags_dead,
            replace_counter: this.target.replace_counter(code),
            trampoline_options: &mut options,
        };
        let Body {
            mut bytes,
            replay,
            mut dispatch,
            handler_range,
            inflight,
        } = parts.action.body(&mut cx).map_err(refused)?;
        if let Some(g) = &guard {
            let skip_at = base + bytes.len() as u64;
            let mut all = g.emit(code.addr, skip_at).map_err(refused)?;
            debug_assert_eq!(code.addr + all.len() as u64, base);
            all.append(&mut bytes);
            all.extend(g.emit_skip(plan, skip_at).map_err(refused)?);
            bytes = all;
            log::debug!(
                "{at}: guard for {only} in front of the trampoline, skip path at {skip_at:#x}"
            );
        }
        if let (false, Some(d)) = (only.is_empty() || guard.is_some(), dispatch.as_mut()) {
            let skip = replay.unwrap_or(d.dest);
            d.only = TaskMatch::of(only, skip).map_err(|reason| {
                terr(TargetError::Predicate {
                    predicate: only.to_string(),
                    reason,
                })
            })?;
            log::debug!("{at}: the dispatcher tests {only}; other tasks go to {skip:#x}");
        }
        if bytes.len() > code.size {
            let reason = "trampoline larger than its block".into();
            return Err(terr(TargetError::Block {
                addr: code.addr,
                offset: 0,
                len: bytes.len(),
                reason,
            }));
        }
        self.target.write(code, 0, &bytes).map_err(terr)?;
        self.target.seal(code).map_err(terr)?;
        // Every splice enters its code block at the start.
        let entry = code.addr;
        let site_new = match plan.mechanism {
            Mechanism::Trap => trap_bytes(self.target.info().trap_vector).to_vec(),
            Mechanism::Jmp => {
                jmp_bytes(plan, plan.springboard.as_ref().map_or(entry, |sb| sb.addr))
                    .map_err(refused)?
            }
        };
        // The bytes the planning analysed are the text's bytes: nothing writes text before the
        // batch ends (and the text writer checks them again).
        let window = plan.displaced_len.max(site_new.len());
        let displaced_bytes = match site_text.filter(|t| t.len() == window) {
            Some(text) => text,
            None => self.target.read(site, window).map_err(terr)?,
        };
        let old = displaced_bytes[..site_new.len()].to_vec();
        let springboard_patch = match &plan.springboard {
            Some(sb) => Some(TextPatch {
                addr: sb.addr,
                old: sb.old.clone(),
                new: springboard_bytes(sb, entry).map_err(refused)?.to_vec(),
            }),
            None => None,
        };
        Ok(Filled {
            site_patch: TextPatch {
                addr: site,
                old,
                new: site_new,
            },
            springboard_patch,
            entry,
            replay,
            dispatch,
            handler_range,
            inflight,
            displaced_bytes,
        })
    }

    /// What the call trampoline of a splice at `site` with handler `handler` may leave out: the
    /// `popfq` where the flags are dead at the site (`flags_dead`, from the planning), the vector
    /// saves and the in-flight counter where the handler is a lean leaf (then its range,
    /// returned, is scanned at removal).
    fn trampoline_options(
        &self,
        site: u64,
        flags_dead: bool,
        handler: u64,
        component: Option<ComponentId>,
        cache: &mut BatchCache,
    ) -> (TrampolineOptions, Option<(u64, u64)>) {
        let info = self.target.info();
        let lean = cache.lean_leaf(handler, || {
            let s = self
                .components
                .get(component?)?
                .symbols
                .iter()
                .find(|s| s.addr == handler && s.size > 0)?;
            let bytes = self
                .target
                .read(s.addr, usize::try_from(s.size).ok()?)
                .ok()?;
            let lean =
                analyze_function(&s.name, s.addr, &bytes).is_ok_and(|func| is_lean_leaf(&func));
            log::debug!(
                "handler {} at {handler:#x} {}",
                s.name,
                if lean {
                    "is a lean leaf"
                } else {
                    "needs the full frame"
                }
            );
            lean.then_some((s.addr, s.addr + s.size))
        });
        log::debug!(
            "trampoline for {site:#x}: flags {}",
            if flags_dead { "dead" } else { "live" }
        );
        let opts = TrampolineOptions {
            restore_flags: !flags_dead,
            save_vector_regs: info.save_vector_regs && lean.is_none(),
            count_inflight: lean.is_none(),
            // Full extended state where the CPU has XSAVE (read once, baked into the trampoline).
            xsave_size: if info.save_vector_regs {
                crate::trampoline::host_xsave_size()
            } else {
                None
            },
            // Kernel handlers run with RCU watching even in idle text (kmod/jmp_rcu.c).
            rcu_watch: crate::trampoline::RcuWatch::find(self.target.symbols()),
        };
        (opts, lean)
    }

    /// Free the repository side of splices that never became visible.
    pub(super) fn discard(&mut self, built: &[Box<LiveSplice>]) {
        for s in built {
            let mut held: Vec<Held> = s.data.iter().cloned().map(Held::Block).collect();
            held.push(Held::Block(s.code.clone()));
            held.extend(s.slot().map(Held::Slot));
            self.give_back(held);
        }
    }

    /// Give back what a splice that never became visible took, last taken first. Nothing has
    /// run it, so nothing waits; a failure to give something back leaves it taken (logged).
    fn give_back(&mut self, held: Vec<Held>) {
        for h in held.into_iter().rev() {
            let given = match &h {
                Held::Block(b) => self.target.free(b),
                Held::Slot(s) => self.target.free_slot(s),
            };
            if let Err(e) = given {
                log::debug!(
                    "giving back an unused block or slot: {}",
                    trapvec::error_chain(&e)
                );
            }
        }
    }
}

/// The code block of a splice whose trampoline is not sized in advance: room for the longest
/// (a call trampoline with the full extended-state save, a guard in front).
const TRAMPOLINE_BLOCK: usize = 512;

/// The code block a plain `count` splice (no task predicate) needs, rounded up to the arena's
/// 16-byte grain: its whole trampoline is the replay (where the dispatcher counts) or the
/// counting replay, emitted here once at a trial address to measure it. The trial address is
/// a block allocated first, as near the site as the code block will be ([`Splicer::alloc_code`]),
/// so every rel32 in it takes its 4-byte form as at the real address: the length does not change
/// when [`Splicer::fill`] emits it again there (and `fill` refuses a trampoline larger than its
/// block if it ever did). `None`: another kind of splice, sized [`TRAMPOLINE_BLOCK`].
///
/// Why it matters: 512 bytes per count splice held the module's 8 MiB code arena to 16,384
/// splices; a count site's replay is 16 or 32 bytes (issue 26, item 1).
fn compact_code_size(
    action: &dyn SpliceAction,
    r: &SpliceRequest,
    planned: &Planned,
    info: &trapvec::TargetInfo,
    trial: u64,
) -> Result<Option<usize>, crate::Refusal> {
    if action.name() != "count" || !r.options.only.is_empty() {
        return Ok(None);
    }
    let plan = &planned.plan;
    let len = match plan.mechanism == Mechanism::Trap && info.dispatcher_counts_hits {
        true => crate::trampoline::emit_replay(plan, trial)?.len(),
        false => crate::trampoline::emit_counting_replay(trial, trial, plan, info)?.len(),
    };
    Ok(Some(len.next_multiple_of(CODE_GRAIN)))
}

/// The allocation grain of the repositories (the kernel module's `TRAPVEC_ARENA_GRAIN`).
const CODE_GRAIN: usize = 16;

/// What [`Splicer::fill`] builds a splice from besides its request and plan.
struct Parts<'a> {
    action: &'static dyn SpliceAction,
    code: &'a RepoBlock,
    data: Option<&'a RepoBlock>,
    /// The handler or the replacement (0 for none) and its component.
    dest_fn: u64,
    component: Option<ComponentId>,
    slot: Option<&'a Slot>,
}

#[cfg(test)]
mod tests {
    use trapvec::fake::FakeKernel;

    use super::super::{Action, SpliceId, SpliceRequest, Splicer};
    use crate::plan::Mechanism;

    /// A fake kernel and a splicer holding a count trap at f1 and a count jmp at f2 (their ids).
    fn count_trap_and_jmp() -> (FakeKernel, Splicer<FakeKernel>, Vec<SpliceId>) {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        let ids = sp
            .apply(&[
                SpliceRequest::new("f1", Action::Count, Mechanism::Trap),
                SpliceRequest::new("f2", Action::Count, Mechanism::Jmp),
            ])
            .unwrap();
        (k, sp, ids)
    }

    /// A count splice's code block is its trampoline rounded to 16 bytes, not 512: 9 bytes of
    /// replay (push rbp; mov rbp,rsp; jmp) where the dispatcher counts, 25 of counting replay
    /// for a jmp (pushfq; lock inc; popfq; the replay).
    #[test]
    fn count_splices_take_code_blocks_sized_to_their_trampoline() {
        let (k, mut sp, ids) = count_trap_and_jmp();
        let sizes: Vec<usize> = ids.iter().map(|id| sp.live[id].code.size).collect();
        assert_eq!(sizes, [16, 32]);
        let trap = &sp.live[&ids[0]];
        assert_eq!(trap.entry, trap.code.addr);
        assert_eq!(
            k.text(trap.entry + 4, 1),
            [0xE9],
            "the jmp back fits the block"
        );
        sp.remove(&ids).unwrap();
        assert_eq!(k.live_blocks(), 0);
    }

    /// A count trap the dispatcher counts takes its code block only (no 16-byte data block,
    /// no arena record for one); a count jmp and a call trap keep theirs. Its hits are the
    /// dispatcher's, read live, after a save and restore of the state, and at removal, which
    /// gives every block back.
    #[test]
    fn a_count_trap_counted_by_the_dispatcher_takes_no_data_block() {
        let (k, sp, ids) = count_trap_and_jmp();
        let has_data: Vec<bool> = ids.iter().map(|id| sp.live[id].data.is_some()).collect();
        assert_eq!(has_data, [false, true]);
        assert_eq!(k.live_blocks(), 3, "trap: code; jmp: code and data");
        let site = sp.live[&ids[0]].point.site;
        k.state().hits.insert(site, 7);
        assert_eq!(sp.hits(ids[0]).unwrap().hits, 7);
        let mut again = Splicer::import_state(k.clone(), &sp.export_state()).unwrap();
        assert!(again.live[&ids[0]].data.is_none());
        assert_eq!(again.hits(ids[0]).unwrap().hits, 7);
        let hits = again.remove(&ids).unwrap();
        assert_eq!(hits[0].hits, 7);
        assert_eq!(k.live_blocks(), 0);
    }
}
