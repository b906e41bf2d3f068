//! The running kernel as trapctl commands see it: [`Kernel::open`] opens `/dev/trapvec`, takes
//! `flock(LOCK_EX)` on it for the whole command (a command that waits on something else, such
//! as `trapctl cover -- COMMAND`, lets go of it meanwhile: [`Kernel::unlock`],
//! [`Kernel::relock`]), reads the state blob the previous trapctl left
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
    /// While unlocked: the state as this command left it, to know at [`Kernel::relock`]
    /// whether another command changed it meanwhile.
    left: Option<Mark>,
}

/// What moves when a command changes the state: the blob's generation (a snapshot) and the
/// state log's file and length (a change line).
#[derive(Debug, PartialEq, Eq)]
struct Mark {
    generation: u64,
    log: Option<(u64, u64, u64)>,
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
            left: None,
        })
    }

    fn mark(&self) -> Result<Mark> {
        use std::os::unix::fs::MetadataExt;
        let generation = self.target().state_generation()?;
        let log = std::fs::metadata(self.state_log.path())
            .ok()
            .map(|m| (m.dev(), m.ino(), m.len()));
        Ok(Mark { generation, log })
    }

    /// Let other trapctl commands use the module while this one waits (for its command, or
    /// between once mode's looks): a `trapctl list` or `trapctl splice` run by the covered
    /// command itself would otherwise wait for this command, which waits for it, for ever.
    /// What this command made stays live and saved; before its next change it calls
    /// [`Kernel::relock`]. Call only after a save (nothing unsaved may be left in memory). If
    /// the state's mark cannot be read or the lock let go, it says so and keeps the lock (the
    /// command goes on as before, other commands waiting for it).
    pub fn unlock(&mut self) {
        if self.left.is_some() {
            return;
        }
        let let_go = self.mark().and_then(|mark| {
            self.target().unlock()?;
            Ok(mark)
        });
        match let_go {
            Ok(mark) => self.left = Some(mark),
            Err(e) => log::warn!("keeping /dev/trapvec locked while this command waits: {e:#}"),
        }
    }

    /// Take the lock back after [`Kernel::unlock`] (waiting for another command to finish
    /// first). If another command changed the state meanwhile, the state is restored from
    /// the module and the log again, as [`Kernel::open`] does: splice ids stay what they were,
    /// and a splice another command removed is no longer there.
    pub fn relock(&mut self) -> Result<()> {
        let Some(left) = self.left.take() else {
            return Ok(());
        };
        self.target().lock_exclusive()?;
        if self.mark()? == left {
            return Ok(());
        }
        log::info!("another trapctl changed the state while this one waited: reading it again");
        self.target().unlock()?;
        *self = Kernel::open()?;
        Ok(())
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
