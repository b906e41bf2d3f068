//! The kernel backend's logic against a fake module (the [`ioctl`](super::ioctl) seam): batch
//! building, error mapping, chunking, reach checks, list growth, kallsyms parsing. The real
//! module is tested in a VM (kmod/tests/).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use nix::errno::Errno;

use super::ioctl::{fake, Request};
use super::kallsyms::{self, KallsymsError};
use super::{KernelTarget, ListedEntry, SiteRefusal};
use crate::abi::*;
use crate::error::TargetError;
use crate::slots::{Slot, SlotReading, SlotSpec};
use crate::target::{
    BlockKind, DispatchEntry, RepoBlock, SymbolKind, Target, TargetExt, TextPatch, TrapHits,
};

const TEXT: u64 = 0xffff_ffff_8100_0000;
const CODE_ARENA: u64 = 0xffff_ffff_c020_5000;
const INFLIGHT: u64 = 0xffff_ffff_c041_3000;
const REPLACE_RET: u64 = 0xffff_ffff_c020_2000;

#[rustfmt::skip]
const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff810b0f90 T __x64_sys_getppid
ffffffff810b0fd0 t do_getppid_helper
ffffffff81a077a0 T __memcpy
ffffffff81a077a0 W memcpy
ffffffff82a59540 D text_mutex
ffffffff832b4000 b idt_table
ffffffff82000000 R __start_rodata
0000000000000000 A fixed_percpu_data
ffffffffc0201ef0 t trapvec_entry\t[trapvec]
ffffffffc0313000 b trapvec_data_arena\t[trapvec]
";

/// What the fake module has seen and what it answers.
#[derive(Default)]
struct FakeModule {
    abi_version: u32,
    /// Calls, by ioctl name, in order.
    calls: Vec<&'static str>,
    /// Kernel memory READ serves: `addr -> byte`, and `pattern` (byte `(addr - start) % 251`);
    /// anything else faults.
    memory: BTreeMap<u64, u8>,
    pattern: std::ops::Range<u64>,
    /// The patches of every APPLY.
    applied: Vec<Vec<TrapvecPatch>>,
    /// Answer to the next APPLY: errno and the fields to fill.
    apply_failure: Option<(Errno, TrapvecApply)>,
    /// CHECK answers by address: `(reason, error)`, and the flags of every CHECK.
    checks: BTreeMap<u64, (u32, i32)>,
    check_flags: Vec<u32>,
    /// The entries of every CHECK_MANY (answered from `checks` and `culprits`, as CHECK).
    check_many: Vec<Vec<TrapvecCheck>>,
    /// CHECK's culprit by address, where the default (a kprobe two bytes into the window) does
    /// not fit; the flags of every READ.
    culprits: BTreeMap<u64, u64>,
    read_flags: Vec<u32>,
    /// Where ALLOC puts the next block.
    next_block: u64,
    next_id: u64,
    freed: Vec<u64>,
    sealed: Vec<u64>,
    writes: Vec<(u64, u64, Vec<u8>)>,
    /// Errno for every request of this name.
    fail: BTreeMap<&'static str, (Errno, u32)>,
    dispatch: BTreeMap<u64, TrapvecListEntry>,
    /// The `vector` INFO reports (0 means the default, 0xf5).
    vector: u32,
    /// Entries LIST pretends were added between a caller's two LIST calls.
    list_grows_by: usize,
    quiesced: u32,
    /// QUIESCE answers EBUSY with this block and count while set.
    quiesce_busy: Option<(u64, u64)>,
    /// The state blob and its generation.
    state: Vec<u8>,
    generation: u64,
    /// STATE_GETs answered so far, and after how many the blob grows by itself once (another
    /// trapctl's PUT between a caller's two GETs).
    state_gets: u32,
    state_grows_after: Option<u32>,
    /// Return-point slots: `(add request, removed)`, and the stats RETURN_STATS answers.
    returns: Vec<(TrapvecReturnAdd, bool)>,
    return_stats: TrapvecReturnStats,
    /// Keyed-count slots: `(add request, removed)`; the table KEY_STATS answers (merged, by
    /// key), its overflow, and the capacity of every KEY_STATS.
    keys: Vec<(TrapvecKeyAdd, bool)>,
    key_table: Vec<TrapvecKeyEntry>,
    key_overflow: u64,
    key_capacities: Vec<u32>,
}

type Shared = Rc<RefCell<FakeModule>>;

impl FakeModule {
    /// CHECK's answer, and each of CHECK_MANY's: from `checks` by address.
    fn answer_check(&self, c: &mut TrapvecCheck) {
        (c.reason, c.error) = self.checks.get(&c.addr).copied().unwrap_or_default();
        if c.len as usize > TRAPVEC_PATCH_MAX {
            c.reason = TRAPVEC_REASON_BAD_LENGTH;
        }
        // A kprobe refusal names the probe: here, two bytes into the window.
        c.culprit = match self.culprits.get(&c.addr) {
            Some(&culprit) => culprit,
            None if c.reason == TRAPVEC_REASON_KPROBE => c.addr + 2,
            None => 0,
        };
    }

    fn serve(&mut self, req: &mut Request<'_>) -> Result<(), Errno> {
        self.calls.push(req.name());
        if let Some(&(errno, index)) = self.fail.get(req.name()) {
            match req {
                Request::DispatchAdd { arg, .. } => arg.failed_index = index,
                Request::DispatchRemove { arg, .. } => arg.failed_index = index,
                Request::DispatchReplace { arg, .. } => arg.failed_index = index,
                _ => {}
            }
            return Err(errno);
        }
        match req {
            Request::Info(i) => {
                **i = TrapvecInfo {
                    abi_version: self.abi_version,
                    vector: if self.vector == 0 { 0xf5 } else { self.vector },
                    code_base: CODE_ARENA,
                    code_size: 1 << 20,
                    inflight_base: INFLIGHT,
                    replace_ret: REPLACE_RET,
                    ..Default::default()
                }
            }
            Request::Read { arg, buf } => {
                assert_eq!(arg.len as usize, buf.len());
                assert!(
                    buf.len() <= TRAPVEC_XFER_MAX as usize,
                    "a READ larger than the module takes"
                );
                self.read_flags.push(arg.flags);
                for (i, b) in buf.iter_mut().enumerate() {
                    let at = arg.addr + i as u64;
                    *b = match self.memory.get(&at) {
                        Some(&v) => v,
                        None if self.pattern.contains(&at) => {
                            u8::try_from((at - self.pattern.start) % 251).unwrap()
                        }
                        None => return Err(Errno::EFAULT),
                    };
                }
            }
            Request::Alloc(a) => {
                self.next_id += 1;
                a.id = self.next_id;
                a.addr = self.next_block;
                self.next_block += a.size.next_multiple_of(16);
            }
            Request::Write { arg, bytes } => {
                assert!(bytes.len() <= TRAPVEC_XFER_MAX as usize);
                self.writes.push((arg.id, arg.offset, bytes.to_vec()));
            }
            Request::Seal(b) => self.sealed.push(b.id),
            Request::Free(b) => self.freed.push(b.id),
            Request::Check(c) => {
                self.check_flags.push(c.flags);
                self.answer_check(c);
            }
            Request::CheckMany { arg, checks } => {
                assert_eq!(arg.count as usize, checks.len());
                assert_eq!(arg.flags, 0);
                self.check_many.push(checks.to_vec());
                for c in checks.iter_mut() {
                    assert_eq!(
                        c.flags, TRAPVEC_CHECK_NO_KPROBE,
                        "the module refuses others"
                    );
                    self.answer_check(c);
                }
            }
            Request::Apply { arg, patches } => {
                assert_eq!(arg.count as usize, patches.len());
                self.applied.push(patches.to_vec());
                if let Some((errno, answer)) = self.apply_failure.take() {
                    **arg = TrapvecApply {
                        patches: arg.patches,
                        count: arg.count,
                        ..answer
                    };
                    return Err(errno);
                }
            }
            Request::DispatchAdd { entries, .. } => {
                for e in entries.iter() {
                    let l = TrapvecListEntry {
                        site: e.site,
                        dest: e.dest,
                        handler: e.handler,
                        cookie: e.cookie,
                        ..Default::default()
                    };
                    self.dispatch.insert(e.site, l);
                }
            }
            Request::DispatchRemove { sites, .. } => {
                for s in sites.iter() {
                    self.dispatch.remove(s);
                }
            }
            Request::DispatchReplace {
                arg,
                entries,
                counts,
            } => {
                assert_eq!(
                    (arg.count as usize, counts.len()),
                    (entries.len(), entries.len())
                );
                if let Some(i) = entries
                    .iter()
                    .position(|e| !self.dispatch.contains_key(&e.site))
                {
                    arg.failed_index = u32::try_from(i).unwrap();
                    return Err(Errno::ENOENT);
                }
                for (e, c) in entries.iter().zip(counts.iter_mut()) {
                    let new = TrapvecListEntry {
                        site: e.site,
                        dest: e.dest,
                        handler: e.handler,
                        cookie: e.cookie,
                        hits: c.hits,
                        missed: c.missed,
                        ..Default::default()
                    };
                    let old = self.dispatch.insert(e.site, new).expect("checked above");
                    *c = TrapvecHits {
                        site: e.site,
                        hits: old.hits,
                        missed: old.missed,
                    };
                }
            }
            Request::Hits(h) => {
                let e = self.dispatch.get(&h.site).ok_or(Errno::ENOENT)?;
                (h.hits, h.missed) = (e.hits, e.missed);
            }
            Request::List { arg, out, hit } => {
                if arg.capacity == 0 {
                    // Entries arrive between this call and the caller's next one.
                    for k in 0..self.list_grows_by as u64 {
                        let site = TEXT + 0x1000 + k;
                        self.dispatch.insert(
                            site,
                            TrapvecListEntry {
                                site,
                                hits: k,
                                ..Default::default()
                            },
                        );
                    }
                }
                // LIST_HIT: as LIST over the entries hit at least once only.
                let listed: Vec<TrapvecListEntry> = self
                    .dispatch
                    .values()
                    .filter(|e| !*hit || e.hits > 0)
                    .copied()
                    .collect();
                arg.count = u32::try_from(listed.len()).unwrap();
                // As the module: from the start-th entry, at most TRAPVEC_BATCH_MAX of them.
                let skip = usize::try_from(arg.start).unwrap();
                let room = out.len().min(TRAPVEC_BATCH_MAX as usize);
                for (slot, e) in out[..room].iter_mut().zip(listed.into_iter().skip(skip)) {
                    *slot = e;
                }
            }
            Request::Quiesce(q) => {
                self.quiesced += 1;
                if let Some((addr, count)) = self.quiesce_busy {
                    q.busy_addr = addr;
                    q.busy_count = count;
                    return Err(Errno::EBUSY);
                }
                q.reclaimed_blocks = 1;
            }
            Request::StateGet { arg, buf } => {
                self.state_gets += 1;
                if self.state_grows_after == Some(self.state_gets) {
                    self.state.extend_from_slice(b" and more");
                    self.generation += 1;
                }
                assert_eq!(arg.len, buf.len() as u64);
                arg.size = self.state.len() as u64;
                arg.generation = self.generation;
                if self.state.len() > buf.len() {
                    return Err(Errno::ENOSPC);
                }
                buf[..self.state.len()].copy_from_slice(&self.state);
            }
            Request::StatePut { arg, bytes } => {
                assert_eq!(arg.len, bytes.len() as u64);
                if arg.generation != self.generation {
                    arg.generation = self.generation;
                    return Err(Errno::ESTALE);
                }
                self.state = bytes.to_vec();
                self.generation += 1;
                arg.generation = self.generation;
            }
            Request::ReturnAdd(a) => {
                a.slot = u32::try_from(self.returns.len()).unwrap();
                a.generation = 7;
                a.entry = RP_ENTRY;
                a.entry_cookie = (7 << 32) | u64::from(a.slot);
                self.returns.push((**a, false));
            }
            Request::ReturnRemove(r) => {
                let slot = self
                    .returns
                    .get_mut(r.slot as usize)
                    .filter(|s| !s.1 && r.generation == 7)
                    .ok_or(Errno::ENOENT)?;
                slot.1 = true;
            }
            Request::ReturnStats(st) => {
                self.returns
                    .get(st.slot as usize)
                    .filter(|s| !s.1 && st.generation == 7)
                    .ok_or(Errno::ENOENT)?;
                **st = TrapvecReturnStats {
                    slot: st.slot,
                    generation: st.generation,
                    ..self.return_stats
                };
            }
            Request::KeyAdd(a) => {
                a.slot = u32::try_from(self.keys.len()).unwrap();
                a.generation = 5;
                a.entry = KEY_ENTRY;
                a.entry_cookie = (5 << 32) | u64::from(a.slot);
                self.keys.push((**a, false));
            }
            Request::KeyRemove(r) => {
                let slot = self
                    .keys
                    .get_mut(r.slot as usize)
                    .filter(|s| !s.1 && r.generation == 5)
                    .ok_or(Errno::ENOENT)?;
                slot.1 = true;
            }
            Request::KeyStats { arg, out } => {
                let (add, _) = self
                    .keys
                    .get(arg.slot as usize)
                    .filter(|s| !s.1 && arg.generation == 5)
                    .ok_or(Errno::ENOENT)?;
                assert_eq!(arg.capacity as usize, out.len());
                self.key_capacities.push(arg.capacity);
                let n = self.key_table.len().min(out.len());
                out[..n].copy_from_slice(&self.key_table[..n]);
                arg.count = u32::try_from(self.key_table.len()).unwrap();
                arg.by = add.by;
                arg.overflow = self.key_overflow;
                arg.hits = self.key_table.iter().map(|e| e.count).sum::<u64>() + self.key_overflow;
            }
            // The module watch has its own file (kernel/modwatch.rs); no target sends these.
            Request::Watch(_) | Request::Modevent(_) | Request::Modack(_) => {
                return Err(Errno::ENOTTY)
            }
        }
        Ok(())
    }
}

/// A target talking to a fresh fake module; keep the guard alive for the test's duration.
fn target_with(setup: impl FnOnce(&mut FakeModule)) -> (KernelTarget, Shared, fake::Guard) {
    let module: Shared = Rc::new(RefCell::new(FakeModule {
        abi_version: TRAPVEC_ABI_VERSION,
        next_block: CODE_ARENA,
        ..Default::default()
    }));
    setup(&mut module.borrow_mut());
    let m = module.clone();
    let guard = fake::override_ioctl(move |req| m.borrow_mut().serve(req));
    let dev = std::fs::File::open("/dev/null").unwrap().into();
    let target = KernelTarget::from_parts(dev, KALLSYMS).unwrap();
    (target, module, guard)
}

fn trap_patch(addr: u64, old: [u8; 2]) -> TextPatch {
    TextPatch {
        addr,
        old: old.to_vec(),
        new: TRAP_BYTES.to_vec(),
    }
}

#[test]
fn kallsyms_lines_become_functions_objects_and_module_symbols() {
    let syms = kallsyms::parse(KALLSYMS).unwrap();
    let by = |name: &str| syms.iter().find(|s| s.name == name).unwrap().clone();
    assert_eq!(by("__x64_sys_getppid").kind, SymbolKind::Function);
    assert_eq!(by("do_getppid_helper").kind, SymbolKind::Function);
    assert_eq!(
        by("memcpy").kind,
        SymbolKind::Function,
        "weak text (W) is a function"
    );
    assert_eq!(by("text_mutex").kind, SymbolKind::Object);
    assert_eq!(by("idt_table").kind, SymbolKind::Object);
    assert_eq!(by("__start_rodata").kind, SymbolKind::Object);
    assert_eq!(by("fixed_percpu_data").kind, SymbolKind::Other);
    assert_eq!(by("__x64_sys_getppid").origin, None);
    assert_eq!(by("trapvec_entry").origin.as_deref(), Some("trapvec"));
    assert_eq!(by("trapvec_entry").addr, 0xffff_ffff_c020_1ef0);
    assert!(syms.iter().all(|s| s.size == 0));
}

#[test]
fn kallsyms_function_extent_runs_to_the_next_function() {
    let (target, _m, _g) = target_with(|_| {});
    let f = target
        .symbols()
        .function_containing(0xffff_ffff_810b_0fa0)
        .unwrap();
    assert_eq!(f.name, "__x64_sys_getppid");
    assert_eq!(f.size, 0x40, "bounded by do_getppid_helper at +0x40");
}

#[test]
fn kallsyms_with_every_address_zero_is_an_error_not_an_empty_table() {
    let hidden = "0000000000000000 T _stext\n0000000000000000 t foo\t[bar]\n";
    assert_eq!(
        kallsyms::parse(hidden).unwrap_err(),
        KallsymsError::AddressesHidden
    );
}

#[test]
fn kallsyms_malformed_line_is_named_by_number() {
    let bad = "ffffffff81000000 T _stext\nffffffff81000010 T\n";
    assert_eq!(
        kallsyms::parse(bad).unwrap_err(),
        KallsymsError::Malformed {
            line: 2,
            text: "ffffffff81000010 T".into()
        }
    );
    let bad_module = "ffffffff81000000 t f\ttrapvec\n";
    assert!(matches!(
        kallsyms::parse(bad_module),
        Err(KallsymsError::Malformed { line: 1, .. })
    ));
}

#[test]
fn target_info_describes_kernel_code_generation() {
    let (target, _m, _g) = target_with(|_| {});
    let info = target.info();
    assert_eq!(info.red_zone, 0);
    assert!(!info.save_vector_regs);
    assert!(info.dispatcher_runs_handlers);
    assert!(info.dispatcher_counts_hits);
    assert!(info.has_fentry);
    assert!(
        info.description.contains("vector 0xf5"),
        "{}",
        info.description
    );
}

#[test]
fn the_trap_written_is_the_module_vector() {
    let (target, _m, _g) = target_with(|_| {});
    assert_eq!(target.info().trap_vector, 0xf5);
    let (target, _m, _g) = target_with(|m| m.vector = 0xf3);
    assert_eq!(
        target.info().trap_vector,
        0xf3,
        "a module loaded with vector=0xf3"
    );
    assert!(
        target.info().description.contains("vector 0xf3"),
        "{}",
        target.info().description
    );
    for bad in [0x1f, 0x1f5] {
        let module: Shared = Rc::new(RefCell::new(FakeModule {
            abi_version: TRAPVEC_ABI_VERSION,
            vector: bad,
            ..Default::default()
        }));
        let m = module.clone();
        let _g = fake::override_ioctl(move |req| m.borrow_mut().serve(req));
        let dev = std::fs::File::open("/dev/null").unwrap().into();
        let err = KernelTarget::from_parts(dev, KALLSYMS).err().unwrap();
        assert!(
            err.to_string().contains("not a system vector"),
            "{bad:#x}: {err}"
        );
    }
}

#[test]
fn a_module_speaking_another_abi_version_is_refused_at_open() {
    let module: Shared = Rc::new(RefCell::new(FakeModule {
        abi_version: TRAPVEC_ABI_VERSION + 1,
        ..Default::default()
    }));
    let m = module.clone();
    let _g = fake::override_ioctl(move |req| m.borrow_mut().serve(req));
    let dev = std::fs::File::open("/dev/null").unwrap().into();
    let err = KernelTarget::from_parts(dev, KALLSYMS).err().unwrap();
    assert!(
        err.to_string()
            .contains(&format!("ABI version {}", TRAPVEC_ABI_VERSION + 1)),
        "{err}"
    );
}

#[test]
fn text_batch_is_one_apply_with_zero_padded_bytes() {
    let (mut target, m, _g) = target_with(|_| {});
    let batch = [
        trap_patch(TEXT + 0x95, [0x53, 0xe8]),
        TextPatch {
            addr: TEXT + 0x200,
            old: vec![0x0f, 0x1f, 0x44, 0x00, 0x00],
            new: vec![0xe9, 1, 2, 3, 4],
        },
    ];
    target.patch_text(&batch).unwrap();
    let m = m.borrow();
    assert_eq!(m.calls, ["INFO", "APPLY"]);
    let sent = &m.applied[0];
    assert_eq!(sent.len(), 2);
    assert_eq!((sent[0].addr, sent[0].len), (TEXT + 0x95, 2));
    assert_eq!(sent[0].old_bytes[..3], [0x53, 0xe8, 0]);
    assert_eq!(sent[0].new_bytes[..3], [0xcd, 0xf5, 0]);
    assert_eq!((sent[1].addr, sent[1].len), (TEXT + 0x200, 5));
    assert_eq!(sent[1].new_bytes[..6], [0xe9, 1, 2, 3, 4, 0]);
}

#[test]
fn empty_batch_sends_nothing() {
    let (mut target, m, _g) = target_with(|_| {});
    target.patch_text(&[]).unwrap();
    assert_eq!(m.borrow().calls, ["INFO"]);
}

#[test]
fn apply_mismatch_names_the_failing_patch_and_the_bytes_found() {
    let mut found = [0u8; 16];
    found[..2].copy_from_slice(&[0xcc, 0xe8]);
    let (mut target, _m, _g) = target_with(|m| {
        m.apply_failure = Some((
            Errno::ESTALE,
            TrapvecApply {
                failed_index: 1,
                reason: TRAPVEC_REASON_MISMATCH,
                found,
                ..Default::default()
            },
        ));
    });
    let batch = [
        trap_patch(TEXT + 0x10, [0x55, 0x48]),
        trap_patch(TEXT + 0x95, [0x53, 0xe8]),
    ];
    let err = target.patch_text(&batch).unwrap_err();
    match err {
        TargetError::TextMismatch {
            addr,
            expected,
            found,
        } => {
            assert_eq!(addr, TEXT + 0x95);
            assert_eq!(expected, "53 e8");
            assert_eq!(found, "cc e8");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn apply_refusal_becomes_site_refused_with_the_kernel_reason() {
    let (mut target, _m, _g) = target_with(|m| {
        m.apply_failure = Some((
            Errno::EINVAL,
            TrapvecApply {
                failed_index: 0,
                reason: TRAPVEC_REASON_FTRACE,
                ..Default::default()
            },
        ));
    });
    let err = target
        .patch_text(&[trap_patch(TEXT, [0x0f, 0x1f])])
        .unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::SiteRefused {
                addr: TEXT,
                reason: SiteRefusal::Ftrace
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("0xffffffff81000000"), "{err}");
    assert!(err.to_string().contains("__fentry__"), "{err}");
}

#[test]
fn a_kprobe_in_the_window_is_named_as_symbol_plus_offset() {
    let getppid = 0xffff_ffff_810b_0f90;
    let (mut target, _m, _g) = target_with(|m| {
        m.apply_failure = Some((
            Errno::EINVAL,
            TrapvecApply {
                failed_index: 0,
                reason: TRAPVEC_REASON_KPROBE,
                culprit: getppid + 5,
                ..Default::default()
            },
        ));
        m.checks.insert(getppid + 4, (TRAPVEC_REASON_KPROBE, 0));
    });
    let err = target
        .patch_text(&[trap_patch(getppid + 5, [0x53, 0xe8])])
        .unwrap_err();
    assert!(
        matches!(&err, TargetError::SiteRefused { reason: SiteRefusal::Kprobe { at, .. }, .. } if *at == getppid + 5),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("a kprobe is registered at __x64_sys_getppid+5: remove it first"),
        "{err}"
    );
    let refusal = target.precheck_site(getppid + 4, 2).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "a kprobe is registered at __x64_sys_getppid+6: remove it first"
    );
}

/// Put `bytes` into the fake module's memory at `addr`.
fn poke(m: &mut FakeModule, addr: u64, bytes: &[u8]) {
    for (i, b) in bytes.iter().enumerate() {
        m.memory.insert(addr + i as u64, *b);
    }
}

/// `field + rel` as the kernel's relative table fields hold it.
fn rel32(field: u64, to: u64) -> [u8; 4] {
    i32::try_from(i64::from_le_bytes(to.wrapping_sub(field).to_le_bytes()))
        .unwrap()
        .to_le_bytes()
}

#[test]
fn a_jump_label_target_in_the_window_names_its_static_key_and_place() {
    let getppid = 0xffff_ffff_810b_0f90;
    let entry: u64 = 0xffff_ffff_8290_0000; // in __jump_table
    let key: u64 = 0xffff_ffff_82a5_9548; // text_mutex+0x8, standing in for a static key
    let (target, _m, _g) = target_with(|m| {
        m.checks
            .insert(getppid + 9, (TRAPVEC_REASON_JUMP_TARGET, 0));
        m.culprits.insert(getppid + 9, entry);
        let mut e = Vec::new();
        e.extend(rel32(entry, getppid + 4)); // code
        e.extend(rel32(entry + 4, getppid + 0x1c)); // target
                                                    // The key with the branch-type flag (bit 0) set, as the kernel keeps it.
        e.extend(key.wrapping_sub(entry + 8).wrapping_add(1).to_le_bytes());
        poke(m, entry, &e);
    });
    let refusal = target.precheck_site(getppid + 9, 5).unwrap_err();
    assert_eq!(refusal.code(), Some(TRAPVEC_REASON_JUMP_TARGET));
    assert_eq!(refusal.to_string(), "jump-label target of static key text_mutex+0x8 at __x64_sys_getppid+0x1c inside the window");
}

#[test]
fn an_exception_fixup_in_the_window_names_its_faulting_instruction() {
    let getppid = 0xffff_ffff_810b_0f90;
    let entry: u64 = 0xffff_ffff_8280_0010; // in __ex_table
    let (target, _m, _g) = target_with(|m| {
        m.checks
            .insert(getppid + 0x20, (TRAPVEC_REASON_EXTABLE_FIXUP, 0));
        m.culprits.insert(getppid + 0x20, entry);
        let mut e = Vec::new();
        e.extend(rel32(entry, getppid + 0x11)); // insn
        e.extend(rel32(entry + 4, getppid + 0x21)); // fixup
        e.extend(0x3u32.to_le_bytes()); // data
        poke(m, entry, &e);
        // An entry that cannot be read: the refusal still says what it is.
        m.checks
            .insert(getppid + 0x30, (TRAPVEC_REASON_EXTABLE_FIXUP, 0));
        m.culprits.insert(getppid + 0x30, 0xffff_ffff_8280_1000);
    });
    let refusal = target.precheck_site(getppid + 0x20, 2).unwrap_err();
    assert_eq!(
        refusal.to_string(),
        "exception fixup of __x64_sys_getppid+0x11 at __x64_sys_getppid+0x21 inside the window"
    );
    let unread = target.precheck_site(getppid + 0x30, 2).unwrap_err();
    assert!(
        unread
            .to_string()
            .starts_with("exception fixup of an address the module did not say"),
        "{unread}"
    );
}

#[test]
fn code_for_planning_is_read_without_probes_and_other_reads_as_they_are() {
    let (target, m, _g) = target_with(|m| m.pattern = TEXT..TEXT + 0x100);
    target.read(TEXT, 16).unwrap();
    target.read_code(TEXT, 16).unwrap();
    assert_eq!(m.borrow().read_flags, [0, TRAPVEC_READ_ORIGINAL]);
}

#[test]
fn lockdown_and_modules_disabled_refusals_say_what_forbids_the_write() {
    let (mut target, _m, _g) = target_with(|m| {
        m.apply_failure = Some((
            Errno::EPERM,
            TrapvecApply {
                failed_index: 0,
                reason: TRAPVEC_REASON_LOCKDOWN,
                error: -1,
                ..Default::default()
            },
        ));
    });
    let err = target.patch_text(&[trap_patch(TEXT, [1, 2])]).unwrap_err();
    assert!(err.to_string().contains("kernel lockdown ("), "{err}");
    assert!(
        err.to_string().contains(") forbids writing kernel text"),
        "{err}"
    );
    assert_eq!(
        SiteRefusal::from_abi(TRAPVEC_REASON_MODULES_DISABLED, -1)
            .unwrap()
            .to_string(),
        "kernel.modules_disabled=1 forbids writing kernel text"
    );
}

#[test]
fn eperm_from_alloc_is_a_forbidden_write_not_a_full_arena() {
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("ALLOC", (Errno::EPERM, 0));
    });
    let err = target.alloc(TEXT, 64, BlockKind::Code).unwrap_err();
    assert!(
        err.to_string()
            .contains("forbids writing kernel text (ALLOC of /dev/trapvec: EPERM)"),
        "{err}"
    );
}

#[test]
fn list_reads_a_table_larger_than_one_batch_page_by_page() {
    let n = TRAPVEC_BATCH_MAX as u64 + 4464;
    let (target, m, _g) = target_with(|m| {
        for k in 0..n {
            m.dispatch.insert(
                TEXT + k,
                TrapvecListEntry {
                    site: TEXT + k,
                    hits: k,
                    ..Default::default()
                },
            );
        }
    });
    let listed = target.list().unwrap();
    assert_eq!(listed.len() as u64, n);
    assert!(listed
        .iter()
        .enumerate()
        .all(|(k, e)| e.entry.site == TEXT + k as u64 && e.hits.hits == k as u64));
    assert_eq!(
        m.borrow().calls.iter().filter(|c| **c == "LIST").count(),
        3,
        "a count, then two pages"
    );
}

#[test]
fn apply_kprobe_refusal_carries_the_errno() {
    let (mut target, _m, _g) = target_with(|m| {
        m.apply_failure = Some((
            Errno::EINVAL,
            TrapvecApply {
                failed_index: 0,
                reason: TRAPVEC_REASON_KPROBE_REFUSED,
                error: -22,
                ..Default::default()
            },
        ));
    });
    let err = target.patch_text(&[trap_patch(TEXT, [1, 2])]).unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::SiteRefused {
                reason: SiteRefusal::KprobeRefused {
                    errno: Errno::EINVAL
                },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn apply_failure_without_an_index_is_an_os_error() {
    let (mut target, _m, _g) = target_with(|m| {
        m.apply_failure = Some((
            Errno::ENOMEM,
            TrapvecApply {
                failed_index: TRAPVEC_NO_INDEX,
                ..Default::default()
            },
        ));
    });
    let err = target.patch_text(&[trap_patch(TEXT, [1, 2])]).unwrap_err();
    assert!(matches!(err, TargetError::Os { .. }), "{err}");
}

#[test]
fn malformed_patches_are_refused_before_any_ioctl() {
    let (mut target, m, _g) = target_with(|_| {});
    let long = TextPatch {
        addr: TEXT,
        old: vec![0x90; 17],
        new: vec![0xcc; 17],
    };
    let err = target.patch_text(&[long]).unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::SiteRefused {
                addr: TEXT,
                reason: SiteRefusal::BadLength
            }
        ),
        "{err}"
    );
    let uneven = TextPatch {
        addr: TEXT + 4,
        old: vec![0x90; 2],
        new: vec![0xcc; 3],
    };
    let err = target.patch_text(&[uneven]).unwrap_err();
    assert!(
        matches!(err, TargetError::Text { addr, .. } if addr == TEXT + 4),
        "{err}"
    );
    assert_eq!(m.borrow().calls, ["INFO"]);
}

#[test]
fn a_read_larger_than_the_module_takes_is_split_into_chunks() {
    let len = 2 * TRAPVEC_XFER_MAX as usize + 100;
    let (target, m, _g) = target_with(|m| {
        m.pattern = TEXT..TEXT + len as u64;
    });
    let bytes = target.read(TEXT, len).unwrap();
    assert_eq!(bytes.len(), len);
    assert!(bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| usize::from(b) == i % 251));
    assert_eq!(m.borrow().calls.iter().filter(|c| **c == "READ").count(), 3);
}

#[test]
fn a_read_that_faults_names_the_address() {
    let (target, _m, _g) = target_with(|m| {
        m.memory.insert(TEXT, 0x90);
    });
    let err = target.read(TEXT, 2).unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::Read {
                addr: TEXT,
                len: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn alloc_sends_the_kind_and_returns_the_block() {
    let (mut target, m, _g) = target_with(|_| {});
    let code = target.alloc(TEXT, 40, BlockKind::Code).unwrap();
    let data = target.alloc(TEXT, 8, BlockKind::Data).unwrap();
    assert_eq!(
        (code.id, code.addr, code.size, code.kind),
        (1, CODE_ARENA, 40, BlockKind::Code)
    );
    assert_eq!(
        (data.id, data.addr, data.kind),
        (2, CODE_ARENA + 48, BlockKind::Data)
    );
    assert_eq!(m.borrow().calls, ["INFO", "ALLOC", "ALLOC"]);
}

#[test]
fn a_block_out_of_rel32_reach_is_freed_and_reported() {
    let (mut target, m, _g) = target_with(|_| {});
    let near = CODE_ARENA - (3 << 30);
    let err = target.alloc(near, 64, BlockKind::Code).unwrap_err();
    assert!(
        matches!(err, TargetError::Alloc { near: n, size: 64, .. } if n == near),
        "{err}"
    );
    assert!(err.to_string().contains("out of rel32 reach"), "{err}");
    assert_eq!(m.borrow().freed, [1]);
}

#[test]
fn a_full_arena_is_reported_as_such() {
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("ALLOC", (Errno::ENOSPC, 0));
    });
    let err = target.alloc(TEXT, 1 << 19, BlockKind::Data).unwrap_err();
    assert!(
        err.to_string().contains("Data arena of trapvec.ko is full"),
        "{err}"
    );
}

#[test]
fn writes_are_chunked_and_carry_the_block_id_and_offsets() {
    let (mut target, m, _g) = target_with(|_| {});
    let block = target.alloc(TEXT, 3 << 20, BlockKind::Code).unwrap();
    let bytes: Vec<u8> = (0..(TRAPVEC_XFER_MAX as usize + 10))
        .map(|i| u8::try_from(i % 7).unwrap())
        .collect();
    target.write(&block, 16, &bytes).unwrap();
    let m = m.borrow();
    assert_eq!(m.writes.len(), 2);
    assert_eq!(
        (m.writes[0].0, m.writes[0].1, m.writes[0].2.len()),
        (block.id, 16, TRAPVEC_XFER_MAX as usize)
    );
    assert_eq!(
        (m.writes[1].1, m.writes[1].2.len()),
        (16 + u64::from(TRAPVEC_XFER_MAX), 10)
    );
    assert_eq!(
        [m.writes[0].2.clone(), m.writes[1].2.clone()].concat(),
        bytes
    );
}

#[test]
fn a_write_to_a_sealed_block_says_so() {
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("WRITE", (Errno::EPERM, 0));
    });
    let block = target.alloc(TEXT, 32, BlockKind::Code).unwrap();
    let err = target.write(&block, 4, &[0xc3]).unwrap_err();
    match &err {
        TargetError::Block {
            addr,
            offset: 4,
            len: 1,
            reason,
        } => {
            assert_eq!(*addr, block.addr);
            assert!(reason.contains("sealed"), "{reason}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn seal_and_free_name_the_block_id() {
    let (mut target, m, _g) = target_with(|_| {});
    let block = target.alloc(TEXT, 32, BlockKind::Code).unwrap();
    target.seal(&block).unwrap();
    target.free(&block).unwrap();
    assert_eq!(m.borrow().sealed, [block.id]);
    assert_eq!(m.borrow().freed, [block.id]);
}

#[test]
fn a_dispatch_error_names_the_failing_site() {
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("DISPATCH_ADD", (Errno::EEXIST, 1));
    });
    let entries = [
        DispatchEntry {
            site: TEXT + 5,
            dest: CODE_ARENA,
            handler: 0,
            cookie: 0,
            only: None,
        },
        DispatchEntry {
            site: TEXT + 9,
            dest: CODE_ARENA,
            handler: 0,
            cookie: 0,
            only: None,
        },
    ];
    let err = target.add_dispatch(&entries).unwrap_err();
    assert!(
        matches!(&err, TargetError::Dispatch { site, reason } if *site == TEXT + 9 && reason.contains("already")),
        "{err}"
    );
}

#[test]
fn removing_an_unknown_site_names_it() {
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("DISPATCH_REMOVE", (Errno::ENOENT, 0));
    });
    let err = target.remove_dispatch(&[TEXT + 0x40]).unwrap_err();
    assert!(
        matches!(&err, TargetError::Dispatch { site, reason } if *site == TEXT + 0x40 && reason.contains("no dispatch entry")),
        "{err}"
    );
}

/// DISPATCH_REPLACE carries the start counts in and the old entries' final counts out, site by
/// site; a site without an entry is named.
#[test]
fn replacing_dispatch_entries_returns_the_old_counts_and_names_a_site_without_one() {
    let (mut target, m, _g) = target_with(|_| {});
    assert!(target.replaces_dispatch());
    let old = DispatchEntry {
        site: TEXT + 5,
        dest: CODE_ARENA,
        handler: 0,
        cookie: 0,
        only: None,
    };
    target.add_dispatch(&[old]).unwrap();
    m.borrow_mut().dispatch.get_mut(&(TEXT + 5)).unwrap().hits = 41;
    let new = DispatchEntry {
        dest: CODE_ARENA + 64,
        ..old
    };
    let counts = target
        .replace_dispatch(&[new], &[TrapHits { hits: 7, missed: 1 }])
        .unwrap();
    assert_eq!(
        counts,
        [TrapHits {
            hits: 41,
            missed: 0
        }]
    );
    assert_eq!(
        target.trap_hits(TEXT + 5),
        Some(TrapHits { hits: 7, missed: 1 }),
        "the new entry starts from the counts given"
    );
    assert_eq!(m.borrow().dispatch[&(TEXT + 5)].dest, CODE_ARENA + 64);
    let err = target
        .replace_dispatch(
            &[
                new,
                DispatchEntry {
                    site: TEXT + 9,
                    ..new
                },
            ],
            &[TrapHits::default(); 2],
        )
        .unwrap_err();
    assert!(
        matches!(&err, TargetError::Dispatch { site, reason } if *site == TEXT + 9 && reason.contains("DISPATCH_REPLACE: no dispatch entry")),
        "{err}"
    );
}

#[test]
fn trap_hits_reads_counters_and_none_for_a_site_without_entry() {
    let (mut target, m, _g) = target_with(|_| {});
    let entry = DispatchEntry {
        site: TEXT + 5,
        dest: CODE_ARENA,
        handler: CODE_ARENA + 32,
        cookie: 7,
        only: None,
    };
    target.add_dispatch(&[entry]).unwrap();
    m.borrow_mut().dispatch.get_mut(&(TEXT + 5)).unwrap().hits = 1200;
    m.borrow_mut().dispatch.get_mut(&(TEXT + 5)).unwrap().missed = 100;
    assert_eq!(
        target.trap_hits(TEXT + 5),
        Some(TrapHits {
            hits: 1200,
            missed: 100
        })
    );
    assert_eq!(target.trap_hits(TEXT + 6), None);
}

#[test]
fn the_hits_of_many_sites_are_one_list_and_of_few_one_hits_each() {
    let (mut target, m, _g) = target_with(|_| {});
    // 100 entries; site i has hits 10 * i and missed i.
    let entries: Vec<DispatchEntry> = (0..100u64)
        .map(|i| DispatchEntry {
            site: TEXT + 2 * i,
            dest: CODE_ARENA,
            handler: 0,
            cookie: i,
            only: None,
        })
        .collect();
    target.add_dispatch(&entries).unwrap();
    for i in 0..100u64 {
        let mut module = m.borrow_mut();
        let e = module.dispatch.get_mut(&(TEXT + 2 * i)).unwrap();
        (e.hits, e.missed) = (10 * i, i);
    }
    let count = |name: &str| m.borrow().calls.iter().filter(|c| **c == name).count();
    // Every site, and two that have no entry (odd addresses), in an order of their own.
    let mut asked: Vec<u64> = (0..100u64).rev().map(|i| TEXT + 2 * i).collect();
    asked.insert(50, TEXT + 1);
    asked.push(TEXT + 999);
    let got = target.trap_hits_many(&asked);
    assert_eq!(got.len(), asked.len());
    for (site, h) in asked.iter().zip(&got) {
        let off = site - TEXT;
        let want = (off.is_multiple_of(2) && off < 200).then(|| TrapHits {
            hits: 5 * off,
            missed: off / 2,
        });
        assert_eq!(*h, want, "site {site:#x}");
    }
    assert_eq!(
        (count("LIST"), count("HITS")),
        (3, 0),
        "a LIST counting the table (not much larger than the request), then the listing (its count and its copy)"
    );
    // A few: HITS each, the same counters.
    let few = [TEXT + 20, TEXT + 21, TEXT + 198];
    assert_eq!(
        target.trap_hits_many(&few),
        vec![
            Some(TrapHits {
                hits: 100,
                missed: 10
            }),
            None,
            Some(TrapHits {
                hits: 990,
                missed: 99
            })
        ]
    );
    assert_eq!((count("LIST"), count("HITS")), (3, 3));
    assert_eq!(target.trap_hits_many(&[]), Vec::new());
    assert_eq!(
        (count("LIST"), count("HITS")),
        (3, 3),
        "nothing asked, nothing read"
    );
    // A LIST the module refuses: no counters (logged), as a HITS refused.
    m.borrow_mut().fail.insert("LIST", (Errno::ENOMEM, 0));
    assert_eq!(target.trap_hits_many(&asked), vec![None; asked.len()]);
}

#[test]
fn list_asks_again_when_entries_were_added_meanwhile() {
    let (mut target, m, _g) = target_with(|m| m.list_grows_by = 3);
    let entry = DispatchEntry {
        site: TEXT + 5,
        dest: CODE_ARENA,
        handler: 0,
        cookie: 9,
        only: None,
    };
    target.add_dispatch(&[entry]).unwrap();
    let listed = target.list().unwrap();
    assert_eq!(listed.len(), 4);
    assert_eq!(
        listed[0],
        ListedEntry {
            entry,
            hits: TrapHits::default()
        }
    );
    assert_eq!(listed[3].hits.hits, 2);
    assert_eq!(m.borrow().calls.iter().filter(|c| **c == "LIST").count(), 2);
}

#[test]
fn list_hit_copies_the_hit_entries_only_and_an_older_module_gets_the_whole_list_filtered() {
    let (mut target, m, _g) = target_with(|_| {});
    let entries: Vec<DispatchEntry> = (0..5u64)
        .map(|k| DispatchEntry {
            site: TEXT + 0x10 * (k + 1),
            dest: CODE_ARENA,
            handler: 0,
            cookie: k,
            only: None,
        })
        .collect();
    target.add_dispatch(&entries).unwrap();
    for (site, hits) in [(TEXT + 0x20, 7), (TEXT + 0x40, 1)] {
        m.borrow_mut().dispatch.get_mut(&site).unwrap().hits = hits;
    }
    let want = vec![
        (TEXT + 0x20, TrapHits { hits: 7, missed: 0 }),
        (TEXT + 0x40, TrapHits { hits: 1, missed: 0 }),
    ];
    m.borrow_mut().calls.clear();
    assert_eq!(target.trap_sites_hit(), Some(want.clone()));
    // How many, then those two with room to spare: no LIST of the five.
    assert_eq!(m.borrow().calls, ["LIST_HIT", "LIST_HIT"]);

    // Sites hit between the two calls: asked again with more room, one snapshot each time.
    m.borrow_mut().list_grows_by = 40;
    m.borrow_mut().calls.clear();
    let hit = target.list_hit().unwrap();
    assert_eq!(
        hit.len(),
        2 + 39,
        "the grown entries of hits 1..40 and the two"
    );
    assert!(hit.windows(2).all(|w| w[0].entry.site < w[1].entry.site));
    assert!(hit.iter().all(|e| e.hits.hits > 0));
    assert!(m.borrow().calls.iter().all(|c| *c == "LIST_HIT"));
    m.borrow_mut().list_grows_by = 0;

    // A module older than LIST_HIT: the whole LIST, filtered, the same answer.
    m.borrow_mut().fail.insert("LIST_HIT", (Errno::ENOTTY, 0));
    m.borrow_mut().calls.clear();
    let old = target.list_hit().unwrap();
    assert_eq!(old, hit);
    assert!(m.borrow().calls.contains(&"LIST"));
    // Any other refusal is an error that names it.
    m.borrow_mut().fail.insert("LIST_HIT", (Errno::ENOMEM, 0));
    let err = target.list_hit().unwrap_err().to_string();
    assert!(err.contains("LIST_HIT"), "{err}");
    assert_eq!(
        target.trap_sites_hit(),
        None,
        "logged, and the caller reads its sites"
    );
}

#[test]
fn check_site_maps_every_reason_code_and_back() {
    for code in 1..=TRAPVEC_REASON_MAX {
        let refusal = SiteRefusal::from_abi(code, -22).unwrap();
        assert!(
            !matches!(refusal, SiteRefusal::Unknown { .. }),
            "code {code} is known"
        );
        assert_eq!(refusal.code(), Some(code));
    }
    assert_eq!(SiteRefusal::from_abi(TRAPVEC_REASON_NONE, 0), None);
    assert_eq!(
        SiteRefusal::from_abi(99, 0),
        Some(SiteRefusal::Unknown { code: 99 })
    );

    let (target, _m, _g) = target_with(|m| {
        m.checks.insert(TEXT, (TRAPVEC_REASON_ENTRY_TEXT, 0));
        m.checks
            .insert(TEXT + 8, (TRAPVEC_REASON_KPROBE_REFUSED, -16));
    });
    assert_eq!(
        target.check_site_with_kprobe(TEXT, 2),
        Err(SiteRefusal::EntryText)
    );
    assert_eq!(
        target.check_site_with_kprobe(TEXT + 8, 2),
        Err(SiteRefusal::KprobeRefused {
            errno: Errno::EBUSY
        })
    );
    assert_eq!(target.check_site_with_kprobe(TEXT + 16, 2), Ok(()));
}

#[test]
fn precheck_skips_only_the_kprobe_cross_check() {
    let (target, m, _g) = target_with(|m| {
        m.checks.insert(TEXT, (TRAPVEC_REASON_JUMP_LABEL, 0));
    });
    assert_eq!(target.precheck_site(TEXT, 2), Err(SiteRefusal::JumpLabel));
    assert_eq!(
        target.check_site_with_kprobe(TEXT, 2),
        Err(SiteRefusal::JumpLabel)
    );
    assert_eq!(m.borrow().check_flags, [TRAPVEC_CHECK_NO_KPROBE, 0]);
}

#[test]
fn check_site_that_cannot_ask_the_module_says_so() {
    let (target, _m, _g) = target_with(|m| {
        m.fail.insert("CHECK", (Errno::EPERM, 0));
    });
    assert_eq!(
        target.check_site_with_kprobe(TEXT, 2),
        Err(SiteRefusal::CheckFailed {
            errno: Errno::EPERM
        })
    );
}

#[test]
fn quiesce_is_one_ioctl_for_all_ranges() {
    let (mut target, m, _g) = target_with(|_| {});
    target
        .quiesce(&[(CODE_ARENA, CODE_ARENA + 64), (TEXT, TEXT + 2)])
        .unwrap();
    assert_eq!(m.borrow().quiesced, 1);
}

#[test]
fn quiesce_refused_while_a_task_sleeps_in_a_freed_replacement_names_the_trampoline() {
    let (mut target, m, _g) = target_with(|_| {});
    m.borrow_mut().quiesce_busy = Some((CODE_ARENA + 0x40, 1));
    let e = target.quiesce(&[]).unwrap_err().to_string();
    assert!(
        e.contains("1 task(s) still inside the replacement called by the trampoline at 0x"),
        "{e}"
    );
    assert!(
        e.contains(&format!("{:#x}", CODE_ARENA + 0x40)) && e.contains("try again"),
        "{e}"
    );
}

#[test]
fn replace_counter_of_a_code_block_is_its_granules_word_and_the_exit_is_replace_ret() {
    let (target, _m, _g) = target_with(|_| {});
    let block = |addr| RepoBlock {
        id: 1,
        addr,
        size: 512,
        kind: BlockKind::Code,
    };
    let c = target.info().replace_counter(&block(CODE_ARENA)).unwrap();
    assert_eq!((c.counter, c.exit), (INFLIGHT, REPLACE_RET));
    // The block at code_base + 16 * 0x31 counts at inflight_base + 8 * 0x31.
    assert_eq!(
        target
            .info()
            .replace_counter(&block(CODE_ARENA + 0x310))
            .unwrap()
            .counter,
        INFLIGHT + 0x188
    );
    assert_eq!(
        target
            .info()
            .replace_counter(&block(CODE_ARENA + (1 << 20))),
        None,
        "outside the code arena"
    );
    assert_eq!(target.info().replace_counter(&block(CODE_ARENA - 16)), None);
}

#[test]
fn module_info_converts_bases_and_sizes_to_ranges() {
    let (target, _m, _g) = target_with(|_| {});
    let info = target.module_info().unwrap();
    assert_eq!(info.vector, 0xf5);
    assert_eq!(info.code_arena, CODE_ARENA..CODE_ARENA + (1 << 20));
}

#[test]
fn state_blob_round_trips_and_reports_its_generation() {
    let (target, m, _g) = target_with(|_| {});
    assert_eq!(
        target.state().unwrap(),
        super::StateBlob {
            generation: 0,
            bytes: Vec::new()
        }
    );
    assert_eq!(target.put_state(0, b"{\"splices\":[]}").unwrap(), 1);
    let blob = target.state().unwrap();
    assert_eq!(
        (blob.generation, blob.bytes.as_slice()),
        (1, &b"{\"splices\":[]}"[..])
    );
    assert_eq!(
        target.put_state(1, b"").unwrap(),
        2,
        "an empty blob is a write too"
    );
    assert!(target.state().unwrap().bytes.is_empty());
    assert_eq!(m.borrow().generation, 2);
}

#[test]
fn state_put_with_an_old_generation_is_stale_and_changes_nothing() {
    let (target, m, _g) = target_with(|m| {
        m.state = b"theirs".to_vec();
        m.generation = 7;
    });
    let err = target.put_state(6, b"mine").unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::StateStale {
                expected: 6,
                current: 7
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("another trapctl"), "{err}");
    assert_eq!(m.borrow().state, b"theirs");
}

#[test]
fn state_get_asks_again_when_the_blob_grew_between_two_calls() {
    let (target, m, _g) = target_with(|m| {
        m.state = b"blob".to_vec();
        m.state_grows_after = Some(2);
    });
    let blob = target.state().unwrap();
    assert_eq!(
        (blob.generation, blob.bytes.as_slice()),
        (1, &b"blob and more"[..])
    );
    assert_eq!(
        m.borrow().state_gets,
        3,
        "capacity 0, then 4 (grew meanwhile), then 13"
    );
}

#[test]
fn state_larger_than_the_module_keeps_is_refused_before_any_ioctl() {
    let (target, m, _g) = target_with(|_| {});
    let big = vec![0u8; TRAPVEC_STATE_MAX as usize + 1];
    let err = target.put_state(0, &big).unwrap_err();
    assert!(err.to_string().contains("at most"), "{err}");
    assert!(!m.borrow().calls.contains(&"STATE_PUT"));
}

#[test]
fn target_check_site_is_the_precheck_with_the_refusal_and_address() {
    let (target, m, _g) = target_with(|m| {
        m.checks.insert(TEXT, (TRAPVEC_REASON_EXTABLE, 0));
    });
    let err = TargetExt::check_site(&target, TEXT, 3).unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::SiteRefused {
                addr: TEXT,
                reason: SiteRefusal::Extable
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("exception-table"), "{err}");
    TargetExt::check_site(&target, TEXT + 4, 2).unwrap();
    // CHECK_MANY of one window each, whose entries the fake asserts are TRAPVEC_CHECK_NO_KPROBE:
    // never the slow kprobe cross-check.
    assert!(m.borrow().check_flags.is_empty());
    assert_eq!(m.borrow().check_many.len(), 2);
}

#[test]
fn dispatch_entries_are_the_modules_list() {
    let (mut target, _m, _g) = target_with(|_| {});
    let e = DispatchEntry {
        site: TEXT + 5,
        dest: CODE_ARENA,
        handler: 0,
        cookie: 3,
        only: None,
    };
    target.add_dispatch(&[e]).unwrap();
    assert_eq!(target.dispatch_entries().unwrap().unwrap(), vec![e]);
}

const RP_ENTRY: u64 = 0xffff_ffff_c020_4000;

#[test]
fn a_return_slot_is_the_modules_entry_routine_with_its_cookie_and_its_stats_come_back_summed() {
    use crate::returns::{Clock, ReturnConfig};
    let (mut target, module, _g) = target_with(|m| {
        m.return_stats = TrapvecReturnStats {
            returns: 12,
            missed: 3,
            active: 1,
            clock: TRAPVEC_CLOCK_WALL,
            sum: 12_000,
            max: 1500,
            ..Default::default()
        };
        m.return_stats.buckets[11] = 12;
    });
    let cfg = ReturnConfig {
        handler: CODE_ARENA + 0x40,
        cookie: 99,
        maxactive: 16,
        clock: Some(Clock::Wall),
    };
    let slot = target.alloc_slot(&SlotSpec::Return(cfg)).unwrap();
    assert_eq!(
        (slot.index(), slot.entry(), slot.cookie()),
        (0, RP_ENTRY, 7 << 32)
    );
    let (sent, _) = module.borrow().returns[0];
    assert_eq!(
        (sent.handler, sent.cookie, sent.maxactive, sent.clock),
        (CODE_ARENA + 0x40, 99, 16, TRAPVEC_CLOCK_WALL)
    );
    let st = target
        .read_slot(&slot)
        .and_then(SlotReading::into_return_stats)
        .unwrap();
    assert_eq!((st.returns, st.missed, st.active), (12, 3, 1));
    let h = st.histogram.unwrap();
    assert_eq!(
        (h.count(), h.sum, h.max, h.buckets.len()),
        (12, 12_000, 1500, 65)
    );
    target.free_slot(&slot).unwrap();
    assert!(module.borrow().returns[0].1);
    assert_eq!(
        target
            .read_slot(&slot)
            .and_then(SlotReading::into_return_stats),
        None,
        "a removed slot has no figures"
    );
    // Giving it back twice is not an error (a retry after a reply that was lost).
    target.free_slot(&slot).unwrap();
}

#[test]
fn return_slot_refusals_name_the_cause() {
    use crate::returns::ReturnConfig;
    let cfg = ReturnConfig {
        handler: 0x1234,
        cookie: 0,
        maxactive: 5000,
        clock: None,
    };
    for (errno, words) in [
        (Errno::EINVAL, "maxactive 5000 is outside 1..=4096"),
        (Errno::ENOSPC, "all 256 return-point slots"),
        (Errno::EFAULT, "0x1234 is not in a sealed code block"),
    ] {
        let (mut target, _m, _g) = target_with(|m| {
            m.fail.insert("RETURN_ADD", (errno, 0));
        });
        let e = crate::error_chain(&target.alloc_slot(&SlotSpec::Return(cfg)).unwrap_err());
        assert!(e.contains(words), "{errno}: {e}");
    }
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("RETURN_REMOVE", (Errno::EBUSY, 0));
    });
    let slot = Slot::Return(crate::returns::ReturnSlot {
        index: 3,
        entry: RP_ENTRY,
        cookie: 7 << 32 | 3,
    });
    let e = crate::error_chain(&target.free_slot(&slot).unwrap_err());
    assert!(
        e.contains("still in the return handler of return-point slot 3"),
        "{e}"
    );
}

const KEY_ENTRY: u64 = 0xffff_ffff_c020_4800;

/// A KEY_STATS entry of a number key (pid, tgid, cpu).
fn number_key(n: u64, count: u64) -> TrapvecKeyEntry {
    let mut key = [0u8; TRAPVEC_KEY_BYTES];
    key[..8].copy_from_slice(&n.to_ne_bytes());
    TrapvecKeyEntry { key, count }
}

/// A KEY_STATS entry of a comm key (NUL-padded, as the kernel pads it).
fn comm_key(name: &str, count: u64) -> TrapvecKeyEntry {
    let mut key = [0u8; TRAPVEC_KEY_BYTES];
    key[..name.len()].copy_from_slice(name.as_bytes());
    TrapvecKeyEntry { key, count }
}

#[test]
fn a_key_slot_is_the_modules_counting_routine_tid_counts_by_task_pid_and_pid_by_tgid() {
    use crate::keyed::KeyBy;
    let (mut target, module, _g) = target_with(|_| {});
    let mut sent = Vec::new();
    // `tgid`, the old spelling, is `pid`.
    let tgid: KeyBy = "tgid".parse().unwrap();
    for (i, by) in (0u32..).zip([KeyBy::Pid, KeyBy::Tid, tgid, KeyBy::Comm, KeyBy::Cpu]) {
        let slot = target.alloc_slot(&SlotSpec::Keyed(by)).unwrap();
        assert_eq!(
            (slot.index(), slot.entry(), slot.cookie()),
            (i, KEY_ENTRY, 5 << 32 | u64::from(i))
        );
        sent.push(module.borrow().keys[i as usize].0.by);
    }
    // The process is current->tgid, the thread current->pid.
    assert_eq!(
        sent,
        [
            TRAPVEC_KEY_TGID,
            TRAPVEC_KEY_PID,
            TRAPVEC_KEY_TGID,
            TRAPVEC_KEY_COMM,
            TRAPVEC_KEY_CPU
        ]
    );
}

#[test]
fn comm_counts_come_back_as_names_most_hits_first_and_add_up_to_the_hits() {
    use crate::keyed::{KeyBy, KeyCount};
    let (mut target, module, _g) = target_with(|m| {
        // As the module answers: ordered by key bytes, one entry per key.
        m.key_table = vec![
            comm_key("bash", 3),
            comm_key("getppid_a", 1000),
            comm_key("getppid_b", 2000),
            comm_key("0123456789abcdef", 7),
        ];
        m.key_overflow = 4;
    });
    let slot = target.alloc_slot(&SlotSpec::Keyed(KeyBy::Comm)).unwrap();
    let counts = target
        .read_slot(&slot)
        .and_then(SlotReading::into_key_counts)
        .unwrap();
    let rows: Vec<(&str, u64)> = counts
        .keys
        .iter()
        .map(|k: &KeyCount| (k.key.as_str(), k.count))
        .collect();
    // A 16-byte name without a NUL is whole.
    assert_eq!(
        rows,
        [
            ("getppid_b", 2000),
            ("getppid_a", 1000),
            ("0123456789abcdef", 7),
            ("bash", 3)
        ]
    );
    assert_eq!((counts.overflow, counts.total()), (4, 3014));
    assert_eq!(module.borrow().key_capacities, [TRAPVEC_KEY_TABLE]);
    target.free_slot(&slot).unwrap();
    assert!(module.borrow().keys[0].1);
    assert_eq!(
        target
            .read_slot(&slot)
            .and_then(SlotReading::into_key_counts),
        None,
        "a removed slot has no table"
    );
    // Giving it back twice is not an error (a retry after a reply that was lost).
    target.free_slot(&slot).unwrap();
    assert_eq!(
        module
            .borrow()
            .calls
            .iter()
            .filter(|&&c| c == "KEY_REMOVE")
            .count(),
        2
    );
}

#[test]
fn number_keys_are_decimal_and_a_table_larger_than_the_buffer_is_asked_again() {
    use crate::keyed::KeyBy;
    // Two CPUs' worth of distinct pids: more keys than one CPU's table.
    let (mut target, module, _g) = target_with(|m| {
        m.key_table = (0..300u64)
            .map(|pid| number_key(1000 + pid, 1 + pid % 3))
            .collect();
        m.key_overflow = 0;
    });
    let slot = target.alloc_slot(&SlotSpec::Keyed(KeyBy::Pid)).unwrap();
    let counts = target
        .read_slot(&slot)
        .and_then(SlotReading::into_key_counts)
        .unwrap();
    assert_eq!(counts.keys.len(), 300);
    assert_eq!(
        module.borrow().key_capacities,
        [256, 300 + 256],
        "asked again with room for every key"
    );
    assert_eq!(
        (counts.keys[0].key.as_str(), counts.keys[0].count),
        ("1002", 3),
        "most hits first, ties by key"
    );
    assert_eq!(counts.total(), (0..300u64).map(|p| 1 + p % 3).sum::<u64>());
}

#[test]
fn key_slot_refusals_name_the_cause() {
    use crate::keyed::{KeyBy, KeySlot};
    for (errno, words) in [
        (
            Errno::ENOSPC,
            "keyed count by comm: all 64 keyed-count slots of trapvec.ko are in use",
        ),
        (Errno::EINVAL, "does not count by comm (key code 3)"),
        (Errno::ENOTTY, "no KEY_ADD (an older module)"),
    ] {
        let (mut target, _m, _g) = target_with(|m| {
            m.fail.insert("KEY_ADD", (errno, 0));
        });
        let e = crate::error_chain(
            &target
                .alloc_slot(&SlotSpec::Keyed(KeyBy::Comm))
                .unwrap_err(),
        );
        assert!(e.contains(words), "{errno}: {e}");
    }
    let (mut target, _m, _g) = target_with(|m| {
        m.fail.insert("KEY_REMOVE", (Errno::EIO, 0));
    });
    let slot = Slot::Keyed(KeySlot {
        index: 9,
        entry: KEY_ENTRY,
        cookie: 5 << 32 | 9,
    });
    let e = crate::error_chain(&target.free_slot(&slot).unwrap_err());
    assert!(e.contains("keyed count slot 9: KEY_REMOVE"), "{e}");
}

/// Every reason at its own address (32 bytes apart from `TEXT`), an accepted window after each,
/// and a window too long for any patch.
fn every_reason_windows(m: &mut FakeModule) -> Vec<(u64, usize)> {
    let mut windows = Vec::new();
    for code in 1..=TRAPVEC_REASON_MAX {
        let at = TEXT + 32 * u64::from(code);
        m.checks.insert(at, (code, -16));
        windows.push((at, 2));
        windows.push((at + 16, 5));
    }
    windows.push((TEXT, 17));
    windows
}

#[test]
fn check_sites_answers_every_reason_as_one_check_each_does_in_one_call() {
    let mut windows = Vec::new();
    let (target, m, _g) = target_with(|m| windows = every_reason_windows(m));
    // Shuffled: the answers follow the order given, not the addresses.
    windows.reverse();
    windows.swap(0, 7);
    let batched = target.precheck_sites(&windows);
    assert_eq!(m.borrow().calls, ["INFO", "CHECK_MANY"]);
    let one_by_one: Vec<_> = windows
        .iter()
        .map(|&(a, l)| target.precheck_site(a, l))
        .collect();
    assert_eq!(batched, one_by_one);
    assert!(batched.iter().any(Result::is_ok));
    assert!(batched.contains(&Err(SiteRefusal::BadLength)));
    assert!(batched.contains(&Err(SiteRefusal::KprobeRefused {
        errno: Errno::EBUSY
    })));
    // The kprobe's place, from the culprit, as CHECK names it.
    let kprobe = windows
        .iter()
        .position(|&(a, _)| a == TEXT + 32 * u64::from(TRAPVEC_REASON_KPROBE))
        .unwrap();
    assert!(
        matches!(&batched[kprobe], Err(SiteRefusal::Kprobe { at, .. }) if *at == windows[kprobe].0 + 2),
        "{:?}",
        batched[kprobe]
    );
}

#[test]
fn target_check_sites_names_each_refused_address() {
    let (target, m, _g) = target_with(|m| {
        m.checks.insert(TEXT + 8, (TRAPVEC_REASON_EXTABLE, 0));
    });
    let answers = Target::check_sites(&target, &[(TEXT, 2), (TEXT + 8, 3)]);
    assert!(answers[0].is_ok());
    let err = answers[1].as_ref().unwrap_err();
    assert!(
        matches!(
            err,
            TargetError::SiteRefused {
                addr,
                reason: SiteRefusal::Extable
            } if *addr == TEXT + 8
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        TargetExt::check_site(&target, TEXT + 8, 3)
            .unwrap_err()
            .to_string()
    );
    assert_eq!(
        m.borrow().check_many.len(),
        2,
        "one for both windows, one for the last"
    );
}

#[test]
fn check_sites_goes_to_the_module_in_chunks() {
    use super::CHECK_MANY_CHUNK;

    let (target, m, _g) = target_with(|m| {
        m.checks.insert(TEXT + 5, (TRAPVEC_REASON_FTRACE, 0));
    });
    let windows: Vec<(u64, usize)> = (0..2 * CHECK_MANY_CHUNK as u64 + 1)
        .map(|i| (TEXT + i, 2))
        .collect();
    let answers = target.precheck_sites(&windows);
    assert_eq!(answers.len(), windows.len());
    assert_eq!(answers[5], Err(SiteRefusal::Ftrace));
    assert_eq!(answers.iter().filter(|a| a.is_err()).count(), 1);
    let sizes: Vec<usize> = m.borrow().check_many.iter().map(Vec::len).collect();
    assert_eq!(sizes, [CHECK_MANY_CHUNK, CHECK_MANY_CHUNK, 1]);
    assert!(target.precheck_sites(&[]).is_empty());
    assert_eq!(m.borrow().check_many.len(), 3, "nothing asked for nothing");
}

#[test]
fn check_sites_falls_back_to_one_check_each_on_a_module_without_check_many() {
    for errno in [Errno::ENOTTY, Errno::EINVAL] {
        let mut windows = Vec::new();
        let (target, m, _g) = target_with(|m| {
            windows = every_reason_windows(m);
            m.fail.insert("CHECK_MANY", (errno, 0));
        });
        let answers = target.precheck_sites(&windows);
        let one_by_one: Vec<_> = windows
            .iter()
            .map(|&(a, l)| target.precheck_site(a, l))
            .collect();
        assert_eq!(answers, one_by_one, "{errno}");
        // Asked once; every window then had its CHECK, without the kprobe cross-check.
        target.precheck_sites(&windows[..2]);
        let m = m.borrow();
        assert_eq!(m.calls.iter().filter(|c| **c == "CHECK_MANY").count(), 1);
        assert_eq!(m.check_flags.len(), 2 * windows.len() + 2);
        assert!(m.check_flags.iter().all(|&f| f == TRAPVEC_CHECK_NO_KPROBE));
    }
}

#[test]
fn check_sites_that_cannot_ask_the_module_says_so_for_each_window() {
    let (target, m, _g) = target_with(|m| {
        m.fail.insert("CHECK_MANY", (Errno::ENOMEM, 0));
    });
    let answers = target.precheck_sites(&[(TEXT, 2), (TEXT + 4, 2)]);
    let failed = Err(SiteRefusal::CheckFailed {
        errno: Errno::ENOMEM,
    });
    assert_eq!(answers, vec![failed.clone(), failed]);
    assert!(
        !m.borrow().calls.contains(&"CHECK"),
        "no fallback for ENOMEM"
    );
}
