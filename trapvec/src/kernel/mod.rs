//! The kernel backend: the running kernel as a [`Target`], through `/dev/trapvec` (`kmod/`).
//!
//! - `ioctl`: the one function every request to the module goes through (the seam unit tests
//!   replace);
//! - [`kallsyms`]: symbols from `/proc/kallsyms`.
//!
//! This module turns the [`Target`] contract into ioctls and the module's answers into
//! [`TargetError`]s: a text batch becomes one APPLY (all or nothing in the module), a refused
//! site becomes [`TargetError::SiteRefused`] with the module's [`SiteRefusal`], a mismatch
//! becomes [`TargetError::TextMismatch`] with the bytes the module found. Repository memory is
//! the module's arena (1 MiB of code in its own text, 1 MiB of data in its `.bss`), which lies
//! within ±2 GiB of all kernel text; each block is checked against `near` all the same.
//!
//! The dispatcher runs `call` handlers itself, with interrupts off and reentry detection, and
//! counts hits per site; kernel code has no red zone and does not use vector registers; traced
//! functions begin with the ftrace `__fentry__` site, which the module refuses to overlap.

pub(crate) mod ioctl;
pub mod kallsyms;
pub mod modwatch;
mod slots;

/// A LIST entry as the backend gives it.
fn listed(e: &TrapvecListEntry) -> ListedEntry {
    ListedEntry {
        entry: DispatchEntry {
            site: e.site,
            dest: e.dest,
            handler: e.handler,
            cookie: e.cookie,
            only: e.only.to_match(),
        },
        hits: TrapHits {
            hits: e.hits,
            missed: e.missed,
        },
    }
}

#[cfg(test)]
mod tests;

use std::fs::OpenOptions;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use thiserror::Error;

use crate::abi::{
    TrapvecAlloc, TrapvecApply, TrapvecBlock, TrapvecCheck, TrapvecCheckMany, TrapvecDispatchAdd,
    TrapvecDispatchEntry, TrapvecDispatchRemove, TrapvecDispatchReplace, TrapvecHits, TrapvecInfo,
    TrapvecKeyAdd, TrapvecKeyEntry, TrapvecKeyRemove, TrapvecKeyStats, TrapvecList,
    TrapvecListEntry, TrapvecPatch, TrapvecQuiesce, TrapvecRead, TrapvecReturnAdd,
    TrapvecReturnRemove, TrapvecReturnStats, TrapvecState, TrapvecTaskMatch, TrapvecWrite,
    TRAPVEC_ABI_VERSION, TRAPVEC_BATCH_MAX, TRAPVEC_BLOCK_CODE, TRAPVEC_BLOCK_DATA,
    TRAPVEC_CHECK_NO_KPROBE, TRAPVEC_CLOCK_CPU, TRAPVEC_CLOCK_NONE, TRAPVEC_CLOCK_WALL,
    TRAPVEC_KEY_COMM, TRAPVEC_KEY_CPU, TRAPVEC_KEY_PID, TRAPVEC_KEY_SLOTS, TRAPVEC_KEY_TABLE,
    TRAPVEC_KEY_TGID, TRAPVEC_NO_INDEX, TRAPVEC_PATCH_MAX, TRAPVEC_READ_ORIGINAL,
    TRAPVEC_REASON_ALTERNATIVE, TRAPVEC_REASON_BAD_LENGTH, TRAPVEC_REASON_BPF_TEXT,
    TRAPVEC_REASON_BUG_ENTRY, TRAPVEC_REASON_CPUIDLE_TEXT, TRAPVEC_REASON_CROSSES_SYMBOL,
    TRAPVEC_REASON_ENTRY_TEXT, TRAPVEC_REASON_EXTABLE, TRAPVEC_REASON_EXTABLE_FIXUP,
    TRAPVEC_REASON_FOREIGN_TRAP, TRAPVEC_REASON_FTRACE, TRAPVEC_REASON_FTRACE_TRAMPOLINE,
    TRAPVEC_REASON_JUMP_LABEL, TRAPVEC_REASON_JUMP_TARGET, TRAPVEC_REASON_KPROBE,
    TRAPVEC_REASON_KPROBE_BLACKLIST, TRAPVEC_REASON_KPROBE_REFUSED, TRAPVEC_REASON_KPROBE_SLOT,
    TRAPVEC_REASON_LIVE_PATCH, TRAPVEC_REASON_LOCKDOWN, TRAPVEC_REASON_MISMATCH,
    TRAPVEC_REASON_MODULES_DISABLED, TRAPVEC_REASON_MODULE_INIT, TRAPVEC_REASON_NOINSTR_TEXT,
    TRAPVEC_REASON_NONE, TRAPVEC_REASON_NOT_A_JUMP, TRAPVEC_REASON_NOT_BOUNDARY,
    TRAPVEC_REASON_NOT_TEXT, TRAPVEC_REASON_NO_DISPATCH, TRAPVEC_REASON_OWN_MODULE,
    TRAPVEC_REASON_RETURN_IN_WINDOW, TRAPVEC_REASON_STATIC_CALL, TRAPVEC_REASON_STATIC_CALL_TRAMP,
    TRAPVEC_REASON_THUNK, TRAPVEC_RETURN_INSTANCES, TRAPVEC_RETURN_SLOTS, TRAPVEC_STATE_MAX,
    TRAPVEC_XFER_MAX,
};
use crate::error::{hex, TargetError};
use crate::target::{
    BlockKind, DispatchChange, DispatchEntry, DispatchRead, DispatchReading, ReplaceCounters,
    RepoBlock, SymbolTable, Target, TargetInfo, TaskFields, TextPatch, TrapHits,
};
use ioctl::Request;

/// The module's device.
pub const DEVICE_PATH: &str = "/dev/trapvec";
/// Where kernel symbols come from.
pub const KALLSYMS_PATH: &str = "/proc/kallsyms";

/// Farthest a byte of a block may lie from `near` for `rel32` to reach it both ways.
const REACH: u64 = i32::MAX as u64;

/// `sizeof(struct jump_entry)` with relative entries (x86-64): `s32 code, s32 target, s64 key`.
const JUMP_ENTRY_SIZE: usize = 16;
/// `sizeof(struct exception_table_entry)` (x86-64): `s32 insn, s32 fixup, s32 data`.
const EXTABLE_ENTRY_SIZE: usize = 12;

/// The address a kernel table's `s32` field at `field` points at (it is relative to itself).
fn relative(field: u64, bytes: &[u8]) -> u64 {
    let rel = bytes.try_into().map_or(0, i32::from_le_bytes);
    field.wrapping_add_signed(i64::from(rel))
}

/// As [`relative`], for an `s64` field.
fn relative64(field: u64, bytes: &[u8]) -> u64 {
    let rel = bytes.try_into().map_or(0, i64::from_le_bytes);
    field.wrapping_add_signed(rel)
}

/// Where kernel lockdown's mode is shown (`none [integrity] confidentiality`).
pub const LOCKDOWN_PATH: &str = "/sys/kernel/security/lockdown";
/// `kernel.modules_disabled`.
pub const MODULES_DISABLED_PATH: &str = "/proc/sys/kernel/modules_disabled";

/// What a refusal says of a culprit the module did not give (or that could not be read).
const UNSAID: &str = "an address the module did not say";

/// Why the module refuses to patch a site (`TRAPVEC_REASON_*` in `kmod/trapvec_abi.h`).
///
/// One variant per reason of the header's `TRAPVEC_REASONS()` list but `NONE`, named as the
/// reason is (`KPROBE_REFUSED` -> `KprobeRefused`), plus `Unknown` and `CheckFailed`, which are
/// no verdict of the module; tests/abi_layout.rs holds the variants, [`SiteRefusal::from_abi`]
/// and [`SiteRefusal::code`] to that list.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SiteRefusal {
    #[error("a patch must be 1 to {TRAPVEC_PATCH_MAX} bytes long")]
    BadLength,
    #[error("not kernel text nor the text of a live module")]
    NotText,
    #[error("inside trapvec.ko itself")]
    OwnModule,
    #[error("in entry text (__entry_text_start..__entry_text_end)")]
    EntryText,
    #[error("in noinstr text, where RCU may not be watching")]
    NoinstrText,
    #[error("in the retpoline/return thunks, which the trap path itself runs through")]
    Thunk,
    #[error("in a function on the kprobes blacklist")]
    KprobeBlacklist,
    #[error("overlaps an ftrace __fentry__ site (a point at a function's entry goes past it)")]
    Ftrace,
    #[error("overlaps a jump label (static key) site, which the kernel rewrites by itself")]
    JumpLabel,
    #[error("overlaps a static call site, which the kernel rewrites by itself")]
    StaticCall,
    #[error("overlaps a BUG()/WARN() trap instruction")]
    BugEntry,
    #[error(
        "an instruction with an exception-table entry (its fix-up would not follow it out of line)"
    )]
    Extable,
    #[error("not an instruction boundary of its function")]
    NotBoundary,
    #[error("runs into the next symbol")]
    CrossesSymbol,
    #[error("register_kprobe() refuses it: {errno}")]
    KprobeRefused { errno: Errno },
    #[error("overlaps a live patch, or another patch of the same batch")]
    LivePatch,
    #[error("the text does not hold the expected bytes")]
    Mismatch,
    #[error("overlaps an SMP lock prefix, which the kernel rewrites by itself")]
    Alternative,
    /// `at` is the probe's address, `place` the same as `symbol+offset` (or hex).
    #[error("a kprobe is registered at {place}: remove it first")]
    Kprobe { at: u64, place: String },
    #[error("in .cpuidle.text, where RCU is not watching")]
    CpuidleText,
    #[error("a static call trampoline (__SCT__*), which the kernel rewrites by itself")]
    StaticCallTramp,
    #[error("a kprobe instruction slot, which kprobes own")]
    KprobeSlot,
    #[error("a BPF JIT image, which the BPF subsystem owns")]
    BpfText,
    #[error("an ftrace trampoline, which ftrace owns")]
    FtraceTrampoline,
    #[error("a module's init text, freed once its init returns")]
    ModuleInit,
    /// `mode` as `/sys/kernel/security/lockdown` shows it.
    #[error("kernel lockdown ({mode}) forbids writing kernel text")]
    Lockdown { mode: String },
    #[error("kernel.modules_disabled=1 forbids writing kernel text")]
    ModulesDisabled,
    #[error(
        "a trap with no dispatch entry for its site (it would be taken for a spurious interrupt)"
    )]
    NoDispatch,
    #[error("an int instruction of another vector than trapvec.ko's (the program and the module disagree on the vector)")]
    ForeignTrap,
    #[error("a call inside the window is not its last instruction: its return address would point into the new bytes")]
    ReturnInWindow,
    #[error("the window covers several instructions and its new bytes begin with neither a trap nor a jmp, which the module cannot stand in for while it writes them")]
    NotAJump,
    /// The CPU jumps to `at` (`function+0x1c`) when static key `key` (`symbol+offset`) flips,
    /// through a jump-label site no decoder sees as a branch.
    #[error("jump-label target of static key {key} at {at} inside the window")]
    JumpTarget { key: String, at: String },
    /// A fault at `insn` (`function+0x..`) resumes at the fix-up `at`.
    #[error("exception fixup of {insn} at {at} inside the window")]
    ExtableFixup { insn: String, at: String },
    /// In `function`, which a CPU going offline runs after `rcu_report_dead()`.
    #[error("in {function}, which a CPU going offline runs after rcu_report_dead(): no RCU grace period waits for that CPU, and a dead CPU loops there outside the writer's stop_machine()")]
    DeadCpu { function: String },
    #[error("the window covers an endbr64: with indirect branch tracking (IBT) every indirect call or jmp must land on it, so it stays where it is (a point past it, such as the function's entry past endbr64 and its ftrace nop, is accepted)")]
    Endbr,
    #[error("refused for reason {code}, which this version of trapvec does not know")]
    Unknown { code: u32 },
    #[error("the site could not be checked: CHECK failed with {errno}")]
    CheckFailed { errno: Errno },
}

impl SiteRefusal {
    /// The refusal behind a module answer (`reason`, and the negative errno in `error`);
    /// `None` when the site was accepted.
    pub fn from_abi(reason: u32, error: i32) -> Option<SiteRefusal> {
        Some(match reason {
            TRAPVEC_REASON_NONE => return None,
            TRAPVEC_REASON_BAD_LENGTH => SiteRefusal::BadLength,
            TRAPVEC_REASON_NOT_TEXT => SiteRefusal::NotText,
            TRAPVEC_REASON_OWN_MODULE => SiteRefusal::OwnModule,
            TRAPVEC_REASON_ENTRY_TEXT => SiteRefusal::EntryText,
            TRAPVEC_REASON_NOINSTR_TEXT => SiteRefusal::NoinstrText,
            TRAPVEC_REASON_THUNK => SiteRefusal::Thunk,
            TRAPVEC_REASON_KPROBE_BLACKLIST => SiteRefusal::KprobeBlacklist,
            TRAPVEC_REASON_FTRACE => SiteRefusal::Ftrace,
            TRAPVEC_REASON_JUMP_LABEL => SiteRefusal::JumpLabel,
            TRAPVEC_REASON_STATIC_CALL => SiteRefusal::StaticCall,
            TRAPVEC_REASON_BUG_ENTRY => SiteRefusal::BugEntry,
            TRAPVEC_REASON_EXTABLE => SiteRefusal::Extable,
            TRAPVEC_REASON_NOT_BOUNDARY => SiteRefusal::NotBoundary,
            TRAPVEC_REASON_CROSSES_SYMBOL => SiteRefusal::CrossesSymbol,
            TRAPVEC_REASON_KPROBE_REFUSED => SiteRefusal::KprobeRefused {
                errno: Errno::from_raw(-error),
            },
            TRAPVEC_REASON_LIVE_PATCH => SiteRefusal::LivePatch,
            TRAPVEC_REASON_MISMATCH => SiteRefusal::Mismatch,
            TRAPVEC_REASON_ALTERNATIVE => SiteRefusal::Alternative,
            TRAPVEC_REASON_KPROBE => SiteRefusal::Kprobe {
                at: 0,
                place: "an address the module did not say".into(),
            },
            TRAPVEC_REASON_CPUIDLE_TEXT => SiteRefusal::CpuidleText,
            TRAPVEC_REASON_STATIC_CALL_TRAMP => SiteRefusal::StaticCallTramp,
            TRAPVEC_REASON_KPROBE_SLOT => SiteRefusal::KprobeSlot,
            TRAPVEC_REASON_BPF_TEXT => SiteRefusal::BpfText,
            TRAPVEC_REASON_FTRACE_TRAMPOLINE => SiteRefusal::FtraceTrampoline,
            TRAPVEC_REASON_MODULE_INIT => SiteRefusal::ModuleInit,
            TRAPVEC_REASON_LOCKDOWN => SiteRefusal::Lockdown {
                mode: lockdown_mode(),
            },
            TRAPVEC_REASON_MODULES_DISABLED => SiteRefusal::ModulesDisabled,
            TRAPVEC_REASON_NO_DISPATCH => SiteRefusal::NoDispatch,
            TRAPVEC_REASON_FOREIGN_TRAP => SiteRefusal::ForeignTrap,
            TRAPVEC_REASON_RETURN_IN_WINDOW => SiteRefusal::ReturnInWindow,
            TRAPVEC_REASON_NOT_A_JUMP => SiteRefusal::NotAJump,
            TRAPVEC_REASON_JUMP_TARGET => SiteRefusal::JumpTarget {
                key: UNSAID.into(),
                at: UNSAID.into(),
            },
            TRAPVEC_REASON_EXTABLE_FIXUP => SiteRefusal::ExtableFixup {
                insn: UNSAID.into(),
                at: UNSAID.into(),
            },
            crate::abi::TRAPVEC_REASON_DEAD_CPU => SiteRefusal::DeadCpu {
                function: UNSAID.into(),
            },
            crate::abi::TRAPVEC_REASON_ENDBR => SiteRefusal::Endbr,
            code => SiteRefusal::Unknown { code },
        })
    }

    /// The module's reason code (`None` for refusals that are not the module's verdict).
    pub fn code(&self) -> Option<u32> {
        Some(match self {
            SiteRefusal::BadLength => TRAPVEC_REASON_BAD_LENGTH,
            SiteRefusal::NotText => TRAPVEC_REASON_NOT_TEXT,
            SiteRefusal::OwnModule => TRAPVEC_REASON_OWN_MODULE,
            SiteRefusal::EntryText => TRAPVEC_REASON_ENTRY_TEXT,
            SiteRefusal::NoinstrText => TRAPVEC_REASON_NOINSTR_TEXT,
            SiteRefusal::Thunk => TRAPVEC_REASON_THUNK,
            SiteRefusal::KprobeBlacklist => TRAPVEC_REASON_KPROBE_BLACKLIST,
            SiteRefusal::Ftrace => TRAPVEC_REASON_FTRACE,
            SiteRefusal::JumpLabel => TRAPVEC_REASON_JUMP_LABEL,
            SiteRefusal::StaticCall => TRAPVEC_REASON_STATIC_CALL,
            SiteRefusal::BugEntry => TRAPVEC_REASON_BUG_ENTRY,
            SiteRefusal::Extable => TRAPVEC_REASON_EXTABLE,
            SiteRefusal::NotBoundary => TRAPVEC_REASON_NOT_BOUNDARY,
            SiteRefusal::CrossesSymbol => TRAPVEC_REASON_CROSSES_SYMBOL,
            SiteRefusal::KprobeRefused { .. } => TRAPVEC_REASON_KPROBE_REFUSED,
            SiteRefusal::LivePatch => TRAPVEC_REASON_LIVE_PATCH,
            SiteRefusal::Mismatch => TRAPVEC_REASON_MISMATCH,
            SiteRefusal::Alternative => TRAPVEC_REASON_ALTERNATIVE,
            SiteRefusal::Kprobe { .. } => TRAPVEC_REASON_KPROBE,
            SiteRefusal::CpuidleText => TRAPVEC_REASON_CPUIDLE_TEXT,
            SiteRefusal::StaticCallTramp => TRAPVEC_REASON_STATIC_CALL_TRAMP,
            SiteRefusal::KprobeSlot => TRAPVEC_REASON_KPROBE_SLOT,
            SiteRefusal::BpfText => TRAPVEC_REASON_BPF_TEXT,
            SiteRefusal::FtraceTrampoline => TRAPVEC_REASON_FTRACE_TRAMPOLINE,
            SiteRefusal::ModuleInit => TRAPVEC_REASON_MODULE_INIT,
            SiteRefusal::Lockdown { .. } => TRAPVEC_REASON_LOCKDOWN,
            SiteRefusal::ModulesDisabled => TRAPVEC_REASON_MODULES_DISABLED,
            SiteRefusal::NoDispatch => TRAPVEC_REASON_NO_DISPATCH,
            SiteRefusal::ForeignTrap => TRAPVEC_REASON_FOREIGN_TRAP,
            SiteRefusal::ReturnInWindow => TRAPVEC_REASON_RETURN_IN_WINDOW,
            SiteRefusal::NotAJump => TRAPVEC_REASON_NOT_A_JUMP,
            SiteRefusal::JumpTarget { .. } => TRAPVEC_REASON_JUMP_TARGET,
            SiteRefusal::ExtableFixup { .. } => TRAPVEC_REASON_EXTABLE_FIXUP,
            SiteRefusal::DeadCpu { .. } => crate::abi::TRAPVEC_REASON_DEAD_CPU,
            SiteRefusal::Endbr => crate::abi::TRAPVEC_REASON_ENDBR,
            SiteRefusal::Unknown { code } => *code,
            SiteRefusal::CheckFailed { .. } => return None,
        })
    }

    /// The refusal as one sentence that is the same for every site it refuses: its message,
    /// without the details that differ from one site to the next (the probe's place, the
    /// static key, the errno).
    pub fn summary(&self) -> String {
        match self {
            SiteRefusal::KprobeRefused { .. } => "register_kprobe() refuses it".into(),
            SiteRefusal::Kprobe { .. } => "a kprobe is registered there: remove it first".into(),
            SiteRefusal::Lockdown { .. } => "kernel lockdown forbids writing kernel text".into(),
            SiteRefusal::JumpTarget { .. } => {
                "a static key's jump-label target is inside the window".into()
            }
            SiteRefusal::ExtableFixup { .. } => "an exception fixup is inside the window".into(),
            SiteRefusal::DeadCpu { .. } => "in a function that a CPU going offline runs after \
                                            rcu_report_dead()"
                .into(),
            SiteRefusal::Unknown { .. } => {
                "refused for a reason this version of trapvec does not know".into()
            }
            SiteRefusal::CheckFailed { .. } => "the site could not be checked".into(),
            other => other.to_string(),
        }
    }

    /// The refusal's kind in snake_case (`jump_label`, `kprobe_blacklist`), the same for every
    /// site it refuses whatever the details (the probe's place, the errno).
    pub fn name(&self) -> &'static str {
        match self {
            SiteRefusal::BadLength => "bad_length",
            SiteRefusal::NotText => "not_text",
            SiteRefusal::OwnModule => "own_module",
            SiteRefusal::EntryText => "entry_text",
            SiteRefusal::NoinstrText => "noinstr_text",
            SiteRefusal::Thunk => "thunk",
            SiteRefusal::KprobeBlacklist => "kprobe_blacklist",
            SiteRefusal::Ftrace => "ftrace",
            SiteRefusal::JumpLabel => "jump_label",
            SiteRefusal::StaticCall => "static_call",
            SiteRefusal::BugEntry => "bug_entry",
            SiteRefusal::Extable => "extable",
            SiteRefusal::NotBoundary => "not_boundary",
            SiteRefusal::CrossesSymbol => "crosses_symbol",
            SiteRefusal::KprobeRefused { .. } => "kprobe_refused",
            SiteRefusal::LivePatch => "live_patch",
            SiteRefusal::Mismatch => "mismatch",
            SiteRefusal::Alternative => "alternative",
            SiteRefusal::Kprobe { .. } => "kprobe",
            SiteRefusal::CpuidleText => "cpuidle_text",
            SiteRefusal::StaticCallTramp => "static_call_tramp",
            SiteRefusal::KprobeSlot => "kprobe_slot",
            SiteRefusal::BpfText => "bpf_text",
            SiteRefusal::FtraceTrampoline => "ftrace_trampoline",
            SiteRefusal::ModuleInit => "module_init",
            SiteRefusal::Lockdown { .. } => "lockdown",
            SiteRefusal::ModulesDisabled => "modules_disabled",
            SiteRefusal::NoDispatch => "no_dispatch",
            SiteRefusal::ForeignTrap => "foreign_trap",
            SiteRefusal::ReturnInWindow => "return_in_window",
            SiteRefusal::NotAJump => "not_a_jump",
            SiteRefusal::JumpTarget { .. } => "jump_target",
            SiteRefusal::ExtableFixup { .. } => "extable_fixup",
            SiteRefusal::DeadCpu { .. } => "dead_cpu",
            SiteRefusal::Endbr => "endbr",
            SiteRefusal::Unknown { .. } => "unknown",
            SiteRefusal::CheckFailed { .. } => "check_failed",
        }
    }
}

/// Lockdown's mode from [`LOCKDOWN_PATH`] (the bracketed word), or `"integrity"`, the least
/// mode that forbids writing kernel memory, when it cannot be read.
fn lockdown_mode() -> String {
    let text = std::fs::read_to_string(LOCKDOWN_PATH).unwrap_or_default();
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .filter(|m| *m != "none")
        .unwrap_or("integrity")
        .to_owned()
}

/// Whether kernel lockdown is on (any mode forbids writing kernel memory).
fn locked_down() -> bool {
    std::fs::read_to_string(LOCKDOWN_PATH).is_ok_and(|t| {
        t.split_whitespace()
            .any(|w| w.starts_with('[') && w != "[none]")
    })
}

/// Whether lockdown or kernel.modules_disabled forbids the module to write kernel memory now.
fn writes_forbidden() -> bool {
    locked_down() || std::fs::read_to_string(MODULES_DISABLED_PATH).is_ok_and(|t| t.trim() == "1")
}

/// Why the module answered EPERM to ALLOC or WRITE (after the capability check, which INFO
/// passed): lockdown, else kernel.modules_disabled (the order in which the module asks).
fn write_forbidden(op: &str) -> TargetError {
    let why = if locked_down() {
        SiteRefusal::Lockdown {
            mode: lockdown_mode(),
        }
    } else {
        SiteRefusal::ModulesDisabled
    };
    TargetError::Other(format!("{why} ({op} of {DEVICE_PATH}: EPERM)"))
}

/// What the module reports about itself (INFO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub vector: u32,
    /// The gate's entry stub.
    pub entry: u64,
    /// The gate's handler before the module was loaded (the kernel's spurious entry).
    pub old_handler: u64,
    /// The gate's handler now; equal to `entry` while the module is loaded.
    pub gate_handler: u64,
    pub code_arena: Range<u64>,
    pub data_arena: Range<u64>,
    /// The module's core image (refused as a site).
    pub module: Range<u64>,
    pub code_used: u64,
    pub data_used: u64,
    pub live_patches: u64,
    pub dispatch_entries: u64,
    /// Traps at no known site, chained to the old handler.
    pub unknown_traps: u64,
    /// Traps at a site whose trap had just been removed, sent back to run the original.
    pub retried_traps: u64,
}

impl From<&TrapvecInfo> for ModuleInfo {
    fn from(i: &TrapvecInfo) -> Self {
        ModuleInfo {
            vector: i.vector,
            entry: i.entry,
            old_handler: i.old_handler,
            gate_handler: i.gate_handler,
            code_arena: i.code_base..i.code_base + i.code_size,
            data_arena: i.data_base..i.data_base + i.data_size,
            module: i.module_base..i.module_base + i.module_size,
            code_used: i.code_used,
            data_used: i.data_used,
            live_patches: i.live_patches,
            dispatch_entries: i.dispatch_entries,
            unknown_traps: i.unknown_traps,
            retried_traps: i.retried_traps,
        }
    }
}

/// User space's state blob as the module keeps it (STATE_GET).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateBlob {
    /// Incremented by every STATE_PUT since the module was loaded (0: never written).
    pub generation: u64,
    /// The bytes (empty when none were put).
    pub bytes: Vec<u8>,
}

/// One live dispatch entry with its counters (LIST).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListedEntry {
    pub entry: DispatchEntry,
    pub hits: TrapHits,
}

/// The module's arena granule (`TRAPVEC_ARENA_GRAIN`): one in-flight counter per granule.
const INFLIGHT_GRAIN: u64 = 16;

/// The running kernel, modified through trapvec.ko.
pub struct KernelTarget {
    dev: OwnedFd,
    info: TargetInfo,
    symbols: SymbolTable,
    /// Where code finds the running task's fields (INFO's `current_task` and offsets).
    task: crate::predicate::TaskLayout,
    /// Text batches are APPLYed with `TRAPVEC_APPLY_DEFERRED` ([`KernelTarget::set_deferred`]).
    deferred: bool,
    /// The module answered CHECK_MANY with `ENOTTY` or `EINVAL` (an older trapvec.ko, from
    /// DKMS): windows are checked one CHECK each from then on.
    no_check_many: std::sync::atomic::AtomicBool,
}

/// Most windows of one CHECK_MANY ([`KernelTarget::precheck_sites`]): 512 KiB of answers, and
/// the module's locks held for a bounded time.
pub const CHECK_MANY_CHUNK: usize = 16_384;

impl KernelTarget {
    /// Open `/dev/trapvec` and read `/proc/kallsyms` (both need root).
    pub fn open() -> Result<Self, TargetError> {
        Self::open_at(Path::new(DEVICE_PATH), Path::new(KALLSYMS_PATH))
    }

    /// Open the module's device at `device` and read symbols from `kallsyms`.
    pub fn open_at(device: &Path, kallsyms: &Path) -> Result<Self, TargetError> {
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .map_err(|e| {
                TargetError::os(
                    format!(
                        "opening {} (is trapvec.ko loaded, and are you root?)",
                        device.display()
                    ),
                    e,
                )
            })?;
        let text = std::fs::read_to_string(kallsyms)
            .map_err(|e| TargetError::os(format!("reading {}", kallsyms.display()), e))?;
        Self::from_parts(dev.into(), &text)
    }

    /// A target from an open device and the text of kallsyms: asks the module who it is.
    fn from_parts(dev: OwnedFd, kallsyms_text: &str) -> Result<Self, TargetError> {
        let mut raw = TrapvecInfo::default();
        ioctl::ioctl(dev.as_fd(), Request::Info(&mut raw))
            .map_err(|e| TargetError::os("INFO of /dev/trapvec", e))?;
        if raw.abi_version != TRAPVEC_ABI_VERSION {
            return Err(TargetError::Other(format!(
                "trapvec.ko speaks ioctl ABI version {}, this program speaks {TRAPVEC_ABI_VERSION}: build both from the same tree",
                raw.abi_version
            )));
        }
        let symbols = kallsyms::parse(kallsyms_text).map_err(|source| TargetError::Kallsyms {
            path: KALLSYMS_PATH,
            source,
        })?;
        // The module validates its parameter; a vector that is no system vector here means a
        // module this program does not understand.
        let trap_vector = u8::try_from(raw.vector)
            .ok()
            .filter(|&v| v >= 0x20)
            .ok_or_else(|| {
                TargetError::Other(format!(
                    "trapvec.ko reports trap vector {:#x}, which is not a system vector",
                    raw.vector
                ))
            })?;
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let info = TargetInfo {
            // INFO's code arena, in-flight counters and `trapvec_replace_ret` (fixed while
            // the module is loaded).
            replace_counters: (raw.inflight_base != 0).then_some(ReplaceCounters {
                code_base: raw.code_base,
                code_size: raw.code_size,
                grain: INFLIGHT_GRAIN,
                counters: raw.inflight_base,
                exit: raw.replace_ret,
            }),
            // A guard reads `gs:[current_task]` and compares the task's fields.
            task_fields: TaskFields::Known(Self::task_layout(&raw)),
            ..TargetInfo::kernel(
                format!(
                    "kernel {} (trapvec.ko, vector {:#x})",
                    release.trim(),
                    raw.vector
                ),
                trap_vector,
            )
        };
        log::debug!(
            "kernel target: {}, {} symbols, code arena {:#x}+{:#x}",
            info.description,
            symbols.len(),
            raw.code_base,
            raw.code_size
        );
        Ok(KernelTarget {
            dev,
            info,
            symbols: SymbolTable::new(symbols),
            task: Self::task_layout(&raw),
            deferred: false,
            no_check_many: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The running task's fields as INFO gives them: `gs:[current_task]`, then `pid`, `tgid`
    /// (a thread id is the kernel's `pid`: `tid` reads it too) and `comm` at their offsets.
    fn task_layout(raw: &TrapvecInfo) -> crate::predicate::TaskLayout {
        let off = |o: u32| i32::try_from(o).ok();
        crate::predicate::TaskLayout {
            base: crate::predicate::TaskBase::CurrentTask {
                per_cpu: raw.current_task,
            },
            tid: off(raw.task_pid),
            pid: off(raw.task_pid),
            tgid: off(raw.task_tgid),
            comm: off(raw.task_comm),
        }
    }

    /// READ `len` bytes at `addr` with `flags` (`TRAPVEC_READ_*`), `TRAPVEC_XFER_MAX` at a time.
    fn read_with(&self, addr: u64, len: usize, flags: u32) -> Result<Vec<u8>, TargetError> {
        let mut out = vec![0u8; len];
        for (i, chunk) in out.chunks_mut(TRAPVEC_XFER_MAX as usize).enumerate() {
            let at = addr + (i * TRAPVEC_XFER_MAX as usize) as u64;
            let mut arg = TrapvecRead {
                addr: at,
                flags,
                ..Default::default()
            };
            self.call(Request::Read {
                arg: &mut arg,
                buf: chunk,
            })
            .map_err(|e| TargetError::Read {
                addr: at,
                len: chunk.len(),
                reason: format!("READ: {e}"),
            })?;
        }
        Ok(out)
    }

    fn call(&self, req: Request<'_>) -> Result<(), Errno> {
        ioctl::ioctl(self.dev.as_fd(), req)
    }

    /// From now on, text batches are deferred patches (`TRAPVEC_APPLY_DEFERRED`): allowed in a
    /// module whose load the module watch holds for its watcher ([`modwatch`]), taking no
    /// reference on the module, reverted by the kernel itself if the module goes with them.
    /// The watcher sets this while it arms a coming module and clears it after.
    pub fn set_deferred(&mut self, on: bool) {
        self.deferred = on;
    }

    /// Read `/proc/kallsyms` again: a module that came (or went) since the target was opened
    /// has its symbols listed (or no more).
    pub fn refresh_symbols(&mut self) -> Result<(), TargetError> {
        let text = std::fs::read_to_string(KALLSYMS_PATH)
            .map_err(|e| TargetError::os(format!("reading {KALLSYMS_PATH}"), e))?;
        let symbols = kallsyms::parse(&text).map_err(|source| TargetError::Kallsyms {
            path: KALLSYMS_PATH,
            source,
        })?;
        log::debug!("kernel target: {} symbols after a refresh", symbols.len());
        self.symbols = SymbolTable::new(symbols);
        Ok(())
    }

    /// Where code finds the running task's fields (INFO's `current_task` and offsets), for
    /// code generated outside the splicer (`trapctl trace`'s kernel programs).
    pub fn task_fields(&self) -> crate::predicate::TaskLayout {
        self.task
    }

    /// What the module reports now.
    pub fn module_info(&self) -> Result<ModuleInfo, TargetError> {
        let mut raw = TrapvecInfo::default();
        self.call(Request::Info(&mut raw))
            .map_err(|e| TargetError::os("INFO of /dev/trapvec", e))?;
        Ok(ModuleInfo::from(&raw))
    }

    /// Would the module accept a patch of `[addr, addr + len)`? Runs every check APPLY makes,
    /// then the kernel's own verdict (a disabled kprobe registered and removed: one RCU grace
    /// period, milliseconds). Changes nothing.
    pub fn check_site_with_kprobe(&self, addr: u64, len: usize) -> Result<(), SiteRefusal> {
        self.check(addr, len, 0)
    }

    /// The checks APPLY makes, without the kprobe cross-check: the verdict APPLY would give,
    /// at microseconds per site (for vetting many points before a batch).
    pub fn precheck_site(&self, addr: u64, len: usize) -> Result<(), SiteRefusal> {
        self.check(addr, len, TRAPVEC_CHECK_NO_KPROBE)
    }

    fn check(&self, addr: u64, len: usize, flags: u32) -> Result<(), SiteRefusal> {
        let len = u32::try_from(len).map_err(|_| SiteRefusal::BadLength)?;
        let mut arg = TrapvecCheck {
            addr,
            len,
            flags,
            ..Default::default()
        };
        self.call(Request::Check(&mut arg))
            .map_err(|errno| SiteRefusal::CheckFailed { errno })?;
        self.answer(&arg)
    }

    /// A CHECK's answer (CHECK's or one of CHECK_MANY's): the refusal with its culprit placed.
    fn answer(&self, arg: &TrapvecCheck) -> Result<(), SiteRefusal> {
        match SiteRefusal::from_abi(arg.reason, arg.error).map(|r| self.placed(r, arg.culprit)) {
            None => Ok(()),
            Some(refusal) => {
                log::debug!("site {:#x}+{} refused: {refusal}", arg.addr, arg.len);
                Err(refusal)
            }
        }
    }

    /// [`KernelTarget::precheck_site`] of many windows, one answer per window in the order
    /// given: CHECK_MANY in chunks of [`CHECK_MANY_CHUNK`] windows (the module reads and
    /// decodes each function once for all of a chunk's windows in it), or one CHECK per window
    /// where the module has no CHECK_MANY (`ENOTTY`, or `EINVAL`: an older trapvec.ko).
    pub fn precheck_sites(&self, windows: &[(u64, usize)]) -> Vec<Result<(), SiteRefusal>> {
        use std::sync::atomic::Ordering;

        let mut out = Vec::with_capacity(windows.len());
        for chunk in windows.chunks(CHECK_MANY_CHUNK) {
            if !self.no_check_many.load(Ordering::Relaxed) {
                match self.check_many(chunk) {
                    Ok(answers) => {
                        out.extend(answers);
                        continue;
                    }
                    Err(errno @ (Errno::ENOTTY | Errno::EINVAL)) => {
                        log::debug!("CHECK_MANY: {errno}: an older module, one CHECK per window");
                        self.no_check_many.store(true, Ordering::Relaxed);
                    }
                    Err(errno) => {
                        out.extend(
                            chunk
                                .iter()
                                .map(|_| Err(SiteRefusal::CheckFailed { errno })),
                        );
                        continue;
                    }
                }
            }
            out.extend(
                chunk
                    .iter()
                    .map(|&(addr, len)| self.precheck_site(addr, len)),
            );
        }
        out
    }

    /// One CHECK_MANY of `windows` (at most [`CHECK_MANY_CHUNK`]).
    fn check_many(&self, windows: &[(u64, usize)]) -> Result<Vec<Result<(), SiteRefusal>>, Errno> {
        let mut checks: Vec<TrapvecCheck> = windows
            .iter()
            .map(|&(addr, len)| TrapvecCheck {
                addr,
                // Longer than any patch: the module refuses it as BAD_LENGTH, as CHECK does.
                len: u32::try_from(len).unwrap_or(u32::MAX),
                flags: TRAPVEC_CHECK_NO_KPROBE,
                ..Default::default()
            })
            .collect();
        let mut arg = TrapvecCheckMany::default();
        self.call(Request::CheckMany {
            arg: &mut arg,
            checks: &mut checks,
        })?;
        Ok(checks.iter().map(|c| self.answer(c)).collect())
    }

    /// A refusal with the module's culprit named: the kprobe's `symbol+offset`; the jump-label
    /// target and its static key, or the exception fix-up and its faulting instruction, read
    /// from the table entry the module points at.
    fn placed(&self, refusal: SiteRefusal, culprit: u64) -> SiteRefusal {
        match refusal {
            SiteRefusal::Kprobe { .. } => SiteRefusal::Kprobe {
                at: culprit,
                place: self.place(culprit),
            },
            SiteRefusal::JumpTarget { .. } if culprit != 0 => {
                match self.read(culprit, JUMP_ENTRY_SIZE) {
                    Ok(e) => {
                        let target = relative(culprit + 4, &e[4..8]);
                        // The key's low two bits are the entry's flags (branch type, linked).
                        let key = relative64(culprit + 8, &e[8..16]) & !3;
                        SiteRefusal::JumpTarget {
                            key: self.place_any(key),
                            at: self.place_hex(target),
                        }
                    }
                    Err(e) => {
                        log::debug!("reading the jump entry at {culprit:#x}: {e}");
                        refusal
                    }
                }
            }
            SiteRefusal::ExtableFixup { .. } if culprit != 0 => {
                match self.read(culprit, EXTABLE_ENTRY_SIZE) {
                    Ok(e) => SiteRefusal::ExtableFixup {
                        insn: self.place_hex(relative(culprit, &e[0..4])),
                        at: self.place_hex(relative(culprit + 4, &e[4..8])),
                    },
                    Err(e) => {
                        log::debug!("reading the exception-table entry at {culprit:#x}: {e}");
                        refusal
                    }
                }
            }
            SiteRefusal::DeadCpu { .. } if culprit != 0 => SiteRefusal::DeadCpu {
                function: self.place_hex(culprit),
            },
            other => other,
        }
    }

    /// `addr` as `function+0x1c` (as the kernel's `%pS` prints it), or hex outside every function.
    fn place_hex(&self, addr: u64) -> String {
        match self.symbols.function_containing(addr) {
            Some(f) if addr == f.addr => f.name.to_string(),
            Some(f) => format!("{}+{:#x}", f.name, addr - f.addr),
            None => format!("{addr:#x}"),
        }
    }

    /// `addr` as `symbol+0x8` after the nearest symbol of any kind at or before it (static keys
    /// are data: `__tracepoint_sched_switch+0x8`), or hex when none lies within 64 KiB.
    fn place_any(&self, addr: u64) -> String {
        match self.symbols.iter().take_while(|s| s.addr <= addr).last() {
            Some(s) if addr == s.addr => s.name.to_string(),
            Some(s) if addr - s.addr < 0x10000 => format!("{}+{:#x}", s.name, addr - s.addr),
            _ => format!("{addr:#x}"),
        }
    }

    /// `addr` as `symbol+offset` (decimal, as points are written), or hex outside every symbol.
    fn place(&self, addr: u64) -> String {
        match self.symbols.function_containing(addr) {
            Some(f) if addr == f.addr => f.name.to_string(),
            Some(f) => format!("{}+{}", f.name, addr - f.addr),
            None => format!("{addr:#x}"),
        }
    }

    /// Every live dispatch entry with its counters, ordered by site. LIST copies at most
    /// `TRAPVEC_BATCH_MAX` entries per call: larger tables are read page by page.
    pub fn list(&self) -> Result<Vec<ListedEntry>, TargetError> {
        let page = TRAPVEC_BATCH_MAX as usize;
        'again: loop {
            let mut all: Vec<TrapvecListEntry> = Vec::new();
            let mut total = None;
            loop {
                let start = all.len();
                let want = total.map_or(0, |t: usize| (t - start).min(page));
                let mut out = vec![TrapvecListEntry::default(); want];
                let mut arg = TrapvecList {
                    start: start as u64,
                    ..Default::default()
                };
                self.call(Request::List {
                    arg: &mut arg,
                    out: &mut out,
                    hit: false,
                })
                .map_err(|e| TargetError::os("LIST of /dev/trapvec", e))?;
                let count = arg.count as usize;
                match total {
                    // The first call only asks how many there are.
                    None => total = Some(count),
                    // Entries came or went between two pages: read them all again.
                    Some(t) if t != count => continue 'again,
                    Some(_) => all.extend_from_slice(&out),
                }
                if all.len() >= count {
                    all.truncate(count);
                    break;
                }
            }
            return Ok(all.iter().map(listed).collect());
        }
    }

    /// The live dispatch entries hit at least once, with their counters, ordered by site
    /// (LIST_HIT): a look at thousands of counters of which few moved copies those few. One
    /// call asks how many there are, the next copies them with room to spare, again with more
    /// room should more have been hit meanwhile; each call is one snapshot of the table. A
    /// module older than LIST_HIT (ENOTTY), or more hit entries than one call copies: the
    /// whole [`KernelTarget::list`], filtered.
    pub fn list_hit(&self) -> Result<Vec<ListedEntry>, TargetError> {
        let mut room = 0;
        loop {
            let mut out = vec![TrapvecListEntry::default(); room];
            let mut arg = TrapvecList::default();
            match self.call(Request::List {
                arg: &mut arg,
                out: &mut out,
                hit: true,
            }) {
                Ok(()) => {}
                Err(Errno::ENOTTY) => break,
                Err(e) => return Err(TargetError::os("LIST_HIT of /dev/trapvec", e)),
            }
            let count = arg.count as usize;
            if count <= room {
                return Ok(out[..count].iter().map(listed).collect());
            }
            if count > TRAPVEC_BATCH_MAX as usize {
                break;
            }
            room = (count + count / 4 + 16).min(TRAPVEC_BATCH_MAX as usize);
        }
        let mut all = self.list()?;
        all.retain(|e| e.hits.hits > 0);
        Ok(all)
    }

    /// Take `flock(LOCK_EX)` on the device for as long as this target lives, waiting for
    /// another holder (another trapctl) to finish first. Every command that reads the state
    /// blob, changes the kernel and writes the blob back holds it, so commands never interleave.
    pub fn lock_exclusive(&self) -> Result<(), TargetError> {
        let fd = self.dev.as_raw_fd();
        // SAFETY: flock() only takes a descriptor, which `self.dev` keeps open; the lock is
        // released when that descriptor is closed (the target dropped).
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(TargetError::os(
                format!("flock(LOCK_EX) of {DEVICE_PATH}"),
                err,
            ));
        }
        log::info!("another trapctl holds {DEVICE_PATH}: waiting for it");
        loop {
            // SAFETY: as above.
            if unsafe { libc::flock(fd, libc::LOCK_EX) } == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(TargetError::os(
                    format!("flock(LOCK_EX) of {DEVICE_PATH}"),
                    err,
                ));
            }
        }
    }

    /// Release [`KernelTarget::lock_exclusive`]'s lock while this target stays open (a command
    /// that waits on something else lets other commands in meanwhile).
    pub fn unlock(&self) -> Result<(), TargetError> {
        // SAFETY: as in `lock_exclusive`.
        if unsafe { libc::flock(self.dev.as_raw_fd(), libc::LOCK_UN) } == 0 {
            return Ok(());
        }
        Err(TargetError::os(
            format!("flock(LOCK_UN) of {DEVICE_PATH}"),
            std::io::Error::last_os_error(),
        ))
    }

    /// The state blob's generation alone (nothing copied): it moves with every PUT.
    pub fn state_generation(&self) -> Result<u64, TargetError> {
        let mut arg = TrapvecState::default();
        match self.call(Request::StateGet {
            arg: &mut arg,
            buf: &mut [],
        }) {
            Ok(()) | Err(Errno::ENOSPC) => Ok(arg.generation),
            Err(e) => Err(TargetError::os("STATE_GET of /dev/trapvec", e)),
        }
    }

    /// The state blob the module keeps for user space, with its generation.
    pub fn state(&self) -> Result<StateBlob, TargetError> {
        let mut capacity = 0usize;
        loop {
            let mut bytes = vec![0u8; capacity];
            let mut arg = TrapvecState::default();
            match self.call(Request::StateGet {
                arg: &mut arg,
                buf: &mut bytes,
            }) {
                Ok(()) => {
                    let size = usize::try_from(arg.size)
                        .unwrap_or(usize::MAX)
                        .min(capacity);
                    bytes.truncate(size);
                    return Ok(StateBlob {
                        generation: arg.generation,
                        bytes,
                    });
                }
                // Another PUT may have grown it between two calls: ask again with room for it.
                Err(Errno::ENOSPC) if arg.size <= u64::from(TRAPVEC_STATE_MAX) => {
                    capacity = usize::try_from(arg.size)
                        .unwrap_or(usize::MAX)
                        .max(capacity + 1);
                }
                Err(e) => return Err(TargetError::os("STATE_GET of /dev/trapvec", e)),
            }
        }
    }

    /// Replace the state blob if its generation is still `expected` (compare and swap); returns
    /// the new generation. [`TargetError::StateStale`] when another writer came in between.
    pub fn put_state(&self, expected: u64, bytes: &[u8]) -> Result<u64, TargetError> {
        if bytes.len() > TRAPVEC_STATE_MAX as usize {
            return Err(TargetError::Other(format!(
                "the state blob is {} bytes; trapvec.ko keeps at most {TRAPVEC_STATE_MAX}",
                bytes.len()
            )));
        }
        let mut arg = TrapvecState {
            generation: expected,
            ..Default::default()
        };
        match self.call(Request::StatePut {
            arg: &mut arg,
            bytes,
        }) {
            Ok(()) => {
                log::debug!(
                    "state blob: {} bytes, generation {expected} -> {}",
                    bytes.len(),
                    arg.generation
                );
                Ok(arg.generation)
            }
            Err(Errno::ESTALE) => Err(TargetError::StateStale {
                expected,
                current: arg.generation,
            }),
            Err(e) => Err(TargetError::os("STATE_PUT of /dev/trapvec", e)),
        }
    }

    fn block_error(
        block: &RepoBlock,
        offset: usize,
        len: usize,
        op: &str,
        errno: Errno,
    ) -> TargetError {
        let why = match errno {
            Errno::ENOENT => "not a live block of the arena",
            Errno::EPERM => "the block is sealed",
            Errno::EINVAL => "outside the block, or the wrong kind of block",
            Errno::EIO => "the bytes read back differ from the bytes written",
            Errno::EBUSY => "a dispatch entry still sends CPUs into it",
            _ => "",
        };
        let reason = if why.is_empty() {
            format!("{op}: {errno}")
        } else {
            format!("{op}: {why} ({errno})")
        };
        TargetError::Block {
            addr: block.addr,
            offset,
            len,
            reason,
        }
    }

    fn dispatch_error(site: u64, op: &str, errno: Errno) -> TargetError {
        let why = match errno {
            Errno::EEXIST => "the site already has a dispatch entry (or is given twice)",
            Errno::EFAULT => {
                "the destination or the handler is not in a sealed code block of the arena"
            }
            Errno::EINVAL => "the site is not kernel or module text outside trapvec.ko",
            Errno::ENOENT => "no dispatch entry for this site (or it is named twice)",
            _ => "",
        };
        let reason = if why.is_empty() {
            format!("{op}: {errno}")
        } else {
            format!("{op}: {why} ({errno})")
        };
        TargetError::Dispatch { site, reason }
    }

    fn to_abi_entry(e: &DispatchEntry) -> TrapvecDispatchEntry {
        TrapvecDispatchEntry {
            site: e.site,
            dest: e.dest,
            handler: e.handler,
            cookie: e.cookie,
            only: TrapvecTaskMatch::of(e.only.as_ref()),
        }
    }

    fn to_abi_patch(p: &TextPatch) -> Result<TrapvecPatch, TargetError> {
        if p.old.len() != p.new.len() {
            return Err(TargetError::Text {
                addr: p.addr,
                reason: format!("expects {} bytes but writes {}", p.old.len(), p.new.len()),
            });
        }
        let len = u32::try_from(p.old.len())
            .ok()
            .filter(|&l| l >= 1 && l as usize <= TRAPVEC_PATCH_MAX)
            .ok_or(TargetError::SiteRefused {
                addr: p.addr,
                reason: SiteRefusal::BadLength,
            })?;
        let mut out = TrapvecPatch {
            addr: p.addr,
            len,
            ..Default::default()
        };
        out.old_bytes[..p.old.len()].copy_from_slice(&p.old);
        out.new_bytes[..p.new.len()].copy_from_slice(&p.new);
        Ok(out)
    }

    /// The error of a failed APPLY of `batch`, from the module's answer in `arg`.
    fn apply_error(&self, batch: &[TextPatch], arg: &TrapvecApply, errno: Errno) -> TargetError {
        let Some(p) = batch
            .get(arg.failed_index as usize)
            .filter(|_| arg.failed_index != TRAPVEC_NO_INDEX)
        else {
            return TargetError::os(
                format!("APPLY of a batch of {} patches", batch.len()),
                errno,
            );
        };
        match SiteRefusal::from_abi(arg.reason, arg.error).map(|r| self.placed(r, arg.culprit)) {
            Some(SiteRefusal::Mismatch) => TargetError::TextMismatch {
                addr: p.addr,
                expected: hex(&p.old),
                found: hex(&arg.found[..p.old.len().min(TRAPVEC_PATCH_MAX)]),
            },
            Some(reason) => TargetError::SiteRefused {
                addr: p.addr,
                reason,
            },
            None => TargetError::Text {
                addr: p.addr,
                reason: format!("APPLY: {errno}"),
            },
        }
    }
}

impl Target for KernelTarget {
    fn info(&self) -> &TargetInfo {
        &self.info
    }

    fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        self.read_with(addr, len, 0)
    }

    /// READ with `TRAPVEC_READ_ORIGINAL`: the module undoes its own live patches and puts back
    /// the bytes armed kprobes saved (their int3, an optimized probe's jmp), under the kprobe
    /// table's lock.
    fn read_code(&self, addr: u64, len: usize) -> Result<Vec<u8>, TargetError> {
        self.read_with(addr, len, TRAPVEC_READ_ORIGINAL)
    }

    fn alloc(&mut self, near: u64, size: usize, kind: BlockKind) -> Result<RepoBlock, TargetError> {
        let mut arg = TrapvecAlloc {
            kind: match kind {
                BlockKind::Code => TRAPVEC_BLOCK_CODE,
                BlockKind::Data => TRAPVEC_BLOCK_DATA,
            },
            size: size as u64,
            ..Default::default()
        };
        self.call(Request::Alloc(&mut arg)).map_err(|e| match e {
            Errno::EPERM => write_forbidden("ALLOC"),
            Errno::ENOSPC => TargetError::Alloc {
                near,
                size,
                reason: format!("the {kind:?} arena of trapvec.ko is full ({e})"),
            },
            _ => TargetError::Alloc {
                near,
                size,
                reason: format!("ALLOC: {e}"),
            },
        })?;
        let block = RepoBlock {
            id: arg.id,
            addr: arg.addr,
            size,
            kind,
        };
        let far = arg
            .addr
            .abs_diff(near)
            .max((arg.addr + size as u64).abs_diff(near));
        if far > REACH {
            // The block is unused: give it back before reporting.
            let mut free = TrapvecBlock { id: arg.id };
            if let Err(e) = self.call(Request::Free(&mut free)) {
                log::warn!(
                    "freeing out-of-reach block {} at {:#x}: {}",
                    arg.id,
                    arg.addr,
                    crate::error_chain(&e)
                );
            }
            return Err(TargetError::Alloc {
                near,
                size,
                reason: format!(
                    "the arena block at {:#x} is {far:#x} bytes away, out of rel32 reach",
                    arg.addr
                ),
            });
        }
        log::debug!(
            "allocated {kind:?} block {} at {:#x} ({size} bytes) near {near:#x}",
            block.id,
            block.addr
        );
        Ok(block)
    }

    fn write(&mut self, block: &RepoBlock, offset: usize, bytes: &[u8]) -> Result<(), TargetError> {
        for (i, chunk) in bytes.chunks(TRAPVEC_XFER_MAX as usize).enumerate() {
            let at = offset + i * TRAPVEC_XFER_MAX as usize;
            let mut arg = TrapvecWrite {
                id: block.id,
                offset: at as u64,
                ..Default::default()
            };
            self.call(Request::Write {
                arg: &mut arg,
                bytes: chunk,
            })
            .map_err(|e| match e {
                // EPERM is also the answer for a sealed block: ask the kernel which it is.
                Errno::EPERM if writes_forbidden() => write_forbidden("WRITE"),
                _ => Self::block_error(block, at, chunk.len(), "WRITE", e),
            })?;
        }
        Ok(())
    }

    fn seal(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        let mut arg = TrapvecBlock { id: block.id };
        self.call(Request::Seal(&mut arg))
            .map_err(|e| Self::block_error(block, 0, block.size, "SEAL", e))
    }

    fn free(&mut self, block: &RepoBlock) -> Result<(), TargetError> {
        let mut arg = TrapvecBlock { id: block.id };
        self.call(Request::Free(&mut arg))
            .map_err(|e| Self::block_error(block, 0, block.size, "FREE", e))
    }

    /// APPLY stops the machine: where a CPU may be inside the old bytes does not matter.
    fn write_text(
        &mut self,
        batch: &[TextPatch],
        _live_interior: Option<&[u64]>,
    ) -> Result<(), TargetError> {
        if batch.is_empty() {
            return Ok(());
        }
        if let Some(p) = batch.get(TRAPVEC_BATCH_MAX as usize) {
            return Err(TargetError::Text {
                addr: p.addr,
                reason: format!(
                    "a batch holds at most {TRAPVEC_BATCH_MAX} patches; this one has {}",
                    batch.len()
                ),
            });
        }
        let patches = batch
            .iter()
            .map(Self::to_abi_patch)
            .collect::<Result<Vec<_>, _>>()?;
        let mut arg = TrapvecApply {
            flags: if self.deferred {
                crate::abi::TRAPVEC_APPLY_DEFERRED
            } else {
                0
            },
            ..TrapvecApply::default()
        };
        match self.call(Request::Apply {
            arg: &mut arg,
            patches: &patches,
        }) {
            Ok(()) => {
                log::debug!("applied a batch of {} text patches", batch.len());
                Ok(())
            }
            Err(errno) => {
                let err = self.apply_error(batch, &arg, errno);
                log::debug!(
                    "batch of {} refused: {}",
                    batch.len(),
                    crate::error_chain(&err)
                );
                Err(err)
            }
        }
    }

    fn change_dispatch(
        &mut self,
        change: DispatchChange<'_>,
    ) -> Result<Vec<TrapHits>, TargetError> {
        match change {
            DispatchChange::Add(entries) => self.dispatch_add(entries).map(|()| Vec::new()),
            DispatchChange::Remove(sites) => self.dispatch_remove(sites).map(|()| Vec::new()),
            DispatchChange::Replace { entries, start } => self.dispatch_replace(entries, start),
        }
    }

    /// The module waits for `synchronize_rcu()` and `synchronize_rcu_tasks()`, which cover every
    /// range at once.
    /// And for the tasks in flight through freed replace trampolines (`EBUSY` after the
    /// module's bounded wait, naming the trampoline).
    fn quiesce(&mut self, _ranges: &[(u64, u64)]) -> Result<(), TargetError> {
        let mut arg = TrapvecQuiesce::default();
        self.call(Request::Quiesce(&mut arg)).map_err(|e| match e {
            Errno::EBUSY => TargetError::Quiesce(format!(
                "QUIESCE: {} task(s) still inside the replacement called by the trampoline at {:#x}; try again",
                arg.busy_count, arg.busy_addr
            )),
            e => TargetError::Quiesce(format!("QUIESCE: {e}")),
        })?;
        log::debug!(
            "quiesced; reclaimed {} blocks ({} bytes)",
            arg.reclaimed_blocks,
            arg.reclaimed_bytes
        );
        Ok(())
    }

    /// The module's checks of APPLY ([`KernelTarget::precheck_sites`]), without the kprobe
    /// cross-check: CHECK_MANY, each function decoded once in the module for all its windows,
    /// so a batch of thousands is vetted quickly.
    fn check_sites(&self, windows: &[(u64, usize)]) -> Vec<Result<(), TargetError>> {
        self.precheck_sites(windows)
            .into_iter()
            .zip(windows)
            .map(|(r, &(addr, _))| r.map_err(|reason| TargetError::SiteRefused { addr, reason }))
            .collect()
    }

    /// LIST for the table; for counters, HITS of each site, or one LIST when many are asked
    /// for ([`KernelTarget::hits_many`]).
    fn read_dispatch(
        &self,
        what: DispatchRead<'_>,
    ) -> Option<Result<DispatchReading, TargetError>> {
        Some(match what {
            DispatchRead::Table => self
                .list()
                .map(|l| DispatchReading::Table(l.into_iter().map(|e| e.entry).collect())),
            DispatchRead::Hits(sites) => self.hits_many(sites).map(DispatchReading::Hits),
            DispatchRead::Hit => self.list_hit().map(|l| {
                DispatchReading::Hit(l.into_iter().map(|e| (e.entry.site, e.hits)).collect())
            }),
        })
    }

    /// RETURN_ADD or KEY_ADD ([`slots`]).
    fn alloc_slot(
        &mut self,
        spec: &crate::slots::SlotSpec,
    ) -> Result<crate::slots::Slot, TargetError> {
        use crate::slots::{Slot, SlotSpec};
        match spec {
            SlotSpec::Return(cfg) => self.return_add(cfg).map(Slot::Return),
            SlotSpec::Keyed(by) => self.key_add(*by).map(Slot::Keyed),
        }
    }

    /// RETURN_REMOVE or KEY_REMOVE ([`slots`]).
    fn free_slot(&mut self, slot: &crate::slots::Slot) -> Result<(), TargetError> {
        use crate::slots::Slot;
        match slot {
            Slot::Return(s) => self.return_remove(s),
            Slot::Keyed(s) => self.key_remove(s),
        }
    }

    /// RETURN_STATS or KEY_STATS ([`slots`]).
    fn read_slot(&self, slot: &crate::slots::Slot) -> Option<crate::slots::SlotReading> {
        use crate::slots::{Slot, SlotReading};
        match slot {
            Slot::Return(s) => self.return_stats(s).map(SlotReading::Return),
            Slot::Keyed(s) => self.key_stats(s).map(SlotReading::Keyed),
        }
    }
}

/// From this many sites on, their counters are read from one LIST of the table (when the table
/// is at most [`LIST_HITS_SPREAD`] times as large) instead of one HITS per site.
const LIST_HITS_MIN: usize = 16;

/// How many table entries per site asked about a LIST may copy to answer for them.
const LIST_HITS_SPREAD: usize = 4;

impl KernelTarget {
    /// The counters of `sites` (`None` for a site without a dispatch entry): one HITS per site
    /// for a few, else one LIST of the table (the same sums under the same lock, for thousands
    /// of sites two calls instead of thousands) when the table is not much larger than the
    /// request.
    fn hits_many(&self, sites: &[u64]) -> Result<Vec<Option<TrapHits>>, TargetError> {
        if sites.len() >= LIST_HITS_MIN
            && self.list_count()? <= sites.len().saturating_mul(LIST_HITS_SPREAD)
        {
            let mut table: Vec<(u64, TrapHits)> = self
                .list()?
                .into_iter()
                .map(|e| (e.entry.site, e.hits))
                .collect();
            table.sort_unstable_by_key(|e| e.0);
            return Ok(sites
                .iter()
                .map(|site| {
                    table
                        .binary_search_by_key(site, |e| e.0)
                        .ok()
                        .map(|i| table[i].1)
                })
                .collect());
        }
        Ok(sites.iter().map(|&site| self.hits(site)).collect())
    }

    /// How many dispatch entries the module holds (a LIST that copies none).
    fn list_count(&self) -> Result<usize, TargetError> {
        let mut arg = TrapvecList::default();
        self.call(Request::List {
            arg: &mut arg,
            out: &mut [],
            hit: false,
        })
        .map_err(|e| TargetError::os("LIST of /dev/trapvec", e))?;
        Ok(arg.count as usize)
    }

    /// HITS of one site: `None` for a site without a dispatch entry (or when the module cannot
    /// say, which is logged).
    fn hits(&self, site: u64) -> Option<TrapHits> {
        let mut arg = TrapvecHits {
            site,
            ..Default::default()
        };
        match self.call(Request::Hits(&mut arg)) {
            Ok(()) => Some(TrapHits {
                hits: arg.hits,
                missed: arg.missed,
            }),
            Err(Errno::ENOENT) => None,
            Err(e) => {
                log::warn!("HITS of site {site:#x}: {}", crate::error_chain(&e));
                None
            }
        }
    }
}

/// The dispatch changes of [`Target::change_dispatch`].
impl KernelTarget {
    fn dispatch_add(&mut self, entries: &[DispatchEntry]) -> Result<(), TargetError> {
        let abi: Vec<TrapvecDispatchEntry> = entries.iter().map(Self::to_abi_entry).collect();
        let mut arg = TrapvecDispatchAdd::default();
        self.call(Request::DispatchAdd {
            arg: &mut arg,
            entries: &abi,
        })
        .map_err(|errno| {
            let site = entries.get(arg.failed_index as usize).map_or(0, |e| e.site);
            Self::dispatch_error(site, "DISPATCH_ADD", errno)
        })
    }

    fn dispatch_remove(&mut self, sites: &[u64]) -> Result<(), TargetError> {
        let mut arg = TrapvecDispatchRemove::default();
        self.call(Request::DispatchRemove {
            arg: &mut arg,
            sites,
        })
        .map_err(|errno| {
            let site = sites.get(arg.failed_index as usize).copied().unwrap_or(0);
            Self::dispatch_error(site, "DISPATCH_REMOVE", errno)
        })
    }

    /// DISPATCH_REPLACE: `hlist_replace_rcu()` per site, then a grace period before the old
    /// entries' counters are read and the entries freed.
    fn dispatch_replace(
        &mut self,
        entries: &[DispatchEntry],
        start: &[TrapHits],
    ) -> Result<Vec<TrapHits>, TargetError> {
        if start.len() != entries.len() {
            return Err(TargetError::Dispatch {
                site: entries.first().map_or(0, |e| e.site),
                reason: "DISPATCH_REPLACE: a start count per entry".into(),
            });
        }
        let abi: Vec<TrapvecDispatchEntry> = entries.iter().map(Self::to_abi_entry).collect();
        let mut counts: Vec<TrapvecHits> = entries
            .iter()
            .zip(start)
            .map(|(e, h)| TrapvecHits {
                site: e.site,
                hits: h.hits,
                missed: h.missed,
            })
            .collect();
        let mut arg = TrapvecDispatchReplace::default();
        self.call(Request::DispatchReplace {
            arg: &mut arg,
            entries: &abi,
            counts: &mut counts,
        })
        .map_err(|errno| {
            let site = entries.get(arg.failed_index as usize).map_or(0, |e| e.site);
            Self::dispatch_error(site, "DISPATCH_REPLACE", errno)
        })?;
        Ok(counts
            .iter()
            .map(|c| TrapHits {
                hits: c.hits,
                missed: c.missed,
            })
            .collect())
    }
}
