//! `trapctl trace -e 'PROGRAM' [--allow-changes] [--json] --process -- COMMAND ARGS...`: a
//! bpftrace-shaped one-liner compiled by [`trapvec_script`] into a component and a spec, run
//! under the LD_PRELOAD agent (as `cover --process` runs a program). Without `--process` the
//! program is compiled for the running kernel and applied through trapvec.ko ([`kernel`]).
//!
//! A process's maps are read back from a file: the compiled component has a handler spliced at the
//! entry of libc's `exit` that writes its whole data block there with plain system calls; this
//! command decodes it ([`trapvec_script::Layout::decode`]) after COMMAND ends. A program that
//! ends without `exit` (killed by a signal, `_exit`, `exec`) leaves no maps, which is said.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// Move `sp`, an entry probe of a function that also has a `:return` probe (whose splice takes
/// the entry), to the first instruction after that splice's window of `window` bytes from
/// `start` in `code`, the function's code at `addr` ([`trapvec_script::after_window`]); the
/// kernel and a process differ only in where the code is read.
fn past_return_site(
    sp: &mut trapvec_script::Splice,
    code: &[u8],
    addr: u64,
    start: usize,
    window: usize,
) -> Result<()> {
    let at = trapvec_script::after_window(code, addr, start, window).with_context(|| {
        format!(
            "probe {}: it cannot run beside {}:return (whose splice takes the entry)",
            sp.at, sp.at
        )
    })?;
    log::debug!(
        "probe {}: at +{at:#x}, after the return point's site at +{start:#x}",
        sp.at
    );
    sp.at = format!("{}+{at:#x}", sp.at);
    Ok(())
}

mod attached;
mod functions;
mod kernel;
mod poll;

/// The version of `--json`'s layout.
pub const SCHEMA: u32 = 1;

/// Where the dump handler goes: the entry of libc's `exit`.
const EXIT_POINT: &str = "libc.so.6:exit";

/// Run a tracing (and patching) program against a command.
#[derive(clap::Args)]
#[command(long_about = "\
Compile PROGRAM (a bpftrace-shaped language, see docs/trace.md) straight to x86-64 (no C
compiler, no LLVM) and print the maps at the end, as bpftrace prints them (`@name[key]: value`,
histograms as bars), then the updates a full map dropped and the memory reads that failed, per
probe.

Without --process the probes are kernel functions: the program is loaded into trapvec.ko's
repository with one trap splice per probe, for --seconds N, until SIGINT (Ctrl-C), SIGTERM or
SIGHUP, or while `-- COMMAND ARGS` runs (the whole kernel is traced, not only COMMAND); then
the maps are read out of the kernel, everything is removed and the maps printed. A signal ends
trapctl by that signal after the maps are printed (as `trapctl count`); with COMMAND trapctl
exits with its status. `tracing N probe(s) ...` is printed once the probes are live.

  trapctl trace -e '__x64_sys_getppid { @[comm] = count() }' --seconds 5
  trapctl trace -e 'vfs_read:return { @r = hist(retval) }' -- ls -R /usr

With --process, COMMAND runs with its probes spliced in by the LD_PRELOAD agent, and the maps
are printed when it exits, or after --seconds N: then the probes are removed, the maps read out
of COMMAND's memory through its agent, and COMMAND is killed (SIGKILL; trapctl exits 0).

With -p PID (trapctl -p PID trace -e PROGRAM), the probes are spliced into the running process
by its agent (attaching first, as `trapctl -p PID attach`), for --seconds N, until SIGINT,
SIGTERM or SIGHUP, or until the process exits; then they are removed, the maps read out of the
process's memory and printed, the component unloaded and, if this command attached, the
agent's channel stopped: the process goes on, its text as it was. Globs expand over the
process's executable, `LIB:GLOB` over the library the process has mapped as LIB.

  trapctl trace --process -e 'compute { @calls = count(); @sum = sum(arg0) }' -- ./prog
  trapctl trace --process -e 'compute:return { @r = hist(retval) }' -- ./prog
  trapctl trace --process --allow-changes -e 'compute:return /arg0 == 3/ { retval = 0 }' -- ./prog

A probe's printf lines are printed as they come (trapctl reads the program's data every 50 ms;
lines a full ring overwrote are counted and said at the end), exit() in a probe or an
interval ends the trace as Ctrl-C does, and interval:s:N / interval:ms:N probes run in trapctl
(print(@m), clear(@m), printf, exit()).

  trapctl trace -e 'vfs_read { @[comm] = count() } interval:s:1 { print(@); clear(@) }'

The language in short: a probe is `SPEC[, SPEC...] [/PREDICATE/] { STATEMENTS }`, SPEC being
FUNC, FUNC+OFF, FUNC:return, a glob, BEGIN, END or interval:s:N; statements are map updates
(`@m[k1, k2] = count()`, sum, avg, min, max, hist, lhist, or a value), `$var = E`, printf,
delete, clear, print (in intervals), exit(), and in function probes
`if (E) { ... } else if (E) { ... } else { ... }` (one branch per hit); builtins include pid,
tid, comm, nsecs, cpu, argN, retval, probe and str(E).

Changes need --allow-changes: `retval = E` at a :return probe, `argN = E` or `reg(\"r\") = E`
at an entry, and `return E`, the last statement of an entry probe at offset 0 (not inside an
if): the function is skipped and its caller gets E; under a predicate, the calls it does not
select run the function as usual.

  trapctl trace --allow-changes -e 'ksys_lseek /comm == \"lseeks\"/ { return 5 }' --seconds 5

Probes may be globs (a process's own functions, a library's with
`lib:GLOB`, or the kernel's functions in kallsyms); `lib:sym` names a library's function. A
function may have an entry probe and a :return probe in one program. trapctl exits with COMMAND's exit status
(128+N when a signal N killed it).")]
pub struct Args {
    /// The program text.
    #[arg(short = 'e', value_name = "PROGRAM", conflicts_with = "file")]
    pub expr: Option<String>,
    /// A file holding the program.
    #[arg(value_name = "FILE", required_unless_present = "expr")]
    pub file: Option<PathBuf>,
    /// Trace a command run under the agent (without it: the kernel).
    #[arg(long)]
    pub process: bool,
    /// Trace for N seconds [default: until SIGINT, SIGTERM or SIGHUP, or while COMMAND runs;
    /// with --process: until COMMAND exits]. With --process and COMMAND: the maps are printed
    /// after N seconds and COMMAND is killed (SIGKILL), unless it exits before; with -p PID:
    /// the process goes on, untouched.
    #[arg(long, value_name = "N", value_parser = parse_seconds)]
    pub seconds: Option<f64>,
    /// Allow changes of return values, arguments and registers.
    #[arg(long)]
    pub allow_changes: bool,
    /// How every probe is spliced: trap (int 0xF5, 2 bytes, at any instruction) or jmp (5
    /// bytes, where the instructions there allow one). A probe whose site cannot take a jmp is
    /// refused, named, and nothing is spliced.
    #[arg(long, default_value = "trap", value_parser = crate::cmd::splice::listed::<instr_manager::Mechanism>(crate::cmd::splice::MECHANISMS))]
    pub mechanism: instr_manager::Mechanism,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Slots per keyed map (a power of two); a full map counts dropped updates [default: 4096,
    /// kernel: 1024].
    #[arg(long, value_name = "N")]
    pub map_size: Option<usize>,
    /// The agent to preload [default: $TRAPVEC_AGENT, else found next to trapctl].
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// The command to run, and its arguments.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// A `--seconds` that is no duration.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not a duration in seconds (a finite, non-negative number)")]
pub struct SecondsError(String);

fn parse_seconds(text: &str) -> Result<f64, SecondsError> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(SecondsError(text.to_string())),
    }
}

#[derive(Serialize)]
struct Report<'a> {
    schema: u32,
    command: &'a [String],
    exit: i32,
    begin: Vec<String>,
    end: Vec<String>,
    /// What the probes' printf and the intervals printed, in order.
    printed: &'a [String],
    /// printf records overwritten in the ring before trapctl read them.
    printf_lost: u64,
    #[serde(flatten)]
    results: &'a trapvec_script::Results,
}

/// The maps and END's lines, as text (END's lines, then the maps) or as one JSON object with
/// BEGIN's lines too: how a trace ends, on a process or on the kernel.
/// (The probes' lines, `printed`, were printed as they came; in text only the lost count is
/// said, last.)
fn print_report(
    args: &Args,
    exit: i32,
    begin: Vec<String>,
    end: Vec<String>,
    results: &trapvec_script::Results,
    printed: &[String],
    lost: u64,
) -> Result<()> {
    if args.json {
        let report = Report {
            schema: SCHEMA,
            command: &args.command,
            exit,
            begin,
            end,
            printed,
            printf_lost: lost,
            results,
        };
        crate::print(&(serde_json::to_string_pretty(&report)? + "\n"))
    } else {
        let mut text = end.concat() + &trapvec_script::render(results);
        if lost > 0 {
            text += &format!(
                "{lost} printf line(s) lost: the ring's {} records were overwritten before trapctl read them\n",
                trapvec_script::layout::RING_RECORDS
            );
        }
        crate::print(&text)
    }
}

/// The program's text, from -e or FILE.
fn program_text(args: &Args) -> Result<String> {
    Ok(match (&args.expr, &args.file) {
        (Some(e), _) => e.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => bail!("give a program with -e 'PROGRAM' or a FILE"),
    })
}

/// Run `trapctl -p PID trace` ([`attached::run`]).
pub fn on_process(pid: i32, args: &Args, verbose: bool) -> Result<()> {
    attached::run(pid, args, &program_text(args)?, verbose)
}

/// Run `trapctl trace`.
pub fn run(args: &Args) -> Result<()> {
    let text = program_text(args)?;
    if !args.process {
        if args.seconds.is_some() && !args.command.is_empty() {
            bail!("give --seconds N or `-- COMMAND`, not both (a kernel trace lasts as long as one of them)");
        }
        return kernel::run(args, &text);
    }
    if args.command.is_empty() {
        bail!("no command to trace: give one after `--`");
    }
    let program = super::under_agent::find_command(&args.command[0])?;
    let agent = super::cover::find_agent(args.agent.as_deref())?;
    let dir = std::env::temp_dir().join(format!("trapctl-trace.{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = trace(args, &text, &program, &agent, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let exit = result?;
    if exit != 0 {
        let _ = std::io::stdout().flush();
        std::process::exit(exit);
    }
    Ok(())
}

/// A program compiled for a process and written out: the component, the spec that loads it
/// (its probes and the dump handler at `exit`), and where the dump goes.
pub struct Prepared {
    pub compiled: trapvec_script::Compiled,
    /// The component's file (its stem names the component in the process).
    pub object: PathBuf,
    pub spec: PathBuf,
    /// Where the dump handler writes the maps when the program calls `exit`.
    pub dump: PathBuf,
    /// BEGIN's lines.
    pub begin: Vec<String>,
}

/// Compile `text` for a process running `program` (process `pid` when it runs already; its
/// globs expanded over `program`'s functions or a library's, [`functions`]) into files in
/// `dir`. The component is named `trace_PID` after this trapctl, so that it does not meet
/// another trace's in a process.
fn prepare(
    args: &Args,
    text: &str,
    program: &Path,
    pid: Option<i32>,
    dir: &Path,
) -> Result<Prepared> {
    let dump = dir.join("maps.bin");
    let start = Instant::now();
    let mut functions = functions::Functions::new(program, pid);
    let mut compiled = trapvec_script::compile(
        text,
        &trapvec_script::Options {
            allow_changes: args.allow_changes,
            slots: args.map_size.unwrap_or(trapvec_script::DEFAULT_SLOTS),
            dump_path: dump.display().to_string(),
            kernel: None,
        },
        &mut |object, name| functions.expand(object, name),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let window = match args.mechanism {
        instr_manager::Mechanism::Trap => instr_manager::plan::TRAP_LEN,
        instr_manager::Mechanism::Jmp => instr_manager::plan::JMP_REL32_LEN,
    };
    functions.place_beside_returns(&mut compiled, window)?;
    let object = dir.join(format!("trace_{}.o", std::process::id()));
    let spec = dir.join("trace.toml");
    std::fs::write(&object, &compiled.object)
        .with_context(|| format!("writing {}", object.display()))?;
    std::fs::write(
        &spec,
        compiled.spec_by(
            &object.display().to_string(),
            EXIT_POINT,
            &args.mechanism.to_string(),
        ),
    )
    .with_context(|| format!("writing {}", spec.display()))?;
    log::info!(
        "compiled {} probe(s) into {} bytes of component and {} bytes of maps in {:.3} ms",
        compiled.splices.len(),
        compiled.object.len(),
        compiled.layout.size,
        start.elapsed().as_secs_f64() * 1e3
    );
    let begin: Vec<String> = compiled
        .begin
        .iter()
        .map(trapvec_script::format_printf)
        .collect();
    Ok(Prepared {
        compiled,
        object,
        spec,
        dump,
        begin,
    })
}

fn trace(args: &Args, text: &str, program: &Path, agent: &Path, dir: &Path) -> Result<i32> {
    let prepared = prepare(args, text, program, None, dir)?;
    let Prepared {
        compiled,
        dump,
        begin,
        spec,
        ..
    } = &prepared;
    if !args.json {
        crate::print(&begin.concat())?;
        let _ = std::io::stdout().flush();
    }
    let control = Path::new("1");
    let polls = compiled.polls();
    let live_reads = args.seconds.is_some() || polls;
    // The agent serves its control channel: the maps are read through it while it runs
    // (printf, intervals, exit()) or after N seconds.
    let env: &[(&str, &Path)] = if live_reads {
        &[("TRAPVEC_CONTROL", control)]
    } else {
        &[]
    };
    let mut running = super::under_agent::spawn(program, &args.command, agent, spec, env, false)?;
    let mut poller = poll::Poller::new(compiled, args.json, Instant::now());
    let read = if live_reads {
        attached::read_then_kill(running.child(), &prepared, args.seconds, &mut poller)
    } else {
        Ok(None)
    };
    let super::under_agent::Ended { exit, refused } = running.wait()?;
    if let Some(why) = refused {
        bail!(
            "the probes could not be spliced (nothing of {} ran): {why}",
            args.command[0]
        );
    }
    // Killed by trapctl when the time was up: that is how the trace ends, not a failure.
    let (data, exit) = match read? {
        Some(data) => (data, 0),
        None => (std::fs::read(dump).with_context(|| {
            format!(
                "{} exited with status {exit} without calling exit() (killed, _exit or exec): no maps to print",
                args.command[0]
            )
        })?, exit),
    };
    let results = poller.finish(&data)?;
    let end: Vec<String> = compiled
        .end
        .iter()
        .map(trapvec_script::format_printf)
        .collect();
    print_report(
        args,
        exit,
        begin.clone(),
        end,
        &results,
        &poller.printed,
        poller.lost(),
    )?;
    Ok(exit)
}
