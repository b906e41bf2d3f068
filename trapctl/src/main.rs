//! trapctl: the command-line tool of trapvec.
//!
//! One module per subcommand; each exposes `Args` (clap) and `run(args) -> anyhow::Result<()>`.
//! `anyhow` is used here, at the edge; the libraries below return typed errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod inspect;

#[derive(Parser)]
#[command(name = "trapctl", version, about = "Inspect and splice running code with trapvec", propagate_version = true)]
struct Cli {
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Inspect(inspect::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("trapctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
