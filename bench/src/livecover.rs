//! Live coverage at scale (issue 27's goals), side by side in one guest: `bench cover`.
//!
//! `bench/scenarios/live_cover.sh` runs in the VM (emulated, QEMU TCG: only ratios within the
//! run mean anything) with the bench's `TCP` group as its globs and prints `LIVECOVER_*` lines,
//! read here by [`LiveCover::parse`]; [`LiveCover::goals`] puts each goal beside what was
//! measured, with the proof that makes the figure valid:
//!
//! 1. the TCP group armed in one batch through trapd under TCP traffic, the whole command under
//!    2 s (valid only if the command succeeded, every byte of the traffic went through, no oops
//!    and no site was left);
//! 2. kprobes' registration time per probe over trapvec's arm time per block, at least 100×
//!    (valid only if kprobe_events holds exactly the sample written);
//! 3. a workload under `--mode once` after warm-up within 5 % of its unspliced time (medians;
//!    valid only if every round ran and no site was left);
//! 4. every function of `available_filter_functions` covered at once (opt-in): blocks, armed,
//!    refused by kind, time, memory.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::peers::Goal;

/// The guest scenario.
pub const SCENARIO: &str = include_str!("../scenarios/live_cover.sh");

/// The name of the bench group whose functions goal 1 covers.
pub const GROUP: &str = "TCP";

/// The figures of one guest run: every `LIVECOVER_KEY=value` line (the last of a key wins) and
/// the refusals by kind of each coverage (`LIVECOVER_<P>_REFUSED_BY=N KIND`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LiveCover {
    pub values: BTreeMap<String, String>,
    /// Per prefix (`TCP`, `ALL`): kind → blocks refused for it.
    pub refused_by: BTreeMap<String, BTreeMap<String, u64>>,
    /// kprobe lines kprobe_events refused (`p:tvc/sN ADDR`), the first few.
    pub kprobe_refused: Vec<String>,
}

/// Why a figure cannot be read: the key and what was there.
fn missing(key: &str, v: Option<&String>) -> String {
    match v {
        None => format!("no LIVECOVER_{key} line"),
        Some(v) => format!("LIVECOVER_{key}=`{v}` is not a number"),
    }
}

impl LiveCover {
    /// Read the `LIVECOVER_*` lines of a console log; an error when the scenario did not end.
    pub fn parse(console: &str) -> Result<LiveCover, String> {
        let mut v = LiveCover::default();
        let mut done = false;
        for raw in console.lines() {
            let line = raw.trim_end_matches('\r');
            let Some(at) = line.find("LIVECOVER_") else {
                continue;
            };
            let rest = &line[at + "LIVECOVER_".len()..];
            if rest == "DONE" {
                done = true;
                continue;
            }
            let Some((key, value)) = rest.split_once(['=', ' ']) else {
                continue;
            };
            if key == "KPROBE_REFUSED" {
                v.kprobe_refused.push(value.to_string());
            } else if let Some(prefix) = key.strip_suffix("_REFUSED_BY") {
                let (n, kind) = value
                    .split_once(' ')
                    .ok_or_else(|| format!("bad line `{line}`"))?;
                let n: u64 = n.parse().map_err(|_| format!("bad count in `{line}`"))?;
                v.refused_by
                    .entry(prefix.to_string())
                    .or_default()
                    .insert(kind.to_string(), n);
            } else {
                v.values.insert(key.to_string(), value.to_string());
            }
        }
        if !done {
            return Err("the scenario did not reach LIVECOVER_DONE".into());
        }
        Ok(v)
    }

    /// `LIVECOVER_<key>` as text.
    pub fn text(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// `LIVECOVER_<key>` as a number, or why not.
    pub fn number(&self, key: &str) -> Result<f64, String> {
        let v = self.values.get(key);
        v.and_then(|s| s.trim().parse::<f64>().ok())
            .ok_or_else(|| missing(key, v))
    }

    /// `name=N` of the line `LIVECOVER_<key>` (`TRAFFIC rounds=12 failed=0`).
    fn word(&self, key: &str, name: &str) -> Result<f64, String> {
        let line = self.text(key).ok_or_else(|| missing(key, None))?;
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("LIVECOVER_{key} `{line}` has no {name}=N"))
    }

    /// Blocks armed by the coverage `prefix` (`TCP`, `ALL`): blocks less refused.
    pub fn armed(&self, prefix: &str) -> Result<f64, String> {
        Ok(self.number(&format!("{prefix}_TOTAL_BLOCKS"))?
            - self.number(&format!("{prefix}_TOTAL_REFUSED"))?)
    }

    /// What makes the coverage `prefix`'s figures invalid: a failed command, sites left, an
    /// oops, nothing armed.
    fn coverage_proof(&self, prefix: &str) -> Result<(), String> {
        let status = self.number(&format!("{prefix}_STATUS"))?;
        if status != 0.0 {
            let why = self
                .text(&format!("{prefix}_STDERR"))
                .unwrap_or_default()
                .trim_end_matches('|');
            return Err(format!("trapctl cover exited {status}: {why}"));
        }
        let left = self.number(&format!("{prefix}_LEFT"))?;
        if left != 0.0 {
            return Err(format!("{left} site(s) left live after the coverage"));
        }
        if self.armed(prefix)? <= 0.0 {
            return Err("no block was armed".into());
        }
        Ok(())
    }

    /// Goal 1's proof and figure: the whole command in ms, valid only if the command
    /// succeeded, nothing was left, the kernel logged no oops and the traffic ran clean.
    pub fn tcp_whole_ms(&self) -> Result<f64, String> {
        self.coverage_proof("TCP")?;
        let oops = self.number("TCP_OOPS")?;
        if oops != 0.0 {
            return Err(format!("{oops} oops/warning line(s) in the kernel log"));
        }
        let (rounds, failed) = (
            self.word("TRAFFIC", "rounds")?,
            self.word("TRAFFIC", "failed")?,
        );
        if rounds < 1.0 || failed != 0.0 {
            return Err(format!(
                "the TCP traffic did not run clean ({rounds} stream(s), {failed} failed)"
            ));
        }
        Ok(self.number("TCP_WHOLE_NS")? / 1e6)
    }

    /// Goal 2's figures: (kprobe ns per probe registered, trapvec ns per block armed, their
    /// ratio), valid only if kprobe_events holds exactly the sample written.
    pub fn arm_rate(&self) -> Result<(f64, f64, f64), String> {
        self.coverage_proof("TCP")?;
        let sample = self.number("KPROBE_SAMPLE")?;
        let registered = self.number("KPROBE_REGISTERED")?;
        if sample < 1.0 {
            return Err("no kprobe was written".into());
        }
        if registered != sample {
            return Err(format!(
                "kprobe_events holds {registered} of the {sample} probes written{}",
                self.kprobe_refused
                    .first()
                    .map(|l| format!(" (refused: {l} ...)"))
                    .unwrap_or_default()
            ));
        }
        let kprobe = self.number("KPROBE_REGISTER_NS")? / registered;
        let trapvec = self.number("TCP_ARM_MS")? * 1e6 / self.armed("TCP")?;
        Ok((kprobe, trapvec, kprobe / trapvec))
    }

    /// Goal 3's figures through `route` (`trapd`, `direct`): (median ns under once mode, median
    /// ns unspliced, their ratio), valid only if every round ran and nothing was left.
    pub fn once_ratio(&self, route: &str) -> Result<(f64, f64, f64), String> {
        let prefix = format!("ONCE_{route}");
        self.coverage_proof(&prefix)?;
        for key in [format!("{prefix}_ROUNDS"), "BASE_ROUNDS".to_string()] {
            let rounds = self.text(&key).ok_or_else(|| missing(&key, None))?;
            if rounds.split_whitespace().count() == 0
                || rounds.split_whitespace().any(|r| r.parse::<f64>().is_err())
            {
                return Err(format!("a round did not run: LIVECOVER_{key}=`{rounds}`"));
            }
        }
        let once = self.number(&format!("{prefix}_MEDIAN_NS"))?;
        let base = self.number("BASE_MEDIAN_NS")?;
        Ok((once, base, once / base))
    }

    /// Each goal of issue 27 beside what was measured.
    pub fn goals(&self) -> Vec<Goal> {
        let mut out = Vec::new();
        let blocks = self.number("TCP_TOTAL_BLOCKS").unwrap_or(f64::NAN);
        out.push(match self.tcp_whole_ms() {
            Ok(ms) => verdict(
                &format!(
                    "`{GROUP}` group ({blocks} blocks) armed in one batch through trapd under TCP traffic: whole `trapctl cover` ≤ 2 s"
                ),
                ms / 1000.0,
                Bound::AtMost(2.0),
                |r| format!("{:.1} s ({:.0} ms; 0 oops, 0 sites left)", r, r * 1000.0),
            ),
            Err(why) => invalid("`TCP` group armed through trapd under TCP traffic ≤ 2 s", &why),
        });
        out.push(match self.arm_rate() {
            Ok((kprobe, trapvec, ratio)) => verdict(
                "arm rate ≥ 100× kprobes' (registration through kprobe_events, per probe, on a sample of the same blocks)",
                ratio,
                Bound::AtLeast(100.0),
                |r| {
                    format!(
                        "{r:.1}× ({:.0} µs per kprobe over {} probes / {:.1} µs per block over {} blocks)",
                        kprobe / 1e3,
                        self.number("KPROBE_REGISTERED").unwrap_or(f64::NAN),
                        trapvec / 1e3,
                        self.armed("TCP").unwrap_or(f64::NAN)
                    )
                },
            ),
            Err(why) => invalid("arm rate ≥ 100× kprobes'", &why),
        });
        for route in ["trapd", "direct"] {
            let name = format!(
                "once mode ({route}): workload after warm-up within 5 % of unspliced (median time ratio ≤ 1.05)"
            );
            out.push(match self.once_ratio(route) {
                Ok((once, base, ratio)) => verdict(&name, ratio, Bound::AtMost(1.05), |r| {
                    format!("{r:.3}× ({:.1} / {:.1} ms)", once / 1e6, base / 1e6)
                }),
                Err(why) => invalid(&name, &why),
            });
        }
        out.push(self.whole_goal());
        out
    }

    /// Goal 4: a report, not a bound; met when every traceable function's blocks went through
    /// one coverage that ended clean (refusals, capacity ones included, are its figures).
    fn whole_goal(&self) -> Goal {
        let name = "whole traceable text (every function of available_filter_functions) at once: blocks, time, memory, refusals";
        if self.text("ALL_STATUS").is_none() {
            return Goal {
                goal: name.into(),
                measured: "not measured: opt-in (`bench cover --whole-kernel`, LIVECOVER_WHOLE=1)"
                    .into(),
                met: None,
                margin: None,
            };
        }
        let figures = || -> Result<String, String> {
            Ok(format!(
                "{} functions, {} blocks, {} armed, {} refused, whole command {:.1} s",
                self.number("ALL_TOTAL_FUNCTIONS")?,
                self.number("ALL_TOTAL_BLOCKS")?,
                self.armed("ALL")?,
                self.number("ALL_TOTAL_REFUSED")?,
                self.number("ALL_WHOLE_NS")? / 1e9
            ))
        };
        match self.coverage_proof("ALL").and_then(|()| figures()) {
            Ok(text) => Goal {
                goal: name.into(),
                measured: text,
                met: Some(true),
                margin: None,
            },
            Err(why) => Goal {
                goal: name.into(),
                measured: format!("not met: {why}"),
                met: Some(false),
                margin: None,
            },
        }
    }

    /// The goals and every figure behind them, as text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "live coverage (issue 27), guest {} ({} CPUs), emulated (QEMU TCG): ratios only",
            self.text("KERNEL").unwrap_or("?"),
            self.text("CPUS").unwrap_or("?")
        );
        let _ = writeln!(s, "group {GROUP}: {}", self.text("GLOBS").unwrap_or("?"));
        let _ = writeln!(
            s,
            "\n| goal (issue 27) | measured | verdict |\n|---|---|---|"
        );
        for g in self.goals() {
            let verdict = match g.met {
                Some(true) => "met",
                Some(false) => "**not met**",
                None if g.measured.starts_with("invalid") => "invalid",
                None => "not measured",
            };
            let _ = writeln!(s, "| {} | {} | {verdict} |", g.goal, g.measured);
        }
        let _ = writeln!(s, "\nfigures:");
        for (k, v) in &self.values {
            let _ = writeln!(s, "  {k}={v}");
        }
        for (p, kinds) in &self.refused_by {
            for (kind, n) in kinds {
                let _ = writeln!(s, "  {p} refused: {n} {kind}");
            }
        }
        for l in &self.kprobe_refused {
            let _ = writeln!(s, "  kprobe refused: {l}");
        }
        s
    }
}

/// A goal that the figure be at most or at least a target.
#[derive(Clone, Copy)]
enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

/// A figure judged against its bound: one that is not a positive finite number meets nothing.
fn verdict(goal: &str, r: f64, bound: Bound, show: impl Fn(f64) -> String) -> Goal {
    if !(r.is_finite() && r > 0.0) {
        return Goal {
            goal: goal.into(),
            measured: format!("not resolvable: {r} is not a positive figure"),
            met: None,
            margin: None,
        };
    }
    let (met, margin) = match bound {
        Bound::AtMost(t) => (r <= t, t / r),
        Bound::AtLeast(t) => (r >= t, r / t),
    };
    Goal {
        goal: goal.into(),
        measured: show(r),
        met: Some(met),
        margin: margin.is_finite().then_some(margin),
    }
}

/// A goal whose proof did not hold: no figure.
fn invalid(goal: &str, why: &str) -> Goal {
    Goal {
        goal: goal.into(),
        measured: format!("invalid: {why}"),
        met: None,
        margin: None,
    }
}

/// The scenario as the guest runs it: `LIVECOVER_GLOBS`, the bench group `GROUP`'s patterns,
/// on the line after the shebang.
pub fn scenario_text() -> Result<String, String> {
    let group = crate::groups::default_groups()
        .into_iter()
        .find(|g| g.name == GROUP)
        .ok_or_else(|| format!("the bench has no `{GROUP}` group"))?;
    let (shebang, rest) = SCENARIO
        .split_once('\n')
        .ok_or("the scenario has no lines")?;
    Ok(format!(
        "{shebang}\nLIVECOVER_GLOBS='{}'\n{rest}",
        group.patterns.join(" ")
    ))
}

/// Options of one guest run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Also goal 4 (`LIVECOVER_WHOLE=1`; a bigger guest, hours of TCG at worst).
    pub whole_kernel: bool,
    pub sample: u32,
    pub rounds: u32,
    pub conns: u32,
    /// The console log is written here as well.
    pub console: Option<PathBuf>,
}

/// Boot the guest with the scenario, trapd and the module; parse its lines.
pub fn measure_vm(repo: &Path, o: &Options) -> Result<LiveCover, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let scenario = dir.path().join("live_cover.sh");
    std::fs::write(&scenario, scenario_text()?).map_err(|e| e.to_string())?;
    let trapd = vmtest::testing::build_trapd();
    let mut append = vec![
        format!("LIVECOVER_SAMPLE={}", o.sample),
        format!("LIVECOVER_ROUNDS={}", o.rounds),
        format!("LIVECOVER_CONNS={}", o.conns),
    ];
    if o.whole_kernel {
        append.push("LIVECOVER_WHOLE=1".into());
    }
    let opts = vmtest::runner::RunOptions {
        repo: repo.to_path_buf(),
        scenario,
        files: vec![trapd],
        timeout: Duration::from_secs(if o.whole_kernel { 4 * 3600 } else { 1800 }),
        load_module: true,
        kernel: None,
        keep_initramfs: None,
        append,
        qemu_args: Vec::new(),
        extra_modules: Vec::new(),
        memory_mib: if o.whole_kernel { 3072 } else { 1024 },
    };
    let mut console = Vec::new();
    let report = vmtest::runner::run(&opts, &mut console).map_err(|e| e.to_string())?;
    if let Some(path) = &o.console {
        std::fs::write(path, &console).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let text = String::from_utf8_lossy(&console);
    if report.exit_code() != 0 {
        return Err(format!(
            "{} (last lines: {})",
            report.summary(opts.timeout),
            text.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
        ));
    }
    LiveCover::parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clean run's lines, as the scenario prints them.
    fn clean() -> String {
        "noise\r\n\
         LIVECOVER_KERNEL=6.1.0-56-cloud-amd64\r\n\
         LIVECOVER_GLOBS=tcp_* __tcp_*\r\n\
         LIVECOVER_TCP_STATUS=0\r\n\
         LIVECOVER_TCP_WHOLE_NS=30000000000\r\n\
         LIVECOVER_TCP_STDERR=covering ...|\r\n\
         LIVECOVER_TCP_ARM_MS=20000.0\r\n\
         LIVECOVER_TCP_TOTAL_FUNCTIONS=900\r\n\
         LIVECOVER_TCP_TOTAL_BLOCKS=21000\r\n\
         LIVECOVER_TCP_TOTAL_REFUSED=1000\r\n\
         LIVECOVER_TCP_REFUSED_BY=600 undefined_opcode\r\n\
         LIVECOVER_TCP_REFUSED_BY=400 the window [.., ..) crosses a block\r\n\
         LIVECOVER_TCP_LEFT=0\r\n\
         LIVECOVER_TRAFFIC rounds=14 failed=0\r\n\
         LIVECOVER_TCP_OOPS=0\r\n\
         LIVECOVER_KPROBE_SAMPLE=500\r\n\
         LIVECOVER_KPROBE_REGISTER_NS=1000000000\r\n\
         LIVECOVER_KPROBE_REGISTERED=500\r\n\
         LIVECOVER_ONCE_trapd_STATUS=0\r\n\
         LIVECOVER_ONCE_trapd_TOTAL_BLOCKS=21000\r\n\
         LIVECOVER_ONCE_trapd_TOTAL_REFUSED=1000\r\n\
         LIVECOVER_ONCE_trapd_ROUNDS=103 104 102 \r\n\
         LIVECOVER_ONCE_trapd_MEDIAN_NS=103\r\n\
         LIVECOVER_ONCE_trapd_LEFT=0\r\n\
         LIVECOVER_ONCE_direct_STATUS=0\r\n\
         LIVECOVER_ONCE_direct_TOTAL_BLOCKS=21000\r\n\
         LIVECOVER_ONCE_direct_TOTAL_REFUSED=1000\r\n\
         LIVECOVER_ONCE_direct_ROUNDS=120 121 119 \r\n\
         LIVECOVER_ONCE_direct_MEDIAN_NS=120\r\n\
         LIVECOVER_ONCE_direct_LEFT=0\r\n\
         LIVECOVER_BASE_ROUNDS=100 101 99 100 \r\n\
         LIVECOVER_BASE_MEDIAN_NS=100\r\n\
         LIVECOVER_OOPS=0\r\n\
         LIVECOVER_DONE\r\n"
            .to_string()
    }

    fn with(line: &str, value: &str) -> LiveCover {
        let text = clean()
            .lines()
            .map(|l| {
                let key = format!("LIVECOVER_{line}");
                if l.strip_prefix(&key)
                    .is_some_and(|r| r.starts_with(['=', ' ']))
                {
                    format!("LIVECOVER_{line}={value}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        LiveCover::parse(&text).unwrap()
    }

    #[test]
    fn a_clean_run_gives_every_figure_and_verdict() {
        let v = LiveCover::parse(&clean()).unwrap();
        assert_eq!(v.armed("TCP").unwrap(), 20_000.0);
        assert_eq!(v.refused_by["TCP"]["undefined_opcode"], 600);
        assert_eq!(
            v.refused_by["TCP"]["the window [.., ..) crosses a block"],
            400
        );
        assert_eq!(v.tcp_whole_ms().unwrap(), 30_000.0);
        // 2 ms per kprobe, 1 ms per block: 2x.
        let (k, t, r) = v.arm_rate().unwrap();
        assert_eq!((k, t, r), (2e6, 1e6, 2.0));
        assert_eq!(v.once_ratio("trapd").unwrap().2, 1.03);
        let g = v.goals();
        assert_eq!(g.len(), 5);
        assert_eq!(g[0].met, Some(false), "30 s is over 2 s: {:?}", g[0]);
        assert!(g[0].goal.contains("21000 blocks"), "{:?}", g[0]);
        assert_eq!(g[1].met, Some(false), "2x is under 100x");
        assert!(g[1].measured.starts_with("2.0×"), "{}", g[1].measured);
        assert_eq!(g[2].met, Some(true), "1.03 is within 1.05");
        assert_eq!(g[3].met, Some(false), "1.20 is not");
        assert_eq!(g[4].met, None);
        assert!(g[4].measured.starts_with("not measured: opt-in"));
        let text = v.render();
        assert!(
            text.contains("| **not met** |") && text.contains("| met |"),
            "{text}"
        );
    }

    #[test]
    fn a_run_that_did_not_end_is_refused() {
        let text = clean().replace("LIVECOVER_DONE", "");
        assert!(LiveCover::parse(&text)
            .unwrap_err()
            .contains("LIVECOVER_DONE"));
    }

    #[test]
    fn a_kprobe_count_other_than_the_sample_makes_the_rate_invalid() {
        let v = with("KPROBE_REGISTERED", "499");
        let why = v.arm_rate().unwrap_err();
        assert!(why.contains("499 of the 500"), "{why}");
        let g = &v.goals()[1];
        assert_eq!(g.met, None);
        assert!(g.measured.starts_with("invalid: "), "{}", g.measured);
        assert!(v.render().contains("| invalid |"));
        assert!(with("KPROBE_SAMPLE", "0").arm_rate().is_err());
    }

    #[test]
    fn the_tcp_row_needs_its_proofs() {
        for (key, value, says) in [
            ("TCP_LEFT", "3", "3 site(s) left"),
            ("TCP_OOPS", "1", "oops"),
            ("TCP_STATUS", "1", "exited 1"),
            ("TRAFFIC", "rounds=4 failed=1", "did not run clean"),
            ("TRAFFIC", "rounds=0 failed=0", "did not run clean"),
            ("TCP_TOTAL_REFUSED", "21000", "no block was armed"),
            ("TCP_WHOLE_NS", "soon", "not a number"),
        ] {
            let why = with(key, value).tcp_whole_ms().unwrap_err();
            assert!(why.contains(says), "{key}={value}: {why}");
            assert_eq!(with(key, value).goals()[0].met, None, "{key}={value}");
        }
    }

    #[test]
    fn nan_zero_and_negative_figures_meet_no_goal() {
        // A negative median (a clock gone wrong) or a zero one gives no verdict.
        for bad in ["-100", "0"] {
            let g = &with("BASE_MEDIAN_NS", bad).goals()[2];
            assert_eq!(g.met, None, "{bad}: {g:?}");
            assert!(g.measured.starts_with("not resolvable"), "{}", g.measured);
        }
        // A NaN arm time (0 of 0 blocks would be refused before: here 0 ms over 20,000).
        let g = &with("TCP_ARM_MS", "0").goals()[1];
        assert_eq!(g.met, None, "{g:?}");
        let g = verdict("x", f64::NAN, Bound::AtLeast(1.0), |r| r.to_string());
        assert_eq!(g.met, None);
        // A round that failed makes the once row invalid, not a figure.
        let g = &with("ONCE_direct_ROUNDS", "120 fail 119").goals()[3];
        assert!(
            g.measured.starts_with("invalid: a round did not run"),
            "{g:?}"
        );
    }

    #[test]
    fn the_whole_kernel_row_reports_or_says_why_not() {
        let mut text = clean().replace("LIVECOVER_DONE", "");
        text.push_str(
            "LIVECOVER_ALL_STATUS=0\nLIVECOVER_ALL_WHOLE_NS=600000000000\n\
             LIVECOVER_ALL_TOTAL_FUNCTIONS=40000\nLIVECOVER_ALL_TOTAL_BLOCKS=900000\n\
             LIVECOVER_ALL_TOTAL_REFUSED=700000\nLIVECOVER_ALL_LEFT=0\nLIVECOVER_DONE\n",
        );
        let g = &LiveCover::parse(&text).unwrap().goals()[4];
        assert_eq!(g.met, Some(true));
        assert!(g.measured.contains("200000 armed"), "{}", g.measured);
        let failed = text.replace("ALL_STATUS=0", "ALL_STATUS=1");
        let g = &LiveCover::parse(&failed).unwrap().goals()[4];
        assert_eq!(g.met, Some(false));
        assert!(g.measured.contains("exited 1"), "{}", g.measured);
    }

    #[test]
    fn the_scenario_gets_the_tcp_group() {
        let s = scenario_text().unwrap();
        let mut lines = s.lines();
        assert_eq!(lines.next(), Some("#!/bin/sh"));
        let globs = lines.next().unwrap();
        assert!(
            globs.starts_with("LIVECOVER_GLOBS='tcp_* __tcp_* "),
            "{globs}"
        );
    }
}
