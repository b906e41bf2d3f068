//! Branch targets that come from outside a function: the *cold parts* compilers split off a
//! function (gcc's `foo.cold` in `.text.unlikely`, `foo.cold.N` in older releases) jump back
//! into it, at join points nothing inside the function targets. Without them, a window could
//! cover a join point and a jump back from the cold part would land inside the patched bytes.
//!
//! The parts are found by name ([`part_names`]), decoded, and their direct branch targets that
//! land inside the function ([`targets_into`]) join its branch targets
//! ([`Function::add_outside_targets`]). Both directions: a cold part's targets in its parent, and
//! the parent's targets in a cold part (a jump to a label in the middle of `foo.cold`).
//!
//! Exception landing pads, which the unwinder jumps to, are outside targets too: [`super::landing`]
//! reads them and [`Function::add_landing_pads`] adds them. Jumps from code that shares no name
//! with this one (a stripped binary's unnamed cold parts, other functions) are found by scanning
//! the whole object instead ([`super::outside`]), where the target knows its objects' code.

use iced_x86::FlowControl;

use super::{build_blocks, Function};

/// Suffixes gcc gives a function's cold part.
const COLD_SUFFIXES: [&str; 5] = [".cold", ".cold.0", ".cold.1", ".cold.2", ".cold.3"];

/// Names of the code that may jump into the function `name`: its cold parts, or, for a cold
/// part, the function it was split from.
pub fn part_names(name: &str) -> Vec<String> {
    let mut out: Vec<String> = COLD_SUFFIXES.iter().map(|s| format!("{name}{s}")).collect();
    if let Some(i) = name.rfind(".cold") {
        let rest = &name[i + ".cold".len()..];
        if rest.is_empty()
            || rest
                .strip_prefix('.')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            out.push(name[..i].to_string());
        }
    }
    out
}

/// The targets of `part`'s direct `jmp`/`jcc`/`loop`/`call`/`xbegin` that lie in `[start, end)`,
/// sorted, without duplicates.
pub fn targets_into(part: &Function, start: u64, end: u64) -> Vec<u64> {
    let mut out: Vec<u64> = part
        .insns
        .iter()
        .filter(|i| {
            matches!(
                i.instr.flow_control(),
                FlowControl::ConditionalBranch
                    | FlowControl::UnconditionalBranch
                    | FlowControl::Call
                    | FlowControl::XbeginXabortXend
            )
        })
        .filter_map(|i| {
            let t = i.instr.near_branch_target();
            // 0 for forms without a near target (far jumps, xabort/xend).
            (t != 0).then_some(t)
        })
        .filter(|&t| t >= start && t < end)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

impl Function {
    /// Add branch targets reached from outside the function (a cold part's jumps back), those
    /// inside it, and rebuild the basic blocks. Returns how many were new.
    pub fn add_outside_targets(&mut self, targets: impl IntoIterator<Item = u64>) -> usize {
        let before = self.branch_targets.len();
        let (start, end) = (self.start, self.end);
        self.branch_targets
            .extend(targets.into_iter().filter(|&t| t >= start && t < end));
        let added = self.branch_targets.len() - before;
        if added > 0 {
            self.rebuild_blocks();
        }
        added
    }

    /// Add exception landing pads (read by [`super::landing`]) as outside targets, remembered as
    /// landing pads so that a refusal names them. Returns how many were new branch targets.
    pub fn add_landing_pads(&mut self, pads: impl IntoIterator<Item = u64>) -> usize {
        let (start, end) = (self.start, self.end);
        let pads: Vec<u64> = pads
            .into_iter()
            .filter(|&p| p >= start && p < end)
            .collect();
        self.landing_pads.extend(pads.iter().copied());
        self.add_outside_targets(pads)
    }
}

impl Function {
    /// The basic blocks again, after branch targets were added (cold parts, outside targets).
    pub(super) fn rebuild_blocks(&mut self) {
        self.blocks = build_blocks(
            &self.insns,
            &self.branch_targets,
            &self.indirect_jumps,
            self.start,
            self.end,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyze_function;

    #[test]
    fn part_names_go_both_ways() {
        assert_eq!(
            part_names("foo")[..2],
            ["foo.cold".to_string(), "foo.cold.0".to_string()]
        );
        assert!(part_names("foo.cold").contains(&"foo".to_string()));
        assert!(part_names("foo.part.0.cold.1").contains(&"foo.part.0".to_string()));
        assert!(!part_names("foo.colder").contains(&"foo".to_string()));
    }

    #[rustfmt::skip]
    #[test]
    fn cold_part_jump_back_splits_the_block_it_lands_in() {
        // foo at 0x1000: test edi,edi; js rel32 -> 0x2000; lea eax,[rdi+2]; (0x100b) lea eax,[rax+rax*4+1]; ret
        let foo = [0x85, 0xFF, 0x0F, 0x88, 0xF8, 0x0F, 0x00, 0x00, 0x8D, 0x47, 0x02, 0x8D, 0x44, 0x80, 0x01, 0xC3];
        // foo.cold at 0x2000: mov eax,edi; neg eax; jmp 0x100b
        let cold = [0x89, 0xF8, 0xF7, 0xD8, 0xE9, 0x02, 0xF0, 0xFF, 0xFF];
        let mut f = analyze_function("foo", 0x1000, &foo).unwrap();
        let c = analyze_function("foo.cold", 0x2000, &cold).unwrap();
        assert_eq!(f.block_of(0x100b).unwrap().start, 0x1008, "the join is mid-block seen from foo alone");
        assert_eq!(targets_into(&c, f.start, f.end), vec![0x100b]);
        assert_eq!(targets_into(&f, c.start, c.end), vec![0x2000], "and the other way");
        assert_eq!(f.add_outside_targets(targets_into(&c, f.start, f.end)), 1);
        assert!(f.branch_targets.contains(&0x100b));
        assert_eq!(f.block_of(0x100b).unwrap().start, 0x100b);
        assert_eq!(f.block_of(0x1008).unwrap().end, 0x100b);
        assert_eq!(f.add_outside_targets([0x100b, 0x5000]), 0, "known or outside: nothing new");
    }
}
