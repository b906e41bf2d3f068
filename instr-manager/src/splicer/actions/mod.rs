//! What a splice does at its point, one file per kind of action behind [`SpliceAction`] (as
//! [`crate::relocate`] has one file per kind of fix-up behind its `Fixup`):
//!
//! | kind | file | the request | needs |
//! |---|---|---|---|
//! | `call` | [`call`] | `action = call` | a handler run by the dispatcher, or the call trampoline |
//! | `replace` | [`replace`] | `action = replace` | the function's entry; the replace trampoline and its replay |
//! | `count` | [`count`] | `action = count` | the dispatcher's counter, or a counting replay |
//! | `count-by` | [`count_by`] | `action = count`, `by` | a keyed-count slot, called as a handler |
//! | `time` | [`time`] | `action = time` | the function's entry; a return slot with a clock |
//! | `return` | [`on_return`] | `when = return` | the function's entry; a return slot with the handler |
//!
//! Building a splice ([`super::build`]) asks its kind for the runtime slot it needs
//! ([`SpliceAction::slot`], see [`trapvec::slots`]) and for the body of its trampoline and its
//! dispatch entry ([`SpliceAction::body`]); everything around the body (the blocks, the task
//! guard, the text patches, and releasing what was taken when something fails) is the same for
//! every kind. Planning and removal ask it the few questions that differ by kind.
//!
//! A new action is a variant of [`crate::splice::Action`] with its flat form
//! ([`crate::splice`]), one file here, and one line in [`kind_of`].

use std::time::Duration;

use component_manager::ComponentId;
use trapvec::slots::{Slot, SlotSpec};
use trapvec::target::{DispatchEntry, ReplaceCounter, RepoBlock, TargetInfo};

use crate::plan::{Mechanism, Plan};
use crate::trampoline::{
    emit_call_trampoline_with, emit_replay, CallTrampoline, TrampolineOptions,
};
use crate::Refusal;

use super::{Action, LiveSplice, SpliceRequest};

mod call;
mod count;
mod count_by;
mod on_return;
mod replace;
mod time;

/// The kind of action of `r`: the list of kinds.
pub(super) fn kind_of(r: &SpliceRequest) -> &'static dyn SpliceAction {
    match (&r.action, r.at_return(), r.options.by) {
        (Action::Time { .. }, _, _) => &time::Time,
        (_, true, _) => &on_return::OnReturn,
        (Action::Call { .. }, false, _) => &call::Call,
        (Action::Replace { .. }, false, _) => &replace::Replace,
        (Action::Count, false, Some(_)) => &count_by::CountBy,
        (Action::Count, false, None) => &count::Count,
    }
}

/// What a kind of action needs from planning, building and removal.
pub(super) trait SpliceAction: Sync {
    /// The kind's name (`call`, `replace`, `count`, `count-by`, `time`, `return`).
    fn name(&self) -> &'static str;

    /// Whether the point must be its function's entry.
    fn needs_entry(&self) -> bool {
        false
    }

    /// Whether the splice takes its function over: its replay is what the function's original
    /// trampoline ([`super::orig`]) calls while it lives.
    fn replaces_function(&self) -> bool {
        false
    }

    /// Whether planning finds out if the status flags are dead at the site (the call
    /// trampoline then leaves out its `popfq`, and a task guard need not keep them).
    fn asks_flags(&self, _r: &SpliceRequest) -> bool {
        false
    }

    /// The runtime slot the splice needs ([`trapvec::slots`]); `dest_fn` is its handler's
    /// address (0 without one). The splice is then a call of the slot's routine.
    fn slot(&self, _r: &SpliceRequest, _dest_fn: u64) -> Option<SlotSpec> {
        None
    }

    /// Whether the splice needs a data block (a hit counter and an in-flight counter its
    /// trampoline counts in) with `mechanism` on a target that `info` describes. A splice that
    /// needs none takes no 16-byte block and no arena record for it (issue 26, item 1).
    fn needs_data(&self, _mechanism: Mechanism, _info: &TargetInfo) -> bool {
        true
    }

    /// The body of the trampoline (at [`BodyCx::base`]) and the dispatch entry of a trap.
    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal>;

    /// Why a removal still waits for `s` after `waited`, `inside` being its in-flight count.
    fn still_inside(&self, s: &LiveSplice, inside: u64, waited: Duration) -> String {
        let _ = inside;
        format!(
            "a thread is still inside the handler of {} (trampoline block at {:#x}) after {waited:?}",
            s.request.at, s.code.addr
        )
    }
}

/// What the body of one splice's trampoline is made from.
pub(super) struct BodyCx<'a> {
    pub(super) r: &'a SpliceRequest,
    pub(super) plan: &'a Plan,
    pub(super) info: &'a TargetInfo,
    pub(super) code: &'a RepoBlock,
    /// Hit counter, then in-flight counter (allocated unless [`SpliceAction::needs_data`]
    /// said no).
    pub(super) data: Option<&'a RepoBlock>,
    /// Where the body begins: the code block's start, or past the task guard in front of it.
    pub(super) base: u64,
    /// The handler or the replacement (0 for none) and its component.
    pub(super) dest_fn: u64,
    pub(super) component: Option<ComponentId>,
    /// The slot [`SpliceAction::slot`] asked for.
    pub(super) slot: Option<&'a Slot>,
    /// Whether the status flags are dead at the site (asked for by [`SpliceAction::asks_flags`]).
    pub(super) flags_dead: bool,
    /// The target's in-flight counter of a `replace` trampoline in `code`, where it keeps one.
    pub(super) replace_counter: Option<ReplaceCounter>,
    /// What the call trampoline of handler `h` (of `component`) may leave out, given whether
    /// the flags are dead, and the handler's range when it is a lean leaf.
    #[allow(clippy::type_complexity, reason = "one callback, named by its field")]
    pub(super) trampoline_options: &'a mut dyn FnMut(
        u64,
        Option<ComponentId>,
        bool,
    )
        -> (TrampolineOptions, Option<(u64, u64)>),
}

impl BodyCx<'_> {
    fn trap(&self) -> bool {
        self.plan.mechanism == Mechanism::Trap
    }

    fn site(&self) -> u64 {
        self.plan.site
    }

    /// A trap's dispatch entry into the code block, with nothing for the dispatcher to run.
    fn enter_code(&self) -> Option<DispatchEntry> {
        self.trap().then_some(DispatchEntry {
            site: self.site(),
            dest: self.code.addr,
            handler: 0,
            cookie: 0,
            only: None,
        })
    }

    /// The data block's address: its hit counter, then its in-flight counter (the kinds and
    /// mechanisms that [`SpliceAction::needs_data`] says yes to count in it).
    fn data_addr(&self) -> u64 {
        self.data.expect("the kind asked for a data block").addr
    }

    /// The slot's routine and cookie (the kinds that ask for a slot call it).
    fn slot_call(&self) -> (u64, u64) {
        let slot = self.slot.expect("the kind asked for a slot");
        (slot.entry(), slot.cookie())
    }
}

/// What [`SpliceAction::body`] made.
#[derive(Default)]
pub(super) struct Body {
    pub(super) bytes: Vec<u8>,
    /// The replay (displaced instructions, then back), where the body has one of its own.
    pub(super) replay: Option<u64>,
    pub(super) dispatch: Option<DispatchEntry>,
    /// The handler's code, when it is a lean leaf (scanned for threads at removal).
    pub(super) handler_range: Option<(u64, u64)>,
    /// The target's in-flight counter the body counts in.
    pub(super) inflight: Option<u64>,
}

/// Only the replay, entered by the trap's dispatch entry, which runs `handler` (0: none) with
/// `cookie` first: the dispatcher counts the hit (and runs the handler) itself.
fn dispatcher_body(cx: &BodyCx<'_>, handler: u64, cookie: u64) -> Result<Body, Refusal> {
    Ok(Body {
        bytes: emit_replay(cx.plan, cx.base)?,
        replay: Some(cx.base),
        dispatch: Some(DispatchEntry {
            site: cx.site(),
            dest: cx.base,
            handler,
            cookie,
            only: None,
        }),
        ..Body::default()
    })
}

/// A call of `handler(regs, cookie)`: by the dispatcher where it runs handlers (a trap), else
/// by the call trampoline, which may leave out the `popfq` where `flags_dead`.
fn call_body(
    cx: &mut BodyCx<'_>,
    handler: u64,
    cookie: u64,
    component: Option<ComponentId>,
    flags_dead: bool,
) -> Result<Body, Refusal> {
    if cx.trap() && cx.info.dispatcher_runs_handlers {
        return dispatcher_body(cx, handler, cookie);
    }
    let t = CallTrampoline {
        addr: cx.base,
        site: cx.site(),
        handler,
        cookie,
        hits: cx.data_addr(),
        inflight: cx.data_addr() + 8,
    };
    let (opts, lean) = (cx.trampoline_options)(handler, component, flags_dead);
    Ok(Body {
        bytes: emit_call_trampoline_with(&t, cx.plan, cx.info, &opts)?,
        dispatch: cx.enter_code(),
        handler_range: lean,
        ..Body::default()
    })
}
