//! Runtime slots: the one way a splice asks its target for state that lives beside the code
//! (the types of the [`crate::Target`] contract). A slot has a kind ([`SlotSpec`] asks for
//! one, [`Slot`] is the handle the target gives back, [`SlotReading`] is what reading it
//! returns); every kind is used the same way:
//!
//! 1. [`crate::Target::alloc_slot`] before the splice is built: the splice becomes a call of
//!    the slot's [`Slot::entry`] routine with its [`Slot::cookie`];
//! 2. [`crate::Target::read_slot`] while it lives (reports);
//! 3. [`crate::Target::free_slot`] once its splice is quiescent.
//!
//! The kinds today: a return point's instance pool ([`crate::returns`]) and a keyed count's
//! table ([`crate::keyed`]). A new kind (the maps compiled snippets will need) is a variant in
//! each of the three enums below and an arm in each backend's three methods.

use crate::keyed::{KeyBy, KeyCounts, KeySlot};
use crate::returns::{ReturnConfig, ReturnSlot, ReturnStats};

/// What a new slot is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotSpec {
    /// A return point or a timer: its instance pool and counters.
    Return(ReturnConfig),
    /// A keyed count: its table.
    Keyed(KeyBy),
}

impl SlotSpec {
    /// What this kind of slot serves, as a refusal names it ("keyed counts are not supported
    /// on ...").
    pub fn what(&self) -> &'static str {
        match self {
            SlotSpec::Return(_) => "return points and timers",
            SlotSpec::Keyed(_) => "keyed counts",
        }
    }
}

/// A slot in a target's runtime, owned by one splice until freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum Slot {
    Return(ReturnSlot),
    Keyed(KeySlot),
}

impl Slot {
    /// The slot's index in its kind's table.
    pub fn index(&self) -> u32 {
        match self {
            Slot::Return(s) => s.index,
            Slot::Keyed(s) => s.index,
        }
    }

    /// The routine the splice calls (its handler).
    pub fn entry(&self) -> u64 {
        match self {
            Slot::Return(s) => s.entry,
            Slot::Keyed(s) => s.entry,
        }
    }

    /// The cookie the splice calls [`Slot::entry`] with.
    pub fn cookie(&self) -> u64 {
        match self {
            Slot::Return(s) => s.cookie,
            Slot::Keyed(s) => s.cookie,
        }
    }

    /// The return point's slot, if this is one.
    pub fn as_return(&self) -> Option<&ReturnSlot> {
        match self {
            Slot::Return(s) => Some(s),
            _ => None,
        }
    }

    /// The keyed count's slot, if this is one.
    pub fn as_keyed(&self) -> Option<&KeySlot> {
        match self {
            Slot::Keyed(s) => Some(s),
            _ => None,
        }
    }
}

/// What a live slot holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotReading {
    Return(ReturnStats),
    Keyed(KeyCounts),
}

impl SlotReading {
    /// A return point's figures, if that is what was read.
    pub fn into_return_stats(self) -> Option<ReturnStats> {
        match self {
            SlotReading::Return(s) => Some(s),
            _ => None,
        }
    }

    /// A keyed count's table, if that is what was read.
    pub fn into_key_counts(self) -> Option<KeyCounts> {
        match self {
            SlotReading::Keyed(k) => Some(k),
            _ => None,
        }
    }
}
