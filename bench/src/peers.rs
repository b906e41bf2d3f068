//! trapvec beside the systems users would pick instead (issue 13): BPF fentry, ftrace and
//! livepatch in the VM (emulated, ratios within one guest only), Frida on this host (cycles).
//!
//! - The guest rows come from `vmtest/scenarios/peers.sh`, booted through `vmtest` with the
//!   peers it needs (`vmtest::build::peers`: the libbpf helper `fentry_count` and the livepatch
//!   module `tv_lp_mss.ko`); the scenario prints `PEERS_*` lines, read here by [`VmPeers::parse`].
//! - The host rows are [`crate::frida`]'s.
//!
//! [`Peers::goals`] puts each of the goals beside its measured ratio.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::frida::{FridaError, FridaRows};

/// A ratio of the guest's figures at N for a mechanism (`VmPeers::commit_over_enable`, ...).
type RatioAt = fn(&VmPeers, u32, &str) -> Option<f64>;

/// The guest scenario (shared with `vmtest/tests/kernel_peers.rs`).
pub const SCENARIO: &str = include_str!("../../vmtest/scenarios/peers.sh");

/// One `PEERS_*` line: its key, its `name=value` words and the text after the key.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Line {
    pub key: String,
    pub text: String,
}

/// The figures of one guest run of `peers.sh` (emulated time: only ratios mean anything).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VmPeers {
    pub kernel: String,
    /// Every `PEERS_*` line, in order (the rounds included).
    pub lines: Vec<Line>,
    /// Emulated ns per getppid(): `base`, `jmp_empty`, `jmp_count`, `trap_empty`,
    /// `fentry_empty`, `fentry_count`.
    pub hit_ns: BTreeMap<String, f64>,
    /// The counting fentry program's hits in the check run, and the getppid() calls made.
    pub fentry_hits: (u64, u64),
    /// Per N: ftrace's `filter_ns`, `enable_ns`, `disable_ns`; trapvec's `<mech>_apply_ns`,
    /// `<mech>_commit_ms`, `<mech>_remove_ns` (medians).
    pub mass: BTreeMap<u32, BTreeMap<String, f64>>,
    /// livepatch `load_ns`, `transition_ns`, `disable_ns`, `unload_ns`; trapvec
    /// `<mech>_splice_ns`, `<mech>_commit_ms`, `<mech>_unsplice_ns` (medians).
    pub swap: BTreeMap<String, f64>,
    /// Emulated ns per loopback connection: `none`, `livepatch`, `trap`, `jmp`.
    pub conn_ns: BTreeMap<String, f64>,
    /// Emulated ns per `tcp_sync_mss()` call (`tv_mss_bench.ko`'s loop): `none`, `livepatch`,
    /// `trap`, `jmp`.
    #[serde(default)]
    pub call_ns: BTreeMap<String, f64>,
    /// What every `trapctl` command pays before planning: `kallsyms_ns` (`cat /proc/kallsyms`),
    /// `list_ns` (`trapctl list` with nothing live), `symbols` (medians).
    #[serde(default)]
    pub fixed: BTreeMap<String, f64>,
    /// Mass-attach batches trapvec.ko refused (code arena full): `n=… round=… mechanism=…: why`.
    #[serde(default)]
    pub refused: Vec<String>,
    /// Mass-attach batches the scenario did not run: `n=… round=… mechanism=…: why`.
    #[serde(default)]
    pub skipped: Vec<String>,
    /// The counting kprobe_multi program's hits in its check run and the getppid() calls made,
    /// where the kernel has kprobe_multi (6.12; its per-N attach and detach go into `mass` as
    /// `kmulti_<empty|count>_attach_ns` and `_detach_ns`, its hit costs into `hit_ns`).
    #[serde(default)]
    pub kmulti_hits: Option<(u64, u64)>,
    /// Per trapvec configuration of the hit-cost rows (`jmp_empty`, `jmp_count`, `trap_empty`):
    /// its splice's hits (`trapctl list`) in a check run, and the getppid() calls made.
    #[serde(default)]
    pub trapvec_hits: BTreeMap<String, (u64, u64)>,
    /// The one-liner `@[comm] = count()`'s (`trace_comm`, `trapctl trace --mechanism jmp`) and
    /// its BPF twin's (`fentry_comm`, a hash map keyed by comm) sysbench entries in their
    /// check runs, and the getppid() calls made.
    #[serde(default)]
    pub comm_hits: BTreeMap<String, (u64, u64)>,
}

/// `hits=N expected=M` (or `N expected=M`) of a hit-count line, whose text starts with `key=`.
fn hits_of(line: &str, text: &str, key: &str) -> Result<(u64, u64), String> {
    let rest = text.trim_start_matches(&format!("{key}="));
    let rest = rest.trim_start_matches("hits=");
    let (h, e) = rest
        .split_once(" expected=")
        .ok_or_else(|| format!("bad line `{line}`"))?;
    Ok((
        h.trim()
            .parse()
            .map_err(|_| format!("bad hits in `{line}`"))?,
        e.trim()
            .parse()
            .map_err(|_| format!("bad count in `{line}`"))?,
    ))
}

/// `name=value` words of `text` whose value is a number.
fn numbers(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.split_whitespace().filter_map(|w| {
        let (k, v) = w.split_once('=')?;
        Some((k, v.parse().ok()?))
    })
}

impl VmPeers {
    /// Read the `PEERS_*` lines of a console log; an error names the first missing figure.
    pub fn parse(console: &str, kernel: &str) -> Result<VmPeers, String> {
        let mut v = VmPeers {
            kernel: kernel.to_string(),
            ..VmPeers::default()
        };
        for raw in console.lines() {
            let line = raw.trim_end_matches('\r');
            let Some(at) = line.find("PEERS_") else {
                continue;
            };
            let line = &line[at..];
            let (key, text) = match line.split_once(['=', ' ']) {
                Some((k, t)) if line.as_bytes()[k.len()] == b'=' => (k, format!("{k}={t}")),
                Some((k, t)) => (k, t.to_string()),
                None => (line, String::new()),
            };
            v.lines.push(Line {
                key: key.to_string(),
                text: text.clone(),
            });
            if let Some(c) = key.strip_prefix("PEERS_NS_") {
                let n = text
                    .split_once('=')
                    .and_then(|(_, n)| n.trim().parse().ok());
                v.hit_ns.insert(
                    c.to_lowercase(),
                    n.ok_or_else(|| format!("bad figure in `{line}`"))?,
                );
            } else if key == "PEERS_KMULTI_HITS" {
                v.kmulti_hits = Some(hits_of(line, &text, key)?);
            } else if key == "PEERS_TRAPVEC_HITS" {
                // `config=jmp_empty hits=22002 expected=22002`
                let (config, rest) = text
                    .strip_prefix("config=")
                    .and_then(|t| t.split_once(' '))
                    .ok_or_else(|| format!("bad line `{line}`"))?;
                v.trapvec_hits
                    .insert(config.to_string(), hits_of(line, rest, key)?);
            } else if let Some((n, prog)) = key
                .strip_prefix("PEERS_KMULTI_")
                .and_then(|rest| rest.split_once('_'))
                .and_then(|(n, prog)| Some((n.parse::<u32>().ok()?, prog)))
            {
                let m = v.mass.entry(n).or_default();
                m.extend(
                    numbers(&text).map(|(k, x)| (format!("kmulti_{}_{k}", prog.to_lowercase()), x)),
                );
            } else if key == "PEERS_FENTRY_HITS" {
                v.fentry_hits = hits_of(line, &text, key)?;
            } else if key == "PEERS_TRACE_COMM_HITS" {
                v.comm_hits
                    .insert("trace_comm".into(), hits_of(line, &text, key)?);
            } else if key == "PEERS_FENTRY_COMM_HITS" {
                v.comm_hits
                    .insert("fentry_comm".into(), hits_of(line, &text, key)?);
            } else if let Some(n) = key
                .strip_prefix("PEERS_FTRACE_")
                .and_then(|n| n.parse::<u32>().ok())
            {
                let m = v.mass.entry(n).or_default();
                m.extend(numbers(&text).map(|(k, x)| (k.to_string(), x)));
            } else if let Some(mech) = key.strip_prefix("PEERS_TRAPD_SWAP_") {
                if !mech.contains("ROUND") {
                    v.swap.extend(
                        numbers(&text)
                            .map(|(k, x)| (format!("trapd_{}_{k}", mech.to_lowercase()), x)),
                    );
                }
            } else if let Some((n, mech)) = key
                .strip_prefix("PEERS_TRAPD_")
                .and_then(|rest| rest.split_once('_'))
                .and_then(|(n, mech)| Some((n.parse::<u32>().ok()?, mech)))
            {
                let m = v.mass.entry(n).or_default();
                m.extend(
                    numbers(&text).map(|(k, x)| (format!("trapd_{}_{k}", mech.to_lowercase()), x)),
                );
            } else if key == "PEERS_TRAPVEC_REFUSED" {
                v.refused.push(text.clone());
            } else if key == "PEERS_TRAPVEC_SKIPPED" {
                v.skipped.push(text.clone());
            } else if let Some(rest) = key.strip_prefix("PEERS_TRAPVEC_") {
                let Some((n, mech)) = rest.split_once('_') else {
                    continue;
                };
                let Ok(n) = n.parse::<u32>() else { continue };
                let m = v.mass.entry(n).or_default();
                m.extend(numbers(&text).map(|(k, x)| (format!("{}_{k}", mech.to_lowercase()), x)));
            } else if key == "PEERS_LIVEPATCH" {
                v.swap
                    .extend(numbers(&text).map(|(k, x)| (k.to_string(), x)));
            } else if let Some(mech) = key.strip_prefix("PEERS_REPLACE_") {
                if !mech.contains("ROUND") {
                    v.swap.extend(
                        numbers(&text).map(|(k, x)| (format!("{}_{k}", mech.to_lowercase()), x)),
                    );
                }
            } else if key == "PEERS_CONN_NS" {
                v.conn_ns
                    .extend(numbers(&text).map(|(k, x)| (k.to_string(), x)));
            } else if key == "PEERS_TRAPCTL_FIXED" {
                v.fixed
                    .extend(numbers(&text).map(|(k, x)| (k.to_string(), x)));
            } else if key == "PEERS_CALL_NS" {
                // Up to the parenthesis: the MSS after it is no figure.
                let figures = text.split('(').next().unwrap_or_default();
                v.call_ns
                    .extend(numbers(figures).map(|(k, x)| (k.to_string(), x)));
            }
        }
        for need in [
            "base",
            "jmp_empty",
            "trap_empty",
            "fentry_empty",
            "fentry_count",
        ] {
            if !v.hit_ns.contains_key(need) {
                return Err(format!(
                    "the guest printed no PEERS_NS_{} line",
                    need.to_uppercase()
                ));
            }
        }
        if !v.mass.contains_key(&1000) {
            return Err("the guest printed no mass-attach figures for N = 1000".into());
        }
        if !v.swap.contains_key("transition_ns") {
            return Err("the guest printed no livepatch figures".into());
        }
        Ok(v)
    }

    /// Why the hit cost of configuration `config` (a `hit_ns` key) is no figure: the hits its
    /// check run counted differ from the getppid() calls made, or were never counted. `None`:
    /// counted and equal (or `base`, which runs nothing). The empty fentry and kprobe_multi
    /// programs count nothing: they share their attachment with the counting program, whose
    /// check stands for both.
    pub fn invalid_hits(&self, config: &str) -> Option<String> {
        let (what, hits) = match config {
            "base" => return None,
            "fentry_empty" | "fentry_count" => ("the counting fentry program", {
                Some(self.fentry_hits).filter(|&(h, e)| (h, e) != (0, 0))
            }),
            "kmulti_empty" | "kmulti_count" => {
                ("the counting kprobe_multi program", self.kmulti_hits)
            }
            "trace_comm" | "fentry_comm" => (
                "the map's sysbench entry",
                self.comm_hits.get(config).copied(),
            ),
            c => ("trapvec's splice", self.trapvec_hits.get(c).copied()),
        };
        match hits {
            None => Some(format!("{config}: {what} reported no hit count")),
            Some((h, e)) if h != e => {
                Some(format!("{config}: {what} counted {h} hits for {e} calls"))
            }
            Some(_) => None,
        }
    }

    /// Emulated overhead per getppid() of configuration `key` over the bare call.
    pub fn hit_overhead(&self, key: &str) -> Option<f64> {
        Some(self.hit_ns.get(key)? - self.hit_ns.get("base")?)
    }

    fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
        match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    }

    /// jmp `call` splice (empty handler) / fentry (empty program), overheads per hit.
    pub fn jmp_over_fentry(&self) -> Option<f64> {
        Self::ratio(
            self.hit_overhead("jmp_empty"),
            self.hit_overhead("fentry_empty"),
        )
    }

    /// [`Self::jmp_over_fentry`], or why its figures are invalid (hits not the calls made).
    pub fn jmp_over_fentry_checked(&self) -> Result<Option<f64>, String> {
        let invalid: Vec<String> = ["jmp_empty", "fentry_empty"]
            .iter()
            .filter_map(|c| self.invalid_hits(c))
            .collect();
        if invalid.is_empty() {
            Ok(self.jmp_over_fentry())
        } else {
            Err(format!("invalid: {}", invalid.join("; ")))
        }
    }

    /// The one-liner `@[comm] = count()` by jmp / BPF fentry's same map update, overheads per
    /// hit, or why its figures are invalid (a map's entry not the calls made).
    pub fn trace_over_fentry_checked(&self) -> Result<Option<f64>, String> {
        let invalid: Vec<String> = ["trace_comm", "fentry_comm"]
            .iter()
            .filter_map(|c| self.invalid_hits(c))
            .collect();
        if invalid.is_empty() {
            Ok(Self::ratio(
                self.hit_overhead("trace_comm"),
                self.hit_overhead("fentry_comm"),
            ))
        } else {
            Err(format!("invalid: {}", invalid.join("; ")))
        }
    }

    /// The largest N with both ftrace's and trapvec's (`mech`) mass-attach figures.
    pub fn mass_n(&self, mech: &str) -> u32 {
        let key = format!("{mech}_commit_ms");
        self.mass
            .iter()
            .filter(|(_, m)| m.contains_key(&key) && m.contains_key("enable_ns"))
            .map(|(n, _)| *n)
            .max()
            .unwrap_or(0)
    }

    /// The Ns at which trapvec.ko refused the `mech` batch.
    pub fn refused_ns(&self, mech: &str) -> Vec<u32> {
        Self::ns_of(&self.refused, mech)
    }

    /// The Ns at which the scenario skipped the `mech` batch, and the first reason given.
    pub fn skipped_ns(&self, mech: &str) -> (Vec<u32>, Option<String>) {
        let why = self
            .skipped
            .iter()
            .find(|r| r.contains(&format!("mechanism={mech}:")))
            .and_then(|r| r.split_once(": ").map(|(_, why)| why.to_string()));
        (Self::ns_of(&self.skipped, mech), why)
    }

    fn ns_of(lines: &[String], mech: &str) -> Vec<u32> {
        let mut ns: Vec<u32> = lines
            .iter()
            .filter(|r| r.contains(&format!("mechanism={mech}:")))
            .filter_map(|r| {
                r.split_whitespace()
                    .find_map(|w| w.strip_prefix("n=")?.parse::<u32>().ok())
            })
            .collect();
        ns.dedup();
        ns
    }

    /// trapvec's commit / ftrace's enable at N, for `mech`.
    pub fn commit_over_enable(&self, n: u32, mech: &str) -> Option<f64> {
        let m = self.mass.get(&n)?;
        Self::ratio(
            m.get(&format!("{mech}_commit_ms")).map(|c| c * 1e6),
            m.get("enable_ns").copied(),
        )
    }

    /// trapvec's whole `apply` command / ftrace's filter + enable at N, for `mech`.
    pub fn apply_over_ftrace(&self, n: u32, mech: &str) -> Option<f64> {
        let m = self.mass.get(&n)?;
        let ftrace = m.get("filter_ns")? + m.get("enable_ns")?;
        Self::ratio(m.get(&format!("{mech}_apply_ns")).copied(), Some(ftrace))
    }

    /// The whole `trapctl apply` through trapd / ftrace's filter + enable at N, for `mech`.
    pub fn trapd_apply_over_ftrace(&self, n: u32, mech: &str) -> Option<f64> {
        let m = self.mass.get(&n)?;
        let ftrace = m.get("filter_ns")? + m.get("enable_ns")?;
        Self::ratio(
            m.get(&format!("trapd_{mech}_apply_ns")).copied(),
            Some(ftrace),
        )
    }

    /// livepatch's transition / the swap through trapd: `trapctl activate` of a profile with
    /// the replacement (`activate`), else `trapctl apply` of it (both whole commands).
    pub fn transition_over_trapd_swap(&self, mech: &str, activate: bool) -> Option<f64> {
        let what = if activate { "activate" } else { "splice" };
        Self::ratio(
            self.swap.get("transition_ns").copied(),
            self.swap.get(&format!("trapd_{mech}_{what}_ns")).copied(),
        )
    }

    /// livepatch's transition / trapvec's swap (`whole`: the trapctl command; else its commit).
    pub fn transition_over_swap(&self, mech: &str, whole: bool) -> Option<f64> {
        let swap = if whole {
            self.swap.get(&format!("{mech}_splice_ns")).copied()
        } else {
            self.swap.get(&format!("{mech}_commit_ms")).map(|c| c * 1e6)
        };
        Self::ratio(self.swap.get("transition_ns").copied(), swap)
    }

    /// jmp replacement / livepatch, overhead per loopback connection over the unpatched one;
    /// `None` when it is not resolvable: either overhead not positive, or livepatch's below 5 %
    /// of a connection (the spread between rounds under TCG is larger than that).
    pub fn jmp_over_livepatch_per_connection(&self) -> Option<f64> {
        let base = *self.conn_ns.get("none")?;
        let jmp = self.conn_ns.get("jmp")? - base;
        let livepatch = self.conn_ns.get("livepatch")? - base;
        (jmp > 0.0 && livepatch >= 0.05 * base).then(|| jmp / livepatch)
    }

    /// Emulated overhead per `tcp_sync_mss()` call of `key` over the unpatched call.
    pub fn call_overhead(&self, key: &str) -> Option<f64> {
        Some(self.call_ns.get(key)? - self.call_ns.get("none")?)
    }

    /// Replacement by `mech` / livepatch, overheads per `tcp_sync_mss()` call over the
    /// unpatched call (measured in the guest's kernel by `tv_mss_bench.ko`).
    pub fn over_livepatch_per_call(&self, mech: &str) -> Option<f64> {
        Self::ratio(self.call_overhead(mech), self.call_overhead("livepatch"))
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "\nguest rows, {} (EMULATED under QEMU TCG: compare ratios only)\n",
            self.kernel
        );
        for c in self.hit_ns.keys() {
            if let Some(why) = self.invalid_hits(c) {
                let _ = writeln!(s, "  INVALID hit cost {why}");
            }
        }
        for l in &self.lines {
            let _ = writeln!(
                s,
                "  {} {}",
                l.key,
                l.text
                    .strip_prefix(&format!("{}=", l.key))
                    .unwrap_or(&l.text)
            );
        }
        s
    }
}

/// Boot the newest cloud kernel (or `kernel`) with the module and the peers, run peers.sh.
/// `ten_thousand` adds the N = 10,000 mass-attach rows (PEERS_10K=1).
pub fn measure_vm(
    repo: &Path,
    kernel: Option<PathBuf>,
    ten_thousand: bool,
) -> Result<VmPeers, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let scenario = dir.path().join("peers.sh");
    std::fs::write(&scenario, SCENARIO).map_err(|e| e.to_string())?;
    let install = match &kernel {
        Some(image) => vmtest::host::KernelInstall::for_image(
            image,
            Path::new(vmtest::host::HEADERS_DIR),
            Path::new(vmtest::host::MODULES_DIR),
        ),
        None => vmtest::host::KernelInstall::newest(),
    }
    .map_err(|e| e.to_string())?;
    let mut files = vmtest::build::peers(repo, &install, dir.path()).map_err(|e| e.to_string())?;
    // The changes through trapd (the scenario's part 6).
    files.push(vmtest::testing::build_trapd());
    let opts = vmtest::runner::RunOptions {
        repo: repo.to_path_buf(),
        scenario,
        files,
        timeout: Duration::from_secs(if ten_thousand { 7200 } else { 1800 }),
        load_module: true,
        kernel,
        keep_initramfs: None,
        append: if ten_thousand {
            vec!["PEERS_10K=1".into()]
        } else {
            Vec::new()
        },
        qemu_args: Vec::new(),
        extra_modules: Vec::new(),
        memory_mib: 512,
    };
    let mut console = Vec::new();
    let report = vmtest::runner::run(&opts, &mut console).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&console);
    if report.exit_code() != 0 {
        let why: Vec<&str> = text
            .lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| l.starts_with("PEERS: "))
            .collect();
        return Err(format!(
            "{} {}",
            report.summary(opts.timeout),
            why.join("; ")
        ));
    }
    VmPeers::parse(&text, &report.kernel_version)
}

/// Measure what is asked: the Frida rows (`frida`) and the guest rows (`vm`). A peer that
/// cannot run here is left out with the reason; only an error of trapvec's own side fails.
pub fn measure(
    repo: &Path,
    iters: u32,
    rounds: u32,
    attach_rounds: u32,
    frida: bool,
    vm: bool,
    ten_thousand: bool,
) -> Result<Peers, FridaError> {
    let mut p = Peers::default();
    if frida {
        match crate::frida::measure(repo, iters, rounds, attach_rounds) {
            Ok(f) => p.frida = Some(f),
            Err(FridaError::Unavailable(why)) => p.frida_unavailable = Some(why),
            Err(e @ FridaError::Run { .. }) => p.frida_unavailable = Some(e.to_string()),
            Err(e) => return Err(e),
        }
    } else {
        p.frida_unavailable = Some("not asked for (--no-frida)".into());
    }
    if vm {
        match measure_vm(repo, None, ten_thousand) {
            Ok(v) => p.vm = Some(v),
            Err(why) => p.vm_unavailable = Some(why),
        }
    } else {
        p.vm_unavailable = Some("not asked for (--vm)".into());
    }
    Ok(p)
}

/// One goal of issue 13 and what was measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Goal {
    pub goal: String,
    /// The measured ratio as text (`0.84x`), or why there is none.
    pub measured: String,
    /// `None`: not measured.
    pub met: Option<bool>,
    /// How far the ratio is on the right side of the goal: target / ratio for an "at most"
    /// goal, ratio / target for an "at least" one; > 1 is met. `None`: not measured.
    #[serde(default)]
    pub margin: Option<f64>,
}

/// Everything `bench peers` measured.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Peers {
    pub vm: Option<VmPeers>,
    pub vm_unavailable: Option<String>,
    pub frida: Option<FridaRows>,
    pub frida_unavailable: Option<String>,
}

/// A goal that the ratio be at most (`Bound::AtMost`) or at least a target.
#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

fn goal(goal: &str, ratio: Option<f64>, bound: Bound, missing: &str) -> Goal {
    match ratio {
        // Every goal is a ratio of two costs: one that is not a positive number (an overhead
        // that came out negative or zero under emulation's noise) meets no goal either way.
        Some(r) if !(r.is_finite() && r > 0.0) => Goal {
            goal: goal.into(),
            measured: format!("not resolvable: {r:.2}x is not a positive ratio"),
            met: None,
            margin: None,
        },
        Some(r) => {
            let margin = match bound {
                Bound::AtMost(t) => t / r,
                Bound::AtLeast(t) => r / t,
            };
            let met = match bound {
                Bound::AtMost(t) => r <= t,
                Bound::AtLeast(t) => r >= t,
            };
            let margin = margin.is_finite().then_some(margin);
            Goal {
                goal: goal.into(),
                measured: format!("{r:.2}x"),
                met: Some(met),
                margin,
            }
        }
        None => Goal {
            goal: goal.into(),
            measured: missing.into(),
            met: None,
            margin: None,
        },
    }
}

/// A goal whose figures exist but are not to be trusted (`why`), reported without a ratio.
fn invalid(goal: &str, why: String) -> Goal {
    Goal {
        goal: goal.into(),
        measured: why,
        met: None,
        margin: None,
    }
}

impl Peers {
    /// The goals, each with its measured ratio and verdict.
    pub fn goals(&self) -> Vec<Goal> {
        let vm = self.vm.as_ref();
        let no_vm = self.vm_unavailable.as_deref().unwrap_or("no guest run");
        let no_frida = self.frida_unavailable.as_deref().unwrap_or("no Frida run");
        // Why a goal "at 10,000" has no figure at 10,000 for `mech`: refused, skipped or not asked
        // for; then what the largest N measured gave, for information only (a goal at N is
        // judged at N).
        let not_at_10k = |mech: &str, ratio: fn(&VmPeers, u32, &str) -> Option<f64>| -> String {
            let Some(v) = vm else {
                return no_vm.to_string();
            };
            let n = v.mass_n(mech);
            let refused = v.refused_ns(mech);
            let (skipped, skip_why) = v.skipped_ns(mech);
            let why = if !refused.is_empty() {
                let list: Vec<String> = refused.iter().map(u32::to_string).collect();
                format!(
                    "N = {} refused by trapvec.ko: its code arena is full",
                    list.join(", ")
                )
            } else if !skipped.is_empty() {
                let list: Vec<String> = skipped.iter().map(u32::to_string).collect();
                format!(
                    "N = {} not run: {}",
                    list.join(", "),
                    skip_why.unwrap_or_default()
                )
            } else {
                "N = 10,000 needs PEERS_10K=1".to_string()
            };
            match ratio(v, n, mech) {
                Some(r) => format!("not measured at N = 10,000 ({why}); {r:.2}x at N = {n}"),
                None => format!("not measured at N = 10,000 ({why})"),
            }
        };
        let measured_at = |n: u32, mech: &str| -> bool {
            vm.is_some_and(|v| {
                v.mass.get(&n).is_some_and(|m| {
                    m.contains_key(&format!("{mech}_commit_ms")) && m.contains_key("enable_ns")
                })
            })
        };
        let mut g = vec![
            goal(
                "livepatch: swap >= 20x faster than livepatch's transition (jmp, whole trapctl command)",
                vm.and_then(|v| v.transition_over_swap("jmp", true)),
                Bound::AtLeast(20.0),
                no_vm,
            ),
            goal(
                "livepatch: swap >= 20x faster than livepatch's transition (jmp, trapctl's commit)",
                vm.and_then(|v| v.transition_over_swap("jmp", false)),
                Bound::AtLeast(20.0),
                no_vm,
            ),
            goal(
                "livepatch: swap >= 20x faster than livepatch's transition (trap, trapctl's commit)",
                vm.and_then(|v| v.transition_over_swap("trap", false)),
                Bound::AtLeast(20.0),
                no_vm,
            ),
        ];
        // Issue 26: the swap through a running trapd, as a profile switch and as an apply.
        for (mech, activate, how) in [
            ("jmp", true, "trapctl activate"),
            ("trap", true, "trapctl activate"),
            ("jmp", false, "trapctl apply"),
        ] {
            g.push(goal(
                &format!(
                    "livepatch: swap through trapd >= 20x faster than livepatch's transition ({mech}, whole `{how}`)"
                ),
                vm.and_then(|v| v.transition_over_trapd_swap(mech, activate)),
                Bound::AtLeast(20.0),
                &vm.map_or(no_vm.to_string(), |_| {
                    "not measured (no PEERS_TRAPD_SWAP line)".to_string()
                }),
            ));
        }
        g.push(match vm {
            Some(v) if !v.call_ns.is_empty() => goal(
                "livepatch: jmp replacement per call <= 1.0x livepatch's (overhead per tcp_sync_mss call)",
                v.over_livepatch_per_call("jmp"),
                Bound::AtMost(1.0),
                "not resolvable: livepatch's overhead per call is not positive",
            ),
            Some(v) => goal(
                "livepatch: jmp replacement per call <= 1.0x livepatch's (overhead per loopback connection)",
                v.jmp_over_livepatch_per_connection(),
                Bound::AtMost(1.0),
                "not resolvable: livepatch's overhead per connection is within the noise",
            ),
            None => goal("livepatch: jmp replacement per call <= 1.0x livepatch's", None, Bound::AtMost(1.0), no_vm),
        });
        let fentry =
            "fentry: jmp `call` splice hit (empty handler) <= 1.0x a fentry hit (empty program)";
        g.push(match vm.map(VmPeers::jmp_over_fentry_checked) {
            Some(Err(why)) => invalid(fentry, why),
            Some(Ok(r)) => goal(fentry, r, Bound::AtMost(1.0), "not resolvable"),
            None => goal(fentry, None, Bound::AtMost(1.0), no_vm),
        });
        let comm = "trace: `@[comm] = count()` by jmp per hit <= 1.0x BPF fentry's same map update";
        g.push(match vm.map(VmPeers::trace_over_fentry_checked) {
            Some(Err(why)) => invalid(comm, why),
            Some(Ok(r)) => goal(
                comm,
                r,
                Bound::AtMost(1.0),
                "not measured in this guest run",
            ),
            None => goal(comm, None, Bound::AtMost(1.0), no_vm),
        });
        for mech in ["trap", "jmp"] {
            let rows: [(String, RatioAt, Bound); 2] = [
                (
                    format!("ftrace: {mech} batch commit <= 1.0x ftrace's enable at 10,000"),
                    VmPeers::commit_over_enable,
                    Bound::AtMost(1.0),
                ),
                (
                    format!(
                        "ftrace: whole `trapctl apply` ({mech}) <= 2.0x filter + enable at 10,000"
                    ),
                    VmPeers::apply_over_ftrace,
                    Bound::AtMost(2.0),
                ),
            ];
            for (text, ratio, bound) in rows {
                g.push(if measured_at(10_000, mech) {
                    goal(&text, vm.and_then(|v| ratio(v, 10_000, mech)), bound, no_vm)
                } else {
                    goal(&text, None, bound, &not_at_10k(mech, ratio))
                });
            }
            // Issue 26: the same batch through a running trapd, at most ftrace's filter + enable.
            let text = format!(
                "ftrace: whole `trapctl apply` ({mech}) through trapd <= 1.0x filter + enable at 10,000"
            );
            let ratio: RatioAt = VmPeers::trapd_apply_over_ftrace;
            let at_10k = vm.is_some_and(|v| {
                v.mass.get(&10_000).is_some_and(|m| {
                    m.contains_key(&format!("trapd_{mech}_apply_ns")) && m.contains_key("enable_ns")
                })
            });
            g.push(if at_10k {
                goal(
                    &text,
                    vm.and_then(|v| ratio(v, 10_000, mech)),
                    Bound::AtMost(1.0),
                    no_vm,
                )
            } else {
                goal(&text, None, Bound::AtMost(1.0), &not_at_10k(mech, ratio))
            });
        }
        let f = self.frida.as_ref();
        g.push(goal(
            "Frida: jmp splice hit >= 5x cheaper than a Frida CModule onEnter hit (Frida / jmp)",
            f.and_then(FridaRows::frida_over_jmp),
            Bound::AtLeast(5.0),
            no_frida,
        ));
        g.push(goal(
            "Frida: 1,000-function attach >= 10x faster (Frida attach / trapvec jmp batch apply)",
            f.and_then(FridaRows::attach_over_batch),
            Bound::AtLeast(10.0),
            no_frida,
        ));
        g
    }

    /// The goals as a Markdown table.
    pub fn goals_markdown(&self) -> String {
        let mut s = String::from("| goal | measured | verdict |\n|---|---:|---|\n");
        for g in self.goals() {
            let verdict = match g.met {
                Some(true) => "met",
                Some(false) => "**not met**",
                None => "not measured",
            };
            let _ = writeln!(s, "| {} | {} | {verdict} |", g.goal, g.measured);
        }
        s
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        match (&self.frida, &self.frida_unavailable) {
            (Some(f), _) => s.push_str(&f.render()),
            (None, Some(why)) => {
                let _ = writeln!(s, "Frida rows: not measured: {why}");
            }
            (None, None) => {}
        }
        match (&self.vm, &self.vm_unavailable) {
            (Some(v), _) => s.push_str(&v.render()),
            (None, Some(why)) => {
                let _ = writeln!(s, "guest rows: not measured: {why}");
            }
            (None, None) => {}
        }
        s.push_str("\ngoals (issue 13):\n");
        for g in self.goals() {
            let verdict = match g.met {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not measured",
            };
            let _ = writeln!(s, "  {:<100} {:>12}  {verdict}", g.goal, g.measured);
        }
        s
    }

    /// CSV of every figure: `source,key,value`.
    pub fn csv(&self) -> String {
        let mut s = String::from("source,key,value,emulated\n");
        if let Some(f) = &self.frida {
            for (k, v) in f.figures() {
                let _ = writeln!(s, "host,{k},{v},false");
            }
        }
        if let Some(v) = &self.vm {
            for (k, x) in &v.hit_ns {
                let _ = writeln!(s, "vm,hit_ns_{k},{x},true");
            }
            for (n, m) in &v.mass {
                for (k, x) in m {
                    let _ = writeln!(s, "vm,mass_{n}_{k},{x},true");
                }
            }
            for (k, x) in &v.swap {
                let _ = writeln!(s, "vm,swap_{k},{x},true");
            }
            for (k, x) in &v.conn_ns {
                let _ = writeln!(s, "vm,conn_ns_{k},{x},true");
            }
            for (k, x) in &v.call_ns {
                let _ = writeln!(s, "vm,call_ns_{k},{x},true");
            }
            for (k, x) in &v.fixed {
                let _ = writeln!(s, "vm,trapctl_fixed_{k},{x},true");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "[ 1.0] trapvec: loaded\r\n\
PEERS_HIT_ROUND 1: base=600 jmp_empty=900 jmp_count=800 trap_empty=2000 fentry_empty=1000 fentry_count=1100\r\n\
PEERS_NS_BASE=600\r\nPEERS_NS_JMP_EMPTY=900\nPEERS_NS_JMP_COUNT=800\nPEERS_NS_TRAP_EMPTY=2000\n\
PEERS_NS_FENTRY_EMPTY=1000\nPEERS_NS_FENTRY_COUNT=1100\n\
PEERS_NS_TRACE_COMM=1300\nPEERS_NS_FENTRY_COMM=1400\n\
PEERS_FENTRY_HITS=22002 expected=22002\n\
PEERS_TRACE_COMM_HITS=22002 expected=22002\nPEERS_FENTRY_COMM_HITS=22002 expected=22002\n\
PEERS_TRAPVEC_HITS config=jmp_empty hits=22002 expected=22002\n\
PEERS_TRAPVEC_HITS config=jmp_count hits=22002 expected=22002\n\
PEERS_TRAPVEC_HITS config=trap_empty hits=22002 expected=22002\n\
PEERS_TRAPCTL_FIXED kallsyms_ns=300000000 list_ns=900000000 symbols=130000 (medians of 3)\n\
PEERS_FTRACE_1000 filter_ns=1000000 enable_ns=800000000 disable_ns=500000000 (medians of 3)\n\
PEERS_TRAPVEC_1000_TRAP apply_ns=5000000000 commit_ms=400 remove_ns=3000000000 (medians of 3)\n\
PEERS_TRAPVEC_1000_JMP apply_ns=3000000000 commit_ms=200 remove_ns=2000000000 (medians of 3)\n\
PEERS_LIVEPATCH load_ns=100000000 transition_ns=1500000000 disable_ns=1100000000 unload_ns=1200000000 (medians of 3)\n\
PEERS_REPLACE_ROUND 1: mechanism=jmp splice_ns=1 commit_ms=1 unsplice_ns=1\n\
PEERS_REPLACE_TRAP splice_ns=1500000000 commit_ms=30 unsplice_ns=1000000000 (medians of 3)\n\
PEERS_REPLACE_JMP splice_ns=1000000000 commit_ms=15 unsplice_ns=1000000000 (medians of 3)\n\
PEERS_TRAPD_MASS_ROUND n=1000 round=1 mechanism=trap apply_ns=1 plan_ms=1 build_ms=1 commit_ms=1 remove_ns=1 live=1000\n\
PEERS_TRAPD_1000_TRAP apply_ns=400000000 commit_ms=300 remove_ns=300000000 (medians of 3)\n\
PEERS_TRAPD_1000_JMP apply_ns=1600000000 commit_ms=150 remove_ns=300000000 (medians of 3)\n\
PEERS_TRAPD_SWAP_ROUND 1: mechanism=jmp splice_ns=1 commit_ms=1 unsplice_ns=1 activate_ns=1 deactivate_ns=1\n\
PEERS_TRAPD_SWAP_TRAP splice_ns=300000000 commit_ms=30 unsplice_ns=300000000 activate_ns=100000000 deactivate_ns=100000000 (medians of 3)\n\
PEERS_TRAPD_SWAP_JMP splice_ns=300000000 commit_ms=15 unsplice_ns=300000000 activate_ns=50000000 deactivate_ns=50000000 (medians of 3)\n\
PEERS_TRAPD_LOG [2026-11-27T19:00:00Z DEBUG trapd::daemon] timing: change 3 (apply): intent journaled 0.100 ms\n\
PEERS_CONN_NS none=1000 livepatch=1100 trap=1300 jmp=1050 (connections=300)\n\
PEERS_CALL_ROUND 1: none=2000000 mss=32741 livepatch=3000000 mss=948 trap=9000000 mss=948 jmp=2500000 mss=948\n\
PEERS_CALL_NS none=100.0 livepatch=150.0 trap=450.0 jmp=125.0 (ns per tcp_sync_mss call; MSS unpatched 32741, clamped 948)\n\n";

    #[test]
    fn figures_and_ratios_are_read_from_a_console_with_noise() {
        let v = VmPeers::parse(CONSOLE, "6.1.0").unwrap();
        assert_eq!(v.hit_overhead("jmp_empty"), Some(300.0));
        assert_eq!(v.jmp_over_fentry(), Some(0.75));
        assert_eq!(v.fentry_hits, (22002, 22002));
        assert_eq!(v.trapvec_hits.get("jmp_empty"), Some(&(22002, 22002)));
        assert_eq!(v.trapvec_hits.len(), 3);
        for c in v.hit_ns.keys() {
            assert_eq!(v.invalid_hits(c), None, "{c}: hits equal the calls");
        }
        assert_eq!(v.mass_n("jmp"), 1000);
        assert_eq!(v.commit_over_enable(1000, "jmp"), Some(0.25));
        assert_eq!(
            v.apply_over_ftrace(1000, "trap")
                .map(|r| (r * 1000.0).round()),
            Some(6242.0)
        );
        assert_eq!(v.transition_over_swap("jmp", true), Some(1.5));
        assert_eq!(v.transition_over_swap("jmp", false), Some(100.0));
        assert_eq!(v.jmp_over_livepatch_per_connection(), Some(0.5));
        assert_eq!(v.fixed.get("list_ns"), Some(&9e8));
        assert_eq!(
            v.call_ns.len(),
            4,
            "the MSS in parentheses is no figure: {:?}",
            v.call_ns
        );
        assert_eq!(v.call_overhead("trap"), Some(350.0));
        assert_eq!(v.over_livepatch_per_call("jmp"), Some(0.5));
        assert_eq!(v.over_livepatch_per_call("trap"), Some(7.0));
        let mut noisy = v.clone();
        noisy.conn_ns.insert("jmp".into(), 900.0);
        assert_eq!(
            noisy.jmp_over_livepatch_per_connection(),
            None,
            "jmp faster than nothing: noise"
        );
        noisy.conn_ns.insert("jmp".into(), 1010.0);
        noisy.conn_ns.insert("livepatch".into(), 1020.0);
        assert_eq!(
            noisy.jmp_over_livepatch_per_connection(),
            None,
            "livepatch within 5 %: noise"
        );
        assert_eq!(
            v.swap.get("jmp_splice_ns"),
            Some(&1e9),
            "the round line is not the median"
        );
        assert!(
            v.lines.iter().any(|l| l.key == "PEERS_HIT_ROUND"),
            "rounds are kept"
        );
        assert!(v.render().contains("EMULATED"));
    }

    #[test]
    fn kprobe_multi_rows_of_a_6_12_guest_are_read_beside_the_others() {
        let console = format!(
            "{CONSOLE}PEERS_KMULTI=yes\n\
PEERS_NS_KMULTI_EMPTY=1400\nPEERS_NS_KMULTI_COUNT=1500\n\
PEERS_KMULTI_HITS=22001 expected=22002\n\
PEERS_KMULTI_MASS_ROUND n=1000 round=1 program=empty attach_ns=9 detach_ns=9 attached=1000\n\
PEERS_KMULTI_1000_EMPTY attach_ns=300000000 detach_ns=200000000 (medians of 3)\n\
PEERS_KMULTI_1000_COUNT attach_ns=310000000 detach_ns=210000000 (medians of 3)\n"
        );
        let v = VmPeers::parse(&console, "6.12.95").unwrap();
        assert_eq!(v.hit_overhead("kmulti_count"), Some(900.0));
        assert_eq!(v.kmulti_hits, Some((22001, 22002)));
        let m = &v.mass[&1000];
        assert_eq!(m.get("kmulti_empty_attach_ns"), Some(&3e8));
        assert_eq!(m.get("kmulti_count_detach_ns"), Some(&2.1e8));
        assert_eq!(
            m.keys().filter(|k| k.starts_with("kmulti_")).count(),
            4,
            "the round line is not a median: {m:?}"
        );
        assert!(v
            .render()
            .contains("PEERS_KMULTI_1000_COUNT attach_ns=310000000"));
        let v = VmPeers::parse(CONSOLE, "6.1.0").unwrap();
        assert_eq!(v.kmulti_hits, None, "6.1 has no kprobe_multi");
    }

    #[test]
    fn a_refused_batch_leaves_the_goal_at_10000_unmeasured_and_says_why() {
        let console = format!(
            "{CONSOLE}PEERS_FTRACE_10000 filter_ns=1 enable_ns=900000000 disable_ns=1 (medians of 3)\n\
             PEERS_TRAPVEC_REFUSED n=10000 round=1 mechanism=trap: no repository memory (arena full)\n\
             PEERS_TRAPVEC_REFUSED n=10000 round=2 mechanism=trap: no repository memory (arena full)\n"
        );
        let v = VmPeers::parse(&console, "6.1.0").unwrap();
        assert_eq!(
            (v.mass_n("trap"), v.refused_ns("trap"), v.refused_ns("jmp")),
            (1000, vec![10_000], vec![])
        );
        let peers = Peers {
            vm: Some(v),
            ..Peers::default()
        };
        let goal = peers
            .goals()
            .into_iter()
            .find(|g| g.goal.starts_with("ftrace: trap batch commit"))
            .unwrap();
        assert_eq!(
            (goal.measured.as_str(), goal.met),
            (
                "not measured at N = 10,000 (N = 10000 refused by trapvec.ko: its code arena is \
                 full); 0.50x at N = 1000",
                None
            ),
            "a goal at 10,000 is not judged at 1,000"
        );
    }

    #[test]
    fn a_goal_at_10000_is_judged_at_10000_and_not_measured_without_it() {
        // Met at 1,000 (0.25x), not met at 10,000 (2.00x): the verdict is 10,000's.
        let console = format!(
            "{CONSOLE}PEERS_FTRACE_10000 filter_ns=1 enable_ns=900000000 disable_ns=1 (medians of 3)\n\
             PEERS_TRAPVEC_10000_JMP apply_ns=9000000000 commit_ms=1800 remove_ns=1 (medians of 3)\n"
        );
        let peers = Peers {
            vm: Some(VmPeers::parse(&console, "6.1.0").unwrap()),
            ..Peers::default()
        };
        let goals = peers.goals();
        let jmp = goals
            .iter()
            .find(|g| g.goal.starts_with("ftrace: jmp batch commit"))
            .unwrap();
        assert_eq!((jmp.measured.as_str(), jmp.met), ("2.00x", Some(false)));
        // Without a 10,000 row (CONSOLE has 1,000 only), no verdict.
        let peers = Peers {
            vm: Some(VmPeers::parse(CONSOLE, "6.1.0").unwrap()),
            ..Peers::default()
        };
        for g in peers
            .goals()
            .iter()
            .filter(|g| g.goal.contains("at 10,000"))
        {
            assert_eq!(g.met, None, "{}: {}", g.goal, g.measured);
            assert!(
                g.measured
                    .starts_with("not measured at N = 10,000 (N = 10,000 needs PEERS_10K=1); "),
                "{}",
                g.measured
            );
        }
    }

    #[test]
    fn the_changes_through_trapd_are_judged_beside_the_direct_ones() {
        let v = VmPeers::parse(CONSOLE, "6.1.0").unwrap();
        assert_eq!(v.mass[&1000]["trapd_trap_apply_ns"], 400_000_000.0);
        assert_eq!(v.mass[&1000]["trapd_jmp_commit_ms"], 150.0);
        // The direct figures stay the direct ones.
        assert_eq!(v.mass[&1000]["trap_apply_ns"], 5_000_000_000.0);
        assert_eq!(v.swap["trapd_jmp_activate_ns"], 50_000_000.0);
        assert_eq!(v.swap["jmp_splice_ns"], 1_000_000_000.0);
        // 1.5 s of transition: jmp's switch (50 ms) 30x, trap's (100 ms) 15x, jmp's apply 5x.
        let peers = Peers {
            vm: Some(v),
            ..Peers::default()
        };
        let goals = peers.goals();
        let find = |start: &str| goals.iter().find(|g| g.goal.starts_with(start)).unwrap();
        let swap = "livepatch: swap through trapd >= 20x faster than livepatch's transition";
        let g = find(&format!("{swap} (jmp, whole `trapctl activate`)"));
        assert_eq!((g.measured.as_str(), g.met), ("30.00x", Some(true)));
        let g = find(&format!("{swap} (trap, whole `trapctl activate`)"));
        assert_eq!((g.measured.as_str(), g.met), ("15.00x", Some(false)));
        let g = find(&format!("{swap} (jmp, whole `trapctl apply`)"));
        assert_eq!((g.measured.as_str(), g.met), ("5.00x", Some(false)));
        // At 1,000 only: no verdict, 1,000's ratio for information (0.50x and 2.00x).
        let g = find("ftrace: whole `trapctl apply` (trap) through trapd");
        assert_eq!(g.met, None);
        assert!(
            g.measured.ends_with("; 0.50x at N = 1000"),
            "{}",
            g.measured
        );
        let g = find("ftrace: whole `trapctl apply` (jmp) through trapd");
        assert!(
            g.measured.ends_with("; 2.00x at N = 1000"),
            "{}",
            g.measured
        );
        // At 10,000, judged: met at 0.9x (trap), not met at 1.1x (jmp).
        let console = format!(
            "{CONSOLE}PEERS_FTRACE_10000 filter_ns=100000000 enable_ns=900000000 disable_ns=1 (medians of 3)\n\
             PEERS_TRAPVEC_10000_TRAP apply_ns=6000000000 commit_ms=800 remove_ns=1 (medians of 3)\n\
             PEERS_TRAPVEC_10000_JMP apply_ns=7000000000 commit_ms=1800 remove_ns=1 (medians of 3)\n\
             PEERS_TRAPD_10000_TRAP apply_ns=900000000 commit_ms=800 remove_ns=1 (medians of 3)\n\
             PEERS_TRAPD_10000_JMP apply_ns=1100000000 commit_ms=1800 remove_ns=1 (medians of 3)\n"
        );
        let peers = Peers {
            vm: Some(VmPeers::parse(&console, "6.1.0").unwrap()),
            ..Peers::default()
        };
        let goals = peers.goals();
        let find = |start: &str| goals.iter().find(|g| g.goal.starts_with(start)).unwrap();
        let g = find("ftrace: whole `trapctl apply` (trap) through trapd");
        assert_eq!((g.measured.as_str(), g.met), ("0.90x", Some(true)));
        let g = find("ftrace: whole `trapctl apply` (jmp) through trapd");
        assert_eq!((g.measured.as_str(), g.met), ("1.10x", Some(false)));
        let g = find("ftrace: whole `trapctl apply` (trap) <= 2.0x");
        assert_eq!((g.measured.as_str(), g.met), ("6.00x", Some(false)));
    }

    #[test]
    fn an_at_most_goal_is_not_met_by_a_negative_or_zero_ratio() {
        let mut v = VmPeers::parse(CONSOLE, "6.1.0").unwrap();
        // The jmp splice came out 100 ns *faster* than the bare call: noise, not a win.
        v.hit_ns.insert("jmp_empty".into(), 500.0);
        assert_eq!(v.jmp_over_fentry(), Some(-0.25));
        let fentry = |v: VmPeers| {
            Peers {
                vm: Some(v),
                ..Peers::default()
            }
            .goals()
            .into_iter()
            .find(|g| g.goal.starts_with("fentry"))
            .unwrap()
        };
        let g = fentry(v.clone());
        assert_eq!(g.met, None, "{}", g.measured);
        assert_eq!(g.measured, "not resolvable: -0.25x is not a positive ratio");
        v.hit_ns.insert("jmp_empty".into(), 600.0);
        let g = fentry(v);
        assert_eq!((g.met, g.margin), (None, None), "{}", g.measured);
        let g = goal("x", Some(f64::NAN), Bound::AtLeast(1.0), "");
        assert_eq!(g.met, None, "nan meets nothing");
    }

    #[test]
    fn the_comm_one_liner_goal_is_judged_on_checked_maps() {
        let comm = |console: &str| {
            Peers {
                vm: Some(VmPeers::parse(console, "6.1.0").unwrap()),
                ..Peers::default()
            }
            .goals()
            .into_iter()
            .find(|g| g.goal.starts_with("trace: `@[comm]"))
            .unwrap()
        };
        // (1300 - 600) / (1400 - 600)
        let g = comm(CONSOLE);
        assert_eq!((g.measured.as_str(), g.met), ("0.88x", Some(true)));
        let console = CONSOLE.replace("PEERS_TRACE_COMM_HITS=22002", "PEERS_TRACE_COMM_HITS=21000");
        let g = comm(&console);
        assert_eq!(
            (g.measured.as_str(), g.met),
            (
                "invalid: trace_comm: the map's sysbench entry counted 21000 hits for 22002 calls",
                None
            )
        );
    }

    #[test]
    fn a_figure_whose_hits_are_not_the_calls_made_is_invalid_not_a_ratio() {
        let fentry = |console: &str| {
            Peers {
                vm: Some(VmPeers::parse(console, "6.1.0").unwrap()),
                ..Peers::default()
            }
            .goals()
            .into_iter()
            .find(|g| g.goal.starts_with("fentry"))
            .unwrap()
        };
        let console = CONSOLE.replace("config=jmp_empty hits=22002", "config=jmp_empty hits=0");
        let g = fentry(&console);
        assert_eq!(
            (g.measured.as_str(), g.met),
            (
                "invalid: jmp_empty: trapvec's splice counted 0 hits for 22002 calls",
                None
            )
        );
        let console = CONSOLE.replace("PEERS_FENTRY_HITS=22002", "PEERS_FENTRY_HITS=11001");
        let g = fentry(&console);
        assert_eq!(
            g.measured,
            "invalid: fentry_empty: the counting fentry program counted 11001 hits for 22002 calls"
        );
        let v = VmPeers::parse(&console, "6.1.0").unwrap();
        assert!(v.render().contains(
            "INVALID hit cost fentry_count: the counting fentry program counted 11001 hits"
        ));
        // No hit count at all is no better.
        let console: String = CONSOLE
            .lines()
            .filter(|l| !l.starts_with("PEERS_TRAPVEC_HITS config=jmp_empty"))
            .map(|l| format!("{l}\n"))
            .collect();
        let g = fentry(&console);
        assert_eq!(
            g.measured,
            "invalid: jmp_empty: trapvec's splice reported no hit count"
        );
        let v = VmPeers::parse(&console, "6.1.0").unwrap();
        assert_eq!(
            v.invalid_hits("kmulti_count"),
            Some("kmulti_count: the counting kprobe_multi program reported no hit count".into())
        );
        assert_eq!(v.invalid_hits("trap_empty"), None);
    }

    #[test]
    fn a_skipped_batch_leaves_the_goal_at_10000_unmeasured_and_gives_the_reason() {
        let console = format!(
            "{CONSOLE}PEERS_FTRACE_10000 filter_ns=1 enable_ns=900000000 disable_ns=1 (medians of 3)\n\
             PEERS_TRAPVEC_10000_TRAP apply_ns=9000000000 plan_ms=1 build_ms=1 commit_ms=1800 remove_ns=1 (medians of 3)\n\
             PEERS_TRAPVEC_SKIPPED n=10000 round=1 mechanism=jmp: stalls the guest\n"
        );
        let v = VmPeers::parse(&console, "6.1.0").unwrap();
        assert_eq!((v.mass_n("trap"), v.mass_n("jmp")), (10_000, 1000));
        assert_eq!(
            v.skipped_ns("jmp"),
            (vec![10_000], Some("stalls the guest".to_string()))
        );
        let peers = Peers {
            vm: Some(v),
            ..Peers::default()
        };
        let goals = peers.goals();
        let jmp = goals
            .iter()
            .find(|g| g.goal.starts_with("ftrace: jmp batch commit"))
            .unwrap();
        assert_eq!(
            (jmp.measured.as_str(), jmp.met),
            (
                "not measured at N = 10,000 (N = 10000 not run: stalls the guest); 0.25x at N = 1000",
                None
            )
        );
        let trap = goals
            .iter()
            .find(|g| g.goal.starts_with("ftrace: trap batch commit"))
            .unwrap();
        assert_eq!(
            (trap.measured.as_str(), trap.met),
            ("2.00x", Some(false)),
            "{}",
            trap.goal
        );
    }

    #[test]
    fn a_missing_figure_is_an_error_naming_it() {
        let err = VmPeers::parse("PEERS_NS_BASE=1\nPEERS_NS_JMP_EMPTY=2\n", "k").unwrap_err();
        assert_eq!(err, "the guest printed no PEERS_NS_TRAP_EMPTY line");
    }

    #[test]
    fn goals_say_met_not_met_or_why_not_measured() {
        let peers = Peers {
            vm: Some(VmPeers::parse(CONSOLE, "6.1.0").unwrap()),
            frida_unavailable: Some("no frida".into()),
            ..Peers::default()
        };
        let goals = peers.goals();
        let fentry = goals.iter().find(|g| g.goal.starts_with("fentry")).unwrap();
        assert_eq!(
            (fentry.measured.as_str(), fentry.met),
            ("0.75x", Some(true))
        );
        assert_eq!(
            fentry.margin.map(|m| (m * 1000.0).round()),
            Some(1333.0),
            "1.0 / 0.75"
        );
        let per_call = goals
            .iter()
            .find(|g| g.goal.contains("per tcp_sync_mss call"))
            .unwrap();
        assert_eq!(
            (per_call.measured.as_str(), per_call.met),
            ("0.50x", Some(true)),
            "measured per call, not per connection"
        );
        let whole = goals
            .iter()
            .find(|g| g.goal.contains("whole trapctl command"))
            .unwrap();
        assert_eq!(whole.met, Some(false));
        assert!(
            goals.iter().any(|g| g.measured.contains("at N = 1000")),
            "the N measured is named"
        );
        let frida = goals.iter().find(|g| g.goal.starts_with("Frida")).unwrap();
        assert_eq!((frida.measured.as_str(), frida.met), ("no frida", None));
        assert!(peers.goals_markdown().contains("| not measured |"));
    }
}
