//! Planning tests over small hand-assembled images: which splices are possible where, what
//! they displace, and the refusals with their reasons.

use trapvec::{Symbol, SymbolKind, SymbolTable, TargetInfo};

use super::*;
use crate::analysis::analyze_function;
use crate::RefusalCause;

const BASE: u64 = 0x40_1000;

/// A text image: bytes from `BASE`, with function symbols over it.
struct Image {
    bytes: Vec<u8>,
    symbols: SymbolTable,
}

impl Image {
    /// `parts`: (name, bytes, is_function); each part follows the previous one.
    fn new(parts: &[(&str, &[u8], bool)]) -> Image {
        let mut bytes = Vec::new();
        let mut syms = Vec::new();
        for (name, b, is_fn) in parts {
            if *is_fn {
                syms.push(Symbol {
                    name: (*name).to_string(),
                    addr: BASE + bytes.len() as u64,
                    size: b.len() as u64,
                    kind: SymbolKind::Function,
                    origin: None,
                    version: None,
                });
            }
            bytes.extend_from_slice(b);
        }
        Image {
            bytes,
            symbols: SymbolTable::new(syms),
        }
    }

    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let off = usize::try_from(addr.checked_sub(BASE)?).ok()?;
        self.bytes
            .get(off..off.checked_add(len)?)
            .map(<[u8]>::to_vec)
    }

    fn func(&self, name: &str) -> Function {
        let s = self.symbols.lookup(name).unwrap();
        let b = self.read(s.addr, usize::try_from(s.size).unwrap()).unwrap();
        analyze_function(name, s.addr, &b).unwrap()
    }
}

/// A user-space target (red zone, vector registers saved); also used by other modules' tests.
pub(crate) fn user() -> TargetInfo {
    TargetInfo::user("test")
}

/// Kernel code whose handlers run in trampolines, as the planner's tests have always assumed.
fn kernel() -> TargetInfo {
    TargetInfo {
        dispatcher_runs_handlers: false,
        dispatcher_counts_hits: false,
        ..TargetInfo::kernel("test", trapvec::abi::TRAP_VECTOR)
    }
}

/// Plan with nothing busy and the trampoline reachable.
fn plan(
    img: &Image,
    name: &str,
    off: u64,
    mech: Mechanism,
    info: &TargetInfo,
) -> Result<Plan, Refusal> {
    plan_with(img, name, off, mech, info, &|_, _| false, None)
}

fn plan_with(
    img: &Image,
    name: &str,
    off: u64,
    mech: Mechanism,
    info: &TargetInfo,
    busy: &dyn Fn(u64, u64) -> bool,
    trampoline_near: Option<u64>,
) -> Result<Plan, Refusal> {
    let func = img.func(name);
    let read = |a: u64, l: usize| img.read(a, l);
    let input = PlanInput {
        func: &func,
        info,
        read: &read,
        symbols: &img.symbols,
        busy,
        trampoline_near,
    };
    plan_splice(&input, func.start + off, mech)
}

#[rustfmt::skip]
const FRAME_FN: &[u8] = &[
    /*00*/ 0x55,                         // push rbp
    /*01*/ 0x48, 0x89, 0xE5,             // mov rbp, rsp
    /*04*/ 0x8D, 0x47, 0x01,             // lea eax, [rdi+1]
    /*07*/ 0x5D,                         // pop rbp
    /*08*/ 0xC3,                         // ret
];

#[rustfmt::skip]
const XOR_RET: &[u8] = &[0x31, 0xC0, 0xC3]; // xor eax, eax; ret

const NEXT: &[u8] = &[0x31, 0xC0, 0xC3];

#[test]
fn trap_at_push_rbp_displaces_two_instructions() {
    let img = Image::new(&[("f", FRAME_FN, true)]);
    let p = plan(&img, "f", 0, Mechanism::Trap, &user()).unwrap();
    assert_eq!(
        (p.site, p.patch_len, p.displaced_len, p.springboard.clone()),
        (BASE, 2, 4, None)
    );
    assert_eq!(p.displaced_text(), "push rbp; mov rbp, rsp");
}

#[test]
fn trap_at_a_three_byte_instruction_displaces_only_it() {
    let img = Image::new(&[("f", FRAME_FN, true)]);
    let p = plan(&img, "f", 4, Mechanism::Trap, &user()).unwrap();
    assert_eq!(
        (p.displaced_len, p.displaced_text()),
        (3, "lea eax, [rdi+0x1]".to_string())
    );
}

#[test]
fn jmp_rel32_at_entry_displaces_whole_instructions() {
    let img = Image::new(&[("f", FRAME_FN, true)]);
    let p = plan(&img, "f", 0, Mechanism::Jmp, &user()).unwrap();
    assert_eq!(
        (p.patch_len, p.displaced_len, p.mechanism),
        (5, 7, Mechanism::Jmp)
    );
    assert_eq!(
        p.displaced_text(),
        "push rbp; mov rbp, rsp; lea eax, [rdi+0x1]"
    );
}

#[test]
fn site_inside_an_instruction_is_refused_naming_the_instruction() {
    let img = Image::new(&[("f", FRAME_FN, true)]);
    let err = plan(&img, "f", 2, Mechanism::Trap, &user()).unwrap_err();
    assert_eq!(
        err,
        Refusal::NotInstructionBoundary {
            site: BASE + 2,
            func: "f".into(),
            nearest_before: BASE + 1,
            insn: "mov rbp, rsp".into()
        }
    );
    assert!(
        err.to_string().contains("0x401002") && err.to_string().contains("mov rbp, rsp"),
        "{err}"
    );
    assert_eq!(err.cause(), RefusalCause::NotInstructionBoundary);
}

#[test]
fn site_outside_the_function_is_refused() {
    let img = Image::new(&[("f", FRAME_FN, true)]);
    let func = img.func("f");
    let read = |a: u64, l: usize| img.read(a, l);
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &img.symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    assert!(matches!(
        plan_splice(&input, BASE + 9, Mechanism::Trap),
        Err(Refusal::OutsideFunction { .. })
    ));
}

#[test]
fn one_byte_function_cannot_be_trapped_and_says_so() {
    let img = Image::new(&[("r", &[0xC3], true), ("next", NEXT, true)]);
    let err = plan(&img, "r", 0, Mechanism::Trap, &user()).unwrap_err();
    assert!(
        matches!(
            err,
            Refusal::FunctionTooShort {
                size: 1,
                needed: 2,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "function `r` is only 1 byte(s) long; a trap (int 0xF5) needs 2 bytes"
    );
    assert_eq!(err.cause(), RefusalCause::TooShort);
}

#[test]
fn short_function_traps_at_entry_but_jmp_rel32_is_refused_without_padding() {
    let img = Image::new(&[("z", XOR_RET, true), ("next", NEXT, true)]);
    let p = plan(&img, "z", 0, Mechanism::Trap, &user()).unwrap();
    assert_eq!(
        (p.displaced_len, p.displaced_text()),
        (2, "xor eax, eax".to_string())
    );

    let func = img.func("z");
    let read = |a: u64, l: usize| img.read(a, l);
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &img.symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    let e32 = plan_jmp_rel32(&input, BASE).unwrap_err();
    assert!(
        matches!(
            e32,
            Refusal::FunctionTooShort {
                size: 3,
                needed: 5,
                ..
            }
        ),
        "{e32:?}"
    );

    let err = plan(&img, "z", 0, Mechanism::Jmp, &user()).unwrap_err();
    let Refusal::NoRoomForJmp { site, reason } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*site, BASE);
    assert!(
        reason.contains("jmp rel32: function `z` is only 3 byte(s) long"),
        "{reason}"
    );
    assert!(reason.contains("no 5 bytes of padding"), "{reason}");
    assert_eq!(err.cause(), RefusalCause::NoRoomForJmp);
}

#[test]
fn short_function_gets_a_springboard_in_the_padding_after_it() {
    let pad = [0xCC; 13];
    let img = Image::new(&[
        ("z", XOR_RET, true),
        ("pad", &pad, false),
        ("next", NEXT, true),
    ]);
    let p = plan(&img, "z", 0, Mechanism::Jmp, &user()).unwrap();
    assert_eq!((p.patch_len, p.displaced_len), (2, 2));
    let sb = p.springboard.expect("springboard");
    assert_eq!(
        sb,
        Springboard {
            addr: BASE + 3,
            old: vec![0xCC; 5]
        }
    );
}

#[test]
fn springboard_uses_trailing_nops_after_the_final_ret_and_skips_busy_ones() {
    // Function whose size covers its trailing NOP padding (kallsyms style).
    #[rustfmt::skip]
    let f = [
        0x31, 0xC0,                                     // xor eax, eax
        0xC3,                                           // ret
        0x66, 0x0F, 0x1F, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, // nop word [rax+rax] (9 bytes)
        0x90, 0x90, 0x90, 0x90, 0x90, 0x90,             // six 1-byte nops
    ];
    let img = Image::new(&[("z", &f, true), ("next", NEXT, true)]);
    let p = plan(&img, "z", 0, Mechanism::Jmp, &user()).unwrap();
    assert_eq!(p.springboard.as_ref().unwrap().addr, BASE + 3);
    // With [BASE+3, BASE+8) in use, the next free 5 bytes that begin an instruction are taken:
    // not BASE+8, inside the 9-byte NOP (the module writes only at instruction boundaries).
    let busy = |lo: u64, hi: u64| lo < BASE + 8 && hi > BASE + 3;
    let p = plan_with(&img, "z", 0, Mechanism::Jmp, &user(), &busy, None).unwrap();
    assert_eq!(p.springboard.as_ref().unwrap().addr, BASE + 12);
    // Everything busy: refused, saying so.
    let busy = |lo: u64, hi: u64| lo >= BASE + 3 && hi <= BASE + 18;
    let err = plan_with(&img, "z", 0, Mechanism::Jmp, &user(), &busy, None).unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");
}

#[test]
fn springboard_may_be_in_the_previous_functions_padding() {
    #[rustfmt::skip]
    let prev = [0x31, 0xC0, 0xC3, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC, 0xCC]; // padding inside its extent
    let img = Image::new(&[
        ("prev", &prev, true),
        ("z", XOR_RET, true),
        ("next", NEXT, true),
    ]);
    let p = plan(&img, "z", 0, Mechanism::Jmp, &user()).unwrap();
    assert_eq!(
        p.springboard.unwrap().addr,
        BASE + 4,
        "closest 5 CC bytes before z"
    );
}

#[test]
fn gap_after_the_last_function_is_not_padding() {
    // No symbol after the CC bytes: they might not be text at all.
    let img = Image::new(&[("z", XOR_RET, true), ("tail", &[0xCC; 16], false)]);
    assert!(matches!(
        plan(&img, "z", 0, Mechanism::Jmp, &user()),
        Err(Refusal::NoRoomForJmp { .. })
    ));
}

#[test]
fn springboard_must_reach_the_trampoline() {
    let pad = [0xCC; 13];
    let img = Image::new(&[
        ("z", XOR_RET, true),
        ("pad", &pad, false),
        ("next", NEXT, true),
    ]);
    let far = BASE + 0x1_0000_0000;
    let err = plan_with(
        &img,
        "z",
        0,
        Mechanism::Jmp,
        &user(),
        &|_, _| false,
        Some(far),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("cannot reach the trampoline"),
        "{err}"
    );
}

#[test]
fn jmp_rel32_needs_the_trampoline_within_reach() {
    // The trampoline 3 GiB away: no rel32, and no padding for a springboard either; with the
    // trampoline near, rel32 is used.
    let img = Image::new(&[("f", FRAME_FN, true), ("next", NEXT, true)]);
    let err = plan_with(
        &img,
        "f",
        0,
        Mechanism::Jmp,
        &user(),
        &|_, _| false,
        Some(BASE + 0xC000_0000),
    )
    .unwrap_err();
    let Refusal::NoRoomForJmp { reason, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        reason.contains("jmp rel32: a jmp rel32 at 0x401000 cannot reach"),
        "{reason}"
    );
    let p = plan_with(
        &img,
        "f",
        0,
        Mechanism::Jmp,
        &user(),
        &|_, _| false,
        Some(BASE + 0x1000_0000),
    )
    .unwrap();
    assert_eq!(p.patch_len, 5);
}

#[test]
fn window_with_a_branch_target_inside_is_refused() {
    #[rustfmt::skip]
    let f = [
        /*00*/ 0x31, 0xC0,       // xor eax, eax
        /*02*/ 0xFF, 0xC0,       // inc eax          <- loop head
        /*04*/ 0x39, 0xF8,       // cmp eax, edi
        /*06*/ 0x7C, 0xFA,       // jl 0x02
        /*08*/ 0xC3,             // ret
    ];
    let img = Image::new(&[("l", &f, true)]);
    let err = plan(&img, "l", 0, Mechanism::Jmp, &user()).unwrap_err();
    // rel32 window [0, 6) holds target 2; rel8 window [0, 2) is fine but there's no padding.
    assert!(
        err.to_string()
            .contains("contains the branch target 0x401002"),
        "{err}"
    );
    // A trap at the loop head itself is fine: the target equals the site.
    let p = plan(&img, "l", 2, Mechanism::Trap, &user()).unwrap();
    assert_eq!(p.displaced_text(), "inc eax");
    // Traps at 0 are fine too (window [0, 2)).
    assert!(plan(&img, "l", 0, Mechanism::Trap, &user()).is_ok());
    let func = img.func("l");
    let read = |a: u64, l: usize| img.read(a, l);
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &img.symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    assert_eq!(
        plan_jmp_rel32(&input, BASE).unwrap_err(),
        Refusal::BranchTargetInWindow {
            site: BASE,
            window_end: BASE + 6,
            target: BASE + 2
        }
    );
    assert_eq!(
        plan_jmp_rel32(&input, BASE).unwrap_err().cause(),
        RefusalCause::BranchTargetInWindow
    );
}

#[test]
fn window_past_a_ret_crosses_the_block() {
    #[rustfmt::skip]
    let f = [0x31, 0xC0, 0xC3, 0x0F, 0x1F, 0x40, 0x00]; // xor; ret; nop dword [rax] (dead, inside the symbol)
    let img = Image::new(&[("z", &f, true)]);
    let func = img.func("z");
    let read = |a: u64, l: usize| img.read(a, l);
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &img.symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    let err = plan_jmp_rel32(&input, BASE).unwrap_err();
    assert_eq!(
        err,
        Refusal::WindowCrossesBlock {
            site: BASE,
            window_end: BASE + 7,
            block_start: BASE,
            block_end: BASE + 3,
            last: "ret".into()
        }
    );
    assert_eq!(err.cause(), RefusalCause::WindowCrossesBlock);
}

#[test]
fn window_running_past_the_function_end_is_refused() {
    let f = [0x48, 0x89, 0xF8, 0x90, 0xC3]; // mov rax, rdi; nop; ret
    let img = Image::new(&[("g", &f, true), ("next", NEXT, true)]);
    let func = img.func("g");
    let read = |a: u64, l: usize| img.read(a, l);
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &img.symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    assert_eq!(
        plan_jmp_rel32(&input, BASE + 3).unwrap_err(),
        Refusal::PastFunctionEnd {
            site: BASE + 3,
            window_end: BASE + 8,
            func: "g".into(),
            func_end: BASE + 5
        }
    );
}

#[test]
fn call_that_is_not_last_in_the_window_is_refused() {
    let f = [0xFF, 0xD0, 0x90, 0x90, 0x90, 0xC3]; // call rax; nop; nop; nop; ret
    let img = Image::new(&[("c", &f, true)]);
    let err = plan(&img, "c", 0, Mechanism::Jmp, &user()).unwrap_err();
    let Refusal::NoRoomForJmp { reason, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(reason.contains("would return to 0x401002"), "{reason}");
    // The trap's window is the call alone: fine.
    let p = plan(&img, "c", 0, Mechanism::Trap, &user()).unwrap();
    assert_eq!(p.displaced_text(), "call rax");
}

#[test]
fn syscall_in_the_window_is_unrelocatable() {
    let f = [0x0F, 0x05, 0xC3]; // syscall; ret
    let img = Image::new(&[("s", &f, true)]);
    let err = plan(&img, "s", 0, Mechanism::Trap, &user()).unwrap_err();
    assert!(
        matches!(&err, Refusal::Unrelocatable { addr, .. } if *addr == BASE),
        "{err:?}"
    );
    assert!(err.to_string().contains("`syscall` at 0x401000"), "{err}");
    assert_eq!(err.cause(), RefusalCause::SystemCall);
}

#[test]
fn already_patched_text_is_refused() {
    let img = Image::new(&[("f", FRAME_FN, true)]);
    let busy = |lo: u64, hi: u64| lo < BASE + 2 && hi > BASE + 1;
    let err = plan_with(&img, "f", 0, Mechanism::Trap, &user(), &busy, None).unwrap_err();
    assert_eq!(
        err,
        Refusal::AlreadyPatched {
            site: BASE,
            lo: BASE,
            hi: BASE + 4
        }
    );
    assert_eq!(err.cause(), RefusalCause::AlreadyPatched);
}

#[rustfmt::skip]
const TRACED: &[u8] = &[
    /*00*/ 0xE8, 0x00, 0x00, 0x00, 0x00, // call __fentry__
    /*05*/ 0x55,                         // push rbp
    /*06*/ 0x48, 0x89, 0xFA,             // mov rdx, rdi
    /*09*/ 0x5D,                         // pop rbp
    /*0a*/ 0xC3,                         // ret
];

#[test]
fn kernel_fentry_site_is_refused_and_entry_plus_5_displaces_two_instructions() {
    let img = Image::new(&[("tcp_sync_mss", TRACED, true)]);
    let err = plan(&img, "tcp_sync_mss", 0, Mechanism::Trap, &kernel()).unwrap_err();
    assert_eq!(
        err,
        Refusal::OverlapsFentry {
            site: BASE,
            func: "tcp_sync_mss".into(),
            entry: BASE,
            fentry_end: BASE + 5
        }
    );
    let p = plan(&img, "tcp_sync_mss", 5, Mechanism::Trap, &kernel()).unwrap();
    assert_eq!(p.displaced_text(), "push rbp; mov rdx, rdi");
    // In user space the same call is an ordinary first instruction.
    let p = plan(&img, "tcp_sync_mss", 0, Mechanism::Trap, &user()).unwrap();
    assert_eq!(p.displaced_len, 5);
    // The NOP form of the site counts too.
    let mut nop = TRACED.to_vec();
    nop[..5].copy_from_slice(&crate::point::NOP5);
    let img = Image::new(&[("t", &nop, true)]);
    assert!(matches!(
        plan(&img, "t", 3, Mechanism::Trap, &kernel()),
        Err(Refusal::NotInstructionBoundary { .. })
    ));
    assert!(matches!(
        plan(&img, "t", 0, Mechanism::Jmp, &kernel()),
        Err(Refusal::OverlapsFentry { .. })
    ));
}

#[test]
fn undecodable_part_is_refused_in_lenient_analysis() {
    let f = [0x55, 0x48, 0x89, 0xE5, 0x06, 0xC3];
    let func = crate::analysis::analyze_function_with(
        "u",
        BASE,
        &f,
        &crate::AnalysisOptions {
            read: None,
            lenient: true,
            object_targets: None,
        },
    )
    .unwrap();
    let syms = SymbolTable::new(vec![]);
    let read = |_: u64, _: usize| None;
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &syms,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    assert_eq!(
        plan_splice(&input, BASE + 4, Mechanism::Trap).unwrap_err(),
        Refusal::Undecodable {
            site: BASE + 4,
            func: "u".into(),
            from: BASE + 4
        }
    );
    assert_eq!(
        plan_jmp_rel32(&input, BASE + 1).unwrap_err(),
        Refusal::Undecodable {
            site: BASE + 1,
            func: "u".into(),
            from: BASE + 4
        }
    );
    assert!(plan_splice(&input, BASE, Mechanism::Trap).is_ok());
}

#[test]
fn mechanism_names_round_trip() {
    assert_eq!("trap".parse::<Mechanism>().unwrap(), Mechanism::Trap);
    assert_eq!(Mechanism::Jmp.to_string(), "jmp");
    assert!("int3".parse::<Mechanism>().is_err());
}

#[test]
fn jmp_at_the_top_of_the_address_space_looks_for_a_springboard_without_overflowing() {
    // Found by the fuzzer (fuzz/regressions/analysis): the springboard search computed the end
    // of rel8 reach past 2^64. A function in the last bytes of the address space: `mov eax,
    // [rcx]; ret` leaves no room for a jmp rel32, and the reach above the site is clipped.
    let start = u64::MAX - 0x20;
    let bytes = [0x8B, 0x01, 0xC3];
    let func = analyze_function("top", start, &bytes).unwrap();
    // `last` follows after 13 bytes of int3 padding, and ends 12 bytes before 2^64.
    let sym = |name: &str, addr: u64, size: u64| Symbol {
        name: name.into(),
        addr,
        size,
        kind: SymbolKind::Function,
        origin: None,
        version: None,
    };
    let symbols = SymbolTable::new(vec![sym("top", start, 3), sym("last", start + 0x10, 4)]);
    let read = |a: u64, l: usize| -> Option<Vec<u8>> {
        (a >= start + 3 && a.checked_add(l as u64)? <= start + 0x10).then(|| vec![0xCC; l])
    };
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    let p = plan_splice(&input, start, Mechanism::Jmp).unwrap();
    let sb = p
        .springboard
        .expect("a jmp rel8 to a springboard in the int3 padding");
    assert_eq!(
        (sb.addr, sb.old),
        (start + 3, vec![0xCC; 5]),
        "the padding right after the function"
    );
}

#[test]
fn jmp_rel32_window_past_the_top_of_the_address_space_is_refused_as_past_the_function_end() {
    // Found by the fuzzer (fuzz/regressions/analysis): the window end of a 5-byte jmp at a
    // site 3 bytes before 2^64 overflowed. The function `nop` ×5, `ret` ends at 2^64 - 1.
    let start = u64::MAX - 6;
    let func = analyze_function("top", start, &[0x90, 0x90, 0x90, 0x90, 0x90, 0xC3]).unwrap();
    let symbols = SymbolTable::new(vec![]);
    let read = |_: u64, _: usize| -> Option<Vec<u8>> { None };
    let input = PlanInput {
        func: &func,
        info: &user(),
        read: &read,
        symbols: &symbols,
        busy: &|_, _| false,
        trampoline_near: None,
    };
    let err = plan_jmp_rel32(&input, start + 3).unwrap_err();
    assert_eq!(
        err,
        Refusal::PastFunctionEnd {
            site: start + 3,
            window_end: u64::MAX,
            func: "top".into(),
            func_end: u64::MAX
        }
    );
}
