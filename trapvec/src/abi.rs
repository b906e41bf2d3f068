//! The trap ABI shared with `kmod/` (`kmod/trapvec_abi.h`) and with components
//! (`components/include/trapvec.h`).

/// Interrupt vector of the trap: 0xF5 is an unused system vector on Linux 6.1 x86-64 (it was
/// UV_BAU), so the interrupt matrix never hands it to a device.
pub const TRAP_VECTOR: u8 = 0xF5;

/// The trap written over a point: `int 0xF5`.
pub const TRAP_BYTES: [u8; 2] = [0xCD, TRAP_VECTOR];

/// The one-byte breakpoint written first by the int3-first protocol.
pub const INT3: u8 = 0xCC;

/// Error code of the #GP a user-mode `int 0xF5` raises: the IDT entry index with the IDT bit.
pub const USER_TRAP_ERROR_CODE: u64 = ((TRAP_VECTOR as u64) << 3) | 2;

/// Registers handed to a `call` handler, `struct trapvec_regs` in `components/include/trapvec.h`.
///
/// A handler may change any general register; `rsp` and `rip` are informational (the value at the
/// point and the point's address) and writes to them are ignored. Trampolines build exactly this
/// layout on the stack, so the field order is ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecRegs {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rbp: u64,
    pub rbx: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rax: u64,
    pub rsp: u64,
    pub rip: u64,
    pub rflags: u64,
}

const _: () = assert!(core::mem::size_of::<TrapvecRegs>() == 18 * 8);

/// What the return half of a return point hands its handler beside the registers, `struct
/// trapvec_call` in `components/include/trapvec.h`: the entry's argument registers, kept in the
/// call's instance from the entry to the return (kretprobe's per-instance data). The field order
/// is ABI.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecCall {
    /// `rdi, rsi, rdx, rcx, r8, r9` at the function's entry.
    pub args: [u64; 6],
    /// The splice's cookie.
    pub cookie: u64,
    /// The stack pointer at the entry (the return address's slot).
    pub sp: u64,
    /// Where the function returns to.
    pub ret: u64,
    /// Nanoseconds from the entry to the return, by the splice's clock (timers; else 0).
    pub elapsed_ns: u64,
}

const _: () = assert!(core::mem::size_of::<TrapvecCall>() == 10 * 8);

// ---------------------------------------------------------------------------------------------
// ioctl interface
//
// The mirror of `kmod/trapvec_abi.h`: every struct field for field, named as the header names
// it, and every number. `tests/abi_layout.rs` compiles the header with `cc` and compares sizes,
// offsets and numbers with what is below; the module asserts the same sizes with BUILD_BUG_ON.
// Pointer fields (`buf`, `patches`, `entries`, `sites`) carry user addresses as `u64`; only
// `kernel::ioctl` fills them, from slices borrowed for the duration of the call.
// ---------------------------------------------------------------------------------------------

/// Version of the ioctl interface; `TrapvecInfo::abi_version` must equal it.
pub const TRAPVEC_ABI_VERSION: u32 = 11;
/// Name of the misc device (`/dev/trapvec`).
pub const TRAPVEC_DEVICE_NAME: &str = "trapvec";
/// `_IOC_TYPE` of every trapvec ioctl.
pub const TRAPVEC_IOC_MAGIC: u8 = b'T';
/// Longest text patch, in bytes.
pub const TRAPVEC_PATCH_MAX: usize = 16;
/// Most bytes one READ or WRITE moves.
pub const TRAPVEC_XFER_MAX: u32 = 1 << 20;
/// Most elements of one APPLY, DISPATCH_ADD, DISPATCH_REMOVE or LIST (2^18 since ABI 11).
pub const TRAPVEC_BATCH_MAX: u32 = 1 << 18;
/// Largest state blob (STATE_PUT).
pub const TRAPVEC_STATE_MAX: u32 = 256 << 20;
/// `failed_index` when nothing failed.
pub const TRAPVEC_NO_INDEX: u32 = 0xffff_ffff;

/// Code block: written, then sealed; executable; never written after.
pub const TRAPVEC_BLOCK_CODE: u32 = 1;
/// Data block: writable at any time; never executable.
pub const TRAPVEC_BLOCK_DATA: u32 = 2;

// The refusal reasons: the header's `TRAPVEC_REASONS()` list is their one source;
// tests/abi_layout.rs fails, naming the reason, where these constants (or `SiteRefusal`)
// differ from it. Why they are written here rather than generated: kmod/README.md.

/// Site accepted.
pub const TRAPVEC_REASON_NONE: u32 = 0;
/// Length 0 or above `TRAPVEC_PATCH_MAX`.
pub const TRAPVEC_REASON_BAD_LENGTH: u32 = 1;
/// Not core kernel text nor a live module's core text.
pub const TRAPVEC_REASON_NOT_TEXT: u32 = 2;
/// Inside trapvec.ko itself.
pub const TRAPVEC_REASON_OWN_MODULE: u32 = 3;
/// Overlaps entry text.
pub const TRAPVEC_REASON_ENTRY_TEXT: u32 = 4;
/// Overlaps noinstr text.
pub const TRAPVEC_REASON_NOINSTR_TEXT: u32 = 5;
/// Overlaps the retpoline/return thunks.
pub const TRAPVEC_REASON_THUNK: u32 = 6;
/// A function on the kprobes blacklist.
pub const TRAPVEC_REASON_KPROBE_BLACKLIST: u32 = 7;
/// Overlaps an ftrace `__fentry__` site.
pub const TRAPVEC_REASON_FTRACE: u32 = 8;
/// Overlaps a jump label site.
pub const TRAPVEC_REASON_JUMP_LABEL: u32 = 9;
/// Overlaps a static call site.
pub const TRAPVEC_REASON_STATIC_CALL: u32 = 10;
/// Overlaps a BUG()/WARN() `ud2`.
pub const TRAPVEC_REASON_BUG_ENTRY: u32 = 11;
/// An instruction with an exception-table entry.
pub const TRAPVEC_REASON_EXTABLE: u32 = 12;
/// Not an instruction boundary.
pub const TRAPVEC_REASON_NOT_BOUNDARY: u32 = 13;
/// Runs into the next symbol.
pub const TRAPVEC_REASON_CROSSES_SYMBOL: u32 = 14;
/// `register_kprobe()` refused it (errno in `error`).
pub const TRAPVEC_REASON_KPROBE_REFUSED: u32 = 15;
/// Overlaps a live patch, or another patch of the batch.
pub const TRAPVEC_REASON_LIVE_PATCH: u32 = 16;
/// The current bytes differ from `old_bytes`.
pub const TRAPVEC_REASON_MISMATCH: u32 = 17;
/// Overlaps an SMP lock prefix the kernel rewrites (alternatives).
pub const TRAPVEC_REASON_ALTERNATIVE: u32 = 18;
/// A kprobe is registered on the range (or a jump-optimizable one before it covers it);
/// `culprit` is its address.
pub const TRAPVEC_REASON_KPROBE: u32 = 19;
/// Overlaps `.cpuidle.text`.
pub const TRAPVEC_REASON_CPUIDLE_TEXT: u32 = 20;
/// A static call trampoline (`__SCT__*`).
pub const TRAPVEC_REASON_STATIC_CALL_TRAMP: u32 = 21;
/// A kprobe instruction slot.
pub const TRAPVEC_REASON_KPROBE_SLOT: u32 = 22;
/// A BPF JIT image or dispatcher.
pub const TRAPVEC_REASON_BPF_TEXT: u32 = 23;
/// An ftrace trampoline.
pub const TRAPVEC_REASON_FTRACE_TRAMPOLINE: u32 = 24;
/// A module's init text.
pub const TRAPVEC_REASON_MODULE_INIT: u32 = 25;
/// Kernel lockdown forbids writing kernel memory.
pub const TRAPVEC_REASON_LOCKDOWN: u32 = 26;
/// `kernel.modules_disabled=1` forbids writing kernel memory.
pub const TRAPVEC_REASON_MODULES_DISABLED: u32 = 27;
/// A trap (`CD vector`) at a site with no dispatch entry.
pub const TRAPVEC_REASON_NO_DISPATCH: u32 = 28;
/// An `int` of another vector than the module's.
pub const TRAPVEC_REASON_FOREIGN_TRAP: u32 = 29;
/// A call before the window's last instruction: its return address would point into the new bytes.
pub const TRAPVEC_REASON_RETURN_IN_WINDOW: u32 = 30;
/// A window over several instructions whose new bytes begin with neither a trap nor a jmp.
pub const TRAPVEC_REASON_NOT_A_JUMP: u32 = 31;
/// A jump-label target lies inside the window past its first byte; `culprit` is its
/// `struct jump_entry` (16 bytes: `s32 code`, `s32 target`, `s64 key`, each relative to its own
/// field; the key's low 2 bits are flags).
pub const TRAPVEC_REASON_JUMP_TARGET: u32 = 32;
/// An exception fix-up address lies inside the window past its first byte; `culprit` is its
/// `struct exception_table_entry` (12 bytes: `s32 insn`, `s32 fixup`, `s32 data`, the first two
/// relative to their own fields).
pub const TRAPVEC_REASON_EXTABLE_FIXUP: u32 = 33;
/// A function a CPU going offline runs after `rcu_report_dead()`; `culprit` is its start.
pub const TRAPVEC_REASON_DEAD_CPU: u32 = 34;
/// An `endbr64` lies inside the window: with IBT an indirect branch must land on it.
pub const TRAPVEC_REASON_ENDBR: u32 = 35;
/// Highest reason code.
pub const TRAPVEC_REASON_MAX: u32 = 35;

/// `struct trapvec_info`: what the module is and where its memory lies.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecInfo {
    /// `TRAPVEC_ABI_VERSION`.
    pub abi_version: u32,
    /// The trap vector.
    pub vector: u32,
    /// The gate's entry stub.
    pub entry: u64,
    /// The gate's handler before the module was loaded.
    pub old_handler: u64,
    /// The gate's handler now, read from the IDT.
    pub gate_handler: u64,
    /// Executable arena.
    pub code_base: u64,
    pub code_size: u64,
    /// Data arena.
    pub data_base: u64,
    pub data_size: u64,
    /// Bytes held by code blocks (live or waiting to be freed).
    pub code_used: u64,
    pub data_used: u64,
    /// The module's core image `[base, base + size)`.
    pub module_base: u64,
    pub module_size: u64,
    /// Text patches applied and not reverted.
    pub live_patches: u64,
    pub dispatch_entries: u64,
    /// Traps at no known site, chained to the old handler.
    pub unknown_traps: u64,
    /// Traps at a site restored under them, sent back to it.
    pub retried_traps: u64,
    /// In-flight counters of replace trampolines: the code block at `code_base + 16 * i`
    /// counts the tasks inside its replacement at `inflight_base + 8 * i`.
    pub inflight_base: u64,
    /// `trapvec_replace_ret`: a replace trampoline leaves with `jmp replace_ret`, `r11` = its
    /// counter (decremented there, outside the block, then `ret`).
    pub replace_ret: u64,
    /// The per-CPU offset of `current_task` (`gs:[current_task]` is the running task).
    pub current_task: u64,
    /// `offsetof(struct task_struct, pid)`, `tgid` and `comm`.
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_comm: u32,
    pub task_pad: u32,
}

/// `struct trapvec_read`: copy `len` bytes of kernel memory at `addr` to `buf`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecRead {
    pub addr: u64,
    /// User buffer.
    pub buf: u64,
    /// At most `TRAPVEC_XFER_MAX`.
    pub len: u32,
    /// `TRAPVEC_READ_*`.
    pub flags: u32,
}

/// `TrapvecRead::flags`: the text without anyone's patches (the module's live patches undone,
/// kprobes' int3 and optimized jmps replaced by the bytes they saved).
pub const TRAPVEC_READ_ORIGINAL: u32 = 1;

/// `struct trapvec_alloc`: a block of `size` bytes (rounded up to 16) of one arena.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecAlloc {
    /// `TRAPVEC_BLOCK_CODE` or `TRAPVEC_BLOCK_DATA`.
    pub kind: u32,
    pub pad: u32,
    pub size: u64,
    /// Out: handle for WRITE, SEAL and FREE.
    pub id: u64,
    /// Out: kernel address of the block.
    pub addr: u64,
}

/// `struct trapvec_write`: copy `len` bytes from `buf` into block `id` at `offset`, read back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecWrite {
    pub id: u64,
    pub offset: u64,
    /// User buffer.
    pub buf: u64,
    /// At most `TRAPVEC_XFER_MAX`.
    pub len: u32,
    pub pad: u32,
}

/// `struct trapvec_block`: the block of SEAL and FREE.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecBlock {
    pub id: u64,
}

/// `struct trapvec_patch`: `old_bytes` must be at `addr`; `new_bytes` replaces them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecPatch {
    pub addr: u64,
    /// `1..=TRAPVEC_PATCH_MAX`.
    pub len: u32,
    pub pad: u32,
    pub old_bytes: [u8; TRAPVEC_PATCH_MAX],
    pub new_bytes: [u8; TRAPVEC_PATCH_MAX],
}

/// CHECK flag: only the checks APPLY makes, without the kprobe cross-check.
pub const TRAPVEC_CHECK_NO_KPROBE: u32 = 1;

/// `struct trapvec_check`: would a patch of `[addr, addr + len)` be accepted?
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecCheck {
    pub addr: u64,
    pub len: u32,
    /// Out: `TRAPVEC_REASON_*`.
    pub reason: u32,
    /// Out: negative errno of `register_kprobe()` for `TRAPVEC_REASON_KPROBE_REFUSED`.
    pub error: i32,
    /// `TRAPVEC_CHECK_*`.
    pub flags: u32,
    /// Out: what the reason is about (`TRAPVEC_REASON_KPROBE`: the probe's address;
    /// `JUMP_TARGET`, `EXTABLE_FIXUP`: the table entry's), or 0.
    pub culprit: u64,
}

/// `struct trapvec_check_many`: CHECK of `count` windows in one call, each answered in place as
/// CHECK with [`TRAPVEC_CHECK_NO_KPROBE`] answers it (every entry's `flags` must be exactly
/// that). Added without a new ABI version: an older module answers `ENOTTY`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecCheckMany {
    /// User pointer to `count` [`TrapvecCheck`], answered in place.
    pub checks: u64,
    /// At most `TRAPVEC_BATCH_MAX`.
    pub count: u32,
    /// Must be 0.
    pub flags: u32,
}

/// `struct trapvec_apply`: a batch of patches, all or none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecApply {
    /// User pointer to `count` [`TrapvecPatch`].
    pub patches: u64,
    /// At most `TRAPVEC_BATCH_MAX`.
    pub count: u32,
    /// Must be 0.
    pub flags: u32,
    /// Out: the failing patch, or `TRAPVEC_NO_INDEX`.
    pub failed_index: u32,
    /// Out: `TRAPVEC_REASON_*`.
    pub reason: u32,
    /// Out: negative errno behind the reason, if any.
    pub error: i32,
    pub pad: u32,
    /// Out: the current bytes at the failing patch (for a mismatch).
    pub found: [u8; TRAPVEC_PATCH_MAX],
    /// Out: as [`TrapvecCheck::culprit`].
    pub culprit: u64,
}

/// `struct trapvec_dispatch_entry`: a trap at `site` continues at `dest`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecDispatchEntry {
    pub site: u64,
    pub dest: u64,
    /// `handler(struct trapvec_regs *, cookie)`, run by the dispatcher first; 0 for none.
    pub handler: u64,
    pub cookie: u64,
    pub only: TrapvecTaskMatch,
}

/// `TRAPVEC_MATCH_*`: the fields a [`TrapvecTaskMatch`] tests.
pub const TRAPVEC_MATCH_PID: u32 = 1 << 0;
pub const TRAPVEC_MATCH_TGID: u32 = 1 << 1;
pub const TRAPVEC_MATCH_COMM: u32 = 1 << 2;

/// `struct trapvec_task_match`: a dispatch entry's task predicate; a trap of a task that does
/// not match goes to `skip`, uncounted, without the handler.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecTaskMatch {
    /// `TRAPVEC_MATCH_*` bits; 0: every task.
    pub r#match: u32,
    pub pid: u32,
    pub tgid: u32,
    pub pad: u32,
    pub skip: u64,
    pub comm: [u8; 16],
}

impl TrapvecTaskMatch {
    /// The ABI form of a predicate (all zero for none).
    pub fn of(m: Option<&crate::predicate::TaskMatch>) -> TrapvecTaskMatch {
        let Some(m) = m else {
            return TrapvecTaskMatch::default();
        };
        let bit = |present: bool, b: u32| if present { b } else { 0 };
        TrapvecTaskMatch {
            r#match: bit(m.pid.is_some(), TRAPVEC_MATCH_PID)
                | bit(m.tgid.is_some(), TRAPVEC_MATCH_TGID)
                | bit(m.comm.is_some(), TRAPVEC_MATCH_COMM),
            pid: m.pid.unwrap_or(0),
            tgid: m.tgid.unwrap_or(0),
            pad: 0,
            skip: m.skip,
            comm: m.comm.unwrap_or([0; 16]),
        }
    }

    /// The predicate this ABI form holds (`None` without match bits).
    pub fn to_match(&self) -> Option<crate::predicate::TaskMatch> {
        let has = |b: u32| self.r#match & b != 0;
        (self.r#match != 0).then(|| crate::predicate::TaskMatch {
            pid: has(TRAPVEC_MATCH_PID).then_some(self.pid),
            tgid: has(TRAPVEC_MATCH_TGID).then_some(self.tgid),
            comm: has(TRAPVEC_MATCH_COMM).then_some(self.comm),
            skip: self.skip,
        })
    }
}

/// `struct trapvec_dispatch_add`: all entries or none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecDispatchAdd {
    /// User pointer to `count` [`TrapvecDispatchEntry`].
    pub entries: u64,
    pub count: u32,
    /// Out.
    pub failed_index: u32,
}

/// `struct trapvec_dispatch_remove`: all sites or none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecDispatchRemove {
    /// User pointer to `count` `u64` sites.
    pub sites: u64,
    pub count: u32,
    /// Out.
    pub failed_index: u32,
}

/// `struct trapvec_dispatch_replace` (ABI 8): each site's entry swapped for a new one, the
/// trap staying in the text; all entries or none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecDispatchReplace {
    /// User pointer to `count` [`TrapvecDispatchEntry`].
    pub entries: u64,
    /// User pointer to `count` [`TrapvecHits`]: in, what the new entries' counters start
    /// from; out, the old entries' final counters.
    pub counts: u64,
    pub count: u32,
    /// Out.
    pub failed_index: u32,
}

/// `struct trapvec_hits`: counters of one site, summed over CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecHits {
    pub site: u64,
    /// Out: every trap taken at the site.
    pub hits: u64,
    /// Out: of those, how many skipped the handler (reentry).
    pub missed: u64,
}

/// `struct trapvec_list_entry`: one element of LIST.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecListEntry {
    pub site: u64,
    pub dest: u64,
    pub handler: u64,
    pub cookie: u64,
    pub hits: u64,
    pub missed: u64,
    pub only: TrapvecTaskMatch,
}

/// `struct trapvec_list`: up to `capacity` entries (at most `TRAPVEC_BATCH_MAX`) ordered by
/// site, from the `start`-th on; `count` is the total.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecList {
    /// User pointer to `capacity` [`TrapvecListEntry`].
    pub entries: u64,
    pub capacity: u32,
    /// Out.
    pub count: u32,
    /// Index of the first entry to copy.
    pub start: u64,
}

/// `struct trapvec_quiesce`: what QUIESCE reclaimed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecQuiesce {
    pub reclaimed_blocks: u64,
    pub reclaimed_bytes: u64,
    /// With `EBUSY`: a freed code block a task is still in flight through, and how many.
    pub busy_addr: u64,
    pub busy_count: u64,
}

/// `struct trapvec_state`: user space's opaque state blob (STATE_GET, STATE_PUT).
///
/// GET copies the blob to `buf` if it fits in `len` bytes and reports `size` and `generation`
/// either way (`ENOSPC`: it did not fit). PUT replaces the blob with `len` bytes at `buf` if
/// `generation` is still the current one (else `ESTALE`, with the current one in
/// `generation`), and returns the new generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecState {
    /// User buffer.
    pub buf: u64,
    /// GET: capacity of `buf`; PUT: bytes in `buf` (at most `TRAPVEC_STATE_MAX`).
    pub len: u64,
    /// GET out: size of the blob.
    pub size: u64,
    /// GET out: current; PUT in: expected, out: new.
    pub generation: u64,
}

const _: () = assert!(core::mem::size_of::<TrapvecInfo>() == 168);
const _: () = assert!(core::mem::size_of::<TrapvecRead>() == 24);
const _: () = assert!(core::mem::size_of::<TrapvecAlloc>() == 32);
const _: () = assert!(core::mem::size_of::<TrapvecWrite>() == 32);
const _: () = assert!(core::mem::size_of::<TrapvecBlock>() == 8);
const _: () = assert!(core::mem::size_of::<TrapvecPatch>() == 48);
const _: () = assert!(core::mem::size_of::<TrapvecCheck>() == 32);
const _: () = assert!(core::mem::size_of::<TrapvecCheckMany>() == 16);
const _: () = assert!(core::mem::size_of::<TrapvecApply>() == 56);
const _: () = assert!(core::mem::size_of::<TrapvecDispatchEntry>() == 72);
const _: () = assert!(core::mem::size_of::<TrapvecTaskMatch>() == 40);
const _: () = assert!(core::mem::size_of::<TrapvecDispatchAdd>() == 16);
const _: () = assert!(core::mem::size_of::<TrapvecDispatchReplace>() == 24);
const _: () = assert!(core::mem::size_of::<TrapvecDispatchRemove>() == 16);
const _: () = assert!(core::mem::size_of::<TrapvecHits>() == 24);
const _: () = assert!(core::mem::size_of::<TrapvecListEntry>() == 88);
const _: () = assert!(core::mem::size_of::<TrapvecList>() == 24);
const _: () = assert!(core::mem::size_of::<TrapvecQuiesce>() == 32);
const _: () = assert!(core::mem::size_of::<TrapvecState>() == 32);

// Return points (ABI 5): `kmod/returns.c`.

/// Return points the module holds at once.
pub const TRAPVEC_RETURN_SLOTS: u32 = 256;
/// Calls with a pending return in the module, in all return points together.
pub const TRAPVEC_RETURN_INSTANCES: u32 = 4096;
/// Log2 buckets of a timer's histogram (as [`crate::returns::HISTOGRAM_BUCKETS`]).
pub const TRAPVEC_RETURN_BUCKETS: usize = 65;
/// No timer.
pub const TRAPVEC_CLOCK_NONE: u32 = 0;
/// A timer of elapsed time (`ktime_get_mono_fast_ns()`).
pub const TRAPVEC_CLOCK_WALL: u32 = 1;
/// A timer of the task's time on a CPU.
pub const TRAPVEC_CLOCK_CPU: u32 = 2;

/// `struct trapvec_return_add`: a slot for a new return point.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecReturnAdd {
    /// `void handler(struct trapvec_regs *, struct trapvec_call *)` in sealed code, or 0.
    pub handler: u64,
    pub cookie: u64,
    /// 1..=`TRAPVEC_RETURN_INSTANCES`.
    pub maxactive: u32,
    /// `TRAPVEC_CLOCK_*`.
    pub clock: u32,
    /// Out.
    pub slot: u32,
    /// Out.
    pub generation: u32,
    /// Out: the entry routine, the handler of the entry half.
    pub entry: u64,
    /// Out: the cookie of the entry half.
    pub entry_cookie: u64,
}

/// `struct trapvec_return_remove`: give a slot back (waits for CPUs in its return half).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecReturnRemove {
    pub slot: u32,
    pub generation: u32,
    /// Out, with `EBUSY`: CPUs still in the return half.
    pub busy: u64,
}

/// `struct trapvec_return_stats`: a live slot's counters, summed over CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrapvecReturnStats {
    pub slot: u32,
    pub generation: u32,
    pub returns: u64,
    pub missed: u64,
    pub active: u64,
    pub clock: u32,
    pub pad: u32,
    pub sum: u64,
    pub max: u64,
    pub buckets: [u64; TRAPVEC_RETURN_BUCKETS],
}

impl Default for TrapvecReturnStats {
    fn default() -> Self {
        TrapvecReturnStats {
            slot: 0,
            generation: 0,
            returns: 0,
            missed: 0,
            active: 0,
            clock: 0,
            pad: 0,
            sum: 0,
            max: 0,
            buckets: [0; TRAPVEC_RETURN_BUCKETS],
        }
    }
}

const _: () = assert!(core::mem::size_of::<TrapvecReturnAdd>() == 48);
const _: () = assert!(core::mem::size_of::<TrapvecReturnRemove>() == 16);
const _: () = assert!(core::mem::size_of::<TrapvecReturnStats>() == 576);

// Keyed counts (ABI 6): `kmod/keyed.c`.

/// Keyed counts the module holds at once.
pub const TRAPVEC_KEY_SLOTS: u32 = 64;
/// Keys per CPU per keyed count; hits of further keys are counted as overflow.
pub const TRAPVEC_KEY_TABLE: u32 = 256;
/// Bytes of a key (`TASK_COMM_LEN`).
pub const TRAPVEC_KEY_BYTES: usize = 16;
/// By `current->pid`.
pub const TRAPVEC_KEY_PID: u32 = 1;
/// By `current->tgid`.
pub const TRAPVEC_KEY_TGID: u32 = 2;
/// By `current->comm`.
pub const TRAPVEC_KEY_COMM: u32 = 3;
/// By the CPU.
pub const TRAPVEC_KEY_CPU: u32 = 4;

/// `struct trapvec_key_add`: a slot for a new keyed count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecKeyAdd {
    /// `TRAPVEC_KEY_*`.
    pub by: u32,
    /// Out.
    pub slot: u32,
    /// Out.
    pub generation: u32,
    pub pad: u32,
    /// Out: the counting routine, the handler of the splice.
    pub entry: u64,
    /// Out: the cookie of the splice.
    pub entry_cookie: u64,
}

/// `struct trapvec_key_remove`: give a slot back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecKeyRemove {
    pub slot: u32,
    pub generation: u32,
}

/// `struct trapvec_key_entry`: one key of KEY_STATS and its count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecKeyEntry {
    /// pid, tgid, cpu: the number in the first 8 bytes (native order); comm: the name,
    /// NUL-padded.
    pub key: [u8; TRAPVEC_KEY_BYTES],
    pub count: u64,
}

/// `struct trapvec_key_stats`: a live slot's table, merged over CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecKeyStats {
    pub slot: u32,
    pub generation: u32,
    /// User pointer to `capacity` [`TrapvecKeyEntry`].
    pub entries: u64,
    pub capacity: u32,
    /// Out: keys in the table (more than `capacity`: only `capacity` were copied).
    pub count: u32,
    /// Out: `TRAPVEC_KEY_*`.
    pub by: u32,
    pub pad: u32,
    /// Out: hits whose key found the table full.
    pub overflow: u64,
    /// Out: every key's count and the overflow.
    pub hits: u64,
}

const _: () = assert!(core::mem::size_of::<TrapvecKeyAdd>() == 32);
const _: () = assert!(core::mem::size_of::<TrapvecKeyRemove>() == 8);
const _: () = assert!(core::mem::size_of::<TrapvecKeyEntry>() == 24);
const _: () = assert!(core::mem::size_of::<TrapvecKeyStats>() == 48);

// Module watch (ABI 10): `kmod/modwatch.c`.

/// `trapvec_apply.flags`: patches for a module that is COMING (its load held for the watcher)
/// or live, taking no reference on it; the module's going reverts them.
pub const TRAPVEC_APPLY_DEFERRED: u32 = 1;
/// A module is coming: its symbols are listed, its init has not run.
pub const TRAPVEC_MODEVENT_COMING: u32 = 1;
/// A module is going: its exit has run, its text is not freed yet.
pub const TRAPVEC_MODEVENT_GOING: u32 = 2;
/// Bytes of a module name (`MODULE_NAME_LEN` on 64-bit), NUL included.
pub const TRAPVEC_MODNAME_LEN: usize = 56;

/// `struct trapvec_watch`: make this file the watcher.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecWatch {
    /// Must be 0.
    pub flags: u32,
    pub pad: u32,
}

/// `struct trapvec_modevent`: the next module event.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrapvecModevent {
    /// Out: the event's number, for MODACK.
    pub seq: u64,
    /// Out: `TRAPVEC_MODEVENT_*`.
    pub state: u32,
    /// In: how long to wait for an event.
    pub timeout_ms: u32,
    /// Out: the module's core text.
    pub text_base: u64,
    /// Out.
    pub text_size: u64,
    /// Out: the module's name, NUL-terminated.
    pub name: [u8; TRAPVEC_MODNAME_LEN],
}

impl Default for TrapvecModevent {
    fn default() -> Self {
        TrapvecModevent {
            seq: 0,
            state: 0,
            timeout_ms: 0,
            text_base: 0,
            text_size: 0,
            name: [0; TRAPVEC_MODNAME_LEN],
        }
    }
}

/// `struct trapvec_modack`: the watcher is done with an event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrapvecModack {
    pub seq: u64,
    /// 0, or (COMING only) a negative errno that refuses the module.
    pub error: i32,
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<TrapvecWatch>() == 8);
const _: () = assert!(core::mem::size_of::<TrapvecModevent>() == 88);
const _: () = assert!(core::mem::size_of::<TrapvecModack>() == 16);

/// `_IOWR(TRAPVEC_IOC_MAGIC, nr, T)` for an argument of `size` bytes (Linux asm-generic
/// encoding: direction in bits 30–31, size in 16–29, type in 8–15, number in 0–7).
const fn iowr(nr: u8, size: usize) -> u32 {
    const IOC_READ_WRITE: u32 = 3;
    assert!(size < 1 << 14, "_IOC_SIZEBITS is 14");
    // The assert above bounds `size`, so the cast keeps every bit.
    #[allow(clippy::cast_possible_truncation)]
    let size = size as u32;
    (IOC_READ_WRITE << 30) | (size << 16) | ((TRAPVEC_IOC_MAGIC as u32) << 8) | nr as u32
}

pub const TRAPVEC_IOC_INFO: u32 = iowr(0, core::mem::size_of::<TrapvecInfo>());
pub const TRAPVEC_IOC_READ: u32 = iowr(1, core::mem::size_of::<TrapvecRead>());
pub const TRAPVEC_IOC_ALLOC: u32 = iowr(2, core::mem::size_of::<TrapvecAlloc>());
pub const TRAPVEC_IOC_WRITE: u32 = iowr(3, core::mem::size_of::<TrapvecWrite>());
pub const TRAPVEC_IOC_SEAL: u32 = iowr(4, core::mem::size_of::<TrapvecBlock>());
pub const TRAPVEC_IOC_FREE: u32 = iowr(5, core::mem::size_of::<TrapvecBlock>());
pub const TRAPVEC_IOC_CHECK: u32 = iowr(6, core::mem::size_of::<TrapvecCheck>());
pub const TRAPVEC_IOC_APPLY: u32 = iowr(7, core::mem::size_of::<TrapvecApply>());
pub const TRAPVEC_IOC_DISPATCH_ADD: u32 = iowr(8, core::mem::size_of::<TrapvecDispatchAdd>());
pub const TRAPVEC_IOC_DISPATCH_REMOVE: u32 = iowr(9, core::mem::size_of::<TrapvecDispatchRemove>());
pub const TRAPVEC_IOC_HITS: u32 = iowr(10, core::mem::size_of::<TrapvecHits>());
pub const TRAPVEC_IOC_DISPATCH_REPLACE: u32 =
    iowr(15, core::mem::size_of::<TrapvecDispatchReplace>());
pub const TRAPVEC_IOC_CHECK_MANY: u32 = iowr(16, core::mem::size_of::<TrapvecCheckMany>());
pub const TRAPVEC_IOC_LIST: u32 = iowr(11, core::mem::size_of::<TrapvecList>());
pub const TRAPVEC_IOC_LIST_HIT: u32 = iowr(17, core::mem::size_of::<TrapvecList>());
pub const TRAPVEC_IOC_QUIESCE: u32 = iowr(12, core::mem::size_of::<TrapvecQuiesce>());
pub const TRAPVEC_IOC_STATE_GET: u32 = iowr(13, core::mem::size_of::<TrapvecState>());
pub const TRAPVEC_IOC_STATE_PUT: u32 = iowr(14, core::mem::size_of::<TrapvecState>());
pub const TRAPVEC_IOC_RETURN_ADD: u32 = iowr(32, core::mem::size_of::<TrapvecReturnAdd>());
pub const TRAPVEC_IOC_RETURN_REMOVE: u32 = iowr(33, core::mem::size_of::<TrapvecReturnRemove>());
pub const TRAPVEC_IOC_RETURN_STATS: u32 = iowr(34, core::mem::size_of::<TrapvecReturnStats>());
pub const TRAPVEC_IOC_KEY_ADD: u32 = iowr(35, core::mem::size_of::<TrapvecKeyAdd>());
pub const TRAPVEC_IOC_KEY_REMOVE: u32 = iowr(36, core::mem::size_of::<TrapvecKeyRemove>());
pub const TRAPVEC_IOC_KEY_STATS: u32 = iowr(37, core::mem::size_of::<TrapvecKeyStats>());
pub const TRAPVEC_IOC_WATCH: u32 = iowr(48, core::mem::size_of::<TrapvecWatch>());
pub const TRAPVEC_IOC_MODEVENT: u32 = iowr(49, core::mem::size_of::<TrapvecModevent>());
pub const TRAPVEC_IOC_MODACK: u32 = iowr(50, core::mem::size_of::<TrapvecModack>());
