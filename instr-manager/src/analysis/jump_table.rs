//! Recognising the jump table behind an indirect `jmp` (a `switch`), so that its entries become
//! branch targets.
//!
//! Two compiler patterns are recognised, looking back at most [`MAX_BACK`] instructions:
//! - absolute tables (non-PIC code): `jmp qword [T + idx*8]`, entries are 8-byte addresses;
//! - relative tables (PIC code): `lea B, [rip+T]; movsxd R, dword [B + idx*4]; add R, B; jmp R`
//!   (either register order), entries are 4-byte offsets from `T`.
//!
//! The number of entries comes from the guard `cmp idx, N; ja default` (N+1 entries) or
//! `cmp idx, N; jae default` (N entries) when one is found on the same index register. Without a
//! guard, entries are read until the first one that is not an instruction boundary of the
//! function: that can only over-approximate the targets (the entries of a real table are all
//! valid), which makes the planner more conservative, never less.

use iced_x86::{Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register};

use super::{Insn, ReadFn};

/// How far back from the `jmp` the pattern is searched.
pub const MAX_BACK: usize = 24;
/// Largest guarded table accepted.
const MAX_ENTRIES: u64 = 4096;
/// Most entries read from a table without a guard.
const MAX_UNGUARDED: usize = 512;

/// An indirect `jmp` of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndirectJump {
    pub addr: u64,
    /// Its jump table, when recognised.
    pub table: Option<JumpTable>,
}

/// A recognised jump table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JumpTable {
    /// Address of the table.
    pub table: u64,
    /// 8 (absolute addresses) or 4 (offsets from `table`).
    pub entry_size: u8,
    /// Entries read.
    pub entries: usize,
    /// Whether the entry count came from a `cmp`/`ja` guard (else: read until an invalid entry).
    pub guarded: bool,
    /// Distinct targets inside the function, in address order.
    pub targets: Vec<u64>,
}

/// Whether `instr` writes (any part of) `reg`.
fn writes(factory: &mut InstructionInfoFactory, instr: &Instruction, reg: Register) -> bool {
    factory.info(instr).used_registers().iter().any(|u| {
        u.register().full_register() == reg
            && matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
    })
}

/// Index of the last instruction in `[lo, hi)` that writes `reg`.
fn last_writer(
    f: &mut InstructionInfoFactory,
    insns: &[Insn],
    lo: usize,
    hi: usize,
    reg: Register,
) -> Option<usize> {
    (lo..hi).rev().find(|&k| writes(f, &insns[k].instr, reg))
}

/// Find the table of the indirect `jmp` at `insns[idx]`.
pub(crate) fn find(
    insns: &[Insn],
    idx: usize,
    start: u64,
    end: u64,
    read: ReadFn<'_>,
) -> Option<JumpTable> {
    let jmp = &insns[idx].instr;
    let lo = idx.saturating_sub(MAX_BACK);
    let mut f = InstructionInfoFactory::new();
    match jmp.op0_kind() {
        OpKind::Memory
            if jmp.memory_base() == Register::None
                && jmp.memory_index() != Register::None
                && jmp.memory_index_scale() == 8 =>
        {
            let table = jmp.memory_displacement64();
            let count = guard_count(insns, lo, idx, jmp.memory_index().full_register());
            read_table(table, 8, count, start, end, insns, read)
        }
        OpKind::Register => {
            let r = jmp.op0_register().full_register();
            let add_i = last_writer(&mut f, insns, lo, idx, r)?;
            let add = &insns[add_i].instr;
            if add.mnemonic() != Mnemonic::Add
                || add.op0_kind() != OpKind::Register
                || add.op1_kind() != OpKind::Register
            {
                return None;
            }
            let s = add.op1_register().full_register();
            if add.op0_register().full_register() != r || s == r {
                return None;
            }
            // The entry load writes one of the two, the table base is the other.
            let mov_i = (lo..add_i).rev().find(|&k| {
                writes(&mut f, &insns[k].instr, r) || writes(&mut f, &insns[k].instr, s)
            })?;
            let mov = &insns[mov_i].instr;
            if mov.mnemonic() != Mnemonic::Movsxd
                || mov.op1_kind() != OpKind::Memory
                || mov.memory_index_scale() != 4
            {
                return None;
            }
            let dst = mov.op0_register().full_register();
            let base = mov.memory_base().full_register();
            if !((dst == r && base == s) || (dst == s && base == r)) {
                return None;
            }
            // The base must hold T at the add too: nothing between the load and the add rewrites it.
            if (mov_i + 1..add_i).any(|k| writes(&mut f, &insns[k].instr, base)) {
                return None;
            }
            let lea_i = last_writer(&mut f, insns, lo, mov_i, base)?;
            let lea = &insns[lea_i].instr;
            if lea.mnemonic() != Mnemonic::Lea || !lea.is_ip_rel_memory_operand() {
                return None;
            }
            let table = lea.ip_rel_memory_address();
            let count = guard_count(insns, lo, mov_i, mov.memory_index().full_register());
            read_table(table, 4, count, start, end, insns, read)
        }
        _ => None,
    }
}

/// The entry count implied by a `cmp idx, N` followed by `ja`/`jae` before `insns[before]`.
fn guard_count(insns: &[Insn], lo: usize, before: usize, idx: Register) -> Option<u64> {
    (lo.max(1)..before).rev().find_map(|k| {
        let j = &insns[k].instr;
        let c = &insns[k - 1].instr;
        let extra = match j.mnemonic() {
            Mnemonic::Ja => 1,
            Mnemonic::Jae => 0,
            _ => return None,
        };
        let is_guard = c.mnemonic() == Mnemonic::Cmp
            && c.op0_kind() == OpKind::Register
            && c.op0_register().full_register() == idx
            && matches!(
                c.op1_kind(),
                OpKind::Immediate8to32
                    | OpKind::Immediate32
                    | OpKind::Immediate8to64
                    | OpKind::Immediate32to64
                    | OpKind::Immediate8
            );
        if !is_guard {
            return None;
        }
        let n = c.immediate(1).checked_add(extra)?;
        (n > 0 && n <= MAX_ENTRIES).then_some(n)
    })
}

fn read_table(
    table: u64,
    entry_size: u8,
    count: Option<u64>,
    start: u64,
    end: u64,
    insns: &[Insn],
    read: ReadFn<'_>,
) -> Option<JumpTable> {
    let es = usize::from(entry_size);
    let valid =
        |t: u64| t >= start && t < end && insns.binary_search_by_key(&t, |i| i.addr).is_ok();
    let decode = |chunk: &[u8]| -> u64 {
        if entry_size == 8 {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            u64::from_le_bytes(b)
        } else {
            let mut b = [0u8; 4];
            b.copy_from_slice(chunk);
            table.wrapping_add_signed(i64::from(i32::from_le_bytes(b)))
        }
    };
    let mut targets = Vec::new();
    let entries = match count {
        Some(n) => {
            let n = usize::try_from(n).ok()?;
            let bytes = read(table, n * es)?;
            if bytes.len() < n * es {
                return None;
            }
            for (i, chunk) in bytes.chunks_exact(es).enumerate() {
                let t = decode(chunk);
                if valid(t) {
                    targets.push(t);
                } else {
                    log::debug!("jump table {table:#x} entry {i} -> {t:#x} is not an instruction of the function; ignored");
                }
            }
            n
        }
        None => {
            let mut n = 0;
            'outer: while n < MAX_UNGUARDED {
                let Some(bytes) = read(table + (n * es) as u64, 64 * es) else {
                    break;
                };
                for chunk in bytes.chunks_exact(es) {
                    let t = decode(chunk);
                    if !valid(t) || n >= MAX_UNGUARDED {
                        break 'outer;
                    }
                    targets.push(t);
                    n += 1;
                }
                if bytes.len() < 64 * es {
                    break;
                }
            }
            n
        }
    };
    if targets.is_empty() {
        return None;
    }
    targets.sort_unstable();
    targets.dedup();
    Some(JumpTable {
        table,
        entry_size,
        entries,
        guarded: count.is_some(),
        targets,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{analyze_function_with, AnalysisOptions};

    const BASE: u64 = 0x1000;
    const TABLE: u64 = 0x2000;

    /// `switch (edi) { case 0..3 }` as gcc -O2 -fPIC emits it.
    #[rustfmt::skip]
    const PIC_SWITCH: &[u8] = &[
        /*1000*/ 0x83, 0xFF, 0x03,                   // cmp edi, 3
        /*1003*/ 0x77, 0x1B,                         // ja 0x1020
        /*1005*/ 0x48, 0x8D, 0x15, 0xF4, 0x0F, 0x00, 0x00, // lea rdx, [rip+0xff4] -> 0x2000
        /*100c*/ 0x48, 0x63, 0x04, 0xBA,             // movsxd rax, dword [rdx+rdi*4]
        /*1010*/ 0x48, 0x01, 0xD0,                   // add rax, rdx
        /*1013*/ 0xFF, 0xE0,                         // jmp rax
        /*1015*/ 0xB8, 0x01, 0x00, 0x00, 0x00,       // mov eax, 1    case 0
        /*101a*/ 0xC3,                               // ret
        /*101b*/ 0xB8, 0x02, 0x00, 0x00, 0x00,       // mov eax, 2    case 1, 2
        /*1020*/ 0x31, 0xC0,                         // xor eax, eax  default, case 3
        /*1022*/ 0xC3,                               // ret
    ];

    fn rel_table(targets: &[u64]) -> Vec<u8> {
        targets
            .iter()
            .flat_map(|t| {
                i32::try_from(i128::from(*t) - i128::from(TABLE))
                    .unwrap()
                    .to_le_bytes()
            })
            .collect()
    }

    #[test]
    fn pic_switch_table_targets_become_branch_targets() {
        let mut table = rel_table(&[0x1015, 0x101b, 0x101b, 0x1020]);
        table.extend(rel_table(&[0x1022])); // beyond the guard: must not be read
        let read = move |addr: u64, len: usize| -> Option<Vec<u8>> {
            let off = usize::try_from(addr.checked_sub(TABLE)?).ok()?;
            table.get(off..off + len).map(<[u8]>::to_vec)
        };
        let f = analyze_function_with(
            "sw",
            BASE,
            PIC_SWITCH,
            &AnalysisOptions {
                read: Some(&read),
                lenient: false,
                object_targets: None,
            },
        )
        .unwrap();
        assert!(f.has_indirect_jumps);
        let t = f.indirect_jumps[0].table.as_ref().expect("table found");
        assert_eq!(
            (t.table, t.entry_size, t.entries, t.guarded),
            (TABLE, 4, 4, true)
        );
        assert_eq!(t.targets, vec![0x1015, 0x101b, 0x1020]);
        assert!(f.branch_targets.contains(&0x1015) && f.branch_targets.contains(&0x101b));
        assert!(!f.branch_targets.contains(&0x1022));
        let jmp_block = f.block_of(0x1013).unwrap();
        assert_eq!(jmp_block.succs, vec![0x1015, 0x101b, 0x1020]);
        assert_eq!(f.unresolved_indirect_jumps().count(), 0);
    }

    #[test]
    fn unguarded_table_is_read_until_an_invalid_entry() {
        // Same code without the cmp/ja guard (replaced by 5 NOP bytes).
        let mut code = PIC_SWITCH.to_vec();
        code[..5].copy_from_slice(&[0x0F, 0x1F, 0x44, 0x00, 0x00]);
        let mut table = rel_table(&[0x1015, 0x101b]);
        table.extend(rel_table(&[0x1016])); // mid-instruction: the table ends here
        table.extend(rel_table(&[0x1020]));
        let read = move |addr: u64, len: usize| -> Option<Vec<u8>> {
            let off = usize::try_from(addr.checked_sub(TABLE)?).ok()?;
            let end = (off + len).min(table.len());
            table.get(off..end).map(<[u8]>::to_vec)
        };
        let f = analyze_function_with(
            "sw",
            BASE,
            &code,
            &AnalysisOptions {
                read: Some(&read),
                lenient: false,
                object_targets: None,
            },
        )
        .unwrap();
        let t = f.indirect_jumps[0].table.as_ref().expect("table found");
        assert!(!t.guarded);
        assert_eq!(t.entries, 2);
        assert_eq!(t.targets, vec![0x1015, 0x101b]);
    }

    #[test]
    fn absolute_table_jmp_through_memory_is_recognised() {
        #[rustfmt::skip]
        let code = [
            /*1000*/ 0x83, 0xFF, 0x01,                         // cmp edi, 1
            /*1003*/ 0x77, 0x0A,                               // ja 0x100f
            /*1005*/ 0xFF, 0x24, 0xFD, 0x00, 0x20, 0x00, 0x00, // jmp qword [rdi*8+0x2000]
            /*100c*/ 0x31, 0xC0,                               // xor eax, eax
            /*100e*/ 0xC3,                                     // ret
            /*100f*/ 0xC3,                                     // ret
        ];
        let table: Vec<u8> = [0x100cu64, 0x100f]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let read = move |addr: u64, len: usize| (addr == TABLE && len == 16).then(|| table.clone());
        let f = analyze_function_with(
            "abs",
            BASE,
            &code,
            &AnalysisOptions {
                read: Some(&read),
                lenient: false,
                object_targets: None,
            },
        )
        .unwrap();
        let t = f.indirect_jumps[0].table.as_ref().expect("table found");
        assert_eq!((t.entry_size, t.entries, t.guarded), (8, 2, true));
        assert_eq!(t.targets, vec![0x100c, 0x100f]);
    }

    #[test]
    fn indirect_jump_without_reader_stays_unresolved() {
        let f = super::super::analyze_function("sw", BASE, PIC_SWITCH).unwrap();
        assert!(f.has_indirect_jumps);
        assert_eq!(
            f.unresolved_indirect_jumps()
                .map(|j| j.addr)
                .collect::<Vec<_>>(),
            vec![0x1013]
        );
        assert!(f.block_of(0x1013).unwrap().succs.is_empty());
    }
}
