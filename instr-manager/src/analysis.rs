//! Decoding and control flow of one function: a linear-sweep decode of `[start, end)` with
//! iced-x86 (64-bit), the branch targets, the basic blocks, indirect jumps (with their jump tables
//! where they can be found, [`jump_table`]) and the padding a springboard may use ([`padding`]).
//!
//! Everything here is pure: it works on the function's bytes and, for jump tables only, on an
//! optional read callback; it never touches a target.
//!
//! Rules:
//! - Branch targets are the targets of every direct `jmp`/`jcc`/`loop`/`jrcxz`/`xbegin`/`call`
//!   that lie inside the function, every fall-through of a conditional branch, and every entry
//!   of a jump table that was found; with [`AnalysisOptions::object_targets`], also every
//!   target inside it of a direct branch or call anywhere else in its object ([`outside`]: a
//!   stripped binary's unnamed `.cold` parts jumping back); the splicer adds the targets of jumps
//!   back from the function's cold parts found by name ([`parts`]) and the exception landing
//!   pads the unwinder jumps to ([`landing`]).
//! - Basic blocks start at the function start and at every branch target that is an instruction
//!   boundary, and end after every branch, `ret`, `jmp`, `ud2`/`ud0`/`ud1` and interrupt
//!   instruction (`int3`, `int n`).
//! - Indirect jumps (`jmp reg`, `jmp [mem]`): the function is still analysed and
//!   [`Function::has_indirect_jumps`] is set. When the jump's table is recognised (see
//!   [`jump_table`]) its entries become branch targets. When it is not, the planner accepts
//!   windows on the basic-block rules over the targets that *are* known: an unrecognised table
//!   could send control into a window, which is the residual risk of splicing such a function
//!   (the same one kprobes takes); `trapctl inspect` prints a warning for these functions.

pub mod jump_table;
pub mod landing;
pub mod liveness;
pub mod outside;
pub mod padding;
pub mod parts;

use std::collections::BTreeSet;
use std::fmt;

use iced_x86::{
    Decoder, DecoderError, DecoderOptions, FlowControl, Formatter, Instruction, IntelFormatter,
    Mnemonic,
};
use trapvec::error::hex;

use crate::error::AnalysisError;
pub use jump_table::{IndirectJump, JumpTable};
pub use outside::ObjectTargets;

/// Reads `len` bytes of the target (or file) at an address; `None` when not readable.
pub type ReadFn<'a> = &'a dyn Fn(u64, usize) -> Option<Vec<u8>>;

/// One decoded instruction.
#[derive(Clone, Debug)]
pub struct Insn {
    pub addr: u64,
    pub len: usize,
    pub instr: Instruction,
}

impl Insn {
    /// Address just past the instruction.
    pub fn end(&self) -> u64 {
        self.addr + self.len as u64
    }

    /// The instruction in Intel syntax, with absolute branch and memory targets.
    pub fn intel(&self) -> String {
        intel(&self.instr)
    }

    /// Whether this is a `call` (near: direct, register or memory).
    pub fn is_call(&self) -> bool {
        self.instr.is_call_near() || self.instr.is_call_near_indirect()
    }
}

impl fmt::Display for Insn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.intel())
    }
}

/// Format one instruction in Intel syntax (`mov rax, [0x4010]`, `jne 0x1140`).
pub fn intel(instr: &Instruction) -> String {
    intel_list(std::iter::once(instr))
}

/// Format instructions in Intel syntax as [`intel`] does, `; `-separated.
pub fn intel_list<'a>(instrs: impl IntoIterator<Item = &'a Instruction>) -> String {
    thread_local! {
        // Building a formatter costs as much as formatting an instruction: one per thread.
        static FORMATTER: std::cell::RefCell<IntelFormatter> = std::cell::RefCell::new(intel_formatter());
    }
    let mut out = String::new();
    FORMATTER.with_borrow_mut(|fmt| {
        for (n, instr) in instrs.into_iter().enumerate() {
            if n > 0 {
                out.push_str("; ");
            }
            fmt.format(instr, &mut out);
        }
    });
    out
}

fn intel_formatter() -> IntelFormatter {
    let mut fmt = IntelFormatter::new();
    let o = fmt.options_mut();
    o.set_hex_prefix("0x");
    o.set_hex_suffix("");
    o.set_uppercase_hex(false);
    o.set_space_after_operand_separator(true);
    o.set_branch_leading_zeros(false);
    o.set_leading_zeros(false);
    o.set_show_branch_size(false);
    o.set_small_hex_numbers_in_decimal(false);
    fmt
}

/// A basic block: straight-line code entered only at `start`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicBlock {
    pub start: u64,
    /// Exclusive.
    pub end: u64,
    /// Starts of the blocks control can flow to inside the function, in address order.
    pub succs: Vec<u64>,
}

/// A decoded function with its control-flow facts.
#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub start: u64,
    /// Exclusive: `start + bytes.len()`.
    pub end: u64,
    /// In address order, contiguous from `start` (up to `undecodable_from` if set).
    pub insns: Vec<Insn>,
    /// In address order, covering every decoded instruction.
    pub blocks: Vec<BasicBlock>,
    pub branch_targets: BTreeSet<u64>,
    /// The exception landing pads among [`Function::branch_targets`] (added by
    /// [`Function::add_landing_pads`]), for refusals that say what the target is.
    pub landing_pads: BTreeSet<u64>,
    /// Branch targets only code outside the function reaches (a `.cold` part), each with one
    /// branch from there ([`Function::add_object_targets`]), for refusals that name it.
    pub outside_targets: std::collections::BTreeMap<u64, u64>,
    pub bytes: Vec<u8>,
    /// The function contains at least one indirect `jmp`.
    pub has_indirect_jumps: bool,
    /// Every indirect `jmp`, with its jump table when one was recognised.
    pub indirect_jumps: Vec<IndirectJump>,
    /// Set by a lenient analysis ([`AnalysisOptions::lenient`]) that met an invalid or truncated
    /// instruction: nothing from this address on was decoded.
    pub undecodable_from: Option<u64>,
}

/// How to analyse a function.
#[derive(Clone, Copy, Default)]
pub struct AnalysisOptions<'a> {
    /// Reads memory outside the function (jump tables in `.rodata`); `None` leaves tables
    /// unresolved.
    pub read: Option<ReadFn<'a>>,
    /// Keep what decodes instead of failing on an invalid instruction (for inspection): the rest
    /// is marked with [`Function::undecodable_from`].
    pub lenient: bool,
    /// The whole object's direct branch targets ([`ObjectTargets`]): those inside the function
    /// that code outside it reaches become branch targets too.
    pub object_targets: Option<&'a ObjectTargets>,
}

impl Function {
    /// The instruction starting exactly at `addr`.
    pub fn insn_at(&self, addr: u64) -> Option<&Insn> {
        self.insn_index(addr).map(|i| &self.insns[i])
    }

    /// Index in [`Function::insns`] of the instruction starting exactly at `addr`.
    pub fn insn_index(&self, addr: u64) -> Option<usize> {
        self.insns.binary_search_by_key(&addr, |i| i.addr).ok()
    }

    /// The instruction covering `addr` (starting at or before it).
    pub fn insn_containing(&self, addr: u64) -> Option<&Insn> {
        let i = self.insns.partition_point(|i| i.addr <= addr);
        let insn = self.insns.get(i.checked_sub(1)?)?;
        (addr < insn.end()).then_some(insn)
    }

    /// The basic block containing `addr`.
    pub fn block_of(&self, addr: u64) -> Option<&BasicBlock> {
        let i = self.blocks.partition_point(|b| b.start <= addr);
        let b = self.blocks.get(i.checked_sub(1)?)?;
        (addr < b.end).then_some(b)
    }

    /// Whether a basic block starts at `addr`.
    pub fn is_block_start(&self, addr: u64) -> bool {
        self.blocks.binary_search_by_key(&addr, |b| b.start).is_ok()
    }

    /// The bytes of one instruction.
    pub fn insn_bytes(&self, insn: &Insn) -> &[u8] {
        let off = usize::try_from(insn.addr - self.start).unwrap_or(usize::MAX);
        self.bytes
            .get(off..off.saturating_add(insn.len))
            .unwrap_or(&[])
    }

    /// Indirect jumps whose targets are not known.
    pub fn unresolved_indirect_jumps(&self) -> impl Iterator<Item = &IndirectJump> {
        self.indirect_jumps.iter().filter(|j| j.table.is_none())
    }
}

/// Decode and analyse `[start, start + bytes.len())`. Invalid or truncated instructions are an
/// error naming the address. Jump tables are left unresolved (no read access).
pub fn analyze_function(name: &str, start: u64, bytes: &[u8]) -> Result<Function, AnalysisError> {
    analyze_function_with(name, start, bytes, &AnalysisOptions::default())
}

/// [`analyze_function`] with options: a reader for jump tables, and lenient decoding.
pub fn analyze_function_with(
    name: &str,
    start: u64,
    bytes: &[u8],
    opts: &AnalysisOptions<'_>,
) -> Result<Function, AnalysisError> {
    if bytes.is_empty() {
        return Err(AnalysisError::Empty {
            func: name.to_string(),
            start,
        });
    }
    // The end is exclusive, so it must itself be an address: a function may not reach 2^64.
    let end =
        start
            .checked_add(bytes.len() as u64)
            .ok_or_else(|| AnalysisError::PastAddressSpace {
                func: name.to_string(),
                start,
                len: bytes.len(),
            })?;
    let (insns, undecodable) = decode(name, start, bytes);

    let mut branch_targets = BTreeSet::new();
    let mut indirect_jumps = Vec::new();
    let inside = |a: u64| a >= start && a < end;
    for (i, insn) in insns.iter().enumerate() {
        let ins = &insn.instr;
        match ins.flow_control() {
            FlowControl::ConditionalBranch | FlowControl::XbeginXabortXend
                if ins.mnemonic() == Mnemonic::Xbegin
                    || ins.flow_control() == FlowControl::ConditionalBranch =>
            {
                let t = ins.near_branch_target();
                if inside(t) {
                    branch_targets.insert(t);
                }
                if insn.end() < end {
                    branch_targets.insert(insn.end());
                }
            }
            FlowControl::UnconditionalBranch | FlowControl::Call
                if ins.is_jmp_short_or_near() || ins.is_call_near() =>
            {
                let t = ins.near_branch_target();
                if inside(t) {
                    branch_targets.insert(t);
                }
            }
            FlowControl::IndirectBranch => {
                let table = opts
                    .read
                    .and_then(|read| jump_table::find(&insns, i, start, end, read));
                if let Some(t) = &table {
                    log::debug!(
                        "{name}: jump table at {:#x} for the indirect jmp at {:#x}: {} targets",
                        t.table,
                        insn.addr,
                        t.targets.len()
                    );
                    branch_targets.extend(t.targets.iter().copied());
                } else {
                    log::debug!(
                        "{name}: indirect jmp at {:#x} with no recognised jump table",
                        insn.addr
                    );
                }
                indirect_jumps.push(IndirectJump {
                    addr: insn.addr,
                    table,
                });
            }
            _ => {}
        }
    }

    let undecodable_from = match undecodable {
        None => None,
        Some(err) if opts.lenient => {
            log::debug!("{err}; the rest of `{name}` is undecodable");
            Some(undecodable_at(&err))
        }
        Some(err) => {
            // Bytes that no instruction reaches (data or padding after a function's last `ret`,
            // in functions whose extent is a guess) are no reason to refuse the function.
            let at = undecodable_at(&err);
            let falls_in = insns
                .last()
                .is_some_and(|last| may_fall_through(&last.instr));
            let jumped_to = branch_targets.range(at..).next().is_some();
            let unknown_jumps = indirect_jumps.iter().any(|j| j.table.is_none());
            if falls_in || jumped_to || unknown_jumps || insns.is_empty() {
                return Err(err);
            }
            log::debug!("`{name}`: nothing reaches {at:#x}, where decoding stops ({err})");
            Some(at)
        }
    };
    let blocks = build_blocks(&insns, &branch_targets, &indirect_jumps, start, end);
    let mut func = Function {
        name: name.to_string(),
        start,
        end,
        has_indirect_jumps: !indirect_jumps.is_empty(),
        insns,
        blocks,
        branch_targets,
        landing_pads: BTreeSet::new(),
        outside_targets: Default::default(),
        bytes: bytes.to_vec(),
        indirect_jumps,
        undecodable_from,
    };
    if let Some(t) = opts.object_targets {
        func.add_object_targets(t);
    }
    Ok(func)
}

/// Decode `[start, start + bytes.len())` linearly up to the first invalid or truncated
/// instruction, returned beside the instructions before it.
fn decode(name: &str, start: u64, bytes: &[u8]) -> (Vec<Insn>, Option<AnalysisError>) {
    let end = start + bytes.len() as u64;
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut insns = Vec::with_capacity(bytes.len() / 3);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        let offset = decoder.position();
        decoder.decode_out(&mut instr);
        let addr = instr.ip();
        if instr.is_invalid() {
            let err = if decoder.last_error() == DecoderError::NoMoreBytes {
                AnalysisError::Truncated {
                    func: name.to_string(),
                    addr,
                    end,
                }
            } else {
                let stop = bytes.len().min(offset + 15);
                AnalysisError::InvalidInstruction {
                    func: name.to_string(),
                    addr,
                    bytes: hex(&bytes[offset..stop]),
                }
            };
            return (insns, Some(err));
        }
        insns.push(Insn {
            addr,
            len: instr.len(),
            instr,
        });
    }
    (insns, None)
}

/// The address of an undecodable instruction.
fn undecodable_at(err: &AnalysisError) -> u64 {
    match err {
        AnalysisError::InvalidInstruction { addr, .. } | AnalysisError::Truncated { addr, .. } => {
            *addr
        }
        AnalysisError::Empty { start, .. } | AnalysisError::PastAddressSpace { start, .. } => {
            *start
        }
    }
}

/// Whether control may continue to the instruction after `instr`: everything but `ret`, `jmp`
/// (direct or indirect) and `int3`. A `ud2` counts as continuing: a kernel WARN's does.
fn may_fall_through(instr: &Instruction) -> bool {
    match instr.flow_control() {
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch => {
            false
        }
        FlowControl::Interrupt => instr.mnemonic() != Mnemonic::Int3,
        _ => true,
    }
}

/// Whether a block must end after this instruction.
pub(crate) fn ends_block(instr: &Instruction) -> bool {
    matches!(
        instr.flow_control(),
        FlowControl::ConditionalBranch
            | FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Return
            | FlowControl::Exception
            | FlowControl::Interrupt
            | FlowControl::XbeginXabortXend
    )
}

/// Where control may go after `insn` (inside `[start, end)`), for the block that it ends.
fn successors(insn: &Insn, indirect: &[IndirectJump], start: u64, end: u64) -> Vec<u64> {
    let ins = &insn.instr;
    let inside = |a: u64| a >= start && a < end;
    let fall = insn.end();
    let mut out = Vec::new();
    match ins.flow_control() {
        FlowControl::ConditionalBranch | FlowControl::XbeginXabortXend => {
            if ins.mnemonic() == Mnemonic::Xbegin
                || ins.flow_control() == FlowControl::ConditionalBranch
            {
                out.push(ins.near_branch_target());
            }
            out.push(fall);
        }
        FlowControl::UnconditionalBranch if ins.is_jmp_short_or_near() => {
            out.push(ins.near_branch_target())
        }
        FlowControl::IndirectBranch => {
            if let Some(t) = indirect
                .iter()
                .find(|j| j.addr == insn.addr)
                .and_then(|j| j.table.as_ref())
            {
                out.extend(t.targets.iter().copied());
            }
        }
        // `int n` other than int3 returns to the next instruction; int3, ud2 and ret do not
        // continue (a kernel WARN's ud2 does, but its next instruction starts a block anyway).
        FlowControl::Interrupt if ins.mnemonic() != Mnemonic::Int3 => out.push(fall),
        FlowControl::Return
        | FlowControl::Exception
        | FlowControl::Interrupt
        | FlowControl::UnconditionalBranch => {}
        _ => out.push(fall),
    }
    out.retain(|&a| inside(a));
    out.sort_unstable();
    out.dedup();
    out
}

fn build_blocks(
    insns: &[Insn],
    targets: &BTreeSet<u64>,
    indirect: &[IndirectJump],
    start: u64,
    end: u64,
) -> Vec<BasicBlock> {
    let mut blocks = Vec::new();
    let Some(first) = insns.first() else {
        return blocks;
    };
    let mut block_start = first.addr;
    for (i, insn) in insns.iter().enumerate() {
        let next = insns.get(i + 1);
        let cut = ends_block(&insn.instr) || next.is_none_or(|n| targets.contains(&n.addr));
        if cut {
            let succs = if ends_block(&insn.instr) {
                successors(insn, indirect, start, end)
            } else {
                next.map(|n| vec![n.addr]).unwrap_or_default()
            };
            blocks.push(BasicBlock {
                start: block_start,
                end: insn.end(),
                succs,
            });
            if let Some(n) = next {
                block_start = n.addr;
            }
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x40_1000;

    #[rustfmt::skip]
    const LOOP_FN: &[u8] = &[
        /*0000*/ 0x31, 0xC0,             // xor eax, eax
        /*0002*/ 0x85, 0xFF,             // test edi, edi
        /*0004*/ 0x7E, 0x08,             // jle 0x0e
        /*0006*/ 0x01, 0xF8,             // add eax, edi      <- loop head
        /*0008*/ 0x83, 0xEF, 0x01,       // sub edi, 1
        /*000b*/ 0x75, 0xF9,             // jne 0x06
        /*000d*/ 0x90,                   // nop
        /*000e*/ 0xC3,                   // ret
        /*000f*/ 0xCC,                   // int3 (padding)
    ];

    #[test]
    fn loop_function_has_targets_at_loop_head_and_fall_throughs() {
        let f = analyze_function("loop", BASE, LOOP_FN).unwrap();
        assert_eq!(f.insns.len(), 9);
        let t: Vec<u64> = f.branch_targets.iter().map(|a| a - BASE).collect();
        // jle -> 0x0e, its fall-through 0x06 (also the loop head), jne fall-through 0x0d.
        assert_eq!(t, vec![0x06, 0x0d, 0x0e]);
        let blocks: Vec<(u64, u64)> = f
            .blocks
            .iter()
            .map(|b| (b.start - BASE, b.end - BASE))
            .collect();
        assert_eq!(
            blocks,
            vec![(0x0, 0x6), (0x6, 0xd), (0xd, 0xe), (0xe, 0xf), (0xf, 0x10)]
        );
        assert_eq!(f.blocks[0].succs, vec![BASE + 0x6, BASE + 0xe]);
        assert_eq!(f.blocks[1].succs, vec![BASE + 0x6, BASE + 0xd]);
        assert_eq!(f.blocks[2].succs, vec![BASE + 0xe]);
        assert!(f.blocks[3].succs.is_empty(), "ret has no successor");
        assert_eq!(f.block_of(BASE + 0x9).unwrap().start, BASE + 0x6);
        assert_eq!(f.insn_at(BASE + 0x8).unwrap().len, 3);
        assert!(f.insn_at(BASE + 0x9).is_none());
        assert_eq!(f.insn_containing(BASE + 0x9).unwrap().addr, BASE + 0x8);
        assert_eq!(f.insn_index(BASE + 0xb), Some(5));
        assert!(!f.has_indirect_jumps);
    }

    #[test]
    fn call_into_the_function_is_a_branch_target() {
        #[rustfmt::skip]
        let bytes = [
            /*0000*/ 0xE8, 0x01, 0x00, 0x00, 0x00, // call 0x06
            /*0005*/ 0xC3,                         // ret
            /*0006*/ 0x31, 0xC0,                   // xor eax, eax
            /*0008*/ 0xC3,                         // ret
        ];
        let f = analyze_function("selfcall", BASE, &bytes).unwrap();
        assert_eq!(
            f.branch_targets.iter().copied().collect::<Vec<_>>(),
            vec![BASE + 6]
        );
        // A call does not end a block: `call; ret` is one block, the callee another.
        assert_eq!(
            f.blocks,
            vec![
                BasicBlock {
                    start: BASE,
                    end: BASE + 6,
                    succs: vec![]
                },
                BasicBlock {
                    start: BASE + 6,
                    end: BASE + 9,
                    succs: vec![]
                },
            ]
        );
    }

    #[test]
    fn invalid_opcode_is_an_error_naming_the_address() {
        let bytes = [0x90, 0x06, 0xC3]; // nop; (push es: invalid in 64-bit mode); ret
        let err = analyze_function("bad", BASE, &bytes).unwrap_err();
        assert_eq!(
            err,
            AnalysisError::InvalidInstruction {
                func: "bad".into(),
                addr: BASE + 1,
                bytes: "06 c3".into()
            }
        );
        assert!(err.to_string().contains("0x401001"), "{err}");
    }

    #[test]
    fn lenient_analysis_keeps_the_decodable_prefix() {
        let bytes = [0x55, 0x48, 0x89, 0xE5, 0x06, 0xC3];
        let f = analyze_function_with(
            "bad",
            BASE,
            &bytes,
            &AnalysisOptions {
                read: None,
                lenient: true,
                object_targets: None,
            },
        )
        .unwrap();
        assert_eq!(f.insns.len(), 2);
        assert_eq!(f.undecodable_from, Some(BASE + 4));
        assert_eq!(
            f.blocks,
            vec![BasicBlock {
                start: BASE,
                end: BASE + 4,
                succs: vec![]
            }]
        );
    }

    #[test]
    fn undecodable_bytes_no_instruction_reaches_end_the_function_quietly() {
        // lea eax,[rdi+1]; ret; then bytes that are no instruction (push es, a cut call).
        let bytes = [0x8D, 0x47, 0x01, 0xC3, 0x06, 0xE8, 0x00];
        let f = analyze_function("bare", BASE, &bytes).unwrap();
        assert_eq!(f.insns.len(), 2);
        assert_eq!(f.undecodable_from, Some(BASE + 4));
        // The same bytes reached: by falling in after a call, by a branch over them, or
        // possibly by an indirect jmp whose table is unknown.
        let reached = [
            (
                vec![0xE8, 0x00, 0x00, 0x00, 0x00, 0x06, 0xC3],
                "falls in after a call",
            ),
            (
                vec![0x74, 0x02, 0xC3, 0xC3, 0x06, 0xC3],
                "je over the rets to the bad byte",
            ),
            (
                vec![0x74, 0x01, 0xC3, 0xFF, 0xE0, 0x06],
                "jmp rax may land there",
            ),
        ];
        for (code, why) in reached {
            assert!(analyze_function("reached", BASE, &code).is_err(), "{why}");
        }
    }

    #[test]
    fn truncated_last_instruction_is_reported_as_truncated() {
        let bytes = [0x90, 0xE8, 0x00, 0x00];
        let err = analyze_function("cut", BASE, &bytes).unwrap_err();
        assert_eq!(
            err,
            AnalysisError::Truncated {
                func: "cut".into(),
                addr: BASE + 1,
                end: BASE + 4
            }
        );
    }

    #[test]
    fn empty_function_is_an_error() {
        assert!(matches!(
            analyze_function("e", BASE, &[]),
            Err(AnalysisError::Empty { .. })
        ));
    }

    #[test]
    fn function_running_past_the_end_of_the_address_space_is_refused() {
        // Found by the fuzzer (fuzz/regressions/analysis): the end overflowed.
        let err = analyze_function("top", u64::MAX - 2, &[0x90, 0x90, 0x90, 0xC3]).unwrap_err();
        assert_eq!(
            err,
            AnalysisError::PastAddressSpace {
                func: "top".into(),
                start: u64::MAX - 2,
                len: 4
            }
        );
        assert_eq!(
            err.to_string(),
            "function `top` at 0xfffffffffffffffd (4 bytes) runs past the end of the address space"
        );
        // Ending exactly at 2^64 leaves no exclusive end either.
        assert!(analyze_function("top", u64::MAX - 3, &[0x90, 0x90, 0x90, 0xC3]).is_err());
        assert!(analyze_function("top", u64::MAX - 4, &[0x90, 0x90, 0x90, 0xC3]).is_ok());
    }

    #[test]
    fn ud2_and_int3_end_blocks_without_successors() {
        let bytes = [0x0F, 0x0B, 0x90, 0xCC, 0x90, 0xC3];
        let f = analyze_function("u", BASE, &bytes).unwrap();
        let b: Vec<(u64, u64, usize)> = f
            .blocks
            .iter()
            .map(|b| (b.start - BASE, b.end - BASE, b.succs.len()))
            .collect();
        assert_eq!(b, vec![(0, 2, 0), (2, 4, 0), (4, 6, 0)]);
    }

    #[test]
    fn intel_formatting_shows_absolute_targets() {
        let f = analyze_function("loop", BASE, LOOP_FN).unwrap();
        assert_eq!(f.insns[2].intel(), "jle 0x40100e");
        assert_eq!(f.insns[0].to_string(), "xor eax, eax");
        assert_eq!(f.insn_bytes(&f.insns[4]), &[0x83, 0xEF, 0x01]);
    }
}
