//! Splice planning: given a decoded function and a site, decide what a trap or jmp splice there
//! writes and displaces, or refuse with the reason. Pure: the target is only seen through the
//! `read` and `busy` callbacks of [`PlanInput`].
//!
//! Rules (DESIGN.md, "Splices"):
//! - the site is an instruction boundary of the decoded function and not inside the ftrace site;
//! - the window is `[site, site + patch_len)` widened to whole instructions (the *displaced*
//!   instructions); it lies inside one basic block, contains no branch target except possibly
//!   the site itself (the function's own, and those code outside it reaches that the analysis
//!   was given: [`crate::analysis::outside`]), does not pass the function's end, overlaps no text that is already patched,
//!   and every displaced instruction can be relocated ([`crate::relocate`]);
//! - trap: `patch_len` 2 (`CD F5`);
//! - jmp: a 5-byte `jmp rel32` when that window passes and the trampoline is within reach;
//!   otherwise a 2-byte `jmp rel8` to a springboard (a `jmp rel32` written into 5 bytes of padding
//!   within rel8 reach, see [`springboard`]); otherwise [`Refusal::NoRoomForJmp`] with the reasons.

pub mod springboard;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use trapvec::{SymbolTable, TargetInfo};

use crate::analysis::{intel_list, Function, Insn, ReadFn};
use crate::error::Refusal;
use crate::point::{starts_with_endbr, FENTRY_LEN, NOP5};
use crate::relocate::{check_relocatable, reaches, LAYOUT_MARGIN};

/// Length of the trap `CD F5`.
pub const TRAP_LEN: usize = 2;
/// Length of `jmp rel32` (`E9 xx xx xx xx`).
pub const JMP_REL32_LEN: usize = 5;
/// Length of `jmp rel8` (`EB xx`).
pub const JMP_REL8_LEN: usize = 2;

/// How control leaves the site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    /// `int 0xF5` (2 bytes), redirected by the trap dispatcher.
    Trap,
    /// `jmp rel32` (5 bytes), or `jmp rel8` to a springboard.
    Jmp,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mechanism::Trap => "trap",
            Mechanism::Jmp => "jmp",
        })
    }
}

/// A mechanism's name that is neither `trap` nor `jmp`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown mechanism `{text}` (expected `trap` or `jmp`)")]
pub struct UnknownMechanism {
    pub text: String,
}

impl FromStr for Mechanism {
    type Err = UnknownMechanism;

    fn from_str(s: &str) -> Result<Self, UnknownMechanism> {
        match s {
            "trap" => Ok(Mechanism::Trap),
            "jmp" => Ok(Mechanism::Jmp),
            _ => Err(UnknownMechanism {
                text: s.to_string(),
            }),
        }
    }
}

/// A `jmp rel32` written into padding, reached from the site by a `jmp rel8`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Springboard {
    pub addr: u64,
    /// The 5 padding bytes it overwrites.
    pub old: Vec<u8>,
}

/// What a splice at `site` writes and displaces.
#[derive(Clone, Debug)]
pub struct Plan {
    pub site: u64,
    pub mechanism: Mechanism,
    /// The instructions overlapping `[site, site + patch_len)`, replayed out of line.
    pub displaced: Vec<Insn>,
    /// Total length of `displaced`; execution resumes at `site + displaced_len`.
    pub displaced_len: usize,
    /// Bytes written at the site: 2 for a trap, 5 for `jmp rel32`, 2 for `jmp rel8`.
    pub patch_len: usize,
    /// For `jmp rel8`: the springboard it jumps to.
    pub springboard: Option<Springboard>,
}

impl Plan {
    /// End of the displaced window.
    pub fn window_end(&self) -> u64 {
        self.site + self.displaced_len as u64
    }

    /// The displaced instructions, `; `-separated, in Intel syntax.
    pub fn displaced_text(&self) -> String {
        intel_list(self.displaced.iter().map(|i| &i.instr))
    }
}

/// Everything planning needs, all of it borrowed.
pub struct PlanInput<'a> {
    pub func: &'a Function,
    pub info: &'a TargetInfo,
    /// Target bytes (for springboard padding around the function).
    pub read: ReadFn<'a>,
    pub symbols: &'a SymbolTable,
    /// Whether `[lo, hi)` overlaps text that is already patched (including the displaced
    /// window of a live splice) or a springboard in use.
    pub busy: &'a dyn Fn(u64, u64) -> bool,
    /// Where the trampoline will be (for jmp reach checks); `None` = assume reachable.
    pub trampoline_near: Option<u64>,
}

impl<'a> PlanInput<'a> {
    /// Planning over an object's own bytes with nothing spliced in it yet (what `trapctl
    /// inspect`, `points` and `cover` judge): no range is busy, the trampoline is taken to be in
    /// reach.
    pub fn unspliced(
        func: &'a Function,
        info: &'a TargetInfo,
        read: ReadFn<'a>,
        symbols: &'a SymbolTable,
    ) -> PlanInput<'a> {
        PlanInput {
            func,
            info,
            read,
            symbols,
            busy: &|_, _| false,
            trampoline_near: None,
        }
    }
}

/// Plan a splice of `mech` at `site`.
pub fn plan_splice(input: &PlanInput<'_>, site: u64, mech: Mechanism) -> Result<Plan, Refusal> {
    let plan = match mech {
        Mechanism::Trap => plan_trap(input, site),
        Mechanism::Jmp => plan_jmp(input, site),
    };
    match &plan {
        Ok(p) => log::debug!(
            "{mech} splice at {site:#x} in `{}`: patch {} bytes, displaces {} ({} bytes){}",
            input.func.name,
            p.patch_len,
            p.displaced_text(),
            p.displaced_len,
            p.springboard
                .as_ref()
                .map_or(String::new(), |s| format!(", springboard at {:#x}", s.addr))
        ),
        Err(e) => log::debug!("{mech} splice at {site:#x} refused: {e}"),
    }
    plan
}

/// A trap splice: 2 bytes.
pub fn plan_trap(input: &PlanInput<'_>, site: u64) -> Result<Plan, Refusal> {
    check_site(input.func, input.info, site)?;
    let (displaced, displaced_len) = check_window(input, site, TRAP_LEN, "a trap (int 0xF5)")?;
    Ok(Plan {
        site,
        mechanism: Mechanism::Trap,
        displaced,
        displaced_len,
        patch_len: TRAP_LEN,
        springboard: None,
    })
}

/// A jmp splice: `jmp rel32`, else `jmp rel8` to a springboard.
pub fn plan_jmp(input: &PlanInput<'_>, site: u64) -> Result<Plan, Refusal> {
    check_site(input.func, input.info, site)?;
    match plan_jmp_rel32(input, site) {
        Ok(p) => Ok(p),
        Err(e32) => plan_jmp_after_rel32(input, site, &e32),
    }
}

/// The springboard, once `jmp rel32` was refused for `e32` (named in the refusal when padding
/// is what is missing).
fn plan_jmp_after_rel32(input: &PlanInput<'_>, site: u64, e32: &Refusal) -> Result<Plan, Refusal> {
    log::debug!("jmp rel32 at {site:#x} impossible ({e32}); trying jmp rel8 to a springboard");
    match plan_jmp_springboard(input, site) {
        Ok(p) => Ok(p),
        Err(Refusal::NoRoomForJmp { reason, .. }) => Err(Refusal::NoRoomForJmp {
            site,
            reason: format!("jmp rel32: {e32}; jmp rel8 to a springboard: {reason}"),
        }),
        // The 2-byte window itself fails: the 5-byte one cannot do better.
        Err(e8) => Err(e8),
    }
}

/// What each mechanism can do at one site, as `trapctl inspect` and `bench`'s coverage report
/// it: a trap, a `jmp rel32`, and, only where `jmp rel32` is refused, `jmp rel8` to a
/// springboard (the same order a jmp splice tries them in).
#[derive(Clone, Debug)]
pub struct SiteVerdict {
    pub trap: Result<Plan, Refusal>,
    pub jmp_rel32: Result<Plan, Refusal>,
    /// `None` when `jmp rel32` is possible.
    pub jmp_springboard: Option<Result<Plan, Refusal>>,
}

impl SiteVerdict {
    /// Ask the planner about both mechanisms at `site`.
    pub fn judge(input: &PlanInput<'_>, site: u64) -> SiteVerdict {
        let trap = plan_trap(input, site);
        let jmp_rel32 = plan_jmp_rel32(input, site);
        let jmp_springboard = jmp_rel32
            .as_ref()
            .err()
            .map(|e32| plan_jmp_after_rel32(input, site, e32));
        SiteVerdict {
            trap,
            jmp_rel32,
            jmp_springboard,
        }
    }

    /// A jmp splice's plan or refusal (what [`plan_jmp`] answers).
    pub fn jmp(&self) -> Result<&Plan, &Refusal> {
        match (&self.jmp_rel32, &self.jmp_springboard) {
            (Ok(p), _) => Ok(p),
            (Err(_), Some(sb)) => sb.as_ref(),
            (Err(e), None) => Err(e),
        }
    }
}

/// A 5-byte `jmp rel32` splice only.
pub fn plan_jmp_rel32(input: &PlanInput<'_>, site: u64) -> Result<Plan, Refusal> {
    check_site(input.func, input.info, site)?;
    let (displaced, displaced_len) = check_window(input, site, JMP_REL32_LEN, "a jmp rel32")?;
    if let Some(t) = input.trampoline_near {
        if !reaches(site + JMP_REL32_LEN as u64, t, LAYOUT_MARGIN) {
            return Err(Refusal::OutOfReach {
                what: "a jmp rel32",
                from: site,
                to: t,
            });
        }
    }
    Ok(Plan {
        site,
        mechanism: Mechanism::Jmp,
        displaced,
        displaced_len,
        patch_len: JMP_REL32_LEN,
        springboard: None,
    })
}

/// A 2-byte `jmp rel8` to a springboard only.
pub fn plan_jmp_springboard(input: &PlanInput<'_>, site: u64) -> Result<Plan, Refusal> {
    check_site(input.func, input.info, site)?;
    let (displaced, displaced_len) = check_window(input, site, JMP_REL8_LEN, "a jmp rel8")?;
    let window_end = site + displaced_len as u64;
    let sb = springboard::find(input, site, window_end)
        .map_err(|reason| Refusal::NoRoomForJmp { site, reason })?;
    Ok(Plan {
        site,
        mechanism: Mechanism::Jmp,
        displaced,
        displaced_len,
        patch_len: JMP_REL8_LEN,
        springboard: Some(sb),
    })
}

/// Whether the function starts with an ftrace site that the kernel rewrites (after its
/// `endbr64` where the kernel has IBT).
pub fn has_fentry_site(func: &Function, info: &TargetInfo) -> bool {
    kernel_entry(func, info).is_some_and(|(endbr, end)| end - func.start > endbr)
}

/// The bytes at a kernel function's entry that the kernel owns: `[func.start, end)`, of which
/// the first `endbr` bytes are an `endbr64` (IBT: indirect calls land on it) or its sealed NOP,
/// and the rest the
/// ftrace site; `None` where there is neither (or the target is not a kernel).
pub fn kernel_entry(func: &Function, info: &TargetInfo) -> Option<(u64, u64)> {
    if !info.has_fentry {
        return None;
    }
    let mut insns = func.insns.iter().peekable();
    let mut end = func.start;
    let mut endbr = 0;
    if let Some(i) =
        insns.next_if(|i| i.addr == end && i.len == 4 && starts_with_endbr(func.insn_bytes(i)))
    {
        endbr = i.len as u64;
        end += endbr;
    }
    if insns
        .next_if(|i| {
            i.addr == end
                && i.len as u64 == FENTRY_LEN
                && (i.instr.is_call_near() || func.insn_bytes(i) == NOP5)
        })
        .is_some()
    {
        end += FENTRY_LEN;
    }
    (end > func.start).then_some((endbr, end))
}

/// Checks that depend on the site only.
fn check_site(func: &Function, info: &TargetInfo, site: u64) -> Result<(), Refusal> {
    if site < func.start || site >= func.end {
        return Err(Refusal::OutsideFunction {
            site,
            func: func.name.clone(),
            start: func.start,
            end: func.end,
        });
    }
    if let Some(from) = func.undecodable_from.filter(|&f| site >= f) {
        return Err(Refusal::Undecodable {
            site,
            func: func.name.clone(),
            from,
        });
    }
    if func.insn_index(site).is_none() {
        let before = func.insn_containing(site);
        return Err(Refusal::NotInstructionBoundary {
            site,
            func: func.name.clone(),
            nearest_before: before.map_or(func.start, |i| i.addr),
            insn: before.map_or_else(String::new, Insn::intel),
        });
    }
    if let Some((_, end)) = kernel_entry(func, info).filter(|&(_, end)| site < end) {
        return Err(Refusal::OverlapsFentry {
            site,
            func: func.name.clone(),
            entry: func.start,
            fentry_end: end,
        });
    }
    Ok(())
}

/// The displaced instructions of a `patch_len`-byte window at `site` (a checked boundary), or
/// why that window cannot be spliced.
fn check_window(
    input: &PlanInput<'_>,
    site: u64,
    patch_len: usize,
    what: &'static str,
) -> Result<(Vec<Insn>, usize), Refusal> {
    let func = input.func;
    let size = func.end - func.start;
    if size < patch_len as u64 {
        return Err(Refusal::FunctionTooShort {
            func: func.name.clone(),
            size,
            needed: patch_len,
            what,
        });
    }
    let first = func
        .insn_index(site)
        .ok_or_else(|| Refusal::NotInstructionBoundary {
            site,
            func: func.name.clone(),
            nearest_before: func.insn_containing(site).map_or(func.start, |i| i.addr),
            insn: String::new(),
        })?;
    let mut len = 0usize;
    let mut last = first;
    while len < patch_len {
        let Some(insn) = func.insns.get(last) else {
            // Saturating: the function may end in the last bytes of the address space.
            let window_end = site.saturating_add(patch_len as u64);
            return Err(match func.undecodable_from {
                Some(from) if from < window_end => Refusal::Undecodable {
                    site,
                    func: func.name.clone(),
                    from,
                },
                _ => Refusal::PastFunctionEnd {
                    site,
                    window_end,
                    func: func.name.clone(),
                    func_end: func.end,
                },
            });
        };
        len += insn.len;
        last += 1;
    }
    let window_end = site + len as u64;
    if let Some(&target) = func.branch_targets.range(site + 1..window_end).next() {
        if func.landing_pads.contains(&target) {
            log::debug!(
                "`{}`: the window at {site:#x} covers the landing pad at {target:#x}",
                func.name
            );
            let offset = target - func.start;
            return Err(Refusal::LandingPadInWindow {
                site,
                window_end,
                func: func.name.clone(),
                offset,
                pad: target,
            });
        }
        if let Some(&from) = func.outside_targets.get(&target) {
            let from_where = input
                .symbols
                .function_containing(from)
                .map_or_else(String::new, |s| {
                    format!(" ({}+{:#x})", s.name, from - s.addr)
                });
            return Err(Refusal::OutsideTargetInWindow {
                site,
                window_end,
                func: func.name.clone(),
                target,
                from,
                from_where,
            });
        }
        return Err(Refusal::BranchTargetInWindow {
            site,
            window_end,
            target,
        });
    }
    let block = func.block_of(site).ok_or(Refusal::PastFunctionEnd {
        site,
        window_end,
        func: func.name.clone(),
        func_end: func.end,
    })?;
    if window_end > block.end {
        let last_insn = func
            .insns
            .iter()
            .rev()
            .find(|i| i.end() == block.end)
            .map_or_else(String::new, Insn::intel);
        return Err(Refusal::WindowCrossesBlock {
            site,
            window_end,
            block_start: block.start,
            block_end: block.end,
            last: last_insn,
        });
    }
    if (input.busy)(site, window_end) {
        return Err(Refusal::AlreadyPatched {
            site,
            lo: site,
            hi: window_end,
        });
    }
    let displaced = func.insns[first..last].to_vec();
    // Relocatability, where the trampoline will be (or at the site itself: same reach).
    check_relocatable(&displaced, input.trampoline_near.unwrap_or(site))?;
    Ok((displaced, len))
}

#[cfg(test)]
pub(crate) mod tests;
