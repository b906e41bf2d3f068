//! `trapd`, the command: run the daemon ([`trapd::run`]) with a configuration and the socket and
//! journal the command line or the configuration name, or send requests to a running one.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use trapd::client;
use trapd::config::Config;

#[derive(Parser)]
#[command(
    name = "trapd",
    version,
    about = "trapvec's reconfiguration daemon: holds the kernel's splices, serves JSON requests on a Unix socket, journals every change, and switches profiles by rules over metrics",
    after_help = "Requests are one JSON object per line, e.g. {\"op\":\"list\"}; see trapd/README.md."
)]
struct Cli {
    /// Configuration (TOML: socket, journal, allowed groups, metrics, rules, profiles).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Unix socket to listen on (or to send to) [default: the config's, else $TRAPD_SOCKET, else /run/trapd.sock].
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Journal file [default: the config's, else /var/lib/trapd/journal].
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Serve Prometheus metrics (GET /metrics) on ADDR, e.g. 127.0.0.1:9464 [default: the config's `listen`, else none].
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Send requests to a running trapd and print its replies, one per line: each REQUEST
    /// argument is one line; without arguments, stdin is sent as it is. Exit status 0 when
    /// every reply is ok, 1 otherwise, 2 when no daemon could be reached.
    Send { requests: Vec<String> },
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell); hidden:
    /// the packages install the scripts (packaging/build-deb).
    #[command(hide = true)]
    Completions { shell: trapd::docs::Shell },
    /// Write trapd.1 and trapd-send.1 into DIR; hidden, as completions.
    #[command(hide = true)]
    Man { dir: PathBuf },
}

/// The man pages' EXAMPLES and EXIT STATUS.
const MAN: trapd::docs::ManExtras = trapd::docs::ManExtras {
    exit_status: &[
        (
            "0",
            "the daemon stopped cleanly (SIGTERM, SIGINT); for send: every reply was ok",
        ),
        (
            "1",
            "an error, named on stderr and in the journal; for send: a reply was not ok",
        ),
        (
            "2",
            "usage (a bad option or argument); for send: no daemon could be reached",
        ),
    ],
    examples: &[
        (
            "trapd",
            &[
                (
                    "trapd --config /etc/trapvec/trapd.toml",
                    "run the daemon as the package's systemd unit does",
                ),
                (
                    "trapd send '{\"op\":\"list\"}'",
                    "ask a running trapd for its live splices",
                ),
            ],
        ),
        (
            "trapd-send",
            &[(
                "trapd send '{\"op\":\"activate\",\"profile\":\"clamp\"}'",
                "switch to the profile named clamp",
            )],
        ),
    ],
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level)).init();
    let result = match &cli.command {
        Some(Command::Send { requests }) => send(&cli, requests),
        Some(Command::Completions { shell }) => {
            trapd::docs::completions(Cli::command(), "trapd", *shell, &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Man { dir }) => trapd::docs::man_pages(Cli::command(), dir, &MAN)
            .map(|_| ExitCode::SUCCESS)
            .map_err(Into::into),
        None => run(&cli).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| {
        let chain = trapvec::error_chain(e.as_ref());
        log::error!("{chain}");
        eprintln!("trapd: {chain}");
        ExitCode::FAILURE
    })
}

fn send(cli: &Cli, requests: &[String]) -> anyhow::Result<ExitCode> {
    let path = cli.socket.clone().unwrap_or_else(client::socket_path);
    let bytes = if requests.is_empty() {
        let mut b = Vec::new();
        std::io::stdin()
            .read_to_end(&mut b)
            .context("reading requests from stdin")?;
        b
    } else {
        requests
            .iter()
            .flat_map(|r| r.bytes().chain(std::iter::once(b'\n')))
            .collect()
    };
    let replies = match client::exchange(&path, &bytes) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("trapd: no daemon at {}: {e}", path.display());
            return Ok(ExitCode::from(2));
        }
    };
    let mut all_ok = true;
    for r in &replies {
        println!("{r}");
        all_ok &= serde_json::from_str::<serde_json::Value>(r)
            .is_ok_and(|v| v["ok"] == serde_json::Value::Bool(true));
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let mut config = match &cli.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if cli.listen.is_some() {
        config.listen = cli.listen;
    }
    let socket = cli
        .socket
        .clone()
        .or_else(|| config.socket.clone())
        .unwrap_or_else(client::socket_path);
    let journal = cli
        .journal
        .clone()
        .or_else(|| config.journal.clone())
        .unwrap_or_else(|| PathBuf::from("/var/lib/trapd/journal"));
    trapd::run(config, &socket, &journal)
}
