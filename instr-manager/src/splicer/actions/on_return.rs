//! `when = return`: the action runs when the function returns ([`trapvec::returns`]). The
//! splice at the entry is the entry half, a call of the target's entry routine with its return
//! slot, which holds the handler (`call`) or nothing (`count`).

use trapvec::returns::{ReturnConfig, DEFAULT_MAXACTIVE};
use trapvec::slots::SlotSpec;

use super::{call_body, Body, BodyCx, SpliceAction};
use crate::splice::Action;
use crate::splicer::SpliceRequest;
use crate::Refusal;

pub(super) struct OnReturn;

impl SpliceAction for OnReturn {
    fn name(&self) -> &'static str {
        "return"
    }

    /// The entry half takes the return address from the top of the stack.
    fn needs_entry(&self) -> bool {
        true
    }

    /// Asked as for `call` at the entry, for the task guard (the entry half's trampoline
    /// always restores them).
    fn asks_flags(&self, r: &SpliceRequest) -> bool {
        matches!(r.action, Action::Call { .. })
    }

    fn slot(&self, r: &SpliceRequest, dest_fn: u64) -> Option<SlotSpec> {
        Some(SlotSpec::Return(ReturnConfig {
            handler: dest_fn,
            cookie: match r.action {
                Action::Call { cookie, .. } => cookie,
                _ => 0,
            },
            maxactive: r.options.maxactive.unwrap_or(DEFAULT_MAXACTIVE),
            clock: None,
        }))
    }

    fn body(&self, cx: &mut BodyCx<'_>) -> Result<Body, Refusal> {
        let (entry, cookie) = cx.slot_call();
        call_body(cx, entry, cookie, None, false)
    }
}
