//! Unit tests: the parse of every construct, each kind of error, and the code of each map kind
//! decoded back.

use crate::ast::*;
use crate::check::{MapKind, Ty};
use crate::*;

fn parse(src: &str) -> Program {
    parser::parse(src).unwrap_or_else(|e| panic!("{src}: {e:?}"))
}

fn check_err(src: &str, allow_changes: bool) -> CompileError {
    match check(
        src,
        CheckOptions {
            allow_changes,
            ..Default::default()
        },
    ) {
        Ok(_) => panic!("`{src}` checked"),
        Err(e) => e,
    }
}

fn opts() -> Options {
    Options {
        allow_changes: true,
        slots: 64,
        dump_path: "/tmp/x".into(),
        kernel: None,
    }
}

fn same(_: Option<&str>, n: &str) -> Result<Vec<String>, String> {
    Ok(vec![n.to_string()])
}

#[test]
fn probes_of_every_form_parse() {
    let p = parse("BEGIN { printf(\"hi\\n\") } compute, compute+8, compute:return, libc.so.6:malloc, tcp_* , END {}");
    let specs: Vec<_> = p
        .probes
        .iter()
        .flat_map(|p| p.specs.iter().map(|s| s.0.clone()))
        .collect();
    let f = |object: Option<&str>, name: &str, offset, ret| ProbeSpec::Func {
        object: object.map(str::to_string),
        name: name.into(),
        offset,
        ret,
    };
    assert_eq!(
        specs,
        vec![
            ProbeSpec::Begin,
            f(None, "compute", 0, false),
            f(None, "compute", 8, false),
            f(None, "compute", 0, true),
            f(Some("libc.so.6"), "malloc", 0, false),
            f(None, "tcp_*", 0, false),
            ProbeSpec::End,
        ]
    );
}

#[test]
fn predicate_and_precedence_parse() {
    let p = parse("f /pid == 1 && arg0 + 2 * 3 > 4 || !arg1/ { @ = count() }");
    let pred = p.probes[0].predicate.clone().unwrap();
    let ExprKind::Binary(BinOp::LogOr, l, r) = pred.kind else {
        panic!("{pred:?}")
    };
    assert!(matches!(r.kind, ExprKind::Unary(UnOp::Not, _)));
    let ExprKind::Binary(BinOp::LogAnd, _, gt) = l.kind else {
        panic!()
    };
    let ExprKind::Binary(BinOp::Gt, sum, _) = gt.kind else {
        panic!()
    };
    let ExprKind::Binary(BinOp::Add, _, mul) = sum.kind else {
        panic!()
    };
    assert!(matches!(mul.kind, ExprKind::Binary(BinOp::Mul, _, _)));
}

#[test]
fn statements_of_every_kind_parse() {
    let p = parse(
        "f:return { $x = *(u32 *)(arg0 + 8); @m[func, $x] = sum((s16)$x); retval = 1; reg(\"rdx\") = 2; @v = -$x % 3 }
         g { arg1 = arg2 << 1; @h = hist(arg0); @l = lhist(arg0, 0, 100, 10); @a = avg(nsecs); @n = min(cpu); @x = max(tid) }",
    );
    let b = &p.probes[0].body;
    assert!(matches!(
        &b[0],
        Stmt::VarAssign {
            value: Expr {
                kind: ExprKind::Deref(
                    IntTy {
                        bytes: 4,
                        signed: false
                    },
                    _
                ),
                ..
            },
            ..
        }
    ));
    assert!(matches!(&b[1], Stmt::MapAssign { keys, .. } if keys.len() == 2));
    assert!(matches!(
        &b[2],
        Stmt::Change {
            target: Target::Retval,
            ..
        }
    ));
    assert!(matches!(&b[3], Stmt::Change { target: Target::Reg(r), .. } if r == "rdx"));
    assert!(matches!(
        &p.probes[1].body[0],
        Stmt::Change {
            target: Target::Arg(1),
            ..
        }
    ));
    let c = check(
        "f:return { $x = *(u32 *)(arg0 + 8); @m[func, $x] = sum((s16)$x); retval = 1 } g { @h = hist(arg0); @l = lhist(arg0, 0, 100, 10); @a = avg(nsecs); @n = min(cpu); @x = max(tid); @c[probe] = count() }",
        CheckOptions {
            allow_changes: true,
            ..Default::default()
        },
    )
    .unwrap();
    let kinds: Vec<_> = c.maps.iter().map(|m| m.kind).collect();
    assert_eq!(
        kinds,
        vec![
            MapKind::Sum,
            MapKind::Hist,
            MapKind::Lhist {
                lo: 0,
                hi: 100,
                step: 10
            },
            MapKind::Avg,
            MapKind::Min,
            MapKind::Max,
            MapKind::Count
        ]
    );
    assert_eq!(c.maps[0].keys, vec![Ty::Str, Ty::Int { signed: false }]);
}

#[test]
fn begin_end_printf_formats_constants() {
    let c = check(
        "BEGIN { printf(\"%s %5d|%-3x|%%\\n\", \"go\", -12, 255) }",
        CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(format_printf(&c.begin[0]), "go   -12|ff |%\n");
}

/// Each error kind: the message and the column.
#[test]
fn errors_name_line_and_column() {
    let cases: &[(&str, bool, (u32, u32), &str)] = &[
        ("f { @ = pidd }", false, (1, 9), "unknown builtin 'pidd'"),
        ("f { @ = foo(1) }", false, (1, 9), "unknown function 'foo'"),
        ("f { @ = \"abc }", false, (1, 9), "unterminated string"),
        (
            "f { @ = 1 # 2 }",
            false,
            (1, 11),
            "unexpected character '#'",
        ),
        (
            "f { @ = 99999999999999999999 }",
            false,
            (1, 9),
            "bad integer",
        ),
        (
            "f { @ = count() ",
            false,
            (1, 17),
            "expected ';', found the end of the program",
        ),
        ("f+zz { @ = count() }", false, (1, 1), "bad offset"),
        (
            "f+4:return { @ = count() }",
            false,
            (1, 1),
            "a return probe takes no offset",
        ),
        (
            "f { @ = retval }",
            false,
            (1, 9),
            "retval is only known at a :return probe",
        ),
        (
            "f:return { retval = 0 }",
            false,
            (1, 12),
            "changing retval needs --allow-changes",
        ),
        (
            "f { retval = 0 }",
            true,
            (1, 5),
            "retval can only be changed at a :return probe",
        ),
        (
            "f:return { arg0 = 1 }",
            true,
            (1, 12),
            "can only be changed at a function's entry",
        ),
        (
            "f+4 { arg0 = 1 }",
            true,
            (1, 7),
            "is the argument at the entry",
        ),
        (
            "f:return { reg(\"rbx\") = 1 }",
            true,
            (1, 12),
            "only rax and rdx",
        ),
        (
            "f { reg(\"rsp\") = 1 }",
            true,
            (1, 5),
            "rsp cannot be changed",
        ),
        (
            "f { @ = reg(\"eax\") }",
            false,
            (1, 9),
            "unknown register 'eax'",
        ),
        (
            "f { @ = $y }",
            false,
            (1, 9),
            "variable '$y' is used before it is assigned",
        ),
        (
            "f { @a = count() } g { @a = sum(1) }",
            false,
            (1, 24),
            "map '@a' holds count() (at 1:5), here sum()",
        ),
        (
            "f { @a[1] = count() } g { @a = count() }",
            false,
            (1, 27),
            "map '@a' has 1 key(s)",
        ),
        (
            "f { @a[func] = count(); @a[1] = count() }",
            false,
            (1, 25),
            "is a string in one place",
        ),
        ("f { @ = count() + 1 }", false, (1, 9), "is an aggregation"),
        (
            "f { @ = sum(1, 2) }",
            false,
            (1, 9),
            "sum() takes 1 argument(s)",
        ),
        (
            "f { @ = lhist(arg0, 0, arg1, 1) }",
            false,
            (1, 24),
            "must be integer constants",
        ),
        ("f { @ = lhist(arg0, 5, 1, 1) }", false, (1, 9), "lo < hi"),
        (
            "f { @ = func + 1 }",
            false,
            (1, 9),
            "a string can only be a map key",
        ),
        (
            "f { printf(\"%d\", comm) }",
            false,
            (1, 5),
            "argument 1 is a string, the conversion wants an integer",
        ),
        (
            "f { printf(\"%s%s\", str(arg0, 128), comm) }",
            false,
            (1, 5),
            "take 18 words, at most 16",
        ),
        (
            "f { print(@x) }",
            false,
            (1, 5),
            "only in an interval probe",
        ),
        (
            "f { @h = hist(arg0) } g { @ = @h }",
            false,
            (1, 31),
            "a histogram cannot be read in an expression",
        ),
        (
            "f { @c[arg0] = count() } g { delete(@c) }",
            false,
            (1, 30),
            "map '@c' has 1 key(s) (at 1:5), here 0",
        ),
        (
            "f { @c[comm] = count() } g { delete(@c[arg0]) }",
            false,
            (1, 30),
            "key 1 is not of the kind",
        ),
        (
            "f { @m = max(arg0) } interval:s:1 { clear(@m) }",
            false,
            (1, 37),
            "clear(@m) in an interval",
        ),
        ("interval:s:0 { exit() }", false, (1, 1), "bad interval"),
        (
            "interval:m:5 { exit() }",
            false,
            (1, 1),
            "interval:s:N or interval:ms:N",
        ),
        (
            "interval:s:1 { @ = count() }",
            false,
            (1, 16),
            "an interval probe runs in trapctl",
        ),
        (
            "f { clear(@nope) }",
            false,
            (1, 5),
            "map '@nope' is never assigned",
        ),
        (
            "BEGIN { @ = count() }",
            false,
            (1, 9),
            "only printf is allowed",
        ),
        (
            "BEGIN { printf(\"%d\", arg0) }",
            false,
            (1, 22),
            "BEGIN and END print constants only",
        ),
        (
            "BEGIN { printf(\"%d %d\", 1) }",
            false,
            (1, 9),
            "conversion 2 has no argument",
        ),
        (
            "BEGIN { printf(\"%s\", 1) }",
            false,
            (1, 9),
            "%s wants a string",
        ),
        ("BEGIN, f { }", false, (1, 1), "BEGIN and END cannot share"),
        (
            "f { @ = *(u128 *)(arg0) }",
            false,
            (1, 10),
            "needs a pointer type",
        ),
        ("f { @ = @x }", false, (1, 9), "map '@x' is never assigned"),
        (
            "f { @ = clear(@x) }",
            false,
            (1, 9),
            "clear() is a statement of its own",
        ),
        ("f { foo = 1 }", false, (1, 5), "cannot start a statement"),
        ("", false, (1, 1), "the program has no probe"),
    ];
    for (src, allow, (line, col), want) in cases {
        let e = check_err(src, *allow);
        assert!(
            e.message.contains(want) && (e.pos.line, e.pos.col) == (*line, *col),
            "`{src}`: got {}:{} {:?}, want {line}:{col} {want:?}",
            e.pos.line,
            e.pos.col,
            e.message
        );
    }
}

#[test]
fn error_display_has_a_caret_under_the_culprit() {
    let e = check_err("compute { @[pidd] = count() }", false);
    assert_eq!(
        e.to_string(),
        "error at 1:13: unknown builtin 'pidd'\ncompute { @[pidd] = count() }\n            ^"
    );
    assert_eq!(e.headline(), "error at 1:13: unknown builtin 'pidd'");
}

#[test]
fn globs_expand_to_one_splice_per_function_and_misses_are_errors() {
    let mut expand = |_: Option<&str>, n: &str| -> Result<Vec<String>, String> {
        Ok(if n == "a*" {
            vec!["ab".into(), "ac".into()]
        } else {
            vec![]
        })
    };
    let c = compile("a*:return { @[func] = count() }", &opts(), &mut expand).unwrap();
    let at: Vec<_> = c.splices.iter().map(|s| (s.at.as_str(), s.ret)).collect();
    assert_eq!(at, vec![("ab", true), ("ac", true)]);
    let e = compile("zz { @ = count() }", &opts(), &mut expand).unwrap_err();
    assert!(
        e.to_string().contains("probe 'zz' matches no function"),
        "{e}"
    );
}

#[test]
fn the_component_is_an_elf_relocatable_with_pc32_relocations() {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let c = compile(
        "f { @[arg0] = count() } g+4 { @s = sum(arg1) }",
        &opts(),
        &mut same,
    )
    .unwrap();
    let f = object::File::parse(&*c.object).unwrap();
    assert_eq!(f.kind(), object::ObjectKind::Relocatable);
    let names: Vec<_> = f
        .symbols()
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    for n in [
        "trapvec_trace_h0",
        "trapvec_trace_h1",
        DUMP_SYMBOL,
        DATA_SYMBOL,
    ] {
        assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
    }
    let text = f.section_by_name(".text").unwrap();
    assert_eq!(text.relocations().count(), 4);
    let spec = c.spec("/t/trace.o", "libc.so.6:exit");
    assert!(
        spec.contains("at = \"g+0x4\"") && spec.contains("handler = \"trapvec_trace_dump\""),
        "{spec}"
    );
    // The exit flag and the ring's head (no ring: no probe prints), the counters, the maps.
    assert_eq!(
        c.layout.size,
        8 * 2 + 8 * 2 + 8 * 2 + 64 * (1 + 1 + 1) * 8 + (1 + 1) * 8
    );
}

/// A kernel program's task fields, as a 6.1 INFO might give them.
const TASK: KernelTask = KernelTask {
    current_task: 0x1fbc0,
    pid: 0x5a0,
    tgid: 0x5a4,
    comm: 0x758,
};

#[test]
fn a_kernel_component_calls_the_kernels_nofault_reads_and_has_no_dump_handler() {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget};
    let o = Options {
        kernel: Some(TASK),
        ..opts()
    };
    let c = compile(
        "f /pid == 7/ { @[comm, str(arg0, 20)] = count(); @r = sum(*(u32 *)(arg1 + 8)); @t = max(nsecs) }",
        &o,
        &mut same,
    )
    .unwrap();
    let f = object::File::parse(&*c.object).unwrap();
    let names: Vec<String> = f
        .symbols()
        .filter_map(|s| s.name().ok().map(str::to_string))
        .collect();
    assert!(!names.iter().any(|n| n == DUMP_SYMBOL), "{names:?}");
    assert!(f.section_by_name(".rodata").is_none(), "no dump path");
    let text = f.section_by_name(".text").unwrap();
    let bytes = text.data().unwrap();
    let mut called = Vec::new();
    for (off, r) in text.relocations() {
        let RelocationTarget::Symbol(i) = r.target() else {
            panic!("a relocation against a symbol")
        };
        let s = f.symbol_by_index(i).unwrap();
        if s.is_undefined() {
            assert_eq!(
                r.flags(),
                object::RelocationFlags::Elf {
                    r_type: object::elf::R_X86_64_PLT32
                }
            );
            assert_eq!(
                bytes[usize::try_from(off).unwrap() - 1],
                0xE8,
                "a call rel32"
            );
            called.push(s.name().unwrap().to_string());
        }
    }
    called.sort();
    called.dedup();
    assert_eq!(
        called,
        [
            "copy_from_kernel_nofault",
            "copy_from_user_nofault",
            "ktime_get_mono_fast_ns",
            "strncpy_from_kernel_nofault",
            "strncpy_from_user_nofault"
        ]
    );
    // gs:[current_task] then the tgid (pid's) dword.
    let mut gs = vec![0x65, 0x48, 0x8B, 0x04, 0x25];
    gs.extend(0x1fbc0i32.to_le_bytes());
    assert!(
        bytes.windows(gs.len()).any(|w| w == gs),
        "mov rax, gs:[current_task]"
    );
    let spec = c.kernel_spec("/t/trace.o");
    assert!(!spec.contains("trapvec_trace_dump"), "{spec}");
    assert_eq!(spec.matches("[[splice]]").count(), 1, "{spec}");
}

#[test]
fn cpu_in_a_kernel_program_is_lsl_of_the_per_cpu_segment() {
    let o = Options {
        kernel: Some(TASK),
        ..opts()
    };
    let c = compile("f { @[cpu] = count() }", &o, &mut same).unwrap();
    // mov eax, 0x7b (__CPUNODE_SEG); lsl eax, eax; and eax, 0xfff (the CPU's bits).
    let lsl = [
        0xB8, 0x7B, 0, 0, 0, 0x0F, 0x03, 0xC0, 0x25, 0xFF, 0x0F, 0, 0,
    ];
    assert!(
        c.object.windows(lsl.len()).any(|w| w == lsl),
        "the handler reads the CPU with lsl"
    );
    let p = compile("f { @[cpu] = count() }", &opts(), &mut same).unwrap();
    assert!(
        !p.object.windows(lsl.len()).any(|w| w == lsl),
        "a process asks getcpu"
    );
}

/// The generated code, run in this process: the handlers and the data block in one RWX
/// mapping (so the `lea` displacements are patched by hand, as the loader would), each call
/// given its own registers.
struct Loaded {
    base: *mut u8,
    len: usize,
    c: Compiled,
    offsets: Vec<usize>,
    data: usize,
}

impl Loaded {
    fn new(src: &str) -> Loaded {
        Loaded::new_with(src, &opts())
    }

    fn new_with(src: &str, o: &Options) -> Loaded {
        let c = compile(src, o, &mut same).unwrap_or_else(|e| panic!("{e}"));
        let f = {
            use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
            let f = object::File::parse(&*c.object).unwrap();
            let text = f.section_by_name(".text").unwrap().data().unwrap().to_vec();
            let mut offs = Vec::new();
            for i in 0..c.splices.len() {
                let n = format!("trapvec_trace_h{i}");
                offs.push(
                    f.symbols()
                        .find(|s| s.name() == Ok(n.as_str()))
                        .unwrap()
                        .address()
                        .try_into()
                        .unwrap(),
                );
            }
            (text, offs)
        };
        let (text, offsets) = f;
        let data = (text.len() + 63) & !63;
        let len = data + c.layout.size;
        // SAFETY: a fresh anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        // SAFETY: `len` bytes are mapped at `base`, and `text.len() <= data < len`.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), base, text.len()) };
        for &off in &offsets {
            let place = off + crate::codegen::DATA_DISP;
            let d = i32::try_from(data).unwrap() - i32::try_from(place + 4).unwrap();
            // SAFETY: the displacement lies inside the copied text.
            unsafe { std::ptr::write_unaligned(base.add(place).cast::<i32>(), d) };
        }
        Loaded {
            base,
            len,
            c,
            offsets,
            data,
        }
    }

    /// Call handler `h` with these registers (and, at a return, these entry arguments).
    fn call(&self, h: usize, regs: &mut [u64; 18], args: [u64; 6]) {
        let mut call = [0u64; 11];
        call[..6].copy_from_slice(&args);
        // SAFETY: the handler's code was copied and relocated above; it follows the C ABI of
        // trapvec.h and touches only `regs`, `call` and the data block.
        unsafe {
            let f: extern "C" fn(*mut u64, *mut u64) =
                std::mem::transmute(self.base.add(self.offsets[h]));
            f(regs.as_mut_ptr(), call.as_mut_ptr());
        }
    }

    /// The data block as it is now (what trapctl reads).
    fn data(&self) -> Vec<u8> {
        // SAFETY: the data block lies inside the mapping.
        unsafe { std::slice::from_raw_parts(self.base.add(self.data), self.c.layout.size) }.to_vec()
    }

    /// The printf lines a drain takes from the data block now.
    fn lines(&self, drain: &mut Drain) -> Vec<String> {
        let d = self.data();
        let head = Layout::head(&d);
        drain.take(&self.c.layout, &d, head, &self.c.formats, &self.c.strings)
    }

    fn results(&self) -> Results {
        // SAFETY: the data block lies inside the mapping.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.data), self.c.layout.size) };
        self.c.layout.decode(data, &self.c.strings).unwrap()
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Entry registers with arguments a0..a5 (rdi, rsi, rdx, rcx, r8, r9).
fn regs(a: [u64; 6]) -> [u64; 18] {
    let mut r = [0u64; 18];
    r[8] = a[0];
    r[9] = a[1];
    r[12] = a[2];
    r[13] = a[3];
    r[7] = a[4];
    r[6] = a[5];
    r
}

fn ints(r: &Results, map: usize) -> Vec<(Vec<layout::KeyPart>, i128)> {
    r.maps[map]
        .entries
        .iter()
        .map(|e| match &e.value {
            layout::Value::Int(v) => (e.key.clone(), *v),
            other => panic!("{other:?}"),
        })
        .collect()
}

use layout::KeyPart::{Int as K, Str as S};

#[test]
fn counts_sums_min_max_avg_by_key() {
    let l = Loaded::new(
        "f { @c[arg0 % 3] = count(); @s = sum(arg1); @mn = min((s64)arg1 - 50); @mx = max(arg1); @a = avg(arg1); @v = arg1 }",
    );
    for i in 0..30u64 {
        l.call(0, &mut regs([i, i * 10, 0, 0, 0, 0]), [0; 6]);
    }
    let r = l.results();
    assert_eq!(
        ints(&r, 0),
        vec![(vec![K(0)], 10), (vec![K(1)], 10), (vec![K(2)], 10)]
    );
    assert_eq!(ints(&r, 1), vec![(vec![], 4350)]);
    assert_eq!(ints(&r, 2), vec![(vec![], -50)]);
    assert_eq!(ints(&r, 3), vec![(vec![], 290)]);
    assert_eq!(ints(&r, 4), vec![(vec![], 145)]);
    assert_eq!(ints(&r, 5), vec![(vec![], 290)]);
}

#[test]
fn a_predicate_selects_and_strings_key_by_probe() {
    let l = Loaded::new("f, g /arg0 >= 5 && (arg0 / 2) * 2 == arg0/ { @[func, probe] = count() }");
    for i in 0..10u64 {
        l.call(0, &mut regs([i, 0, 0, 0, 0, 0]), [0; 6]);
        l.call(1, &mut regs([i, 0, 0, 0, 0, 0]), [0; 6]);
    }
    let r = l.results();
    assert_eq!(
        ints(&r, 0),
        vec![
            (vec![S("f".into()), S("f".into())], 2),
            (vec![S("g".into()), S("g".into())], 2)
        ]
    );
}

#[test]
fn hist_and_lhist_bucket_known_values() {
    let l = Loaded::new("f { @h = hist(arg0); @l = lhist(arg0, 0, 30, 10) }");
    for v in [0u64, 1, 2, 3, 4, 7, 8, 100, 1024, u64::MAX] {
        l.call(0, &mut regs([v, 0, 0, 0, 0, 0]), [0; 6]);
    }
    let r = l.results();
    let text = render(&r);
    let layout::Value::Buckets(h) = &r.maps[0].entries[0].value else {
        panic!()
    };
    let got: Vec<_> = h.iter().map(|b| (b.label.as_str(), b.count)).collect();
    // u64::MAX is -1 as a signed value.
    assert_eq!(
        &got[..6],
        &[
            ("(..., 0)", 1),
            ("[0]", 1),
            ("[1]", 1),
            ("[2, 4)", 2),
            ("[4, 8)", 2),
            ("[8, 16)", 1)
        ]
    );
    assert_eq!(got.last(), Some(&("[1K, 2K)", 1)));
    let layout::Value::Buckets(lh) = &r.maps[1].entries[0].value else {
        panic!()
    };
    let got: Vec<_> = lh.iter().map(|b| (b.label.as_str(), b.count)).collect();
    assert_eq!(
        got,
        vec![
            ("(..., 0)", 1),
            ("[0, 10)", 7),
            ("[10, 20)", 0),
            ("[20, 30)", 0),
            ("[30, ...)", 2)
        ]
    );
    assert!(
        text.contains(
            "[2, 4)                 2 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@|"
        ),
        "{text}"
    );
}

#[test]
fn a_bad_address_is_counted_as_a_failed_read_and_a_good_one_read() {
    let l = Loaded::new("f { @[*(u32 *)(arg0 + 4)] = count() }");
    let words: [u32; 2] = [7, 0xdead_beef];
    l.call(0, &mut regs([words.as_ptr() as u64, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([8, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([8, 0, 0, 0, 0, 0]), [0; 6]);
    let r = l.results();
    assert_eq!(
        ints(&r, 0),
        vec![(vec![K(0xdead_beef)], 1), (vec![K(0)], 2)]
    );
    assert_eq!(
        r.failed_reads,
        vec![layout::FailedReads {
            probe: "f".into(),
            count: 2
        }]
    );
    assert!(render(&r).contains("2 read(s) failed at f: bad address"));
}

#[test]
fn changes_write_the_registers_and_return_reads_entry_arguments() {
    let l = Loaded::new(
        "f:return { @r = sum(arg0); retval = retval * 2 + 1 } g { arg1 = arg0 + 1; reg(\"r10\") = -1; $x = (s8)255; @x = $x }",
    );
    let mut r = regs([0; 6]);
    r[14] = 20; // rax
    l.call(0, &mut r, [5, 0, 0, 0, 0, 0]);
    assert_eq!(r[14], 41);
    let mut r = regs([9, 0, 0, 0, 0, 0]);
    l.call(1, &mut r, [0; 6]);
    assert_eq!((r[9], r[5]), (10, u64::MAX));
    let res = l.results();
    assert_eq!(ints(&res, 0), vec![(vec![], 5)]);
    assert_eq!(ints(&res, 1), vec![(vec![], -1)]);
}

#[test]
fn a_full_table_counts_dropped_updates() {
    let l = Loaded::new("f { @[arg0] = count() }");
    for i in 0..100u64 {
        l.call(0, &mut regs([i, 0, 0, 0, 0, 0]), [0; 6]);
    }
    let r = l.results();
    assert_eq!(r.maps[0].entries.len(), 64);
    assert_eq!(r.maps[0].dropped, 36);
    assert!(render(&r).contains("@: 36 update(s) dropped: the table is full (64 slots)"));
}

#[test]
fn division_by_zero_gives_zero_and_builtins_run() {
    let l = Loaded::new("f { @d = sum(arg0 / arg1); @m = sum((s64)arg0 % -1); @p = max(pid); @t = max(tid); @n = min(nsecs > 0); @c = max(cpu < 4096) }");
    l.call(0, &mut regs([7, 0, 0, 0, 0, 0]), [0; 6]);
    let r = l.results();
    assert_eq!(ints(&r, 0), vec![(vec![], 0)]);
    assert_eq!(ints(&r, 1), vec![(vec![], 0)]);
    assert_eq!(ints(&r, 2), vec![(vec![], i128::from(std::process::id()))]);
    assert!(ints(&r, 3)[0].1 > 0);
    assert_eq!(ints(&r, 4), vec![(vec![], 1)]);
    assert_eq!(ints(&r, 5), vec![(vec![], 1)]);
}

#[test]
fn two_probes_at_one_site_are_refused_at_the_second() {
    let e = compile(
        "f { @a = count() } f:return { @b = count() } f { @c = count() }",
        &opts(),
        &mut same,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("error at 1:46: probe 'f' already uses the site of f (beside its return)"),
        "{e}"
    );
    let e = compile(
        "f:return { @a = count() } f:return { @b = count() }",
        &opts(),
        &mut same,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("error at 1:27: probe 'f:return' already uses the site of f"),
        "{e}"
    );
    assert!(compile(
        "f { @a = count() } f+4, g:return { @b = count() }",
        &opts(),
        &mut same
    )
    .is_ok());
}

#[test]
fn an_entry_probe_goes_beside_its_functions_return_probe_in_the_kernel_and_a_process() {
    let kernel = Options {
        kernel: Some(TASK),
        ..opts()
    };
    for o in [kernel, opts()] {
        entry_beside_return(&o);
    }
}

fn entry_beside_return(o: &Options) {
    let c = compile(
        "f { @a = count() } f:return { @b = count() } g { @c = count() }",
        o,
        &mut same,
    )
    .unwrap();
    let s: Vec<(&str, bool, bool)> = c
        .splices
        .iter()
        .map(|s| (s.at.as_str(), s.ret, s.beside_return))
        .collect();
    assert_eq!(
        s,
        [("f", false, true), ("f", true, false), ("g", false, false)]
    );
    // Both probes keep their names in the report.
    assert_eq!(c.layout.handlers[0].probe, "f");
    assert_eq!(c.layout.handlers[1].probe, "f:return");
    let e = compile("f { return 1 } f:return { @b = count() }", o, &mut same).unwrap_err();
    assert!(
        e.to_string().contains("its entry cannot also skip it"),
        "{e}"
    );
}

#[test]
fn after_window_is_the_next_instruction_past_the_traps_bytes() {
    // nop5 (the ftrace site); push rbp; mov rbp, rsp; ret
    let f = [0x0F, 0x1F, 0x44, 0x00, 0x00, 0x55, 0x48, 0x89, 0xE5, 0xC3];
    assert_eq!(after_window(&f, 0x1000, 5, 2).unwrap(), 9);
    // A 2-byte first instruction is the whole window: xor eax, eax.
    let f = [0x31, 0xC0, 0x55, 0xC3];
    assert_eq!(after_window(&f, 0x1000, 0, 2).unwrap(), 2);
    // mov edi, 1 changes arg0 before the probe's place: refused, naming it.
    let f = [0x0F, 0x1F, 0x44, 0x00, 0x00, 0xBF, 1, 0, 0, 0, 0xC3];
    let e = after_window(&f, 0x1000, 5, 2).unwrap_err().to_string();
    assert!(e.contains("+0x5") && e.contains("rdi"), "{e}");
    // A tail jmp as the first instruction: no place after it.
    let f = [0xE9, 0, 0, 0, 0];
    let e = after_window(&f, 0x1000, 0, 2).unwrap_err().to_string();
    assert!(e.contains("a branch"), "{e}");
    assert!(matches!(
        after_window(&[0x48], 0x1000, 0, 2),
        Err(WindowError::Undecodable(0))
    ));
}

#[test]
fn an_unkeyed_count_as_the_last_statement_assembles_and_counts() {
    let l = Loaded::new("f { @c = count() }");
    for _ in 0..3 {
        l.call(0, &mut regs([0; 6]), [0; 6]);
    }
    assert_eq!(ints(&l.results(), 0), vec![(vec![], 3)]);
}

/// This thread's name as the kernel has it (what `comm` reads).
fn my_comm() -> String {
    std::fs::read_to_string("/proc/thread-self/comm")
        .unwrap()
        .trim_end_matches('\n')
        .to_string()
}

#[test]
fn comm_is_a_key_and_selects_in_a_predicate() {
    let me = my_comm();
    assert!(!me.is_empty() && me.len() <= 15, "{me:?}");
    let src = format!(
        "f {{ @[comm, arg0] = count() }} g /comm == \"{me}\"/ {{ @mine = count() }} h /comm != \"{me}\" && \"x\" != comm/ {{ @other = count() }}"
    );
    let l = Loaded::new(&src);
    for _ in 0..3 {
        l.call(0, &mut regs([7, 0, 0, 0, 0, 0]), [0; 6]);
        l.call(1, &mut regs([0; 6]), [0; 6]);
        l.call(2, &mut regs([0; 6]), [0; 6]);
    }
    let r = l.results();
    assert_eq!(ints(&r, 0), vec![(vec![S(me.clone()), K(7)], 3)]);
    assert_eq!(ints(&r, 1), vec![(vec![], 3)]);
    assert_eq!(ints(&r, 2), vec![]);
    assert!(render(&r).contains(&format!("@[{me}, 7]: 3")));
}

#[test]
fn str_reads_at_most_n_bytes_to_the_nul_and_counts_a_bad_address() {
    let l = Loaded::new(
        "f { @[str(arg0, 5)] = count() } g /str(arg0, 20) == \"hello\"/ { @hello = count() } h { @e[str(arg0, 16)] = count() }",
    );
    let hello = b"hello\0junk";
    let long = b"hello world\0";
    l.call(0, &mut regs([long.as_ptr() as u64, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([hello.as_ptr() as u64, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([c"hi".as_ptr() as u64, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(1, &mut regs([hello.as_ptr() as u64, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(1, &mut regs([long.as_ptr() as u64, 0, 0, 0, 0, 0]), [0; 6]);
    // A string ending 3 bytes before an unmapped page reads whole; a bad address fails.
    // SAFETY: a fresh anonymous mapping of two pages, the second made inaccessible.
    let page = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(
            libc::mprotect(p.cast::<u8>().add(4096).cast(), 4096, libc::PROT_NONE),
            0
        );
        p.cast::<u8>()
    };
    // SAFETY: the first page is mapped read-write.
    unsafe { std::ptr::copy_nonoverlapping(c"ab".as_ptr().cast::<u8>(), page.add(4093), 3) };
    l.call(2, &mut regs([page as u64 + 4093, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(2, &mut regs([8, 0, 0, 0, 0, 0]), [0; 6]);
    // SAFETY: unmapping the two pages mapped above.
    unsafe { libc::munmap(page.cast(), 8192) };
    let r = l.results();
    assert_eq!(
        ints(&r, 0),
        vec![(vec![S("hi".into())], 1), (vec![S("hello".into())], 2)]
    );
    assert_eq!(ints(&r, 1), vec![(vec![], 1)]);
    assert_eq!(
        ints(&r, 2),
        vec![(vec![S("".into())], 1), (vec![S("ab".into())], 1)]
    );
    assert_eq!(
        r.failed_reads,
        vec![layout::FailedReads {
            probe: "h".into(),
            count: 1
        }]
    );
}

#[test]
fn comm_and_str_errors_point_at_the_culprit() {
    let cases: &[(&str, (u32, u32), &str)] = &[
        (
            "f { @ = sum(comm) }",
            (1, 13),
            "comm and str() can only be map keys",
        ),
        (
            "f /comm == 3/ { @ = count() }",
            (1, 9),
            "can only be compared with a string literal",
        ),
        (
            "f /comm == \"abcdefghijklmnop\"/ { @ = count() }",
            (1, 9),
            "can never match",
        ),
        (
            "f { @[str(arg0, 0)] = count() }",
            (1, 17),
            "n must be an integer constant from 1 to 128",
        ),
        (
            "f { @[str(arg0)] = count() }",
            (1, 7),
            "str() takes 2 arguments",
        ),
        (
            "f { @[comm] = count(); @[str(arg0, 8)] = count() }",
            (1, 24),
            "key 1 is a string of another kind",
        ),
        ("f { @ = str(arg0, 8) }", (1, 9), "str() gives a string"),
    ];
    for (src, (line, col), msg) in cases {
        let e = check_err(src, false);
        let s = e.to_string();
        assert!(
            s.starts_with(&format!("error at {line}:{col}: ")) && s.contains(msg),
            "{src}: {s}"
        );
    }
}

#[test]
fn return_at_an_entry_is_a_replacement_returning_the_value() {
    let c = compile(
        "f { @[arg1] = count(); return arg0 * 2 + arg5 } g { @g = count() }",
        &Options {
            allow_changes: true,
            ..opts()
        },
        &mut same,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.splices[0].replace && !c.splices[1].replace);
    let spec = c.spec("t.o", "libc.so.6:exit");
    assert!(
        spec.contains("at = \"f\"\naction = \"replace\"\nhandler = \"trapvec_trace_h0\""),
        "{spec}"
    );
    let mut o = opts();
    o.allow_changes = true;
    let l = Loaded::new_with("f { @[arg1] = count(); return arg0 * 2 + arg5 }", &o);
    // SAFETY: the handler was copied and relocated by `new_with`; as a replacement it has the
    // C signature of the function it replaces (six integer arguments, an integer result).
    let f: extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
        unsafe { std::mem::transmute(l.base.add(l.offsets[0])) };
    assert_eq!(f(20, 7, 0, 0, 0, 1), 41);
    assert_eq!(f(3, 7, 0, 0, 0, 0), 6);
    assert_eq!(ints(&l.results(), 0), vec![(vec![K(7)], 2)]);
    for (src, allow, (line, col), msg) in [
        (
            "f { return 1 }",
            false,
            (1, 5),
            "return (skipping the function) needs --allow-changes",
        ),
        ("f:return { return 1 }", true, (1, 12), "only at its entry"),
        (
            "f { return 1; @ = count() }",
            true,
            (1, 5),
            "must be the probe's last statement",
        ),
    ] {
        let s = check_err(src, allow).to_string();
        assert!(
            s.starts_with(&format!("error at {line}:{col}: ")) && s.contains(msg),
            "{src}: {s}"
        );
    }
}

#[test]
fn return_under_a_predicate_jumps_to_the_original_for_the_calls_it_does_not_select() {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let c = compile(
        "f /arg0 == 3/ { return 7 } g { @g = count() }",
        &opts(),
        &mut same,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.splices[0].replace);
    // The handler's last instruction is a jmp rel32 relocated against f's original trampoline.
    let o = object::File::parse(&*c.object).unwrap();
    let text = o.section_by_name(".text").unwrap();
    let h0 = o
        .symbols()
        .find(|s| s.name() == Ok("trapvec_trace_h0"))
        .unwrap();
    let jumps: Vec<u64> = text
        .relocations()
        .filter_map(|(at, r)| match r.target() {
            object::RelocationTarget::Symbol(i) => {
                let name = o.symbol_by_index(i).unwrap().name().unwrap().to_string();
                (name == "__trapvec_orig_f").then_some(at)
            }
            _ => None,
        })
        .collect();
    assert_eq!(jumps.len(), 1, "{jumps:?}");
    let code = text.data().unwrap();
    let at = usize::try_from(jumps[0]).unwrap();
    assert_eq!(code[at - 1], 0xE9, "a jmp rel32");
    assert!(jumps[0] + 4 <= h0.address() + h0.size());
    // The kernel's handler is the same: its unselected calls go on through the original.
    let kernel = Options {
        kernel: Some(TASK),
        ..opts()
    };
    let c =
        compile("f /arg0 == 1/ { return 1 }", &kernel, &mut same).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.splices[0].replace);
    let o = object::File::parse(&*c.object).unwrap();
    let text = o.section_by_name(".text").unwrap();
    assert_eq!(
        text.relocations()
            .filter(|(_, r)| match r.target() {
                object::RelocationTarget::Symbol(i) =>
                    o.symbol_by_index(i).unwrap().name() == Ok("__trapvec_orig_f"),
                _ => false,
            })
            .count(),
        1
    );
}

#[test]
fn exit_delete_clear_print_and_intervals_parse() {
    let p = parse(
        "f { delete(@m[arg0, 1]); clear(@m); exit() } interval:s:2 { print(@m); clear(@m) } interval:ms:500 { exit() }",
    );
    let b = &p.probes[0].body;
    assert!(matches!(&b[0], Stmt::Delete { name, keys, .. } if name == "m" && keys.len() == 2));
    assert!(matches!(&b[1], Stmt::Clear { name, .. } if name == "m"));
    assert!(matches!(&b[2], Stmt::Exit { .. }));
    assert_eq!(p.probes[1].specs[0].0, ProbeSpec::Interval { ms: 2000 });
    assert!(matches!(&p.probes[1].body[0], Stmt::Print { name, .. } if name == "m"));
    assert_eq!(p.probes[2].specs[0].0, ProbeSpec::Interval { ms: 500 });
    let c = check(
        "f { @m[arg0] = count() } interval:s:1 { printf(\"tick %d\\n\", 1); print(@m); clear(@m); exit() }",
        CheckOptions::default(),
    )
    .unwrap();
    assert_eq!(c.intervals.len(), 1);
    assert_eq!(c.intervals[0].ms, 1000);
    assert_eq!(
        &c.intervals[0].actions[1..],
        &[
            Action::Print("m".into()),
            Action::Clear("m".into()),
            Action::Exit
        ]
    );
    assert!(
        !c.exits,
        "an interval's exit() is the tracer's, not a probe's"
    );
}

#[test]
fn printf_in_a_probe_writes_ring_records_drained_in_order() {
    let l = Loaded::new(
        "f /arg0 != 7/ { printf(\"%s %d %u %x|%s|\\n\", func, (s64)arg0 - 2, arg0, arg1, comm) }",
    );
    assert_eq!(l.c.layout.ring_records, layout::RING_RECORDS);
    assert!(l.c.polls());
    let mut drain = Drain::default();
    assert!(l.lines(&mut drain).is_empty());
    for i in [1u64, 7, 2, 3] {
        l.call(0, &mut regs([i, 255 + i, 0, 0, 0, 0]), [0; 6]);
    }
    let comm = my_comm();
    assert_eq!(
        l.lines(&mut drain),
        vec![
            format!("f -1 1 100|{comm}|\n"),
            format!("f 0 2 101|{comm}|\n"),
            format!("f 1 3 102|{comm}|\n"),
        ]
    );
    // Taken once: a second look finds nothing new.
    assert!(l.lines(&mut drain).is_empty());
    l.call(0, &mut regs([9, 0, 0, 0, 0, 0]), [0; 6]);
    assert_eq!(l.lines(&mut drain), vec![format!("f 7 9 0|{comm}|\n")]);
    assert_eq!(drain.lost, 0);
}

#[test]
fn a_full_ring_overwrites_the_oldest_records_and_the_drain_counts_them_lost() {
    let l = Loaded::new("f { printf(\"%d\\n\", arg0) }");
    let n = layout::RING_RECORDS as u64;
    for i in 0..n + 44 {
        l.call(0, &mut regs([i, 0, 0, 0, 0, 0]), [0; 6]);
    }
    let mut drain = Drain::default();
    let lines = l.lines(&mut drain);
    assert_eq!(drain.lost, 44);
    assert_eq!(lines.len(), layout::RING_RECORDS);
    assert_eq!(lines[0], "44\n");
    assert_eq!(lines.last().unwrap(), &format!("{}\n", n + 43));
    // A record whose slot a later ticket took while the snapshot was copied is lost, not torn.
    let d = l.data();
    let mut late = Drain {
        next: n + 40,
        lost: 0,
    };
    let got = late.take(&l.c.layout, &d, 2 * n + 42, &l.c.formats, &l.c.strings);
    assert_eq!(late.lost, 2);
    assert_eq!(got, vec![format!("{}\n", n + 42), format!("{}\n", n + 43)]);
}

#[test]
fn exit_sets_the_flag_and_the_handlers_record_nothing_after_it() {
    let l = Loaded::new("f { @n = count() } g /arg0 == 3/ { exit() }");
    assert!(l.c.exits && l.c.polls());
    l.call(0, &mut regs([0; 6]), [0; 6]);
    l.call(1, &mut regs([1, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([0; 6]), [0; 6]);
    assert!(!l.c.layout.exited(&l.data()));
    l.call(1, &mut regs([3, 0, 0, 0, 0, 0]), [0; 6]);
    assert!(l.c.layout.exited(&l.data()));
    l.call(0, &mut regs([0; 6]), [0; 6]);
    assert_eq!(ints(&l.results(), 0), vec![(vec![], 2)]);
    // Without exit() there is nothing to poll for.
    assert!(!Loaded::new("f { @n = count() }").c.polls());
}

#[test]
fn delete_removes_one_entry_the_same_keys_take_it_back_and_clear_empties_the_map() {
    let l = Loaded::new(
        "f { @c[arg0] = count(); @mn[arg0] = min(arg1) } g { delete(@c[arg0]); delete(@mn[arg0]) } h { clear(@c) }",
    );
    let f = |a: u64, b: u64| l.call(0, &mut regs([a, b, 0, 0, 0, 0]), [0; 6]);
    f(1, 10);
    f(1, 20);
    f(2, 30);
    l.call(1, &mut regs([1, 0, 0, 0, 0, 0]), [0; 6]);
    assert_eq!(ints(&l.results(), 0), vec![(vec![K(2)], 1)]);
    assert_eq!(ints(&l.results(), 1), vec![(vec![K(2)], 30)]);
    // Deleting what is not there changes nothing.
    l.call(1, &mut regs([9, 0, 0, 0, 0, 0]), [0; 6]);
    f(1, 50);
    // Counted from zero and min from its initial value again, not from what was deleted.
    assert_eq!(
        ints(&l.results(), 0),
        vec![(vec![K(1)], 1), (vec![K(2)], 1)]
    );
    assert_eq!(
        ints(&l.results(), 1),
        vec![(vec![K(2)], 30), (vec![K(1)], 50)]
    );
    l.call(2, &mut regs([0; 6]), [0; 6]);
    assert_eq!(ints(&l.results(), 0), vec![]);
    f(5, 0);
    assert_eq!(ints(&l.results(), 0), vec![(vec![K(5)], 1)]);
    assert_eq!(ints(&l.results(), 1).len(), 3);
}

#[test]
fn a_map_read_in_an_expression_and_a_predicate_gives_its_value_or_zero() {
    let l = Loaded::new(
        "f { @s[arg0] = sum(arg1); @a = avg(arg1) } g /@s[arg0]/ { @hit[arg0] = count(); @v[arg0] = @s[arg0] + 1; @avg = @a * 10 } h { @n[arg0] = count(); @twice[arg0] = @n[arg0] * 2 }",
    );
    l.call(0, &mut regs([1, 10, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([1, 5, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([2, 0, 0, 0, 0, 0]), [0; 6]);
    for k in [1u64, 2, 3, 1] {
        l.call(1, &mut regs([k, 0, 0, 0, 0, 0]), [0; 6]);
    }
    for _ in 0..3 {
        l.call(2, &mut regs([4, 0, 0, 0, 0, 0]), [0; 6]);
    }
    let r = l.results();
    let by = |name: &str| {
        let i = r.maps.iter().position(|m| m.name == name).unwrap();
        ints(&r, i)
    };
    // @s[2] is 0 and @s[3] absent: both false.
    assert_eq!(by("hit"), vec![(vec![K(1)], 2)]);
    assert_eq!(by("v"), vec![(vec![K(1)], 16)]);
    // avg of 10, 5, 0 is 5.
    assert_eq!(by("avg"), vec![(vec![], 50)]);
    assert_eq!(by("twice"), vec![(vec![K(4)], 6)]);
}

#[test]
fn an_intervals_clear_counts_each_map_since_its_snapshot() {
    let l = Loaded::new("f { @c[arg0] = count(); @h = hist(arg0) } interval:s:1 { print(@c); clear(@c); clear(@h) }");
    assert_eq!(l.c.intervals.len(), 1);
    for k in [1u64, 1, 2] {
        l.call(0, &mut regs([k, 0, 0, 0, 0, 0]), [0; 6]);
    }
    let base = l.data();
    l.call(0, &mut regs([1, 0, 0, 0, 0, 0]), [0; 6]);
    l.call(0, &mut regs([3, 0, 0, 0, 0, 0]), [0; 6]);
    let bases = vec![Some(base.clone()), Some(base)];
    let r =
        l.c.layout
            .decode_since(&l.data(), &l.c.strings, &bases)
            .unwrap();
    assert_eq!(ints(&r, 0), vec![(vec![K(1)], 1), (vec![K(3)], 1)]);
    assert_eq!(render_map(&r.maps[0]), "@c[1]: 1\n@c[3]: 1\n\n");
    let layout::Value::Buckets(h) = &r.maps[1].entries[0].value else {
        panic!()
    };
    let got: Vec<_> = h.iter().map(|b| (b.label.as_str(), b.count)).collect();
    assert_eq!(got, vec![("[1]", 1), ("[2, 4)", 1)]);
}

#[test]
fn if_else_if_else_parse_into_nested_statements() {
    let p = parse(
        "f { if (arg0 > 5) { @a = count(); $k = 1 } else if (arg0 == 0) { @z = count() } else { @b = count() } @n = count() }",
    );
    let body = &p.probes[0].body;
    assert_eq!(body.len(), 2, "{body:?}");
    let Stmt::If { then, els, pos, .. } = &body[0] else {
        panic!("{body:?}")
    };
    assert_eq!((pos.line, pos.col), (1, 5));
    assert_eq!(then.len(), 2);
    // `else if` is an if alone in the else branch, with its own else.
    let [Stmt::If {
        then: t2, els: e2, ..
    }] = els.as_slice()
    else {
        panic!("{els:?}")
    };
    assert_eq!((t2.len(), e2.len()), (1, 1));
    // An if without else, and `if` as a map name is still a map.
    let p = parse("f { if (1) { @if = count() } }");
    assert!(matches!(&p.probes[0].body[0], Stmt::If { els, .. } if els.is_empty()));
}

#[test]
fn if_refuses_return_inside_and_checks_its_condition_and_branches() {
    let e = check_err("f { if (arg0) { return 1 } }", true);
    assert!(
        e.to_string()
            .starts_with("error at 1:17: return cannot be inside an if"),
        "{e}"
    );
    let e = check_err("f { if (arg0) { @a = count() } else { retval = 2 } }", true);
    assert!(
        e.to_string()
            .contains("retval can only be changed at a :return probe"),
        "{e}"
    );
    let e = check_err("f { if (arg0 { @a = count() } }", true);
    assert!(e.to_string().contains("1:14"), "{e}");
    // Interval probes run in trapctl: no if there.
    let e = check_err("interval:s:1 { if (1) { exit() } }", true);
    assert!(e.to_string().contains("only printf of constants"), "{e}");
}

#[test]
fn if_compiles_to_a_conditional_jump_and_variables_start_at_zero() {
    let c = compile(
        "f { if (arg0 > 5) { $k = 1 } else { $k = 2 } @k[$k] = count() }",
        &opts(),
        &mut same,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.splices.len(), 1);
    for kernel in [None, Some(TASK)] {
        let o = Options { kernel, ..opts() };
        compile("f { if (arg0) { if (arg1) { exit() } } }", &o, &mut same)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
