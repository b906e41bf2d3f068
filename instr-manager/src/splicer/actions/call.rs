//! `call H`: run handler `H(regs, cookie)` at the point (kprobe's pre-handler), then the
//! displaced instructions.

use super::{call_body, Body, BodyCx, SpliceAction};
use crate::splice::Action;
use crate::splicer::SpliceRequest;
use crate::Refusal;

pub(super) struct Call;

impl SpliceAction for Call {
    fn name(&self) -> &'static str {
        "call"
    }

    fn asks_flags(&self, _r: &SpliceRequest) -> bool {
        true
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        let Action::Call { cookie, .. } = cx.r.action else {
            unreachable!("kind_of gives `call` only calls")
        };
        call_body(cx, cx.dest_fn, cookie, cx.component, cx.flags_dead)
    }
}
