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
    // The spec is read where the request is executed (trapd, or this process's splicer): a
    // batch of 10,000 splices is 600 KB of TOML, not to be parsed twice. A request that failed
    // is reported as the spec's own error when the spec is bad, the same with or without trapd.
    let path = route::absolute(&args.spec).map_err(|e| spec_error_or(&args.spec, e))?;
    let request = Request::Apply {
        spec: path,
        best_effort: args.best_effort,
        check: args.check,
    };
    if args.check {
        let report: CheckReport =
            route::read(&request).map_err(|e| spec_error_or(&args.spec, e))?;
        // The count of the spec's splices (globs unexpanded) only goes into the refusal.
        let splices = match report.refused.is_empty() {
            true => 0,
            false => Spec::from_path(&args.spec)?.splices.len(),
        };
        return print_check(&report, args.json, splices);
    }
    let report: ApplyReport = route::change(&request, |_| {})
        .with_context(|| format!("{file}: nothing was applied"))
        .map_err(|e| spec_error_or(&args.spec, e))?;
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

/// The error of reading and parsing the spec at `spec` if it is bad, else `e`: what a failed
/// request reports.
fn spec_error_or(spec: &std::path::Path, e: anyhow::Error) -> anyhow::Error {
    match Spec::from_path(spec) {
        Err(bad) => bad.into(),
        Ok(_) => e,
    }
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
