//! Errors of the target layer. Each names the address, block or symbol at fault.
//!
//! Also [`error_chain`], the one way every crate of the workspace shows an error to a person: an
//! error's message describes its own layer only and exposes the layer below as
//! [`std::error::Error::source`], so the whole story is the chain, printed once.

use thiserror::Error;

/// What went wrong while touching a target.
#[derive(Debug, Error)]
pub enum TargetError {
    #[error("cannot read {len} bytes at {addr:#x}: {reason}")]
    Read {
        addr: u64,
        len: usize,
        reason: String,
    },
    #[error("no repository memory of {size} bytes within reach (±2 GiB) of {near:#x}: {reason}")]
    Alloc {
        near: u64,
        size: usize,
        reason: String,
    },
    #[error("repository block at {addr:#x} (+{offset:#x}, {len} bytes): {reason}")]
    Block {
        addr: u64,
        offset: usize,
        len: usize,
        reason: String,
    },
    #[error("text at {addr:#x} does not hold the expected bytes (expected {expected}, found {found}); batch not applied")]
    TextMismatch {
        addr: u64,
        expected: String,
        found: String,
    },
    #[error("text patch at {addr:#x}: {reason}")]
    Text { addr: u64, reason: String },
    #[error("the kernel refuses to patch {addr:#x}: {reason}")]
    SiteRefused {
        addr: u64,
        reason: crate::kernel::SiteRefusal,
    },
    #[error("dispatch entry for site {site:#x}: {reason}")]
    Dispatch { site: u64, reason: String },
    #[error("the state blob of trapvec.ko changed under us (read generation {expected}, now {current}): another trapctl ran meanwhile; run the command again")]
    StateStale { expected: u64, current: u64 },
    #[error("quiescence not reached: {0}")]
    Quiesce(String),
    #[error("installing trapvec's signal handlers")]
    Signals(#[from] crate::process::SignalError),
    #[error("kernel symbols from {path}")]
    Kallsyms {
        path: &'static str,
        #[source]
        source: crate::kernel::kallsyms::KallsymsError,
    },
    #[error("{what}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("return point {what}: {reason}")]
    ReturnPoint { what: String, reason: String },
    #[error("predicate {predicate}: {reason}")]
    Predicate { predicate: String, reason: String },
    #[error("keyed count {what}: {reason}")]
    KeyedCount { what: String, reason: String },
    #[error("{what} are not supported on {target}")]
    Unsupported { what: &'static str, target: String },
    #[error("{0}")]
    Other(String),
}

impl TargetError {
    /// Wrap an OS error with what was being done.
    pub fn os(what: impl Into<String>, source: impl Into<std::io::Error>) -> Self {
        TargetError::Os {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// The error and its causes on one line, `what: why: root cause`: each message of the
/// [`source`](std::error::Error::source) chain once, outermost first, joined with `": "`.
///
/// For `anyhow::Error`, pass `err.as_ref()` (its context layers are sources too).
pub fn error_chain(e: &(dyn std::error::Error + '_)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("loading {path}")]
    struct Top {
        path: String,
        #[source]
        source: TargetError,
    }

    #[test]
    fn error_chain_prints_each_layer_once_outermost_first() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let root = io.to_string();
        let e = Top {
            path: "c.o".into(),
            source: TargetError::os("opening /dev/trapvec", io),
        };
        assert_eq!(
            error_chain(&e),
            format!("loading c.o: opening /dev/trapvec: {root}")
        );
        assert_eq!(root.matches("No such file").count(), 1, "{root}");
        assert_eq!(error_chain(&e).matches("No such file").count(), 1);
    }

    #[test]
    fn error_chain_of_a_single_error_is_its_message() {
        assert_eq!(
            error_chain(&TargetError::Quiesce("a task is inside".into())),
            "quiescence not reached: a task is inside"
        );
    }
}
