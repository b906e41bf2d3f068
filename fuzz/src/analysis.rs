//! The instruction analysis: function bytes at an address, a site in them, through decode, CFG,
//! trap and jmp planning, relocation and the trampolines. Every refusal is a sentence; a plan
//! displaces whole instructions from the site, inside the function, whose bytes re-decode to
//! the plan's instructions; a jmp's bytes have the plan's patch length.
//!
//! Input: a flags byte (lenient decoding, the kind of address, the kind of target, whether the
//! trampoline's place is known), 8 bytes of address, a site byte, then the function's bytes.

use iced_x86::{Decoder, DecoderOptions};
use instr_manager::trampoline::{
    emit_call_trampoline, emit_replay, jmp_bytes, springboard_bytes, CallTrampoline,
};
use instr_manager::{
    analyze_function_with, plan_splice, relocate, AnalysisOptions, Function, Mechanism, Plan,
    PlanInput,
};
use trapvec::{Symbol, SymbolKind, SymbolTable, TargetInfo};

use crate::{assert_sentence, Bytes};

/// Padding (int3) readable on either side of the function, for springboards.
const PAD: u64 = 64;
/// Longest function tried.
const MAX_LEN: usize = 4096;

fn info(kernel: bool) -> TargetInfo {
    TargetInfo::for_code(kernel, "fuzz")
}

pub fn run(data: &[u8]) {
    let mut b = Bytes(data);
    let flags = b.u8();
    let raw = b.u64();
    let site_sel = b.u8();
    let bytes = b.rest();
    let bytes = &bytes[..bytes.len().min(MAX_LEN)];
    let start = match (flags >> 1) & 3 {
        0 => 0x40_0000 + (raw & 0xff_ffff),
        1 => 0xffff_ffff_8100_0000 + (raw & 0xff_ffff),
        2 => raw,
        _ => u64::MAX - (raw & 0xffff),
    };
    let lenient = flags & 1 != 0;
    let info = info(flags & 8 != 0);

    // The function with int3 padding around it, as a linker lays functions out.
    let lo = start.saturating_sub(PAD);
    let read = move |addr: u64, len: usize| -> Option<Vec<u8>> {
        let end = addr.checked_add(len as u64)?;
        let fn_end = start.checked_add(bytes.len() as u64)?;
        if addr < lo || end > fn_end.saturating_add(PAD) {
            return None;
        }
        Some(
            (addr..end)
                .map(|a| {
                    if a >= start && a < fn_end {
                        bytes[usize::try_from(a - start).expect("small")]
                    } else {
                        0xCC
                    }
                })
                .collect(),
        )
    };
    let opts = AnalysisOptions {
        read: Some(&read),
        lenient,
        object_targets: None,
    };
    let func = match analyze_function_with("f", start, bytes, &opts) {
        Ok(f) => f,
        Err(e) => return assert_sentence("analysis", &trapvec::error_chain(&e)),
    };
    check_function(&func, bytes);
    if func.insns.is_empty() {
        return;
    }

    let site = if site_sel & 0x80 != 0 {
        start.wrapping_add(u64::from(site_sel & 0x7f))
    } else {
        func.insns[usize::from(site_sel) % func.insns.len()].addr
    };
    let symbols = SymbolTable::new(vec![Symbol {
        name: "f".into(),
        addr: start,
        size: bytes.len() as u64,
        kind: SymbolKind::Function,
        origin: None,
        version: None,
    }]);
    let tramp = site.wrapping_add(0x10_0000) & !0xf;
    let input = PlanInput {
        func: &func,
        info: &info,
        read: &read,
        symbols: &symbols,
        busy: &|_, _| false,
        trampoline_near: (flags & 16 != 0).then_some(tramp),
    };
    for mech in [Mechanism::Trap, Mechanism::Jmp] {
        match plan_splice(&input, site, mech) {
            Ok(plan) => check_plan(&func, &plan, &info, tramp),
            Err(e) => assert_sentence("plan", &trapvec::error_chain(&e)),
        }
    }
}

/// The decoded instructions tile `[start, undecodable or end)`; blocks cover them.
fn check_function(func: &Function, bytes: &[u8]) {
    let mut at = func.start;
    for i in &func.insns {
        assert_eq!(i.addr, at, "instructions are not contiguous at {at:#x}");
        at = i.end();
    }
    let stop = func.undecodable_from.unwrap_or(func.end);
    assert_eq!(
        at, stop,
        "the instructions end at {at:#x}, not at {stop:#x}"
    );
    assert_eq!(func.bytes, bytes);
    for blk in &func.blocks {
        assert!(
            blk.start < blk.end && blk.start >= func.start && blk.end <= func.end,
            "block [{:#x}, {:#x}) outside the function",
            blk.start,
            blk.end
        );
    }
}

fn check_plan(func: &Function, plan: &Plan, info: &TargetInfo, tramp: u64) {
    let site = plan.site;
    assert!(
        !plan.displaced.is_empty(),
        "a plan at {site:#x} displaces nothing"
    );
    let mut at = site;
    for i in &plan.displaced {
        assert_eq!(
            i.addr, at,
            "displaced instructions are not contiguous from the site {site:#x}"
        );
        at = i.end();
    }
    assert_eq!(
        at - site,
        plan.displaced_len as u64,
        "displaced_len does not match the displaced instructions"
    );
    assert!(
        plan.displaced_len >= plan.patch_len,
        "the plan at {site:#x} displaces {} bytes for a {}-byte patch",
        plan.displaced_len,
        plan.patch_len
    );
    assert!(
        site >= func.start && plan.window_end() <= func.end,
        "the window of {site:#x} leaves the function"
    );

    // The displaced bytes re-decode to the displaced instructions.
    let off = usize::try_from(site - func.start).expect("inside the function");
    let window = &func.bytes[off..off + plan.displaced_len];
    let mut dec = Decoder::with_ip(64, window, site, DecoderOptions::NONE);
    for want in &plan.displaced {
        let got = dec.decode();
        assert!(
            !got.is_invalid()
                && got == want.instr
                && got.ip() == want.addr
                && got.len() == want.len,
            "the displaced bytes at {:#x} re-decode to `{got}`, not `{}`",
            want.addr,
            want.instr
        );
    }
    assert!(
        !dec.can_decode(),
        "the displaced bytes hold more than the displaced instructions"
    );

    let sentence_or = |what: &str, r: Result<Vec<u8>, instr_manager::Refusal>| match r {
        Ok(code) => assert!(!code.is_empty(), "{what} at {site:#x}: no code"),
        Err(e) => assert_sentence(what, &trapvec::error_chain(&e)),
    };
    sentence_or("relocate", relocate(&plan.displaced, tramp));
    sentence_or("replay", emit_replay(plan, tramp));
    let t = CallTrampoline {
        addr: tramp,
        site,
        handler: tramp + 0x1000,
        cookie: 7,
        hits: tramp + 0x2000,
        inflight: tramp + 0x2008,
    };
    sentence_or("call trampoline", emit_call_trampoline(&t, plan, info));
    if plan.mechanism == Mechanism::Jmp {
        match jmp_bytes(plan, tramp) {
            Ok(j) => assert_eq!(
                j.len(),
                plan.patch_len,
                "the jmp at {site:#x} is {} bytes, the plan patches {}",
                j.len(),
                plan.patch_len
            ),
            Err(e) => assert_sentence("jmp", &trapvec::error_chain(&e)),
        }
        if let Some(sb) = &plan.springboard {
            assert_eq!(sb.old.len(), 5, "a springboard overwrites 5 bytes");
            if let Err(e) = springboard_bytes(sb, tramp) {
                assert_sentence("springboard", &trapvec::error_chain(&e));
            }
        }
    }
}
