//! Where a command goes: through trapd when one is listening on its socket (`--socket`, else
//! `$TRAPD_SOCKET`, else `/run/trapd.sock`), else straight to `/dev/trapvec` ([`Kernel`]).
//!
//! Both ways run the same [`instr_manager::ops`] operation and give back the same report, so a
//! command prints the same either way. The daemon holds the module's lock while it runs, so
//! going through it is the only way a command can act then; and the daemon journals the change
//! and keeps its `list` right.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use instr_manager::ops::{Made, OpError};
use instr_manager::splicer::Splicer;
use serde::de::DeserializeOwned;
use trapvec::kernel::KernelTarget;
use trapvec_proto::client;
use trapvec_proto::Request;

use crate::kernel::Kernel;

static SOCKET: OnceLock<PathBuf> = OnceLock::new();

/// Use `path` as trapd's socket instead of `$TRAPD_SOCKET` or the default.
pub fn set_socket(path: Option<PathBuf>) {
    let _ = SOCKET.set(path.unwrap_or_else(client::socket_path));
}

/// trapd's socket.
pub fn socket() -> &'static Path {
    SOCKET.get_or_init(client::socket_path)
}

/// A change: sent to trapd if one listens, else `direct` on the kernel, whose change is then
/// saved in the module (or undone if it cannot be).
pub fn change<R: DeserializeOwned>(
    request: &Request,
    direct: impl FnOnce(&mut Splicer<KernelTarget>) -> Result<(R, Made), OpError>,
) -> Result<R> {
    if let Some(reply) = client::call(socket(), request) {
        return reply;
    }
    let mut k = Kernel::open()?;
    let retiring_before: Vec<u64> = k.splicer.retiring().map(|s| s.id.0).collect();
    let (report, made) = match direct(&mut k.splicer) {
        Ok(r) => r,
        Err(e) => {
            // A removal that could not reach quiescence has restored the text and left its
            // splices retiring: that change must be saved, or the next command would find
            // the text unlike the state and could not finish the removal.
            if k.splicer.retiring().map(|s| s.id.0).collect::<Vec<_>>() != retiring_before {
                if let Err(s) = k.save() {
                    return Err(anyhow::Error::new(e).context(format!(
                        "and saving the retiring splices failed: {}",
                        trapvec::error_chain(s.as_ref())
                    )));
                }
            }
            return Err(e.into());
        }
    };
    k.commit_or_undo(&made)?;
    Ok(report)
}

/// A read: answered by trapd if one listens, else by `direct` on the kernel.
pub fn read<R: DeserializeOwned>(
    request: &Request,
    direct: impl FnOnce(&Splicer<KernelTarget>) -> Result<R, OpError>,
) -> Result<R> {
    if let Some(reply) = client::call(socket(), request) {
        return reply;
    }
    let k = Kernel::open()?;
    Ok(direct(&k.splicer)?)
}

/// A request only trapd can answer (profiles, its status).
pub fn daemon_only<R: DeserializeOwned>(request: &Request) -> Result<R> {
    client::call(socket(), request).with_context(|| {
        format!(
            "no trapd is listening on {} (start trapd, or give its --socket)",
            socket().display()
        )
    })?
}

/// For a command that only works on the module itself: refused while trapd runs (it holds
/// the module's lock for its whole life, so the command would wait for ever).
pub fn direct_only(command: &str) -> Result<()> {
    if client::is_listening(socket()) {
        anyhow::bail!("trapd is running (listening on {}) and holds /dev/trapvec; `trapctl {command}` needs the module to itself: stop trapd first", socket().display());
    }
    Ok(())
}

/// `path` made absolute, as trapd (another process, elsewhere) must be given it.
pub fn absolute(path: &Path) -> Result<PathBuf> {
    std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))
}
