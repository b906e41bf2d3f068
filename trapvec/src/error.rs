//! Errors of the target layer. Each names the address, block or symbol at fault.

use thiserror::Error;

/// What went wrong while touching a target.
#[derive(Debug, Error)]
pub enum TargetError {
    #[error("cannot read {len} bytes at {addr:#x}: {reason}")]
    Read { addr: u64, len: usize, reason: String },
    #[error("no repository memory of {size} bytes within reach (±2 GiB) of {near:#x}: {reason}")]
    Alloc { near: u64, size: usize, reason: String },
    #[error("repository block at {addr:#x} (+{offset:#x}, {len} bytes): {reason}")]
    Block { addr: u64, offset: usize, len: usize, reason: String },
    #[error("text at {addr:#x} does not hold the expected bytes (expected {expected}, found {found}); batch not applied")]
    TextMismatch { addr: u64, expected: String, found: String },
    #[error("text patch at {addr:#x}: {reason}")]
    Text { addr: u64, reason: String },
    #[error("the kernel refuses to patch {addr:#x}: {reason}")]
    SiteRefused { addr: u64, reason: crate::kernel::SiteRefusal },
    #[error("dispatch entry for site {site:#x}: {reason}")]
    Dispatch { site: u64, reason: String },
    #[error("the state blob of trapvec.ko changed under us (read generation {expected}, now {current}): another trapctl ran meanwhile; run the command again")]
    StateStale { expected: u64, current: u64 },
    #[error("quiescence not reached: {0}")]
    Quiesce(String),
    #[error("{what}: {source}")]
    Os { what: String, #[source] source: std::io::Error },
    #[error("{0}")]
    Other(String),
}

impl TargetError {
    /// Wrap an OS error with what was being done.
    pub fn os(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        TargetError::Os { what: what.into(), source: source.into() }
    }
}

/// Render bytes as `cd f5 90` for messages.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}
