//! trapd: the embedded reconfiguration daemon of trapvec (the paper's MSS adaptation, KernInst's
//! kerninstd), as a library the `trapd` binary runs. It holds the kernel's instrumentation,
//! serves requests on a Unix socket ([`protocol`], [`server`]), journals every change
//! ([`journal`]), and switches profiles when metrics cross the thresholds of its rules
//! ([`metrics`], [`rules`], [`config`]); [`prometheus`] serves what it holds to Prometheus when
//! the configuration says where. [`daemon`] owns the state and the order of effects; [`run`]
//! puts them together. What a request does is `instr_manager::ops`, the operations `trapctl`
//! also runs. What `trapctl` shares with the daemon (the [`protocol`], the [`client`], the
//! [`exposition`], the [`docs`], the socket [`server`]) is the `trapvec-proto` crate's,
//! re-exported here.

pub mod config;
pub mod daemon;
pub mod journal;
#[cfg(test)]
mod latency_tests;
pub mod metrics;
pub mod pending;
pub mod prometheus;
pub mod rules;
mod startup;
#[cfg(test)]
mod tests;

pub use trapvec_proto::{client, docs, exposition, protocol, server};

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use trapvec::Target;

use config::Config;
use daemon::{Daemon, StateHome};
use protocol::Request;

/// Serve the kernel's splices on `socket` with `config`, journalling to `journal`, until the
/// process ends: open the module (held exclusively for the daemon's life), replay the journal,
/// start the rules thread when there are rules, and answer requests. Errors before serving
/// name what could not be set up.
pub fn run(config: Config, socket: &Path, journal: &Path) -> anyhow::Result<()> {
    let access = server::Access::from_groups(&config.allow_groups)?;
    let metric_list = config
        .metrics
        .iter()
        .map(|m| metrics::Metric::new(m.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<&str> = config.metrics.iter().map(|m| m.name.as_str()).collect();
    let profiles: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
    let engine = rules::Engine::new(config.rules.clone(), config.min_dwell(), &names, &profiles)?;
    let interval = config.interval();
    let listen = config.listen;

    let target = trapvec::kernel::KernelTarget::open()?;
    // Held for the daemon's life: a trapctl going straight to the module waits for us.
    target.lock_exclusive()?;
    let listener =
        server::bind(socket).with_context(|| format!("listening on {}", socket.display()))?;
    let metrics_listener =
        match listen {
            Some(addr) => Some(prometheus::bind(addr).with_context(|| {
                format!("listening for Prometheus scrapes on {addr} (`listen`)")
            })?),
            None => None,
        };
    let daemon = Daemon::start(target, config, journal)?;
    log::info!(
        "listening on {} (journal {})",
        socket.display(),
        journal.display()
    );
    let daemon = Arc::new(Mutex::new(daemon));
    if !engine.rules().is_empty() {
        let d = Arc::clone(&daemon);
        std::thread::spawn(move || rules_loop(&d, engine, metric_list, interval));
    }
    let counts = Arc::new(server::RequestCounts::default());
    if let Some(l) = metrics_listener {
        log::info!(
            "serving Prometheus metrics on http://{}/metrics",
            l.local_addr()
                .map_or_else(|_| "?".into(), |a| a.to_string())
        );
        let (d, c) = (Arc::clone(&daemon), Arc::clone(&counts));
        std::thread::spawn(move || prometheus::serve(&l, &d, &c));
    }
    {
        let d = Arc::clone(&daemon);
        std::thread::spawn(move || pending::watch_loop(&d));
    }
    server::serve(listener, daemon, access, counts);
    Ok(())
}

impl<T: Target + StateHome + Send + 'static> server::Handler for Daemon<T> {
    fn handle(&mut self, req: Request) -> serde_json::Value {
        Daemon::handle(self, req)
    }
}

/// Sample the metrics every `interval`, feed the rules, and switch profiles when one fires.
fn rules_loop<T: Target + StateHome>(
    daemon: &Mutex<Daemon<T>>,
    mut engine: rules::Engine,
    mut metric_list: Vec<metrics::Metric>,
    interval: std::time::Duration,
) {
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
                    let msg = trapvec::error_chain(&e);
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
        let Some(decision) = engine.observe(now, &values, d.profile(), d.switched_at()) else {
            continue;
        };
        if let Some((p, at)) = &failed_switch {
            if *p == decision.profile && now.saturating_sub(*at) < retry_after {
                log::debug!(
                    "not retrying profile {p} yet: it failed {:?} ago",
                    now.saturating_sub(*at)
                );
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
        let request = Request::Activate {
            profile: decision.profile.clone(),
        };
        match d.answer(request, &cause) {
            Ok(_) => failed_switch = None,
            Err(error) => {
                log::error!(
                    "switching to profile {} failed (next try in {retry_after:?} at the earliest): {:?}",
                    decision.profile,
                    error
                );
                failed_switch = Some((decision.profile.clone(), now));
            }
        }
    }
}
