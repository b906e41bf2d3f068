//! The running kernel as trapctl commands see it: [`Kernel::open`] opens `/dev/trapvec`, takes
//! `flock(LOCK_EX)` on it for the whole command, reads the state blob the previous trapctl left
//! in the module and restores the splicer from it (checked against the module: every dispatch
//! entry, the bytes at every site, the code of every component); [`Kernel::save`] writes the
//! splicer's state back (compare-and-swap on the blob's generation). A command that changes
//! the kernel and then cannot save undoes its change ([`Kernel::commit_or_undo`]), so no change
//! is left that the next trapctl would not know about.

use anyhow::{Context, Result};
use instr_manager::ops::{self, Made};
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
        let splicer = Splicer::import_state(target, &blob.bytes).with_context(|| {
            format!("restoring trapctl's state kept in trapvec.ko ({RECOVERY_HINT})")
        })?;
        Ok(Kernel {
            splicer,
            generation: blob.generation,
        })
    }

    pub fn target(&self) -> &KernelTarget {
        self.splicer.target()
    }

    /// Store the splicer's state in the module for the next command.
    pub fn save(&mut self) -> Result<()> {
        let bytes = self.splicer.export_state();
        self.generation = self
            .splicer
            .target()
            .put_state(self.generation, &bytes)
            .context("saving trapctl's state in trapvec.ko")?;
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
