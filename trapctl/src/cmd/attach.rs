//! `trapctl -p PID attach | apply SPEC | list [--json] | unsplice AT|--all | detach`: the
//! process commands against a running process, through its agent's control channel (loaded by
//! ptrace by the first of them, see [`crate::attach`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use instr_manager::ops::{
    ApplyReport, CheckReport, ListReply, SpliceReply, SpliceRow, UnspliceReply, Unspliced,
};
use instr_manager::splice::{SpliceOptions, When};
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Spec;
use trapvec_proto::Request;

use crate::attach::{self, inject};
use crate::cmd::splice::print_json;

/// Load the agent into the running process `-p PID` and start its control channel.
#[derive(clap::Args)]
#[command(long_about = "\
Load trapvec's agent into the running process given by -p PID and start its control channel (a
Unix socket only the process's uid or root may use): every thread is seized and stopped with
ptrace, one of them is chosen to make the calls and the others go on at once; it calls libc's
dlopen(agent) and the agent's trapvec_agent_attach(), its registers are put back exactly, and it
goes on (a thread blocked in a system call goes back into it: no EINTR). -v prints how long the
threads were held.

Refused, with the reason and before anything is changed: a process of another user (unless
root), one already traced (gdb, strace), yama's ptrace_scope forbidding it, a static binary, a
process where executable mappings are forbidden (MemoryDenyWriteExecute, seccomp).

`trapctl -p PID apply SPEC`, `list`, `unsplice` attach first when no agent answers.")]
pub struct AttachArgs {
    /// The agent to load [default: $TRAPVEC_AGENT, else found next to trapctl].
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Give up when the agent's dlopen has not returned after SECONDS (it waits for the
    /// loader's lock while a thread is inside a library's constructor): the call is undone and
    /// the process left as it was.
    #[arg(long, value_name = "SECONDS", default_value_t = inject::CALL_TIMEOUT.as_secs_f64(), value_parser = seconds)]
    pub attach_timeout: f64,
    /// Print one JSON object (`"schema": 1` first: pid, socket, attached) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// What `trapctl -p PID attach --json` prints.
#[derive(serde::Serialize)]
struct Attached<'a> {
    pid: i32,
    /// The agent's control socket.
    socket: &'a Path,
    /// False when an agent already listened (nothing was loaded).
    attached: bool,
}

/// What `trapctl -p PID detach --json` prints.
#[derive(serde::Serialize)]
struct Detached {
    pid: i32,
    /// How many splices the agent removed.
    unspliced: u64,
}

/// A positive number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v < 1e6 => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

/// Remove every splice from the process `-p PID` and stop its agent's channel.
#[derive(clap::Args)]
#[command(long_about = "\
Remove every splice from the process given by -p PID, in one batch (the removal waits until no
thread is inside a trampoline or a component), then stop the agent's control channel and remove
its socket. The text is as it was before the first splice; the agent stays mapped, idle (a later
attach reuses it).")]
pub struct DetachArgs {
    /// Print one JSON object (`"schema": 1` first: pid, unspliced) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// The agent's socket in `pid`, after attaching if none answers.
fn channel(pid: i32, agent: Option<&Path>, verbose: bool) -> Result<PathBuf> {
    channel_within(pid, agent, verbose, inject::CALL_TIMEOUT)
}

fn channel_within(
    pid: i32,
    agent: Option<&Path>,
    verbose: bool,
    timeout: Duration,
) -> Result<PathBuf> {
    if let Some(s) = attach::agent_socket(pid) {
        return Ok(s);
    }
    let agent = crate::cmd::cover::find_agent(agent)?;
    attach::attach(pid, &agent, verbose, timeout)
}

pub fn attach(pid: i32, args: &AttachArgs, verbose: bool) -> Result<()> {
    let already = attach::agent_socket(pid).is_some();
    let timeout = Duration::from_secs_f64(args.attach_timeout);
    let socket = channel_within(pid, args.agent.as_deref(), verbose, timeout)?;
    if args.json {
        return print_json(&Attached {
            pid,
            socket: &socket,
            attached: !already,
        });
    }
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
        brief: false,
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
    // Points in libraries the process has not loaded yet wait for its dlopen (the agent's list).
    if report.spliced.len() < spec.splices.len() && report.refused.is_empty() {
        let r: ListReply = attach::ask(pid, &socket, &Request::List)?;
        for p in pending_rows(&r) {
            println!(
                "{} waits for {} (applied when the process loads it)",
                p.at, p.module
            );
        }
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
        return print_json(&r);
    }
    crate::print(&listing_text(pid, &r))
}

/// What `trapctl -p PID list` prints of the agent's listing `r` (`list --by pid` too, per process).
pub fn listing_text(pid: i32, r: &ListReply) -> String {
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
    for p in pending_rows(r) {
        out.push_str(&format!(
            "     {} ({}): {}, {} hits over {} loads\n",
            p.at, p.action, p.state, p.hits, p.loads
        ));
    }
    out
}

/// The deferred points of the agent's listing (in libraries not loaded yet, or armed).
fn pending_rows(r: &ListReply) -> &[instr_manager::ops::PendingRow] {
    r.daemon
        .as_ref()
        .and_then(|d| d.pending.as_deref())
        .unwrap_or_default()
}

/// Remove the one splice at `site` through the agent's channel (what `-p count` and `-p time`
/// made), naming `what` if the agent answers with anything but that one removal.
fn unsplice_site(pid: i32, socket: &Path, site: &str, what: &str) -> Result<Unspliced> {
    let request = Request::Unsplice {
        at: Some(site.to_string()),
        all: false,
    };
    match attach::ask::<UnspliceReply>(pid, socket, &request)? {
        UnspliceReply::One(u) => Ok(u),
        other => bail!("process {pid}: unexpected reply to the {what}'s removal: {other:?}"),
    }
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

pub fn detach(pid: i32, args: &DetachArgs) -> Result<()> {
    let Some(socket) = attach::agent_socket(pid) else {
        bail!("process {pid} has no agent attached: nothing to detach");
    };
    let reply = attach::send(pid, &socket, &serde_json::json!({"op": "detach"}))?;
    let unspliced = reply["unspliced"].as_u64().unwrap_or(0);
    if args.json {
        return print_json(&Detached { pid, unspliced });
    }
    println!("detached from process {pid}: {unspliced} splice(s) removed");
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
        return print_json(&s);
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
    let removed = unsplice_site(pid, &socket, &row.site, "count")?;
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

/// `trapctl -p PID trace -e PROGRAM`: the program run in the process, its maps printed at the
/// end (see `trapctl trace --help`).
pub fn trace(pid: i32, args: &crate::cmd::trace::Args, verbose: bool) -> Result<()> {
    crate::cmd::trace::on_process(pid, args, verbose)
}

/// `trapctl -p PID cover GLOB... [--seconds N]`: block coverage of the running process from now
/// on, its splices removed at the end (see [`crate::cmd::cover::attached`]).
pub fn cover(pid: i32, args: &crate::cmd::cover::Args, verbose: bool) -> Result<()> {
    if let Some(file) = &args.from_json {
        bail!(
            "--from-json {} reads a saved report and covers nothing: give it without -p",
            file.display()
        );
    }
    crate::cmd::cover::attached::run(pid, args, verbose)
}

/// `trapctl -p PID VERB` for a verb that does not act on a process.
pub fn unsupported(pid: i32, verb: &str) -> Result<()> {
    bail!("`trapctl -p {pid} {verb}` is not supported: with -p, trapctl runs attach, apply, splice, count, time, cover, trace, list, unsplice and detach")
}

/// `trapctl -p PID time FUNCTION [--seconds N]`: a timer spliced by the agent, held for N
/// seconds or until SIGINT, SIGTERM or SIGHUP, its histogram read from the agent's listing,
/// removed, printed as `trapctl time` prints it.
pub fn time(pid: i32, args: &crate::cmd::time::Args, verbose: bool) -> Result<()> {
    if instr_manager::glob::is_glob(&args.function) || args.best_effort {
        bail!("with -p, time takes one point, not a glob or --best-effort");
    }
    if !args.span.command.is_empty() {
        bail!("with -p, time runs no COMMAND: the process runs on its own (give --seconds N, or stop with Ctrl-C)");
    }
    let request = SpliceRequest {
        at: args.function.clone(),
        action: Action::Time { clock: args.clock },
        mechanism: args.mechanism,
        options: SpliceOptions {
            when: When::Return,
            maxactive: args.maxactive,
            only: args.only.predicate(),
            ..Default::default()
        },
    };
    // Signals are watched before the timer exists: a Ctrl-C now ends the hold, not trapctl.
    let watch = crate::hold::Watch::start()?;
    let row = splice_in(pid, &request, verbose)?;
    println!(
        "timing {} at {} in process {pid} {} ({} clock)",
        args.function,
        row.site,
        args.span.describe(),
        args.clock.name()
    );
    let start = std::time::Instant::now();
    let ended = watch.wait(&args.span, None, start)?;
    let elapsed = start.elapsed();
    let socket = attach::agent_socket(pid)
        .with_context(|| format!("process {pid}: its agent no longer answers"))?;
    let listing: ListReply = attach::ask(pid, &socket, &Request::List)?;
    let figures = listing
        .listing
        .splices
        .iter()
        .find(|s| s.id == row.id)
        .and_then(|s| s.returns.clone())
        .unwrap_or_default();
    let removed = unsplice_site(pid, &socket, &row.site, "timer")?;
    let held = crate::cmd::splice::Held {
        figures,
        removed,
        ended,
        elapsed,
    };
    crate::cmd::time::report(args, &row, held)?;
    crate::hold::finish(&watch, ended)
}
