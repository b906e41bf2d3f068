//! `time`: each call from its entry to its return into a log2 histogram, a return point
//! ([`super::on_return`]) whose slot reads a clock and runs no handler.

use trapvec::returns::{ReturnConfig, DEFAULT_MAXACTIVE};
use trapvec::slots::SlotSpec;

use super::{call_body, Body, BodyCx, SpliceAction};
use crate::splice::Action;
use crate::splicer::SpliceRequest;
use crate::Refusal;

pub(super) struct Time;

impl SpliceAction for Time {
    fn name(&self) -> &'static str {
        "time"
    }

    fn needs_entry(&self) -> bool {
        true
    }

    fn slot(&self, r: &SpliceRequest, dest_fn: u64) -> Option<SlotSpec> {
        let Action::Time { clock } = r.action else {
            unreachable!("kind_of gives `time` only timers")
        };
        Some(SlotSpec::Return(ReturnConfig {
            handler: dest_fn,
            cookie: 0,
            maxactive: r.options.maxactive.unwrap_or(DEFAULT_MAXACTIVE),
            clock: Some(clock),
        }))
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        let (entry, cookie) = cx.slot_call();
        call_body(cx, entry, cookie, None, false)
    }
}
