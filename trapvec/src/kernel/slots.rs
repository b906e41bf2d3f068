//! The module's runtime slots ([`crate::slots`]): return points (`kmod/returns.c`: RETURN_ADD,
//! RETURN_REMOVE, RETURN_STATS) and keyed counts (`kmod/keyed.c`: KEY_ADD, KEY_REMOVE,
//! KEY_STATS), which [`KernelTarget`]'s `alloc_slot`, `free_slot` and `read_slot` dispatch to.

use super::*;

impl KernelTarget {
    /// RETURN_ADD: a slot of the module's return runtime (`kmod/returns.c`); the entry half is
    /// a call of the module's entry routine with the slot's cookie.
    pub(super) fn return_add(
        &mut self,
        cfg: &crate::returns::ReturnConfig,
    ) -> Result<crate::returns::ReturnSlot, TargetError> {
        let mut arg = TrapvecReturnAdd {
            handler: cfg.handler,
            cookie: cfg.cookie,
            maxactive: cfg.maxactive,
            clock: match cfg.clock {
                None => TRAPVEC_CLOCK_NONE,
                Some(crate::returns::Clock::Wall) => TRAPVEC_CLOCK_WALL,
                Some(crate::returns::Clock::Cpu) => TRAPVEC_CLOCK_CPU,
            },
            ..Default::default()
        };
        let what = || format!("with handler {:#x}", cfg.handler);
        self.call(Request::ReturnAdd(&mut arg))
            .map_err(|errno| TargetError::ReturnPoint {
                what: what(),
                reason: match errno {
                    Errno::ENOSPC => format!(
                        "all {TRAPVEC_RETURN_SLOTS} return-point slots of trapvec.ko are in use"
                    ),
                    Errno::EINVAL => format!(
                        "maxactive {} is outside 1..={TRAPVEC_RETURN_INSTANCES}",
                        cfg.maxactive
                    ),
                    Errno::EFAULT => format!(
                        "the handler {:#x} is not in a sealed code block of the arena",
                        cfg.handler
                    ),
                    Errno::ENOTTY => {
                        "trapvec.ko has no RETURN_ADD (an older module): rebuild it from this tree"
                            .into()
                    }
                    e => format!("RETURN_ADD: {e}"),
                },
            })?;
        log::debug!(
            "return slot {} (generation {}): entry {:#x}",
            arg.slot,
            arg.generation,
            arg.entry
        );
        Ok(crate::returns::ReturnSlot {
            index: arg.slot,
            entry: arg.entry,
            cookie: arg.entry_cookie,
        })
    }

    /// RETURN_REMOVE: waits in the module (bounded) for CPUs in the slot's return half.
    pub(super) fn return_remove(
        &mut self,
        slot: &crate::returns::ReturnSlot,
    ) -> Result<(), TargetError> {
        let mut arg = TrapvecReturnRemove {
            slot: slot.index,
            generation: (slot.cookie >> 32) as u32,
            busy: 0,
        };
        match self.call(Request::ReturnRemove(&mut arg)) {
            Ok(()) => Ok(()),
            // Already given back (a retry after a failure that did go through).
            Err(Errno::ENOENT) => Ok(()),
            Err(Errno::EBUSY) => Err(TargetError::Quiesce(format!(
                "{} CPU(s) still in the return handler of return-point slot {}; try again",
                arg.busy, slot.index
            ))),
            Err(e) => Err(TargetError::ReturnPoint {
                what: format!("slot {}", slot.index),
                reason: format!("RETURN_REMOVE: {e}"),
            }),
        }
    }

    pub(super) fn return_stats(
        &self,
        slot: &crate::returns::ReturnSlot,
    ) -> Option<crate::returns::ReturnStats> {
        let mut arg = TrapvecReturnStats {
            slot: slot.index,
            generation: (slot.cookie >> 32) as u32,
            ..Default::default()
        };
        match self.call(Request::ReturnStats(&mut arg)) {
            Ok(()) => Some(return_stats_of(&arg)),
            Err(Errno::ENOENT) => None,
            Err(e) => {
                log::warn!(
                    "RETURN_STATS of slot {}: {}",
                    slot.index,
                    crate::error_chain(&e)
                );
                None
            }
        }
    }

    /// KEY_ADD: a slot of the module's keyed counts (`kmod/keyed.c`); the splice is a call of
    /// the module's counting routine with the slot's cookie. `tid` counts by `current->pid` (the
    /// kernel's thread id), `pid` by `current->tgid` (the process).
    pub(super) fn key_add(
        &mut self,
        by: crate::keyed::KeyBy,
    ) -> Result<crate::keyed::KeySlot, TargetError> {
        let mut arg = TrapvecKeyAdd {
            by: key_code(by),
            ..Default::default()
        };
        self.call(Request::KeyAdd(&mut arg))
            .map_err(|errno| TargetError::KeyedCount {
                what: format!("by {}", by.name()),
                reason: match errno {
                    Errno::ENOSPC => format!(
                        "all {TRAPVEC_KEY_SLOTS} keyed-count slots of trapvec.ko are in use"
                    ),
                    Errno::EINVAL => format!(
                        "trapvec.ko does not count by {} (key code {})",
                        by.name(),
                        arg.by
                    ),
                    Errno::ENOTTY => {
                        "trapvec.ko has no KEY_ADD (an older module): rebuild it from this tree"
                            .into()
                    }
                    e => format!("KEY_ADD: {e}"),
                },
            })?;
        log::debug!(
            "key slot {} (generation {}) by {}: entry {:#x}",
            arg.slot,
            arg.generation,
            by.name(),
            arg.entry
        );
        Ok(crate::keyed::KeySlot {
            index: arg.slot,
            entry: arg.entry,
            cookie: arg.entry_cookie,
        })
    }

    /// KEY_REMOVE: the module waits for an RCU grace period (CPUs still in the routine).
    pub(super) fn key_remove(&mut self, slot: &crate::keyed::KeySlot) -> Result<(), TargetError> {
        let mut arg = TrapvecKeyRemove {
            slot: slot.index,
            generation: (slot.cookie >> 32) as u32,
        };
        match self.call(Request::KeyRemove(&mut arg)) {
            Ok(()) => Ok(()),
            // Already given back (a retry after a failure that did go through).
            Err(Errno::ENOENT) => {
                log::debug!(
                    "key slot {} (generation {}) was already free",
                    slot.index,
                    arg.generation
                );
                Ok(())
            }
            Err(e) => Err(TargetError::KeyedCount {
                what: format!("slot {}", slot.index),
                reason: format!("KEY_REMOVE: {e}"),
            }),
        }
    }

    /// KEY_STATS, with room for every key (asked again with more room while the table grew).
    pub(super) fn key_stats(
        &self,
        slot: &crate::keyed::KeySlot,
    ) -> Option<crate::keyed::KeyCounts> {
        let generation = (slot.cookie >> 32) as u32;
        let mut room = TRAPVEC_KEY_TABLE as usize;
        loop {
            let mut out = vec![TrapvecKeyEntry::default(); room];
            let mut arg = TrapvecKeyStats {
                slot: slot.index,
                generation,
                ..Default::default()
            };
            match self.call(Request::KeyStats {
                arg: &mut arg,
                out: &mut out,
            }) {
                Ok(()) if arg.count as usize > room => {
                    log::debug!(
                        "key slot {}: {} keys, room for {room}: asking again",
                        slot.index,
                        arg.count
                    );
                    room = arg.count as usize + TRAPVEC_KEY_TABLE as usize;
                }
                Ok(()) => return Some(key_counts_of(&arg, &out[..arg.count as usize])),
                Err(Errno::ENOENT) => return None,
                Err(e) => {
                    log::warn!(
                        "KEY_STATS of slot {}: {}",
                        slot.index,
                        crate::error_chain(&e)
                    );
                    return None;
                }
            }
        }
    }
}

/// The module's code of a key (`TRAPVEC_KEY_*`): the thread (`tid`) is the task's `pid` in the
/// kernel, the process (`pid`) its `tgid`.
fn key_code(by: crate::keyed::KeyBy) -> u32 {
    use crate::keyed::KeyBy;
    match by {
        KeyBy::Tid => TRAPVEC_KEY_PID,
        KeyBy::Pid => TRAPVEC_KEY_TGID,
        KeyBy::Comm => TRAPVEC_KEY_COMM,
        KeyBy::Cpu => TRAPVEC_KEY_CPU,
    }
}

/// The table of KEY_STATS: numbers as decimal text, names up to their first NUL.
fn key_counts_of(a: &TrapvecKeyStats, entries: &[TrapvecKeyEntry]) -> crate::keyed::KeyCounts {
    let keys = entries
        .iter()
        .map(|e| {
            let key = if a.by == TRAPVEC_KEY_COMM {
                let len = e.key.iter().position(|&b| b == 0).unwrap_or(e.key.len());
                String::from_utf8_lossy(&e.key[..len]).into_owned()
            } else {
                let mut n = [0u8; 8];
                n.copy_from_slice(&e.key[..8]);
                u64::from_ne_bytes(n).to_string()
            };
            crate::keyed::KeyCount {
                key,
                count: e.count,
            }
        })
        .collect();
    let counts = crate::keyed::KeyCounts {
        keys,
        overflow: a.overflow,
    }
    .sorted();
    // Read in one pass by the module: they add up, whatever ran meanwhile.
    debug_assert_eq!(
        counts.total(),
        a.hits,
        "KEY_STATS: entries and overflow differ from hits"
    );
    counts
}

/// The figures of RETURN_STATS.
fn return_stats_of(a: &TrapvecReturnStats) -> crate::returns::ReturnStats {
    crate::returns::ReturnStats {
        returns: a.returns,
        missed: a.missed,
        active: a.active,
        histogram: (a.clock != TRAPVEC_CLOCK_NONE).then(|| crate::returns::Histogram {
            buckets: a.buckets.to_vec(),
            sum: a.sum,
            max: a.max,
        }),
    }
}
