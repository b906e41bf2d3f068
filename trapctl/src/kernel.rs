//! The running kernel as trapctl commands see it: [`Kernel::open`] opens `/dev/trapvec`, takes
//! `flock(LOCK_EX)` on it for the whole command, reads the state blob the previous trapctl left
//! in the module and restores the splicer from it (checked against the module: every dispatch
//! entry, the bytes at every site, the code of every component); [`Kernel::save`] writes the
//! splicer's state back (compare-and-swap on the blob's generation). A command that changes
//! the kernel and then cannot save undoes its change ([`Kernel::commit_or_undo`]), so no change
//! is left that the next trapctl would not know about.

use anyhow::{Context, Result};
use instr_manager::splicer::Splicer;
use trapvec::kernel::KernelTarget;
use trapvec::Target;

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
        log::debug!("state blob: {} bytes, generation {}", blob.bytes.len(), blob.generation);
        let splicer = Splicer::import_state(target, &blob.bytes)
            .with_context(|| format!("restoring trapctl's state kept in trapvec.ko ({RECOVERY_HINT})"))?;
        Ok(Kernel { splicer, generation: blob.generation })
    }

    pub fn target(&self) -> &KernelTarget {
        self.splicer.target()
    }

    /// Where components go: near kernel text (the module's arena is within reach of all of it).
    pub fn near(&self) -> u64 {
        let symbols = self.target().symbols();
        symbols.lookup("_stext").or_else(|| symbols.lookup("_text")).map_or(0, |s| s.addr)
    }

    /// Store the splicer's state in the module for the next command.
    pub fn save(&mut self) -> Result<()> {
        let bytes = self.splicer.export_state();
        self.generation = self.splicer.target().put_state(self.generation, &bytes).context("saving trapctl's state in trapvec.ko")?;
        Ok(())
    }

    /// Save after a change; if saving fails, run `undo` (which reverts the change) and report
    /// the save error, so the kernel never keeps a change the state does not describe.
    pub fn commit_or_undo(&mut self, undo: impl FnOnce(&mut Splicer<KernelTarget>) -> Result<()>) -> Result<()> {
        let Err(e) = self.save() else { return Ok(()) };
        match undo(&mut self.splicer) {
            Ok(()) => Err(e.context("the change was undone")),
            Err(u) => Err(e.context(format!("undoing the change failed too: {u:#}"))),
        }
    }
}
