//! Trampoline tests: decode what was emitted and compare the instruction sequence (Intel syntax,
//! absolute targets) with the documented one; check rel32/imm64 values; and run one trampoline
//! for real in this process.

use iced_x86::{Code, Decoder, DecoderOptions, Instruction};
use trapvec::abi::TrapvecRegs;

use super::*;
use crate::analysis::{intel, Insn};
use crate::plan::Mechanism;

const SITE: u64 = 0x40_1000;
const TRAMP: u64 = 0x5000_0000;
const HITS: u64 = TRAMP + 0x2000;
const INFLIGHT: u64 = TRAMP + 0x2008;
const HANDLER: u64 = TRAMP + 0x10_0000;
const COOKIE: u64 = 0xdead_beef_cafe;

fn decode(bytes: &[u8], addr: u64) -> Vec<Instruction> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        out.push(d.decode());
    }
    out
}

fn listing(bytes: &[u8], addr: u64) -> Vec<String> {
    decode(bytes, addr).iter().map(intel).collect()
}

fn plan_for(bytes: &[u8], site: u64, patch_len: usize) -> Plan {
    let displaced: Vec<Insn> = decode(bytes, site)
        .into_iter()
        .map(|i| Insn {
            addr: i.ip(),
            len: i.len(),
            instr: i,
        })
        .collect();
    let displaced_len = displaced.iter().map(|i| i.len).sum();
    Plan {
        site,
        mechanism: Mechanism::Trap,
        displaced,
        displaced_len,
        patch_len,
        springboard: None,
    }
}

fn info(user: bool) -> TargetInfo {
    TargetInfo::for_code(!user, "test")
}

fn tramp() -> CallTrampoline {
    CallTrampoline {
        addr: TRAMP,
        site: SITE,
        handler: HANDLER,
        cookie: COOKIE,
        hits: HITS,
        inflight: INFLIGHT,
    }
}

/// The documented sequence, with `call` and the tail given.
fn expected(rz: u32, xmm: bool, call: &[String], tail: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    if rz > 0 {
        v.push(format!("lea rsp, [rsp-{rz:#x}]"));
    }
    v.push("pushfq".into());
    v.push(format!("lock inc qword ptr [{HITS:#x}]"));
    v.push(format!("lock inc qword ptr [{INFLIGHT:#x}]"));
    v.push("lea rsp, [rsp-0x10]".into());
    for r in [
        "rax", "rcx", "rdx", "rbx", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
        "r14", "r15",
    ] {
        v.push(format!("push {r}"));
    }
    v.push(format!("mov rax, {SITE:#x}"));
    v.push("mov [rsp+0x80], rax".into());
    v.push(format!("lea rax, [rsp+{:#x}]", 144 + rz));
    v.push("mov [rsp+0x78], rax".into());
    v.push("mov rbx, rsp".into());
    v.push("and rsp, 0xfffffffffffffff0".into());
    let xmm_slot = |i: u32| {
        if i == 0 {
            "[rsp]".to_string()
        } else {
            format!("[rsp+{:#x}]", 16 * i)
        }
    };
    if xmm {
        v.push("sub rsp, 0x100".into());
        for i in 0..16 {
            v.push(format!("movdqa {}, xmm{i}", xmm_slot(i)));
        }
    }
    v.push("cld".into());
    v.push("mov rdi, rbx".into());
    v.push(format!("mov rsi, {COOKIE:#x}"));
    v.extend(call.iter().cloned());
    if xmm {
        for i in 0..16 {
            v.push(format!("movdqa xmm{i}, {}", xmm_slot(i)));
        }
    }
    v.push("mov rsp, rbx".into());
    for r in [
        "r15", "r14", "r13", "r12", "r11", "r10", "r9", "r8", "rdi", "rsi", "rbp", "rbx", "rdx",
        "rcx", "rax",
    ] {
        v.push(format!("pop {r}"));
    }
    v.push("lea rsp, [rsp+0x10]".into());
    v.push(format!("lock dec qword ptr [{INFLIGHT:#x}]"));
    v.push("popfq".into());
    if rz > 0 {
        v.push(format!("lea rsp, [rsp+{rz:#x}]"));
    }
    v.extend(tail.iter().map(|s| (*s).to_string()));
    v
}

#[test]
fn frame_offsets_match_struct_trapvec_regs() {
    use std::mem::offset_of;
    assert_eq!(offset_of!(TrapvecRegs, r15), 0);
    assert_eq!(offset_of!(TrapvecRegs, rax), 112);
    assert_eq!(
        offset_of!(TrapvecRegs, rsp),
        usize::try_from(RSP_SLOT).unwrap()
    );
    assert_eq!(
        offset_of!(TrapvecRegs, rip),
        usize::try_from(RIP_SLOT).unwrap()
    );
    assert_eq!(offset_of!(TrapvecRegs, rflags), 136);
    assert_eq!(
        std::mem::size_of::<TrapvecRegs>(),
        usize::try_from(FRAME).unwrap()
    );
    assert_eq!(PUSH_ORDER.len() * 8, offset_of!(TrapvecRegs, rsp));
}

#[test]
fn user_space_call_trampoline_is_the_documented_sequence() {
    // push rbp; mov rbp, rsp displaced by a trap at SITE.
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let out = emit_call_trampoline(&tramp(), &plan, &info(true)).unwrap();
    let want = expected(
        128,
        true,
        &[format!("call {HANDLER:#x}")],
        &["push rbp", "mov rbp, rsp", "jmp 0x401004"],
    );
    assert_eq!(listing(&out, TRAMP), want);
    // imm64 forms for the site and the cookie, rel32 call and jmp.
    let d = decode(&out, TRAMP);
    let imm64: Vec<u64> = d
        .iter()
        .filter(|i| i.code() == Code::Mov_r64_imm64)
        .map(Instruction::immediate64)
        .collect();
    assert_eq!(imm64, vec![SITE, COOKIE]);
    let call = d.iter().find(|i| i.is_call_near()).unwrap();
    assert_eq!(
        (call.code(), call.near_branch_target()),
        (Code::Call_rel32_64, HANDLER)
    );
    let back = d.last().unwrap();
    assert_eq!(
        (back.code(), back.near_branch_target()),
        (Code::Jmp_rel32_64, SITE + 4)
    );
}

#[test]
fn trampolines_sharing_a_prelude_template_each_get_their_own_values() {
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let second = CallTrampoline {
        addr: TRAMP + 0x4_0000,
        site: SITE + 0x20,
        handler: HANDLER + 0x30,
        cookie: 7,
        hits: HITS + 0x10,
        inflight: INFLIGHT + 0x10,
    };
    for t in [tramp(), second, tramp()] {
        let out = emit_call_trampoline(&t, &plan, &info(true)).unwrap();
        let d = decode(&out, t.addr);
        let counters: Vec<u64> = d
            .iter()
            .filter(|i| i.has_lock_prefix())
            .map(Instruction::ip_rel_memory_address)
            .collect();
        assert_eq!(counters, vec![t.hits, t.inflight, t.inflight]);
        let imm64: Vec<u64> = d
            .iter()
            .filter(|i| i.code() == Code::Mov_r64_imm64)
            .map(Instruction::immediate64)
            .collect();
        assert_eq!(imm64, vec![t.site, t.cookie]);
        assert_eq!(
            d.iter()
                .find(|i| i.is_call_near())
                .unwrap()
                .near_branch_target(),
            t.handler
        );
        assert_eq!(
            d.last().unwrap().near_branch_target(),
            SITE + 4,
            "the jmp back goes to the plan's window end"
        );
    }
}

#[test]
fn kernel_call_trampoline_has_no_red_zone_step_and_no_vector_saves() {
    let plan = plan_for(&[0x53, 0xE8, 0x00, 0x10, 0x00, 0x00], SITE, 2); // push rbx; call +0x1000
    let out = emit_call_trampoline(&tramp(), &plan, &info(false)).unwrap();
    let ret = SITE + 6;
    let want = expected(
        0,
        false,
        &[format!("call {HANDLER:#x}")],
        &[
            "push rbx",
            "lea rsp, [rsp-0x8]",
            &format!("mov dword ptr [rsp], {ret:#x}"),
            "mov dword ptr [rsp+0x4], 0x0",
            &format!("jmp {:#x}", SITE + 6 + 0x1000),
            &format!("jmp {ret:#x}"),
        ],
    );
    assert_eq!(listing(&out, TRAMP), want);
}

#[test]
fn far_handler_is_called_through_rax() {
    let far = 0x7fff_0000_0000;
    let t = CallTrampoline {
        handler: far,
        ..tramp()
    };
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let out = emit_call_trampoline(&t, &plan, &info(false)).unwrap();
    let want = expected(
        0,
        false,
        &[format!("mov rax, {far:#x}"), "call rax".into()],
        &["push rbp", "mov rbp, rsp", "jmp 0x401004"],
    );
    assert_eq!(listing(&out, TRAMP), want);
}

#[test]
fn counters_out_of_rip_relative_reach_are_refused() {
    let t = CallTrampoline {
        hits: TRAMP + 0x1_0000_0000,
        ..tramp()
    };
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let err = emit_call_trampoline(&t, &plan, &info(true)).unwrap_err();
    assert_eq!(
        err,
        Refusal::OutOfReach {
            what: "a call trampoline's counter",
            from: TRAMP,
            to: TRAMP + 0x1_0000_0000
        }
    );
}

#[test]
fn replay_is_relocated_displaced_then_jump_back() {
    // mov rax, [rip+0x100] at SITE: the replay must still read SITE+7+0x100.
    let plan = plan_for(&[0x48, 0x8B, 0x05, 0x00, 0x01, 0x00, 0x00], SITE, 5);
    let out = emit_replay(&plan, TRAMP).unwrap();
    assert_eq!(
        listing(&out, TRAMP),
        vec![
            format!("mov rax, [{:#x}]", SITE + 7 + 0x100),
            format!("jmp {:#x}", SITE + 7)
        ]
    );
}

/// A relocated branch goes to its target from wherever its copy is placed, however many copies of
/// the same shape were encoded before: a count site's replay is encoded at a trial address to
/// size it and again at its block (a jcc rel32 of x64_sys_call sent every system call 0x188e000
/// below its target in the guest, the distance from the data arena to the code arena).
#[test]
fn replayed_branches_reach_their_targets_from_every_copy() {
    // jne rel32 +0x200, jmp rel32 +0x300, call rel32 +0x400, jb rel8 +0x10 at SITE.
    let cases: [&[u8]; 4] = [
        &[0x0F, 0x85, 0x00, 0x02, 0x00, 0x00],
        &[0xE9, 0x00, 0x03, 0x00, 0x00],
        &[0xE8, 0x00, 0x04, 0x00, 0x00],
        &[0x72, 0x10],
    ];
    for code in cases {
        let plan = plan_for(code, SITE, 2);
        let end = SITE + code.len() as u64;
        let target = {
            let mut d = iced_x86::Decoder::with_ip(64, code, SITE, iced_x86::DecoderOptions::NONE);
            d.decode().near_branch_target()
        };
        for at in [TRAMP, TRAMP + 0x188_e000, TRAMP + 0x40, TRAMP] {
            let out = emit_replay(&plan, at).unwrap();
            // The relocated branch (a call becomes a push of its return address and a jmp).
            let targets: Vec<u64> =
                iced_x86::Decoder::with_ip(64, &out, at, iced_x86::DecoderOptions::NONE)
                    .into_iter()
                    .map(|i| i.near_branch_target())
                    .filter(|&t| t != 0)
                    .collect();
            assert_eq!(
                targets,
                [target, end],
                "{code:02x?} replayed at {at:#x}: {:?}",
                listing(&out, at)
            );
            assert_eq!(listing(&out, at).last().unwrap(), &format!("jmp {end:#x}"));
        }
    }
}

#[test]
fn indirect_stub_near_and_far_slot() {
    let out = emit_indirect_stub(TRAMP, HITS);
    assert_eq!(out.len(), 6);
    assert_eq!(
        listing(&out, TRAMP),
        vec![format!("jmp qword ptr [{HITS:#x}]")]
    );
    let far = 0x7fff_1234_0000;
    let out = emit_indirect_stub(TRAMP, far);
    assert_eq!(
        listing(&out, TRAMP),
        vec![
            "lea rsp, [rsp-0x80]".to_string(),
            "push rax".into(),
            "push rax".into(),
            format!("mov rax, {far:#x}"),
            "mov rax, [rax]".into(),
            "mov [rsp], rax".into(),
            "mov rax, [rsp+0x8]".into(),
            "ret 0x88".into(),
        ]
    );
}

#[test]
fn patch_bytes_are_exact() {
    assert_eq!(trap_bytes(0xF5), [0xCD, 0xF5]);
    assert_eq!(
        trap_bytes(0xF3),
        [0xCD, 0xF3],
        "a module loaded with vector=0xf3"
    );
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5, 0x90], SITE, 5);
    // E9 rel32 from SITE+5.
    assert_eq!(
        jmp_bytes(&plan, SITE + 0x105).unwrap(),
        vec![0xE9, 0x00, 0x01, 0x00, 0x00]
    );
    assert_eq!(
        jmp_bytes(&plan, SITE - 0x10).unwrap(),
        vec![0xE9, 0xEB, 0xFF, 0xFF, 0xFF]
    );
    assert!(matches!(
        jmp_bytes(&plan, SITE + 0x1_0000_0000),
        Err(Refusal::OutOfReach { .. })
    ));
    // EB rel8 to a springboard 0x30 bytes after the site; the springboard jumps on.
    let sb = Springboard {
        addr: SITE + 0x30,
        old: vec![0xCC; 5],
    };
    let plan8 = Plan {
        springboard: Some(sb.clone()),
        patch_len: 2,
        ..plan_for(&[0x31, 0xC0], SITE, 2)
    };
    assert_eq!(jmp_bytes(&plan8, 0).unwrap(), vec![0xEB, 0x2E]);
    assert_eq!(
        springboard_bytes(&sb, SITE + 0x35 + 0x200).unwrap(),
        [0xE9, 0x00, 0x02, 0x00, 0x00]
    );
    // A rel32 plan whose window is shorter than 5 bytes cannot take an E9.
    assert!(jmp_bytes(&plan_for(&[0x31, 0xC0], SITE, 2), SITE + 0x100).is_err());
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod run;

#[test]
fn lean_call_trampoline_leaves_out_popfq_inflight_counter_and_vector_saves() {
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let full = listing(
        &emit_call_trampoline(&tramp(), &plan, &info(true)).unwrap(),
        TRAMP,
    );
    let opts = TrampolineOptions {
        restore_flags: false,
        save_vector_regs: false,
        count_inflight: false,
        xsave_size: None,
        rcu_watch: None,
    };
    let lean = listing(
        &emit_call_trampoline_with(&tramp(), &plan, &info(true), &opts).unwrap(),
        TRAMP,
    );
    let count = |l: &[String], pat: &str| l.iter().filter(|s| s.contains(pat)).count();
    assert_eq!((count(&full, "popfq"), count(&lean, "popfq")), (1, 0));
    assert_eq!((count(&full, "movdqa"), count(&lean, "movdqa")), (32, 0));
    assert_eq!(
        (count(&full, "lock inc"), count(&lean, "lock inc")),
        (2, 1),
        "only the hit counter"
    );
    assert_eq!((count(&full, "lock dec"), count(&lean, "lock dec")), (1, 0));
    // The flags slot is still pushed (regs->rflags) and dropped without popfq: the stack balances.
    assert_eq!(count(&lean, "pushfq"), 1);
    assert!(
        lean.iter()
            .any(|s| s == "lea rsp, [rsp+0x8]" || s == "lea rsp, [rsp+8]"),
        "{lean:#?}"
    );
    assert_eq!(
        lean[lean.len() - 3..],
        full[full.len() - 3..],
        "same replay and jump back"
    );
}

#[test]
fn xsave_trampoline_saves_the_whole_extended_state_in_an_aligned_area_with_a_zeroed_header() {
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let opts = TrampolineOptions {
        xsave_size: Some(2696),
        rcu_watch: None,
        ..TrampolineOptions::full(&info(true))
    };
    let l = listing(
        &emit_call_trampoline_with(&tramp(), &plan, &info(true), &opts).unwrap(),
        TRAMP,
    );
    let at = |s: &str| {
        l.iter()
            .position(|x| x == s)
            .unwrap_or_else(|| panic!("no `{s}` in {l:#?}"))
    };
    let save = at("xsave64 [rsp]");
    #[rustfmt::skip]
    let before = [
        "and rsp, 0xfffffffffffffff0", "sub rsp, 0xac0", "and rsp, 0xffffffffffffffc0", "xor eax, eax",
        "mov [rsp+0x200], rax", "mov [rsp+0x208], rax", "mov [rsp+0x210], rax", "mov [rsp+0x218], rax",
        "mov [rsp+0x220], rax", "mov [rsp+0x228], rax", "mov [rsp+0x230], rax", "mov [rsp+0x238], rax",
        "mov eax, 0xffffffff", "mov edx, 0xffffffff", "xsave64 [rsp]", "cld", "mov rdi, rbx",
    ];
    assert_eq!(l[save - 14..save + 3], before);
    let call = l.iter().position(|x| x.starts_with("call ")).unwrap();
    assert_eq!(
        l[call + 1..call + 5],
        [
            "mov eax, 0xffffffff",
            "mov edx, 0xffffffff",
            "xrstor64 [rsp]",
            "mov rsp, rbx"
        ]
    );
    assert!(!l.iter().any(|x| x.contains("movdqa")), "no xmm-only saves");
}

#[test]
fn without_popfq_df_is_set_again_from_the_saved_flags() {
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let opts = TrampolineOptions {
        restore_flags: false,
        save_vector_regs: false,
        count_inflight: false,
        xsave_size: None,
        rcu_watch: None,
    };
    let l = listing(
        &emit_call_trampoline_with(&tramp(), &plan, &info(true), &opts).unwrap(),
        TRAMP,
    );
    let i = l
        .iter()
        .position(|x| x == "test byte ptr [rsp+0x1], 0x4")
        .unwrap_or_else(|| panic!("{l:#?}"));
    // jz over the std, then the flags slot dropped.
    assert!(l[i + 1].starts_with("je "), "{l:#?}");
    assert_eq!(l[i + 2..i + 4], ["std", "lea rsp, [rsp+0x8]"]);
    let d = decode(
        &emit_call_trampoline_with(&tramp(), &plan, &info(true), &opts).unwrap(),
        TRAMP,
    );
    let jz = d.iter().find(|x| x.code() == Code::Je_rel8_64).unwrap();
    assert_eq!(
        jz.near_branch_target(),
        jz.next_ip() + 1,
        "jz skips exactly the std"
    );
    assert_eq!(l.iter().filter(|x| *x == "cld").count(), 1);
}

/// A kernel trampoline with the module's RCU calls: the handler's call is wrapped in them
/// (`kmod/jmp_rcu.c`), everything else is the documented sequence.
#[test]
fn kernel_call_trampoline_with_rcu_watch_wraps_the_handler_in_the_rcu_entry_and_exit() {
    let plan = plan_for(&[0x55, 0x48, 0x89, 0xE5], SITE, 2);
    let rcu = RcuWatch {
        enter: TRAMP + 0x20_0000,
        exit: TRAMP + 0x20_0040,
    };
    let opts = TrampolineOptions {
        rcu_watch: Some(rcu),
        ..TrampolineOptions::full(&info(false))
    };
    let out = emit_call_trampoline_with(&tramp(), &plan, &info(false), &opts).unwrap();
    let got = listing(&out, TRAMP);
    let mut want = expected(
        0,
        false,
        &[
            format!("call {HANDLER:#x}"),
            "test r12, r12".into(),
            // jz over the call: the bytes are the point, the listing shows the target.
        ],
        &["push rbp", "mov rbp, rsp", "jmp 0x401004"],
    );
    let cld = want.iter().position(|s| s == "cld").unwrap();
    want.insert(cld, "mov r12, rax".into());
    want.insert(cld, format!("call {:#x}", rcu.enter));
    let test = want.iter().position(|s| s == "test r12, r12").unwrap();
    let jz_at = got.iter().position(|s| s.starts_with("je ")).unwrap();
    want.insert(test + 1, got[jz_at].clone());
    want.insert(test + 2, format!("call {:#x}", rcu.exit));
    assert_eq!(got, want);
    // The jz skips exactly the exit's call: its target is the instruction after that call.
    let after_exit = got.iter().position(|s| s == "mov rsp, rbx").unwrap();
    assert_eq!(after_exit, jz_at + 2);
    let bytes = out
        .windows(7)
        .position(|w| w[0] == 0x74 && w[1] == 0x05 && w[2] == 0xE8);
    assert!(bytes.is_some(), "jz +5 right before the exit's call rel32");
    // Without it, no call but the handler's.
    let plain = listing(
        &emit_call_trampoline(&tramp(), &plan, &info(false)).unwrap(),
        TRAMP,
    );
    assert_eq!(plain.iter().filter(|s| s.starts_with("call ")).count(), 1);
}

/// The module's calls are found by name among its own symbols only.
#[test]
fn rcu_watch_is_found_only_among_the_trapvec_modules_symbols() {
    use trapvec::{Symbol, SymbolKind, SymbolTable};
    let sym = |name: &str, addr: u64, origin: Option<&str>| Symbol {
        name: name.into(),
        addr,
        size: 0,
        kind: SymbolKind::Function,
        origin: origin.map(Into::into),
        version: None,
    };
    let kernel = SymbolTable::new(vec![
        sym(RcuWatch::ENTER, 0x1000, Some("trapvec")),
        sym(RcuWatch::EXIT, 0x1040, Some("trapvec")),
    ]);
    assert_eq!(
        RcuWatch::find(&kernel),
        Some(RcuWatch {
            enter: 0x1000,
            exit: 0x1040
        })
    );
    let elsewhere = SymbolTable::new(vec![
        sym(RcuWatch::ENTER, 0x1000, None),
        sym(RcuWatch::EXIT, 0x1040, Some("libfoo.so")),
    ]);
    assert_eq!(RcuWatch::find(&elsewhere), None);
    let old_module = SymbolTable::new(vec![sym("trapvec_rp_entry", 0x1000, Some("trapvec"))]);
    assert_eq!(RcuWatch::find(&old_module), None);
}

mod replace;
