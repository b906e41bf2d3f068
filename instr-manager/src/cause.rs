//! Why a point cannot be spliced, as a type: [`RefusalCause`], carried by the errors the
//! resolver, the planner, the relocator and the splicer return where they refuse a point
//! ([`SpliceError::cause`]). Each cause has a fixed name (`too_short`) and a fixed sentence (its
//! summary), the same for every function it refuses; the error itself keeps the specifics
//! (addresses, bytes, the instruction, the other splice). `--best-effort` groups a batch's
//! refusals by cause ([`crate::ops::expand::summarize`]).

use std::borrow::Cow;

use trapvec::kernel::SiteRefusal;
use trapvec::TargetError;

use crate::error::{AnalysisError, PlanError, Refusal};
use crate::splicer::SpliceError;

macro_rules! causes {
    ($($(#[$doc:meta])* $variant:ident => $name:literal, $summary:literal;)*) => {
        /// Why a point cannot be spliced. `Kernel` is the target's own verdict on the site
        /// (the module's reserved text and the like), every other cause is the planner's.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum RefusalCause {
            $($(#[$doc])* $variant,)*
            /// The kernel refuses to patch the site (reserved text, a site it rewrites itself).
            Kernel(SiteRefusal),
        }

        impl RefusalCause {
            /// Every cause but `Kernel`'s, for tests and documentation.
            pub const PLANNER: &'static [RefusalCause] = &[$(RefusalCause::$variant,)*];

            /// The cause's name in snake_case, as `--json` shows it: `too_short`,
            /// `kernel_jump_label`.
            pub fn name(&self) -> Cow<'static, str> {
                match self {
                    $(RefusalCause::$variant => Cow::Borrowed($name),)*
                    RefusalCause::Kernel(r) => Cow::Owned(format!("kernel_{}", r.name())),
                }
            }

            /// The cause as one sentence, the same for every point it refuses.
            pub fn summary(&self) -> Cow<'static, str> {
                match self {
                    $(RefusalCause::$variant => Cow::Borrowed($summary),)*
                    RefusalCause::Kernel(r) => {
                        Cow::Owned(format!("the kernel refuses to patch the site: {}", r.summary()))
                    }
                }
            }
        }
    };
}

causes! {
    // Resolving the point.
    BadPoint => "bad_point", "the point is not `[object:]symbol[@version|@address][+offset]` or an address";
    UnknownSymbol => "unknown_symbol", "no symbol of that name";
    ObjectNotLoaded => "object_not_loaded", "the object is not loaded";
    NotInObject => "not_in_object", "the name is defined, but not in the object named";
    NoSuchVersion => "no_such_version", "the symbol has no such version";
    Ambiguous => "ambiguous", "the name is ambiguous (functions of that name in several places)";
    NotAtAddress => "not_at_address", "no function of that name at the address given";
    Ifunc => "ifunc", "an IFUNC, whose address is its resolver's: name the implementation instead";
    NotAFunction => "not_a_function", "the symbol is not a function";
    UnknownExtent => "unknown_extent", "the function's extent is unknown (no size and no following function)";
    OffsetPastEnd => "offset_past_end", "the offset is past the function's end";
    NoFunctionAt => "no_function_at", "no function contains the address";
    InitFreed => "init_freed", "init code, freed after boot";
    // Decoding the function.
    NoBytes => "no_bytes", "the function has no bytes to decode";
    InvalidInstruction => "invalid_instruction", "invalid instruction in the function";
    Truncated => "truncated", "an instruction of the function runs past the function's end";
    PastAddressSpace => "past_address_space", "the function runs past the end of the address space";
    ExceptionTables => "exception_tables", "the function's exception tables cannot be read";
    Unreadable => "unreadable", "the function's code cannot be read";
    // Planning the window.
    OutsideFunction => "outside_function", "the site is not inside the function";
    NotInstructionBoundary => "not_instruction_boundary", "the site is not an instruction boundary";
    Undecodable => "undecodable", "the site lies in a part of the function that could not be decoded";
    TooShort => "too_short", "the function is too short for the patch";
    PastFunctionEnd => "past_function_end", "the window would run past the function's end";
    BranchTargetInWindow => "branch_target_in_window", "a branch target is inside the window: a jump there would land inside the patched bytes";
    OutsideTargetInWindow => "outside_target_in_window", "a branch target that code outside the function reaches (a split-off .cold part, another function) is inside the window";
    LandingPadInWindow => "landing_pad_in_window", "an exception landing pad is inside the window";
    WindowCrossesBlock => "window_crosses_block", "the window crosses the end of its basic block";
    OverlapsFentry => "overlaps_fentry", "the window overlaps the function's entry (its ftrace site, its endbr64)";
    AlreadyPatched => "already_patched", "the window overlaps text that is already patched or a springboard in use";
    CallReturnsIntoWindow => "call_returns_into_window", "a displaced call would return inside the window";
    NoRoomForJmp => "no_room_for_jmp", "no jmp splice fits (neither a jmp rel32 nor a springboard)";
    OutOfReach => "out_of_reach", "a jump would be more than ±2 GiB from its target";
    Encode => "encode", "iced-x86 could not encode the patch or its trampoline";
    // Relocating a displaced instruction ([`Refusal::Unrelocatable`]).
    SystemCall => "system_call", "a system call instruction cannot be relocated: it saves its return address";
    InterruptInstruction => "interrupt_instruction", "an interrupt instruction cannot be relocated: it is identified by its address";
    UndefinedOpcode => "undefined_opcode", "an undefined-opcode trap (ud2) cannot be relocated: it is identified by its address (the kernel's BUG/WARN table)";
    FarReturn => "far_return", "a far return cannot be relocated: it changes privilege or code segment";
    FarBranch => "far_branch", "a far jump or call cannot be relocated: it changes the code segment";
    EipRelative => "eip_relative", "an instruction with an EIP-relative (32-bit address) operand cannot be relocated";
    NarrowBranch => "narrow_branch", "a branch with a 16- or 32-bit operand size cannot be relocated: it truncates its target";
    NotNearCall => "not_near_call", "a call that is not a 64-bit near call cannot be relocated";
    CallThroughRsp => "call_through_rsp", "a call whose target is read through rsp cannot be relocated";
    OperandOutOfReach => "operand_out_of_reach", "an instruction cannot be relocated: its memory operand is more than ±2 GiB from the new address";
    MustStayInPlace => "must_stay_in_place", "an instruction that must run at its own address cannot be relocated";
    Reencode => "reencode", "an instruction cannot be relocated: iced-x86 cannot re-encode it there";
    // What the splice asks of its site.
    UnknownHandler => "unknown_handler", "the handler is not a symbol of any loaded component";
    ReplaceNotAtEntry => "replace_not_at_entry", "replace needs the function's entry";
    ReturnNotAtEntry => "return_not_at_entry", "a return point needs the function's entry";
    ReturnsTwice => "returns_twice", "the function returns twice: a return point cannot be placed there";
    BadPredicate => "bad_predicate", "the predicate does not fit the site";
    AlreadySpliced => "already_spliced", "the site is already spliced";
}

impl SpliceError {
    /// Why the point was refused, when this error is a refusal of the point (not an error of
    /// the target's, a component's or a removal's).
    pub fn cause(&self) -> Option<RefusalCause> {
        Some(match self {
            SpliceError::Point { source, .. } => return source.cause(),
            SpliceError::Refused { refusal, .. } => refusal.cause(),
            SpliceError::UnknownHandler { .. } => RefusalCause::UnknownHandler,
            SpliceError::ReplaceNotAtEntry { .. } => RefusalCause::ReplaceNotAtEntry,
            SpliceError::ReturnNotAtEntry { .. } => RefusalCause::ReturnNotAtEntry,
            SpliceError::ReturnsTwice { .. } => RefusalCause::ReturnsTwice,
            SpliceError::BadPredicate { .. } => RefusalCause::BadPredicate,
            SpliceError::AlreadySpliced { .. } => RefusalCause::AlreadySpliced,
            SpliceError::Target { source, .. } => return target_cause(source),
            _ => return None,
        })
    }
}

/// A target's error that refuses the site: the kernel's verdict, or code it cannot read.
fn target_cause(e: &TargetError) -> Option<RefusalCause> {
    match e {
        TargetError::SiteRefused { reason, .. } => Some(RefusalCause::Kernel(reason.clone())),
        TargetError::Read { .. } => Some(RefusalCause::Unreadable),
        _ => None,
    }
}

impl PlanError {
    /// Why the point was refused, when resolving it is what failed.
    pub fn cause(&self) -> Option<RefusalCause> {
        Some(match self {
            PlanError::BadPointSpec { .. } => RefusalCause::BadPoint,
            PlanError::UnknownSymbol { .. } => RefusalCause::UnknownSymbol,
            PlanError::ObjectNotLoaded { .. } => RefusalCause::ObjectNotLoaded,
            PlanError::NotInObject { .. } => RefusalCause::NotInObject,
            PlanError::NoSuchVersion { .. } => RefusalCause::NoSuchVersion,
            PlanError::Ambiguous { .. } => RefusalCause::Ambiguous,
            PlanError::NotAtAddress { .. } => RefusalCause::NotAtAddress,
            PlanError::UnresolvedIfunc { .. } => RefusalCause::Ifunc,
            PlanError::NotAFunction { .. } => RefusalCause::NotAFunction,
            PlanError::UnknownExtent { .. } => RefusalCause::UnknownExtent,
            PlanError::OffsetPastEnd { .. } => RefusalCause::OffsetPastEnd,
            PlanError::NoFunctionAt { .. } => RefusalCause::NoFunctionAt,
            PlanError::InitFreed { .. } => RefusalCause::InitFreed,
            PlanError::Analysis(a) => a.cause(),
            PlanError::Landing(_) => RefusalCause::ExceptionTables,
            PlanError::Refused(r) => r.cause(),
        })
    }
}

impl AnalysisError {
    pub fn cause(&self) -> RefusalCause {
        match self {
            AnalysisError::Empty { .. } => RefusalCause::NoBytes,
            AnalysisError::InvalidInstruction { .. } => RefusalCause::InvalidInstruction,
            AnalysisError::Truncated { .. } => RefusalCause::Truncated,
            AnalysisError::PastAddressSpace { .. } => RefusalCause::PastAddressSpace,
        }
    }
}

impl Refusal {
    pub fn cause(&self) -> RefusalCause {
        match self {
            Refusal::OutsideFunction { .. } => RefusalCause::OutsideFunction,
            Refusal::NotInstructionBoundary { .. } => RefusalCause::NotInstructionBoundary,
            Refusal::Undecodable { .. } => RefusalCause::Undecodable,
            Refusal::FunctionTooShort { .. } => RefusalCause::TooShort,
            Refusal::PastFunctionEnd { .. } => RefusalCause::PastFunctionEnd,
            Refusal::BranchTargetInWindow { .. } => RefusalCause::BranchTargetInWindow,
            Refusal::OutsideTargetInWindow { .. } => RefusalCause::OutsideTargetInWindow,
            Refusal::LandingPadInWindow { .. } => RefusalCause::LandingPadInWindow,
            Refusal::WindowCrossesBlock { .. } => RefusalCause::WindowCrossesBlock,
            Refusal::Unrelocatable { cause, .. } => cause.clone(),
            Refusal::OverlapsFentry { .. } => RefusalCause::OverlapsFentry,
            Refusal::AlreadyPatched { .. } => RefusalCause::AlreadyPatched,
            Refusal::CallReturnsIntoWindow { .. } => RefusalCause::CallReturnsIntoWindow,
            Refusal::NoRoomForJmp { .. } => RefusalCause::NoRoomForJmp,
            Refusal::OutOfReach { .. } => RefusalCause::OutOfReach,
            Refusal::Encode { .. } => RefusalCause::Encode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_its_own_name_and_a_sentence() {
        let mut names = std::collections::BTreeSet::new();
        for c in RefusalCause::PLANNER {
            let name = c.name();
            assert!(
                name.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'),
                "{name}"
            );
            assert!(names.insert(name.clone()), "{name} twice");
            let s = c.summary();
            assert!(!s.is_empty() && !s.contains("0x"), "{name}: {s}");
        }
        let k = RefusalCause::Kernel(SiteRefusal::JumpLabel);
        assert_eq!(k.name(), "kernel_jump_label");
        assert_eq!(
            k.summary(),
            "the kernel refuses to patch the site: overlaps a jump label (static key) site, which \
             the kernel rewrites by itself"
        );
    }

    #[test]
    fn a_kernel_refusal_reads_the_same_whatever_its_details() {
        let a = RefusalCause::Kernel(SiteRefusal::Kprobe {
            at: 0xffff_ffff_8100_1000,
            place: "tcp_v4_rcv+0x5".into(),
        });
        let b = RefusalCause::Kernel(SiteRefusal::Kprobe {
            at: 0xffff_ffff_8100_2000,
            place: "ip_rcv+0x5".into(),
        });
        assert_eq!((a.name(), a.summary()), (b.name(), b.summary()));
        assert!(!a.summary().contains("tcp_v4_rcv"), "{}", a.summary());
    }

    #[test]
    fn the_target_s_errors_are_refusals_only_when_they_refuse_the_site() {
        let at = || "f".to_string();
        let refused = SpliceError::Target {
            at: at(),
            source: TargetError::SiteRefused {
                addr: 0x1000,
                reason: SiteRefusal::BugEntry,
            },
        };
        assert_eq!(
            refused.cause().map(|c| c.name()),
            Some("kernel_bug_entry".into())
        );
        let read = SpliceError::Target {
            at: at(),
            source: TargetError::Read {
                addr: 0x1000,
                len: 16,
                reason: "EFAULT".into(),
            },
        };
        assert_eq!(read.cause(), Some(RefusalCause::Unreadable));
        let stale = SpliceError::Target {
            at: at(),
            source: TargetError::StateStale {
                expected: 1,
                current: 2,
            },
        };
        assert_eq!(stale.cause(), None, "not a verdict on the point");
        assert_eq!(SpliceError::UnknownSplice(3).cause(), None);
    }
}
