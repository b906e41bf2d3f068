//! The splicer against a fake kernel-like target: count-only splices (dispatch entry or counting
//! trampoline), planning-time refusals from the target's own rules, best-effort batches, and the
//! saved state (round trip, checks against the target, removal after a restore).

use std::collections::BTreeMap;

use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use trapvec::fake::{func_addr, FakeKernel, FUNC, FUNCS, TEXT};
use trapvec::kernel::SiteRefusal;
use trapvec::{BlockKind, DispatchEntry, Target};

use super::state::StateError;
use super::{Action, SpliceError, SpliceRequest, Splicer};
use crate::plan::Mechanism;

fn count(at: &str, mechanism: Mechanism) -> SpliceRequest {
    SpliceRequest::new(at, Action::Count, mechanism)
}

fn mnemonics(bytes: &[u8], ip: u64) -> Vec<Mnemonic> {
    Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE)
        .into_iter()
        .map(|i| i.mnemonic())
        .collect()
}

#[test]
fn kernel_count_splice_is_a_handlerless_dispatch_entry_to_the_replay() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let f = func_addr("f1");
    let id = sp.apply(&[count("f1", Mechanism::Trap)]).unwrap()[0];
    let s = sp.get(id).unwrap();
    assert_eq!(s.point.site, f + 5, "the entry moved past the ftrace NOP");
    assert_eq!(s.plan.displaced_text, "push rbp; mov rbp, rsp");
    assert_eq!(k.text(f + 5, 2), [0xCD, 0xF5]);
    let d = s.dispatch().unwrap();
    assert_eq!((d.site, d.handler, d.dest), (f + 5, 0, s.entry()));
    // The replay: the two displaced instructions, then jmp f+9.
    let replay = k.text(d.dest, 9);
    assert_eq!(replay[..4], [0x55, 0x48, 0x89, 0xE5]);
    assert_eq!(replay[4], 0xE9);
    let rel = i32::from_le_bytes(replay[5..9].try_into().unwrap());
    assert_eq!((d.dest + 9).wrapping_add_signed(i64::from(rel)), f + 9);
    k.state().hits.insert(f + 5, 7);
    assert_eq!(sp.hits(id).unwrap().hits, 7, "the dispatcher's counter");
    let final_hits = sp.remove(&[id]).unwrap();
    assert_eq!(
        final_hits[0].hits, 7,
        "read before the dispatch entry (and its counter) went away"
    );
    assert_eq!(k.text(f, 32), FUNC);
    assert_eq!(k.live_blocks(), 0);
}

#[test]
fn jmp_count_splice_counts_between_pushfq_and_popfq_then_replays() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let f = func_addr("f2");
    let id = sp.apply(&[count("f2", Mechanism::Jmp)]).unwrap()[0];
    let entry = sp.get(id).unwrap().entry();
    assert_eq!(k.text(f + 5, 1), [0xE9], "jmp rel32 over push/mov/mov");
    let code = k.text(entry, 32);
    let m = mnemonics(&code, entry);
    assert_eq!(
        m[..7],
        [
            Mnemonic::Pushfq,
            Mnemonic::Inc,
            Mnemonic::Popfq,
            Mnemonic::Push,
            Mnemonic::Mov,
            Mnemonic::Mov,
            Mnemonic::Jmp
        ]
    );
    assert_eq!(code[1], 0xF0, "the increment is locked");
    sp.remove(&[id]).unwrap();
    assert_eq!(k.text(f, 32), FUNC);
}

#[test]
fn target_refusal_comes_at_planning_time_with_the_point_and_the_reason() {
    let k = FakeKernel::new();
    let f = func_addr("f3");
    k.state().refuse.insert(f + 5, SiteRefusal::Extable);
    let mut sp = Splicer::new(k.clone());
    let err = sp
        .apply(&[count("f0", Mechanism::Trap), count("f3", Mechanism::Trap)])
        .unwrap_err();
    let msg = trapvec::error_chain(&err);
    assert!(msg.starts_with("f3: "), "{msg}");
    assert!(msg.contains("exception-table"), "{msg}");
    assert_eq!(
        err.cause(),
        Some(crate::RefusalCause::Kernel(SiteRefusal::Extable))
    );
    assert_eq!(
        k.live_blocks(),
        0,
        "refused while planning: nothing allocated"
    );
    assert_eq!(k.state().batches, 0);
    assert!(
        k.state().checked.contains(&(f + 5, 4)),
        "the whole displaced window is checked"
    );
}

#[test]
fn an_armed_kprobe_is_planned_through_and_refused_by_the_target_naming_it() {
    let k = FakeKernel::new();
    let f = func_addr("f1");
    // A kprobe's int3 over `push rbp` at f1+5, which the target's check refuses as the module does.
    k.state().probed.insert(f + 5);
    k.state().refuse.insert(
        f + 5,
        SiteRefusal::Kprobe {
            at: f + 5,
            place: "f1+5".into(),
        },
    );
    assert_eq!(
        k.read(f + 5, 1).unwrap(),
        [0xCC],
        "the live text shows the probe"
    );
    let mut sp = Splicer::new(k.clone());
    let err = sp.apply(&[count("f1+5", Mechanism::Trap)]).unwrap_err();
    let msg = trapvec::error_chain(&err);
    assert!(
        msg.contains("a kprobe is registered at f1+5: remove it first"),
        "{msg}"
    );
    let cause = err.cause().unwrap();
    assert_eq!(
        (cause.name().as_ref(), cause.summary().as_ref()),
        (
            "kernel_kprobe",
            "the kernel refuses to patch the site: a kprobe is registered there: remove it first"
        )
    );
    // Behind the probe the boundaries are the function's own: f1+6 is `mov rbp, rsp`.
    let id = sp.apply(&[count("f1+6", Mechanism::Trap)]).unwrap()[0];
    assert_eq!(sp.get(id).unwrap().plan.displaced_text, "mov rbp, rsp");
    sp.remove(&[id]).unwrap();
}

#[test]
fn best_effort_applies_what_validates_and_names_each_refusal() {
    let k = FakeKernel::new();
    k.state()
        .refuse
        .insert(func_addr("f1") + 5, SiteRefusal::NoinstrText);
    let mut sp = Splicer::new(k.clone());
    let requests = [
        count("f0", Mechanism::Trap),
        count("f1", Mechanism::Trap),
        count("nosuch", Mechanism::Trap),
        count("f2+7", Mechanism::Trap),
        count("f2", Mechanism::Trap),
        count("f2", Mechanism::Trap),
        SpliceRequest {
            at: "f3".into(),
            action: Action::Call {
                handler: "absent".into(),
                cookie: 0,
            },
            mechanism: Mechanism::Trap,
            options: Default::default(),
        },
    ];
    let r = sp.apply_best_effort(&requests).unwrap();
    let applied: Vec<usize> = r.applied.iter().map(|a| a.0).collect();
    assert_eq!(applied, [0, 4]);
    let refused: BTreeMap<usize, String> = r
        .refused
        .iter()
        .map(|(i, e)| (*i, trapvec::error_chain(e)))
        .collect();
    assert_eq!(refused.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 5, 6]);
    assert!(refused[&1].contains("noinstr"), "{}", refused[&1]);
    assert!(refused[&2].contains("nosuch"), "{}", refused[&2]);
    assert!(
        refused[&3].contains("not an instruction boundary"),
        "{}",
        refused[&3]
    );
    assert!(
        matches!(r.refused[3].1, SpliceError::AlreadySpliced { .. }),
        "{}",
        refused[&5]
    );
    assert!(refused[&6].contains("absent"), "{}", refused[&6]);
    assert_eq!(k.state().batches, 1, "one batch for all that validated");
    assert_eq!(k.text(func_addr("f1"), 32), FUNC);
}

#[test]
fn find_takes_the_point_as_written_the_function_or_the_site_address() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k);
    let id = sp.apply(&[count("f1+0x5", Mechanism::Trap)]).unwrap()[0];
    assert_eq!(sp.find("f1+0x5"), Some(id));
    assert_eq!(
        sp.find("f1"),
        Some(id),
        "the entry resolves past the ftrace NOP"
    );
    assert_eq!(sp.find(&format!("{:#x}", func_addr("f1") + 5)), Some(id));
    assert_eq!(sp.find("f2"), None);
    assert_eq!(sp.find("f1+6"), None);
}

/// A component compiled at test time: a handler and a variable.
fn component(dir: &std::path::Path) -> std::path::PathBuf {
    let src = dir.join("probe.c");
    std::fs::write(
        &src,
        "unsigned long probe_limit = 1000;\nunsigned long probe_seen;\nvoid probe_hit(void *regs, void *cookie) { probe_seen += probe_limit; }\n",
    )
    .unwrap();
    let obj = dir.join("probe.o");
    let out = std::process::Command::new("cc")
        .args(["-c", "-O2", "-fno-asynchronous-unwind-tables", "-o"])
        .arg(&obj)
        .arg(&src)
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    obj
}

#[test]
fn state_keeps_components_their_variables_and_references() {
    let dir = tempfile::tempdir().unwrap();
    let obj = component(dir.path());
    let k = FakeKernel::new();
    let mut first = Splicer::new(k.clone());
    first
        .load_component(&obj, &component_manager::LoadOptions::default())
        .unwrap();
    let call = SpliceRequest {
        at: "f0".into(),
        action: Action::Call {
            handler: "probe_hit".into(),
            cookie: 9,
        },
        mechanism: Mechanism::Trap,
        options: Default::default(),
    };
    let id = first.apply(&[call]).unwrap()[0];
    first.set_var("probe_limit", 1400, 8).unwrap();
    let state = first.export_state();
    drop(first);

    let mut second = Splicer::import_state(k.clone(), &state).unwrap();
    assert_eq!(second.get_var("probe_limit", 8).unwrap(), 1400);
    let c = second
        .components()
        .by_name("probe")
        .expect("the component is known");
    assert_eq!(
        second.components().get(c).unwrap().refs(),
        1,
        "held by the splice"
    );
    let d = second.get(id).unwrap().dispatch().unwrap();
    assert_eq!(
        (d.handler, d.cookie),
        (second.components().lookup("probe_hit").unwrap().1, 9)
    );
    assert!(
        second.unload_component(c).is_err(),
        "in use by a live splice"
    );
    second.remove(&[id]).unwrap();
    second.unload_component(c).unwrap();
    assert_eq!(k.live_blocks(), 0);

    // A component whose code changed under the saved state is refused by name.
    let mut third = Splicer::new(k.clone());
    let c = third
        .load_component(&obj, &component_manager::LoadOptions::default())
        .unwrap();
    let code = third.components().get(c).unwrap().code_addr;
    let state = third.export_state();
    let byte = k.text(code, 1)[0];
    k.state().memory.insert(code, byte ^ 0xFF);
    let err = Splicer::import_state(k, &state).err().unwrap();
    assert!(
        matches!(&err, StateError::Component { name, .. } if name == "probe"),
        "{err}"
    );
}

/// Tests of [`Splicer::switch`] over this fake kernel.
#[path = "switch_tests.rs"]
mod switch_tests;

/// The saved state: round trips, and what a restore checks against the target.
#[path = "state_tests.rs"]
mod state_tests;

#[test]
fn a_batch_reads_the_text_of_neighbouring_functions_at_once_and_analyses_each_once() {
    let k = FakeKernel::new();
    let sp = Splicer::new(k.clone());
    let (f0, f2) = (func_addr("f0"), func_addr("f2"));
    let mut cache = super::batch::BatchCache::default();
    let requests = [
        count("f0", Mechanism::Trap),
        count("f0+0x9", Mechanism::Trap),
        count("f2", Mechanism::Trap),
    ];
    let planned = sp.plan_batch(&requests, &mut cache).unwrap();
    let sites: Vec<u64> = planned.iter().map(|p| p.plan.site).collect();
    assert_eq!(sites, [f0 + 5, f0 + 9, f2 + 5]);
    assert_eq!(
        planned[0].site_text.as_deref(),
        Some(&FUNC[5..5 + planned[0].plan.displaced_len]),
        "the bytes the trap displaces, as analysed"
    );
    // Besides the entry checks (endbr64 and ftrace site, 9 bytes) at each entry: one read of
    // f0..f2's text, nothing else.
    let entry = crate::point::KERNEL_ENTRY_MAX;
    let text_reads: Vec<(u64, usize)> = k
        .state()
        .reads
        .iter()
        .copied()
        .filter(|r| r.1 > entry)
        .collect();
    assert_eq!(text_reads, [(f0, 3 * 32)]);
    // f0 has two points: its analysis is kept and shared; f2's is made anew when asked again.
    let f0_sym = &planned[0].point.function;
    let a = cache.function(&k, "f0", f0_sym).unwrap();
    assert!(std::rc::Rc::ptr_eq(
        &a,
        &cache.function(&k, "f0+0x9", f0_sym).unwrap()
    ));
    let f2_sym = &planned[2].point.function;
    assert!(!std::rc::Rc::ptr_eq(
        &cache.function(&k, "f2", f2_sym).unwrap(),
        &cache.function(&k, "f2", f2_sym).unwrap()
    ));
    assert_eq!(
        k.state().reads.iter().filter(|r| r.1 > entry).count(),
        1,
        "still from the text read ahead"
    );
}

#[test]
fn counters_are_read_in_spans_and_word_by_word_where_a_span_is_unreadable() {
    let mut k = FakeKernel::new();
    let a = k.alloc(0, 16, BlockKind::Data).unwrap();
    let b = k.alloc(0, 16, BlockKind::Data).unwrap();
    k.write(&a, 0, &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    k.write(&b, 0, &[3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    k.state().reads.clear();
    let words = super::batch::read_words(&k, &[b.addr + 8, a.addr, b.addr, a.addr + 8]);
    assert_eq!(words, [4, 1, 3, 2], "in the order asked");
    assert_eq!(
        k.state().reads,
        [(a.addr, 32)],
        "one read for the four neighbours"
    );
    // A span over unmapped memory falls back to single words; the unmapped one reads as 0.
    k.state().reads.clear();
    assert_eq!(super::batch::read_words(&k, &[a.addr - 8, a.addr]), [0, 1]);
    assert_eq!(
        k.state().reads,
        [(a.addr - 8, 16), (a.addr - 8, 8), (a.addr, 8)]
    );
}

#[test]
fn handlers_must_be_code_and_variables_data_of_their_size() {
    let dir = tempfile::tempdir().unwrap();
    let obj = component(dir.path());
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    sp.load_component(&obj, &component_manager::LoadOptions::default())
        .unwrap();
    let bytes_before = k.read(k.symbols().lookup("f0").unwrap().addr, 16).unwrap();
    let data_as_handler = SpliceRequest {
        at: "f0".into(),
        action: Action::Call {
            handler: "probe_limit".into(),
            cookie: 0,
        },
        mechanism: Mechanism::Trap,
        options: Default::default(),
    };
    let err = sp.apply(&[data_as_handler]).unwrap_err().to_string();
    assert!(
        err.contains("probe_limit") && err.contains("not in a code section"),
        "{err}"
    );
    assert_eq!(
        k.read(k.symbols().lookup("f0").unwrap().addr, 16).unwrap(),
        bytes_before,
        "nothing written"
    );
    let err = sp.set_var("probe_hit", 1, 8).unwrap_err().to_string();
    assert!(
        err.contains("probe_hit") && err.contains("not in a data or bss section"),
        "{err}"
    );
    assert!(matches!(
        sp.get_var("no_such_variable", 8),
        Err(SpliceError::UnknownVariable { .. })
    ));
}

#[test]
fn kernel_jmp_at_a_case_label_before_another_takes_a_springboard_not_a_rel32() {
    let k = FakeKernel::new();
    let f = func_addr("f0");
    let table = TEXT + 0x1000;
    let disp = i32::try_from(i64::from_le_bytes(table.to_le_bytes()))
        .unwrap()
        .to_le_bytes();
    #[rustfmt::skip]
    let code = [
        /*00*/ 0x0F, 0x1F, 0x44, 0x00, 0x00,                         // nop5 (fentry)
        /*05*/ 0x83, 0xFF, 0x01,                                     // cmp edi, 1
        /*08*/ 0x77, 0x0F,                                           // ja +0x19
        /*0a*/ 0xFF, 0x24, 0xFD, disp[0], disp[1], disp[2], disp[3], // jmp qword [rdi*8+table]
        /*11*/ 0x31, 0xC0,                                           // xor eax, eax   case 0
        /*13*/ 0xB8, 0x01, 0x00, 0x00, 0x00,                         // mov eax, 1     case 1
        /*18*/ 0xC3,                                                 // ret
        /*19*/ 0xC3,                                                 // ret           default
    ];
    {
        let mut st = k.state();
        for (i, b) in code.iter().enumerate() {
            st.memory.insert(f + i as u64, *b);
        }
        for (i, b) in [f + 0x11, f + 0x13]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .enumerate()
        {
            st.memory.insert(table + i as u64, b);
        }
    }
    let mut sp = Splicer::new(k.clone());
    // xor (2 bytes) + mov (5 bytes) would cover case 1: no jmp rel32 there, only a jmp rel8 to a
    // springboard in the int3 padding after the function, displacing the xor alone.
    let ids = sp
        .apply(&[
            count("f0+0x11", Mechanism::Jmp),
            count("f0+0x13", Mechanism::Trap),
        ])
        .unwrap();
    let s = sp.get(ids[0]).unwrap();
    assert_eq!(
        (s.plan.displaced_text.as_str(), s.plan.displaced_len),
        ("xor eax, eax", 2)
    );
    let sb = s.plan.springboard.as_ref().expect("a springboard").addr;
    assert!(
        sb >= f + 0x1a && sb + 5 <= f + 32,
        "springboard {sb:#x} in f0's padding"
    );
    assert_eq!(k.text(f + 0x11, 1), [0xEB]);
    assert_eq!(
        k.text(f + 0x13, 2),
        [0xCD, 0xF5],
        "a trap at case 1 itself fits"
    );
    sp.remove(&ids).unwrap();
    assert_eq!(k.text(f, code.len()), code);
    assert_eq!(k.live_blocks(), 0);
}

#[test]
fn a_function_is_analysed_as_it_was_before_its_live_splices() {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let f = func_addr("f1");
    // A trap over the 3-byte `mov rbp,rsp` at +6 leaves its last byte, E5, which decodes with
    // the next instruction's first byte as `in eax, 0x48` and hides `mov rax,rdi` at +9.
    let first = sp.apply(&[count("f1+6", Mechanism::Trap)]).unwrap()[0];
    assert_eq!(k.text(f + 6, 3), [0xCD, 0xF5, 0xE5]);
    let second = sp
        .apply(&[count("f1+9", Mechanism::Trap)])
        .expect("+9 is an instruction of the function as it was");
    assert_eq!(
        sp.get(second[0]).unwrap().plan.displaced_text,
        "mov rax, rdi"
    );
    // The live window itself stays refused.
    let e = sp
        .apply(&[count("f1+7", Mechanism::Trap)])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("f1+7"), "{e}");
    sp.remove(&[first, second[0]]).unwrap();
    assert_eq!(k.text(f, 32), FUNC);
}

#[test]
fn each_runtime_slot_is_given_back_once_even_when_a_return_slot_holds_the_removal_up() {
    use trapvec::fake::SLOT_ENTRY;
    use trapvec::keyed::KeyBy;
    use trapvec::returns::Clock;
    use trapvec::slots::Slot;
    let k = FakeKernel::new();
    k.state().runtime_slots = true;
    let mut sp = Splicer::new(k.clone());
    let mut by_tid = count("f1", Mechanism::Trap);
    by_tid.options.by = Some(KeyBy::Tid);
    let timer = SpliceRequest::new("f2", Action::Time { clock: Clock::Wall }, Mechanism::Trap);
    let ids = sp.apply(&[by_tid, timer]).unwrap();
    // Each is a call of its slot's routine with the slot's cookie, run by the dispatcher.
    let calls: Vec<(u64, u64)> = ids
        .iter()
        .map(|&id| {
            let d = sp.get(id).unwrap().dispatch().unwrap();
            (d.handler, d.cookie)
        })
        .collect();
    assert_eq!(calls, [(SLOT_ENTRY, 1), (SLOT_ENTRY + 16, 2)]);
    assert_eq!(k.state().slots.len(), 2);
    assert!(sp.key_counts(ids[0]).unwrap().is_some());
    assert!(
        sp.key_counts(ids[1]).unwrap().is_none(),
        "a timer has no table"
    );
    assert!(sp.return_stats(ids[1]).unwrap().is_some());
    // The keyed count's slot goes back, the timer's does not: both splices stay retiring.
    k.state().return_slot_busy = Some("a thread is in the return handler".into());
    let err = sp.remove(&ids).unwrap_err();
    assert!(
        matches!(&err, SpliceError::Retiring { at, .. } if at == "f2")
            && err
                .to_string()
                .contains("a thread is in the return handler"),
        "{err}"
    );
    assert_eq!(sp.retiring().count(), 2);
    k.state().return_slot_busy = None;
    sp.finish_retiring(&ids).unwrap();
    let freed: Vec<u32> = k.state().slots_freed.iter().map(Slot::index).collect();
    assert_eq!(
        freed,
        [0, 1],
        "each slot given back once, the keyed count's first"
    );
    assert!(k.state().slots.is_empty());
    assert!(k.pristine(), "every block freed");
}

#[test]
fn a_best_effort_batch_puts_every_window_to_the_target_in_one_call() {
    let k = FakeKernel::new();
    let f3 = func_addr("f3");
    k.state().refuse.insert(f3 + 5, SiteRefusal::Extable);
    let mut sp = Splicer::new(k.clone());
    let requests: Vec<SpliceRequest> = ["f0", "f1", "f3", "f2"]
        .iter()
        .map(|f| count(f, Mechanism::Trap))
        .collect();
    let done = sp.apply_best_effort(&requests).unwrap();
    assert_eq!(done.applied.len(), 3);
    assert_eq!(done.refused.len(), 1);
    let (i, err) = &done.refused[0];
    assert_eq!(*i, 2);
    let msg = trapvec::error_chain(err);
    assert!(msg.starts_with("f3: "), "{msg}");
    assert!(msg.contains("exception-table"), "{msg}");
    assert_eq!(
        k.state().check_batches,
        [4],
        "one call for the four windows"
    );
    assert_eq!(k.state().checked.len(), 4, "each window asked once");
}

#[test]
fn a_request_that_met_a_refused_requests_claim_is_planned_again_as_if_checked_in_turn() {
    let k = FakeKernel::new();
    let f2 = func_addr("f2");
    // A jmp at f2+5 displaces push, mov, mov (f2+5..f2+12); the target refuses it. Checked in
    // turn it claims nothing, so a trap at f2+9 (inside that window) plans and is applied.
    k.state().refuse.insert(f2 + 5, SiteRefusal::JumpLabel);
    let mut sp = Splicer::new(k.clone());
    let requests = [count("f2", Mechanism::Jmp), count("f2+9", Mechanism::Trap)];
    let done = sp.apply_best_effort(&requests).unwrap();
    assert_eq!(done.refused.len(), 1, "{:?}", done.refused);
    assert_eq!(done.refused[0].0, 0);
    assert_eq!(
        done.refused[0].1.cause(),
        Some(crate::RefusalCause::Kernel(SiteRefusal::JumpLabel))
    );
    assert_eq!(done.applied.len(), 1);
    assert_eq!(done.applied[0].0, 1);
    assert_eq!(k.text(f2 + 9, 2), [0xCD, 0xF5]);
    // All or nothing: the first refusal, as before.
    sp.remove(&[done.applied[0].1]).unwrap();
    let err = sp.apply(&requests).unwrap_err();
    assert!(trapvec::error_chain(&err).starts_with("f2: "), "{err}");
}

/// The fake's whole text as one object's code ([`trapvec::TargetInfo::object_code`]).
fn fake_object_code(_: u64) -> Option<Vec<(u64, u64)>> {
    Some(vec![(TEXT, TEXT + 32 * FUNCS.len() as u64)])
}

#[test]
fn a_jump_back_from_unnamed_code_elsewhere_in_the_object_keeps_a_jmp_rel32_off_its_target() {
    let info = trapvec::TargetInfo {
        object_code: Some(fake_object_code),
        ..trapvec::TargetInfo::user("fake process")
    };
    let plain = trapvec::TargetInfo::user("fake process without object code");
    let f = func_addr("f0");
    let cold = func_addr("f2");
    let back = i32::try_from((f + 0x0b).wrapping_sub(cold + 9).cast_signed()).unwrap();
    let out = i32::try_from(cold.wrapping_sub(f + 8).cast_signed()).unwrap();
    let (o, b) = (out.to_le_bytes(), back.to_le_bytes());
    #[rustfmt::skip]
    let code = [
        /*00*/ 0x85, 0xFF,                         // test edi, edi
        /*02*/ 0x0F, 0x88, o[0], o[1], o[2], o[3], // js f2 (the unnamed cold part)
        /*08*/ 0x8D, 0x47, 0x02,                   // lea eax, [rdi+2]
        /*0b*/ 0x8D, 0x44, 0x80, 0x01,             // lea eax, [rax+rax*4+1]   <- f2 jumps back
        /*0f*/ 0xC3,                               // ret
    ];
    #[rustfmt::skip]
    let part = [
        /*00*/ 0x89, 0xF8,                         // mov eax, edi
        /*02*/ 0xF7, 0xD8,                         // neg eax
        /*04*/ 0xE9, b[0], b[1], b[2], b[3],       // jmp f0+0xb
    ];
    for (info, springboard) in [(info, true), (plain, false)] {
        let k = FakeKernel::repository(info, Vec::new());
        {
            let mut st = k.state();
            for (i, x) in code.iter().enumerate() {
                st.memory.insert(f + i as u64, *x);
            }
            for (i, x) in part.iter().enumerate() {
                st.memory.insert(cold + i as u64, *x);
            }
        }
        let mut sp = Splicer::new(k.clone());
        let ids = sp.apply(&[count("f0+8", Mechanism::Jmp)]).unwrap();
        let s = sp.get(ids[0]).unwrap();
        if springboard {
            // A jmp rel32 would cover both leas, and f2's jump back would land in its bytes:
            // a jmp rel8 to a springboard in f0's padding, displacing the first lea alone.
            assert!(s.plan.springboard.is_some(), "{:?}", s.plan);
            assert_eq!(s.plan.displaced_len, 3);
        } else {
            // Without the object's code the jump back is unknown (the case this guards).
            assert!(s.plan.springboard.is_none());
            assert_eq!(s.plan.displaced_len, 7);
        }
        sp.remove(&ids).unwrap();
        assert_eq!(k.text(f, code.len()), code);
    }
}
