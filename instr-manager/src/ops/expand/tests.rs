use std::path::Path;

use trapvec::fake::FakeKernel;

use trapvec::kernel::SiteRefusal;

use super::*;
use crate::ops::{apply, check};
use crate::plan::Mechanism;
use crate::spec::Spec;
use crate::splice::Action;
use crate::splicer::SpliceError;
use crate::{PlanError, Refusal};

fn count(at: &str) -> SpliceRequest {
    SpliceRequest::new(at, Action::Count, Mechanism::Trap)
}

fn spec(splices: Vec<SpliceRequest>) -> Spec {
    Spec {
        splices,
        ..Spec::default()
    }
}

fn ats(rows: &[crate::ops::SpliceRow]) -> Vec<&str> {
    rows.iter().map(|r| r.at.as_str()).collect()
}

#[test]
fn a_glob_makes_one_splice_per_matching_function_in_one_batch() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let (report, made) = apply(&mut sp, &spec(vec![count("f[0-2]"), count("f3")]), false).unwrap();
    assert_eq!(ats(&report.spliced), ["f0", "f1", "f2", "f3"]);
    // Where a plain `FUNC` point goes (f3, written by name): past the fentry NOP.
    assert!(report.spliced.iter().all(|r| r.offset == 5));
    assert_eq!(report.requested, 4);
    assert_eq!(made.splices.len(), 4);
    assert_eq!(sp.last_batch().unwrap().splices, 4);
    for f in trapvec::fake::FUNCS {
        assert!(k.trapped(f), "{f}");
    }
}

#[test]
fn a_glob_refuses_freed_init_functions_as_such_without_reading_them() {
    let data = |name: &str, addr: u64| trapvec::Symbol {
        name: name.into(),
        addr,
        size: 0,
        kind: trapvec::SymbolKind::Object,
        origin: None,
        version: None,
    };
    let f3 = trapvec::fake::func_addr("f3");
    let k = FakeKernel::with_symbols(vec![data("__init_begin", f3), data("__init_end", f3 + 32)]);
    let mut sp = Splicer::new(k.clone());
    let (report, _) = apply(&mut sp, &spec(vec![count("f*")]), true).unwrap();
    assert_eq!(ats(&report.spliced), ["f0", "f1", "f2"]);
    let lines: Vec<String> = report.refusals.iter().map(|g| g.to_string()).collect();
    assert_eq!(lines, ["refused 1: init code, freed after boot (at f3)"]);
    assert_eq!(report.refusals[0].cause.as_deref(), Some("init_freed"));
    assert!(
        report.refused[0].contains("is init code"),
        "{}",
        report.refused[0]
    );
    let reads = k.state().reads.clone();
    assert!(
        reads
            .iter()
            .all(|&(a, n)| a + n as u64 <= f3 || a >= f3 + 32),
        "f3's bytes were read: {reads:x?}"
    );
    assert!(!k.trapped("f3"));
}

/// `dup`: a name two functions share (static functions of two files), as kallsyms lists
/// them; `dup` is also the name of f1 and f2, listed first at their addresses.
fn kernel_with_a_shared_name() -> FakeKernel {
    let dup = |f: &str| trapvec::Symbol {
        name: "dup".into(),
        addr: trapvec::fake::func_addr(f),
        size: 0,
        kind: trapvec::SymbolKind::Function,
        origin: None,
        version: None,
    };
    FakeKernel::with_symbols(vec![dup("f1"), dup("f2")])
}

#[test]
fn a_glob_splices_each_copy_of_a_shared_name_by_its_address() {
    let k = kernel_with_a_shared_name();
    let (f1, f2) = (
        trapvec::fake::func_addr("f1"),
        trapvec::fake::func_addr("f2"),
    );
    let mut sp = Splicer::new(k.clone());
    let (report, made) = apply(&mut sp, &spec(vec![count("[df]*")]), false).unwrap();
    let dup1 = format!("dup@{f1:#x}");
    let dup2 = format!("dup@{f2:#x}");
    assert_eq!(
        ats(&report.spliced),
        ["f0", dup1.as_str(), dup2.as_str(), "f3"]
    );
    // Each row names its function and its own site, past the fentry NOP.
    let sites: Vec<(&str, &str, u64)> = report
        .spliced
        .iter()
        .map(|r| (r.function.as_str(), r.site.as_str(), r.offset))
        .collect();
    assert_eq!(sites[1].0, "dup");
    assert_eq!(sites[1].1, format!("{:#x}", f1 + 5));
    assert_eq!(sites[2].1, format!("{:#x}", f2 + 5));
    assert!(sites.iter().all(|s| s.2 == 5));
    assert!(k.trapped("f1") && k.trapped("f2"));
    assert_eq!(made.splices.len(), 4);
    // A copy's point finds its splice again.
    assert!(sp.find(&dup2).is_some());
    assert_eq!(sp.find(&dup2), sp.find(&format!("{:#x}", f2 + 5)));
}

#[test]
fn a_single_point_naming_a_shared_name_stays_refused_with_its_candidates() {
    let k = kernel_with_a_shared_name();
    let mut sp = Splicer::new(k.clone());
    let e = sp.apply(&[count("dup")]).unwrap_err();
    assert_eq!(e.cause(), Some(RefusalCause::Ambiguous));
    let text = trapvec::error_chain(&e);
    let (f1, f2) = (
        trapvec::fake::func_addr("f1"),
        trapvec::fake::func_addr("f2"),
    );
    assert!(
        text.contains(&format!("main:dup at {f1:#x}, main:dup at {f2:#x}"))
            && text.contains("`dup@0xADDRESS`"),
        "{text}"
    );
    assert!(k.pristine());
}

#[test]
fn a_glob_matching_nothing_is_an_error_naming_it() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let e = apply(&mut sp, &spec(vec![count("f0"), count("tcp_*")]), false).unwrap_err();
    assert_eq!(e.to_string(), "the glob `tcp_*` matches no function");
    assert!(k.pristine());
    assert_eq!(sp.live().count(), 0);
}

#[test]
fn by_default_a_refusal_applies_nothing_and_names_the_first_ones() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f3")]).unwrap();
    let e = apply(&mut sp, &spec(vec![count("f*")]), false).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("1 of 4 splices refused, nothing was applied (first: f3: the site"),
        "{text}"
    );
    assert_eq!(sp.live().count(), 1);
    for f in ["f0", "f1", "f2"] {
        assert!(!k.trapped(f), "{f}");
    }
}

#[test]
fn best_effort_applies_the_rest_and_sums_the_refusals_up_by_reason() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.apply(&[count("f3")]).unwrap();
    let call = SpliceRequest::new(
        "f[01]",
        Action::Call {
            handler: "nope".into(),
            cookie: 0,
        },
        Mechanism::Trap,
    );
    let (report, _) = apply(&mut sp, &spec(vec![call, count("f[23]")]), true).unwrap();
    assert_eq!(ats(&report.spliced), ["f2"]);
    assert!(k.trapped("f2") && !k.trapped("f0") && !k.trapped("f1"));
    assert_eq!(report.requested, 4);
    assert_eq!(report.refused.len(), 3);
    let lines: Vec<String> = report.refusals.iter().map(|g| g.to_string()).collect();
    assert_eq!(
        lines,
        [
            "refused 2: the handler is not a symbol of any loaded component (at f0, f1)",
            "refused 1: the site is already spliced (at f3)",
        ]
    );
    let causes: Vec<Option<&str>> = report.refusals.iter().map(|g| g.cause.as_deref()).collect();
    assert_eq!(causes, [Some("unknown_handler"), Some("already_spliced")]);
    // Each refusal's reason, in the order of `refused`, whose errors keep their specifics.
    assert_eq!(
        report.refused_reasons,
        [
            "the handler is not a symbol of any loaded component",
            "the handler is not a symbol of any loaded component",
            "the site is already spliced",
        ]
    );
    assert!(
        report.refused[0].contains("handler `nope`"),
        "{}",
        report.refused[0]
    );
    assert!(
        report.refused[2].contains("(by f3"),
        "{}",
        report.refused[2]
    );
}

#[test]
fn a_summary_line_names_the_first_three_points() {
    let points: Vec<RefusedPoint> = (0..5)
        .map(|i| {
            let at = format!("g{i}");
            let e = SpliceError::Refused {
                at: at.clone(),
                site: 0x1000 + i,
                mechanism: Mechanism::Jmp,
                refusal: Refusal::FunctionTooShort {
                    func: at.clone(),
                    size: 2 + i,
                    needed: 5,
                    what: "a jmp rel32",
                },
            };
            RefusedPoint::of(&at, &e)
        })
        .collect();
    let groups = summarize(&points);
    assert_eq!(groups.len(), 1);
    assert_eq!(
        groups[0].to_string(),
        "refused 5: the function is too short for the patch (at g0, g1, g2, ...)"
    );
    assert_eq!(groups[0].cause.as_deref(), Some("too_short"));
    // The full error keeps what the line leaves out.
    assert!(
        points[4].chain.contains("only 6 byte(s) long") && points[4].chain.contains("0x1004"),
        "{}",
        points[4].chain
    );
}

/// Refusals as 6.1's `[iut][cdp]*` has them (vmtest/scenarios/kernel_glob.sh): one line per
/// cause whatever the addresses, bytes, instructions, function names and other splices
/// their errors name.
#[test]
fn refusals_are_grouped_by_cause_whatever_their_details() {
    let refused = |at: &str, site: u64, refusal: Refusal| SpliceError::Refused {
        at: at.into(),
        site,
        mechanism: Mechanism::Trap,
        refusal,
    };
    let unrelocatable = |site: u64, insn: &str, why: RefusalCause| Refusal::Unrelocatable {
        site,
        addr: site,
        insn: insn.into(),
        reason: format!("its memory operand is more than ±2 GiB from {site:#x}"),
        cause: why,
    };
    let invalid = |at: &str, addr: u64, bytes: &str| SpliceError::Point {
        at: at.into(),
        source: PlanError::Analysis(crate::AnalysisError::InvalidInstruction {
            func: at.into(),
            addr,
            bytes: bytes.into(),
        }),
    };
    let crosses = |site: u64, last: &str| Refusal::WindowCrossesBlock {
        site,
        window_end: site + 2,
        block_start: site - 5,
        block_end: site + 1,
        last: last.into(),
    };
    let kernel = |at: &str, addr: u64, reason: SiteRefusal| SpliceError::Target {
        at: at.into(),
        source: trapvec::TargetError::SiteRefused { addr, reason },
    };
    let errors = [
        (
            "tcp_init",
            invalid("tcp_init", 0xffffffff83a0b8c0, "61 74 74 72 00 00"),
        ),
        ("ip_init", invalid("ip_init", 0xffffffff83a0a000, "61 74")),
        (
            "up_write",
            refused(
                "up_write",
                0xffffffff811034f5,
                unrelocatable(
                    0xffffffff811034f5,
                    "inc dword ptr gs:[0x1fb40]",
                    RefusalCause::OperandOutOfReach,
                ),
            ),
        ),
        (
            "update_spec_ctrl_cond",
            refused(
                "update_spec_ctrl_cond",
                0xffffffff81048625,
                unrelocatable(
                    0xffffffff81048625,
                    "mov rax, gs:[0x1fb88]",
                    RefusalCause::OperandOutOfReach,
                ),
            ),
        ),
        (
            "tp_stub_func",
            refused(
                "tp_stub_func",
                0xffffffff8119cb45,
                crosses(0xffffffff8119cb45, "ret"),
            ),
        ),
        (
            "udp_poll",
            refused(
                "udp_poll",
                0xffffffff810e9965,
                crosses(0xffffffff810e9965, "jmp 0xffffffff810e9900"),
            ),
        ),
        (
            "tcp_twsk_destructor",
            kernel(
                "tcp_twsk_destructor",
                0xffffffff81001000,
                SiteRefusal::JumpLabel,
            ),
        ),
        (
            "udp_destroy_sock",
            kernel(
                "udp_destroy_sock",
                0xffffffff81002000,
                SiteRefusal::JumpLabel,
            ),
        ),
        (
            "tcp_v4_rcv",
            kernel(
                "tcp_v4_rcv",
                0xffffffff81003000,
                SiteRefusal::Kprobe {
                    at: 0xffffffff81003000,
                    place: "tcp_v4_rcv+0x5".into(),
                },
            ),
        ),
        (
            "ip_rcv",
            kernel(
                "ip_rcv",
                0xffffffff81004000,
                SiteRefusal::Kprobe {
                    at: 0xffffffff81004000,
                    place: "ip_rcv+0x5".into(),
                },
            ),
        ),
        (
            "id_show",
            SpliceError::Point {
                at: "id_show".into(),
                source: PlanError::Ambiguous {
                    text: "id_show".into(),
                    name: "id_show".into(),
                    candidates:
                        "main:id_show at 0xffffffff81001000, main:id_show at 0xffffffff81002000"
                            .into(),
                },
            },
        ),
        (
            "udp_lib_hash",
            SpliceError::AlreadySpliced {
                at: "udp_lib_hash".into(),
                site: 0xffffffff81005005,
                other: "udp_lib_hash (count)".into(),
            },
        ),
        // An error that is no refusal of the point: its own text, once.
        (
            "tcp_close",
            SpliceError::Target {
                at: "tcp_close".into(),
                source: trapvec::TargetError::Quiesce("a task stayed in `tcp_close`".into()),
            },
        ),
    ];
    let points: Vec<RefusedPoint> = errors
        .iter()
        .map(|(at, e)| RefusedPoint::of(at, e))
        .collect();
    let groups = summarize(&points);
    let got: Vec<(Option<String>, String)> = groups
        .iter()
        .map(|g| (g.cause.clone(), g.to_string()))
        .collect();
    let want = [
        (Some("invalid_instruction"), "refused 2: invalid instruction in the function (at tcp_init, ip_init)"),
        (Some("operand_out_of_reach"), "refused 2: an instruction cannot be relocated: its memory operand is more than ±2 GiB from the new address (at up_write, update_spec_ctrl_cond)"),
        (Some("window_crosses_block"), "refused 2: the window crosses the end of its basic block (at tp_stub_func, udp_poll)"),
        (Some("kernel_jump_label"), "refused 2: the kernel refuses to patch the site: overlaps a jump label (static key) site, which the kernel rewrites by itself (at tcp_twsk_destructor, udp_destroy_sock)"),
        (Some("kernel_kprobe"), "refused 2: the kernel refuses to patch the site: a kprobe is registered there: remove it first (at tcp_v4_rcv, ip_rcv)"),
        (Some("ambiguous"), "refused 1: the name is ambiguous (functions of that name in several places) (at id_show)"),
        (Some("already_spliced"), "refused 1: the site is already spliced (at udp_lib_hash)"),
        (None, "refused 1: quiescence not reached: a task stayed in the function (at tcp_close)"),
    ];
    let want: Vec<(Option<String>, String)> = want
        .iter()
        .map(|(c, l)| (c.map(str::to_string), l.to_string()))
        .collect();
    assert_eq!(got, want);
    // Each refusal keeps its specifics in the error itself.
    assert!(
        points[1].chain.contains("0xffffffff83a0a000 (bytes 61 74)"),
        "{}",
        points[1].chain
    );
    assert!(
        points[3].chain.contains("`mov rax, gs:[0x1fb88]`"),
        "{}",
        points[3].chain
    );
    assert!(
        points[9].chain.contains("ip_rcv+0x5"),
        "{}",
        points[9].chain
    );
    assert!(
        points[11].chain.contains("(by udp_lib_hash (count))"),
        "{}",
        points[11].chain
    );
}

#[test]
fn an_error_without_a_cause_is_grouped_by_its_text_without_the_point() {
    assert_eq!(
        reason_of("f1", "f1: point `f1`: something new about `f1` at 0x10"),
        "something new about the function at 0x10"
    );
    assert_eq!(
        reason_of("m:f1", "m:f1: `f1` went away"),
        "the function went away"
    );
    let p = |at: &str| RefusedPoint {
        at: at.into(),
        chain: format!("{at}: a new kind of refusal"),
        cause: None,
    };
    let groups = summarize(&[p("a"), p("b")]);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].cause, None);
    assert_eq!(
        groups[0].to_string(),
        "refused 2: a new kind of refusal (at a, b)"
    );
}

#[test]
fn check_expands_globs_too() {
    let sp = Splicer::new(FakeKernel::new());
    let report = check(&sp, &spec(vec![count("f[12]")]));
    let at: Vec<&str> = report.ok.iter().map(|r| r.at.as_str()).collect();
    assert_eq!(at, ["f1", "f2"]);
    let report = check(&sp, &spec(vec![count("x?")]));
    assert_eq!(report.refused, ["the glob `x?` matches no function"]);
}

#[test]
fn a_generated_spec_reads_back_as_its_splices() {
    let mut r = count("tcp_v4_*");
    r.mechanism = Mechanism::Jmp;
    r.options.by = Some(trapvec::keyed::KeyBy::Cpu);
    let text = spec_text(std::slice::from_ref(&r)).unwrap();
    let spec = Spec::parse(&text, Path::new("/"), Path::new("gen.toml")).unwrap();
    assert_eq!(spec.splices, [r]);
}

#[test]
fn a_generated_spec_writes_a_common_owner_once_and_reads_back_as_its_splices() {
    let owner = crate::owner::Owner {
        pid: 4242,
        start: 77,
        command: "trapctl cover 'tcp_*' \"quoted\" \\ --seconds 0".into(),
    };
    let owned = |at: &str, o: &crate::owner::Owner| {
        let mut r = count(at);
        r.options.owner = Some(o.clone());
        r
    };
    let all: Vec<SpliceRequest> = (0..50)
        .map(|i| owned(&format!("{:#x}", 0xffff_ffff_8100_0000u64 + i * 7), &owner))
        .collect();
    let text = spec_text(&all).unwrap();
    assert_eq!(text.matches("4242").count(), 1, "the owner once: {text}");
    let back = Spec::parse(&text, Path::new("/"), Path::new("gen.toml")).unwrap();
    assert_eq!(back.splices, all);
    // The JSON form: the owner once, and the same splices back from a `.json` file.
    let json = spec_json(&all).unwrap();
    assert_eq!(json.matches("4242").count(), 1, "the owner once: {json}");
    let back = Spec::parse(&json, Path::new("/"), Path::new("gen.JSON")).unwrap();
    assert_eq!(back.splices, all);
    // Splices of two owners, or some with none: each keeps its own (none stays none).
    let other = crate::owner::Owner {
        pid: 7,
        ..owner.clone()
    };
    let mixed = vec![owned("f1", &owner), owned("f2", &other), count("f3")];
    let text = spec_text(&mixed).unwrap();
    let back = Spec::parse(&text, Path::new("/"), Path::new("gen.toml")).unwrap();
    assert_eq!(back.splices, mixed);
    let json = spec_json(&mixed).unwrap();
    let back = Spec::parse(&json, Path::new("/"), Path::new("gen.json")).unwrap();
    assert_eq!(back.splices, mixed);
    // A spec's owner is every splice's that names none of its own.
    let text = "[owner]\npid = 1\nstart = 2\ncommand = \"c\"\n\n[[splice]]\nat = \"f1\"\naction = \"count\"\n\n[[splice]]\nat = \"f2\"\naction = \"count\"\nowner = { pid = 3, start = 4, command = \"d\" }\n";
    let back = Spec::parse(text, Path::new("/"), Path::new("gen.toml")).unwrap();
    let pids: Vec<Option<u32>> = back
        .splices
        .iter()
        .map(|s| s.options.owner.as_ref().map(|o| o.pid))
        .collect();
    assert_eq!(pids, [Some(1), Some(3)]);
}

#[test]
fn a_spec_takes_a_glob_and_refuses_a_bad_one() {
    let parse = |at: &str| {
        let text = format!("[[splice]]\nat = \"{at}\"\naction = \"count\"\n");
        Spec::parse(&text, Path::new("/"), Path::new("s.toml"))
    };
    assert_eq!(parse("tcp_v4_*").unwrap().splices[0].at, "tcp_v4_*");
    assert_eq!(parse("nf_*:nf_ct_?").unwrap().splices[0].at, "nf_*:nf_ct_?");
    let e = parse("tcp_[a-").unwrap_err().to_string();
    assert!(
        e.contains("splice[0].at") && e.contains("never closed"),
        "{e}"
    );
}
