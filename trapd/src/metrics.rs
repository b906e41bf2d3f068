//! Metric sources: counters of `/proc/net/snmp` and numbers in plain files, sampled once per
//! interval by the daemon's rules loop.
//!
//! `source = "snmp"` reads a counter named `Proto:Field` (`Tcp:RetransSegs`); per interval it
//! yields the counter's increase per second, or, with `per = "Tcp:OutSegs"`, the increase as a
//! percentage of the other counter's increase (the retransmission rate). An interval in which the
//! denominator did not move yields no value: no segments sent is no evidence either way (and a
//! connection stalled in retransmission back-off must not look like a clean link). `source = "file"` reads the first number in a file; with
//! `delta = true` its increase per second instead. A delta source has no value on its first
//! sample (there is nothing to subtract yet).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A metric as written in the configuration (`[[metric]]`).
// Not `deny_unknown_fields`: serde cannot combine it with the flattened source.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct MetricConfig {
    pub name: String,
    #[serde(flatten)]
    pub source: Source,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "source", rename_all = "lowercase")]
pub enum Source {
    Snmp {
        /// `Proto:Field`, e.g. `Tcp:RetransSegs`.
        counter: String,
        /// `Proto:Field` whose increase the counter's increase is divided by (percent).
        #[serde(default)]
        per: Option<String>,
        /// The file to read (default `/proc/net/snmp`; tests point it elsewhere).
        #[serde(default)]
        path: Option<PathBuf>,
    },
    File {
        path: PathBuf,
        #[serde(default)]
        delta: bool,
    },
}

/// Why a metric could not be sampled.
#[derive(Debug, thiserror::Error)]
pub enum MetricError {
    #[error("metric `{metric}`: reading {path}")]
    Read {
        metric: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metric `{metric}`: {path} has no counter `{counter}`")]
    NoCounter {
        metric: String,
        path: PathBuf,
        counter: String,
    },
    #[error("metric `{metric}`: {path} holds no number")]
    NoNumber { metric: String, path: PathBuf },
    #[error("metric `{metric}`: counter `{counter}` is not written `Proto:Field`")]
    CounterName { metric: String, counter: String },
}

/// The counters of a `/proc/net/snmp`-format text: `Proto:Field` → value. Each protocol has a
/// header line (`Tcp: RtoAlgorithm RtoMin ...`) followed by a value line of the same shape.
pub fn parse_snmp(text: &str) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    let mut lines = text.lines();
    while let (Some(head), Some(vals)) = (lines.next(), lines.next()) {
        let (Some((proto, names)), Some((proto2, values))) =
            (head.split_once(':'), vals.split_once(':'))
        else {
            continue;
        };
        if proto != proto2 {
            log::debug!("snmp: header `{proto}` followed by `{proto2}`; skipping the pair");
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<i64>() {
                out.insert(format!("{proto}:{n}"), v);
            }
        }
    }
    out
}

/// A metric and what it needs to remember between samples.
#[derive(Debug)]
pub struct Metric {
    pub config: MetricConfig,
    /// The raw reading(s) and time of the previous sample.
    last: Option<(Duration, f64, f64)>,
}

impl Metric {
    pub fn new(config: MetricConfig) -> Result<Self, MetricError> {
        if let Source::Snmp { counter, per, .. } = &config.source {
            for c in std::iter::once(counter).chain(per.iter()) {
                if !c.contains(':') {
                    return Err(MetricError::CounterName {
                        metric: config.name.clone(),
                        counter: c.clone(),
                    });
                }
            }
        }
        Ok(Metric { config, last: None })
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Read the source at `now`; the metric's value, or `None` on the first sample of a delta.
    pub fn sample(&mut self, now: Duration) -> Result<Option<f64>, MetricError> {
        let name = &self.config.name;
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| MetricError::Read {
                metric: name.clone(),
                path: path.to_owned(),
                source,
            })
        };
        match &self.config.source {
            Source::Snmp { counter, per, path } => {
                let path = path
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/proc/net/snmp"));
                let counters = parse_snmp(&read(&path)?);
                let get = |c: &String| {
                    counters
                        .get(c)
                        .copied()
                        .ok_or_else(|| MetricError::NoCounter {
                            metric: name.clone(),
                            path: path.clone(),
                            counter: c.clone(),
                        })
                };
                // Counters fit f64 exactly up to 2^53, beyond any interval's count.
                #[allow(clippy::cast_precision_loss)]
                let num = get(counter)? as f64;
                #[allow(clippy::cast_precision_loss)]
                let den = match per {
                    Some(p) => get(p)? as f64,
                    None => 0.0,
                };
                let prev = self.last.replace((now, num, den));
                let Some((then, pnum, pden)) = prev else {
                    return Ok(None);
                };
                let dn = num - pnum;
                if per.is_none() {
                    return Ok(Some(per_second(dn, now.saturating_sub(then))));
                }
                let dd = den - pden;
                Ok((dd > 0.0).then(|| 100.0 * dn / dd))
            }
            Source::File { path, delta } => {
                let text = read(path)?;
                let v = text
                    .split_whitespace()
                    .find_map(|w| w.parse::<f64>().ok())
                    .ok_or_else(|| MetricError::NoNumber {
                        metric: name.clone(),
                        path: path.clone(),
                    })?;
                if !delta {
                    return Ok(Some(v));
                }
                let prev = self.last.replace((now, v, 0.0));
                Ok(prev.map(|(then, pv, _)| per_second(v - pv, now.saturating_sub(then))))
            }
        }
    }
}

fn per_second(delta: f64, over: Duration) -> f64 {
    let s = over.as_secs_f64();
    if s > 0.0 {
        delta / s
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP_A: &str = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm ActiveOpens OutSegs RetransSegs\nTcp: 1 10 1000 5\n";
    const SNMP_B: &str = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm ActiveOpens OutSegs RetransSegs\nTcp: 1 12 1400 25\n";

    #[test]
    fn snmp_text_parses_into_proto_field_counters() {
        let c = parse_snmp(SNMP_A);
        assert_eq!(c["Tcp:OutSegs"], 1000);
        assert_eq!(c["Tcp:RetransSegs"], 5);
        assert_eq!(c["Ip:DefaultTTL"], 64);
    }

    #[test]
    fn snmp_ratio_is_the_percentage_of_the_increases_absent_on_the_first_sample_and_when_idle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snmp");
        std::fs::write(&path, SNMP_A).unwrap();
        let cfg = MetricConfig {
            name: "retrans".into(),
            source: Source::Snmp {
                counter: "Tcp:RetransSegs".into(),
                per: Some("Tcp:OutSegs".into()),
                path: Some(path.clone()),
            },
        };
        let mut m = Metric::new(cfg).unwrap();
        assert_eq!(m.sample(Duration::from_secs(0)).unwrap(), None);
        std::fs::write(&path, SNMP_B).unwrap();
        // (25 - 5) / (1400 - 1000) = 5 %.
        assert_eq!(m.sample(Duration::from_secs(1)).unwrap(), Some(5.0));
        // No segments sent: no value (not 0, not a division by zero).
        assert_eq!(m.sample(Duration::from_secs(2)).unwrap(), None);
    }

    #[test]
    fn snmp_counter_without_per_is_a_rate_per_second() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snmp");
        std::fs::write(&path, SNMP_A).unwrap();
        let cfg = MetricConfig {
            name: "opens".into(),
            source: Source::Snmp {
                counter: "Tcp:ActiveOpens".into(),
                per: None,
                path: Some(path.clone()),
            },
        };
        let mut m = Metric::new(cfg).unwrap();
        m.sample(Duration::from_secs(10)).unwrap();
        std::fs::write(&path, SNMP_B).unwrap();
        assert_eq!(m.sample(Duration::from_secs(12)).unwrap(), Some(1.0));
    }

    #[test]
    fn missing_counter_names_the_counter_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snmp");
        std::fs::write(&path, SNMP_A).unwrap();
        let cfg = MetricConfig {
            name: "x".into(),
            source: Source::Snmp {
                counter: "Tcp:Nope".into(),
                per: None,
                path: Some(path),
            },
        };
        let err = trapvec::error_chain(
            &Metric::new(cfg)
                .unwrap()
                .sample(Duration::ZERO)
                .unwrap_err(),
        );
        assert!(
            err.contains("Tcp:Nope") && err.contains("metric `x`"),
            "{err}"
        );
    }

    #[test]
    fn file_metric_reads_the_first_number_or_its_rate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fer");
        std::fs::write(&path, "fer: 0.25\n").unwrap();
        let mut plain = Metric::new(MetricConfig {
            name: "fer".into(),
            source: Source::File {
                path: path.clone(),
                delta: false,
            },
        })
        .unwrap();
        assert_eq!(plain.sample(Duration::ZERO).unwrap(), Some(0.25));
        let mut rate = Metric::new(MetricConfig {
            name: "r".into(),
            source: Source::File {
                path: path.clone(),
                delta: true,
            },
        })
        .unwrap();
        assert_eq!(rate.sample(Duration::ZERO).unwrap(), None);
        std::fs::write(&path, "4.25").unwrap();
        assert_eq!(rate.sample(Duration::from_secs(2)).unwrap(), Some(2.0));
        std::fs::write(&path, "none here").unwrap();
        assert!(matches!(
            plain.sample(Duration::ZERO),
            Err(MetricError::NoNumber { .. })
        ));
    }
}
