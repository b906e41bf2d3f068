//! A uprobe on a function of a file, through tracefs (`uprobe_events`, the event's `enable`),
//! removed when dropped: the kernel's own trap-based user-space probe, the anchor `bench cost`
//! compares trapvec's trap splice with.
//!
//! Needs root, tracefs and `CONFIG_UPROBE_EVENTS`. When tracefs is not mounted and we are root,
//! it is mounted at `/sys/kernel/tracing` for the measurement and unmounted afterwards. Every
//! failure is an [`UprobeError`], whose chain the report prints in place of the row.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";
const GROUP: &str = "trapvec_bench";

/// Why a uprobe cannot be placed or switched; each names the file, symbol or tracefs path.
#[derive(Debug, thiserror::Error)]
pub enum UprobeError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
    #[error("no symbol `{symbol}` in {path}")]
    NoSymbol { symbol: String, path: PathBuf },
    #[error("`{symbol}` at {addr:#x} is in no segment of {path}")]
    NoSegment {
        symbol: String,
        addr: u64,
        path: PathBuf,
    },
    #[error("opening {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing `{line}` to {path}")]
    Write {
        line: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tracefs is not mounted and mounting it at {TRACEFS} failed")]
    Mount(#[source] std::io::Error),
    #[error("not root: uprobe_events needs root")]
    NotRoot,
    #[error("tracefs has no uprobe_events (kernel without CONFIG_UPROBE_EVENTS)")]
    NoUprobeEvents,
}

/// The file offset of `symbol` in the ELF at `path` (what `uprobe_events` wants).
pub fn file_offset(path: &Path, symbol: &str) -> Result<u64, UprobeError> {
    let data = std::fs::read(path).map_err(|source| UprobeError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|source| UprobeError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    let sym = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(symbol))
        .ok_or_else(|| UprobeError::NoSymbol {
            symbol: symbol.to_string(),
            path: path.to_path_buf(),
        })?;
    let addr = sym.address();
    vmtest::uprobe::file_offset(&data, addr)
        .map_err(|source| UprobeError::Parse {
            path: path.to_path_buf(),
            source,
        })?
        .ok_or_else(|| UprobeError::NoSegment {
            symbol: symbol.to_string(),
            addr,
            path: path.to_path_buf(),
        })
}

/// A live uprobe with its trace event enabled.
pub struct Probe {
    dir: PathBuf,
    event: String,
    mounted: bool,
}

fn append(path: &Path, line: &str) -> Result<(), UprobeError> {
    let mut f = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|source| UprobeError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    f.write_all(line.as_bytes())
        .map_err(|source| UprobeError::Write {
            line: line.trim().to_string(),
            path: path.to_path_buf(),
            source,
        })
}

fn mount_tracefs() -> Result<(), UprobeError> {
    let target = c"/sys/kernel/tracing";
    debug_assert_eq!(target.to_bytes(), TRACEFS.as_bytes());
    let fstype = c"tracefs";
    // SAFETY: all three strings are NUL-terminated and outlive the call; data is null.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(UprobeError::Mount(std::io::Error::last_os_error()));
    }
    Ok(())
}

impl Probe {
    /// Probe `path` at file offset `offset`.
    pub fn add(path: &Path, offset: u64) -> Result<Probe, UprobeError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(UprobeError::NotRoot);
        }
        let mut mounted = false;
        let dir = if Path::new(TRACEFS).join("uprobe_events").exists() {
            PathBuf::from(TRACEFS)
        } else if Path::new(DEBUGFS_TRACING).join("uprobe_events").exists() {
            PathBuf::from(DEBUGFS_TRACING)
        } else {
            mount_tracefs()?;
            mounted = true;
            if !Path::new(TRACEFS).join("uprobe_events").exists() {
                unmount();
                return Err(UprobeError::NoUprobeEvents);
            }
            PathBuf::from(TRACEFS)
        };
        let event = format!("target_{}", std::process::id());
        let probe = Probe {
            dir,
            event,
            mounted,
        };
        append(
            &probe.dir.join("uprobe_events"),
            &format!("p:{GROUP}/{} {}:{offset:#x}\n", probe.event, path.display()),
        )?;
        let enable = probe
            .dir
            .join("events")
            .join(GROUP)
            .join(&probe.event)
            .join("enable");
        append(&enable, "1\n")?;
        log::debug!(
            "uprobe {GROUP}/{} on {}:{offset:#x} enabled",
            probe.event,
            path.display()
        );
        Ok(probe)
    }

    /// Turn the trace event (and so the probe) on or off.
    pub fn set_enabled(&self, on: bool) -> Result<(), UprobeError> {
        let enable = self
            .dir
            .join("events")
            .join(GROUP)
            .join(&self.event)
            .join("enable");
        append(&enable, if on { "1\n" } else { "0\n" })
    }

    /// Hits so far, from `uprobe_profile`.
    pub fn hits(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir.join("uprobe_profile")).ok()?;
        // `  FILE EVENT NHIT`; the event is printed without its group on most kernels.
        let full = format!("{GROUP}/{}", self.event);
        text.lines()
            .find(|l| l.split_whitespace().any(|w| w == self.event || w == full))?
            .split_whitespace()
            .last()?
            .parse()
            .ok()
    }
}

fn unmount() {
    if let Ok(target) = std::ffi::CString::new(TRACEFS) {
        // SAFETY: `target` is NUL-terminated.
        unsafe { libc::umount(target.as_ptr()) };
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let enable = self
            .dir
            .join("events")
            .join(GROUP)
            .join(&self.event)
            .join("enable");
        if let Err(e) = append(&enable, "0\n") {
            log::warn!("disabling the uprobe: {}", trapvec::error_chain(&e));
        }
        if let Err(e) = append(
            &self.dir.join("uprobe_events"),
            &format!("-:{GROUP}/{}\n", self.event),
        ) {
            log::warn!("removing the uprobe: {}", trapvec::error_chain(&e));
        }
        if self.mounted {
            unmount();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function of this test binary with a plain symbol name.
    #[no_mangle]
    #[inline(never)]
    extern "C" fn bench_uprobe_offset_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555
    }

    #[test]
    fn a_symbols_file_offset_holds_the_bytes_it_runs() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let offset = file_offset(&exe, "bench_uprobe_offset_target").unwrap();
        let file = std::fs::read(&exe).unwrap();
        let at = usize::try_from(offset).unwrap();
        let f: extern "C" fn(u64) -> u64 = bench_uprobe_offset_target;
        // SAFETY: the 16 bytes from the function's start lie in this binary's mapped, readable
        // text (the function, then its padding or the next function), which nothing writes.
        let running = unsafe { std::slice::from_raw_parts(f as *const u8, 16) };
        assert_eq!(&file[at..at + 16], running);
        assert_eq!(f(1), 0x9e37_79b9_7f4a_7c15 ^ 0x5555);
        assert!(matches!(
            file_offset(&exe, "no_such_symbol_here"),
            Err(UprobeError::NoSymbol { .. })
        ));
    }
}
