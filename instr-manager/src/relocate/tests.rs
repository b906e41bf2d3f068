//! Relocation tests: byte tables relocated, re-decoded at the new address and compared by
//! meaning (absolute targets and memory addresses), plus a property test.

use iced_x86::{ConditionCode, Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use proptest::prelude::*;

use super::relocate;
use crate::analysis::Insn;
use crate::error::Refusal;
use crate::RefusalCause;

const ORIG: u64 = 0x5555_5555_0000;

fn insns(bytes: &[u8], addr: u64) -> Vec<Insn> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        let i = d.decode();
        assert!(!i.is_invalid(), "test bytes must decode");
        out.push(Insn {
            addr: i.ip(),
            len: i.len(),
            instr: i,
        });
    }
    out
}

/// What an instruction (or the call replacement pattern) means, independent of its address.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Meaning {
    Plain(Vec<u8>),
    RipMem {
        mnemonic: Mnemonic,
        addr: u64,
    },
    Jcc {
        cc: ConditionCode,
        target: u64,
    },
    Jmp {
        target: u64,
    },
    JmpMem {
        addr: u64,
    },
    JmpReg(Register),
    Loop {
        mnemonic: Mnemonic,
        target: u64,
    },
    /// `lea rsp,[rsp-8]; mov dword [rsp], lo; mov dword [rsp+4], hi; jmp ...`
    PushRet(u64),
    Ret,
}

fn meaning_of(i: &Instruction, bytes: &[u8]) -> Meaning {
    if i.is_jcc_short_or_near() {
        Meaning::Jcc {
            cc: i.condition_code(),
            target: i.near_branch_target(),
        }
    } else if i.is_jmp_short_or_near() {
        Meaning::Jmp {
            target: i.near_branch_target(),
        }
    } else if i.is_loop() || i.is_loopcc() || i.is_jcx_short() {
        Meaning::Loop {
            mnemonic: i.mnemonic(),
            target: i.near_branch_target(),
        }
    } else if i.is_jmp_near_indirect() && i.op0_kind() == OpKind::Register {
        Meaning::JmpReg(i.op0_register())
    } else if i.is_jmp_near_indirect() && i.is_ip_rel_memory_operand() {
        Meaning::JmpMem {
            addr: i.ip_rel_memory_address(),
        }
    } else if i.is_ip_rel_memory_operand() {
        Meaning::RipMem {
            mnemonic: i.mnemonic(),
            addr: i.ip_rel_memory_address(),
        }
    } else if i.mnemonic() == Mnemonic::Ret {
        Meaning::Ret
    } else {
        Meaning::Plain(bytes.to_vec())
    }
}

/// Meanings of a relocated block: decodes `bytes` at `addr`, folding the call pattern into
/// [`Meaning::PushRet`] and stopping at data that no longer decodes.
fn meanings(bytes: &[u8], addr: u64, count: usize) -> Vec<Meaning> {
    let mut d = Decoder::with_ip(64, bytes, addr, DecoderOptions::NONE);
    let mut all = Vec::new();
    while d.can_decode() && all.len() < count + 8 {
        let pos = d.position();
        let i = d.decode();
        if i.is_invalid() {
            break;
        }
        all.push((i, bytes[pos..pos + i.len()].to_vec()));
    }
    let mut out = Vec::new();
    let mut k = 0;
    while k < all.len() && out.len() < count {
        let (i, b) = &all[k];
        if i.mnemonic() == Mnemonic::Lea
            && i.op0_register() == Register::RSP
            && i.memory_displacement64() == 8u64.wrapping_neg()
        {
            let (lo, hi) = (&all[k + 1].0, &all[k + 2].0);
            assert_eq!(
                (lo.mnemonic(), lo.memory_base(), lo.memory_displacement64()),
                (Mnemonic::Mov, Register::RSP, 0)
            );
            assert_eq!(
                (hi.mnemonic(), hi.memory_base(), hi.memory_displacement64()),
                (Mnemonic::Mov, Register::RSP, 4)
            );
            out.push(Meaning::PushRet(
                u64::from(lo.immediate32()) | (u64::from(hi.immediate32()) << 32),
            ));
            k += 3;
            continue;
        }
        out.push(meaning_of(i, b));
        k += 1;
    }
    out
}

/// What the original instructions mean; a call becomes "push its return address" + its jump.
fn original_meanings(displaced: &[Insn], bytes: &[u8]) -> Vec<Meaning> {
    let mut out = Vec::new();
    let mut off = 0;
    for insn in displaced {
        let b = &bytes[off..off + insn.len];
        off += insn.len;
        let i = &insn.instr;
        if i.is_call_near() {
            out.push(Meaning::PushRet(insn.end()));
            out.push(Meaning::Jmp {
                target: i.near_branch_target(),
            });
        } else if i.is_call_near_indirect() {
            out.push(Meaning::PushRet(insn.end()));
            out.push(if i.op0_kind() == OpKind::Register {
                Meaning::JmpReg(i.op0_register())
            } else {
                Meaning::JmpMem {
                    addr: i.ip_rel_memory_address(),
                }
            });
        } else {
            out.push(meaning_of(i, b));
        }
    }
    out
}

/// Relocate `bytes` (at [`ORIG`]) to `new_addr` and check that every meaning survives.
fn check_relocation(bytes: &[u8], new_addr: u64) -> Vec<u8> {
    let displaced = insns(bytes, ORIG);
    let out = relocate(&displaced, new_addr)
        .unwrap_or_else(|e| panic!("relocation to {new_addr:#x} refused: {e}"));
    let want = original_meanings(&displaced, bytes);
    assert_eq!(
        meanings(&out, new_addr, want.len()),
        want,
        "relocated to {new_addr:#x}: {out:02x?}"
    );
    out
}

#[rustfmt::skip]
const TABLE: &[(&str, &[u8])] = &[
    ("push rbp; mov rbp,rsp",       &[0x55, 0x48, 0x89, 0xE5]),
    ("mov rax,[rip+0x1000]",        &[0x48, 0x8B, 0x05, 0x00, 0x10, 0x00, 0x00]),
    ("lea rdi,[rip-0x2000]",        &[0x48, 0x8D, 0x3D, 0x00, 0xE0, 0xFF, 0xFF]),
    ("cmp byte [rip+0x10],0",       &[0x80, 0x3D, 0x10, 0x00, 0x00, 0x00, 0x00]),
    ("jne +0x10 (rel8)",            &[0x75, 0x10]),
    ("je +0x100 (rel32)",           &[0x0F, 0x84, 0x00, 0x01, 0x00, 0x00]),
    ("jmp -0x20 (rel8)",            &[0xEB, 0xE0]),
    ("jmp +0x12345 (rel32)",        &[0xE9, 0x45, 0x23, 0x01, 0x00]),
    ("call +0x100",                 &[0xE8, 0x00, 0x01, 0x00, 0x00]),
    ("push rbx; call -0x1000",      &[0x53, 0xE8, 0x00, 0xF0, 0xFF, 0xFF]),
    ("call rax",                    &[0xFF, 0xD0]),
    ("call [rip+0x2000]",           &[0xFF, 0x15, 0x00, 0x20, 0x00, 0x00]),
    ("xor eax,eax; ret",            &[0x31, 0xC0, 0xC3]),
    ("test edi,edi; jle +8",        &[0x85, 0xFF, 0x7E, 0x08]),
];

#[test]
fn byte_table_relocations_keep_targets_and_addresses() {
    for new_addr in [ORIG + 0x1000_0000, ORIG - 0x3000_0000, ORIG + 0x10] {
        for (name, bytes) in TABLE {
            eprintln!("{name} -> {new_addr:#x}");
            check_relocation(bytes, new_addr);
        }
    }
}

#[test]
fn position_independent_instructions_are_copied_byte_for_byte() {
    let bytes = [0x55, 0x48, 0x89, 0xE5, 0x41, 0x54];
    assert_eq!(
        relocate(&insns(&bytes, ORIG), ORIG + 0x4000_0000).unwrap(),
        bytes
    );
}

#[test]
fn call_becomes_push_original_return_then_jmp() {
    // call +0x100 at ORIG: returns to ORIG+5, target ORIG+0x105.
    let out = check_relocation(&[0xE8, 0x00, 0x01, 0x00, 0x00], ORIG + 0x1000);
    let want_ret = ORIG + 5;
    #[rustfmt::skip]
    let mut want = vec![
        0x48, 0x8D, 0x64, 0x24, 0xF8,                                  // lea rsp,[rsp-8]
        0xC7, 0x04, 0x24,                                              // mov dword [rsp], lo32
    ];
    want.extend(u32::try_from(want_ret & 0xffff_ffff).unwrap().to_le_bytes());
    want.extend([0xC7, 0x44, 0x24, 0x04]); // mov dword [rsp+4], hi32
    want.extend(u32::try_from(want_ret >> 32).unwrap().to_le_bytes());
    assert_eq!(&out[..want.len()], &want[..]);
    assert_eq!(out[want.len()], 0xE9, "jmp rel32 to the callee");
}

#[test]
fn branch_to_the_site_itself_stays_a_branch_to_the_site() {
    // site: dec eax; jne site  -- the relocated jne must go back to the site, not to its copy.
    let bytes = [0xFF, 0xC8, 0x75, 0xFC];
    let new_addr = ORIG + 0x10_0000;
    let out = relocate(&insns(&bytes, ORIG), new_addr).unwrap();
    let m = meanings(&out, new_addr, 2);
    assert_eq!(
        m[1],
        Meaning::Jcc {
            cc: ConditionCode::ne,
            target: ORIG
        }
    );
}

#[test]
fn loop_and_jrcxz_use_long_forms_when_far() {
    for bytes in [[0xE2u8, 0x10], [0xE3, 0x10]] {
        let new_addr = ORIG + 0x2000_0000;
        let out = relocate(&insns(&bytes, ORIG), new_addr).unwrap();
        let target = ORIG + 2 + 0x10;
        // loop/jrcxz short over a near jmp, or to a near jmp, to the original target.
        let m = meanings(&out, new_addr, 3);
        assert!(matches!(m[0], Meaning::Loop { .. }), "{m:?}");
        assert!(
            m.contains(&Meaning::Jmp { target }),
            "{m:?} lacks jmp {target:#x}"
        );
    }
}

#[test]
fn jcc_out_of_rel32_reach_goes_through_a_pointer() {
    let new_addr = ORIG + 0x1_0000_0000; // 4 GiB away: no rel32 reaches the original target
    let bytes = [0x75, 0x10];
    let out = relocate(&insns(&bytes, ORIG), new_addr).unwrap();
    let m = meanings(&out, new_addr, 2);
    // jcc (inverted) over `jmp qword [rip+x]`, with x holding the target.
    let Meaning::JmpMem { addr } = m[1] else {
        panic!("{m:?}")
    };
    let off = usize::try_from(addr - new_addr).unwrap();
    let ptr = u64::from_le_bytes(out[off..off + 8].try_into().unwrap());
    assert_eq!(ptr, ORIG + 2 + 0x10);
}

#[test]
fn call_that_is_not_last_returns_into_the_window() {
    let bytes = [0xE8, 0x00, 0x01, 0x00, 0x00, 0x90];
    let err = relocate(&insns(&bytes, ORIG), ORIG + 0x1000).unwrap_err();
    assert_eq!(
        err,
        Refusal::CallReturnsIntoWindow {
            site: ORIG,
            call_addr: ORIG,
            insn: format!("call {:#x}", ORIG + 0x105),
            ret: ORIG + 5,
            window_end: ORIG + 6,
        }
    );
}

#[test]
fn forbidden_and_rsp_based_instructions_are_refused_with_reasons() {
    #[rustfmt::skip]
    let cases: &[(&[u8], &str, RefusalCause)] = &[
        (&[0x0F, 0x05],             "system call", RefusalCause::SystemCall),           // syscall
        (&[0xCD, 0x80],             "interrupt",   RefusalCause::InterruptInstruction), // int 0x80
        (&[0xCC],                   "interrupt",   RefusalCause::InterruptInstruction), // int3
        (&[0x0F, 0x0B],             "BUG/WARN",    RefusalCause::UndefinedOpcode),      // ud2
        (&[0xCB],                   "far return",  RefusalCause::FarReturn),            // retf
        (&[0xFF, 0x54, 0x24, 0x08], "rsp",         RefusalCause::CallThroughRsp),       // call [rsp+8]
        (&[0xFF, 0xD4],             "rsp",         RefusalCause::CallThroughRsp),       // call rsp
    ];
    for (bytes, why, cause) in cases {
        let err = relocate(&insns(bytes, ORIG), ORIG + 0x1000).unwrap_err();
        let Refusal::Unrelocatable {
            site, addr, reason, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!((*site, *addr), (ORIG, ORIG));
        assert!(reason.contains(why), "{bytes:02x?}: {err}");
        // The cause, as a type: the same for every instruction refused for it.
        assert_eq!(err.cause(), *cause, "{bytes:02x?}: {err}");
    }
}

#[test]
fn rip_relative_operand_out_of_reach_is_refused() {
    let bytes = [0x48, 0x8B, 0x05, 0x00, 0x10, 0x00, 0x00];
    let err = relocate(&insns(&bytes, ORIG), ORIG + 0x2_0000_0000).unwrap_err();
    assert!(
        matches!(&err, Refusal::Unrelocatable { reason, .. } if reason.contains("±2 GiB")),
        "{err}"
    );
    assert_eq!(err.cause(), RefusalCause::OperandOutOfReach);
}

#[test]
fn a_per_cpu_operand_near_zero_is_reached_through_the_wrap_as_the_cpu_does() {
    // Linux 6.12's `mov rax, gs:[rip+x]` in getname_flags at 0xffffffff81456259, x such that
    // the target is the per-CPU offset 0x35000: rip + x wraps past 2^64.
    let site: u64 = 0xffff_ffff_8145_6259;
    let next = site + 8;
    let disp = u32::try_from(0x35000u64.wrapping_sub(next) & 0xffff_ffff).unwrap();
    let mut bytes = vec![0x65, 0x48, 0x8B, 0x05];
    bytes.extend(disp.to_le_bytes());
    let displaced = insns(&bytes, site);
    assert_eq!(displaced[0].instr.ip_rel_memory_address(), 0x35000);
    // Moved to the module area (0xffffffffc0...), the operand still names 0x35000 with gs.
    let new_addr = 0xffff_ffff_c012_3000;
    let out = relocate(&displaced, new_addr).unwrap_or_else(|e| panic!("{e}"));
    let moved = insns(&out, new_addr);
    assert_eq!(moved[0].instr.ip_rel_memory_address(), 0x35000);
    assert_eq!(moved[0].instr.segment_prefix(), iced_x86::Register::GS);
    assert_eq!(&out[..4], &bytes[..4]);
    // A target truly out of reach is still refused: 0x35000 from the middle of the space.
    let err = relocate(&displaced, 0x8000_0000_0000_0000).unwrap_err();
    assert_eq!(err.cause(), RefusalCause::OperandOutOfReach);
}

#[derive(Clone, Debug)]
enum Gen {
    Load(i32),
    JccShort(u8, i8),
    JccNear(u8, i32),
    JmpShort(i8),
    JmpNear(i32),
    Call(i32),
}

impl Gen {
    fn bytes(&self) -> Vec<u8> {
        match *self {
            Gen::Load(d) => [&[0x48, 0x8B, 0x05][..], &d.to_le_bytes()].concat(),
            Gen::JccShort(cc, d) => vec![0x70 | cc, d.to_le_bytes()[0]],
            Gen::JccNear(cc, d) => [&[0x0F, 0x80 | cc][..], &d.to_le_bytes()].concat(),
            Gen::JmpShort(d) => vec![0xEB, d.to_le_bytes()[0]],
            Gen::JmpNear(d) => [&[0xE9][..], &d.to_le_bytes()].concat(),
            Gen::Call(d) => [&[0xE8][..], &d.to_le_bytes()].concat(),
        }
    }
}

/// Displacements that keep targets within 1 GiB (minus slack) of the original.
const NEAR: i32 = (1 << 30) - (1 << 16);

fn gen_insn() -> impl Strategy<Value = Gen> {
    prop_oneof![
        (-NEAR..NEAR).prop_map(Gen::Load),
        (0u8..16, any::<i8>()).prop_map(|(c, d)| Gen::JccShort(c, d)),
        (0u8..16, -NEAR..NEAR).prop_map(|(c, d)| Gen::JccNear(c, d)),
        any::<i8>().prop_map(Gen::JmpShort),
        (-NEAR..NEAR).prop_map(Gen::JmpNear),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// decode -> relocate (±1 GiB) -> decode keeps every absolute target, memory address and
    /// the return address of a final call.
    #[test]
    fn relocation_preserves_absolute_targets(
        body in proptest::collection::vec(gen_insn(), 1..4),
        call in proptest::option::of(-NEAR..NEAR),
        base_off in 0u64..(1 << 32),
        shift in -i64::from(NEAR)..i64::from(NEAR),
    ) {
        let orig = 0x4000_0000_0000 + base_off;
        let mut bytes: Vec<u8> = body.iter().flat_map(Gen::bytes).collect();
        if let Some(d) = call {
            bytes.extend(Gen::Call(d).bytes());
        }
        let displaced = insns(&bytes, orig);
        let new_addr = orig.wrapping_add_signed(shift);
        let out = relocate(&displaced, new_addr).expect("all targets are in reach");
        let want = original_meanings(&displaced, &bytes);
        prop_assert_eq!(meanings(&out, new_addr, want.len()), want);
    }
}

#[test]
fn an_instruction_iced_cannot_encode_is_named_as_the_culprit() {
    let mut displaced = insns(&[0x55], ORIG);
    // An instruction the encoder rejects (Code::INVALID), after a good one.
    displaced.push(Insn {
        addr: ORIG + 1,
        len: 1,
        instr: Instruction::default(),
    });
    let err = relocate(&displaced, ORIG + 0x1000).unwrap_err();
    let Refusal::Unrelocatable {
        site, addr, reason, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*site, *addr), (ORIG, ORIG + 1));
    assert!(reason.contains("cannot re-encode"), "{err}");
    assert_eq!(err.cause(), RefusalCause::Reencode);
}

#[test]
fn relocation_running_past_the_top_of_the_address_space_is_refused() {
    // Found by the fuzzer (fuzz/regressions/analysis): the quick check of a window added the
    // encoded lengths past 2^64. `mov rax, rdi; mov rax, rdi` relocated 4 bytes before 2^64
    // does not fit there: the check falls back to the BlockEncoder, which names the problem.
    let displaced = insns(&[0x48, 0x89, 0xF8, 0x48, 0x89, 0xF8], 0x40_1000);
    let new_addr = u64::MAX - 3;
    let err = super::check_relocatable(&displaced, new_addr).unwrap_err();
    assert!(
        matches!(err, Refusal::Encode { addr, .. } if addr == new_addr),
        "{err}"
    );
    assert_eq!(err.cause(), RefusalCause::Encode);
    assert!(relocate(&displaced, new_addr).is_err());
}
