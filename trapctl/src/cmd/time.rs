//! `trapctl time FUNCTION --seconds N [--clock wall|cpu]`: per-call latency of a kernel function
//! as a log2 histogram (bpftrace's `hist()`), from a timer: a return point whose entry half reads
//! the clock and whose return half adds the elapsed time to per-CPU buckets in the module.

use anyhow::Result;
use instr_manager::ops::SpliceRow;
use instr_manager::splice::{SpliceOptions, When};
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Mechanism;
use serde::Serialize;
use trapvec::returns::{Clock, Histogram, ReturnStats};

use super::splice::Held;

/// Time a kernel function's calls for a while (N seconds, until Ctrl-C, or while a command runs).
#[derive(clap::Args)]
#[command(long_about = "\
Time every call of FUNCTION for --seconds N (or until SIGINT, SIGTERM or SIGHUP, or while
`-- COMMAND ARGS` runs) and print the latencies as a log2 histogram (as
bpftrace's hist()), with the number of calls, the mean, the 50th and 99th percentiles and the
maximum, in nanoseconds. A timer is a return point: at the function's entry (past the 5-byte
ftrace site) the module takes an instance, reads the clock and points the call's return address
at one of its stubs; when the function returns the stub reads the clock again and adds the
difference to per-CPU buckets (no locks). Nested and recursive calls are timed each. The
percentiles are the upper ends of their buckets (never above the maximum).

  --clock wall   elapsed time (ktime_get_mono_fast_ns): sleeping and waiting count
  --clock cpu    the task's time on a CPU (the scheduler's sum_exec_runtime plus the running
                 part since its last update): time asleep or preempted does not count

Calls in progress when the timer starts or stops are not counted; a call that found no free
instance (--maxactive, default 256, or the pool of 4096) or its CPU already in the return
runtime is counted as missed. Output: first `timing FUNCTION at 0xSITE for N s (CLOCK clock)`
once the timer is live, then the histogram and `FUNCTION: COUNT calls, mean ..., p50 ...,
p99 ..., max ... (ns), missed M`. --json prints one JSON object instead of the histogram and the
last line. --pid (the process), --tid (a thread) and --comm time only the calls of the tasks
that match (see `trapctl splice --help`). Through trapd (when one runs) the timer is made, read and removed by three requests.

Signals and COMMAND as for `trapctl count` (see its --help): SIGINT, SIGTERM and SIGHUP remove
the timer and print its figures, then trapctl ends by that signal; with a COMMAND its exit status
is trapctl's; a timer left by a trapctl killed by SIGKILL is orphaned (`trapctl unsplice
--orphans`). The JSON's `seconds` is then the time measured and `ended` says what ended it
(`time`, `command`, `SIGINT`, `SIGTERM`, `SIGHUP`).")]
pub struct Args {
    /// The function (its entry).
    pub function: String,
    #[command(flatten)]
    pub span: crate::hold::Span,
    /// wall (elapsed) or cpu (on-CPU time of the task).
    #[arg(long, default_value = "wall", value_parser = super::splice::listed::<Clock>(super::splice::CLOCKS))]
    pub clock: Clock,
    /// trap (the dispatcher runs the entry half) or jmp (a call trampoline does).
    #[arg(long, default_value = "trap", value_parser = super::splice::listed::<Mechanism>(super::splice::MECHANISMS))]
    pub mechanism: Mechanism,
    /// Most calls in progress at once; more are counted as missed [default: 256].
    #[arg(long, value_name = "N")]
    pub maxactive: Option<u32>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// With a glob FUNCTION: time what validates, one line per refusal reason, exit 3 if any.
    #[arg(long)]
    pub best_effort: bool,
    /// Time only the calls of some tasks.
    #[command(flatten)]
    pub only: super::splice::OnlyArgs,
}

/// What `--json` prints.
#[derive(Serialize)]
struct Report<'a> {
    function: &'a str,
    site: &'a str,
    clock: &'static str,
    /// How long the timer was live: the --seconds given, or as measured when something else ended it.
    seconds: f64,
    /// What ended it: `time`, `command`, or the signal (`SIGINT`, `SIGTERM`, `SIGHUP`).
    ended: &'static str,
    count: u64,
    mean_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
    max_ns: u64,
    missed: u64,
    histogram: &'a Histogram,
}

pub fn run(args: &Args) -> Result<()> {
    let request = SpliceRequest {
        at: args.function.clone(),
        action: Action::Time { clock: args.clock },
        mechanism: args.mechanism,
        options: SpliceOptions {
            when: When::Return,
            maxactive: args.maxactive,
            by: None,
            only: args.only.predicate(),
            owner: None,
        },
    };
    if instr_manager::glob::is_glob(&args.function) {
        return time_glob(args, &request);
    }
    if args.best_effort {
        anyhow::bail!(
            "--best-effort is for a glob (`'tcp_v4_*'`); `{}` is one point",
            args.function
        );
    }
    let figures = super::splice::Figures {
        what: "the timer",
        of_row: |r| r.returns.clone(),
        of_splice: |sp, id| sp.return_stats(id),
    };
    let announce = |row: &SpliceRow| {
        println!(
            "timing {} at {} {} ({} clock)",
            args.function,
            row.site,
            args.span.describe(),
            args.clock.name()
        )
    };
    super::splice::for_a_while(&request, &figures, &args.span, announce, |row, held| {
        report(args, row, held)
    })
}

/// `trapctl time 'GLOB'`: a timer at the entry of every matching function, made in one batch
/// and removed in one batch; one line per function, most calls first, then the histogram of
/// every call and its summary.
fn time_glob(args: &Args, request: &SpliceRequest) -> Result<()> {
    let announce = |applied: &instr_manager::ops::ApplyReport| {
        println!(
            "timing {} at {} functions {} ({} clock)",
            args.function,
            applied.spliced.len(),
            args.span.describe(),
            args.clock.name()
        )
    };
    super::splice::glob_for_a_while(request, args.best_effort, &args.span, announce, |held| {
        print!("{}", render_glob(&args.function, &held.rows));
        Ok(())
    })
}

/// A glob's timers: `FUNCTION: COUNT calls, mean ..., p99 ..., max ... (ns), missed M` per
/// function, most calls first, then every call's histogram and its summary line.
fn render_glob(glob: &str, rows: &[SpliceRow]) -> String {
    use std::fmt::Write as _;
    let mut timed: Vec<(&str, ReturnStats)> = rows
        .iter()
        .map(|r| (r.at.as_str(), r.returns.clone().unwrap_or_default()))
        .collect();
    let count = |st: &ReturnStats| st.histogram.as_ref().map_or(0, Histogram::count);
    timed.sort_by(|a, b| count(&b.1).cmp(&count(&a.1)).then_with(|| a.0.cmp(b.0)));
    let mut all = Histogram::default();
    let mut missed = 0;
    let mut out = String::new();
    for (at, st) in &timed {
        let h = st.histogram.clone().unwrap_or_default();
        let _ = writeln!(
            out,
            "{at}: {} calls, mean {}, p99 {}, max {} (ns), missed {}",
            h.count(),
            h.mean(),
            h.percentile(99.0),
            h.max,
            st.missed
        );
        if all.buckets.len() < h.buckets.len() {
            all.buckets.resize(h.buckets.len(), 0);
        }
        for (a, b) in all.buckets.iter_mut().zip(&h.buckets) {
            *a += b;
        }
        all.sum += h.sum;
        all.max = all.max.max(h.max);
        missed += st.missed;
    }
    out.push_str(&all.render());
    let _ = writeln!(
        out,
        "{glob}: {} calls to {} functions, mean {}, p50 {}, p99 {}, max {} (ns), missed {missed}",
        all.count(),
        timed.len(),
        all.mean(),
        all.percentile(50.0),
        all.percentile(99.0),
        all.max
    );
    out
}

/// Print a timer's figures.
pub(crate) fn report(args: &Args, row: &SpliceRow, held: Held<ReturnStats>) -> Result<()> {
    let st = held.figures;
    let h = st.histogram.clone().unwrap_or_default();
    if args.json {
        let report = Report {
            function: &args.function,
            site: &row.site,
            clock: args.clock.name(),
            seconds: args.span.seconds_held(&held.ended, held.elapsed),
            ended: held.ended.name(),
            count: h.count(),
            mean_ns: h.mean(),
            p50_ns: h.percentile(50.0),
            p99_ns: h.percentile(99.0),
            max_ns: h.max,
            missed: st.missed,
            histogram: &h,
        };
        return super::splice::print_json(&report);
    }
    print!("{}", h.render());
    println!(
        "{}: {} calls, mean {}, p50 {}, p99 {}, max {} (ns), missed {}",
        args.function,
        h.count(),
        h.mean(),
        h.percentile(50.0),
        h.percentile(99.0),
        h.max,
        st.missed
    );
    Ok(())
}
