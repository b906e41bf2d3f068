//! trapctl: the command-line tool of trapvec.
//!
//! One module per subcommand (or group, under [`cmd`]); each exposes clap `Args` and
//! `run(args) -> anyhow::Result<()>`. `anyhow` is used here, at the edge; the libraries below
//! return typed errors. Every failure ends in one line on stderr, `trapctl: <what>: <why>`, and
//! exit status 1.
//!
//! The commands that act on the running kernel go through trapd when one is listening, else
//! through [`kernel::Kernel`]: `/dev/trapvec` locked for the command, the state of earlier
//! commands restored from the module (and checked against it), saved back after a change
//! ([`route`] decides; both ways run the same operation of [`instr_manager::ops`]).

// The operations' errors (instr_manager::ops::OpError) carry the splicer's errors whole; each is made
// at most once per command.
#![allow(clippy::result_large_err)]

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod attach;
// `trapctl -p PID VERB`: declared here, beside the -p option it serves.
#[path = "cmd/attach.rs"]
mod attach_cmd;
mod cmd;
mod hold;
mod inspect;
mod kernel;
mod man5;
mod route;

#[derive(Parser)]
#[command(
    name = "trapctl",
    version,
    about = "Inspect and splice running code with trapvec",
    propagate_version = true,
    after_help = "The kernel commands go through trapd when one listens on its socket (--socket, else \
$TRAPD_SOCKET, else /run/trapd.sock), and straight to /dev/trapvec otherwise; they print the same \
either way.

Exit status: 0 done; 1 an error (named on stderr; nothing was changed); 2 usage (a bad option or \
argument); 3 partly applied (`apply --best-effort` with refusals: the rest stays applied). `cover` \
exits with its command's status; a program run under the agent exits 86 when its spec cannot be \
applied."
)]
struct Cli {
    /// trapd's socket [default: $TRAPD_SOCKET, else /run/trapd.sock].
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Act on the running process PID (before the command: `trapctl -p PID apply SPEC`):
    /// attach, apply, splice, count, list, unsplice, detach; the first attaches (docs/process.md).
    #[arg(short = 'p', long = "process", value_name = "PID")]
    process: Option<i32>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Inspect(inspect::Args),
    Points(cmd::points::Args),
    Load(cmd::component::LoadArgs),
    Unload(cmd::component::UnloadArgs),
    Splice(cmd::splice::SpliceArgs),
    Unsplice(cmd::splice::UnspliceArgs),
    Apply(cmd::apply::ApplyArgs),
    List(cmd::list::Args),
    Set(cmd::var::SetArgs),
    Get(cmd::var::GetArgs),
    Count(cmd::count::Args),
    Cover(cmd::cover::Args),
    Time(cmd::time::Args),
    Trace(cmd::trace::Args),
    Read(cmd::read::Args),
    Status(cmd::profile::StatusArgs),
    Activate(cmd::profile::ActivateArgs),
    Require(cmd::profile::RequireArgs),
    Doctor(cmd::doctor::Args),
    Attach(attach_cmd::AttachArgs),
    Detach(attach_cmd::DetachArgs),
    #[command(hide = true)]
    Cycle(cmd::cycle::Args),
    /// Print the completion script for SHELL (the packages install them; from a checkout:
    /// `trapctl completions bash > /etc/bash_completion.d/trapctl`).
    Completions {
        #[arg(value_enum)]
        shell: trapvec_proto::docs::Shell,
    },
    /// Write trapctl.1 and a trapctl-COMMAND.1 per command, with EXAMPLES and EXIT STATUS,
    /// and the man(5) pages trapvec-spec.5, trapd.toml.5 and trapvec-agent.5 into DIR (then
    /// `man -l DIR/trapctl.1`).
    Man {
        dir: std::path::PathBuf,
    },
}

/// A command that changed part of what it was asked and left the rest, by request
/// (`apply --best-effort`): exit status 3, so that a script can tell it from a failure (1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PartlyApplied(pub String);

impl PartlyApplied {
    const STATUS: u8 = 3;
}

/// The man pages' EXIT STATUS and EXAMPLES.
const MAN: trapvec_proto::docs::ManExtras = trapvec_proto::docs::ManExtras {
    exit_status: &[
        ("0", "done"),
        ("1", "an error, named on stderr with its culprit; nothing was changed"),
        ("2", "usage: a bad option or argument"),
        ("3", "partly applied: apply --best-effort refused some splices and applied the rest"),
        ("86", "(a program run under the agent) its spec could not be applied; main never ran"),
    ],
    examples: &[
        (
            "trapctl",
            &[
                ("trapctl doctor", "what this machine allows, each missing piece with its fix"),
                ("trapctl count tcp_sync_mss --seconds 10", "how often the kernel calls tcp_sync_mss"),
                ("trapctl points 'tcp_*' --summary", "how many tcp_ functions can take a trap or a jmp, and why not the rest"),
            ],
        ),
        ("trapctl-doctor", &[("trapctl doctor --json", "the same checks as one JSON object")]),
        ("trapctl-require", &[("trapctl require tv_modcalls", "refuse tv_modcalls's load if one of trapd's pending points in it cannot be made")]),
        (
            "trapctl-points",
            &[
                ("trapctl points 'tcp_v4_*'", "each tcp_v4_ function of the running kernel: trap, jmp, springboard, or why not"),
                ("trapctl points --blocks --process /usr/bin/python3 'Py*Call*'", "the basic blocks of python3's Py*Call* functions"),
            ],
        ),
        (
            "trapctl-count",
            &[
                ("trapctl count tcp_sync_mss --seconds 10", "count calls for ten seconds"),
                ("trapctl count tcp_v4_connect -- curl -s http://127.0.0.1/", "count calls while a command runs"),
            ],
        ),
        ("trapctl-time", &[("trapctl time do_sys_openat2 --seconds 5", "a latency histogram of openat(2) for five seconds")]),
        (
            "trapctl-splice",
            &[
                ("trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss", "replace the function with a loaded component's"),
                ("trapctl splice tcp_sync_mss --count --mechanism jmp", "count calls by a jmp splice until unspliced"),
            ],
        ),
        ("trapctl-unsplice", &[("trapctl unsplice tcp_sync_mss", "remove the splice at tcp_sync_mss")]),
        ("trapctl-load", &[("trapctl load components/mss_clamp.o", "load a component into the kernel's repository")]),
        (
            "trapctl-apply",
            &[
                ("trapctl apply --check spec.toml", "plan and check every splice of the spec, change nothing"),
                ("trapctl apply --best-effort spec.toml", "apply what validates; exit status 3 if anything was refused"),
            ],
        ),
        ("trapctl-list", &[("trapctl list --json", "live splices and loaded components with their hits")]),
        (
            "trapctl-attach",
            &[
                ("trapctl -v -p 4242 attach", "load the agent into process 4242; print how long its threads were held"),
                ("trapctl -p 4242 apply spec.toml", "apply a spec to the running process (attaching first if needed)"),
                ("trapctl -p 4242 list --json", "its splices with their live hits"),
            ],
        ),
        ("trapctl-detach", &[("trapctl -p 4242 detach", "remove every splice from process 4242, stop its agent's channel")]),
        (
            "trapctl-cover",
            &[("trapctl cover --process 'prog:*' --lcov prog.info -- ./prog", "basic-block coverage of prog's functions while it runs, as lcov")],
        ),
    ],
};

/// Write a command's whole output to stdout; a reader that went away (`trapctl ... | head`) is
/// no error.
pub(crate) fn print(out: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to stdout")
        }
        _ => Ok(()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    route::set_socket(cli.socket);
    let result = match (cli.process, cli.command) {
        (Some(pid), command) => on_process(pid, command, cli.verbose > 0),
        (None, Command::Attach(_) | Command::Detach(_)) => Err(anyhow::anyhow!(
            "attach and detach act on a running process: give it first, `trapctl -p PID attach`"
        )),
        (None, command) => on_kernel(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trapctl: {}", trapvec::error_chain(e.as_ref()));
            if e.downcast_ref::<PartlyApplied>().is_some() {
                ExitCode::from(PartlyApplied::STATUS)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `trapctl -p PID VERB`: the verbs that act on a running process, through its agent.
fn on_process(pid: i32, command: Command, verbose: bool) -> anyhow::Result<()> {
    match command {
        Command::Attach(args) => attach_cmd::attach(pid, &args, verbose),
        Command::Detach(args) => attach_cmd::detach(pid, &args),
        Command::Apply(args) => attach_cmd::apply(pid, &args, verbose),
        Command::List(args) => attach_cmd::list(pid, args.json, verbose),
        Command::Unsplice(args) => attach_cmd::unsplice(pid, args.at.as_deref(), args.all, verbose),
        Command::Inspect(_) => attach_cmd::unsupported(pid, "inspect"),
        Command::Points(_) => attach_cmd::unsupported(pid, "points"),
        Command::Load(_) => attach_cmd::unsupported(pid, "load"),
        Command::Unload(_) => attach_cmd::unsupported(pid, "unload"),
        Command::Splice(args) => attach_cmd::splice(pid, &args, verbose),
        Command::Set(_) => attach_cmd::unsupported(pid, "set"),
        Command::Get(_) => attach_cmd::unsupported(pid, "get"),
        Command::Count(args) => attach_cmd::count(pid, &args, verbose),
        Command::Cover(args) => attach_cmd::cover(pid, &args, verbose),
        Command::Time(args) => attach_cmd::time(pid, &args, verbose),
        Command::Trace(args) => attach_cmd::trace(pid, &args, verbose),
        Command::Read(_) => attach_cmd::unsupported(pid, "read"),
        Command::Status(_) => attach_cmd::unsupported(pid, "status"),
        Command::Activate(_) => attach_cmd::unsupported(pid, "activate"),
        Command::Require(_) => attach_cmd::unsupported(pid, "require"),
        Command::Doctor(_) => attach_cmd::unsupported(pid, "doctor"),
        Command::Cycle(_) => attach_cmd::unsupported(pid, "cycle"),
        Command::Completions { .. } | Command::Man { .. } => on_kernel(command),
    }
}

/// The commands without -p.
fn on_kernel(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Completions { shell } => {
            trapvec_proto::docs::completions(
                Cli::command(),
                "trapctl",
                shell,
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Man { dir } => {
            trapvec_proto::docs::man_pages(Cli::command(), &dir, &MAN)?;
            man5::write(&dir)
                .map_err(|e| anyhow::anyhow!("writing man(5) pages to {}: {e}", dir.display()))?;
            Ok(())
        }
        Command::Inspect(args) => inspect::run(&args),
        Command::Points(args) => cmd::points::run(&args),
        Command::Load(args) => cmd::component::load(&args),
        Command::Unload(args) => cmd::component::unload(&args),
        Command::Splice(args) => cmd::splice::splice(&args),
        Command::Unsplice(args) => cmd::splice::unsplice(&args),
        Command::Apply(args) => cmd::apply::run(&args),
        Command::List(args) => cmd::list::run(&args),
        Command::Set(args) => cmd::var::set(&args),
        Command::Get(args) => cmd::var::get(&args),
        Command::Count(args) => cmd::count::run(&args),
        Command::Cover(args) => cmd::cover::run(&args),
        Command::Time(args) => cmd::time::run(&args),
        Command::Trace(args) => cmd::trace::run(&args),
        Command::Read(args) => cmd::read::run(&args),
        Command::Status(args) => cmd::profile::status(&args),
        Command::Activate(args) => cmd::profile::activate(&args),
        Command::Require(args) => cmd::profile::require(&args),
        Command::Doctor(args) => cmd::doctor::run(&args),
        Command::Cycle(args) => cmd::cycle::run(&args),
        Command::Attach(_) | Command::Detach(_) => {
            anyhow::bail!("attach and detach need -p PID")
        }
    }
}
