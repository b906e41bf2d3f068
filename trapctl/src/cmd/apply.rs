//! `trapctl apply SPEC.toml [--best-effort] [--check]`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use instr_manager::apply::{apply_spec, apply_spec_best_effort, request_of, Applied};
use instr_manager::splicer::SpliceRequest;
use instr_manager::Spec;

use crate::kernel::Kernel;

/// Apply a splice spec.
#[derive(clap::Args)]
#[command(long_about = "\
Apply a splice spec (TOML: [[component]] path/crc32, [[splice]] at/action/handler/mechanism/cookie,
[[set]] symbol/value/size; see instr-manager's spec module): load its components, apply its
splices in one batch, write its variables. All or nothing: on any error, everything it did is
undone and the error names the culprit.

--best-effort applies every splice that validates and reports each refused one with its reason
(`refused: AT: why`, on stderr); components and variables are still all or nothing. The exit
status is then non-zero when any splice was refused, although the others stay applied.

--check only plans: every splice is resolved, planned and put to the module's checks, each
refusal is reported as with --best-effort, and nothing is loaded or changed (the spec's
components must already be loaded for their handlers to resolve).")]
pub struct ApplyArgs {
    /// The spec file; component paths are relative to it.
    pub spec: PathBuf,
    /// Apply what validates, report the rest, exit non-zero if anything was refused.
    #[arg(long, conflicts_with = "check")]
    pub best_effort: bool,
    /// Plan and check only; change nothing.
    #[arg(long)]
    pub check: bool,
    /// Print where the time went (planning, trampolines, the text batch) on stderr.
    #[arg(long)]
    pub timings: bool,
}

/// `timings: N splices: plan X ms, build Y ms, commit Z ms` (on stderr).
fn print_timings(k: &Kernel) {
    if let Some(t) = k.splicer.last_batch() {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        eprintln!(
            "timings: {} splices: plan {:.1} ms, build {:.1} ms, commit {:.1} ms (dispatch entries and one text batch)",
            t.splices,
            ms(t.plan),
            ms(t.build),
            ms(t.commit)
        );
    }
}

fn print_applied(k: &Kernel, applied: &Applied) {
    for c in &applied.components {
        if let Some(c) = k.splicer.components().get(*c) {
            println!("loaded {} (crc32 {:#010x}) at {:#x}", c.name, c.file_crc32, c.code_addr);
        }
    }
    for (at, mech, id) in &applied.splices {
        if let Some(s) = k.splicer.get(*id) {
            println!("spliced {at} at {:#x} by {mech}: {}", s.point.site, s.request.action);
        }
    }
}

pub fn run(args: &ApplyArgs) -> Result<()> {
    let spec = Spec::from_path(&args.spec)?;
    let mut k = Kernel::open()?;
    if args.check {
        let requests: Vec<SpliceRequest> = spec.splices.iter().map(request_of).collect();
        let results = k.splicer.plan_each(&requests);
        let mut refused = 0usize;
        for (r, res) in requests.iter().zip(&results) {
            match res {
                Ok((p, plan)) => println!("ok {} at {:#x} by {}: displaces `{}`", r.at, p.site, plan.mechanism, plan.displaced_text()),
                Err(e) => {
                    refused += 1;
                    eprintln!("refused: {e}");
                }
            }
        }
        if refused > 0 {
            bail!("{refused} of {} splices would be refused (nothing was changed)", requests.len());
        }
        return Ok(());
    }
    let file = args.spec.display().to_string();
    let near = k.near();
    if !args.best_effort {
        let applied = apply_spec(&mut k.splicer, &spec, near).with_context(|| format!("{file}: nothing was applied"))?;
        k.commit_or_undo(|sp| undo(sp, &applied))?;
        print_applied(&k, &applied);
        if args.timings {
            print_timings(&k);
        }
        return Ok(());
    }
    let r = apply_spec_best_effort(&mut k.splicer, &spec, near).with_context(|| format!("{file}: nothing was applied"))?;
    k.commit_or_undo(|sp| undo(sp, &r.applied))?;
    print_applied(&k, &r.applied);
    if args.timings {
        print_timings(&k);
    }
    for (_, e) in &r.refused {
        eprintln!("refused: {e}");
    }
    if !r.refused.is_empty() {
        bail!("{} of {} splices refused ({} applied)", r.refused.len(), spec.splices.len(), r.applied.splices.len());
    }
    Ok(())
}

/// Undo an apply whose state could not be saved.
fn undo(sp: &mut instr_manager::splicer::Splicer<trapvec::kernel::KernelTarget>, applied: &Applied) -> Result<()> {
    let ids: Vec<_> = applied.splices.iter().map(|s| s.2).collect();
    if !ids.is_empty() {
        sp.remove(&ids)?;
    }
    for c in applied.components.iter().rev() {
        sp.unload_component(*c)?;
    }
    Ok(())
}
