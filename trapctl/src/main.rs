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

mod cmd;
mod hold;
mod inspect;
mod kernel;
mod route;

#[derive(Parser)]
#[command(
    name = "trapctl",
    version,
    about = "Inspect and splice running code with trapvec",
    propagate_version = true,
    after_help = "The kernel commands go through trapd when one listens on its socket (--socket, else \
$TRAPD_SOCKET, else /run/trapd.sock), and straight to /dev/trapvec otherwise; they print the same \
either way."
)]
struct Cli {
    /// trapd's socket [default: $TRAPD_SOCKET, else /run/trapd.sock].
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
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
    Read(cmd::read::Args),
    Status(cmd::profile::StatusArgs),
    Activate(cmd::profile::ActivateArgs),
    Doctor(cmd::doctor::Args),
    #[command(hide = true)]
    Cycle(cmd::cycle::Args),
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell); hidden:
    /// the packages install the scripts (packaging/build-deb).
    #[command(hide = true)]
    Completions {
        shell: trapvec_proto::docs::Shell,
    },
    /// Write trapctl.1 and a trapctl-COMMAND.1 per command into DIR; hidden, as completions.
    #[command(hide = true)]
    Man {
        dir: std::path::PathBuf,
    },
}

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
    let result = match cli.command {
        Command::Completions { shell } => {
            trapvec_proto::docs::completions(
                Cli::command(),
                "trapctl",
                shell,
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Man { dir } => trapvec_proto::docs::man_pages(Cli::command(), &dir)
            .map(|_| ())
            .map_err(Into::into),
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
        Command::Read(args) => cmd::read::run(&args),
        Command::Status(args) => cmd::profile::status(&args),
        Command::Activate(args) => cmd::profile::activate(&args),
        Command::Doctor(args) => cmd::doctor::run(&args),
        Command::Cycle(args) => cmd::cycle::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trapctl: {}", trapvec::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
