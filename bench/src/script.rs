//! `bench script`: how long a one-liner of `trapctl trace` takes from its text to its planned
//! splices on the host (issue 29's goal: under 10 ms, where bpftrace spends about 120 ms in
//! LLVM on a one-liner). Each one-liner's probes are the benchmark fixture's functions, loaded
//! into this process; one run is what `trapctl trace --process` does before it starts the
//! program: compile (`trapvec_script::compile`, globs expanded over the fixture's ELF symbols),
//! write the component, parse the spec, load the component into this process's repository (the
//! planner needs its handlers' addresses), and plan every splice against this process
//! ([`instr_manager::ops::check`]: the planner and the validator, changing no code). A
//! one-liner some probe of which the planner refuses is an error naming it: a figure of a plan
//! that failed would be no figure.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use instr_manager::glob::{is_glob, FunctionGlob};
use instr_manager::image::CodeImage;
use instr_manager::session::Session;
use instr_manager::spec::Spec;
use serde::Serialize;

use crate::fixtures::Fixture;

/// The one-liners timed: one of each kind of probe and map, as docs/trace.md shows them.
pub const ONE_LINERS: &[&str] = &[
    "bench_target { @[comm] = count() }",
    "bench_target /arg0 > 4096 && pid != 1/ { @big = count(); @sum = sum(arg0) }",
    "bench_target:return { @r = hist(retval) }",
    "bench_target { @v[*(u32 *)(arg1 + 4)] = count(); @l = lhist(arg0, 0, 100, 10) }",
    "bench_target* { @[func] = count() }",
];

/// One one-liner's figures: medians over the runs, in microseconds.
#[derive(Debug, Serialize)]
pub struct Row {
    pub program: String,
    pub probes: usize,
    pub compile_us: f64,
    pub plan_us: f64,
    pub total_us: f64,
    pub runs: usize,
}

/// Time every one-liner of [`ONE_LINERS`] `runs` times.
pub fn measure(runs: usize) -> Result<Vec<Row>> {
    let fx = Fixture::build()?;
    // The fixture's functions must be mapped in this process for the planner to find them.
    fx.sym("bench_target")?;
    let session = Session::open()?;
    session.refresh_symbols()?;
    let dir = tempfile::tempdir().context("a temporary directory")?;
    ONE_LINERS
        .iter()
        .map(|p| time_one(&session, &fx.so, dir.path(), p, runs.max(1)))
        .collect()
}

fn time_one(session: &Session, so: &Path, dir: &Path, program: &str, runs: usize) -> Result<Row> {
    let image = CodeImage::from_path(so).with_context(|| format!("reading {}", so.display()))?;
    let mut compile = Vec::with_capacity(runs);
    let mut plan = Vec::with_capacity(runs);
    let mut probes = 0;
    for _ in 0..runs {
        let start = Instant::now();
        let compiled = trapvec_script::compile(
            program,
            &trapvec_script::Options {
                allow_changes: false,
                slots: trapvec_script::DEFAULT_SLOTS,
                dump_path: dir.join("maps.bin").display().to_string(),
                kernel: None,
            },
            &mut |_object: Option<&str>, name: &str| expand(&image, name),
        )
        .map_err(|e| anyhow::anyhow!("`{program}`: {e}"))?;
        let object = dir.join("trace.o");
        std::fs::write(&object, &compiled.object)
            .with_context(|| format!("writing {}", object.display()))?;
        let text = compiled.spec(&object.display().to_string(), "libc.so.6:exit");
        compile.push(start.elapsed());
        let start = Instant::now();
        let spec = Spec::parse(&text, dir, &dir.join("trace.toml"))
            .with_context(|| format!("the spec of `{program}`"))?;
        let component = session
            .load(&object)
            .with_context(|| format!("loading the component of `{program}`"))?;
        let report = session.with(|sp| instr_manager::ops::check(sp, &spec));
        plan.push(start.elapsed());
        drop(component);
        if !report.refused.is_empty() {
            bail!("`{program}`: refused: {}", report.refused.join("; "));
        }
        probes = compiled.splices.len();
    }
    let total: Vec<Duration> = compile.iter().zip(&plan).map(|(c, p)| *c + *p).collect();
    Ok(Row {
        program: program.to_string(),
        probes,
        compile_us: median_us(compile),
        plan_us: median_us(plan),
        total_us: median_us(total),
        runs,
    })
}

/// A probe's name as the functions it stands for: a glob over the fixture's functions.
fn expand(image: &CodeImage, name: &str) -> Result<Vec<String>, String> {
    if !is_glob(name) {
        return Ok(vec![name.to_string()]);
    }
    let glob = FunctionGlob::new(name).map_err(|e| e.to_string())?;
    Ok(image.functions_matching(&glob))
}

fn median_us(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

/// The rows as text, with the goal and bpftrace's figure beside them.
pub fn print(rows: &[Row]) {
    println!("one-liner: compile + plan on the host (median of runs; goal < 10 ms; bpftrace's LLVM start of a one-liner: about 120 ms, cited, not measured here)");
    for r in rows {
        println!(
            "{:>9.1} us total  {:>8.1} compile  {:>8.1} plan  {:>3} probe(s)  {}",
            r.total_us, r.compile_us, r.plan_us, r.probes, r.program
        );
    }
    let worst = rows.iter().map(|r| r.total_us).fold(0.0, f64::max);
    println!(
        "slowest: {:.2} ms: goal {}",
        worst / 1e3,
        if worst < 10_000.0 { "met" } else { "NOT met" }
    );
}
