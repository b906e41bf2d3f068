//! Branch targets that come from anywhere in an object: every direct `jmp`/`jcc`/`loop`/
//! `jrcxz`/`xbegin`/`call` target of the object's executable code, found by decoding it linearly
//! once ([`ObjectTargets::scan`]), so that a function learns the addresses inside it that code
//! outside it jumps or calls to ([`Function::add_object_targets`]).
//!
//! Names alone ([`super::parts`]) do not find them all: a binary stripped to `.dynsym` (Debian's
//! python3, built with PGO/LTO) has no `foo.cold` symbols, yet its split-off cold parts jump back
//! into the middle of the hot function; and there a symbol's extent may cover unnamed static
//! functions that other code calls. A window over such an address would send the jump into the
//! patched bytes.
//!
//! A linear sweep may decode data or padding as instructions; a target it invents that is no
//! instruction boundary of the function is ignored (a real jump lands on one). Pure: bytes in.

use std::collections::BTreeMap;

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};

use super::Function;

/// One target and the lowest and highest addresses of the instructions that branch to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    target: u64,
    lo: u64,
    hi: u64,
}

/// The direct branch and call targets of an object's code, each with where it is reached from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectTargets {
    /// Sorted by target, one entry per target.
    entries: Vec<Entry>,
    /// Bytes decoded.
    pub code_bytes: usize,
    /// Direct branches and calls found.
    pub branches: usize,
}

impl ObjectTargets {
    /// Decode each `(address, bytes)` run of code (an executable section or segment) linearly
    /// and collect the targets of its direct branches and calls. An undecodable byte is skipped.
    pub fn scan<'a>(code: impl IntoIterator<Item = (u64, &'a [u8])>) -> ObjectTargets {
        let mut pairs: Vec<(u64, u64)> = Vec::new();
        let mut code_bytes = 0;
        let mut instr = Instruction::default();
        for (addr, bytes) in code {
            code_bytes += bytes.len();
            let mut decoder = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
            while decoder.can_decode() {
                decoder.decode_out(&mut instr);
                if instr.is_invalid() {
                    continue;
                }
                if !matches!(
                    instr.flow_control(),
                    FlowControl::ConditionalBranch
                        | FlowControl::UnconditionalBranch
                        | FlowControl::Call
                        | FlowControl::XbeginXabortXend
                ) {
                    continue;
                }
                // 0 for forms without a near target (far jumps, xabort/xend).
                let t = instr.near_branch_target();
                if t != 0 {
                    pairs.push((t, instr.ip()));
                }
            }
        }
        let branches = pairs.len();
        pairs.sort_unstable();
        let mut entries: Vec<Entry> = Vec::new();
        for (target, from) in pairs {
            match entries.last_mut() {
                Some(e) if e.target == target => e.hi = from,
                _ => entries.push(Entry {
                    target,
                    lo: from,
                    hi: from,
                }),
            }
        }
        entries.shrink_to_fit();
        ObjectTargets {
            entries,
            code_bytes,
            branches,
        }
    }

    /// How many distinct targets.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The targets strictly inside `[start, end)` (past `start`) that an instruction outside
    /// it branches to, each with one such instruction's address.
    pub fn from_outside(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.entries.partition_point(|e| e.target <= start);
        self.entries[first..]
            .iter()
            .take_while(move |e| e.target < end)
            .filter_map(move |e| {
                if e.lo < start {
                    Some((e.target, e.lo))
                } else if e.hi >= end {
                    Some((e.target, e.hi))
                } else {
                    None
                }
            })
    }
}

impl Function {
    /// Add the targets inside the function that code outside it branches to (`targets`, the
    /// whole object's) and that are instruction boundaries of it, remembering where each new one
    /// comes from ([`Function::outside_targets`]), and rebuild the basic blocks. Returns how many
    /// were new.
    pub fn add_object_targets(&mut self, targets: &ObjectTargets) -> usize {
        let mut new: BTreeMap<u64, u64> = BTreeMap::new();
        for (t, from) in targets.from_outside(self.start, self.end) {
            if self.branch_targets.contains(&t) {
                continue;
            }
            if self.insn_index(t).is_none() {
                log::debug!(
                    "`{}`: {t:#x}, a branch target from {from:#x}, is no instruction boundary of it: ignored",
                    self.name
                );
                continue;
            }
            new.insert(t, from);
        }
        if new.is_empty() {
            return 0;
        }
        log::debug!(
            "`{}`: {} branch target(s) from outside it: {:x?}",
            self.name,
            new.len(),
            new
        );
        self.branch_targets.extend(new.keys().copied());
        let added = new.len();
        self.outside_targets.extend(new);
        self.rebuild_blocks();
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze_function;

    #[rustfmt::skip]
    #[test]
    fn a_jump_back_from_code_outside_splits_the_block_it_lands_in() {
        // foo at 0x1000: test edi,edi; js rel32 -> 0x2000; lea eax,[rdi+2]; (0x100b) lea eax,[rax+rax*4+1]; ret
        let foo = [0x85, 0xFF, 0x0F, 0x88, 0xF8, 0x0F, 0x00, 0x00, 0x8D, 0x47, 0x02, 0x8D, 0x44, 0x80, 0x01, 0xC3];
        // unnamed code at 0x2000: mov eax,edi; neg eax; jmp 0x100b; call 0x1003 (no boundary)
        let cold = [0x89, 0xF8, 0xF7, 0xD8, 0xE9, 0x02, 0xF0, 0xFF, 0xFF, 0xE8, 0xF5, 0xEF, 0xFF, 0xFF];
        let t = ObjectTargets::scan([(0x1000, &foo[..]), (0x2000, &cold[..])]);
        assert_eq!(t.branches, 3);
        assert_eq!(t.code_bytes, foo.len() + cold.len());
        assert_eq!(t.from_outside(0x1000, 0x1010).collect::<Vec<_>>(), vec![(0x1003, 0x2009), (0x100b, 0x2004)]);
        assert_eq!(t.from_outside(0x2000, 0x2010).count(), 0, "0x2000 is the start: no interior");
        let mut f = analyze_function("foo", 0x1000, &foo).unwrap();
        assert_eq!(f.block_of(0x100b).unwrap().start, 0x1008);
        assert_eq!(f.add_object_targets(&t), 1, "0x1003 is inside `js`: ignored");
        assert_eq!(f.block_of(0x100b).unwrap().start, 0x100b);
        assert_eq!(f.outside_targets.get(&0x100b), Some(&0x2004));
        assert_eq!(f.add_object_targets(&t), 0);
    }
}
