//! instr-manager: points and splices.
//!
//! This crate owns the *analysis and code generation* of instrumentation: resolving a point
//! (`symbol+offset`) to a site ([`point`]), decoding the containing function and building its
//! basic blocks ([`analysis`]), validating a window and planning a trap or jmp splice
//! ([`plan`]), relocating the displaced instructions ([`relocate`]), generating trampolines and
//! patch bytes ([`trampoline`]), the one description of a splice ([`splice`]: point, mechanism,
//! action, read through serde from every format that writes one) and the spec format ([`spec`]).
//!
//! [`splicer`] applies plans through a [`trapvec::Target`] (all-or-nothing batches, removal with
//! quiescence). [`ops`] is the operations layer every front end shares (load with declared
//! splices, unload, splice, unsplice, apply a spec, check, profile switch, set/get, listing;
//! one record of what a change made and one undo; one placement policy), and [`session`] is
//! the RAII library API for a process modifying itself, a front end over [`ops`].
//!
//! Everything in the analysis modules is pure: functions over `(&[u8], address)`, a
//! [`trapvec::SymbolTable`] and a [`trapvec::TargetInfo`]; the target is seen only through read
//! callbacks handed in by the caller. Applying plans through a [`trapvec::Target`] is the
//! splicer's job, and nothing here may write to a target.

pub mod analysis;
pub mod cause;
pub mod cover;
pub mod error;
pub mod glob;
pub mod image;
pub mod ops;
pub mod owner;
pub mod plan;
pub mod point;
pub mod relocate;
pub mod session;
pub mod spec;
pub mod splice;
pub mod splicer;
pub mod trampoline;

pub use analysis::{
    analyze_function, analyze_function_with, AnalysisOptions, BasicBlock, Function, Insn, ReadFn,
};
pub use cause::RefusalCause;
pub use error::{AnalysisError, PlanError, Refusal, SpecError};
pub use plan::{
    plan_jmp, plan_jmp_rel32, plan_jmp_springboard, plan_splice, plan_trap, Mechanism, Plan,
    PlanInput, SiteVerdict, Springboard, UnknownMechanism,
};
pub use point::{
    is_fentry_site, kernel_entry_len, resolve_point, PointSpec, ResolvedPoint, ENDBR64,
    KERNEL_ENTRY_MAX,
};
pub use relocate::relocate;
pub use spec::{ComponentSpec, SetSpec, Spec};
pub use splice::{Action, SpliceFormError, SpliceOptions, SpliceRequest, When};
pub use trampoline::{
    emit_call_trampoline, emit_call_trampoline_with, emit_indirect_stub, emit_replace_trampoline,
    emit_replay, jmp_bytes, springboard_bytes, trap_bytes, CallTrampoline, ReplaceTrampoline,
    TrampolineOptions, REPLACE_STACK_WORDS,
};
