//! In-process integration tests: real functions (assembled at test time into a shared object
//! loaded into this test process) spliced by trap and by jmp, handlers from a real component
//! (compiled at test time), results, exact hit counts and byte-for-byte restoration checked.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use instr_manager::session::{ComponentHandle, Session};
use instr_manager::Mechanism::{self, Jmp, Trap};
use trapvec::Target;

mod common;

use common::{compile_component, fixture_source, load_shared_object, serial, session_with};

struct Fixture {
    handlers: PathBuf,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        load_shared_object(&fixture_source("functions.S"), &dir.join("libfixtures.so"));
        let handlers = dir.join("handlers.o");
        compile_component(&fixture_source("handlers.c"), &handlers);
        Fixture { handlers }
    })
}

fn session() -> (Session, ComponentHandle) {
    session_with(&fixture().handlers)
}

fn addr(s: &Session, name: &str) -> u64 {
    s.with(|sp| {
        sp.target()
            .symbols()
            .lookup(name)
            .unwrap_or_else(|| panic!("no symbol {name}"))
            .addr
    })
}

fn call1(s: &Session, name: &str, x: i32) -> i32 {
    let a = addr(s, name);
    // SAFETY: the fixture functions have the C signature `int f(int)`.
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(usize::try_from(a).unwrap()) };
    f(x)
}

fn bytes(s: &Session, name: &str, len: usize) -> Vec<u8> {
    let a = addr(s, name);
    s.with(|sp| trapvec::Target::read(sp.target(), a, len).unwrap())
}

fn var(c: &ComponentHandle, name: &str) -> u64 {
    let a = c.symbol(name).unwrap();
    // SAFETY: a u64 variable of the loaded component.
    unsafe { std::ptr::read_volatile(a as *const u64) }
}

/// Splice `at` with count_calls, call `f(x)` n times, check the result against the unpatched
/// one, the exact hit count, the handler's view of the registers, and the restored bytes.
fn check_call_splice(func: &str, at: &str, x: i32, mech: Mechanism) {
    let (s, c) = session();
    let want = call1(&s, func, x);
    let original = bytes(&s, func, 16);
    let before = var(&c, "calls");
    let blocks = c_blocks(&s);
    let h = s.splice_call(at, &c, "count_calls", mech).unwrap();
    assert_ne!(bytes(&s, func, 16), original, "{at}: nothing was written");
    for _ in 0..25 {
        assert_eq!(call1(&s, func, x), want, "{at} by {mech}: wrong result");
    }
    assert_eq!(h.hits().unwrap(), 25, "{at} by {mech}: hits");
    assert_eq!(
        var(&c, "calls") - before,
        25,
        "{at} by {mech}: handler runs"
    );
    let site = s.with(|sp| sp.get(h.id()).unwrap().point.site);
    assert_eq!(var(&c, "last_rip"), site, "handler sees rip = the point");
    let hits = h.remove().unwrap();
    assert_eq!(hits.hits, 25);
    assert_eq!(
        bytes(&s, func, 16),
        original,
        "{at} by {mech}: bytes not restored"
    );
    assert_eq!(call1(&s, func, x), want);
    assert_eq!(
        c_blocks(&s),
        blocks,
        "{at} by {mech}: trampoline blocks freed"
    );
}

/// Live repository blocks of the session.
fn c_blocks(s: &Session) -> usize {
    s.with(|sp| sp.target().live_blocks())
}

#[test]
fn trap_splice_of_push_rbp_displaces_two_instructions() {
    let _serial = serial();
    check_call_splice("push_rbp_fn", "push_rbp_fn", 41, Trap);
    let (s, _c) = session();
    let plan = s.with(|sp| {
        sp.plan(&[instr_manager::splicer::SpliceRequest {
            at: "push_rbp_fn".into(),
            action: instr_manager::splicer::Action::Call {
                handler: "count_calls".into(),
                cookie: 0,
            },
            mechanism: Trap,
            options: Default::default(),
        }])
        .unwrap()
    });
    assert_eq!(plan[0].1.displaced.len(), 2, "push rbp + mov rbp,rsp");
    assert_eq!(plan[0].1.displaced_len, 4);
}

#[test]
fn jmp_splice_of_push_rbp() {
    let _serial = serial();
    check_call_splice("push_rbp_fn", "push_rbp_fn+0", 41, Jmp);
}

#[test]
fn rip_relative_first_instruction_is_relocated() {
    let _serial = serial();
    check_call_splice("rip_load_fn", "rip_load_fn", 5, Trap);
    check_call_splice("rip_load_fn", "rip_load_fn", 5, Jmp);
}

#[test]
fn call_rel32_first_instruction_is_relocated() {
    let _serial = serial();
    check_call_splice("call_first_fn", "call_first_fn", 20, Trap);
    check_call_splice("call_first_fn", "call_first_fn", 20, Jmp);
}

#[test]
fn jcc_rel8_inside_the_window_is_relocated() {
    let _serial = serial();
    for x in [0, 9] {
        check_call_splice("jcc_fn", "jcc_fn+3", x, Trap);
        check_call_splice("jcc_fn", "jcc_fn+0", x, Jmp);
    }
}

#[test]
fn point_in_the_middle_of_a_function() {
    let _serial = serial();
    check_call_splice("mid_fn", "mid_fn+3", 4, Trap);
    check_call_splice("mid_fn", "mid_fn+3", 4, Jmp);
}

#[test]
fn function_shorter_than_a_jmp_is_trapped_and_jumped_only_through_a_springboard() {
    let _serial = serial();
    check_call_splice("tiny_fn", "tiny_fn", 1, Trap);
    check_call_splice("tiny_nopad_fn", "tiny_nopad_fn", 1, Trap);
    // jmp: springboard in the int3 padding after tiny_fn.
    let (s, c) = session();
    let pad_at = addr(&s, "tiny_fn") + 3;
    let pad = s.with(|sp| trapvec::Target::read(sp.target(), pad_at, 13).unwrap());
    let h = s.splice_call("tiny_fn", &c, "count_calls", Jmp).unwrap();
    let sb = s
        .with(|sp| {
            sp.get(h.id())
                .unwrap()
                .plan
                .springboard
                .as_ref()
                .map(|sb| sb.addr)
        })
        .expect("a springboard");
    assert!(
        sb >= pad_at && sb + 5 <= pad_at + 13,
        "springboard {sb:#x} in the padding"
    );
    assert_eq!(bytes(&s, "tiny_fn", 1)[0], 0xEB, "jmp rel8 at the site");
    for _ in 0..10 {
        assert_eq!(call1(&s, "tiny_fn", 1), 0);
    }
    assert_eq!(h.hits().unwrap(), 10);
    drop(h);
    let after = s.with(|sp| trapvec::Target::read(sp.target(), pad_at, 13).unwrap());
    assert_eq!(after, pad, "springboard padding restored");
    // jmp with no padding in reach: refused with the reason, nothing written.
    let before = bytes(&s, "tiny_nopad_fn", 16);
    let err = s
        .splice_call("tiny_nopad_fn", &c, "count_calls", Jmp)
        .err()
        .expect("refused");
    let msg = trapvec::error_chain(&err);
    assert!(
        msg.contains("tiny_nopad_fn") && msg.to_lowercase().contains("springboard"),
        "{msg}"
    );
    assert_eq!(bytes(&s, "tiny_nopad_fn", 16), before);
}

#[test]
fn window_over_a_branch_target_is_refused_and_nothing_written() {
    let _serial = serial();
    let (s, c) = session();
    let before = bytes(&s, "target_fn", 16);
    let blocks = c_blocks(&s);
    let err = s
        .splice_call("target_fn", &c, "count_calls", Trap)
        .err()
        .expect("refused");
    let msg = trapvec::error_chain(&err);
    assert!(msg.contains("target_fn") && msg.contains("target"), "{msg}");
    assert_eq!(bytes(&s, "target_fn", 16), before);
    assert_eq!(c_blocks(&s), blocks, "nothing allocated");
    assert_eq!(call1(&s, "target_fn", 3), 0);
}

/// `func`'s branch targets as the analysis sees them from its own bytes alone (no jump tables,
/// no cold parts): what the splicer would have planned on without reading more.
fn own_targets(s: &Session, func: &str) -> std::collections::BTreeSet<u64> {
    let (a, size) = s.with(|sp| {
        let sym = sp.target().symbols().lookup(func).unwrap();
        (sym.addr, sym.size)
    });
    let code = bytes(s, func, usize::try_from(size).unwrap());
    instr_manager::analysis::analyze_function(func, a, &code)
        .unwrap()
        .branch_targets
}

#[test]
fn jmp_window_over_a_case_label_only_the_jump_table_targets_is_refused() {
    let _serial = serial();
    let (s, c) = session();
    let f = addr(&s, "switch_fn");
    let (case0, case1) = (f + 26, f + 28);
    let xs: Vec<i32> = (0..7).collect();
    let want: Vec<i32> = xs.iter().map(|&x| call1(&s, "switch_fn", x)).collect();
    assert_eq!(want, vec![5, 106, 306, -103, 208, 105, 106]);
    assert!(
        !own_targets(&s, "switch_fn").contains(&case1),
        "case 1 is a target through the table only"
    );
    let before = bytes(&s, "switch_fn", 43);
    let blocks = c_blocks(&s);

    // xor (2 bytes) + add (3 bytes): the jmp rel32 window at case 0 covers case 1's label.
    let err = s
        .splice_call("switch_fn+26", &c, "count_calls", Jmp)
        .err()
        .expect("refused");
    let msg = trapvec::error_chain(&err);
    assert!(
        msg.contains("switch_fn+26") && msg.contains(&format!("branch target {case1:#x}")),
        "{msg}"
    );
    assert_eq!(bytes(&s, "switch_fn", 43), before, "nothing written");
    assert_eq!(c_blocks(&s), blocks, "nothing allocated");

    // Traps at both labels and a jmp at the entry: every hit counted exactly.
    let calls = var(&c, "calls");
    let t0 = s
        .splice_call("switch_fn+26", &c, "count_calls", Trap)
        .unwrap();
    let t1 = s
        .splice_call("switch_fn+28", &c, "count_calls", Trap)
        .unwrap();
    let j = s.splice_call("switch_fn", &c, "count_calls", Jmp).unwrap();
    assert_eq!(s.with(|sp| sp.get(t0.id()).unwrap().point.site), case0);
    for _ in 0..10 {
        let got: Vec<i32> = xs.iter().map(|&x| call1(&s, "switch_fn", x)).collect();
        assert_eq!(got, want);
    }
    assert_eq!(t0.hits().unwrap(), 10, "case 0");
    assert_eq!(t1.hits().unwrap(), 20, "case 1 and case 0 falling into it");
    assert_eq!(j.hits().unwrap(), 70, "every call");
    assert_eq!(var(&c, "calls") - calls, 100);
    for h in [t0, t1, j] {
        h.remove().unwrap();
    }
    assert_eq!(bytes(&s, "switch_fn", 43), before);
    assert_eq!(c_blocks(&s), blocks);
}

#[test]
fn jmp_window_over_the_join_point_of_a_cold_part_is_refused() {
    let _serial = serial();
    let (s, c) = session();
    let f = addr(&s, "cold_fn");
    let cold = addr(&s, "cold_fn.cold");
    let join = f + 11;
    let xs = [-3, -1, 0, 4];
    let want: Vec<i32> = xs.iter().map(|&x| call1(&s, "cold_fn", x)).collect();
    assert_eq!(want, vec![16, 6, 11, 31]);
    // The cold part's `jmp` lands on the join point; inside cold_fn nothing does.
    let tail = bytes(&s, "cold_fn.cold", 9);
    let rel = i32::from_le_bytes(tail[5..9].try_into().unwrap());
    assert_eq!((cold + 9).wrapping_add_signed(i64::from(rel)), join);
    assert!(!own_targets(&s, "cold_fn").contains(&join));
    let before = bytes(&s, "cold_fn", 16);
    let blocks = c_blocks(&s);

    // lea (3 bytes) + lea (4 bytes) at +8: the window covers the join point.
    let err = s
        .splice_call("cold_fn+8", &c, "count_calls", Jmp)
        .err()
        .expect("refused");
    let msg = trapvec::error_chain(&err);
    assert!(
        msg.contains("cold_fn+8") && msg.contains(&format!("branch target {join:#x}")),
        "{msg}"
    );
    assert_eq!(bytes(&s, "cold_fn", 16), before, "nothing written");
    assert_eq!(c_blocks(&s), blocks, "nothing allocated");

    // At the join point itself both paths go through the splice, by trap and by jmp.
    for mech in [Trap, Jmp] {
        let h = s
            .splice_call("cold_fn+11", &c, "count_calls", mech)
            .unwrap();
        for _ in 0..10 {
            let got: Vec<i32> = xs.iter().map(|&x| call1(&s, "cold_fn", x)).collect();
            assert_eq!(got, want, "by {mech}");
        }
        assert_eq!(h.hits().unwrap(), 40, "hot and cold paths, by {mech}");
        h.remove().unwrap();
        assert_eq!(bytes(&s, "cold_fn", 16), before);
    }
}

#[test]
fn point_that_is_not_an_instruction_boundary_is_refused_and_nothing_written() {
    let _serial = serial();
    let (s, c) = session();
    let before = bytes(&s, "push_rbp_fn", 16);
    let err = s
        .splice_call("push_rbp_fn+2", &c, "count_calls", Trap)
        .err()
        .expect("refused");
    let msg = trapvec::error_chain(&err);
    assert!(
        msg.contains("push_rbp_fn+2") && msg.contains("boundary"),
        "{msg}"
    );
    assert_eq!(bytes(&s, "push_rbp_fn", 16), before);
}

#[test]
fn replace_whose_replacement_calls_the_original_through_its_trampoline() {
    let _serial = serial();
    for mech in [Trap, Jmp] {
        let (s, c) = session();
        let original = bytes(&s, "compute", 16);
        assert_eq!(call1(&s, "compute", 5), 16);
        let h = s
            .splice_replace("compute", &c, "compute_plus_1000", mech)
            .unwrap();
        for x in 0..20 {
            assert_eq!(call1(&s, "compute", x), 3 * x + 1 + 1000, "by {mech}");
        }
        assert_eq!(h.hits().unwrap(), 20);
        drop(h);
        assert_eq!(bytes(&s, "compute", 16), original);
        assert_eq!(call1(&s, "compute", 5), 16);
        // Without the splice the original trampoline calls the function itself.
        let orig = c.symbol("compute_plus_1000").unwrap();
        // SAFETY: the component's function `int compute_plus_1000(int)`.
        let f: extern "C" fn(i32) -> i32 =
            unsafe { std::mem::transmute(usize::try_from(orig).unwrap()) };
        assert_eq!(f(5), 1016);
    }
}

#[test]
fn handler_that_changes_an_argument_register_changes_the_result() {
    let _serial = serial();
    for mech in [Trap, Jmp] {
        let (s, c) = session();
        assert_eq!(call1(&s, "push_rbp_fn", 10), 11);
        let h = s
            .splice_call("push_rbp_fn", &c, "double_arg", mech)
            .unwrap();
        assert_eq!(call1(&s, "push_rbp_fn", 10), 21, "by {mech}");
        drop(h);
        assert_eq!(call1(&s, "push_rbp_fn", 10), 11);
    }
}

#[test]
fn trap_and_jmp_splices_give_identical_results() {
    let _serial = serial();
    let cases: &[(&str, &str, &[i32])] = &[
        ("push_rbp_fn", "push_rbp_fn", &[0, 7, -3]),
        ("rip_load_fn", "rip_load_fn", &[0, 5]),
        ("call_first_fn", "call_first_fn", &[1, 100]),
        ("jcc_fn", "jcc_fn", &[0, 1, 50]),
        ("mid_fn", "mid_fn+3", &[2, 9]),
        ("compute", "compute", &[4, 8]),
    ];
    for &(func, at, xs) in cases {
        let (s, c) = session();
        let plain: Vec<i32> = xs.iter().map(|&x| call1(&s, func, x)).collect();
        let mut per_mech = Vec::new();
        for mech in [Trap, Jmp] {
            let h = s.splice_call(at, &c, "count_calls", mech).unwrap();
            per_mech.push(xs.iter().map(|&x| call1(&s, func, x)).collect::<Vec<_>>());
            assert_eq!(h.hits().unwrap(), xs.len() as u64);
        }
        assert_eq!(per_mech[0], plain, "{at} by trap");
        assert_eq!(per_mech[1], plain, "{at} by jmp");
    }
}

#[test]
fn four_threads_call_patched_functions_while_splices_come_and_go_10000_times() {
    let _serial = serial();
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    let (s, c) = session();
    let f1 = addr(&s, "push_rbp_fn");
    let f2 = addr(&s, "jcc_fn");
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (stop, calls) = (stop.clone(), calls.clone());
            std::thread::spawn(move || {
                // SAFETY: fixture functions `int f(int)`.
                let a: extern "C" fn(i32) -> i32 =
                    unsafe { std::mem::transmute(usize::try_from(f1).unwrap()) };
                // SAFETY: as above.
                let b: extern "C" fn(i32) -> i32 =
                    unsafe { std::mem::transmute(usize::try_from(f2).unwrap()) };
                let mut i = t;
                while !stop.load(Relaxed) {
                    assert_eq!(a(i), i + 1, "push_rbp_fn({i})");
                    let want = if i == 0 { 20 } else { 10 + i };
                    assert_eq!(b(i), want, "jcc_fn({i})");
                    calls.fetch_add(2, Relaxed);
                    i = (i + 1) % 1000;
                }
            })
        })
        .collect();
    let before = var(&c, "calls");
    let mut hits = 0;
    for round in 0..10_000 {
        let mech = match std::env::var("STRESS_ONLY").as_deref() {
            Ok("trap") => Trap,
            Ok("jmp") => Jmp,
            _ => {
                if round % 2 == 0 {
                    Trap
                } else {
                    Jmp
                }
            }
        };
        let req = |at: &str| instr_manager::splicer::SpliceRequest {
            at: at.into(),
            action: instr_manager::splicer::Action::Call {
                handler: "count_calls".into(),
                cookie: 0,
            },
            mechanism: mech,
            options: Default::default(),
        };
        let ids = s
            .with(|sp| sp.apply(&[req("push_rbp_fn"), req("jcc_fn+3")]))
            .unwrap();
        if round % 100 == 0 {
            std::thread::yield_now();
        }
        hits += s
            .with(|sp| sp.remove(&ids))
            .unwrap()
            .iter()
            .map(|h| h.hits)
            .sum::<u64>();
    }
    stop.store(true, Relaxed);
    for w in workers {
        w.join().expect("a worker saw a wrong result or crashed");
    }
    assert!(hits > 0, "the workers went through the splices");
    assert_eq!(
        var(&c, "calls") - before,
        hits,
        "every trampoline hit ran the handler exactly once"
    );
    assert!(calls.load(Relaxed) >= hits);
    assert_eq!(bytes(&s, "push_rbp_fn", 16)[..4], [0x55, 0x48, 0x89, 0xe5]);
    eprintln!(
        "{} calls, {hits} through splices, {:?}",
        calls.load(Relaxed),
        trapvec::process::trap_stats()
    );
}

/// A trap site handed from one counting splice to the next 500 times by `Splicer::switch`,
/// in place (the trap stays, the dispatch table's entry changes), while four threads call the
/// function: every call is counted by exactly one of the splices, so none ran unspliced.
#[test]
fn a_trap_site_changes_hands_in_place_500_times_under_four_threads_without_a_call_unspliced() {
    let _serial = serial();
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    let (s, _c) = session();
    let f = addr(&s, "push_rbp_fn");
    let count = || {
        instr_manager::splicer::SpliceRequest::new(
            "push_rbp_fn",
            instr_manager::splicer::Action::Count,
            Trap,
        )
    };
    let mut live = s.with(|sp| sp.apply(&[count()])).unwrap();
    let trapped = bytes(&s, "push_rbp_fn", 16);
    assert_eq!(trapped[..2], [0xcd, trapvec::abi::TRAP_VECTOR]);
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (stop, calls) = (stop.clone(), calls.clone());
            std::thread::spawn(move || {
                // SAFETY: the fixture function `int push_rbp_fn(int)`.
                let g: extern "C" fn(i32) -> i32 =
                    unsafe { std::mem::transmute(usize::try_from(f).unwrap()) };
                let mut i = t;
                while !stop.load(Relaxed) {
                    assert_eq!(g(i), i + 1, "push_rbp_fn({i})");
                    calls.fetch_add(1, Relaxed);
                    i = (i + 1) % 1000;
                }
            })
        })
        .collect();
    let mut hits = 0;
    for round in 0..500 {
        let (new, old) = s.with(|sp| sp.switch(&live, &[count()])).unwrap();
        hits += old.iter().map(|h| h.hits).sum::<u64>();
        live = new;
        if round % 100 == 0 {
            assert_eq!(bytes(&s, "push_rbp_fn", 16), trapped, "the trap never left");
        }
    }
    stop.store(true, Relaxed);
    for w in workers {
        w.join().expect("a worker saw a wrong result or crashed");
    }
    hits += s
        .with(|sp| sp.remove(&live))
        .unwrap()
        .iter()
        .map(|h| h.hits)
        .sum::<u64>();
    let calls = calls.load(Relaxed);
    assert!(calls > 500, "the workers ran: {calls} calls");
    assert_eq!(hits, calls, "every call counted by one splice or the next");
    assert_eq!(bytes(&s, "push_rbp_fn", 4), [0x55, 0x48, 0x89, 0xe5]);
    eprintln!(
        "{calls} calls across 500 in-place handovers, {:?}",
        trapvec::process::trap_stats()
    );
}

/// Compile C source into a relocatable object for the bad-component tests.
fn compile(name: &str, src: &str, extra: &[&str]) -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let o = dir.join(format!("{name}.o"));
    let out = Command::new("cc")
        .args(["-c", "-O2"])
        .args(extra)
        .arg("-o")
        .arg(&o)
        .arg(&c)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    o
}

#[test]
fn bad_components_are_refused_with_the_culprit_named_and_the_process_untouched() {
    let _serial = serial();
    let f = fixture();
    let s = Session::open().unwrap();
    let blocks = c_blocks(&s);
    let good = std::fs::read(&f.handlers).unwrap();
    let dir = tempfile::tempdir().unwrap().keep();

    let truncated = dir.join("truncated.o");
    std::fs::write(&truncated, &good[..good.len().min(200)]).unwrap();
    let mut arm = good.clone();
    arm[18..20].copy_from_slice(&183u16.to_le_bytes()); // EM_AARCH64
    let wrong_machine = dir.join("wrong_machine.o");
    std::fs::write(&wrong_machine, &arm).unwrap();
    let tls = compile(
        "tls",
        "__thread int tls_var; int get_tls(void) { return tls_var; }",
        &["-fno-pic"],
    );
    let unresolved = compile("unresolved", "extern int no_such_symbol_anywhere(void); int f(void) { return no_such_symbol_anywhere() + 1; }", &[]);

    let cases: Vec<(PathBuf, Option<u32>, Vec<&str>)> = vec![
        (truncated, None, vec!["truncated.o"]),
        (wrong_machine, None, vec!["wrong_machine.o", "machine"]),
        (
            tls,
            None,
            vec!["tls.o", "R_X86_64_", "not supported", ".text"],
        ),
        (
            unresolved,
            None,
            vec!["unresolved.o", "no_such_symbol_anywhere"],
        ),
        (
            f.handlers.clone(),
            Some(0xdead_beef),
            vec!["handlers.o", "0xdeadbeef"],
        ),
    ];
    for (path, crc, needles) in cases {
        let opts = component_manager::LoadOptions {
            expected_crc32: crc,
            ..Default::default()
        };
        let err = s
            .load_with(&path, &opts)
            .err()
            .unwrap_or_else(|| panic!("{} loaded", path.display()));
        let msg = trapvec::error_chain(&err);
        for n in needles {
            assert!(
                msg.to_lowercase().contains(&n.to_lowercase()),
                "error for {} lacks {n:?}: {msg}",
                path.display()
            );
        }
        assert_eq!(
            c_blocks(&s),
            blocks,
            "{}: repository untouched",
            path.display()
        );
        assert_eq!(s.with(|sp| sp.components().iter().count()), 0);
    }
    assert_eq!(s.with(|sp| sp.live().count()), 0);
}

fn bytes_at(a: u64, len: usize) -> Vec<u8> {
    // SAFETY: `a` is a component variable of at least `len` bytes, loaded for the whole test.
    unsafe { std::slice::from_raw_parts(a as *const u8, len).to_vec() }
}

#[test]
fn handler_that_clobbers_every_ymm_register_leaves_the_spliced_code_s_vector_state_intact() {
    let _serial = serial();
    let (s, c) = session();
    assert!(
        std::arch::is_x86_feature_detected!("avx"),
        "the fixture uses AVX"
    );
    assert_eq!(
        call1(&s, "vec_fn", 0),
        0,
        "unpatched: every ymm register kept"
    );
    if let Some(size) = instr_manager::trampoline::host_xsave_size() {
        assert!(
            size >= 576 + 256,
            "xsave area with the AVX component: {size} bytes"
        );
    }
    for mech in [Trap, Jmp] {
        let before = var(&c, "vec_clobbers");
        let h = s
            .splice_call("vec_site_fn", &c, "clobber_vectors", mech)
            .unwrap();
        for _ in 0..5 {
            assert_eq!(
                call1(&s, "vec_fn", 0),
                0,
                "by {mech}: ymm registers (upper and lower halves) preserved"
            );
        }
        assert_eq!(h.hits().unwrap(), 5);
        assert_eq!(
            var(&c, "vec_clobbers") - before,
            5,
            "the clobbering handler ran"
        );
        h.remove().unwrap();
    }
}

/// Run `f` in a forked child and return its exit status (`f`'s value; 101 if it panicked).
/// The child leaves with `_exit`, never returning into the test harness.
fn in_fork_child(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: fork in a test process; the child runs `f` (the serial lock keeps the other tests'
    // process work out) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101);
        // SAFETY: leaving the child without running the harness's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    libc::WEXITSTATUS(status)
}

#[test]
fn a_fork_child_that_removes_a_splice_leaves_the_parents_splice_counting_and_running() {
    let _serial = serial();
    for mech in [Trap, Jmp] {
        let (s, c) = session();
        let want = call1(&s, "push_rbp_fn", 41);
        let original = bytes(&s, "push_rbp_fn", 16);
        let h = s
            .splice_call("push_rbp_fn", &c, "count_calls", mech)
            .unwrap();
        for _ in 0..5 {
            assert_eq!(call1(&s, "push_rbp_fn", 41), want);
        }
        let child = in_fork_child(|| {
            // The child's splice works, counting from the parent's 5...
            for _ in 0..3 {
                if call1(&s, "push_rbp_fn", 41) != want {
                    return 2;
                }
            }
            // ...and removing it frees its trampoline (filled with CC) in the child only.
            let id = h.id();
            match s.with(|sp| sp.remove(&[id])) {
                Ok(hits) if hits[0].hits == 8 => {}
                _ => return 3,
            }
            if bytes(&s, "push_rbp_fn", 16) != original || call1(&s, "push_rbp_fn", 41) != want {
                return 4;
            }
            // A new splice in the child takes trampoline space the parent may also hand out.
            let Ok(h2) = s.splice_call("push_rbp_fn", &c, "empty_handler", mech) else {
                return 5;
            };
            if call1(&s, "push_rbp_fn", 41) != want || h2.remove().is_err() {
                return 6;
            }
            0
        });
        assert_eq!(child, 0, "{mech}: the child's splice and its removal");
        // The parent's splice still runs through its trampoline and counts only its own calls.
        for _ in 0..5 {
            assert_eq!(call1(&s, "push_rbp_fn", 41), want, "{mech}");
        }
        assert_eq!(h.hits().unwrap(), 10, "{mech}");
        assert_eq!(h.remove().unwrap().hits, 10);
        assert_eq!(bytes(&s, "push_rbp_fn", 16), original);
    }
}

#[test]
fn handler_runs_with_df_clear_and_the_original_df_comes_back() {
    let _serial = serial();
    let (s, c) = session();
    let area = c.symbol("df_area").unwrap();
    let src = bytes_at(c.symbol("df_src").unwrap(), 16);
    assert_eq!(src, b"0123456789abcdef");
    for kind in ["dead", "live"] {
        let (outer, site) = (format!("df_{kind}_fn"), format!("df_site_{kind}_fn"));
        assert_eq!(
            call1(&s, &outer, 0),
            1,
            "{outer} unpatched reads DF = 1 back"
        );
        for mech in [Trap, Jmp] {
            // SAFETY: df_area is the component's 48-byte array, not used by anything running.
            unsafe { std::ptr::write_bytes(area as *mut u8, 0, 48) };
            let h = s.splice_call(&site, &c, "copy_forward", mech).unwrap();
            assert_eq!(
                call1(&s, &outer, 0),
                1,
                "{site} by {mech}: DF set again after the handler"
            );
            assert_eq!(h.hits().unwrap(), 1);
            assert_ne!(
                var(&c, "df_saved_rflags") & 0x400,
                0,
                "{site} by {mech}: regs->rflags holds the original DF"
            );
            assert_eq!(
                var(&c, "df_seen_flags") & 0x400,
                0,
                "{site} by {mech}: the handler runs with DF clear"
            );
            let got = bytes_at(area, 48);
            assert_eq!(&got[16..32], &src[..], "{site} by {mech}: forward copy");
            assert!(
                got[..16].iter().chain(&got[32..]).all(|&b| b == 0),
                "{site} by {mech}: nothing written around it"
            );
            h.remove().unwrap();
        }
    }
}

#[test]
fn malloc_and_free_spliced_in_a_threaded_process_count_and_come_out_again() {
    let _serial = serial();
    // The harness's other threads answer the scans while the writer has a CC in malloc: the
    // writer must not call malloc (or anything of libc) between its CC and its last byte.
    for mech in [Trap, Jmp] {
        let (s, c) = session();
        let m = s.splice_call("malloc", &c, "count_calls", mech).unwrap();
        let f = s.splice_call("free", &c, "count_calls", mech).unwrap();
        let (m0, f0) = (m.hits().unwrap(), f.hits().unwrap());
        // Through opaque pointers: the compiler would otherwise drop a malloc/free pair.
        let malloc: unsafe extern "C" fn(usize) -> *mut libc::c_void =
            std::hint::black_box(libc::malloc);
        let free: unsafe extern "C" fn(*mut libc::c_void) = std::hint::black_box(libc::free);
        for i in 0..1000usize {
            // SAFETY: malloc/free pairs through libc, as any program does.
            unsafe {
                let p = malloc(32 + i % 5).cast::<u8>();
                assert!(!p.is_null());
                *p = 1;
                free(p.cast());
            }
        }
        assert!(m.hits().unwrap() - m0 >= 1000, "{mech}: malloc hits");
        assert!(f.hits().unwrap() - f0 >= 1000, "{mech}: free hits");
        drop(f);
        drop(m);
        assert!(s.with(|sp| sp.live().count()) == 0, "{mech}: removed");
    }
}

#[test]
fn a_component_loaded_by_the_session_brings_its_declared_splice_and_takes_it_away() {
    let _serial = serial();
    let (s, _c) = session();
    let dir = tempfile::tempdir().unwrap();
    let obj = dir.path().join("declaring.o");
    compile_component(&fixture_source("declaring.c"), &obj);
    let original = bytes(&s, "double_it", 8);
    let blocks = c_blocks(&s);
    let d = s.load(&obj).unwrap();
    assert_eq!(
        bytes(&s, "double_it", 2),
        [0xCD, 0xF5],
        "the declared trap splice is live"
    );
    for x in 0..30 {
        assert_eq!(call1(&s, "double_it", x), 2 * x);
    }
    assert_eq!(
        var(&d, "declared_calls"),
        30,
        "the declared handler ran on every call"
    );
    drop(d);
    assert_eq!(
        bytes(&s, "double_it", 8),
        original,
        "unloading removed the declared splice"
    );
    assert_eq!(
        c_blocks(&s),
        blocks,
        "its blocks and the component's are freed"
    );
}

fn gettid() -> u32 {
    // SAFETY: gettid cannot fail.
    u32::try_from(unsafe { libc::syscall(libc::SYS_gettid) }).unwrap()
}

/// `tid = T` on a call, a count and a replacement, by trap and by jmp: two threads call
/// `compute`, only T's calls run the handler, are counted or go to the replacement; the other
/// thread's results are the original ones and nothing counts them.
#[test]
fn a_thread_predicate_lets_only_that_thread_in() {
    use instr_manager::splicer::{Action, SpliceRequest};
    use trapvec::predicate::Predicate;
    let _g = serial();
    let (s, c) = session();
    let f = addr(&s, "compute");
    let original = bytes(&s, "compute", 16);
    let want = |x: i32| call1(&s, "compute", x);
    let wants: Vec<i32> = (0..300).map(want).collect();
    let me = gettid();
    // The other thread calls compute(x) for x in 0..300, 7 rounds, when told; it gives its
    // results back.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<bool>();
    let (res_tx, res_rx) = std::sync::mpsc::channel::<Vec<i32>>();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel::<u32>();
    let other = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        // SAFETY: compute has the C signature `int compute(int)`.
        let g: extern "C" fn(i32) -> i32 =
            unsafe { std::mem::transmute(usize::try_from(f).unwrap()) };
        while go_rx.recv().unwrap_or(false) {
            res_tx
                .send((0..7 * 300).map(|i| g(i % 300)).collect())
                .unwrap();
        }
    });
    let them = tid_rx.recv().unwrap();
    let run_both = || {
        go_tx.send(true).unwrap();
        let mine: Vec<i32> = (0..5 * 300)
            .map(|i| call1(&s, "compute", i % 300))
            .collect();
        (mine, res_rx.recv().unwrap())
    };
    let only = |tid: u32| Predicate {
        tid: Some(tid),
        ..Predicate::default()
    };
    for mech in [Trap, Jmp] {
        // A call for this thread: 1,500 handler runs, not 3,600.
        let before = var(&c, "calls");
        let mut req = SpliceRequest::new(
            "compute",
            Action::Call {
                handler: "count_calls".into(),
                cookie: 0,
            },
            mech,
        );
        req.options.only = only(me);
        let h = s.splice_request(req, Some(&c)).unwrap();
        let (mine, theirs) = run_both();
        assert!(
            mine.iter().enumerate().all(|(i, &r)| r == wants[i % 300]),
            "{mech}: results of this thread"
        );
        assert!(
            theirs.iter().enumerate().all(|(i, &r)| r == wants[i % 300]),
            "{mech}: results of the other thread"
        );
        assert_eq!(
            (h.hits().unwrap(), var(&c, "calls") - before),
            (1500, 1500),
            "{mech}: only this thread's calls"
        );
        h.remove().unwrap();
        assert_eq!(bytes(&s, "compute", 16), original, "{mech}: bytes restored");
        // A count for the other thread: its 2,100 calls.
        let mut req = SpliceRequest::new("compute", Action::Count, mech);
        req.options.only = only(them);
        let h = s.splice_request(req, None).unwrap();
        let _ = run_both();
        assert_eq!(
            h.hits().unwrap(),
            2100,
            "{mech}: only the other thread's calls counted"
        );
        h.remove().unwrap();
        // A replacement for the other thread: +1000 there, the original here.
        let mut req = SpliceRequest::new(
            "compute",
            Action::Replace {
                with: "compute_plus_1000".into(),
            },
            mech,
        );
        req.options.only = only(them);
        let h = s.splice_request(req, Some(&c)).unwrap();
        let (mine, theirs) = run_both();
        assert!(
            mine.iter().enumerate().all(|(i, &r)| r == wants[i % 300]),
            "{mech}: this thread runs the original"
        );
        assert!(
            theirs
                .iter()
                .enumerate()
                .all(|(i, &r)| r == wants[i % 300] + 1000),
            "{mech}: the other thread runs the replacement"
        );
        assert_eq!(h.hits().unwrap(), 2100, "{mech}: replacement hits");
        h.remove().unwrap();
        assert_eq!(bytes(&s, "compute", 16), original, "{mech}: bytes restored");
    }
    // Kernel fields mean nothing in a process: refused, naming the field, nothing written.
    for p in [
        Predicate {
            pid: Some(1),
            ..Predicate::default()
        },
        Predicate {
            comm: Some("sh".into()),
            ..Predicate::default()
        },
    ] {
        let mut req = SpliceRequest::new("compute", Action::Count, Jmp);
        req.options.only = p.clone();
        let e = trapvec::error_chain(&s.splice_request(req, None).err().unwrap());
        let field = if p.pid.is_some() { "`pid`" } else { "`comm`" };
        assert!(
            e.contains(field) && e.contains("in a process a predicate names a thread with `tid`"),
            "{e}"
        );
        assert_eq!(bytes(&s, "compute", 16), original);
    }
    go_tx.send(false).unwrap();
    other.join().unwrap();
}
