//! `count`: count the hits and run nothing. A kernel trap is a dispatch entry without a
//! handler (the dispatcher counts) whose destination is the replay; elsewhere a counting replay
//! (KAPI's `count_func`).

use trapvec::target::TargetInfo;

use super::{dispatcher_body, Body, BodyCx, SpliceAction};
use crate::plan::Mechanism;
use crate::trampoline::emit_counting_replay;
use crate::Refusal;

pub(super) struct Count;

impl SpliceAction for Count {
    fn name(&self) -> &'static str {
        "count"
    }

    /// A trap whose hits the dispatcher counts (in its entry's per-CPU counters) counts in
    /// nothing of its own: no data block.
    fn needs_data(&self, mechanism: Mechanism, info: &TargetInfo) -> bool {
        !(mechanism == Mechanism::Trap && info.dispatcher_counts_hits)
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        if !self.needs_data(cx.plan.mechanism, cx.info) {
            return dispatcher_body(cx, 0, 0);
        }
        Ok(Body {
            bytes: emit_counting_replay(cx.base, cx.data_addr(), cx.plan, cx.info)?,
            dispatch: cx.enter_code(),
            ..Body::default()
        })
    }
}
