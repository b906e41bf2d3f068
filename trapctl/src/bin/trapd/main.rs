//! trapd: the embedded reconfiguration daemon of trapvec (the paper's MSS adaptation, KernInst's
//! kerninstd). It holds the kernel's instrumentation, serves requests on a Unix socket
//! ([`protocol`], [`server`]), journals every change ([`journal`]), and switches profiles when
//! metrics cross the thresholds of its rules ([`metrics`], [`rules`], [`config`]). [`daemon`]
//! owns the state and the order of effects; [`client`] is the other end of the socket.
//! `anyhow` is used here, at the edge only.

mod config;
mod daemon;
mod journal;
mod metrics;
mod rules;
mod server;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use trapctl::{client, protocol};
use clap::{Parser, Subcommand};
use trapvec::Target;

use config::Config;
use daemon::{Daemon, StateHome};
use protocol::Request;

#[derive(Parser)]
#[command(
    name = "trapd",
    version,
    about = "trapvec's reconfiguration daemon: holds the kernel's splices, serves JSON requests on a Unix socket, journals every change, and switches profiles by rules over metrics",
    after_help = "Requests are one JSON object per line, e.g. {\"op\":\"list\"}; see README.md, \"trapd: the reconfiguration daemon\"."
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
}

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
        None => run(&cli).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| {
        log::error!("{e:#}");
        eprintln!("trapd: {e:#}");
        ExitCode::FAILURE
    })
}

fn send(cli: &Cli, requests: &[String]) -> anyhow::Result<ExitCode> {
    let path = cli.socket.clone().unwrap_or_else(client::socket_path);
    let bytes = if requests.is_empty() {
        let mut b = Vec::new();
        std::io::stdin().read_to_end(&mut b).context("reading requests from stdin")?;
        b
    } else {
        requests.iter().flat_map(|r| r.bytes().chain(std::iter::once(b'\n'))).collect()
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
        all_ok &= serde_json::from_str::<serde_json::Value>(r).is_ok_and(|v| v["ok"] == serde_json::Value::Bool(true));
    }
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let config = match &cli.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let socket = cli.socket.clone().or_else(|| config.socket.clone()).unwrap_or_else(client::socket_path);
    let journal = cli.journal.clone().or_else(|| config.journal.clone()).unwrap_or_else(|| PathBuf::from("/var/lib/trapd/journal"));
    let access = server::Access::from_groups(&config.allow_groups).map_err(anyhow::Error::msg)?;
    let metric_list = config
        .metrics
        .iter()
        .map(|m| metrics::Metric::new(m.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<&str> = config.metrics.iter().map(|m| m.name.as_str()).collect();
    let profiles: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
    let engine = rules::Engine::new(config.rules.clone(), config.min_dwell(), &names, &profiles)?;
    let interval = config.interval();

    let target = trapvec::kernel::KernelTarget::open()?;
    // Held for the daemon's life: a trapctl going straight to the module waits for us.
    target.lock_exclusive()?;
    let listener = server::bind(&socket).with_context(|| format!("listening on {}", socket.display()))?;
    let daemon = Daemon::start(target, config, &journal)?;
    log::info!("listening on {} (journal {})", socket.display(), journal.display());
    let daemon = Arc::new(Mutex::new(daemon));
    if !engine.rules().is_empty() {
        let d = Arc::clone(&daemon);
        std::thread::spawn(move || rules_loop(&d, engine, metric_list, interval));
    }
    server::serve(listener, daemon, access);
    Ok(())
}

impl<T: Target + StateHome + Send + 'static> server::Handler for Daemon<T> {
    fn handle(&mut self, req: Request) -> serde_json::Value {
        Daemon::handle(self, req)
    }
}

/// Sample the metrics every `interval`, feed the rules, and switch profiles when one fires.
fn rules_loop<T: Target + StateHome>(daemon: &Mutex<Daemon<T>>, mut engine: rules::Engine, mut metric_list: Vec<metrics::Metric>, interval: std::time::Duration) {
    let mut failing: HashMap<String, String> = HashMap::new();
    // A switch that failed is not retried before this long (each try journals and logs).
    let retry_after = (interval * 10).max(std::time::Duration::from_secs(5));
    let mut failed_switch: Option<(String, std::time::Duration)> = None;
    loop {
        std::thread::sleep(interval);
        let now = server::lock(daemon).now();
        let mut values = HashMap::new();
        for m in &mut metric_list {
            match m.sample(now) {
                Ok(Some(v)) => {
                    failing.remove(m.name());
                    values.insert(m.name().to_string(), v);
                }
                Ok(None) => {}
                Err(e) => {
                    // Say it once per kind of failure, not every interval.
                    let msg = e.to_string();
                    if failing.get(m.name()) != Some(&msg) {
                        log::warn!("{msg}");
                        failing.insert(m.name().to_string(), msg);
                    }
                }
            }
        }
        let mut d = server::lock(daemon);
        d.metrics = values.iter().map(|(k, v)| (k.clone(), *v)).collect();
        log::debug!("metrics: {:?}", d.metrics);
        let Some(decision) = engine.observe(now, &values, d.profile(), d.switched_at()) else { continue };
        if let Some((p, at)) = &failed_switch {
            if *p == decision.profile && now.saturating_sub(*at) < retry_after {
                log::debug!("not retrying profile {p} yet: it failed {:?} ago", now.saturating_sub(*at));
                continue;
            }
        }
        let rule = &engine.rules()[decision.rule];
        let cause = format!(
            "rule {}: {} = {:.3} {} for {:.1} s",
            decision.rule,
            decision.metric,
            decision.value,
            rule.condition(),
            decision.held.as_secs_f64()
        );
        log::info!("switching to profile {}: {cause}", decision.profile);
        let reply = d.handle_with_cause(Request::Activate { profile: decision.profile.clone() }, &cause);
        if reply["ok"] == serde_json::Value::Bool(true) {
            failed_switch = None;
        } else {
            log::error!("switching to profile {} failed (next try in {retry_after:?} at the earliest): {}", decision.profile, reply["error"]);
            failed_switch = Some((decision.profile.clone(), now));
        }
    }
}
