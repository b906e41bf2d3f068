//! The module watch (`kmod/modwatch.c`): hear of kernel modules as they come and go, and hold
//! each one's load (or removal) until answered.
//!
//! A [`ModuleWatch`] is a file of `/dev/trapvec` of its own, made the module's one watcher
//! (WATCH). [`ModuleWatch::next`] hands out the next event: a module *coming* (its symbols in
//! `/proc/kallsyms`, its init not run yet) or *going* (its exit has run, its text not freed
//! yet). The task loading or removing that module waits in the kernel until
//! [`ModuleWatch::answer`] (at most the module parameter `watch_timeout_ms`, 5 s by default):
//! meanwhile the watcher may splice the coming module with deferred patches
//! ([`super::KernelTarget::set_deferred`]) or take its splices out of the going one. Dropping
//! the watch closes its file, which releases every waiting task at once.

use std::fs::OpenOptions;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;

use super::ioctl::{self, Request};
use crate::abi::{
    TrapvecModack, TrapvecModevent, TrapvecWatch, TRAPVEC_MODEVENT_COMING, TRAPVEC_MODEVENT_GOING,
};

/// What a module event says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleState {
    /// Loaded, not initialized: splice it now and its init's calls are counted.
    Coming,
    /// Its exit has run; its text goes once the event is answered.
    Going,
}

/// One module coming or going, held until answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleEvent {
    /// The event's number, for [`ModuleWatch::answer`].
    pub seq: u64,
    pub state: ModuleState,
    /// The module's name as `/proc/kallsyms` shows it (`[name]`).
    pub name: String,
    /// The module's core text `[text_base, text_base + text_size)`.
    pub text_base: u64,
    pub text_size: u64,
}

/// Why the watch failed.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("opening {path} for the module watch (is trapvec.ko loaded, and are you root?)")]
    Open {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("another process is trapvec.ko's module watcher already (WATCH: {0})")]
    Busy(Errno),
    #[error("{op} of the module watch: {errno}")]
    Ioctl { op: &'static str, errno: Errno },
    #[error("module event {seq} is no longer waiting: its wait timed out (watch_timeout_ms) before the answer")]
    TooLate { seq: u64 },
    #[error("trapvec.ko sent a module event of unknown state {0}")]
    UnknownState(u32),
}

/// The module's one watcher, through a file of its own.
pub struct ModuleWatch {
    dev: OwnedFd,
}

impl ModuleWatch {
    /// Open `/dev/trapvec` and become the watcher.
    pub fn open() -> Result<ModuleWatch, WatchError> {
        Self::open_at(Path::new(super::DEVICE_PATH))
    }

    /// Open the module's device at `device` and become the watcher.
    pub fn open_at(device: &Path) -> Result<ModuleWatch, WatchError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .map_err(|source| WatchError::Open {
                path: device.display().to_string(),
                source,
            })?;
        let watch = ModuleWatch { dev: file.into() };
        let mut arg = TrapvecWatch::default();
        ioctl::ioctl(watch.dev.as_fd(), Request::Watch(&mut arg)).map_err(|e| match e {
            Errno::EBUSY => WatchError::Busy(e),
            errno => WatchError::Ioctl { op: "WATCH", errno },
        })?;
        Ok(watch)
    }

    /// The next event, waiting at most `timeout` for one (`None`: none came, or a signal).
    pub fn next(&self, timeout: Duration) -> Result<Option<ModuleEvent>, WatchError> {
        let mut arg = TrapvecModevent {
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            ..TrapvecModevent::default()
        };
        match ioctl::ioctl(self.dev.as_fd(), Request::Modevent(&mut arg)) {
            Ok(()) => {}
            Err(Errno::EAGAIN | Errno::EINTR) => return Ok(None),
            Err(errno) => {
                return Err(WatchError::Ioctl {
                    op: "MODEVENT",
                    errno,
                })
            }
        }
        Ok(Some(event_of(&arg)?))
    }

    /// Answer event `seq`: `Ok(())` lets the module go on; `Err(errno)` (a coming module
    /// only) refuses its load with that errno (a positive number, as `EINVAL`).
    pub fn answer(&self, seq: u64, verdict: Result<(), Errno>) -> Result<(), WatchError> {
        let mut arg = TrapvecModack {
            seq,
            error: match verdict {
                Ok(()) => 0,
                Err(e) => -(e as i32),
            },
            pad: 0,
        };
        ioctl::ioctl(self.dev.as_fd(), Request::Modack(&mut arg)).map_err(|e| match e {
            Errno::ENOENT => WatchError::TooLate { seq },
            errno => WatchError::Ioctl {
                op: "MODACK",
                errno,
            },
        })
    }
}

/// The event in `raw` (the name up to its NUL).
fn event_of(raw: &TrapvecModevent) -> Result<ModuleEvent, WatchError> {
    let state = match raw.state {
        TRAPVEC_MODEVENT_COMING => ModuleState::Coming,
        TRAPVEC_MODEVENT_GOING => ModuleState::Going,
        other => return Err(WatchError::UnknownState(other)),
    };
    let len = raw
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(raw.name.len());
    Ok(ModuleEvent {
        seq: raw.seq,
        state,
        name: String::from_utf8_lossy(&raw.name[..len]).into_owned(),
        text_base: raw.text_base,
        text_size: raw.text_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_module_up_to_the_nul_and_refuses_unknown_states() {
        let mut raw = TrapvecModevent {
            seq: 7,
            state: TRAPVEC_MODEVENT_COMING,
            text_base: 0xffff_ffff_c000_0000,
            text_size: 0x2000,
            ..TrapvecModevent::default()
        };
        raw.name[..9].copy_from_slice(b"modcalls\0");
        raw.name[9] = b'x'; // past the NUL: not part of the name
        let ev = event_of(&raw).unwrap();
        assert_eq!(ev.name, "modcalls");
        assert_eq!(ev.state, ModuleState::Coming);
        assert_eq!((ev.seq, ev.text_size), (7, 0x2000));
        raw.state = 3;
        assert!(matches!(event_of(&raw), Err(WatchError::UnknownState(3))));
    }
}
