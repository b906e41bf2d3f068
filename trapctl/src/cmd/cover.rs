//! `trapctl cover --process GLOB... -- COMMAND ARGS...`: block coverage of a program, live.
//! Without `--process`, of the running kernel ([`kernel`]).
//!
//! Every basic block of every function the globs name gets a counting splice at its first
//! instruction (a jmp where one fits, else a trap; [`instr_manager::cover::object_blocks`]),
//! written as a spec for the LD_PRELOAD agent; COMMAND runs under the agent, whose stats file
//! (read when the program exits) gives each block's hits. A block that cannot take a site is
//! listed with its reason, never fatal; one the agent refuses at start (it exits 86 before
//! `main`, with nothing applied and nothing of the program run) is marked refused with the
//! agent's sentence and the command is started again without it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use instr_manager::cover::{
    glob_names_object, lcov_with, object_blocks, symbol_records, BlockHits, BlockRefusal,
    CoverBlock, LineTable,
};
use instr_manager::glob::FunctionGlob;
use instr_manager::image::CodeImage;
use instr_manager::Mechanism;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The version of `--json`'s layout.
pub const SCHEMA: u32 = 1;

/// `once` mode: how often the agent removes the sites hit since its last look.
const ONCE_PERIOD_MS: u64 = 100;

/// How many blocks the agent may refuse, one start each, before giving up.
const MAX_RESTARTS: usize = 64;

/// The kind of a block the agent refused in the batch, by its sentence alone (the planner's
/// refusals are kinded by cause, [`instr_manager::RefusalCause::name`]).
pub(crate) const AGENT_REFUSED: &str = "agent_refused";

/// The kind of a block of a library the process never loaded while covered.
pub(crate) const NOT_APPLIED: &str = "not_applied";

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Keep counting: exact hits per block.
    Count,
    /// Disarm a site after its first hit (in batches every 100 ms).
    Once,
}

/// Block coverage of a program, without a rebuild.
#[derive(clap::Args)]
#[command(long_about = "\
Count the hits of the first instruction of every basic block of every function GLOB names, in
the running kernel or (--process) in a program, then print per-function block coverage (blocks,
covered, percent; most covered first) and a total.

The kernel (no --process): GLOB is a shell glob over /proc/kallsyms functions (`'tcp_*'`;
`'MOD:GLOB'` for a module's). Every block gets a count trap (the entry block's past the ftrace
site), all armed in ONE best-effort batch, through trapd when it runs, else straight to the
module (as `trapctl apply` goes). A block that cannot take one is listed with the reason and
counted as not covered, never fatal; so is every block past the module's 262,144 sites of one
batch (functions in address order; `over_batch_limit`: narrow the globs). The coverage lasts --seconds N, or while `-- COMMAND ARGS`
runs (trapctl then exits with its status), or until SIGINT (Ctrl-C), SIGTERM or SIGHUP; however
it ends, every site is removed (one batch, through trapd one `remove` request) and the report
printed, and a signal then ends trapctl as `trapctl count` does. The sites record this command as
their owner: if it is killed by SIGKILL, `trapctl unsplice --orphans` removes them. Without
trapd, /dev/trapvec is locked only while sites are armed or removed, so COMMAND may run trapctl
(`trapctl list` shows the sites). --json gives
every block (function, offset, address, length, hit, count) with \"schema\": 1; --lcov writes
source lines when vmlinux's debug file is known (--debuginfo, else
/usr/lib/debug/boot/vmlinux-RELEASE as Debian's linux-image-*-dbg package installs it), else
function+offset records, and says so.

--process: GLOB is a shell glob
over function names of the program (`'*'`, `'parse_*'`); `OBJECT:GLOB` names a library the
program links (`'libfoo.so.1:foo_*'`, found as ldd finds it). Quote globs from the shell. A name
several static functions of one object share is covered copy by copy, each named by its address
in the file (`helper@0x1139`, as nm prints it). A COMMAND that is a script (`#!`) runs its
interpreter: the program's functions and libraries are the interpreter's.

A block gets a jmp splice where one fits (cheap), else a trap; a block that can take neither is
listed with the reason and counted as not covered, never fatal. COMMAND runs under the LD_PRELOAD
agent (--agent, else $TRAPVEC_AGENT, else libtrapvec_agent.so next to trapctl or in
/usr/lib/<multiarch>/trapvec/). trapctl exits with COMMAND's exit status (128+N when a signal N
killed it).

--mode count (the default for now) keeps every site armed and counts every hit. `once`, on the
kernel: every 100 ms the sites hit since the last look are disarmed in one batch, so a block
costs traps only until then; hit/not hit is exact, a count is the hits until the disarming, and
--lcov writes no BRDA records. `once` with --process: the agent's own thread does the same in
the program (every 100 ms the sites hit are removed in one batch); a site's count is its hits
until then, and the JSON gives `disarmed` per block and `disarm_batches`.

`trapctl -p PID cover GLOB...`: a running process, from the moment its sites are armed until
--seconds N, Ctrl-C (SIGINT, SIGTERM, SIGHUP) or its exit, through its agent (attached first when
none answers); then the splices are removed (and the agent's channel stopped when the process had
no splice before: its text is as it was) and the same report printed. No COMMAND.

An `OBJECT:GLOB` whose object the program does not link names a library it loads later
(dlopen): its file is found as the loader finds it (a path; $LD_LIBRARY_PATH, the loader's
cache, the default directories) and the agent arms its blocks when it is mapped.

--lcov FILE writes an lcov tracefile for genhtml: a line is executed when a hit block covers it
(the program's DWARF line table: build it with -g, or give --debuginfo). Without debug info the
file holds symbol+offset records and says why. BRDA records give, per conditional branch, taken
and not taken where block counts determine them.

--from-json FILE (no GLOB): a report saved with --json (kernel or program) again, covering
nothing: the same table, or --json, and --lcov FILE made now, from --debuginfo (else, for
vmlinux, /usr/lib/debug/boot/vmlinux-RELEASE of the release the report names; for a program,
its files as the report names them). So the lines of a guest's kernel are made on a host that
has its debug file. The file must be the covered code's: its GNU build-id must be the one the
report recorded, and every function must be in it at its address (vmlinux's run-time address
less the KASLR slide, from the report's `_text`); else trapctl names what disagrees and writes
nothing.")]
pub struct Args {
    /// Cover a program run under the agent (else the running kernel).
    #[arg(long)]
    pub process: bool,
    /// Function globs (`'*'`, `'parse_*'`, `'libfoo.so.1:foo_*'`).
    #[arg(required_unless_present = "from_json")]
    pub globs: Vec<String>,
    /// Re-render a report saved with --json (text, --json, --lcov), covering nothing.
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["globs", "process", "mode", "seconds", "command", "agent"]
    )]
    pub from_json: Option<PathBuf>,
    /// `count`: exact hits per block (the default); `once`: disarm after the first hit.
    #[arg(long, value_enum, default_value = "count")]
    pub mode: Mode,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write an lcov tracefile.
    #[arg(long, value_name = "FILE")]
    pub lcov: Option<PathBuf>,
    /// The program's debug information (a separate debug file), for --lcov.
    #[arg(long, value_name = "FILE")]
    pub debuginfo: Option<PathBuf>,
    /// Write the report (text or JSON) to FILE instead of stdout, which the command shares.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The agent to preload [default: $TRAPVEC_AGENT, else found next to trapctl].
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// The kernel, or a process with -p PID: cover for N seconds [default: while COMMAND runs,
    /// else until Ctrl-C].
    #[arg(long, value_name = "N", conflicts_with = "command")]
    pub seconds: Option<f64>,
    /// The command to run, and its arguments (required with --process).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// One object's blocks.
struct Object {
    path: PathBuf,
    /// How a point names it: `None` for the main program (a point in it is unqualified).
    qualifier: Option<String>,
    functions: usize,
    blocks: Vec<CoverBlock>,
}

/// A program's own fields of a block's row ([`table::BlockRow`]).
#[derive(Serialize, Deserialize)]
struct InProgram {
    object: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mechanism: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hits: Option<u64>,
    /// `once` mode: the site was removed while the program ran (after its first hits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disarmed: Option<bool>,
}

/// An object covered (`--json`'s `objects`, the program first): its path and GNU build-id, so
/// that a saved report's lines are made from the right file (`--from-json`).
#[derive(Serialize, Deserialize, Clone)]
struct ObjectRow {
    path: String,
    build_id: Option<String>,
}

/// A program's report (`--json`), also as `--from-json` reads it back.
#[derive(Serialize, Deserialize)]
struct Report {
    schema: u32,
    command: Vec<String>,
    /// The program's path (a block's `object` is this or a library's).
    program: String,
    mode: String,
    /// The command's exit status (128+N for a signal N).
    exit: i32,
    /// `once` mode: how many batches removed hit sites while the program ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disarm_batches: Option<u64>,
    /// Absent in a report of a trapctl before it was written.
    #[serde(default)]
    objects: Vec<ObjectRow>,
    functions: Vec<FunctionRow>,
    blocks: Vec<BlockRow<InProgram>>,
    total: Total,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// The text's refused blocks (`blocks` says the same in JSON).
    #[serde(skip)]
    refused: Vec<RefusedBlock>,
}

/// The agent: `--agent`, `$TRAPVEC_AGENT`, next to trapctl's executable, or the package's.
pub(crate) fn find_agent(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(a) = arg {
        return Ok(a.to_path_buf());
    }
    if let Some(a) = std::env::var_os("TRAPVEC_AGENT") {
        return Ok(a.into());
    }
    let mut tried = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        tried.push(dir.join("libtrapvec_agent.so"));
    }
    for lib in ["/usr/lib/x86_64-linux-gnu/trapvec", "/usr/lib/trapvec"] {
        tried.push(Path::new(lib).join("libtrapvec_agent.so"));
    }
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    bail!(
        "libtrapvec_agent.so not found (tried {}): give --agent PATH or set TRAPVEC_AGENT",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The shared libraries `program` loads at start, as `ldd` lists them.
fn linked_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .context("running ldd to find the program's libraries")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" => ").map(|(_, r)| r))
        .filter_map(|r| r.split_whitespace().next())
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .collect())
}

/// The objects the globs name and their blocks: the main program for globs without an object
/// part, a linked library for each one whose file name or path an object part matches.
fn objects(program: &Path, globs: &[FunctionGlob]) -> Result<Vec<Object>> {
    let mut out = Vec::new();
    let image = CodeImage::from_path(program).with_context(|| program.display().to_string())?;
    let origin = program.display().to_string();
    let b = object_blocks(&image, &origin, globs, true);
    out.push(Object {
        path: program.to_path_buf(),
        qualifier: None,
        functions: b.functions,
        blocks: b.blocks,
    });
    if globs.iter().any(glob_names_object) {
        for lib in linked_libraries(program)? {
            let Ok(image) = CodeImage::from_path(&lib) else {
                log::warn!("{}: not readable as ELF, left out", lib.display());
                continue;
            };
            let origin = lib.display().to_string();
            let b = object_blocks(&image, &origin, globs, false);
            if b.functions > 0 {
                out.push(Object {
                    qualifier: lib.file_name().map(|f| f.to_string_lossy().into_owned()),
                    path: lib,
                    functions: b.functions,
                    blocks: b.blocks,
                });
            }
        }
    }
    // An object part that names no library the program links: one it loads later (dlopen),
    // whose blocks the agent arms when it is mapped.
    for g in globs {
        let Some(object) = libs::object_part(g).filter(|o| !instr_manager::glob::is_glob(o)) else {
            continue;
        };
        let origin_of = |o: &Object| o.path.display().to_string();
        if out
            .iter()
            .skip(1)
            .any(|o| instr_manager::point::object_matches(&origin_of(o), object))
        {
            continue;
        }
        let Some(lib) = libs::find_library(object) else {
            log::warn!("{object}: not linked by the program and not found as a library file (give its path)");
            continue;
        };
        if out.iter().any(|o| o.path == lib) {
            continue;
        }
        let image = CodeImage::from_path(&lib).with_context(|| lib.display().to_string())?;
        let b = object_blocks(&image, &lib.display().to_string(), globs, false);
        if b.functions > 0 {
            out.push(Object {
                qualifier: lib.file_name().map(|f| f.to_string_lossy().into_owned()),
                path: lib,
                functions: b.functions,
                blocks: b.blocks,
            });
        }
    }
    Ok(out)
}

/// A block's point as the agent takes it: unqualified in the main program (the agent binds an
/// unqualified name to the program's own definition first), `FILE:` in a library.
fn spec_point(o: &Object, b: &CoverBlock) -> String {
    match &o.qualifier {
        Some(q) => format!("{q}:{}", b.point()),
        None => b.point(),
    }
}

/// The spec: one count splice per block with a site, in (object, block) order.
fn spec(objects: &[Object]) -> (String, Vec<(usize, usize)>) {
    let order: Vec<(usize, usize)> = objects
        .iter()
        .enumerate()
        .flat_map(|(i, o)| {
            o.blocks
                .iter()
                .enumerate()
                .filter(|(_, b)| b.site.is_ok())
                .map(move |(j, _)| (i, j))
        })
        .collect();
    (spec_of(objects, &order), order)
}

/// The spec of the blocks `order` names (each with a site), in that order.
fn spec_of(objects: &[Object], order: &[(usize, usize)]) -> String {
    let mut s = String::new();
    for &(i, j) in order {
        let (o, b) = (&objects[i], &objects[i].blocks[j]);
        if let Ok(m) = &b.site {
            let _ = write!(
                s,
                "[[splice]]\nat = \"{}\"\naction = \"count\"\nmechanism = \"{}\"\n\n",
                spec_point(o, b),
                match m {
                    Mechanism::Trap => "trap",
                    Mechanism::Jmp => "jmp",
                }
            );
        }
    }
    s
}

/// A run of the command: its exit status, the agent's refusal sentence if it exited 86 with
/// one, and the stats file's contents if written.
struct Run {
    exit: i32,
    once: bool,
    refused: Option<String>,
    stats: Option<String>,
}

fn run_once(args: &Args, program: &Path, agent: &Path, dir: &Path, spec_text: &str) -> Result<Run> {
    let spec_path = dir.join("cover.toml");
    let stats_path = dir.join("stats.json");
    std::fs::write(&spec_path, spec_text)
        .with_context(|| format!("writing {}", spec_path.display()))?;
    let _ = std::fs::remove_file(&stats_path);
    let once = args.mode == Mode::Once;
    let period = ONCE_PERIOD_MS.to_string();
    let mut env: Vec<(&str, &Path)> = vec![("TRAPVEC_STATS", &stats_path)];
    if once {
        env.push(("TRAPVEC_ONCE_MS", Path::new(&period)));
    }
    let ended = super::under_agent::run(program, &args.command, agent, &spec_path, &env, true)?;
    let stats = std::fs::read_to_string(&stats_path).ok();
    Ok(Run {
        exit: ended.exit,
        once,
        refused: ended.refused,
        stats,
    })
}

pub(crate) mod attached;
mod debugfile;
mod kernel;
pub(crate) mod libs;
mod saved;
mod table;

use debugfile::{DebugFile, NoLines};
use table::{BlockRow, FunctionRow, Home, RefusedBlock, Tally, Total};

/// Run `trapctl cover`.
pub fn run(args: &Args) -> Result<()> {
    if let Some(path) = &args.from_json {
        return saved::run(args, path);
    }
    if !args.process {
        return kernel::run(args);
    }
    if args.command.is_empty() {
        bail!("--process needs the command to run, after `--`");
    }
    if args.seconds.is_some() {
        bail!(
            "--seconds is for the kernel; with --process the coverage lasts while the command runs"
        );
    }
    let globs = args
        .globs
        .iter()
        .map(|g| FunctionGlob::new(g))
        .collect::<Result<Vec<_>, _>>()?;
    let program = super::under_agent::find_command(&args.command[0])?;
    let agent = find_agent(args.agent.as_deref())?;
    // A script's process runs its interpreter: the main image and the libraries are its.
    let image = super::under_agent::executable_image(&program)?;
    let mut objects = objects(&image, &globs)?;
    if objects.iter().all(|o| o.functions == 0) {
        bail!(
            "no function of {} (or of a library it links, or loads later and is found as the loader finds it: $LD_LIBRARY_PATH, its cache, the default directories; or by path) matches {}",
            image.display(),
            args.globs.join(" ")
        );
    }
    let dir = std::env::temp_dir().join(format!("trapctl-cover.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = run_until_applied(args, &program, &agent, &dir, &mut objects);
    let _ = std::fs::remove_dir_all(&dir);
    let outcome = result?;
    let exit = outcome.exit;
    let ended = format!("{} exited with status {exit}", args.command[0]);
    finish(args, &objects, &outcome, Vec::new(), &ended)?;
    if exit != 0 {
        let _ = std::io::stdout().flush();
        std::process::exit(exit);
    }
    Ok(())
}

/// Write the lcov file if asked, then the report (text or JSON) to --output or stdout; `ended`
/// is the text report's last words (how the coverage ended).
fn finish(
    args: &Args,
    objects: &[Object],
    outcome: &Outcome,
    mut notes: Vec<String>,
    ended: &str,
) -> Result<()> {
    let report = report(args, objects, outcome, &mut notes);
    if let Some(path) = &args.lcov {
        let covered: Vec<Covered<'_>> = objects
            .iter()
            .zip(&outcome.hits)
            .zip(&report.objects)
            .map(|((o, h), row)| Covered {
                path: &o.path,
                main: o.qualifier.is_none(),
                build_id: row.build_id.as_deref(),
                blocks: o
                    .blocks
                    .iter()
                    .zip(h)
                    .map(|(b, n)| (b.clone(), *n))
                    .collect(),
            })
            .collect();
        let how = ProgramLines {
            debuginfo: args.debuginfo.as_deref(),
            branches: args.mode == Mode::Count,
            strict: false,
        };
        let text = lcov_text(&covered, &how, &mut notes)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    emit(args, &Report { notes, ..report }, ended)
}

/// Print the report (text or JSON) to --output or stdout.
fn emit(args: &Args, report: &Report, ended: &str) -> Result<()> {
    let out = if args.json {
        serde_json::to_string_pretty(report)? + "\n"
    } else {
        render_text(report, ended)
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))?
        }
        None => crate::print(&out)?,
    }
    Ok(())
}

/// Hits per (object, block), `None` for a block without a site.
type Hits = Vec<Vec<Option<u64>>>;

/// What the agent's stats say of a run that applied the spec.
struct Outcome {
    exit: i32,
    hits: Hits,
    /// `once` mode: per (object, block), whether its site was removed while the program ran.
    disarmed: Option<Vec<Vec<bool>>>,
    /// `once` mode: how many batches removed hit sites.
    batches: Option<u64>,
}

/// Run the command until the agent applies the spec (each start it refuses, one block is marked
/// refused with its sentence), then read the stats.
fn run_until_applied(
    args: &Args,
    program: &Path,
    agent: &Path,
    dir: &Path,
    objects: &mut [Object],
) -> Result<Outcome> {
    for _ in 0..=MAX_RESTARTS {
        let (spec_text, order) = spec(objects);
        let run = run_once(args, program, agent, dir, &spec_text)?;
        if let Some(sentence) = run.refused {
            // `POINT: reason`: the point has no `: ` of its own.
            let point = sentence.split(": ").next().unwrap_or("");
            let found = order
                .iter()
                .find(|(i, j)| spec_point(&objects[*i], &objects[*i].blocks[*j]) == point);
            let Some(&(i, j)) = found else {
                bail!("the agent refused the coverage spec: {sentence}");
            };
            // A jmp the file's planner allowed can fail in the batch (its springboard's padding
            // taken by a neighbour's): a trap is tried next, then the block is refused.
            if objects[i].blocks[j].site == Ok(Mechanism::Jmp) {
                log::info!("{sentence}; trying a trap there");
                objects[i].blocks[j].site = Ok(Mechanism::Trap);
                continue;
            }
            objects[i].blocks[j].site = Err(BlockRefusal {
                kind: AGENT_REFUSED.into(),
                reason: sentence,
            });
            continue;
        }
        let Some(stats) = run.stats else {
            bail!(
                "{} exited with status {} without the agent's stats (killed by a signal, or ended by a raw exit_group): no coverage to report",
                args.command[0],
                run.exit
            );
        };
        let v: serde_json::Value = serde_json::from_str(&stats).context("the agent's stats")?;
        let splices = v["splices"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if splices.len() != order.len() {
            bail!(
                "the agent's stats list {} splices, the spec {}",
                splices.len(),
                order.len()
            );
        }
        // A library loaded later whose batch failed (all or nothing): the block its reason
        // names is handled as a refusal at start is, and the command run again; a reason that
        // names none refuses every block of the batch.
        let failed: Vec<(usize, &str)> = splices
            .iter()
            .enumerate()
            .filter(|(_, s)| s["state"] == "failed")
            .map(|(k, s)| (k, s["error"].as_str().unwrap_or("no reason given")))
            .collect();
        if let Some(&(_, reason)) = failed.first() {
            let named = order.iter().copied().find(|&(i, j)| {
                let point = spec_point(&objects[i], &objects[i].blocks[j]);
                reason.contains(&format!("{point}: "))
            });
            match named {
                Some((i, j)) if objects[i].blocks[j].site == Ok(Mechanism::Jmp) => {
                    log::info!("{reason}; trying a trap there");
                    objects[i].blocks[j].site = Ok(Mechanism::Trap);
                }
                Some((i, j)) => {
                    objects[i].blocks[j].site = Err(BlockRefusal {
                        kind: AGENT_REFUSED.into(),
                        reason: reason.to_string(),
                    });
                }
                None => {
                    for &(k, reason) in &failed {
                        let (i, j) = order[k];
                        objects[i].blocks[j].site = Err(BlockRefusal {
                            kind: AGENT_REFUSED.into(),
                            reason: format!("the library's batch failed: {reason}"),
                        });
                    }
                }
            }
            continue;
        }
        let mut hits: Hits = objects.iter().map(|o| vec![None; o.blocks.len()]).collect();
        let mut disarmed: Vec<Vec<bool>> = objects
            .iter()
            .map(|o| vec![false; o.blocks.len()])
            .collect();
        for ((i, j), s) in order.iter().zip(splices) {
            hits[*i][*j] = Some(s["hits"].as_u64().unwrap_or(0));
            disarmed[*i][*j] = s["state"] == "disarmed";
        }
        return Ok(Outcome {
            exit: run.exit,
            hits,
            disarmed: run.once.then_some(disarmed),
            batches: v["once_batches"].as_u64(),
        });
    }
    bail!("the agent refused {MAX_RESTARTS} blocks one after another; giving up")
}

fn report(args: &Args, objects: &[Object], outcome: &Outcome, _notes: &mut [String]) -> Report {
    let hits = &outcome.hits;
    let mut blocks = Vec::new();
    let paths: Vec<String> = objects
        .iter()
        .map(|o| o.path.display().to_string())
        .collect();
    let mut tally = Tally::default();
    for (k, ((o, h), object)) in objects.iter().zip(hits).zip(&paths).enumerate() {
        let home = Home {
            object: Some(object),
            module: None,
            qualifier: o.qualifier.as_deref(),
        };
        for (j, (b, hits)) in o.blocks.iter().zip(h).enumerate() {
            let hit = hits.is_some_and(|n| n > 0);
            tally.add(home, b, hit);
            let on = InProgram {
                object: object.clone(),
                mechanism: b.site.as_ref().ok().map(|m| {
                    match m {
                        Mechanism::Trap => "trap",
                        Mechanism::Jmp => "jmp",
                    }
                    .to_string()
                }),
                hits: *hits,
                disarmed: outcome.disarmed.as_ref().map(|d| d[k][j]),
            };
            blocks.push(BlockRow::of(b, hit, on));
        }
    }
    let table = tally.finish(objects.iter().map(|o| o.functions).sum());
    Report {
        schema: SCHEMA,
        command: args.command.clone(),
        program: paths[0].clone(),
        mode: match args.mode {
            Mode::Count => "count",
            Mode::Once => "once",
        }
        .into(),
        objects: objects
            .iter()
            .map(|o| ObjectRow {
                path: o.path.display().to_string(),
                build_id: debugfile::build_id_of(&o.path),
            })
            .collect(),
        exit: outcome.exit,
        disarm_batches: outcome.batches,
        total: table.total,
        functions: table.functions,
        blocks,
        notes: Vec::new(),
        refused: table.refused,
    }
}

/// One object's blocks for the lcov file: its path, whether it is the main program (whose
/// lines may come from --debuginfo), its build-id as the report recorded it, and every block
/// (file addresses) with its hits (`None`: no site).
struct Covered<'a> {
    path: &'a Path,
    main: bool,
    build_id: Option<&'a str>,
    blocks: Vec<(CoverBlock, Option<u64>)>,
}

/// How a program's lines are made: the debug file given for the main program, whether the
/// counts give branches (count mode), and `strict` ([`kernel::KernelLines`]).
struct ProgramLines<'a> {
    debuginfo: Option<&'a Path>,
    branches: bool,
    strict: bool,
}

/// The lcov file: source lines for each object with a line table (the main program's may come
/// from --debuginfo) that matches it (its build-id and functions), symbol+offset records for
/// the others, with a note saying why.
fn lcov_text(
    objects: &[Covered<'_>],
    how: &ProgramLines<'_>,
    notes: &mut Vec<String>,
) -> Result<String> {
    let mut out = String::new();
    for o in objects {
        let blocks: Vec<BlockHits<'_>> = o
            .blocks
            .iter()
            .map(|(block, hits)| BlockHits { block, hits: *hits })
            .collect();
        let given = how.debuginfo.filter(|_| o.main);
        let debug = given.unwrap_or(o.path);
        match object_lines(debug, o) {
            // Branch counts need every hit counted: not in once mode.
            Ok(lines) => out.push_str(&lcov_with("trapctl_cover", &blocks, &lines, how.branches)),
            Err(NoLines::Mismatch(why)) if how.strict => bail!("{why}"),
            Err(NoLines::Unavailable(why)) if how.strict && given.is_some() => bail!("{why}"),
            Err(no) => {
                let why = no.why();
                notes.push(format!(
                    "{}: symbol+offset records in the lcov file: {why}",
                    o.path.display()
                ));
                out.push_str(&symbol_records(&o.path.display().to_string(), why, &blocks));
            }
        }
    }
    Ok(out)
}

/// `o`'s line table from `debug`, once `debug` is found to match it: the build-id recorded
/// (when both are known), and every function of its blocks at its address, its extent holding
/// them.
fn object_lines(debug: &Path, o: &Covered<'_>) -> Result<LineTable, NoLines> {
    let lines =
        LineTable::read(debug).map_err(|e| NoLines::Unavailable(trapvec::error_chain(&e)))?;
    let file = DebugFile::read(debug)?;
    let what = o.path.display().to_string();
    file.check_build_id(o.build_id, &what)?;
    let mut functions: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for (b, _) in &o.blocks {
        let end = functions
            .entry((b.function.clone(), b.func_addr))
            .or_default();
        *end = (*end).max(b.end);
    }
    file.check_functions(&functions, &what)?;
    Ok(lines)
}

/// `--from-json`: the saved program report `r` (read from `path`) again, its lines made now
/// ([`saved`]).
fn from_saved(args: &Args, path: &Path, mut r: Report) -> Result<()> {
    let file = path.display();
    // The objects in the live run's order (the program first); a report without the list
    // gives them in the blocks' order.
    let mut objects = r.objects.clone();
    if objects.is_empty() {
        for o in std::iter::once(&r.program).chain(r.blocks.iter().map(|b| &b.on.object)) {
            if !objects.iter().any(|x| &x.path == o) {
                objects.push(ObjectRow {
                    path: o.clone(),
                    build_id: None,
                });
            }
        }
    }
    let qualifiers: Vec<Option<String>> = objects
        .iter()
        .map(|o| {
            (o.path != r.program).then(|| {
                Path::new(&o.path)
                    .file_name()
                    .map_or(o.path.clone(), |f| f.to_string_lossy().into_owned())
            })
        })
        .collect();
    let mut per: Vec<Vec<(CoverBlock, Option<u64>)>> = vec![Vec::new(); objects.len()];
    let mut tally = Tally::default();
    let mut blocks = Vec::with_capacity(r.blocks.len());
    for row in &r.blocks {
        let k = objects
            .iter()
            .position(|o| o.path == row.on.object)
            .with_context(|| {
                format!(
                    "{file}: block {}+{:#x} is of {}, which its `objects` does not list",
                    row.function, row.offset, row.on.object
                )
            })?;
        let mechanism = match row.on.mechanism.as_deref() {
            Some("jmp") => Mechanism::Jmp,
            _ => Mechanism::Trap,
        };
        let b = row
            .block(mechanism)
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        saved::check_hit(path, row, row.on.hits)?;
        per[k].push((b.clone(), row.on.hits));
        blocks.push((k, b));
    }
    for ((k, b), row) in blocks.iter().zip(&r.blocks) {
        let home = Home {
            object: Some(&objects[*k].path),
            module: None,
            qualifier: qualifiers[*k].as_deref(),
        };
        tally.add(home, b, row.hit);
    }
    r.refused = saved::table_again(
        path,
        tally,
        &mut r.functions,
        &r.total,
        &mut r.notes,
        &r.blocks,
        args.lcov.is_some(),
    )?;
    if let Some(lcov) = &args.lcov {
        let covered: Vec<Covered<'_>> = objects
            .iter()
            .zip(per)
            .map(|(o, blocks)| Covered {
                path: Path::new(&o.path),
                main: o.path == r.program,
                build_id: o.build_id.as_deref(),
                blocks,
            })
            .collect();
        let how = ProgramLines {
            debuginfo: args.debuginfo.as_deref(),
            branches: r.mode == "count",
            strict: true,
        };
        let mut notes = Vec::new();
        let text = lcov_text(&covered, &how, &mut notes)?;
        std::fs::write(lcov, text).with_context(|| format!("writing {}", lcov.display()))?;
        r.notes.extend(notes);
    }
    let ended = match r.command.first() {
        Some(c) => format!("{c} exited with status {}", r.exit),
        None => format!("a running process covered (saved in {file})"),
    };
    emit(args, &r, &ended)
}

fn render_text(r: &Report, ended: &str) -> String {
    table::render(&r.functions, &r.refused, &r.total, ended, &r.notes)
}
