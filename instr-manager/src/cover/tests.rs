use super::*;

fn block(f: &str, fa: u64, s: u64, e: u64) -> CoverBlock {
    CoverBlock {
        function: f.into(),
        func_addr: fa,
        start: s,
        end: e,
        site: Ok(Mechanism::Jmp),
        succs: Vec::new(),
        branch: None,
        shared_name: false,
    }
}

#[test]
fn lcov_marks_a_line_executed_when_a_hit_block_covers_it() {
    let lines = LineTable {
        files: vec!["/src/a.c".into()],
        ranges: vec![
            LineRange {
                start: 0x10,
                end: 0x14,
                file: 0,
                line: 3,
            },
            LineRange {
                start: 0x14,
                end: 0x20,
                file: 0,
                line: 4,
            },
            LineRange {
                start: 0x20,
                end: 0x28,
                file: 0,
                line: 6,
            },
        ],
    };
    let a = block("f", 0x10, 0x10, 0x18);
    let b = block("f", 0x10, 0x18, 0x28);
    let out = lcov(
        "t",
        &[
            BlockHits {
                block: &a,
                hits: Some(5),
            },
            BlockHits {
                block: &b,
                hits: Some(0),
            },
        ],
        &lines,
    );
    assert_eq!(
        out,
        "TN:t\nSF:/src/a.c\nFN:3,f\nFNDA:5,f\nFNF:1\nFNH:1\nDA:3,5\nDA:4,5\nDA:6,0\nLF:3\nLH:2\nend_of_record\n"
    );
}

#[test]
fn overlapping_finds_a_range_that_starts_before_the_block() {
    let lines = LineTable {
        files: vec!["a".into()],
        ranges: vec![LineRange {
            start: 0x10,
            end: 0x30,
            file: 0,
            line: 1,
        }],
    };
    assert_eq!(lines.overlapping(0x20, 0x22).count(), 1);
    assert_eq!(lines.overlapping(0x30, 0x32).count(), 0);
}

#[test]
fn kernel_blocks_put_the_entry_site_past_fentry_and_leave_int3_padding_out() {
    #[rustfmt::skip]
    let code: Vec<u8> = vec![
        /*00*/ 0x0F, 0x1F, 0x44, 0x00, 0x00, // nop5 (the ftrace site)
        /*05*/ 0x85, 0xFF,                   // test edi, edi
        /*07*/ 0x74, 0x03,                   // je 0x0c
        /*09*/ 0x31, 0xC0,                   // xor eax, eax
        /*0b*/ 0xC3,                         // ret
        /*0c*/ 0xB8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1
        /*11*/ 0xC3,                         // ret
        /*12*/ 0xCC, 0xCC,                   // int3 padding
    ];
    let base = 0xffff_ffff_8100_0000;
    let sym = Symbol {
        name: "f".into(),
        addr: base,
        size: code.len() as u64,
        kind: SymbolKind::Function,
        origin: None,
        version: None,
    };
    let table = trapvec::SymbolTable::new(vec![sym.clone()]);
    let read = |a: u64, n: usize| {
        let off = usize::try_from(a - base).ok()?;
        code.get(off..off + n).map(<[u8]>::to_vec)
    };
    let got = kernel_blocks(&[&sym], &table, &read, true);
    let sites: Vec<(u64, u64)> = got
        .iter()
        .map(|b| (b.block.start - base, b.site - base))
        .collect();
    assert_eq!(sites, vec![(0, 5), (9, 9), (0xc, 0xc)]);
    assert!(got.iter().all(|b| b.block.site.is_ok()));
}

#[test]
fn a_kernel_function_in_freed_init_memory_is_one_refused_block_never_read() {
    let sym = |name: &str, addr: u64, kind: SymbolKind| Symbol {
        name: name.into(),
        addr,
        size: 0,
        kind,
        origin: None,
        version: None,
    };
    let table = trapvec::SymbolTable::new(vec![
        sym("__init_begin", 0x8000, SymbolKind::Object),
        sym("tcp_init", 0x8100, SymbolKind::Function),
        sym("__init_end", 0x8200, SymbolKind::Object),
        sym("_einit", 0x8200, SymbolKind::Function),
    ]);
    let f = table.lookup("tcp_init").unwrap().clone();
    let reads = std::cell::Cell::new(0);
    let read = |_: u64, n: usize| {
        reads.set(reads.get() + 1);
        Some(vec![0x61; n])
    };
    let got = kernel_blocks(&[&f], &table, &read, true);
    assert_eq!(reads.get(), 0, "freed memory is not read");
    assert_eq!(got.len(), 1);
    let b = &got[0].block;
    assert_eq!((b.start, b.end), (0x8100, 0x8200));
    let r = b.site.as_ref().unwrap_err();
    assert_eq!(r.kind, "init_freed");
    assert!(r.reason.contains("freed after boot"), "{}", r.reason);
}

#[test]
fn refusal_kinds_are_the_causes_names() {
    let r = crate::Refusal::NoRoomForJmp {
        site: 1,
        reason: "x".into(),
    };
    assert_eq!(kind_of(&r), "no_room_for_jmp");
    // A block of only the entry bytes, and one that cannot be read.
    let sym = Symbol {
        name: "f".into(),
        addr: 0x1000,
        size: 5,
        kind: SymbolKind::Function,
        origin: None,
        version: None,
    };
    let table = trapvec::SymbolTable::new(vec![sym.clone()]);
    let nop5 = |_: u64, n: usize| Some(crate::point::NOP5[..n.min(5)].to_vec());
    let got = kernel_blocks(&[&sym], &table, &nop5, true);
    let kinds: Vec<&str> = got
        .iter()
        .map(|b| b.block.site.as_ref().unwrap_err().kind.as_str())
        .collect();
    assert_eq!(kinds, ["overlaps_fentry"]);
    let none = |_: u64, _: usize| None;
    let got = kernel_blocks(&[&sym], &table, &none, true);
    let r = got[0].block.site.as_ref().unwrap_err();
    assert_eq!(r.kind, "unreadable");
    assert!(r.reason.contains("cannot be read"), "{}", r.reason);
}
