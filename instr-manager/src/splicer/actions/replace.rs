//! `replace F` (at a function's entry): go to `F` instead. The original stays callable through
//! its original trampoline ([`crate::splicer::orig`]), which calls this splice's replay.

use std::time::Duration;

use super::{Body, BodyCx, SpliceAction};
use crate::splice::Action;
use crate::splicer::LiveSplice;
use crate::trampoline::{
    emit_replace_trampoline, emit_replay, ReplaceTrampoline, REPLACE_STACK_WORDS,
};
use crate::Refusal;

pub(super) struct Replace;

impl SpliceAction for Replace {
    fn name(&self) -> &'static str {
        "replace"
    }

    /// The replacement takes over the whole call.
    fn needs_entry(&self) -> bool {
        true
    }

    fn replaces_function(&self) -> bool {
        true
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        // The replacement may sleep: count the tasks inside it (see REPLACE_STACK_WORDS for
        // the arguments), in the target's counter where it keeps one.
        let owned = cx.replace_counter;
        let t = ReplaceTrampoline {
            addr: cx.base,
            hits: cx.data_addr(),
            inflight: owned.map_or(cx.data_addr() + 8, |c| c.counter),
            dest: cx.dest_fn,
            exit: owned.map(|c| c.exit),
        };
        let mut bytes = emit_replace_trampoline(&t, REPLACE_STACK_WORDS)?;
        bytes.resize(bytes.len().next_multiple_of(16), 0xCC);
        let replay_at = cx.base + bytes.len() as u64;
        bytes.extend(emit_replay(cx.plan, replay_at)?);
        Ok(Body {
            bytes,
            replay: Some(replay_at),
            dispatch: cx.enter_code(),
            handler_range: None,
            inflight: owned.map(|c| c.counter),
        })
    }

    fn still_inside(&self, s: &LiveSplice, inside: u64, waited: Duration) -> String {
        let Action::Replace { with } = &s.request.action else {
            unreachable!("kind_of gives `replace` only replacements")
        };
        format!(
            "{inside} task(s) still inside the replacement {with} of {} (trampoline block at {:#x}) after {waited:?}",
            s.point.function.name, s.code.addr
        )
    }
}
