//! Step 2 of a splice's life, building: allocate a data block (hit counter, in-flight counter)
//! and a code block near the site, generate the trampoline ([`crate::trampoline`]: the call
//! trampoline, the counting or bare replay, or the replace trampoline and its replay), write and
//! seal it, and make the text patches (site, springboard). Nothing built is visible to running
//! code until it is published ([`super::publish`]); a failure frees what this step allocated.

use component_manager::ComponentId;
use trapvec::keyed::KeySlot;
use trapvec::predicate::TaskMatch;
use trapvec::returns::{ReturnConfig, ReturnSlot, DEFAULT_MAXACTIVE};
use trapvec::target::{BlockKind, DispatchEntry, RepoBlock, Target, TextPatch};
use trapvec::TargetError;

use crate::analysis::analyze_function;
use crate::analysis::liveness::is_lean_leaf;
use crate::plan::Mechanism;
use crate::trampoline::{
    emit_call_trampoline_with, emit_counting_replay, emit_replace_trampoline, emit_replay,
    jmp_bytes, springboard_bytes, trap_bytes, CallTrampoline, GuardShape, ReplaceTrampoline,
    TrampolineOptions, REPLACE_STACK_WORDS,
};

use super::batch::BatchCache;
use super::plan::Planned;
use super::{Action, LiveSplice, PlanSummary, SpliceError, SpliceId, SpliceRequest, Splicer};

/// The repository side of a splice being built: its blocks and where its action goes.
struct Blocks {
    code: RepoBlock,
    data: RepoBlock,
    /// Handler or replacement address (0 for a count).
    dest_fn: u64,
    component: Option<ComponentId>,
    /// A return point's slot.
    ret: Option<ReturnSlot>,
    /// A keyed count's slot.
    keyed: Option<KeySlot>,
}

/// What [`Splicer::fill`] made of a splice's blocks.
struct Filled {
    site_patch: TextPatch,
    springboard_patch: Option<TextPatch>,
    entry: u64,
    replay: Option<u64>,
    dispatch: Option<DispatchEntry>,
    handler_range: Option<(u64, u64)>,
    inflight: Option<u64>,
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

    /// Allocate and fill the repository side of one splice (nothing visible to running code yet).
    pub(super) fn build(
        &mut self,
        r: &SpliceRequest,
        mut planned: Planned,
        cache: &mut BatchCache,
    ) -> Result<Box<LiveSplice>, SpliceError> {
        let (dest_fn, component) = match r.action.symbol() {
            Some(name) => self.resolve_dest(&r.at, name)?,
            None => (0, None),
        };
        let terr = |e: TargetError| SpliceError::Target {
            at: r.at.clone(),
            source: e,
        };
        let site = planned.point.site;
        let data = self.target.alloc(site, 16, BlockKind::Data).map_err(terr)?;
        let code = match self.target.alloc(site, 512, BlockKind::Code) {
            Ok(c) => c,
            Err(e) => {
                let _ = self.target.free(&data);
                return Err(terr(e));
            }
        };
        // A return point's entry half is a call of the target's entry routine with its slot.
        let ret = match r.at_return() {
            true => {
                let cfg = ReturnConfig {
                    handler: dest_fn,
                    cookie: match r.action {
                        Action::Call { cookie, .. } => cookie,
                        _ => 0,
                    },
                    maxactive: r.options.maxactive.unwrap_or(DEFAULT_MAXACTIVE),
                    clock: match r.action {
                        Action::Time { clock } => Some(clock),
                        _ => None,
                    },
                };
                match self.target.return_slot(&cfg) {
                    Ok(slot) => Some(slot),
                    Err(e) => {
                        let _ = self.target.free(&code);
                        let _ = self.target.free(&data);
                        return Err(terr(e));
                    }
                }
            }
            false => None,
        };
        // A keyed count is a call of the target's counting routine with its slot.
        let keyed = match r.options.by {
            Some(by) => match self.target.key_slot(by) {
                Ok(slot) => Some(slot),
                Err(e) => {
                    self.free_blocks(&code, &data, ret.as_ref());
                    return Err(terr(e));
                }
            },
            None => None,
        };
        let blocks = Blocks {
            code,
            data,
            dest_fn,
            component,
            ret,
            keyed,
        };
        let filled = match self.fill(r, &mut planned, &blocks, cache) {
            Ok(f) => f,
            Err(e) => {
                self.free_blocks(&blocks.code, &blocks.data, blocks.ret.as_ref());
                if let Some(slot) = &blocks.keyed {
                    let _ = self.target.free_key_slot(slot);
                }
                return Err(e);
            }
        };
        self.next += 1;
        Ok(Box::new(LiveSplice {
            id: SpliceId(self.next),
            request: r.clone(),
            plan: PlanSummary::of(&planned.plan),
            point: planned.point,
            dest_fn,
            component,
            site_patch: filled.site_patch,
            springboard_patch: filled.springboard_patch,
            code: blocks.code,
            data: blocks.data,
            entry: filled.entry,
            replay: filled.replay,
            dispatch: filled.dispatch,
            handler_range: filled.handler_range,
            inflight: filled.inflight,
            ret: blocks.ret,
            keyed: blocks.keyed,
        }))
    }

    /// Write the trampoline of one splice into its freshly allocated blocks and make its text
    /// patches (taking the site's bytes from `planned`); the caller frees the blocks if this fails.
    fn fill(
        &mut self,
        r: &SpliceRequest,
        planned: &mut Planned,
        blocks: &Blocks,
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
        let (code, data, dest_fn) = (&blocks.code, &blocks.data, blocks.dest_fn);
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
        self.target.write(data, 0, &[0u8; 16]).map_err(terr)?;
        let info = self.target.info();
        let trap = plan.mechanism == Mechanism::Trap;
        let mut handler_range = None;
        let mut inflight = None;
        // What the call at the site runs: the action's handler, or a return point's entry half
        // (the target's routine, never a lean leaf of a component).
        let (action, call_fn, call_component) = match (&blocks.ret, &blocks.keyed, &r.action) {
            (Some(slot), _, _) => (
                Action::Call {
                    handler: String::new(),
                    cookie: slot.cookie,
                },
                slot.entry,
                None,
            ),
            (None, Some(slot), _) => (
                Action::Call {
                    handler: String::new(),
                    cookie: slot.cookie,
                },
                slot.entry,
                None,
            ),
            (None, None, a) => (a.clone(), dest_fn, blocks.component),
        };
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
        let (mut bytes, replay, mut dispatch) = match &action {
            Action::Call { cookie, .. } if trap && info.dispatcher_runs_handlers => {
                let replay = emit_replay(plan, base).map_err(refused)?;
                let d = DispatchEntry {
                    site,
                    dest: base,
                    handler: call_fn,
                    cookie: *cookie,
                    only: None,
                };
                (replay, Some(base), Some(d))
            }
            Action::Call { cookie, .. } => {
                let t = CallTrampoline {
                    addr: base,
                    site,
                    handler: call_fn,
                    cookie: *cookie,
                    hits: data.addr,
                    inflight: data.addr + 8,
                };
                let (opts, lean) = self.trampoline_options(
                    point.site,
                    *flags_dead && blocks.ret.is_none(),
                    call_fn,
                    call_component,
                    cache,
                );
                handler_range = lean;
                let bytes = emit_call_trampoline_with(&t, plan, info, &opts).map_err(refused)?;
                (
                    bytes,
                    None,
                    trap.then_some(DispatchEntry {
                        site,
                        dest: code.addr,
                        handler: 0,
                        cookie: 0,
                        only: None,
                    }),
                )
            }
            Action::Count if trap && info.dispatcher_counts_hits => {
                let replay = emit_replay(plan, base).map_err(refused)?;
                (
                    replay,
                    Some(base),
                    Some(DispatchEntry {
                        site,
                        dest: base,
                        handler: 0,
                        cookie: 0,
                        only: None,
                    }),
                )
            }
            Action::Count => {
                let bytes = emit_counting_replay(base, data.addr, plan, info).map_err(refused)?;
                (
                    bytes,
                    None,
                    trap.then_some(DispatchEntry {
                        site,
                        dest: code.addr,
                        handler: 0,
                        cookie: 0,
                        only: None,
                    }),
                )
            }
            Action::Time { .. } => {
                unreachable!("a timer is a return point: its site runs the entry half")
            }
            Action::Replace { .. } => {
                // The replacement may sleep: count the tasks inside it (see REPLACE_STACK_WORDS
                // for the arguments), in the target's counter where it keeps one.
                let owned = self.target.replace_counter(code);
                inflight = owned.map(|c| c.counter);
                let t = ReplaceTrampoline {
                    addr: base,
                    hits: data.addr,
                    inflight: owned.map_or(data.addr + 8, |c| c.counter),
                    dest: dest_fn,
                    exit: owned.map(|c| c.exit),
                };
                let mut bytes =
                    emit_replace_trampoline(&t, REPLACE_STACK_WORDS).map_err(refused)?;
                bytes.resize(bytes.len().next_multiple_of(16), 0xCC);
                let replay_at = base + bytes.len() as u64;
                bytes.extend(emit_replay(plan, replay_at).map_err(refused)?);
                (
                    bytes,
                    Some(replay_at),
                    trap.then_some(DispatchEntry {
                        site,
                        dest: code.addr,
                        handler: 0,
                        cookie: 0,
                        only: None,
                    }),
                )
            }
        };
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
        let old = match site_text.filter(|t| t.len() == site_new.len()) {
            Some(old) => old,
            None => self.target.read(site, site_new.len()).map_err(terr)?,
        };
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
            self.free_blocks(&s.code, &s.data, s.ret.as_ref());
            if let Some(slot) = &s.keyed {
                let _ = self.target.free_key_slot(slot);
            }
        }
    }

    /// Free a splice's blocks and return slot, none of which running code has seen.
    fn free_blocks(&mut self, code: &RepoBlock, data: &RepoBlock, ret: Option<&ReturnSlot>) {
        let _ = self.target.free(code);
        let _ = self.target.free(data);
        if let Some(slot) = ret {
            let _ = self.target.free_return_slot(slot);
        }
    }
}
