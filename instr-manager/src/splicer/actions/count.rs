//! `count`: count the hits and run nothing. A kernel trap is a dispatch entry without a
//! handler (the dispatcher counts) whose destination is the replay; elsewhere a counting replay
//! (KAPI's `count_func`).

use super::{dispatcher_body, Body, BodyCx, SpliceAction};
use crate::trampoline::emit_counting_replay;
use crate::Refusal;

pub(super) struct Count;

impl SpliceAction for Count {
    fn name(&self) -> &'static str {
        "count"
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        if cx.trap() && cx.info.dispatcher_counts_hits {
            return dispatcher_body(cx, 0, 0);
        }
        Ok(Body {
            bytes: emit_counting_replay(cx.base, cx.data.addr, cx.plan, cx.info)?,
            dispatch: cx.enter_code(),
            ..Body::default()
        })
    }
}
