//! The analysis checked against known code: the hand-assembled fixture (tests/fixtures/known.S),
//! whose instruction lengths and spliceability at each boundary are known exactly.

mod common;

use bench::coverage::{plan_function, JmpKind, PointAnswers, DISTANCES};
use bench::sets::CodeSet;
use bench::sizes::{self, LengthHistogram};
use instr_manager::image::{CodeImage, NOP5};
use object::{Object, ObjectSection, ObjectSymbol};
use std::sync::Arc;

fn answers(img: &CodeImage, func: &str) -> Vec<PointAnswers> {
    let i = img
        .functions
        .iter()
        .position(|f| f.name == func)
        .unwrap_or_else(|| panic!("no function {func}"));
    let mut out = Vec::new();
    plan_function(img, i, &DISTANCES[..1], |p| out.push(p));
    out
}

fn at(answers: &[PointAnswers], start: u64, off: u64) -> &PointAnswers {
    answers
        .iter()
        .find(|p| p.site == start + off)
        .unwrap_or_else(|| panic!("no boundary at +{off:#x}"))
}

#[test]
fn sizes_of_the_hand_assembled_object_count_each_length_exactly() {
    let b = common::build();
    let img = CodeImage::from_path(&b.path("known.o")).unwrap();
    assert!(img.kernel, "an object calling __fentry__ is kernel code");
    assert_eq!(
        img.fentry_nops, 1,
        "the one `call __fentry__` at f_traced's entry is NOPed"
    );
    let names: Vec<&str> = img.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["f_lengths", "f_traced", "f_short", "f_loop", "f_end"]
    );
    let rows = sizes::sizes(&[CodeSet::whole("known.o", "test", Arc::new(img))]);
    let h: &LengthHistogram = &rows[0].histogram;
    let mut expect = [0u64; 16];
    // f_lengths 1,3,7,2,5,10,1,1; f_traced 5(NOP),1,5,1,1; f_short 2,1; f_loop 2,3,3,2,1; f_end 1.
    for len in [
        1, 3, 7, 2, 5, 10, 1, 1, 5, 1, 5, 1, 1, 2, 1, 2, 3, 3, 2, 1, 1,
    ] {
        expect[len] += 1;
    }
    assert_eq!(h.counts, expect);
    assert_eq!(h.total(), 21);
    assert_eq!(h.functions, 5);
    assert_eq!(h.code_bytes, 30 + 13 + 3 + 11 + 1);
    assert!((h.share_at_least(5) - 5.0 / 21.0).abs() < 1e-12);
}

#[test]
fn planner_answers_at_known_boundaries_of_the_object() {
    let b = common::build();
    let img = CodeImage::from_path(&b.path("known.o")).unwrap();
    let start = |n: &str| img.functions.iter().find(|f| f.name == n).unwrap().start;

    let a = answers(&img, "f_lengths");
    assert_eq!(
        a.iter().map(|p| p.insn_len).collect::<Vec<_>>(),
        [1, 3, 7, 2, 5, 10, 1, 1]
    );
    let s = start("f_lengths");
    // push rbp; mov rbp,rsp; lea rax,[rip]: 11 bytes in one block: both mechanisms.
    assert_eq!(at(&a, s, 0).at[0].trap, Ok(()));
    assert_eq!(at(&a, s, 0).at[0].jmp, JmpKind::Rel32);
    // The final 1-byte ret: even 2 bytes run past the end.
    let last = &at(&a, s, 0x1d).at[0];
    assert_eq!(last.trap, Err("window past the function's end"));
    assert_eq!(last.jmp, JmpKind::Impossible);
    assert_eq!(last.jmp_refusal, Some("window past the function's end"));

    let a = answers(&img, "f_traced");
    let s = start("f_traced");
    assert_eq!(
        img.read(s, 5).unwrap(),
        NOP5,
        "the fentry call is the running kernel's NOP"
    );
    let entry = &at(&a, s, 0).at[0];
    assert_eq!(entry.trap, Err("overlaps the ftrace NOP"));
    assert_eq!(entry.jmp, JmpKind::Impossible);
    // push rbx; call f_lengths: 6 bytes, the call last: both mechanisms.
    assert_eq!(at(&a, s, 5).at[0].trap, Ok(()));
    assert_eq!(at(&a, s, 5).at[0].jmp, JmpKind::Rel32);

    // A 3-byte function: trap yes; jmp only through a springboard in the int3 fill after it.
    let a = answers(&img, "f_short");
    let s = start("f_short");
    assert_eq!(at(&a, s, 0).at[0].trap, Ok(()));
    assert_eq!(at(&a, s, 0).at[0].jmp, JmpKind::Rel8Springboard);

    // The loop head at +2 is a branch target: a 5-byte window at +0 would swallow it; the jne at
    // +8 ends its block, so 5 bytes do not fit there either.
    let a = answers(&img, "f_loop");
    let s = start("f_loop");
    assert_eq!(at(&a, s, 0).at[0].trap, Ok(()));
    assert_eq!(at(&a, s, 0).at[0].jmp, JmpKind::Rel8Springboard);
    assert_eq!(at(&a, s, 8).at[0].trap, Ok(()));
    assert_eq!(at(&a, s, 8).at[0].jmp, JmpKind::Rel8Springboard);
    assert_eq!(
        at(&a, s, 2).at[0].jmp,
        JmpKind::Rel32,
        "add; cmp: 6 bytes before the jne"
    );
    assert_eq!(
        at(&a, s, 0xa).at[0].trap,
        Err("window past the function's end")
    );
}

#[test]
fn vmlinux_with_kallsyms_undoes_kaslr_and_nops_fentry() {
    let b = common::build();
    let elf = std::fs::read(b.path("known.elf")).unwrap();
    let file = object::File::parse(&*elf).unwrap();
    let text = file.section_by_name(".text").unwrap();
    const KASLR: u64 = 0x2a0_0000;
    let mut ks = format!("{:016x} T _text\n", text.address() + KASLR);
    for s in file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
    {
        ks.push_str(&format!(
            "{:016x} t {}\n",
            s.address() + KASLR,
            s.name().unwrap()
        ));
    }
    ks.push_str(&format!(
        "{:016x} T _etext\n",
        text.address() + text.size() + KASLR
    ));
    ks.push_str("ffffffffc0000000 t mod_fn\t[some_module]\n");
    bench::kernel::check_kallsyms(&ks, &elf, "test kallsyms", "known.elf").unwrap();
    let img = CodeImage::vmlinux(&elf, &ks, "known.elf").unwrap();
    let f = img.functions.iter().find(|f| f.name == "f_traced").unwrap();
    let sym = file.symbols().find(|s| s.name() == Ok("f_traced")).unwrap();
    assert_eq!(
        f.start,
        sym.address(),
        "kallsyms addresses brought back to the file's"
    );
    assert_eq!(img.read(f.start, 5).unwrap(), NOP5);
    assert_eq!(img.fentry_nops, 1);
    assert!(
        img.functions.iter().all(|f| f.name != "mod_fn"),
        "module symbols are not vmlinux code"
    );
    // Without sizes, f_lengths runs to the next symbol: its trailing int3 fill is left out.
    let mut h = LengthHistogram::default();
    let fl = img
        .functions
        .iter()
        .find(|f| f.name == "f_lengths")
        .unwrap();
    h.add_function(fl.start, img.bytes_of(fl));
    assert_eq!(h.total(), 8);
    assert_eq!(h.padding_bytes, 2);
}

#[test]
fn points_csv_lists_every_boundary_with_both_answers() {
    let b = common::build();
    let img = Arc::new(CodeImage::from_path(&b.path("known.o")).unwrap());
    let csv = bench::coverage::points_csv(&CodeSet::whole("known.o", "test", img));
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 21, "8 + 5 + 2 + 5 + 1 boundaries");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("\"known.o\",f_short,0,")
                && l.ends_with(",2,ok,rel8+springboard,")),
        "{csv}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("\"known.o\",f_traced,0,")
                && l.contains(",overlaps the ftrace NOP,impossible,")),
        "{csv}"
    );
}
