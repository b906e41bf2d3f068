//! Relocating displaced instructions to a new address (a trampoline), with iced-x86's
//! `BlockEncoder` doing the encoding.
//!
//! Each displaced instruction is *lowered* to the iced instructions that do the same thing at the
//! new address, by the first [`Fixup`] that claims it, one file per kind:
//! - [`forbidden`]: instructions that must not run anywhere but at their own address (refused);
//! - [`call`]: calls become "push the original return address; jmp target", so the callee returns
//!   straight to the original code and never into the trampoline;
//! - [`branch`]: relative branches (`jcc`, `jmp`, `loop`, `jrcxz`, `xbegin`), whose targets the
//!   `BlockEncoder` keeps, using long forms where the short ones no longer reach;
//! - [`rip_relative`]: RIP-relative memory operands, re-aimed at the same absolute address;
//! - [`plain`]: everything else, copied as is.
//!
//! The lowered instructions then get instruction pointers that are no branch target of the block
//! (see [`assign_ips`]): `BlockEncoder` re-aims a branch whose target equals the IP of an
//! instruction of the block at that instruction's new copy, and a displaced branch back to the
//! site must go to the site (through the splice again), never to the relocated copy.

mod branch;
mod call;
mod forbidden;
mod plain;
mod rip_relative;

use std::collections::BTreeSet;

use iced_x86::{BlockEncoder, BlockEncoderOptions, Encoder, Instruction, InstructionBlock, OpKind};

use crate::analysis::Insn;
use crate::error::Refusal;
use crate::RefusalCause;

/// Largest code a relocated block or trampoline may have after its start, used as the safety
/// margin of reach checks made before the exact layout is known.
pub(crate) const LAYOUT_MARGIN: u64 = 4096;

/// What a fix-up sees of the window.
pub(crate) struct Ctx<'a> {
    /// All displaced instructions, in order.
    pub displaced: &'a [Insn],
    /// Index of the instruction being lowered.
    pub index: usize,
    /// Where the relocated instructions will start.
    pub new_addr: u64,
}

impl Ctx<'_> {
    pub fn site(&self) -> u64 {
        self.displaced.first().map_or(0, |i| i.addr)
    }

    pub fn window_end(&self) -> u64 {
        self.displaced.last().map_or(0, Insn::end)
    }

    pub fn is_last(&self) -> bool {
        self.index + 1 == self.displaced.len()
    }

    /// A refusal of `insn` for `cause`, which `reason` says with the specifics.
    pub fn refuse(&self, insn: &Insn, cause: RefusalCause, reason: impl Into<String>) -> Refusal {
        Refusal::Unrelocatable {
            site: self.site(),
            addr: insn.addr,
            insn: insn.intel(),
            reason: reason.into(),
            cause,
        }
    }
}

/// One kind of fix-up.
pub(crate) trait Fixup: Sync {
    /// Whether this fix-up handles `insn`.
    fn claims(&self, insn: &Insn) -> bool;
    /// Append what `insn` becomes at the new address, or refuse.
    fn lower(&self, insn: &Insn, ctx: &Ctx<'_>, out: &mut Vec<Instruction>) -> Result<(), Refusal>;
}

/// In order: the first that claims an instruction lowers it.
static FIXUPS: [&dyn Fixup; 5] = [
    &forbidden::Forbidden,
    &call::Call,
    &branch::Branch,
    &rip_relative::RipRelative,
    &plain::Plain,
];

/// Lower every displaced instruction for execution at `new_addr` (reach checks use a margin of
/// [`LAYOUT_MARGIN`] bytes, so the result may be placed anywhere in `[new_addr, new_addr +
/// LAYOUT_MARGIN)`).
pub(crate) fn lower_displaced(
    displaced: &[Insn],
    new_addr: u64,
) -> Result<Vec<Instruction>, Refusal> {
    let mut out = Vec::with_capacity(displaced.len() + 3);
    for (index, insn) in displaced.iter().enumerate() {
        let ctx = Ctx {
            displaced,
            index,
            new_addr,
        };
        let fixup = FIXUPS
            .iter()
            .find(|f| f.claims(insn))
            .copied()
            .unwrap_or(&plain::Plain);
        fixup.lower(insn, &ctx, &mut out)?;
    }
    Ok(out)
}

/// Relocate `displaced` (consecutive instructions) to `new_addr`: the bytes that do at
/// `new_addr` what the originals did at their address. No jump back is appended (see
/// [`crate::trampoline::emit_replay`]).
pub fn relocate(displaced: &[Insn], new_addr: u64) -> Result<Vec<u8>, Refusal> {
    let mut instrs = lower_displaced(displaced, new_addr)?;
    let bytes = encode_block(&mut instrs, new_addr, "the displaced instructions")
        .map_err(|e| culprit(displaced, new_addr).unwrap_or(e))?;
    log::debug!(
        "relocated {} instruction(s) from {:#x} to {new_addr:#x}: {} -> {} bytes",
        displaced.len(),
        displaced.first().map_or(0, |i| i.addr),
        displaced.iter().map(|i| i.len).sum::<usize>(),
        bytes.len()
    );
    Ok(bytes)
}

/// Whether `displaced` can be relocated to `new_addr`: what [`relocate`] says, without its cost
/// where it is not needed. Planning asks this of every window; most windows (`push`, `mov`,
/// `lea`, a `call rel32`) encode in their fixed forms at once, and only the others go through
/// the `BlockEncoder` (a short branch that must grow, or a refusal to explain).
pub(crate) fn check_relocatable(displaced: &[Insn], new_addr: u64) -> Result<(), Refusal> {
    let instrs = lower_displaced(displaced, new_addr)?;
    let mut enc = Encoder::new(64);
    let mut ip = new_addr;
    // Checked: code that would run past 2^64 is not "direct"; `relocate` then says why.
    let direct = instrs.iter().all(|i| {
        enc.encode(i, ip)
            .ok()
            .and_then(|n| ip.checked_add(n as u64))
            .map(|next| ip = next)
            .is_some()
    });
    if direct {
        return Ok(());
    }
    relocate(displaced, new_addr).map(drop)
}

/// When a block fails to encode, the displaced instruction that fails alone, as
/// [`Refusal::Unrelocatable`].
fn culprit(displaced: &[Insn], new_addr: u64) -> Option<Refusal> {
    displaced.iter().enumerate().find_map(|(index, insn)| {
        let one = std::slice::from_ref(insn);
        let mut instrs = lower_displaced(one, new_addr).ok()?;
        let err = encode_block(&mut instrs, new_addr, "a displaced instruction").err()?;
        let ctx = Ctx {
            displaced,
            index,
            new_addr,
        };
        let reason = match err {
            Refusal::Encode { reason, .. } => format!("iced-x86 cannot re-encode it: {reason}"),
            other => other.to_string(),
        };
        Some(ctx.refuse(insn, RefusalCause::Reencode, reason))
    })
}

/// Whether a RIP-relative memory operand at `from` reaches `to` as the CPU computes it: rip plus
/// a rel32 modulo 2^64 (BlockEncoder encodes it so). Linux 6.12 addresses per-CPU data
/// RIP-relatively (`mov rax, gs:[rip+x]` whose target is the per-CPU offset, 0x35000): near 0,
/// in reach of the kernel's top 2 GiB only through the wrap. Branches keep [`reaches`].
pub(crate) fn reaches_wrapping(from: u64, to: u64, margin: u64) -> bool {
    let d = i64::from_ne_bytes(to.wrapping_sub(from).to_ne_bytes());
    let lim = i64::from(i32::MAX) - i64::try_from(margin).unwrap_or(i64::MAX);
    d.checked_abs().is_some_and(|d| d <= lim)
}

/// Whether a rel32 branch at `from` reaches `to`, with `margin` bytes of slack for where
/// exactly `from` ends up.
pub(crate) fn reaches(from: u64, to: u64, margin: u64) -> bool {
    let d = i128::from(to) - i128::from(from);
    let lim = i128::from(i32::MAX) - i128::from(margin);
    d.abs() <= lim
}

fn branch_target(instr: &Instruction) -> Option<u64> {
    match instr.op0_kind() {
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
            Some(instr.near_branch_target())
        }
        _ => None,
    }
}

/// Give each instruction an IP that is no branch target of the block, so that `BlockEncoder`
/// treats every branch as leaving the block.
pub(crate) fn assign_ips(instrs: &mut [Instruction]) {
    let targets: BTreeSet<u64> = instrs.iter().filter_map(branch_target).collect();
    let mut ip = 1u64;
    for instr in instrs.iter_mut() {
        while targets.contains(&ip) {
            ip += 1;
        }
        instr.set_ip(ip);
        ip += 1;
    }
}

/// Encode `instrs` as one block at `addr` (IPs are reassigned, see [`assign_ips`]).
pub(crate) fn encode_block(
    instrs: &mut [Instruction],
    addr: u64,
    what: &'static str,
) -> Result<Vec<u8>, Refusal> {
    assign_ips(instrs);
    let code = BlockEncoder::encode(
        64,
        InstructionBlock::new(instrs, addr),
        BlockEncoderOptions::NONE,
    )
    .map(|r| r.code_buffer)
    .map_err(|e| Refusal::Encode {
        what,
        addr,
        reason: e.to_string(),
    })?;
    // The encoder wraps IPs silently; code must end (exclusively) inside the address space.
    if addr.checked_add(code.len() as u64).is_none() {
        return Err(Refusal::Encode {
            what,
            addr,
            reason: format!(
                "its {} bytes would run past the end of the address space",
                code.len()
            ),
        });
    }
    Ok(code)
}

#[cfg(test)]
mod tests;
