//! The running kernel as trapctl commands see it: [`Kernel::open`] opens `/dev/trapvec`, takes
//! `flock(LOCK_EX)` on it for the whole command, reads the state blob the previous trapctl left
//! in the module and restores the splicer from it (checked against the module: every dispatch
//! entry, the bytes at every site, the code of every component), with the changes logged after
//! that snapshot in the state log (`/var/lib/trapd/state.log`, or `TRAPVEC_STATE_LOG`; shared with
//! trapd); [`Kernel::save`] appends what the command changed to the log (`fsync`), or now and
//! then writes a whole snapshot back (compare-and-swap on the blob's generation) and begins a new
//! log ([`instr_manager::splicer::state_log`]). A command that changes
//! the kernel and then cannot save undoes its change ([`Kernel::commit_or_undo`]), so no change
//! is left that the next trapctl would not know about.

use anyhow::{Context, Result};
use instr_manager::ops::{self, Made};
use instr_manager::splicer::state_log::{self, StateLog};
use instr_manager::splicer::Splicer;
use trapvec::kernel::KernelTarget;

/// Appended to errors about a state that no longer matches the module.
const RECOVERY_HINT: &str =
    "`rmmod trapvec` reverts every splice and drops the state; `insmod trapvec.ko` starts afresh";

/// trapctl's view of the kernel for one command.
pub struct Kernel {
    pub splicer: Splicer<KernelTarget>,
    /// Generation of the state blob this command read (the compare in compare-and-swap).
    generation: u64,
    /// The log of changes after the blob's snapshot.
    state_log: StateLog,
}

impl Kernel {
    /// Open the module, lock it for this command, and restore what earlier commands made.
    pub fn open() -> Result<Kernel> {
        let target = KernelTarget::open()?;
        target.lock_exclusive()?;
        let blob = target.state()?;
        log::debug!(
            "state blob: {} bytes, generation {}",
            blob.bytes.len(),
            blob.generation
        );
        let (splicer, state_log, _) =
            StateLog::load(&state_log::kernel_state_log(), target, &blob.bytes).with_context(
                || format!("restoring trapctl's state kept in trapvec.ko ({RECOVERY_HINT})"),
            )?;
        Ok(Kernel {
            splicer,
            generation: blob.generation,
            state_log,
        })
    }

    pub fn target(&self) -> &KernelTarget {
        self.splicer.target()
    }

    /// Store what this command changed for the next command: a line in the state log, or a
    /// snapshot in the module and a new log.
    pub fn save(&mut self) -> Result<()> {
        let generation = &mut self.generation;
        self.state_log
            .save(&mut self.splicer, |target, bytes| {
                *generation = target.put_state(*generation, bytes)?;
                Ok(())
            })
            .context("saving trapctl's state (trapvec.ko's snapshot and the state log)")?;
        Ok(())
    }

    /// Save after a change; if saving fails, undo what the change `made` and report the save
    /// error, so the kernel never keeps a change the state does not describe. (A removal has
    /// nothing to undo: its error then says what was removed but not recorded.)
    pub fn commit_or_undo(&mut self, made: &Made) -> Result<()> {
        let Err(e) = self.save() else { return Ok(()) };
        if made.is_empty() {
            return Err(e.context(format!(
                "the change stands but the saved state does not show it ({RECOVERY_HINT})"
            )));
        }
        match ops::undo(&mut self.splicer, made) {
            Ok(()) => Err(e.context("the change was undone")),
            Err(u) => Err(e.context(format!(
                "undoing the change failed too: {}",
                trapvec::error_chain(&u)
            ))),
        }
    }
}
