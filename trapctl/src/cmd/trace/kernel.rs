//! `trapctl trace -e 'PROGRAM' [--seconds N | -- COMMAND ARGS...]` without `--process`: the
//! program compiled for the running kernel and applied through the ordinary requests.
//!
//! 1. The module is asked (INFO, no lock) where the running task's fields are; the program is
//!    compiled against them ([`trapvec_script::KernelTask`]), its globs expanded over
//!    `/proc/kallsyms`' functions.
//! 2. An `apply` of a spec (the component, one trap splice per probe) loads it and splices
//!    every probe in one batch, through trapd when one runs, else straight to the module.
//! 3. trapctl waits as `trapctl count` does ([`crate::hold`]): `--seconds N`, a signal
//!    (SIGINT, SIGTERM, SIGHUP), or the end of COMMAND.
//! 4. The component's data block (its only data: the `.bss` symbol at the start of its data,
//!    whose address the apply's report gives) is read through the module's READ request, as
//!    `trapctl read` reads kernel memory, then the splices are removed (one `remove` of their
//!    sites) and the component unloaded, however the wait ended; then the maps are printed.
//!
//! Nothing is left behind unless trapctl is killed by SIGKILL (then `trapctl unsplice` of the
//! sites and `trapctl unload trace_PID` remove it).

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use instr_manager::glob::{is_glob, matching_functions, FunctionGlob};
use instr_manager::ops::ApplyReport;
use trapvec::kernel::KernelTarget;
use trapvec::predicate::TaskBase;
use trapvec::Target as _;
use trapvec_proto::Request;

use crate::hold::{self, Ended, Span};
use crate::route;

use super::poll::Poller;
use super::{print_report, Args};

/// Slots per keyed map for a kernel program unless `--map-size` says otherwise: the module's
/// data arena (4 MiB) holds every component's data, and a `hist()` slot is 68 words.
pub const KERNEL_SLOTS: usize = 1024;

/// The running task's fields as trapvec.ko reports them.
fn kernel_task(target: &KernelTarget) -> Result<trapvec_script::KernelTask> {
    let t = target.task_fields();
    let TaskBase::CurrentTask { per_cpu } = t.base else {
        bail!("trapvec.ko did not report where the running task is (current_task)");
    };
    let field = |name: &str, v: Option<i32>| {
        v.with_context(|| format!("trapvec.ko did not report task_struct's `{name}` offset"))
    };
    Ok(trapvec_script::KernelTask {
        current_task: per_cpu,
        pid: field("pid", t.pid)?,
        tgid: field("tgid", t.tgid)?,
        comm: field("comm", t.comm)?,
    })
}

/// The kernel functions a probe's name stands for: itself, or for a glob every function of
/// kallsyms it matches (`MOD:glob` within a module).
fn expander(
    target: &KernelTarget,
) -> impl FnMut(Option<&str>, &str) -> Result<Vec<String>, String> + '_ {
    move |object, name| {
        if !is_glob(name) {
            return Ok(vec![name.to_string()]);
        }
        let text = match object {
            Some(o) => format!("{o}:{name}"),
            None => name.to_string(),
        };
        let glob = FunctionGlob::new(&text).map_err(|e| e.to_string())?;
        let mut names: Vec<String> = matching_functions(target.symbols(), &[glob])
            .into_iter()
            .map(|s| s.name.clone())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// Move each entry probe of a function that also has a `:return` probe (its return point's
/// entry half takes the entry's site) to the instruction after that site's trap window: the
/// function's entry is read, past the kernel's own bytes (endbr64, ftrace site), and decoded
/// ([`trapvec_script::after_window`], which refuses a window that branches or writes an
/// argument register, so that `argN` there are still the entry's).
fn place_beside_returns(
    target: &KernelTarget,
    compiled: &mut trapvec_script::Compiled,
) -> Result<()> {
    use instr_manager::point::{kernel_entry_len, KERNEL_ENTRY_MAX};
    const LOOK: usize = KERNEL_ENTRY_MAX + 2 * 15;
    for sp in compiled.splices.iter_mut().filter(|s| s.beside_return) {
        // `MOD:func` names a module's function; kallsyms knows it by its name.
        let name = sp.at.rsplit(':').next().unwrap_or(&sp.at);
        let sym = target
            .symbols()
            .lookup(name)
            .with_context(|| format!("probe {}: no function {name} in /proc/kallsyms", sp.at))?;
        let len = usize::try_from(sym.size)
            .ok()
            .filter(|&n| n > 0)
            .map_or(LOOK, |n| n.min(LOOK));
        let bytes = target
            .read(sym.addr, len)
            .with_context(|| format!("reading the entry of {name} at {:#x}", sym.addr))?;
        let start = usize::try_from(kernel_entry_len(&bytes)).expect("at most 9");
        super::past_return_site(sp, &bytes, sym.addr, start, instr_manager::plan::TRAP_LEN)?;
    }
    Ok(())
}

/// Run a kernel program (see the module docs).
pub fn run(args: &Args, text: &str) -> Result<()> {
    // Before anything is spliced: a signal that comes meanwhile waits, pending.
    let watch = hold::Watch::start()?;
    let span = Span {
        seconds: args.seconds,
        command: args.command.iter().map(Into::into).collect(),
    };
    let target = KernelTarget::open()?;
    let start = Instant::now();
    let compiled = trapvec_script::compile(
        text,
        &trapvec_script::Options {
            allow_changes: args.allow_changes,
            slots: args.map_size.unwrap_or(KERNEL_SLOTS),
            dump_path: String::new(),
            kernel: Some(kernel_task(&target)?),
        },
        &mut expander(&target),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut compiled = compiled;
    place_beside_returns(&target, &mut compiled)?;
    log::info!(
        "compiled {} probe(s) into {} bytes of component and {} bytes of maps in {:.3} ms",
        compiled.splices.len(),
        compiled.object.len(),
        compiled.layout.size,
        start.elapsed().as_secs_f64() * 1e3
    );
    let name = format!("trace_{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("trapctl-trace.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = trace(args, &watch, &span, &target, &compiled, &name, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let ended = result?;
    hold::finish(&watch, ended)
}

/// Apply, wait, read, remove, print; how the wait ended.
fn trace(
    args: &Args,
    watch: &hold::Watch,
    span: &Span,
    target: &KernelTarget,
    compiled: &trapvec_script::Compiled,
    name: &str,
    dir: &Path,
) -> Result<Ended> {
    let object = dir.join(format!("{name}.o"));
    let spec = dir.join(format!("{name}.toml"));
    std::fs::write(&object, &compiled.object)
        .with_context(|| format!("writing {}", object.display()))?;
    std::fs::write(
        &spec,
        compiled.kernel_spec_by(&object.display().to_string(), &args.mechanism.to_string()),
    )
    .with_context(|| format!("writing {}", spec.display()))?;
    let begin: Vec<String> = compiled
        .begin
        .iter()
        .map(trapvec_script::format_printf)
        .collect();
    if !args.json {
        // BEGIN's lines come first, as bpftrace prints them.
        crate::print(&begin.concat())?;
        let _ = std::io::stdout().flush();
    }
    let applied: ApplyReport = route::change(
        &Request::Apply {
            spec: spec.clone(),
            best_effort: false,
            check: false,
            brief: false,
        },
        |_| {},
    )
    .context("the probes could not be spliced (nothing was changed)")?;
    let sites: Vec<String> = applied.spliced.iter().map(|r| r.site.clone()).collect();
    // Removes the probes, then reads the data block at `reread` (if given) once no handler can
    // run any more (what the probes printed after the last look is not lost), then unloads.
    let remove = |reread: Option<u64>| -> Result<Option<Vec<u8>>> {
        if !sites.is_empty() {
            route::remove(sites.clone()).context("removing the probes")?;
        }
        let after = reread.and_then(|at| match target.read(at, compiled.layout.size) {
            Ok(d) => Some(d),
            Err(e) => {
                log::debug!("reading the maps again after the removal: {e}");
                None
            }
        });
        let _: instr_manager::ops::Unloaded = route::change(
            &Request::Unload {
                name: name.to_string(),
            },
            |_| {},
        )?;
        Ok(after)
    };
    let mut poller = super::poll::Poller::new(compiled, args.json, Instant::now());
    let live = live(
        args,
        watch,
        span,
        target,
        compiled,
        name,
        &applied,
        &mut poller,
    );
    let removed = remove(live.as_ref().ok().map(|l| l.0));
    let (data, ended) = match (live, removed) {
        (Ok((_, data, ended)), Ok(after)) => (after.unwrap_or(data), ended),
        (Err(e), Ok(_)) => return Err(e),
        (Ok(_), Err(r)) => {
            return Err(r.context(format!(
                "removing the probes (component {name}) failed; `trapctl list` shows what is left"
            )))
        }
        (Err(e), Err(r)) => {
            return Err(e.context(format!(
                "and removing the probes (component {name}) failed: {}",
                trapvec::error_chain(r.as_ref())
            )))
        }
    };
    let results = poller.finish(&data)?;
    let end: Vec<String> = compiled
        .end
        .iter()
        .map(trapvec_script::format_printf)
        .collect();
    let exit = match ended {
        Ended::Command(status) => {
            use std::os::unix::process::ExitStatusExt as _;
            status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(1)
        }
        _ => 0,
    };
    print_report(
        args,
        exit,
        begin,
        end,
        &results,
        &poller.printed,
        poller.lost(),
    )?;
    Ok(ended)
}

/// While the probes are live: announce them, wait (reading the data block meanwhile when the
/// program needs it: printf lines, exit(), intervals), read the data block.
#[allow(clippy::too_many_arguments)]
fn live(
    args: &Args,
    watch: &hold::Watch,
    span: &Span,
    target: &KernelTarget,
    compiled: &trapvec_script::Compiled,
    name: &str,
    applied: &ApplyReport,
    poller: &mut Poller<'_>,
) -> Result<(u64, Vec<u8>, Ended)> {
    let component = applied
        .components
        .iter()
        .find(|c| c.name == name)
        .with_context(|| format!("the apply's report has no component {name}"))?;
    let data = instr_manager::ops::parse_u64(&component.data)
        .with_context(|| format!("component {name}'s data address `{}`", component.data))?;
    if component.data_len < compiled.layout.size {
        bail!(
            "component {name}'s data is {} bytes, its maps need {}",
            component.data_len,
            compiled.layout.size
        );
    }
    let line = format!(
        "tracing {} probe(s) {}\n",
        applied.spliced.len(),
        span.describe()
    );
    // A script can wait for this line before it drives the probes; --json keeps stdout whole.
    if args.json {
        eprint!("{line}");
    } else {
        print!("{line}");
    }
    let _ = std::io::stdout().flush();
    let start = Instant::now();
    let ended = match watch.pending()? {
        Some(signal) => Ended::Signal(signal),
        None => {
            let mut child = hold::spawn(span)?;
            if compiled.polls() {
                let read = |at: u64, len: usize| {
                    target
                        .read(at, len)
                        .with_context(|| format!("reading the maps at {at:#x}"))
                };
                let size = compiled.layout.size;
                let head = data + trapvec_script::layout::HEAD_OFFSET as u64;
                let mut look = || -> Result<(Vec<u8>, u64)> {
                    let snapshot = read(data, size)?;
                    let after = read(head, 8)?;
                    Ok((snapshot, trapvec_script::Layout::head(&after)))
                };
                poll_wait(watch, span, child.as_mut(), start, poller, &mut look)?
            } else {
                watch.wait(span, child.as_mut(), start)?
            }
        }
    };
    log::debug!(
        "the trace ended by {} after {:.3} s",
        ended.name(),
        start.elapsed().as_secs_f64()
    );
    let bytes = target
        .read(data, compiled.layout.size)
        .with_context(|| format!("reading the maps at {data:#x}"))?;
    Ok((data, bytes, ended))
}

/// Wait as [`hold::Watch::wait`] does, in slices of the poller's timeout, giving the poller a
/// look at the data block after each (`read`: a snapshot and the ring's head read after it),
/// until a probe or an interval calls `exit()`. After `exit()` the command,
/// if any, is killed (SIGKILL, as `--seconds` ends a command) and the trace ends as its time
/// had run out.
pub fn poll_wait(
    watch: &hold::Watch,
    span: &Span,
    mut child: Option<&mut std::process::Child>,
    start: Instant,
    poller: &mut Poller<'_>,
    read: &mut dyn FnMut() -> Result<(Vec<u8>, u64)>,
) -> Result<Ended> {
    let deadline = span.seconds.map(|s| start + Duration::from_secs_f64(s));
    loop {
        let now = Instant::now();
        let mut step = poller.timeout(now);
        if let Some(d) = deadline {
            if now >= d {
                return Ok(Ended::Elapsed);
            }
            step = step.min(d - now);
        }
        let slice = Span {
            seconds: Some(step.as_secs_f64()),
            command: Vec::new(),
        };
        match watch.wait(&slice, child.as_deref_mut(), now)? {
            Ended::Elapsed => {}
            other => return Ok(other),
        }
        let (snapshot, head) = read()?;
        if poller.step(&snapshot, head, Instant::now())? {
            log::debug!("exit() was called: the trace ends");
            if let Some(c) = child {
                let _ = c.kill();
                let _ = c.wait();
            }
            return Ok(Ended::Elapsed);
        }
    }
}
