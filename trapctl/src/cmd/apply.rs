//! `trapctl apply SPEC.toml [--best-effort] [--check]`.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use instr_manager::ops::{ApplyReport, CheckReport};
use instr_manager::Spec;
use trapvec_proto::Request;

use crate::route;

/// Apply a splice spec.
#[derive(clap::Args)]
#[command(long_about = "\
Apply a splice spec (TOML: [[component]] path/crc32, [[splice]] at/action/handler/mechanism/cookie,
[[set]] symbol/value/size; see instr-manager's spec module): load its components, apply its
splices and those its components declare (.trapvec.splices, as `trapctl load` does) in one batch,
write its variables. All or nothing: on any error, everything it did is undone (variables it wrote
get their old values) and the error names the culprit.

An `at` may be a glob (`tcp_v4_*`, `nf_*:nf_ct_*`): it stands for the entry of every matching
function (where `at = \"FUNC\"` would go), all in the same batch; a glob matching nothing is an
error. All or nothing, a refusal names the first three refused points and the count.

--best-effort applies every splice that validates and reports each refused one with its reason
(`refused: AT: why`, on stderr; with globs, one line per reason: `refused 12: why (at f, g, h,
...)`); components and variables are still all or nothing. The exit
status is then 3 when any splice was refused (the others stay applied), 1 when nothing could be.

--check only plans: every splice is resolved, planned and put to the module's checks, each
refusal is reported as with --best-effort, and nothing is loaded or changed (the spec's
components must already be loaded for their handlers to resolve).")]
pub struct ApplyArgs {
    /// The spec file; component paths are relative to it.
    pub spec: PathBuf,
    /// Apply what validates, report the rest, exit 3 if anything was refused.
    #[arg(long, conflicts_with = "check")]
    pub best_effort: bool,
    /// Plan and check only; change nothing.
    #[arg(long)]
    pub check: bool,
    /// Print where the time went (planning, trampolines, the text batch) on stderr.
    #[arg(long)]
    pub timings: bool,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &ApplyArgs) -> Result<()> {
    let file = args.spec.display().to_string();
    // Parsed here too, so that a bad spec is reported the same way with or without trapd, and
    // its warnings (an old spelling such as `tgid`) reach the user, not trapd's log. (Parsing
    // only where the request runs saved 40-110 ms at 10,000 splices and lost those warnings.)
    let spec = Spec::from_path(&args.spec)?;
    let path = route::absolute(&args.spec)?;
    let request = Request::Apply {
        spec: path,
        best_effort: args.best_effort,
        check: args.check,
        brief: false,
    };
    if args.check {
        let report: CheckReport = route::read(&request)?;
        return print_check(&report, args.json, spec.splices.len());
    }
    let report: ApplyReport =
        route::change(&request, |_| {}).with_context(|| format!("{file}: nothing was applied"))?;
    if args.json {
        super::splice::print_json(&report)?;
    }
    if !args.json {
        // One write for all the lines: a batch of 10,000 splices printed line by line was
        // 10,000 system calls (stdout is line-buffered).
        let mut out = String::new();
        for c in &report.components {
            let _ = writeln!(out, "loaded {} (crc32 {}) at {}", c.name, c.crc32, c.code);
        }
        for s in &report.spliced {
            let _ = writeln!(
                out,
                "spliced {} at {} by {}: {}",
                s.at, s.site, s.mechanism, s.action
            );
        }
        crate::print(&out)?;
    }
    if let (true, Some(t)) = (args.timings, report.timings) {
        eprintln!(
            "timings: {} splices: plan {:.1} ms, build {:.1} ms, commit {:.1} ms (dispatch entries and one text batch)",
            t.splices, t.plan_ms, t.build_ms, t.commit_ms
        );
    }
    if report.refusals.is_empty() {
        for e in &report.refused {
            eprintln!("refused: {e}");
        }
    } else {
        // A spec with globs: one line per reason, with its count and first points.
        for g in &report.refusals {
            eprintln!("{g}");
        }
    }
    if !report.refused.is_empty() {
        // Exit status 3: what validated stays applied.
        return Err(crate::PartlyApplied(format!(
            "{} of {} splices refused ({} applied)",
            report.refused.len(),
            report.requested,
            report.spliced.len()
        ))
        .into());
    }
    Ok(())
}

/// Print what `apply --check` found (as JSON with `json`), the refusals on stderr; an error
/// when any of the spec's `splices` would be refused.
pub(crate) fn print_check(report: &CheckReport, json: bool, splices: usize) -> Result<()> {
    if json {
        super::splice::print_json(report)?;
    }
    for ok in report.ok.iter().filter(|_| !json) {
        println!(
            "ok {} at {} by {}: displaces `{}`",
            ok.at, ok.site, ok.mechanism, ok.displaced
        );
    }
    for e in &report.refused {
        eprintln!("refused: {e}");
    }
    if !report.refused.is_empty() {
        bail!(
            "{} of {} splices would be refused (nothing was changed)",
            report.refused.len(),
            splices
        );
    }
    Ok(())
}
