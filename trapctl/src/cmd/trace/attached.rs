//! The process side of `trapctl trace` when the maps are read while the program runs:
//! `trapctl -p PID trace -e PROGRAM` (a running process, through its agent's control channel)
//! and `--seconds N` on a command started under the LD_PRELOAD agent.
//!
//! The maps live in the component's data block inside the process. Once the probes are removed
//! (the removal waits until no thread is inside a trampoline or the component, so no update is
//! half made), the block is read through `/proc/PID/mem`: its address is the component's data
//! block as the agent reports it (`data` of its row) plus the offset of the data symbol, laid
//! out as the component manager lays every component out ([`component_manager::layout::plan`]).
//! The same ptrace rights that attaching needs allow the read.
//!
//! A process that exits while traced (by `exit`) leaves its maps in the dump file as a command
//! run under the agent does.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use component_manager::parse::SymbolDef;
use instr_manager::ops::{ApplyReport, ComponentRow, Unloaded, UnspliceReply};
use trapvec_proto::Request;

use crate::attach;
use crate::hold::{self, Ended, Span, Watch};

use super::poll::Poller;
use super::{print_report, Args, Prepared};

/// How often the wait looks whether the traced process still exists.
const EXIT_POLL: Duration = Duration::from_millis(100);

/// Why the maps could not be found in the process's memory.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the compiled component has no `{0}` symbol in a section")]
    NoDataSymbol(&'static str),
    #[error("the compiled component's data symbol is not in its data block")]
    NotInData,
    #[error("the agent reports the component's data block at `{0}`, not an address")]
    Address(String),
    #[error("reading {len} bytes of the maps at {addr:#x} in process {pid}")]
    Mem {
        pid: i32,
        addr: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
}

/// The maps' bytes in process `pid`, whose agent loaded `compiled`'s component as `row`.
pub fn read_maps(
    pid: i32,
    row: &ComponentRow,
    compiled: &trapvec_script::Compiled,
) -> Result<Vec<u8>> {
    let addr = maps_address(row, compiled)?;
    read_mem(pid, addr, compiled.layout.size)
}

/// A snapshot of the maps and the ring's head read after it (see [`trapvec_script::Drain`]).
fn snapshot(
    pid: i32,
    row: &ComponentRow,
    compiled: &trapvec_script::Compiled,
) -> Result<(Vec<u8>, u64)> {
    let addr = maps_address(row, compiled)?;
    let data = read_mem(pid, addr, compiled.layout.size)?;
    let head = read_mem(pid, addr + trapvec_script::layout::HEAD_OFFSET as u64, 8)?;
    Ok((data, trapvec_script::Layout::head(&head)))
}

/// `len` bytes at `addr` in process `pid`, through `/proc/PID/mem`.
fn read_mem(pid: i32, addr: u64, len: usize) -> Result<Vec<u8>> {
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).map_err(|source| ReadError::Mem {
        pid,
        addr,
        len,
        source,
    })?;
    let mut data = vec![0u8; len];
    mem.read_exact_at(&mut data, addr)
        .map_err(|source| ReadError::Mem {
            pid,
            addr,
            len,
            source,
        })?;
    Ok(data)
}

/// Where the maps are in the process whose agent loaded `compiled`'s component as `row`.
fn maps_address(row: &ComponentRow, compiled: &trapvec_script::Compiled) -> Result<u64> {
    let object = component_manager::parse::parse(&compiled.object)
        .context("parsing the compiled component again")?;
    let plan = component_manager::layout::plan(&object, &BTreeSet::new(), &BTreeSet::new())
        .context("laying the compiled component out again")?;
    let (section, value) = object
        .symbols
        .iter()
        .find(|s| s.name == trapvec_script::DATA_SYMBOL)
        .and_then(|s| match s.def {
            SymbolDef::Section { index, value } => Some((index, value)),
            _ => None,
        })
        .ok_or(ReadError::NoDataSymbol(trapvec_script::DATA_SYMBOL))?;
    let slot = plan
        .sections
        .get(section)
        .copied()
        .flatten()
        .filter(|s| s.kind == trapvec::BlockKind::Data)
        .ok_or(ReadError::NotInData)?;
    let base = u64::from_str_radix(row.data.trim_start_matches("0x"), 16)
        .map_err(|_| ReadError::Address(row.data.clone()))?;
    Ok(base + slot.offset as u64 + value)
}

/// Whether process `pid` is gone (or a zombie: it runs nothing any more).
fn gone(pid: i32) -> bool {
    match attach::maps::status_field(pid, "State") {
        Some(state) => matches!(state.trim_start().chars().next(), Some('Z' | 'X')),
        None => true,
    }
}

/// Wait until `span`'s time is up, a watched signal came, or process `pid` is gone (`None`);
/// after each step `look` reads the maps when the program needs it (true: `exit()` was called,
/// which ends the wait as the time had run out).
fn wait(
    watch: &Watch,
    span: &Span,
    pid: i32,
    poller: &mut Poller<'_>,
    look: &mut dyn FnMut() -> Result<Option<(Vec<u8>, u64)>>,
) -> Result<Option<Ended>> {
    let start = Instant::now();
    let deadline = span.seconds.map(|s| start + Duration::from_secs_f64(s));
    loop {
        if gone(pid) {
            return Ok(None);
        }
        let step = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Ok(Some(Ended::Elapsed));
                }
                EXIT_POLL.min(d - now)
            }
            None => EXIT_POLL,
        };
        let step = step.min(poller.timeout(Instant::now()));
        let slice = Span {
            seconds: Some(step.as_secs_f64()),
            command: Vec::new(),
        };
        if let Ended::Signal(s) = watch.wait(&slice, None, Instant::now())? {
            return Ok(Some(Ended::Signal(s)));
        }
        if let Some((data, head)) = look()? {
            if poller.step(&data, head, Instant::now())? {
                return Ok(Some(Ended::Elapsed));
            }
        }
    }
}

/// `trapctl -p PID trace`: the program's probes spliced into the running process by its agent
/// (attaching first if none answers), held for `--seconds N`, until SIGINT, SIGTERM or SIGHUP,
/// or until the process exits; then removed, the maps read and printed, the component
/// unloaded, and the agent's channel stopped if this command started it. The process goes on.
pub fn run(pid: i32, args: &Args, text: &str, verbose: bool) -> Result<()> {
    if !args.command.is_empty() {
        bail!("with -p, trace runs no COMMAND: the process runs on its own (give --seconds N, or stop with Ctrl-C)");
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .with_context(|| format!("process {pid}: reading /proc/{pid}/exe"))?;
    let dir = std::env::temp_dir().join(format!("trapctl-trace.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The agent in the process reads the component and spec and writes the dump file here.
    let result = (|| {
        let prepared = super::prepare(args, text, &exe, Some(pid), &dir)?;
        traced(pid, args, &prepared, verbose)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (watch, ended) = result?;
    match ended {
        Some(ended) => hold::finish(&watch, ended),
        None => Ok(()),
    }
}

fn traced(
    pid: i32,
    args: &Args,
    prepared: &Prepared,
    verbose: bool,
) -> Result<(Watch, Option<Ended>)> {
    let ours = attach::agent_socket(pid).is_none();
    let socket = match attach::agent_socket(pid) {
        Some(s) => s,
        None => {
            let agent = crate::cmd::cover::find_agent(args.agent.as_deref())?;
            attach::attach(pid, &agent, verbose, attach::inject::CALL_TIMEOUT)?
        }
    };
    // Signals are watched before the probes exist: a Ctrl-C now ends the hold, not trapctl.
    let watch = Watch::start()?;
    let applied: ApplyReport = attach::ask(
        pid,
        &socket,
        &Request::Apply {
            spec: prepared.spec.clone(),
            best_effort: false,
            check: false,
            brief: false,
        },
    )
    .with_context(|| format!("process {pid}: the probes could not be spliced"))?;
    if !applied.refused.is_empty() {
        // Nothing may stay behind: what was made is removed before saying why.
        let _ = remove(pid, &socket, &applied, &prepared.object);
        bail!(
            "process {pid}: the probes could not be spliced: {}",
            applied.refused.join("; ")
        );
    }
    let span = Span {
        seconds: args.seconds,
        command: Vec::new(),
    };
    let line = format!(
        "tracing {} probe(s) in process {pid} {}\n",
        applied.spliced.len().saturating_sub(1),
        span.describe()
    );
    if args.json {
        eprint!("{line}");
    } else {
        crate::print(&prepared.begin.concat())?;
        print!("{line}");
        let _ = std::io::stdout().flush();
    }
    let mut poller = Poller::new(&prepared.compiled, args.json, Instant::now());
    let row = component_of(pid, &applied.components, &prepared.object);
    let mut look = || -> Result<Option<(Vec<u8>, u64)>> {
        match (&row, prepared.compiled.polls()) {
            (Ok(row), true) if !gone(pid) => snapshot(pid, row, &prepared.compiled).map(Some),
            _ => Ok(None),
        }
    };
    let ended = wait(&watch, &span, pid, &mut poller, &mut look)?;
    let data = match ended {
        None => std::fs::read(&prepared.dump).with_context(|| {
            format!("process {pid} ended without calling exit() (killed, _exit or exec): no maps to print")
        })?,
        Some(_) => {
            let row = remove(pid, &socket, &applied, &prepared.object)?;
            let data = read_maps(pid, &row, &prepared.compiled);
            let unloaded = unload(pid, &socket, &row.name);
            let detached = match ours {
                true => attach::send(pid, &socket, &serde_json::json!({"op": "detach"})).map(drop),
                false => Ok(()),
            };
            let data = data?;
            unloaded?;
            detached?;
            data
        }
    };
    let results = poller.finish(&data)?;
    let end: Vec<String> = prepared
        .compiled
        .end
        .iter()
        .map(trapvec_script::format_printf)
        .collect();
    print_report(
        args,
        0,
        prepared.begin.clone(),
        end,
        &results,
        &poller.printed,
        poller.lost(),
    )?;
    Ok((watch, ended))
}

/// Remove the splices `applied` made (one batch); the row of the component it loaded from
/// `object`.
fn remove(pid: i32, socket: &Path, applied: &ApplyReport, object: &Path) -> Result<ComponentRow> {
    let sites: Vec<String> = applied.spliced.iter().map(|r| r.site.clone()).collect();
    if !sites.is_empty() {
        match attach::ask::<UnspliceReply>(pid, socket, &Request::Remove { at: sites })? {
            UnspliceReply::All(_) => {}
            other => bail!("process {pid}: the removal of the probes was answered with {other:?}"),
        }
    }
    component_of(pid, &applied.components, object)
}

/// The row of the component loaded from `object`.
fn component_of(pid: i32, rows: &[ComponentRow], object: &Path) -> Result<ComponentRow> {
    let want = object.display().to_string();
    rows.iter()
        .find(|c| c.path.as_deref() == Some(want.as_str()))
        .cloned()
        .with_context(|| format!("process {pid}: its agent lists no component loaded from {want}"))
}

fn unload(pid: i32, socket: &Path, name: &str) -> Result<()> {
    let _: Unloaded = attach::ask(
        pid,
        socket,
        &Request::Unload {
            name: name.to_string(),
        },
    )?;
    Ok(())
}

/// `trapctl trace --process [--seconds N] -- COMMAND` when the maps are read while it runs: the
/// command (started with its agent's control channel) runs for N seconds, or until a probe or
/// an interval calls `exit()`; meanwhile the poller reads its maps when the program needs it
/// (printf lines, intervals, exit()). Then the probes are removed, the maps read, and the
/// command killed. `None` when the command exited before (its maps are in the dump file as
/// without --seconds).
pub fn read_then_kill(
    child: &mut std::process::Child,
    prepared: &Prepared,
    seconds: Option<f64>,
    poller: &mut Poller<'_>,
) -> Result<Option<Vec<u8>>> {
    let pid = i32::try_from(child.id()).context("the command's pid")?;
    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut row: Option<ComponentRow> = None;
    let mut counted = false;
    loop {
        if child
            .try_wait()
            .context("waiting for the command")?
            .is_some()
        {
            return Ok(None);
        }
        let now = Instant::now();
        let mut step = EXIT_POLL;
        if let Some(d) = deadline {
            if now >= d {
                break;
            }
            step = step.min(d - now);
        }
        if !prepared.compiled.polls() {
            std::thread::sleep(step);
            continue;
        }
        std::thread::sleep(step.min(poller.timeout(now)));
        if row.is_none() {
            // The agent lists the component once its channel is up and the spec applied.
            row = attach::agent_socket(pid).and_then(|socket| {
                let listing: instr_manager::ops::ListReply =
                    attach::ask(pid, &socket, &Request::List).ok()?;
                component_of(pid, &listing.listing.components, &prepared.object).ok()
            });
        }
        if row.is_some() && !counted {
            // The probes are live (the agent applied the spec before it listed the component).
            poller.start_at(Instant::now());
            counted = true;
        }
        let Some(r) = &row else { continue };
        match snapshot(pid, r, &prepared.compiled) {
            Ok((data, head)) => {
                if poller.step(&data, head, Instant::now())? {
                    break;
                }
            }
            // Gone meanwhile: its maps are in the dump file.
            Err(_) if gone(pid) => continue,
            Err(e) => return Err(e),
        }
    }
    let data = (|| {
        let socket: PathBuf = attach::agent_socket(pid)
            .with_context(|| format!("the agent of the command (process {pid}) does not answer"))?;
        let _: UnspliceReply = attach::ask(
            pid,
            &socket,
            &Request::Unsplice {
                at: None,
                all: true,
            },
        )?;
        let listing: instr_manager::ops::ListReply = attach::ask(pid, &socket, &Request::List)?;
        let row = component_of(pid, &listing.listing.components, &prepared.object)?;
        read_maps(pid, &row, &prepared.compiled)
    })();
    // Killed whatever happened: --seconds promises the command does not outlive the trace.
    let _ = child.kill();
    data.map(Some)
}
