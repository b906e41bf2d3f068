//! Where a command goes: through trapd when one is listening on its socket (`--socket`, else
//! `$TRAPD_SOCKET`, else `/run/trapd.sock`), else straight to `/dev/trapvec` ([`Kernel`]).
//!
//! Both ways run the same request through [`instr_manager::ops::execute`] and give back the
//! same typed [`Reply`], so a command prints the same either way. The daemon holds the module's lock while it runs, so
//! going through it is the only way a command can act then; and the daemon journals the change
//! and keeps its `list` right.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use instr_manager::ops::{self, Made, Reply, WrongReply};
use instr_manager::splicer::Splicer;
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

/// A change: sent to trapd if one listens, else [`ops::execute`]d on the kernel (after
/// `setup`, e.g. a quiescence timeout), whose change is then saved in the module (or undone if
/// it cannot be). The reply is the part `R` of it the request answers with.
pub fn change<R: TryFrom<Reply, Error = WrongReply>>(
    request: &Request,
    setup: impl FnOnce(&mut Splicer<KernelTarget>),
) -> Result<R> {
    if let Some(reply) = client::ask(socket(), request) {
        return Ok(R::try_from(reply?)?);
    }
    let mut k = Kernel::open()?;
    setup(&mut k.splicer);
    let retiring_before: Vec<u64> = k.splicer.retiring().map(|s| s.id.0).collect();
    let (reply, made) = match ops::execute(&mut k.splicer, request) {
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
    Ok(R::try_from(reply)?)
}

/// A read: answered by trapd if one listens, else [`ops::execute`]d on the kernel.
pub fn read<R: TryFrom<Reply, Error = WrongReply>>(request: &Request) -> Result<R> {
    if let Some(reply) = client::ask(socket(), request) {
        return Ok(R::try_from(reply?)?);
    }
    let mut k = Kernel::open()?;
    let (reply, _) = ops::execute(&mut k.splicer, request)?;
    Ok(R::try_from(reply)?)
}

/// Execute `request` on `k`, the module held open by a command across several requests (a
/// hold): the reply part `R` and what it made, which the caller saves or undoes.
pub fn execute<R: TryFrom<Reply, Error = WrongReply>>(
    k: &mut Kernel,
    request: &Request,
) -> Result<(R, Made)> {
    let (reply, made) = ops::execute(&mut k.splicer, request)?;
    Ok((R::try_from(reply)?, made))
}

/// A request only trapd can answer (profiles, its status).
pub fn daemon_only<R: TryFrom<Reply, Error = WrongReply>>(request: &Request) -> Result<R> {
    let reply = client::ask(socket(), request).with_context(|| {
        format!(
            "no trapd is listening on {} (start trapd, or give its --socket)",
            socket().display()
        )
    })??;
    Ok(R::try_from(reply)?)
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
