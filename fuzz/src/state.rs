//! The state blob trapctl reads back from the module: any bytes through
//! [`Splicer::import_state`] over a fake kernel that holds two live splices (a trap at `f0`, a
//! jmp at `f2`, both counting), so that a blob describing them can pass the checks against the
//! target and reach deeper. A state that is taken is re-exported, and the export is taken again
//! and exports identically (what one trapctl saves, the next one reads as it was); a refused
//! one is refused with a sentence.

use std::sync::OnceLock;

use instr_manager::splicer::{Action, SpliceRequest, Splicer};
use instr_manager::Mechanism;
use trapvec::fake::FakeKernel;

use crate::assert_sentence;

/// The fake kernel with its two splices, and the state blob that describes them.
pub fn prepared() -> (FakeKernel, Vec<u8>) {
    let k = FakeKernel::new();
    let mut sp = Splicer::new(k.clone());
    let count = |at: &str, mechanism| SpliceRequest {
        at: at.into(),
        action: Action::Count,
        mechanism,
        options: Default::default(),
    };
    sp.apply(&[count("f0", Mechanism::Trap), count("f2", Mechanism::Jmp)])
        .expect("count splices on the fake kernel");
    let blob = sp.export_state();
    (k, blob)
}

/// The prepared kernel, made once: importing a state only reads the target (checked below), so
/// every run can share it.
fn kernel() -> FakeKernel {
    static KERNEL: OnceLock<FakeKernel> = OnceLock::new();
    let k = KERNEL.get_or_init(|| prepared().0).clone();
    k.state().reads.clear();
    k
}

/// What a state import must leave as it was: the text, blocks and dispatch entries.
fn snapshot(k: &FakeKernel) -> (usize, usize, usize, usize) {
    let s = k.state();
    (s.batches, s.blocks.len(), s.dispatch.len(), s.sealed.len())
}

pub fn run(data: &[u8]) {
    let kernel = kernel();
    let before = snapshot(&kernel);
    match Splicer::import_state(kernel.clone(), data) {
        Ok(s) => {
            let out = s.export_state();
            let again = Splicer::import_state(kernel.clone(), &out).unwrap_or_else(|e| {
                panic!(
                    "the export of a taken state is refused: {e}\n{}",
                    String::from_utf8_lossy(&out)
                )
            });
            assert_eq!(
                again.export_state(),
                out,
                "a state exported, imported and exported again differs"
            );
        }
        Err(e) => assert_sentence("state", &trapvec::error_chain(&e)),
    }
    assert_eq!(
        snapshot(&kernel),
        before,
        "importing a state changed the target"
    );
}
