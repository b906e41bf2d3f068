//! Errors of the instrumentation manager, one enum per layer, each naming its culprit:
//! [`AnalysisError`] (decoding a function), [`PlanError`] (resolving a point), [`Refusal`] (why a
//! splice cannot be made at a site: planning, relocation, trampoline generation) and
//! [`SpecError`] (reading a splice spec file).

use std::path::PathBuf;

use thiserror::Error;

/// Decoding a function failed.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum AnalysisError {
    #[error("function `{func}` at {start:#x} has no bytes to decode")]
    Empty { func: String, start: u64 },
    #[error("invalid instruction in `{func}` at {addr:#x} (bytes {bytes})")]
    InvalidInstruction {
        func: String,
        addr: u64,
        bytes: String,
    },
    #[error("the instruction of `{func}` at {addr:#x} runs past the function's end at {end:#x}")]
    Truncated { func: String, addr: u64, end: u64 },
    #[error(
        "function `{func}` at {start:#x} ({len} bytes) runs past the end of the address space"
    )]
    PastAddressSpace {
        func: String,
        start: u64,
        len: usize,
    },
}

/// Resolving a point (`sym`, `sym+off`, `0xADDR`) failed.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("bad point `{text}`: {reason} (expected `[object:]symbol[@version|@0xADDRESS][+offset]` or `0xADDRESS`)")]
    BadPointSpec { text: String, reason: String },
    #[error("point `{text}`: no symbol `{name}`")]
    UnknownSymbol { text: String, name: String },
    /// A kernel module (or library) that is not loaded: nothing there to resolve yet. `found`
    /// says where the name is defined, when it is (`; \`memcpy\` is in libc.so.6`).
    #[error("point `{text}`: no loaded object matches `{object}`{found} (if it is a kernel module that is not loaded yet, the point can only wait for it as a pending point, which trapd holds: send it through trapd)")]
    ObjectNotLoaded {
        text: String,
        object: String,
        found: String,
    },
    #[error("point `{text}`: `{name}` is defined, but not in an object matching `{object}` (it is in {found})")]
    NotInObject {
        text: String,
        name: String,
        object: String,
        found: String,
    },
    #[error("point `{text}`: `{name}` has no version `{version}` (versions: {found})")]
    NoSuchVersion {
        text: String,
        name: String,
        version: String,
        found: String,
    },
    #[error("point `{text}`: `{name}` is ambiguous: {candidates}; qualify it as `object:{name}`, `{name}@VERSION` or `{name}@0xADDRESS`, or give an address")]
    Ambiguous {
        text: String,
        name: String,
        candidates: String,
    },
    /// `name@0xADDRESS` with no function of that name there; `found` lists where it is.
    #[error("point `{text}`: no `{name}` at {addr:#x} (it is at {found})")]
    NotAtAddress {
        text: String,
        name: String,
        addr: u64,
        found: String,
    },
    #[error("point `{text}`: `{name}` at {addr:#x} is an IFUNC whose implementation is chosen at load time; its address is the resolver's, so name the implementation instead")]
    UnresolvedIfunc {
        text: String,
        name: String,
        addr: u64,
    },
    #[error("point `{text}`: `{name}` at {addr:#x} is not a function")]
    NotAFunction {
        text: String,
        name: String,
        addr: u64,
    },
    #[error("point `{text}`: the extent of `{name}` at {addr:#x} is unknown (no size and no following function)")]
    UnknownExtent {
        text: String,
        name: String,
        addr: u64,
    },
    #[error("point `{text}`: offset {offset:#x} is past the end of `{name}` ({size:#x} bytes)")]
    OffsetPastEnd {
        text: String,
        name: String,
        offset: u64,
        size: u64,
    },
    #[error("point `{text}`: no function contains {addr:#x}")]
    NoFunctionAt { text: String, addr: u64 },
    /// A kernel function in init memory (`__init`), which the kernel freed after boot: its
    /// bytes are no longer its code.
    #[error("point `{text}`: `{name}` at {addr:#x} is init code (between __init_begin and __init_end), which the kernel freed after boot: it never runs again")]
    InitFreed {
        text: String,
        name: String,
        addr: u64,
    },
    #[error(transparent)]
    Analysis(#[from] AnalysisError),
    #[error(transparent)]
    Landing(#[from] crate::analysis::landing::LandingError),
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// Why a splice cannot be made at a site. Every message is a sentence naming the addresses and,
/// where one is at fault, the instruction in Intel syntax.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("{site:#x} is not inside function `{func}` [{start:#x}, {end:#x})")]
    OutsideFunction {
        site: u64,
        func: String,
        start: u64,
        end: u64,
    },
    #[error("{site:#x} is not an instruction boundary of `{func}`: it falls inside `{insn}` at {nearest_before:#x}")]
    NotInstructionBoundary {
        site: u64,
        func: String,
        nearest_before: u64,
        insn: String,
    },
    #[error(
        "{site:#x} lies in the part of `{func}` that could not be decoded (from {from:#x} on)"
    )]
    Undecodable { site: u64, func: String, from: u64 },
    #[error("function `{func}` is only {size} byte(s) long; {what} needs {needed} bytes")]
    FunctionTooShort {
        func: String,
        size: u64,
        needed: usize,
        what: &'static str,
    },
    #[error("the window [{site:#x}, {window_end:#x}) would run past the end of `{func}` at {func_end:#x}")]
    PastFunctionEnd {
        site: u64,
        window_end: u64,
        func: String,
        func_end: u64,
    },
    #[error("the window [{site:#x}, {window_end:#x}) contains the branch target {target:#x}: a jump there would land inside the patched bytes")]
    BranchTargetInWindow {
        site: u64,
        window_end: u64,
        target: u64,
    },
    #[error("the window [{site:#x}, {window_end:#x}) contains the branch target {target:#x}, reached from {from:#x}{from_where} outside `{func}` (a split-off .cold part or another function): a jump there would land inside the patched bytes")]
    OutsideTargetInWindow {
        site: u64,
        window_end: u64,
        func: String,
        target: u64,
        /// An instruction outside the function that branches to `target`.
        from: u64,
        /// Where `from` is, as ` (symbol+0xOFF)`, or empty when no symbol holds it.
        from_where: String,
    },
    #[error("the window [{site:#x}, {window_end:#x}) covers the exception landing pad at {func}+{offset:#x} ({pad:#x}, from .gcc_except_table): an exception caught or cleaned up there would land inside the patched bytes")]
    LandingPadInWindow {
        site: u64,
        window_end: u64,
        func: String,
        offset: u64,
        pad: u64,
    },
    #[error("the window [{site:#x}, {window_end:#x}) crosses the end of its basic block [{block_start:#x}, {block_end:#x}) after `{last}`")]
    WindowCrossesBlock {
        site: u64,
        window_end: u64,
        block_start: u64,
        block_end: u64,
        last: String,
    },
    #[error("`{insn}` at {addr:#x} (window at {site:#x}) cannot be relocated: {reason}")]
    Unrelocatable {
        site: u64,
        addr: u64,
        insn: String,
        reason: String,
        /// What `reason` says, as a type: the same for every instruction refused for it.
        cause: crate::RefusalCause,
    },
    #[error("the window at {site:#x} overlaps the entry [{entry:#x}, {fentry_end:#x}) of `{func}`: its ftrace site, which the kernel rewrites by itself, and its endbr64 if IBT is on, where indirect calls land")]
    OverlapsFentry {
        site: u64,
        func: String,
        entry: u64,
        fentry_end: u64,
    },
    #[error("[{lo:#x}, {hi:#x}) (window at {site:#x}) overlaps text that is already patched or a springboard in use")]
    AlreadyPatched { site: u64, lo: u64, hi: u64 },
    #[error("`{insn}` at {call_addr:#x} would return to {ret:#x}, inside the window [{site:#x}, {window_end:#x}): a displaced call must be the last displaced instruction")]
    CallReturnsIntoWindow {
        site: u64,
        call_addr: u64,
        insn: String,
        ret: u64,
        window_end: u64,
    },
    #[error("no jmp splice is possible at {site:#x}: {reason}")]
    NoRoomForJmp { site: u64, reason: String },
    #[error("{what} at {from:#x} cannot reach {to:#x} (more than ±2 GiB away)")]
    OutOfReach {
        what: &'static str,
        from: u64,
        to: u64,
    },
    #[error("iced-x86 could not encode {what} at {addr:#x}: {reason}")]
    Encode {
        what: &'static str,
        addr: u64,
        reason: String,
    },
}

/// Reading a splice spec failed. `file` is the spec file; `key` names the entry and field, as
/// `splice[2].at`.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("cannot read spec {file}")]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spec {file}: {message}")]
    Parse { file: PathBuf, message: String },
    #[error("spec {file}: `{key}`: {reason}")]
    Invalid {
        file: PathBuf,
        key: String,
        reason: String,
    },
}
