//! `trapctl trace -e 'PROGRAM' [--allow-changes] [--json] --process -- COMMAND ARGS...`: a
//! bpftrace-shaped one-liner compiled by [`trapvec_script`] into a component and a spec, run
//! under the LD_PRELOAD agent (as `cover --process` runs a program).
//!
//! The maps are read back from a file: the compiled component has a handler spliced at the
//! entry of libc's `exit` that writes its whole data block there with plain system calls; this
//! command decodes it ([`trapvec_script::Layout::decode`]) after COMMAND ends. A program that
//! ends without `exit` (killed by a signal, `_exit`, `exec`) leaves no maps, which is said.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use instr_manager::glob::{is_glob, FunctionGlob};
use instr_manager::image::CodeImage;
use serde::Serialize;

/// The version of `--json`'s layout.
pub const SCHEMA: u32 = 1;

/// Where the dump handler goes: the entry of libc's `exit`.
const EXIT_POINT: &str = "libc.so.6:exit";

/// Run a tracing (and patching) program against a command.
#[derive(clap::Args)]
#[command(long_about = "\
Compile PROGRAM (a bpftrace-shaped language, see docs/trace.md) straight to x86-64 (no C
compiler, no LLVM), run COMMAND with its probes spliced in by the LD_PRELOAD agent, and print
the maps when COMMAND exits, as bpftrace prints them (`@name[key]: value`, histograms as bars),
then the updates a full map dropped and the memory reads that failed, per probe.

  trapctl trace --process -e 'compute { @calls = count(); @sum = sum(arg0) }' -- ./prog
  trapctl trace --process -e 'compute:return { @r = hist(retval) }' -- ./prog
  trapctl trace --process --allow-changes -e 'compute:return /arg0 == 3/ { retval = 0 }' -- ./prog

--process is required for now (the kernel backend is not implemented yet). Changes (`retval = E`
at a :return probe, `argN = E` or `reg(\"r\") = E` at an entry) need --allow-changes. Probes
may be globs over the program's own functions (`'parse_*'`); `lib:sym` names a library's
function. trapctl exits with COMMAND's exit status (128+N when a signal N killed it).")]
pub struct Args {
    /// The program text.
    #[arg(short = 'e', value_name = "PROGRAM", conflicts_with = "file")]
    pub expr: Option<String>,
    /// A file holding the program.
    #[arg(value_name = "FILE", required_unless_present = "expr")]
    pub file: Option<PathBuf>,
    /// Trace a command run under the agent (required for now).
    #[arg(long)]
    pub process: bool,
    /// Allow changes of return values, arguments and registers.
    #[arg(long)]
    pub allow_changes: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Slots per keyed map (a power of two); a full map counts dropped updates.
    #[arg(long, value_name = "N", default_value_t = trapvec_script::DEFAULT_SLOTS)]
    pub map_size: usize,
    /// The agent to preload [default: $TRAPVEC_AGENT, else found next to trapctl].
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// The command to run, and its arguments.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Serialize)]
struct Report<'a> {
    schema: u32,
    command: &'a [String],
    exit: i32,
    begin: Vec<String>,
    end: Vec<String>,
    #[serde(flatten)]
    results: &'a trapvec_script::Results,
}

/// `name` as the shell finds it: a path when it has a `/`, else the first match on `$PATH`.
fn find_command(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("`{name}` is not found on $PATH"))
}

/// The functions a probe's name stands for: itself, or for a glob the program's own functions
/// it matches.
fn expander(program: &Path) -> impl FnMut(Option<&str>, &str) -> Result<Vec<String>, String> + '_ {
    let mut image: Option<CodeImage> = None;
    move |object, name| {
        if !is_glob(name) {
            return Ok(vec![name.to_string()]);
        }
        if object.is_some() {
            return Err("globs over a library's functions are not supported yet".into());
        }
        let glob = FunctionGlob::new(name).map_err(|e| e.to_string())?;
        if image.is_none() {
            image = Some(
                CodeImage::from_path(program)
                    .map_err(|e| format!("{}: {}", program.display(), trapvec::error_chain(&e)))?,
            );
        }
        let image = image.as_ref().expect("just read");
        let mut names: Vec<String> = image
            .symbols
            .iter()
            .filter(|s| s.kind == trapvec::SymbolKind::Function && glob.matches(&s.name, None))
            .map(|s| s.name.clone())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
}

/// Run `trapctl trace`.
pub fn run(args: &Args) -> Result<()> {
    if !args.process {
        bail!("kernel tracing is not implemented yet: give --process and a command after `--`");
    }
    if args.command.is_empty() {
        bail!("no command to trace: give one after `--`");
    }
    let text = match (&args.expr, &args.file) {
        (Some(e), _) => e.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        (None, None) => bail!("give a program with -e 'PROGRAM' or a FILE"),
    };
    let program = find_command(&args.command[0])?;
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

fn trace(args: &Args, text: &str, program: &Path, agent: &Path, dir: &Path) -> Result<i32> {
    let dump = dir.join("maps.bin");
    let start = Instant::now();
    let compiled = trapvec_script::compile(
        text,
        &trapvec_script::Options {
            allow_changes: args.allow_changes,
            slots: args.map_size,
            dump_path: dump.display().to_string(),
        },
        &mut expander(program),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let object = dir.join("trace.o");
    let spec = dir.join("trace.toml");
    std::fs::write(&object, &compiled.object)
        .with_context(|| format!("writing {}", object.display()))?;
    std::fs::write(
        &spec,
        compiled.spec(&object.display().to_string(), EXIT_POINT),
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
    if !args.json {
        crate::print(&begin.concat())?;
        let _ = std::io::stdout().flush();
    }
    let super::under_agent::Ended { exit, refused } =
        super::under_agent::run(program, &args.command, agent, &spec, &[], false)?;
    if let Some(why) = refused {
        bail!(
            "the probes could not be spliced (nothing of {} ran): {why}",
            args.command[0]
        );
    }
    let data = std::fs::read(&dump).with_context(|| {
        format!(
            "{} exited with status {exit} without calling exit() (killed, _exit or exec): no maps to print",
            args.command[0]
        )
    })?;
    let results = compiled.layout.decode(&data, &compiled.strings)?;
    let end: Vec<String> = compiled
        .end
        .iter()
        .map(trapvec_script::format_printf)
        .collect();
    if args.json {
        let report = Report {
            schema: SCHEMA,
            command: &args.command,
            exit,
            begin,
            end,
            results: &results,
        };
        crate::print(&(serde_json::to_string_pretty(&report)? + "\n"))?;
    } else {
        crate::print(&(end.concat() + &trapvec_script::render(&results)))?;
    }
    Ok(exit)
}
