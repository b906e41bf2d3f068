//! `trapctl -p PID cover GLOB... [--seconds N] [--mode count|once]`: block coverage of a running
//! process, from now until --seconds, a signal (Ctrl-C) or the process's exit, through its
//! agent's control channel (attached first when none answers, as `-p count` does).
//!
//! The blocks' count splices are applied as one best-effort spec; a jmp the agent refuses (its
//! springboard's padding taken by a neighbour's) is tried again as a trap in a second spec, and
//! a block refused then is listed with the agent's sentence. A block of a library the process
//! has not loaded waits as a deferred point: the agent arms it at the library's `dlopen`, and
//! the next look adopts it. Every [`LOOK`] the live hits are read (`list`); in once mode the
//! sites hit since the last look are removed then. At the end the hits are read a last time and
//! the splices removed: by `detach` when the process had no splice before (the text is then as
//! it was), else one by one, leaving the others. When the process exits first, the hits are
//! those of the last look, at most [`LOOK`] before its exit, and the report says so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use instr_manager::cover::BlockRefusal;
use instr_manager::glob::FunctionGlob;
use instr_manager::ops::{ApplyReport, ListReply, SpliceRow, UnspliceReply};
use instr_manager::Mechanism;
use trapvec_proto::Request;

use super::{Args, Mode, Object, Outcome, AGENT_REFUSED, NOT_APPLIED};
use crate::attach;
use crate::hold::{Ended, Watch};

/// How often the live hits are read (and, in once mode, the hit sites removed).
const LOOK: Duration = Duration::from_millis(100);

/// The coverage of process `pid` (`trapctl -p PID cover`).
pub fn run(pid: i32, args: &Args, verbose: bool) -> Result<()> {
    // The agent's channel, attaching first when none answers (as `-p count` does).
    let socket = || -> Result<PathBuf> {
        if let Some(s) = attach::agent_socket(pid) {
            return Ok(s);
        }
        let agent = super::find_agent(args.agent.as_deref())?;
        attach::attach(pid, &agent, verbose, attach::inject::CALL_TIMEOUT)
    };
    if !args.command.is_empty() {
        bail!("with -p, cover runs no COMMAND: the process runs on its own (give --seconds N, or stop with Ctrl-C; it also ends when the process exits)");
    }
    let globs = args
        .globs
        .iter()
        .map(|g| FunctionGlob::new(g))
        .collect::<Result<Vec<_>, _>>()?;
    let exe = format!("/proc/{pid}/exe");
    let program =
        std::fs::read_link(&exe).with_context(|| format!("process {pid}: reading {exe}"))?;
    let mut objects = super::objects(&program, &globs)?;
    if objects.iter().all(|o| o.functions == 0) {
        bail!(
            "no function of {} (or of a library it links) matches {}",
            program.display(),
            args.globs.join(" ")
        );
    }
    let dir = std::env::temp_dir().join(format!("trapctl-cover-p.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Signals are watched before the first splice: a Ctrl-C now ends the coverage, not trapctl.
    let watch = Watch::start()?;
    let result = cover(pid, args, &dir, &mut objects, &watch, socket);
    let _ = std::fs::remove_dir_all(&dir);
    let (outcome, ended, notes) = result?;
    let how = match ended {
        Some(e) => format!("process {pid} covered, ended by {}", e.name()),
        None => format!("process {pid} exited while covered"),
    };
    super::finish(args, &objects, &outcome, notes, &how)?;
    crate::hold::finish(&watch, ended.unwrap_or(Ended::Elapsed))
}

/// One block's splice in the process.
struct Armed {
    object: usize,
    block: usize,
    site: String,
    /// Hits at the last look (or at its removal).
    hits: u64,
    /// Removed already (once mode).
    removed: bool,
}

impl Armed {
    /// Block `(object, block)`'s splice as the agent lists it (applied now, or armed by the
    /// agent since, when its library was loaded), with the hits it has so far.
    fn new((object, block): (usize, usize), row: &SpliceRow) -> Armed {
        Armed {
            object,
            block,
            site: row.site.clone(),
            hits: row.hits,
            removed: false,
        }
    }
}

type Covered = (Outcome, Option<Ended>, Vec<String>);

fn cover(
    pid: i32,
    args: &Args,
    dir: &Path,
    objects: &mut [Object],
    watch: &Watch,
    socket: impl FnOnce() -> Result<PathBuf>,
) -> Result<Covered> {
    let (_, order) = super::spec(objects);
    let by_point: BTreeMap<String, (usize, usize)> = order
        .iter()
        .map(|&(i, j)| {
            (
                super::spec_point(&objects[i], &objects[i].blocks[j]),
                (i, j),
            )
        })
        .collect();
    let socket = socket()?;
    let before: ListReply = attach::ask(pid, &socket, &Request::List)?;
    let had_splices = !before.listing.splices.is_empty();
    let ours = Ours {
        by_point: &by_point,
        before: before.listing.splices.iter().map(|r| r.id).collect(),
    };
    let mut armed: BTreeMap<u64, Armed> = BTreeMap::new();
    let mut round = order.clone();
    for attempt in 0..2 {
        if round.is_empty() {
            break;
        }
        let report = apply(pid, &socket, dir, &super::spec_of(objects, &round))?;
        for row in &report.spliced {
            if let Some(&block) = by_point.get(&row.at) {
                armed.insert(row.id, Armed::new(block, row));
            }
        }
        let mut again = Vec::new();
        for sentence in &report.refused {
            // `POINT: reason`: the point has no `: ` of its own.
            let named = by_point
                .get(sentence.split(": ").next().unwrap_or(""))
                .or_else(|| {
                    by_point
                        .iter()
                        .find(|(point, _)| sentence.contains(&format!("{point}: ")))
                        .map(|(_, ij)| ij)
                });
            let Some(&(i, j)) = named else {
                log::warn!("process {pid}: a refusal that names no block: {sentence}");
                continue;
            };
            if attempt == 0 && objects[i].blocks[j].site == Ok(Mechanism::Jmp) {
                log::info!("{sentence}; trying a trap there");
                objects[i].blocks[j].site = Ok(Mechanism::Trap);
                again.push((i, j));
                continue;
            }
            objects[i].blocks[j].site = Err(BlockRefusal {
                kind: AGENT_REFUSED.into(),
                reason: sentence.clone(),
            });
        }
        round = again;
    }
    // Neither spliced nor refused by name: a deferred point, in a library the process has not
    // loaded. The agent arms it when the library is mapped (dlopen); the looks adopt it then.
    let waiting = order
        .iter()
        .filter(|&&(i, j)| objects[i].blocks[j].site.is_ok())
        .count()
        - armed.len();
    eprintln!(
        "covering {} block(s) of process {pid}{} {} ({} mode)",
        armed.len(),
        if waiting > 0 {
            format!(" ({waiting} more when their library is loaded)")
        } else {
            String::new()
        },
        describe(args),
        match args.mode {
            Mode::Count => "count",
            Mode::Once => "once",
        }
    );
    let start = Instant::now();
    let deadline = args.seconds.map(|s| start + Duration::from_secs_f64(s));
    let mut batches = 0u64;
    let mut notes = Vec::new();
    let once = args.mode == Mode::Once;
    let ended = loop {
        if let Some(signal) = watch.pending()? {
            break Some(Ended::Signal(signal));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Some(Ended::Elapsed);
        }
        if !alive(pid) {
            break None;
        }
        match look(pid, &socket, &mut armed, once, &ours) {
            Ok(true) => batches += 1,
            Ok(false) => {}
            // The process may have exited during the look.
            Err(_) if !alive(pid) => break None,
            Err(e) => {
                // Leave nothing of ours behind before saying why.
                if let Err(also) = remove(pid, &socket, &mut armed, had_splices, &ours) {
                    log::warn!("{also:#}");
                }
                return Err(e);
            }
        }
        std::thread::sleep(LOOK);
    };
    match remove(pid, &socket, &mut armed, had_splices, &ours) {
        Ok(()) => {}
        Err(_) if !alive(pid) => {}
        Err(e) => return Err(e),
    }
    let armed_sites: BTreeSet<(usize, usize)> =
        armed.values().map(|a| (a.object, a.block)).collect();
    for &(i, j) in &order {
        if !armed_sites.contains(&(i, j)) && objects[i].blocks[j].site.is_ok() {
            objects[i].blocks[j].site = Err(BlockRefusal {
                kind: NOT_APPLIED.into(),
                reason: "its library was not loaded while the process was covered".into(),
            });
        }
    }
    if !alive(pid) {
        notes.push(format!(
            "process {pid} exited: the hits are those read at most {} ms before its exit",
            LOOK.as_millis()
        ));
    }
    let mut hits: super::Hits = objects.iter().map(|o| vec![None; o.blocks.len()]).collect();
    let mut disarmed: Vec<Vec<bool>> = objects
        .iter()
        .map(|o| vec![false; o.blocks.len()])
        .collect();
    for a in armed.values() {
        hits[a.object][a.block] = Some(a.hits);
        disarmed[a.object][a.block] = a.removed;
    }
    Ok((
        Outcome {
            exit: 0,
            hits,
            disarmed: once.then_some(disarmed),
            batches: once.then_some(batches),
        },
        ended,
        notes,
    ))
}

/// Remove the splices of `armed` not removed yet, their last hits read on the way (after a
/// last look adopts the blocks armed since the previous one): when the process had no splice
/// before, all of them and then the agent's channel (`detach`: the text is as it was before),
/// else one by one, leaving the others'.
fn remove(
    pid: i32,
    socket: &Path,
    armed: &mut BTreeMap<u64, Armed>,
    had_splices: bool,
    ours: &Ours,
) -> Result<()> {
    look(pid, socket, armed, false, ours)?;
    if had_splices {
        for a in armed.values_mut().filter(|a| !a.removed) {
            let r = attach::ask::<UnspliceReply>(pid, socket, &unsplice(&a.site))?;
            if let UnspliceReply::One(u) = r {
                a.hits = a.hits.max(u.hits);
            }
        }
        return Ok(());
    }
    let all = Request::Unsplice {
        at: None,
        all: true,
    };
    if let UnspliceReply::All(all) = attach::ask::<UnspliceReply>(pid, socket, &all)? {
        let by_site: BTreeMap<&str, u64> = all
            .unspliced
            .iter()
            .map(|u| (u.site.as_str(), u.hits))
            .collect();
        for a in armed.values_mut().filter(|a| !a.removed) {
            if let Some(&hits) = by_site.get(a.site.as_str()) {
                a.hits = a.hits.max(hits);
            }
        }
    }
    attach::send(pid, socket, &serde_json::json!({"op": "detach"}))
        .with_context(|| format!("process {pid}: detaching"))?;
    Ok(())
}

fn unsplice(site: &str) -> Request {
    Request::Unsplice {
        at: Some(site.to_string()),
        all: false,
    }
}

/// Apply `text` as a best-effort spec through the agent's channel.
fn apply(pid: i32, socket: &Path, dir: &Path, text: &str) -> Result<ApplyReport> {
    let path = dir.join("cover.toml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let request = Request::Apply {
        spec: std::fs::canonicalize(&path)?,
        best_effort: true,
        check: false,
        brief: false,
    };
    attach::ask(pid, socket, &request)
        .with_context(|| format!("process {pid}: applying the coverage splices"))
}

fn describe(args: &Args) -> String {
    match args.seconds {
        Some(s) => format!("for {s} s"),
        None => "until Ctrl-C (SIGINT, SIGTERM or SIGHUP) or its exit".into(),
    }
}

/// Whether process `pid` runs (exists and is no zombie).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last `)`.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The blocks' points, to know the splices the agent arms later (when their library is
/// loaded) as ours, and the splices the process had before (never ours, whatever their point).
struct Ours<'a> {
    by_point: &'a BTreeMap<String, (usize, usize)>,
    before: BTreeSet<u64>,
}

/// Read the live hits of `armed`, adopting the blocks the agent armed since the last look
/// (their library was loaded since); with `once`, remove the sites hit and not yet removed.
/// Whether anything was removed.
fn look(
    pid: i32,
    socket: &Path,
    armed: &mut BTreeMap<u64, Armed>,
    once: bool,
    ours: &Ours,
) -> Result<bool> {
    let listing: ListReply = attach::ask(pid, socket, &Request::List)?;
    let mut blocks: BTreeSet<(usize, usize)> =
        armed.values().map(|a| (a.object, a.block)).collect();
    for row in &listing.listing.splices {
        if let Some(a) = armed.get_mut(&row.id) {
            a.hits = a.hits.max(row.hits);
            continue;
        }
        if ours.before.contains(&row.id) {
            continue;
        }
        let Some(&(i, j)) = ours.by_point.get(&row.at) else {
            continue;
        };
        if blocks.insert((i, j)) {
            log::debug!(
                "process {pid}: {} armed since (its library was loaded)",
                row.at
            );
            armed.insert(row.id, Armed::new((i, j), row));
        }
    }
    if !once {
        return Ok(false);
    }
    let mut removed = false;
    for a in armed.values_mut().filter(|a| a.hits > 0 && !a.removed) {
        let r = attach::ask::<UnspliceReply>(pid, socket, &unsplice(&a.site))?;
        if let UnspliceReply::One(u) = r {
            a.hits = a.hits.max(u.hits);
        }
        a.removed = true;
        removed = true;
    }
    Ok(removed)
}
