//! Finding a springboard: 5 bytes of padding within `jmp rel8` reach of a site (the rel8 is
//! measured from `site + 2`, so the springboard starts in `[site + 2 - 128, site + 2 + 127]`),
//! belonging to no function's code, not in use, and within rel32 reach of the trampoline.
//!
//! Padding (see [`crate::analysis::padding`]) is looked for in
//! - the function's own dead `int3`/NOP runs after a `ret`/`jmp`,
//! - the dead runs of the neighbouring functions that overlap the reach (read and decoded),
//! - the gaps between function extents, from one function's end up to the next function symbol.
//!
//! A springboard starts on an instruction boundary of the padding (every byte of an `int3` run,
//! the first byte of each NOP of a NOP run: Debian's kernel pads with multi-byte NOPs), as the
//! module checks every patch it writes; the candidate closest to the site wins.

use iced_x86::{Decoder, DecoderOptions, Instruction};
use trapvec::Symbol;

use super::PlanInput;
use crate::analysis::padding::gap_padding;
use crate::analysis::{analyze_function_with, AnalysisOptions};
use crate::relocate::{reaches, LAYOUT_MARGIN};
use crate::Springboard;

/// Length of a springboard (`jmp rel32`).
pub const SPRINGBOARD_LEN: u64 = 5;
/// Neighbouring functions larger than this are not decoded for inner padding.
const MAX_NEIGHBOUR: u64 = 64 * 1024;

/// Padding ranges overlapping `[lo, hi)` around the function of `input`, merged, each starting
/// where its first padding instruction does (not clipped to `lo`, so that the instructions in
/// it can be decoded from its start) and ending at most at `hi`.
pub fn padding_near(input: &PlanInput<'_>, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let func = input.func;
    let mut ranges = func.padding_runs();

    // Function extents that may matter: those starting up to MAX_NEIGHBOUR before `lo`.
    let mut fns: Vec<(u64, u64, Option<&Symbol>)> = vec![(func.start, func.end, None)];
    for s in input
        .symbols
        .functions_in(lo.saturating_sub(MAX_NEIGHBOUR), hi)
    {
        if s.addr == func.start {
            continue;
        }
        let extent = input.symbols.function_extent(s);
        fns.push((s.addr, s.addr.saturating_add(extent), Some(s)));
    }
    fns.sort_by_key(|f| f.0);
    fns.dedup_by_key(|f| f.0);

    for (i, &(start, end, sym)) in fns.iter().enumerate() {
        // The neighbour's own dead runs.
        if let Some(sym) = sym {
            let extent = end - start;
            if end > lo && start < hi && extent > 0 && extent <= MAX_NEIGHBOUR {
                if let Some(bytes) = usize::try_from(extent)
                    .ok()
                    .and_then(|n| (input.read)(start, n))
                {
                    let opts = AnalysisOptions {
                        read: None,
                        lenient: true,
                        object_targets: None,
                    };
                    if let Ok(f) = analyze_function_with(&sym.name, start, &bytes, &opts) {
                        ranges.extend(f.padding_runs());
                    }
                }
            }
        }
        // The gap after it, up to the next function symbol.
        let next_start = match fns.get(i + 1) {
            Some(n) => Some(n.0),
            None => input
                .symbols
                .functions_in(end, u64::MAX)
                .find(|s| s.addr >= end)
                .map(|s| s.addr),
        };
        let Some(next_start) = next_start else {
            continue;
        };
        if end < next_start && end < hi && next_start > lo {
            let gap_end = next_start.min(hi);
            let Ok(len) = usize::try_from(gap_end - end) else {
                continue;
            };
            if let Some(bytes) = (input.read)(end, len) {
                if let Some(r) = gap_padding(end, &bytes) {
                    ranges.push(r);
                }
            }
        }
    }

    ranges.retain(|&(a, b)| b > lo && a < hi);
    for r in &mut ranges {
        r.1 = r.1.min(hi);
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.0 <= last.1 => last.1 = last.1.max(r.1),
            _ => merged.push(r),
        }
    }
    merged
}

/// Find a springboard for a `jmp rel8` at `site` whose displaced window ends at `window_end`;
/// `Err` says why there is none.
pub(crate) fn find(
    input: &PlanInput<'_>,
    site: u64,
    window_end: u64,
) -> Result<Springboard, String> {
    // Saturating: a site in the last bytes of the address space has less reach above it, not
    // an overflow.
    let from = site.saturating_add(2);
    let lo = from.saturating_sub(128);
    let last_start = from.saturating_add(127);
    let hi = last_start.saturating_add(SPRINGBOARD_LEN);
    let ranges = padding_near(input, lo, hi);
    if ranges
        .iter()
        .all(|&(a, b)| b.saturating_sub(a.max(lo)) < SPRINGBOARD_LEN)
    {
        return Err(format!(
            "no 5 bytes of padding (int3/NOP runs outside any function or after a ret/jmp) within rel8 reach [{lo:#x}, {hi:#x})"
        ));
    }
    let mut best: Option<(u64, u64)> = None;
    let (mut busy, mut far) = (0usize, 0usize);
    for &(a, b) in &ranges {
        let Some(bytes) = usize::try_from(b - a).ok().and_then(|n| (input.read)(a, n)) else {
            continue;
        };
        let mut decoder = Decoder::with_ip(64, &bytes, a, DecoderOptions::NONE);
        let mut instr = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut instr);
            if instr.is_invalid() {
                break;
            }
            let sb = instr.ip();
            if sb < lo {
                continue;
            }
            if sb.checked_add(SPRINGBOARD_LEN).is_none_or(|e| e > b) || sb > last_start {
                break;
            }
            let overlaps_window = sb < window_end && sb + SPRINGBOARD_LEN > site;
            if !overlaps_window {
                if (input.busy)(sb, sb + SPRINGBOARD_LEN) {
                    busy += 1;
                } else if input
                    .trampoline_near
                    .is_some_and(|t| !reaches(sb + SPRINGBOARD_LEN, t, LAYOUT_MARGIN))
                {
                    far += 1;
                } else {
                    let dist = sb.abs_diff(site);
                    if best.is_none_or(|(d, _)| dist < d) {
                        best = Some((dist, sb));
                    }
                }
            }
        }
    }
    let Some((_, addr)) = best else {
        return Err(if far > 0 {
            format!("the padding within rel8 reach [{lo:#x}, {hi:#x}) cannot reach the trampoline by rel32")
        } else if busy > 0 {
            format!("all padding within rel8 reach [{lo:#x}, {hi:#x}) is already used by patches or springboards")
        } else {
            format!("no 5 bytes of padding within rel8 reach [{lo:#x}, {hi:#x}) outside the displaced window")
        });
    };
    let old = (input.read)(addr, 5)
        .filter(|b| b.len() == 5)
        .ok_or_else(|| format!("cannot read the padding at {addr:#x}"))?;
    log::debug!(
        "springboard for {site:#x} at {addr:#x} (padding {})",
        trapvec::error::hex(&old)
    );
    Ok(Springboard { addr, old })
}
