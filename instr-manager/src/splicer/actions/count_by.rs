//! `count` with `by`: the hits counted by who made them ([`trapvec::keyed`]), as a call of the
//! target's counting routine with its keyed-count slot.

use trapvec::slots::SlotSpec;

use super::{call_body, Body, BodyCx, SpliceAction};
use crate::splicer::SpliceRequest;
use crate::Refusal;

pub(super) struct CountBy;

impl SpliceAction for CountBy {
    fn name(&self) -> &'static str {
        "count-by"
    }

    fn slot(&self, r: &SpliceRequest, _dest_fn: u64) -> Option<SlotSpec> {
        r.options.by.map(SlotSpec::Keyed)
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        let (entry, cookie) = cx.slot_call();
        // The target's routine, never a lean leaf of a component.
        call_body(cx, entry, cookie, None, false)
    }
}
