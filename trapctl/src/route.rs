//! Where a command goes: through trapd when one is listening on its socket (`--socket`, else
//! `$TRAPD_SOCKET`, else `/run/trapd.sock`), else straight to `/dev/trapvec` ([`Kernel`]).
//!
//! Both ways run the same request through [`instr_manager::ops::execute`] and give back the
//! same typed [`Reply`], so a command prints the same either way. The daemon holds the module's lock while it runs, so
//! going through it is the only way a command can act then; and the daemon journals the change
//! and keeps its `list` right.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use instr_manager::ops::{self, Made, Reply, UnspliceReply, Unspliced, WrongReply};
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

/// Remove the splices at `sites` and return what each removal gave back: one `remove` request,
/// or through trapd as many as its request line ([`trapvec_proto::protocol::MAX_LINE`]) takes
/// (tens of thousands of coverage or glob sites make a line of megabytes, which trapd refuses).
pub fn remove(sites: Vec<String>) -> Result<Vec<Unspliced>> {
    let parts = if client::is_listening(socket()) {
        request_parts(sites, REMOVE_LINE_BUDGET)
    } else {
        vec![sites]
    };
    let mut removed = Vec::new();
    for at in parts {
        match change(&Request::Remove { at }, |_| {})? {
            UnspliceReply::All(all) => removed.extend(all.unspliced),
            other => bail!("a removal was answered with {other:?}"),
        }
    }
    Ok(removed)
}

/// Bytes of site names one `remove` request to trapd carries: its line limit less room for the
/// rest of the request (the op, the quotes and commas are counted per site).
const REMOVE_LINE_BUDGET: usize = trapvec_proto::protocol::MAX_LINE - 1024;

/// `sites` in order, cut into parts whose names (each with 3 bytes of quotes and comma) fit in
/// `budget` bytes; a part has at least one site.
fn request_parts(sites: Vec<String>, budget: usize) -> Vec<Vec<String>> {
    let mut parts: Vec<Vec<String>> = Vec::new();
    let mut used = 0;
    for site in sites {
        let len = site.len() + 3;
        match parts.last_mut() {
            Some(part) if used + len <= budget => part.push(site),
            _ => {
                parts.push(vec![site]);
                used = 0;
            }
        }
        used += len;
    }
    parts
}

#[cfg(test)]
mod tests {
    #[test]
    fn removals_through_trapd_fit_its_request_line() {
        use trapvec_proto::protocol::MAX_LINE;
        use trapvec_proto::Request;
        // 100,000 kernel sites: one request would be about 2.2 MB.
        let sites: Vec<String> = (0..100_000u64)
            .map(|i| format!("{:#x}", 0xffff_ffff_8100_0000 + i * 7))
            .collect();
        let parts = super::request_parts(sites.clone(), super::REMOVE_LINE_BUDGET);
        assert!(parts.len() > 1 && parts.iter().all(|p| !p.is_empty()));
        for part in &parts {
            let line = serde_json::to_string(&Request::Remove { at: part.clone() }).unwrap();
            assert!(line.len() < MAX_LINE, "{} bytes", line.len());
        }
        // Every site once, in order.
        assert_eq!(parts.concat(), sites);
        assert_eq!(
            super::request_parts(Vec::new(), 100),
            Vec::<Vec<String>>::new()
        );
        // A site longer than the budget still goes, alone.
        let long = vec!["a".repeat(50), "b".into(), "c".into()];
        assert_eq!(
            super::request_parts(long.clone(), 10),
            vec![
                vec![long[0].clone()],
                vec!["b".to_string(), "c".to_string()]
            ]
        );
    }
}
