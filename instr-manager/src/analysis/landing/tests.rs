//! The LSDA reader over hand-made bytes (good, truncated, bad encodings), and the whole path
//! (`.eh_frame_hdr` → FDE → LSDA) over a program g++ compiles at test time.

use std::path::Path;
use std::process::Command;

use iced_x86::Register;
use object::{Object, ObjectSection, ObjectSymbol};

use super::*;
use crate::analysis::{analyze_function, Function};
use crate::error::Refusal;
use crate::plan::tests::user;
use crate::plan::{plan_jmp, plan_trap, PlanInput};

const LSDA: u64 = 0x5000;
const FRAG: u64 = 0x1000;

#[rustfmt::skip]
/// LPStart omitted, TType indirect|pcrel|sdata4 (offset 0x0d), call sites in uleb128: a call at
/// +0x4 (5 bytes) landing at +0xe with action 1, and a call at +0x20 with no landing pad.
const GOOD: &[u8] = &[
    /*00*/ 0xff,                   // LPStart encoding: omit
    /*01*/ 0x9b, 0x0d,             // TType encoding, offset
    /*03*/ 0x01, 0x08,             // call-site encoding uleb128, table length 8
    /*05*/ 0x04, 0x05, 0x0e, 0x01, // start, length, landing pad, action
    /*09*/ 0x20, 0x05, 0x00, 0x00, // no landing pad
    /*0d*/ 0x01, 0x00,             // action table
];

#[test]
fn call_sites_in_uleb128_land_relative_to_the_fragment() {
    let l = parse_lsda(GOOD, LSDA, FRAG).unwrap();
    assert_eq!(l.lp_start, FRAG);
    assert_eq!(l.len, 0x0d);
    assert_eq!(
        l.call_sites,
        [
            CallSite {
                start: FRAG + 4,
                len: 5,
                landing_pad: Some(FRAG + 0xe),
                action: 1
            },
            CallSite {
                start: FRAG + 0x20,
                len: 5,
                landing_pad: None,
                action: 0
            },
        ]
    );
}

#[rustfmt::skip]
#[test]
fn explicit_lpstart_absolute_pcrel_and_funcrel_with_udata4_call_sites() {
    // LPStart udata8 0x9000; no TType; call sites udata4: (0x10, 4, 0x30, 0).
    let abs = [0x04, 0x00, 0x90, 0, 0, 0, 0, 0, 0, 0xff, 0x03, 0x0d,
               0x10, 0, 0, 0, 0x04, 0, 0, 0, 0x30, 0, 0, 0, 0x00];
    let l = parse_lsda(&abs, LSDA, FRAG).unwrap();
    assert_eq!((l.lp_start, l.call_sites[0].landing_pad), (0x9000, Some(0x9030)));
    assert_eq!((l.call_sites[0].start, l.call_sites[0].len), (FRAG + 0x10, 4));
    // pcrel sdata4 -0x10 from the field at LSDA+1.
    let pcrel = [0x1b, 0xf0, 0xff, 0xff, 0xff, 0xff, 0x01, 0x04, 0x01, 0x02, 0x03, 0x00];
    assert_eq!(parse_lsda(&pcrel, LSDA, FRAG).unwrap().lp_start, LSDA + 1 - 0x10);
    assert_eq!(parse_lsda(&pcrel, LSDA, FRAG).unwrap().call_sites[0].landing_pad, Some(LSDA + 1 - 0x10 + 3));
    // funcrel uleb128 0x100.
    let funcrel = [0x41, 0x80, 0x02, 0xff, 0x01, 0x00];
    let l = parse_lsda(&funcrel, LSDA, FRAG).unwrap();
    assert_eq!((l.lp_start, l.call_sites.len()), (FRAG + 0x100, 0));
}

#[test]
fn every_truncation_is_an_error_naming_where_it_ends() {
    for n in 0..0x0d {
        let e = parse_lsda(&GOOD[..n], LSDA, FRAG).unwrap_err();
        match e {
            LsdaError::Truncated { offset, .. } => assert_eq!(offset, n, "{n}: {e}"),
            other => panic!("{n}: {other}"),
        }
        assert!(e.to_string().starts_with("it ends at offset"), "{e}");
    }
    // A table length that cuts an entry in two: the entry runs past the table's end.
    let mut cut = GOOD.to_vec();
    cut[4] = 0x06;
    assert_eq!(
        parse_lsda(&cut, LSDA, FRAG).unwrap_err(),
        LsdaError::EntryPastTable {
            offset: 9,
            end: 0x0b
        }
    );
}

#[test]
fn bad_encodings_and_oversized_values_are_refused_with_their_offset() {
    let bad_cs = [0xff, 0xff, 0x1b, 0x00];
    assert_eq!(
        parse_lsda(&bad_cs, LSDA, FRAG).unwrap_err(),
        LsdaError::BadEncoding {
            what: "call-site",
            enc: 0x1b,
            offset: 2
        }
    );
    let bad_lp = [0x05, 0, 0];
    assert_eq!(
        parse_lsda(&bad_lp, LSDA, FRAG).unwrap_err(),
        LsdaError::BadEncoding {
            what: "LPStart",
            enc: 0x05,
            offset: 0
        }
    );
    let indirect_lp = [0x83, 0, 0, 0, 0, 0xff, 0x01, 0x00];
    assert!(matches!(
        parse_lsda(&indirect_lp, LSDA, FRAG),
        Err(LsdaError::BadEncoding {
            what: "LPStart",
            ..
        })
    ));
    let bad_tt = [0xff, 0x0e, 0x00, 0x01, 0x00];
    assert_eq!(
        parse_lsda(&bad_tt, LSDA, FRAG).unwrap_err(),
        LsdaError::BadEncoding {
            what: "TType",
            enc: 0x0e,
            offset: 1
        }
    );
    // An 11-byte ULEB128 table length, and one whose tenth byte sets bits past 63.
    let long = [
        0xff, 0xff, 0x01, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
    ];
    assert_eq!(
        parse_lsda(&long, LSDA, FRAG).unwrap_err(),
        LsdaError::Overflow {
            what: "call-site table length",
            offset: 3
        }
    );
    let wide = [
        0xff, 0xff, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
    ];
    assert!(matches!(
        parse_lsda(&wide, LSDA, FRAG),
        Err(LsdaError::Overflow { .. })
    ));
    let huge = [0xff, 0xff, 0x01, 0x80, 0x80, 0x80, 0x01];
    assert_eq!(
        parse_lsda(&huge, LSDA, FRAG).unwrap_err(),
        LsdaError::TableTooLarge {
            offset: 3,
            len: 1 << 21
        }
    );
}

#[test]
fn random_bytes_never_panic() {
    // A small deterministic generator: every length and many contents, each a result.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = usize::try_from(x % 24).unwrap();
        let bytes: Vec<u8> = (0..len)
            .map(|i| x.to_le_bytes()[i % 8] ^ u8::try_from(i).unwrap().wrapping_mul(37))
            .collect();
        let _ = parse_lsda(&bytes, x, x.rotate_left(17));
    }
}

/// A g++-compiled program (the agent's exception fixture) as memory by virtual address.
struct Program {
    data: Vec<u8>,
    regions: Vec<(u64, Vec<u8>)>,
    hdr: EhFrameHdr,
}

impl Program {
    /// Compile `agent/tests/fixtures/eh.cc` and `eh_pad.S` with g++ (None, with a
    /// message, when there is no g++ outside CI).
    fn build() -> Option<Program> {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fixtures");
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("eh");
        let out = match Command::new("g++")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(fixtures.join("eh.cc"))
            .arg(fixtures.join("eh_pad.S"))
            .output()
        {
            Ok(o) => o,
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("skipped: no g++ ({e})");
                return None;
            }
            Err(e) => panic!("g++: {e}"),
        };
        assert!(
            out.status.success(),
            "g++: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let data = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let regions = file
            .sections()
            .filter(|s| s.address() != 0)
            .filter_map(|s| Some((s.address(), s.data().ok()?.to_vec())))
            .collect();
        let h = file.section_by_name(".eh_frame_hdr").unwrap();
        let hdr = EhFrameHdr {
            addr: h.address(),
            len: h.size(),
        };
        Some(Program { data, regions, hdr })
    }

    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        self.regions.iter().find_map(|(a, b)| {
            let off = usize::try_from(addr.checked_sub(*a)?).ok()?;
            b.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
        })
    }

    /// (address, size) of the symbol `name`.
    fn symbol(&self, name: &str) -> (u64, u64) {
        let file = object::File::parse(&*self.data).unwrap();
        let s = file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no {name}"));
        (s.address(), s.size())
    }

    fn function(&self, name: &str) -> Function {
        let (addr, size) = self.symbol(name);
        analyze_function(
            name,
            addr,
            &self.read(addr, usize::try_from(size).unwrap()).unwrap(),
        )
        .unwrap()
    }

    fn pads(&self, name: &str) -> Result<Vec<u64>, LandingError> {
        let (addr, size) = self.symbol(name);
        let read = |a: u64, n: usize| self.read(a, n);
        let table = HdrTable::read(&read, name, self.hdr)?;
        Ok(landing_pads(&read, name, &table, addr, addr + size)?
            .iter()
            .map(|p| p.addr)
            .collect())
    }
}

#[test]
fn landing_pads_of_a_g_plus_plus_program_are_where_the_exception_pointer_is_saved() {
    let Some(p) = Program::build() else { return };
    // Every landing pad of these fixtures starts by saving the exception pointer (rax).
    for (name, n) in [
        ("with_cleanup", 1),
        ("catcher", 1),
        ("padded_catch", 1),
        ("thrower.cold", 1),
        ("thrower", 0),
        ("main", 0),
    ] {
        let pads = p.pads(name).unwrap();
        assert_eq!(pads.len(), n, "{name}: {pads:x?}");
        let f = p.function(name);
        for pad in pads {
            let insn = f
                .insn_at(pad)
                .unwrap_or_else(|| panic!("{name}: {pad:#x} is not an instruction boundary"));
            assert_eq!(
                insn.instr.op1_register(),
                Register::RAX,
                "{name}: `{}` at {pad:#x}",
                insn.intel()
            );
        }
    }
    let (start, _) = p.symbol("padded_catch");
    assert_eq!(
        p.pads("padded_catch").unwrap(),
        [start + 0xf],
        "after sub, call, add, ret and the nop"
    );
}

#[test]
fn a_window_over_a_landing_pad_is_refused_only_once_the_pad_is_known() {
    let Some(p) = Program::build() else { return };
    let mut f = p.function("padded_catch");
    let nop = f.start + 0xe;
    let read = |a: u64, n: usize| p.read(a, n);
    let plans = |f: &Function, site: u64| {
        let (symbols, info, busy) = (trapvec::SymbolTable::default(), user(), |_: u64, _: u64| {
            false
        });
        let input = PlanInput {
            func: f,
            info: &info,
            read: &read,
            symbols: &symbols,
            busy: &busy,
            trampoline_near: None,
        };
        (
            plan_trap(&input, site).map(|_| ()),
            plan_jmp(&input, site).map(|_| ()),
        )
    };
    assert_eq!(
        plans(&f, nop),
        (Ok(()), Ok(())),
        "the decoder alone sees the nop run into the pad"
    );
    assert_eq!(f.add_landing_pads(p.pads("padded_catch").unwrap()), 1);
    let pad = f.start + 0xf;
    let want = Refusal::LandingPadInWindow {
        site: nop,
        window_end: pad + 3,
        func: "padded_catch".into(),
        offset: 0xf,
        pad,
    };
    let (trap, jmp) = plans(&f, nop);
    assert_eq!(trap.unwrap_err(), want);
    assert!(
        want.to_string()
            .contains("covers the exception landing pad at padded_catch+0xf"),
        "{want}"
    );
    assert!(
        matches!(jmp, Err(Refusal::LandingPadInWindow { .. })),
        "{jmp:?}"
    );
    assert_eq!(
        plans(&f, pad),
        (Ok(()), Ok(())),
        "a splice at the pad itself is fine"
    );
}

#[test]
fn malformed_unwind_data_is_an_error_naming_the_function_and_where() {
    let Some(p) = Program::build() else { return };
    let (start, size) = p.symbol("with_cleanup");
    let good = |a: u64, n: usize| p.read(a, n);
    let table = HdrTable::read(&good, "with_cleanup", p.hdr).unwrap();
    let fde = table.fde_for("with_cleanup", start).unwrap().unwrap();
    // The FDE's length zeroed (the terminator), then its LSDA's call-site encoding made pcrel.
    let zero_len = |a: u64, n: usize| {
        p.read(a, n).map(|mut b| {
            if a == fde {
                b[..4].fill(0);
            }
            b
        })
    };
    let e = landing_pads(&zero_len, "with_cleanup", &table, start, start + size).unwrap_err();
    assert_eq!(e.to_string(), format!("cannot read the exception landing pads of `with_cleanup`: the FDE at {fde:#x} (.eh_frame) has length 0x0"));
    let lsda = fde_at(&good, "with_cleanup", fde).unwrap().lsda.unwrap();
    // Header: LPStart omitted, TType omitted (a cleanup catches no type), the call-site encoding.
    assert_eq!(p.read(lsda, 3).unwrap(), [0xff, 0xff, 0x01]);
    let bad_cs = |a: u64, n: usize| {
        p.read(a, n).map(|mut b| {
            if a <= lsda + 2 && lsda + 2 < a + n as u64 {
                b[usize::try_from(lsda + 2 - a).unwrap()] = 0x1b;
            }
            b
        })
    };
    let e = landing_pads(&bad_cs, "with_cleanup", &table, start, start + size)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot read the exception landing pads of `with_cleanup`: the LSDA at"),
        "{e}"
    );
    assert!(
        e.ends_with("its call-site encoding 0x1b at offset 0x2 is not one an LSDA can use"),
        "{e}"
    );
    // A broken .eh_frame_hdr (version 2).
    let bad_hdr = |a: u64, n: usize| {
        p.read(a, n).map(|mut b| {
            if a == p.hdr.addr {
                b[0] = 2;
            }
            b
        })
    };
    let e = HdrTable::read(&bad_hdr, "with_cleanup", p.hdr)
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with(&format!("cannot read the exception landing pads of `with_cleanup`: its .eh_frame_hdr at {:#x}: ", p.hdr.addr)), "{e}");
}

#[rustfmt::skip]
#[test]
fn a_search_table_claiming_more_entries_than_it_holds_is_refused() {
    // Version 1; eh_frame_ptr pcrel|sdata4, fde_count udata4, table datarel|sdata4; then
    // eh_frame_ptr, fde_count 0xffffffff and a single entry (gimli's binary search would
    // multiply that count by the entry size).
    let hdr = [0x01, 0x1b, 0x03, 0x3b, 0x10, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x20, 0, 0, 0, 0x40, 0, 0, 0];
    let read = |a: u64, n: usize| hdr.get(usize::try_from(a.checked_sub(0x3000)?).ok()?..).and_then(|b| b.get(..n)).map(<[u8]>::to_vec);
    let e = HdrTable::read(&read, "f", EhFrameHdr { addr: 0x3000, len: hdr.len() as u64 }).err().unwrap().to_string();
    assert!(e.starts_with("cannot read the exception landing pads of `f`: its .eh_frame_hdr at 0x3000: its search table entry 1: "), "{e}");
    // Entries out of order.
    let unsorted = [0x01, 0x1b, 0x03, 0x3b, 0x10, 0, 0, 0, 0x02, 0, 0, 0, 0x20, 0, 0, 0, 0x40, 0, 0, 0, 0x10, 0, 0, 0, 0x40, 0, 0, 0];
    let read = |a: u64, n: usize| unsorted.get(usize::try_from(a.checked_sub(0x3000)?).ok()?..).and_then(|b| b.get(..n)).map(<[u8]>::to_vec);
    let e = HdrTable::read(&read, "f", EhFrameHdr { addr: 0x3000, len: unsorted.len() as u64 }).err().unwrap().to_string();
    assert!(e.ends_with("its search table is not sorted at entry 1 (0x3010)"), "{e}");
}
