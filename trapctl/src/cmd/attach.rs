//! `trapctl -p PID attach | apply SPEC | list [--json] | unsplice AT|--all | detach`: the
//! process commands against a running process, through its agent's control channel (loaded by
//! ptrace by the first of them, see [`crate::attach`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use instr_manager::ops::{
    ApplyReport, CheckReport, ListReply, SpliceReply, SpliceRow, UnspliceReply,
};
use instr_manager::splice::{SpliceOptions, When};
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Spec;
use trapvec_proto::Request;

use crate::attach;

/// Load the agent into the running process `-p PID` and start its control channel.
#[derive(clap::Args)]
#[command(long_about = "\
Load trapvec's agent into the running process given by -p PID and start its control channel (a
Unix socket only the process's uid or root may use): every thread is seized and stopped with
ptrace, one of them calls libc's dlopen(agent) and the agent's trapvec_agent_attach(), its
registers are put back exactly, and every thread goes on (a thread blocked in a system call goes
back into it: no EINTR). -v prints how long the threads were held.

Refused, with the reason and before anything is changed: a process of another user (unless
root), one already traced (gdb, strace), yama's ptrace_scope forbidding it, a static binary, a
process where executable mappings are forbidden (MemoryDenyWriteExecute, seccomp).

`trapctl -p PID apply SPEC`, `list`, `unsplice` attach first when no agent answers.")]
pub struct AttachArgs {
    /// The agent to load [default: $TRAPVEC_AGENT, else found next to trapctl].
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
}

/// Remove every splice from the process `-p PID` and stop its agent's channel.
#[derive(clap::Args)]
#[command(long_about = "\
Remove every splice from the process given by -p PID, in one batch (the removal waits until no
thread is inside a trampoline or a component), then stop the agent's control channel and remove
its socket. The text is as it was before the first splice; the agent stays mapped, idle (a later
attach reuses it).")]
pub struct DetachArgs {}

/// The agent's socket in `pid`, after attaching if none answers.
fn channel(pid: i32, agent: Option<&Path>, verbose: bool) -> Result<PathBuf> {
    if let Some(s) = attach::agent_socket(pid) {
        return Ok(s);
    }
    let agent = crate::cmd::cover::find_agent(agent)?;
    attach::attach(pid, &agent, verbose)
}

pub fn attach(pid: i32, args: &AttachArgs, verbose: bool) -> Result<()> {
    let already = attach::agent_socket(pid).is_some();
    let socket = channel(pid, args.agent.as_deref(), verbose)?;
    match already {
        true => println!(
            "process {pid}: its agent already listens on {}",
            socket.display()
        ),
        false => println!(
            "attached to process {pid}: agent listening on {}",
            socket.display()
        ),
    }
    Ok(())
}

pub fn apply(pid: i32, args: &crate::cmd::apply::ApplyArgs, verbose: bool) -> Result<()> {
    let file = args.spec.display().to_string();
    let spec = Spec::from_path(&args.spec)?;
    let path = std::fs::canonicalize(&args.spec).with_context(|| file.clone())?;
    let socket = channel(pid, None, verbose)?;
    let request = Request::Apply {
        spec: path,
        best_effort: args.best_effort,
        check: args.check,
    };
    if args.check {
        let report: CheckReport = attach::ask(pid, &socket, &request)?;
        return crate::cmd::apply::print_check(&report, false, spec.splices.len());
    }
    let report: ApplyReport = attach::ask(pid, &socket, &request)
        .with_context(|| format!("{file}: nothing was applied"))?;
    for c in &report.components {
        println!("loaded {} (crc32 {}) at {}", c.name, c.crc32, c.code);
    }
    for s in &report.spliced {
        println!(
            "spliced {} at {} by {}: {}",
            s.at, s.site, s.mechanism, s.action
        );
    }
    for e in &report.refused {
        eprintln!("refused: {e}");
    }
    if !report.refused.is_empty() {
        return Err(crate::PartlyApplied(format!(
            "{} of {} splices refused ({} applied)",
            report.refused.len(),
            report.requested,
            report.spliced.len()
        ))
        .into());
    }
    Ok(())
}

pub fn list(pid: i32, json: bool, verbose: bool) -> Result<()> {
    let socket = channel(pid, None, verbose)?;
    let r: ListReply = attach::ask(pid, &socket, &Request::List)?;
    if json {
        return crate::print(&format!("{}\n", serde_json::to_string_pretty(&r)?));
    }
    let mut out = String::new();
    if r.listing.splices.is_empty() {
        out.push_str(&format!("no splices in process {pid}\n"));
    }
    for s in &r.listing.splices {
        out.push_str(&format!(
            "{:>4} {} at {} ({}+{:#x}) by {}: {}, {} hits\n",
            s.id, s.at, s.site, s.function, s.offset, s.mechanism, s.action, s.hits
        ));
    }
    for c in &r.listing.components {
        out.push_str(&format!(
            "component {} (crc32 {}) at {}\n",
            c.name, c.crc32, c.code
        ));
    }
    crate::print(&out)
}

pub fn unsplice(pid: i32, at: Option<&str>, all: bool, verbose: bool) -> Result<()> {
    let Some(socket) = attach::agent_socket(pid) else {
        let _ = verbose;
        bail!("process {pid} has no agent attached: nothing to unsplice");
    };
    let request = Request::Unsplice {
        at: if all { None } else { at.map(str::to_string) },
        all,
    };
    match attach::ask::<UnspliceReply>(pid, &socket, &request)? {
        UnspliceReply::One(u) => println!(
            "unspliced {} at {}: {} hits, {} missed",
            u.at, u.site, u.hits, u.missed
        ),
        UnspliceReply::All(all) => {
            for u in &all.unspliced {
                println!(
                    "unspliced {} at {}: {} hits, {} missed",
                    u.at, u.site, u.hits, u.missed
                );
            }
            println!("unspliced {} splice(s)", all.unspliced.len());
        }
        UnspliceReply::Pending(p) => println!("forgot pending point {}", p.at),
    }
    Ok(())
}

pub fn detach(pid: i32) -> Result<()> {
    let Some(socket) = attach::agent_socket(pid) else {
        bail!("process {pid} has no agent attached: nothing to detach");
    };
    let reply = attach::send(pid, &socket, &serde_json::json!({"op": "detach"}))?;
    println!(
        "detached from process {pid}: {} splice(s) removed",
        reply["unspliced"].as_u64().unwrap_or(0)
    );
    Ok(())
}

/// The splice `request` made in `pid` (attaching first if needed); its row.
fn splice_in(pid: i32, request: &SpliceRequest, verbose: bool) -> Result<SpliceRow> {
    if instr_manager::glob::is_glob(&request.at) {
        bail!(
            "with -p, splice and count take one point, not a glob (`{}`): use `trapctl -p {pid} apply SPEC`",
            request.at
        );
    }
    let socket = channel(pid, None, verbose)?;
    match attach::ask::<SpliceReply>(pid, &socket, &Request::Splice(request.clone()))? {
        SpliceReply::Made(row) => Ok(*row),
        SpliceReply::Pending(p) => bail!(
            "process {pid}: {} is pending (module {} not loaded)",
            p.at,
            p.module
        ),
    }
}

/// `trapctl -p PID splice AT --count|--call SYM|--replace SYM`: one splice made by the agent.
pub fn splice(pid: i32, args: &crate::cmd::splice::SpliceArgs, verbose: bool) -> Result<()> {
    let action = match (&args.call, &args.replace, args.count) {
        (Some(h), None, false) => Action::Call {
            handler: h.clone(),
            cookie: args.cookie.unwrap_or(0),
        },
        (None, Some(f), false) => Action::Replace { with: f.clone() },
        (None, None, true) => Action::Count,
        _ => bail!("give exactly one of --call SYM, --replace SYM and --count"),
    };
    let request = SpliceRequest {
        at: args.at.clone(),
        action,
        mechanism: args.mechanism,
        options: SpliceOptions {
            when: if args.at_return {
                When::Return
            } else {
                When::Entry
            },
            maxactive: args.maxactive,
            by: args.by,
            only: args.only.predicate(),
            owner: None,
        },
    };
    let s = splice_in(pid, &request, verbose)?;
    if args.json {
        return crate::print(&format!("{}\n", serde_json::to_string_pretty(&s)?));
    }
    println!(
        "spliced {} at {} ({}+{:#x}) by {}: {}; displaced `{}`",
        s.at, s.site, s.function, s.offset, s.mechanism, s.action, s.displaced
    );
    Ok(())
}

/// `trapctl -p PID count AT --seconds N`: a count spliced by the agent, its hits read after N
/// seconds by removing it.
pub fn count(pid: i32, args: &crate::cmd::count::Args, verbose: bool) -> Result<()> {
    let Some(seconds) = args.span.seconds else {
        bail!("with -p, count needs --seconds N (the process runs on its own: no COMMAND, no Ctrl-C wait)");
    };
    if args.by.is_some() || args.best_effort {
        bail!("with -p, count takes no --by or --best-effort (use `trapctl -p {pid} splice AT --count --by KEY` and `list --json`)");
    }
    let request = SpliceRequest {
        at: args.function.clone(),
        action: Action::Count,
        mechanism: args.mechanism,
        options: SpliceOptions {
            only: args.only.predicate(),
            ..Default::default()
        },
    };
    let row = splice_in(pid, &request, verbose)?;
    println!(
        "counting {} at {} in process {pid} for {seconds} s",
        args.function, row.site
    );
    let start = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs_f64(seconds));
    let socket = attach::agent_socket(pid)
        .with_context(|| format!("process {pid}: its agent no longer answers"))?;
    let removed = match attach::ask::<UnspliceReply>(
        pid,
        &socket,
        &Request::Unsplice {
            at: Some(row.site.clone()),
            all: false,
        },
    )? {
        UnspliceReply::One(u) => u,
        other => bail!("process {pid}: unexpected reply to the count's removal: {other:?}"),
    };
    let secs = start.elapsed().as_secs_f64();
    // Precision: counts below 2^53 are exact as f64; this is only the printed rate.
    #[allow(clippy::cast_precision_loss)]
    let rate = if secs > 0.0 {
        removed.hits as f64 / secs
    } else {
        0.0
    };
    println!(
        "{}: {} calls in {seconds} s ({rate:.1}/s)",
        args.function, removed.hits
    );
    Ok(())
}

/// `trapctl -p PID VERB` for a verb that does not act on a process.
pub fn unsupported(pid: i32, verb: &str) -> Result<()> {
    bail!("`trapctl -p {pid} {verb}` is not supported: with -p, trapctl runs attach, apply, splice, count, list, unsplice and detach")
}
