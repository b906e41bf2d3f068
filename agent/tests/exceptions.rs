//! C++ exceptions thrown through spliced functions: a destructor's cleanup (`with_cleanup`), a
//! `catch` (`catcher`) and a hand-written function whose landing pad follows a one-byte nop
//! (`padded_catch`), spliced by trap and by jmp at their entries (the displaced `call` the
//! exception unwinds through) and at their landing pads (where the unwinder lands), with exact
//! hit counts and the output of the unspliced run; and a window over a landing pad refused,
//! naming it. The program (`fixtures/eh.cc`, `fixtures/eh_pad.S`) is built with g++ at test
//! time; the landing pads' offsets are read from it as the splicer reads them.

use std::path::Path;

use instr_manager::analysis::landing::{landing_pads, EhFrameHdr, HdrTable};
use object::{Object, ObjectSection, ObjectSymbol};

mod common;
use common::{count_component, gxx, spec, Program, Run};

/// The program (with its hand-written landing pad) and the counting component beside it.
fn fixture() -> Program {
    let p = gxx("eh", &["eh.cc", "eh_pad.S"]);
    count_component(&p.dir);
    p
}

/// The offset in `name` of its one landing pad, read from the file's `.eh_frame_hdr`, FDE and
/// LSDA (and, for a function with a cold part, only those inside the function itself).
fn landing_pad_offset(program: &Path, name: &str) -> u64 {
    let data = std::fs::read(program).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let regions: Vec<(u64, Vec<u8>)> = file
        .sections()
        .filter(|s| s.address() != 0)
        .filter_map(|s| Some((s.address(), s.data().ok()?.to_vec())))
        .collect();
    let read = |addr: u64, len: usize| {
        regions.iter().find_map(|(a, b)| {
            let off = usize::try_from(addr.checked_sub(*a)?).ok()?;
            b.get(off..off.checked_add(len)?).map(<[u8]>::to_vec)
        })
    };
    let h = file.section_by_name(".eh_frame_hdr").unwrap();
    let table = HdrTable::read(
        &read,
        name,
        EhFrameHdr {
            addr: h.address(),
            len: h.size(),
        },
    )
    .unwrap();
    let sym = file.symbols().find(|s| s.name() == Ok(name)).unwrap();
    let (lo, hi) = (sym.address(), sym.address() + sym.size());
    let pads: Vec<u64> = landing_pads(&read, name, &table, lo, hi)
        .unwrap()
        .iter()
        .map(|p| p.addr)
        .filter(|&a| a >= lo && a < hi)
        .collect();
    assert_eq!(pads.len(), 1, "{name}: {pads:x?}");
    pads[0] - lo
}

impl Run {
    fn hits(&self, i: usize) -> u64 {
        let stats = self
            .stats
            .as_ref()
            .unwrap_or_else(|| panic!("no stats written; stderr: {}", self.stderr()));
        stats["splices"][i]["hits"]
            .as_u64()
            .unwrap_or_else(|| panic!("splice {i}: {stats}"))
    }
}

#[test]
fn exceptions_thrown_through_splices_at_entries_and_landing_pads_land_and_count_exactly() {
    let f = fixture();
    let plain = f.run(None, &["30"]);
    assert!(plain.out.status.success(), "{}", plain.stderr());
    // 30 calls of each, the 10 multiples of three throw.
    assert_eq!(
        plain.stdout(),
        "sum 620 caught 10 cleanups 30 padded 600 caught 10\n"
    );
    let pad = |name: &str| format!("{name}+{:#x}", landing_pad_offset(&f.path, name));
    let (cleanup_pad, catch_pad, padded_pad) =
        (pad("with_cleanup"), pad("catcher"), pad("padded_catch"));
    assert_eq!(
        padded_pad, "padded_catch+0xf",
        "after sub, call, add, ret and the nop"
    );
    for mech in ["trap", "jmp"] {
        let points = [
            ("with_cleanup", 30),
            (cleanup_pad.as_str(), 10),
            ("catcher", 30),
            (catch_pad.as_str(), 10),
            ("padded_catch", 30),
            (padded_pad.as_str(), 10),
        ];
        let spec_text = spec(&points.iter().map(|&(at, _)| (at, mech)).collect::<Vec<_>>());
        let r = f.run(Some(&spec_text), &["30"]);
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        assert_eq!(
            r.stdout(),
            plain.stdout(),
            "{mech}: the output of the unspliced run"
        );
        for (i, (at, hits)) in points.iter().enumerate() {
            assert_eq!(r.hits(i), *hits, "{mech}: {at}");
        }
    }
}

#[test]
fn a_splice_whose_window_covers_a_landing_pad_is_refused_naming_it() {
    let f = fixture();
    // The nop before padded_catch's landing pad: a trap displaces it and the pad's first
    // instruction; a jmp (rel32, or rel8 to a springboard) covers the pad too.
    for mech in ["trap", "jmp"] {
        let r = f.run(Some(&spec(&[("padded_catch+0xe", mech)])), &["30"]);
        assert_eq!(r.out.status.code(), Some(86), "{mech}: {}", r.stderr());
        let err = r.stderr();
        assert!(
            err.contains("covers the exception landing pad at padded_catch+0xf"),
            "{mech}: {err}"
        );
        assert!(err.contains("from .gcc_except_table"), "{mech}: {err}");
        assert_eq!(r.stdout(), "", "{mech}: nothing ran");
    }
}
