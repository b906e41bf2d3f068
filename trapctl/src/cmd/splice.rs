//! `trapctl splice AT --call SYM | --replace SYM [--mechanism trap|jmp] [--cookie N]` and
//! `trapctl unsplice AT`.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use instr_manager::ops::{
    self, parse_u64, GoneOwners, ListReply, SpliceReply, SpliceRow, UnspliceReply, Unspliced,
};
use instr_manager::owner::{is_orphaned_trace, Owner};
use instr_manager::splice::{SpliceOptions, When};
use instr_manager::splicer::SpliceId;
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Mechanism;
use trapvec::predicate::Predicate;
use trapvec_proto::client;
use trapvec_proto::Request;

use crate::cmd::progress;
use crate::hold::{self, Ended, Span};
use crate::kernel::Kernel;
use crate::route;

/// Splice a point of the running kernel.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["call", "replace", "count"])))]
#[command(long_about = "\
Splice one point of the running kernel. AT is `function`, `function+offset` (decimal or 0x hex)
or `0xADDRESS`. A point at a traced function's entry moves past its 5-byte ftrace site (the
`call __fentry__` NOP): the kernel rewrites those bytes itself; the function's arguments are still
in their registers there. AT may be a glob ('tcp_v4_*', 'MOD:nf_*'; quote it from the shell): the
entry of every matching function, in one batch, all or nothing; --best-effort splices what
validates, prints one line per refusal reason and exits 3 if any was refused.

  --call SYM      run the component function SYM(struct trapvec_regs *regs, void *cookie) at the
                  point (in the trap dispatcher, interrupts off, like a kprobe pre-handler; it may
                  change the registers), then the displaced instructions, then carry on
  --replace SYM   run SYM instead of the function (AT must be its entry); the original stays
                  callable as __trapvec_orig_<function>
  --count         no handler: only count the hits (`trapctl list` shows them); a kernel trap
                  is then a dispatch entry without a handler, a jmp a counting trampoline
  --by KEY        with --count: count the hits by tid (the thread, task->pid), pid (the
                  process, task->tgid), comm or cpu in trapvec.ko's per-CPU tables of 256 keys
                  (overflow counted); `trapctl list` shows the table's size and top key,
                  `trapctl list --json` every key. `tgid` is read as pid (its old spelling)
                  with a warning; pid meant the thread before
  --return        make a return point (kretprobe): AT must be a function's entry, and --call SYM
                  runs each time the function returns, as SYM(struct trapvec_regs *regs,
                  struct trapvec_call *call): the return value in regs->rax (and rdx; it may be
                  changed), the entry's arguments in call->args, with preemption off. --return
                  --count only counts returns. Each call in progress holds one instance of the
                  module's pool (4096 in all) until it returns; a call that finds its return
                  point's --maxactive instances (default 256) in use, the pool empty, or its
                  CPU already in a return handler runs without its return half and is counted
                  as missed. `trapctl list` shows the returns and the missed calls. Stack
                  traces of a task inside the function end at the module's return stub.

  --pid N, --tid N, --comm NAME
                  a task predicate: the action runs only for the threads of process N
                  (task->tgid), for thread N (task->pid) or for tasks named NAME (task->comm);
                  with several, all must. --tgid N is --pid N's old spelling. --pid meant
                  the thread before: it now warns on stderr that it means the process. Another task's hit runs no handler and is not counted: the trap
                  dispatcher sends it straight to the displaced instructions, a jmp splice's
                  guard (gs:current_task, a compare per field) does the same. With --return
                  only the matching tasks' calls take instances.

The mechanism is `trap` (int 0xF5, 2 bytes: any instruction boundary of a basic block) or `jmp`
(jmp rel32 over 5 bytes, or jmp rel8 to a springboard in nearby padding). The point is checked
before anything changes: an instruction boundary, no branch target inside the displaced window,
relocatable instructions, and the module's rules (not entry or noinstr text, not on the kprobes
blacklist, no exception-table instruction, no jump label, static call or ftrace site).")]
pub struct SpliceArgs {
    /// `function`, `function+offset`, `0xADDRESS`, or a glob (`'tcp_v4_*'`).
    pub at: String,
    /// Run this component function at the point, then the original code.
    #[arg(long, value_name = "SYM")]
    pub call: Option<String>,
    /// Run this component function instead of the function at AT (its entry).
    #[arg(long, value_name = "SYM")]
    pub replace: Option<String>,
    /// Only count the hits.
    #[arg(long)]
    pub count: bool,
    /// How control leaves the point.
    #[arg(long, default_value = "trap", value_parser = listed::<Mechanism>(MECHANISMS))]
    pub mechanism: Mechanism,
    /// Second argument of a --call handler (with --return: `call->cookie`) [default: 0].
    #[arg(long, value_parser = parse_u64, conflicts_with_all = ["replace", "count"])]
    pub cookie: Option<u64>,
    /// A return point: --call runs (or --count counts) when the function at AT returns.
    #[arg(long = "return", conflicts_with = "replace")]
    pub at_return: bool,
    /// With --return: most calls in progress at once; more are counted as missed [default: 256].
    #[arg(long, value_name = "N", requires = "at_return")]
    pub maxactive: Option<u32>,
    /// With --count: count by tid (the thread), pid (the process), comm or cpu (`trapctl list`
    /// shows the table).
    #[arg(long, value_name = "KEY", value_parser = listed::<trapvec::keyed::KeyBy>(KEYS), conflicts_with_all = ["call", "replace", "at_return"])]
    pub by: Option<trapvec::keyed::KeyBy>,
    /// With a glob AT: apply what validates, one line per refusal reason, exit 3 if any.
    #[arg(long)]
    pub best_effort: bool,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub only: OnlyArgs,
}

/// A task predicate: the splice acts only for the tasks that match every option given.
///
/// `--pid` is the process and `--tid` the thread, as in bpftrace, perf and ps. Before, `--pid`
/// was the kernel's `task->pid` (a thread): it now warns once on stderr that it means the
/// process, so that a script written for the old meaning is told rather than silently changed.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct OnlyArgs {
    /// Only for the threads of process N (its process id: the kernel's task->tgid).
    #[arg(long, value_name = "N")]
    pub pid: Option<u32>,
    /// Only for thread N (its thread id, gettid(): the kernel's task->pid).
    #[arg(long, value_name = "N")]
    pub tid: Option<u32>,
    /// As --pid (the process), the old spelling.
    #[arg(long, value_name = "N", conflicts_with = "pid")]
    pub tgid: Option<u32>,
    /// Only for tasks named NAME (task->comm, at most 15 bytes, as `ps -o comm` shows it).
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
}

/// What `--pid` on a kernel splice prints on stderr, once.
pub const PID_MEANS_PROCESS: &str = "trapctl: warning: --pid N now means the process (task->tgid, \
as --tgid N); for one thread (task->pid, the old meaning) give --tid N";

impl OnlyArgs {
    /// The kernel predicate: `--tid` tests task->pid, `--pid` and `--tgid` task->tgid; warns
    /// (once per call) when `--pid` was given.
    pub fn predicate(&self) -> Predicate {
        if self.pid.is_some() {
            eprintln!("{PID_MEANS_PROCESS}");
        }
        Predicate {
            tid: self.tid,
            pid: None,
            tgid: self.pid.or(self.tgid),
            comm: self.comm.clone(),
        }
    }
}

/// Remove a splice.
#[derive(clap::Args)]
#[command(long_about = "\
Remove the splice at AT: the point as it was written when spliced, the function whose entry was
spliced, or the site's address as `trapctl list` shows it. The original bytes are written back,
then trapctl waits until no CPU can be in the splice's trampoline or handler before freeing them.
Prints the final hit counts. --all removes every live splice in one batch. AT may be a glob
('tcp_v4_*', 'MOD:nf_*'; quote it from the shell): every live splice in a matching function, in
one batch; a glob that matches no splice is an error.

A task may sleep inside a --replace function. If one is still inside after --wait seconds (default
10), the command fails naming the replacement and its trampoline block, and the splice is left
*retiring*: its original bytes are back, its code is kept, `trapctl list` shows it. The same
command (or --all, or `trapctl unload` of its component) run again finishes the removal once the
task has left.

--orphans removes every orphaned splice: one that a `trapctl count` or `trapctl time` made and
could not remove because it was killed by SIGKILL (any other ending removes it). Such a command
records itself as the splice's owner (pid, start time, command line); `trapctl list` shows the
splice as orphaned once that process is gone. So is every splice whose handler is in the
component `trace_PID` of a kernel `trapctl trace` killed by SIGKILL (no process has that pid any
more), and that component is unloaded too. Through trapd, trapctl judges the daemon's listing
(in its own pid namespace) and removes each orphan by its own request, then unloads each such
component.")]
pub struct UnspliceArgs {
    /// The point as spliced, the site address, or a glob of functions (`'tcp_v4_*'`).
    #[arg(required_unless_present_any = ["all", "orphans"], conflicts_with_all = ["all", "orphans"])]
    pub at: Option<String>,
    /// Remove every live splice, in one batch.
    #[arg(long, conflicts_with = "orphans")]
    pub all: bool,
    /// Remove the orphaned splices: those of a `trapctl count` or `trapctl time` that was
    /// killed (SIGKILL) before it could remove its splice.
    #[arg(long)]
    pub orphans: bool,
    /// Seconds to wait for tasks to leave a splice's code (a replacement that sleeps) before
    /// giving up; the splice is then retiring and the same command finishes it later.
    #[arg(long, value_name = "SECONDS", value_parser = parse_wait)]
    pub wait: Option<std::time::Duration>,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// A `--wait` that is not a wait.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("`{text}` is not a number of seconds")]
    NotANumber { text: String },
    #[error("`{text}`: the wait must be a finite, non-negative number of seconds")]
    OutOfRange { text: String },
}

/// `--wait SECONDS`: a non-negative number of seconds, fractions allowed.
pub fn parse_wait(text: &str) -> Result<std::time::Duration, WaitError> {
    let secs: f64 = text.parse().map_err(|_| WaitError::NotANumber {
        text: text.to_string(),
    })?;
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| WaitError::OutOfRange {
        text: text.to_string(),
    })
}

/// Print `report` as the JSON object of `--json`: `"schema": 1` first
/// ([`trapvec_proto::protocol::json_output`], the one helper of every command's JSON).
pub fn print_json<T: serde::Serialize + ?Sized>(report: &T) -> Result<()> {
    let mut out = trapvec_proto::protocol::json_output(report)?;
    out.push('\n');
    crate::print(&out)
}

/// The value parser of an enumerated flag: the type's own `FromStr` (its error names the
/// value and the choices, as the spec's does), with the values listed for clap, so that
/// `--help`, the man pages and the completions show them (what `ValueEnum` gives a type of
/// this crate; these types live in crates that do not depend on clap).
#[derive(Clone)]
pub struct Listed<T> {
    values: &'static [&'static str],
    of: std::marker::PhantomData<fn() -> T>,
}

/// [`Listed`] over `values`, each of which `T::from_str` accepts.
pub fn listed<T>(values: &'static [&'static str]) -> Listed<T> {
    Listed {
        values,
        of: std::marker::PhantomData,
    }
}

/// `--mechanism`'s values.
pub const MECHANISMS: &[&str] = &["trap", "jmp"];
/// `--by`'s values.
pub const KEYS: &[&str] = trapvec::keyed::KEY_NAMES;
/// `--clock`'s values.
pub const CLOCKS: &[&str] = &["wall", "cpu"];

impl<T> clap::builder::TypedValueParser for Listed<T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Display,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        use clap::error::ErrorKind;
        let flag = arg.map_or(String::new(), |a| format!(" for '{a}'"));
        let text = value.to_str().ok_or_else(|| {
            clap::Error::raw(
                ErrorKind::InvalidUtf8,
                format!("a value{flag} that is not UTF-8\n"),
            )
            .with_cmd(cmd)
        })?;
        text.parse().map_err(|e: T::Err| {
            clap::Error::raw(
                ErrorKind::InvalidValue,
                format!("invalid value{flag}: {e}\n"),
            )
            .with_cmd(cmd)
        })
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            self.values
                .iter()
                .map(|v| clap::builder::PossibleValue::new(*v)),
        ))
    }
}

/// Make `request` (through trapd when one runs): the splice, or the pending point trapd
/// holds for a module that is not loaded.
pub fn make(request: &SpliceRequest) -> Result<SpliceReply> {
    route::change(&Request::Splice(request.clone()), |_| {})
}

/// Make `request`, which must be made now (a pending point is refused).
fn make_now(request: &SpliceRequest) -> Result<SpliceRow> {
    match make(request)? {
        SpliceReply::Made(row) => Ok(*row),
        SpliceReply::Pending(p) => {
            if let Err(e) = remove(&p.at) {
                log::warn!("{}: {}", p.at, trapvec::error_chain(e.as_ref()));
            }
            bail!(
                "{}: module {} is not loaded, so the splice could only be pending",
                p.at,
                p.module
            )
        }
    }
}

/// How a command that keeps a splice for a while (`trapctl count`, `trapctl time`) reads
/// its figures: from a row of trapd's listing, or from the splicer by the splice's id.
pub struct Figures<R> {
    /// What the splice is, for messages: "the timer", "the keyed count".
    pub what: &'static str,
    pub of_row: fn(&SpliceRow) -> Option<R>,
    pub of_splice: fn(
        &instr_manager::splicer::Splicer<trapvec::kernel::KernelTarget>,
        SpliceId,
    ) -> Result<Option<R>, instr_manager::splicer::SpliceError>,
}

/// What a hold gives its report: the figures read just before the removal, the removal's
/// final counts, how the hold ended and how long it lasted.
pub struct Held<R> {
    pub figures: R,
    pub removed: Unspliced,
    pub ended: Ended,
    pub elapsed: Duration,
}

/// Hold `request`'s splice for `span` ([`crate::hold`]): watch the signals, make the splice
/// with this command as its owner (through trapd when one runs: make, read the listing,
/// remove, three requests; else straight to the module, locked while the splice is made and
/// again for its removal (not while it is held), the splice saved
/// while it lives so that a killed command leaves it known, and orphaned), `announce` it, run
/// the command if any, wait, read the figures, remove the splice, `report`, and end as the
/// hold ended ([`hold::finish`]).
pub fn for_a_while<R>(
    request: &SpliceRequest,
    figures: &Figures<R>,
    span: &Span,
    announce: impl FnOnce(&SpliceRow),
    report: impl FnOnce(&SpliceRow, Held<R>) -> Result<()>,
) -> Result<()> {
    let watch = hold::Watch::start()?;
    let mut request = request.clone();
    let command: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    request.options.owner = Some(Owner::current(command.join(" "))?);
    let what = figures.what;
    if client::is_listening(route::socket()) {
        let row = make_now(&request)?;
        let read = |site: &str| -> Result<R> {
            let listing = route::daemon_only::<ListReply>(&Request::List)?.listing;
            let row = listing
                .splices
                .iter()
                .find(|r| r.site == site)
                .with_context(|| format!("{what} at {site} is no longer listed"))?;
            (figures.of_row)(row).with_context(|| {
                format!(
                    "the splice at {site} is not {}",
                    what.trim_start_matches("the ")
                )
            })
        };
        let held = hold(&watch, span, &row, announce, &read, &mut |site: &str| {
            remove(site)
        })?;
        let ended = held.ended;
        report(&row, held)?;
        return hold::finish(&watch, ended);
    }
    let mut k = Kernel::open()?;
    let (reply, made) = route::execute(&mut k, &Request::Splice(request.clone()))?;
    k.commit_or_undo(&made)?;
    // Made and saved: other trapctl commands (the held command's own too) may use the module
    // while this one waits; the removal takes the lock back.
    k.unlock();
    let SpliceReply::Made(row) = reply else {
        bail!(
            "{}: the module's splice was answered as pending",
            request.at
        );
    };
    let id = SpliceId(row.id);
    let k = std::cell::RefCell::new(k);
    let read = |site: &str| -> Result<R> {
        let got = (figures.of_splice)(&k.borrow().splicer, id)?;
        got.with_context(|| format!("{what} at {site} has no figures (its slot is gone)"))
    };
    let mut remove = |site: &str| -> Result<Unspliced> {
        let mut k = k.borrow_mut();
        k.relock()?;
        let unsplice = Request::Unsplice {
            at: Some(site.to_string()),
            all: false,
        };
        let (removed, _) = route::execute::<UnspliceReply>(&mut k, &unsplice)?;
        k.save()?;
        match removed {
            UnspliceReply::One(u) => Ok(u),
            other => bail!("the removal of {site} was answered with {other:?}"),
        }
    };
    let held = hold(&watch, span, &row, announce, &read, &mut remove)?;
    let ended = held.ended;
    report(&row, held)?;
    hold::finish(&watch, ended)
}

/// The live part of [`for_a_while`]: announce, run the command, wait, read, remove. Whatever
/// fails after the splice was made, the splice is removed before the error is returned.
fn hold<R>(
    watch: &hold::Watch,
    span: &Span,
    row: &SpliceRow,
    announce: impl FnOnce(&SpliceRow),
    read: &dyn Fn(&str) -> Result<R>,
    remove: &mut dyn FnMut(&str) -> Result<Unspliced>,
) -> Result<Held<R>> {
    announce(row);
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    // A signal that came while the splice was made ends the hold before any command starts
    // (a terminal's Ctrl-C then could not have reached a command spawned after it).
    let waited = match watch.pending() {
        Ok(Some(signal)) => Ok(Ended::Signal(signal)),
        Ok(None) => hold::spawn(span).and_then(|mut child| watch.wait(span, child.as_mut(), start)),
        Err(e) => Err(e),
    };
    let ended = match waited {
        Ok(e) => e,
        Err(e) => {
            // By the site: the point as written could name a different splice made meanwhile.
            if let Err(r) = remove(&row.site) {
                return Err(e.context(format!(
                    "and removing the splice at {} failed: {}",
                    row.site,
                    trapvec::error_chain(r.as_ref())
                )));
            }
            return Err(e);
        }
    };
    let elapsed = start.elapsed();
    // Read before the removal: a removed return point or keyed count has no figures.
    let figures = read(&row.site);
    let removed = remove(&row.site)?;
    Ok(Held {
        figures: figures?,
        removed,
        ended,
        elapsed,
    })
}

/// Whether listed splice `r` is orphaned, judged in this process's pid namespace: its owner
/// is gone, or its handler is in the component `trace_PID` of a `trapctl trace` that is gone.
/// `gone` asks each owner once (a killed `trapctl cover` leaves thousands of rows of one).
pub fn is_orphan(r: &SpliceRow, gone: &mut GoneOwners) -> bool {
    r.owner.as_ref().is_some_and(|o| gone.is_gone(o))
        || r.component.as_deref().is_some_and(is_orphaned_trace)
}

/// Remove the orphaned splices: through trapd, those of its listing whose owner is gone or
/// whose handler is in a gone `trapctl trace`'s component, in one `remove` request (by site;
/// as many as trapd's line takes, [`route::remove`]), then that component; else in one batch
/// on the module.
fn unsplice_orphans(args: &UnspliceArgs) -> Result<Vec<Unspliced>> {
    if client::is_listening(route::socket()) {
        // Judged here, not by the daemon's flag: the owner's pid was taken in this machine's
        // view (a trapctl in a container shares the daemon's socket, not its pid namespace).
        // A killed `trapctl trace`'s splices (its component's, none owned) are removed the
        // same way, then its component `trace_PID` is unloaded, as the direct path does.
        let listing = route::daemon_only::<ListReply>(&Request::List)?.listing;
        let traces: Vec<&str> = listing
            .components
            .iter()
            .map(|c| c.name.as_str())
            .filter(|name| is_orphaned_trace(name))
            .collect();
        let mut gone = GoneOwners::default();
        let sites: Vec<String> = listing
            .splices
            .iter()
            .filter(|r| {
                r.owner.as_ref().is_some_and(|o| gone.is_gone(o))
                    || r.component.as_deref().is_some_and(|c| traces.contains(&c))
            })
            .map(|r| r.site.clone())
            .collect();
        // No orphan, no request: through trapd `route::remove` sends one per part.
        let removed = route::remove(sites)?;
        for name in traces {
            let _: ops::Unloaded = route::daemon_only(&Request::Unload {
                name: name.to_string(),
            })
            .with_context(|| {
                format!("unloading {name}, the component of a trapctl trace that is gone")
            })?;
        }
        return Ok(removed);
    }
    let mut k = Kernel::open()?;
    if let Some(w) = args.wait {
        k.splicer.set_quiesce_timeout(w);
    }
    let removed = ops::unsplice_orphans(&mut k.splicer);
    // Whatever was removed (a refused quiescence leaves splices retiring) is saved.
    k.save()?;
    Ok(removed?.unspliced)
}

/// Remove the splice at `at` (through trapd when one runs).
pub fn remove(at: &str) -> Result<Unspliced> {
    match unsplice_one(at, None)? {
        UnspliceReply::One(u) => Ok(u),
        other => bail!("trapd answered the removal of {at} with {other:?}"),
    }
}

/// Remove the splice (or trapd's pending point) at `at`, waiting `wait` for quiescence.
fn unsplice_one(at: &str, wait: Option<Duration>) -> Result<UnspliceReply> {
    route::change(
        &Request::Unsplice {
            at: Some(at.to_string()),
            all: false,
        },
        |sp| {
            if let Some(w) = wait {
                sp.set_quiesce_timeout(w);
            }
        },
    )
}

pub fn splice(args: &SpliceArgs) -> Result<()> {
    let action = match (&args.call, &args.replace, args.count) {
        (Some(h), None, false) => Action::Call {
            handler: h.clone(),
            cookie: args.cookie.unwrap_or(0),
        },
        (None, Some(f), false) => Action::Replace { with: f.clone() },
        (None, None, true) => Action::Count,
        _ => bail!("give exactly one of --call SYM, --replace SYM and --count"),
    };
    let options = SpliceOptions {
        when: if args.at_return {
            When::Return
        } else {
            When::Entry
        },
        maxactive: args.maxactive,
        by: args.by,
        only: args.only.predicate(),
        owner: None,
    };
    let request = SpliceRequest {
        at: args.at.clone(),
        action,
        mechanism: args.mechanism,
        options,
    };
    if instr_manager::glob::is_glob(&args.at) {
        return splice_glob(&request, args.best_effort, args.json);
    }
    if args.best_effort {
        bail!(
            "--best-effort is for a glob (`'tcp_v4_*'`); `{}` is one point",
            args.at
        );
    }
    let reply = make(&request)?;
    if args.json {
        return print_json(&reply);
    }
    let s = match reply {
        SpliceReply::Made(s) => *s,
        SpliceReply::Pending(p) => {
            println!(
                "pending {}: trapd makes it when module {} loads",
                p.at, p.module
            );
            return Ok(());
        }
    };
    println!(
        "spliced {} at {} ({}+{:#x}) by {}: {}; displaced `{}`",
        s.at, s.site, s.function, s.offset, s.mechanism, s.action, s.displaced
    );
    Ok(())
}

/// `trapctl splice 'GLOB'`: the splice at the entry of every matching function, in one batch,
/// sent as an `apply` of a spec of that one (glob) splice, so that trapd and the direct path
/// expand it the same way.
fn splice_glob(glob: &SpliceRequest, best_effort: bool, json: bool) -> Result<()> {
    let working = progress::working(format!("splicing '{}' (one batch)", glob.at), json);
    let report = apply_glob(glob, best_effort);
    drop(working);
    let report = report?;
    if json {
        print_json(&report)?;
        return partly_applied(&report);
    }
    for s in &report.spliced {
        println!(
            "spliced {} at {} by {}: {}",
            s.at, s.site, s.mechanism, s.action
        );
    }
    for g in &report.refusals {
        eprintln!("{g}");
    }
    println!(
        "spliced {} of {} functions",
        report.spliced.len(),
        report.requested
    );
    partly_applied(&report)
}

/// Exit status 3 ([`crate::PartlyApplied`]) when `report` refused anything.
fn partly_applied(report: &ops::ApplyReport) -> Result<()> {
    if !report.refused.is_empty() {
        return Err(crate::PartlyApplied(format!(
            "{} of {} functions refused ({} spliced)",
            report.refused.len(),
            report.requested,
            report.spliced.len()
        ))
        .into());
    }
    Ok(())
}

/// Make `glob`'s splices (one per matching function's entry) in one batch, sent as an `apply`
/// of a spec of that one (glob) splice, so that trapd and the direct path expand it alike.
fn apply_glob(glob: &SpliceRequest, best_effort: bool) -> Result<ops::ApplyReport> {
    let text = ops::expand::spec_text(std::slice::from_ref(glob))?;
    let path = std::env::temp_dir().join(format!("trapctl-glob-{}.toml", std::process::id()));
    // create_new: never through a file (or link) someone else put there.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))?;
    let request = Request::Apply {
        spec: path.clone(),
        best_effort,
        check: false,
        brief: false,
    };
    let report: Result<ops::ApplyReport> = route::change(&request, |_| {});
    let _ = std::fs::remove_file(&path);
    report.with_context(|| format!("{}: nothing was spliced", glob.at))
}

/// What a hold of a glob's splices gives its report.
pub struct HeldMany {
    /// The listing's rows of the splices made, read just before their removal (site order of
    /// `applied.spliced`; a row that could not be read is missing).
    pub rows: Vec<SpliceRow>,
    /// The removal's final counts.
    pub removed: Vec<Unspliced>,
    pub ended: Ended,
    pub elapsed: Duration,
}

/// Hold the splices of glob request `glob` for `span`, as [`for_a_while`] holds one: made in one
/// batch (an `apply` of a generated spec, through trapd when one runs, this command their
/// owner), announced, read from the listing and removed in one batch (a `remove` of their
/// sites) however the hold ends, reported; with --best-effort refusals, exit status 3 after.
/// /dev/trapvec is not held locked meanwhile: other commands may run between the requests.
pub fn glob_for_a_while(
    glob: &SpliceRequest,
    best_effort: bool,
    span: &Span,
    announce: impl FnOnce(&ops::ApplyReport),
    report: impl FnOnce(HeldMany) -> Result<()>,
) -> Result<()> {
    let watch = hold::Watch::start()?;
    let mut glob = glob.clone();
    let command: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    glob.options.owner = Some(Owner::current(command.join(" "))?);
    let applied = apply_glob(&glob, best_effort)?;
    for g in &applied.refusals {
        eprintln!("{g}");
    }
    let sites: Vec<String> = applied.spliced.iter().map(|r| r.site.clone()).collect();
    let remove = || -> Result<Vec<Unspliced>> {
        route::remove(sites.clone()).with_context(|| format!("removing {}'s splices", glob.at))
    };
    announce(&applied);
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    let waited = match watch.pending() {
        Ok(Some(signal)) => Ok(Ended::Signal(signal)),
        Ok(None) => hold::spawn(span).and_then(|mut child| watch.wait(span, child.as_mut(), start)),
        Err(e) => Err(e),
    };
    let ended = match waited {
        Ok(e) => e,
        Err(e) => {
            if let Err(r) = remove() {
                return Err(e.context(format!(
                    "and removing the splices of {} failed: {}",
                    glob.at,
                    trapvec::error_chain(r.as_ref())
                )));
            }
            return Err(e);
        }
    };
    let elapsed = start.elapsed();
    // Read before the removal: a removed timer has no figures.
    let rows = route::read::<ListReply>(&Request::List).map(|l| {
        let mut by_site: std::collections::HashMap<String, SpliceRow> = l
            .listing
            .splices
            .into_iter()
            .map(|r| (r.site.clone(), r))
            .collect();
        sites.iter().filter_map(|s| by_site.remove(s)).collect()
    });
    let removed = remove()?;
    let refused = partly_applied(&applied);
    report(HeldMany {
        rows: rows?,
        removed,
        ended,
        elapsed,
    })?;
    hold::finish(&watch, ended)?;
    refused
}

pub fn unsplice(args: &UnspliceArgs) -> Result<()> {
    if args.orphans {
        let removed = unsplice_orphans(args)?;
        if args.json {
            return print_json(&ops::UnsplicedAll {
                unspliced: removed,
                forgot: Vec::new(),
            });
        }
        for u in &removed {
            println!(
                "unspliced orphan {} at {}: {} hits, {} missed",
                u.at, u.site, u.hits, u.missed
            );
        }
        println!("unspliced {} orphaned splice(s)", removed.len());
        return Ok(());
    }
    let Some(at) = &args.at else {
        let working = progress::working("unsplicing every splice (one batch)".into(), args.json);
        let reply = route::change(
            &Request::Unsplice {
                at: None,
                all: true,
            },
            |sp| {
                if let Some(w) = args.wait {
                    sp.set_quiesce_timeout(w);
                }
            },
        )?;
        drop(working);
        let UnspliceReply::All(all) = reply else {
            bail!("trapd answered `unsplice --all` with {reply:?}");
        };
        if args.json {
            return print_json(&all);
        }
        println!("unspliced {} splice(s)", all.unspliced.len());
        return Ok(());
    };
    let working = instr_manager::glob::is_glob(at)
        .then(|| progress::working(format!("unsplicing '{at}' (one batch)"), args.json));
    let reply = unsplice_one(at, args.wait);
    drop(working);
    let reply = reply?;
    if args.json {
        return print_json(&reply);
    }
    let u = match reply {
        UnspliceReply::One(u) => u,
        UnspliceReply::Pending(p) => {
            println!("forgot pending point {} after {} hits", p.at, p.hits);
            return Ok(());
        }
        UnspliceReply::All(all) if instr_manager::glob::is_glob(at) => {
            for u in &all.unspliced {
                println!(
                    "unspliced {} at {}: {} hits, {} missed",
                    u.at, u.site, u.hits, u.missed
                );
            }
            for p in &all.forgot {
                println!("forgot pending point {} after {} hits", p.at, p.hits);
            }
            println!("unspliced {} splice(s) matching {at}", all.unspliced.len());
            if !all.forgot.is_empty() {
                println!("forgot {} pending point(s) matching {at}", all.forgot.len());
            }
            return Ok(());
        }
        UnspliceReply::All(all) => bail!("trapd answered `unsplice {at}` with {all:?}"),
    };
    println!(
        "unspliced {} at {}: {} hits, {} missed",
        u.at, u.site, u.hits, u.missed
    );
    Ok(())
}
