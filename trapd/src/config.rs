//! trapd's configuration file (TOML): where it listens and journals, who may talk to it, the
//! metrics it samples, the rules over them and the profiles the rules activate. See
//! `trapd/trapd.example.toml` for an annotated example.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use instr_manager::{ComponentSpec, SetSpec, Spec, SpliceRequest};
use serde::Deserialize;

use super::metrics::MetricConfig;
use super::rules::Rule;

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Socket path (`--socket` overrides; default `/run/trapd.sock`).
    pub socket: Option<PathBuf>,
    /// Journal path (`--journal` overrides; default `/var/lib/trapd/journal`).
    pub journal: Option<PathBuf>,
    /// Where the Prometheus endpoint (`GET /metrics`) listens, e.g. `"127.0.0.1:9464"`; no
    /// endpoint when unset (`--listen` overrides).
    pub listen: Option<SocketAddr>,
    /// Groups (names or numeric ids) whose members may use the socket besides root.
    #[serde(default)]
    pub allow_groups: Vec<String>,
    /// How often metrics are sampled and rules evaluated, in milliseconds (default 1000).
    pub interval_ms: Option<u64>,
    /// No rule switches profiles until the active one has been active this long (seconds).
    #[serde(default)]
    pub min_dwell_s: f64,
    /// Profile activated at start when the journal names none.
    pub initial_profile: Option<String>,
    #[serde(default, rename = "metric")]
    pub metrics: Vec<MetricConfig>,
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
    #[serde(default, rename = "profile")]
    pub profiles: BTreeMap<String, Profile>,
}

/// A named set of components, splices and variable values (`[profile.NAME]`).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Component objects loaded before the profile's splices (relative paths: to the config).
    #[serde(default)]
    pub components: Vec<PathBuf>,
    /// Each in the flat form of every splice (`instr_manager::splice`).
    #[serde(default, rename = "splice")]
    pub splices: Vec<SpliceRequest>,
    #[serde(default, rename = "set")]
    pub sets: Vec<ProfileSet>,
}

/// A component variable a profile writes before its splices go live.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSet {
    pub symbol: String,
    pub value: u64,
    /// 1, 2, 4 or 8 bytes; default the symbol's size, else 8.
    #[serde(default)]
    pub size: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
}

impl Profile {
    /// The profile's splice requests, in order.
    pub fn requests(&self) -> Vec<SpliceRequest> {
        self.splices.clone()
    }

    /// The profile as the configuration `instr_manager::ops::switch` goes to.
    pub fn spec(&self) -> Spec {
        Spec {
            components: self
                .components
                .iter()
                .map(|path| ComponentSpec {
                    path: path.clone(),
                    crc32: None,
                })
                .collect(),
            splices: self.splices.clone(),
            sets: self
                .sets
                .iter()
                .map(|s| SetSpec {
                    symbol: s.symbol.clone(),
                    value: s.value,
                    size: s.size,
                })
                .collect(),
        }
    }
}

impl Config {
    /// Read and check `path`; relative component paths become relative to its directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut c: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |what: String| ConfigError::Invalid {
            path: path.to_owned(),
            what,
        };
        let base = path.parent().unwrap_or(Path::new("."));
        for (name, p) in &mut c.profiles {
            for s in &p.sets {
                if let Some(size) = s.size.filter(|z| ![1, 2, 4, 8].contains(z)) {
                    return Err(invalid(format!(
                        "profile `{name}`: set {}: size {size} is not 1, 2, 4 or 8",
                        s.symbol
                    )));
                }
            }
            for comp in &mut p.components {
                if comp.is_relative() {
                    *comp = base.join(&*comp);
                }
            }
        }
        if let Some(p) = &c.initial_profile {
            if !c.profiles.contains_key(p) {
                return Err(invalid(format!(
                    "initial_profile `{p}` is not a [profile.*]"
                )));
            }
        }
        if !c.min_dwell_s.is_finite() || c.min_dwell_s < 0.0 {
            return Err(invalid(format!(
                "min_dwell_s must be >= 0, not {}",
                c.min_dwell_s
            )));
        }
        if c.interval_ms == Some(0) {
            return Err(invalid("interval_ms must be > 0".into()));
        }
        let mut names: Vec<&str> = c.metrics.iter().map(|m| m.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(format!("two metrics are named `{}`", w[0])));
        }
        Ok(c)
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.unwrap_or(1000))
    }

    pub fn min_dwell(&self) -> Duration {
        Duration::from_secs_f64(self.min_dwell_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use instr_manager::splicer::Action;

    #[test]
    fn example_config_parses_with_lossy_and_clean_profiles() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("trapd.example.toml");
        let c = Config::load(&path).unwrap();
        assert_eq!(c.initial_profile.as_deref(), Some("clean"));
        let lossy = &c.profiles["lossy"];
        assert_eq!(
            lossy.requests()[0].action,
            Action::Replace {
                with: "mss_clamp_tcp_sync_mss".into()
            }
        );
        assert_eq!(lossy.sets[0].symbol, "mss_clamp_mtu");
        assert!(c.profiles["clean"].splices.is_empty());
        assert_eq!(c.rules.len(), 2);
        assert_eq!(c.metrics[0].name, "retrans");
    }

    #[test]
    fn relative_component_paths_are_resolved_against_the_config_directory() {
        let c = Config::parse(
            "[profile.p]\ncomponents = [\"c/x.o\", \"/abs/y.o\"]\n",
            Path::new("/etc/trapd/trapd.toml"),
        )
        .unwrap();
        assert_eq!(
            c.profiles["p"].components,
            vec![PathBuf::from("/etc/trapd/c/x.o"), PathBuf::from("/abs/y.o")]
        );
    }

    #[test]
    fn bad_configs_name_what_is_wrong() {
        let err =
            |t: &str| trapvec::error_chain(&Config::parse(t, Path::new("t.toml")).unwrap_err());
        assert!(
            err("[profile.p]\nsplice = [{ at = \"f\", action = \"replace\" }]\n")
                .contains("needs a `handler`")
        );
        assert!(
            err("[profile.p]\nsplice = [{ at = \"f\", action = \"jump\" }]\n")
                .contains("unknown action `jump`")
        );
        assert!(err("initial_profile = \"nope\"\n").contains("initial_profile `nope`"));
        assert!(err("bogus = 1\n").contains("bogus"));
        assert!(
            err("[profile.p]\nset = [{ symbol = \"v\", value = 1, size = 3 }]\n")
                .contains("size 3")
        );
        assert!(err("listen = \"localhost-9464\"\n").contains("listen"));
    }

    #[test]
    fn the_metrics_endpoint_is_off_unless_listen_is_set() {
        assert_eq!(Config::parse("", Path::new("t.toml")).unwrap().listen, None);
        let c = Config::parse("listen = \"127.0.0.1:9464\"\n", Path::new("t.toml")).unwrap();
        assert_eq!(c.listen, Some("127.0.0.1:9464".parse().unwrap()));
        let c = Config::parse("listen = \"[::1]:9464\"\n", Path::new("t.toml")).unwrap();
        assert_eq!(c.listen, Some("[::1]:9464".parse().unwrap()));
    }
}
