//! `trapctl count FUNCTION --seconds N`: KAPI's count_func. A count-only trap at the function's
//! entry (past the ftrace site): no handler, the dispatcher counts; removed at the end.
//! With `--by tid|pid|comm|cpu`, a keyed count (bpftrace's `@[comm] = count()`): the splice
//! calls the module's counting routine, which counts each hit under its key (`pid` the process,
//! `tid` the thread).

use anyhow::Result;
use instr_manager::ops::SpliceRow;
use instr_manager::splice::SpliceOptions;
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Mechanism;
use serde::Serialize;
use trapvec::keyed::{KeyBy, KeyCount, KeyCounts};

use super::splice::Held;

/// Count a kernel function's calls for a while (N seconds, until Ctrl-C, or while a command runs).
#[derive(clap::Args)]
#[command(long_about = "\
Count the calls of FUNCTION: a trap is spliced at its entry (past the 5-byte ftrace site) with no
handler; the module's dispatcher counts every hit and sends the CPU on through a replay of the
displaced instructions. The count lasts --seconds N, or until SIGINT (Ctrl-C), SIGTERM or SIGHUP
when no --seconds is given, or while `-- COMMAND ARGS` runs. However it ends the splice is
removed and the total and the rate are printed.

Output: first `counting FUNCTION at 0xSITE for N s` (or `until Ctrl-C ...`, `while ... runs`)
once the trap is live (a script can wait for that line before it drives the function), then
`FUNCTION: TOTAL calls in N s (R/s)` (the seconds as measured when not ended by --seconds).
With --mechanism jmp a counting trampoline counts instead (5 bytes written over the entry).
Without trapd, /dev/trapvec is locked while the splice is made and while it is removed, not in
between: other trapctl commands (COMMAND's own too) run meanwhile, and if one changed the state
the removal reads it again first. Through trapd (when one runs) the splice is made and removed by
two requests, and the daemon serves others in between.

Signals, as `perf stat` takes them: SIGINT, SIGTERM and SIGHUP remove the splice and print the
figures, then trapctl ends by that same signal (a shell sees status 128+N and a script stops).
One ignored when trapctl starts (nohup's SIGHUP, a background job's SIGINT) stays ignored. With
a COMMAND, trapctl exits with its status (128+N if it died of signal N); a signal sent to trapctl
by a process is forwarded to the command and trapctl waits for it to exit, while one from the
terminal (Ctrl-C, hangup) reached the command already and is not sent again. The splice records
this command as its owner; if the command is killed by SIGKILL, `trapctl list` shows the splice
as orphaned and `trapctl unsplice --orphans` removes it.

--by tid|pid|comm|cpu counts the calls by who made them, as bpftrace's @[comm] = count():
the splice calls trapvec.ko's counting routine, which reads the key of the current task (tid:
the thread, task->pid; pid: the process, task->tgid, as bpftrace's pid; comm: the 16-byte name;
or cpu) and adds one to that key's entry in a per-CPU table of 256 keys (no locks). `tgid` is
read as `pid`, its old spelling, with a warning on stderr (`pid` was the thread before). A call whose key finds its CPU's table full is counted as overflow, so the keys and the
overflow add up to the calls. The top keys are printed, most calls first, as
`@[KEY]: COUNT` lines (--top K, default 10), then `FUNCTION: TOTAL calls in N s (R/s), K keys
by KEY, overflow O`. --json prints one JSON object (every key unless --top is given) instead.
Without --by, --json prints the figures as one object too (`function`, `site`, `mechanism`,
`seconds`, `ended`, `hits`, `missed`; for a glob `functions`, each with `at`, `site`, `hits`,
`missed`, and `total`), after the `counting ...` line; `\"schema\": 1` comes first in each.

--pid N (the process), --tid N (a thread) and --comm NAME count only the calls of the tasks that match (see `trapctl
splice --help`); with --by, only their keys.")]
pub struct Args {
    /// The function (or any point: `function+offset`, `0xADDRESS`).
    pub function: String,
    #[command(flatten)]
    pub span: crate::hold::Span,
    /// trap (the dispatcher counts) or jmp (a counting trampoline).
    #[arg(long, default_value = "trap", value_parser = super::splice::listed::<Mechanism>(super::splice::MECHANISMS))]
    pub mechanism: Mechanism,
    /// Count by tid (the thread), pid (the process), comm or cpu, and print the top keys.
    #[arg(long, value_name = "KEY", value_parser = super::splice::listed::<KeyBy>(super::splice::KEYS))]
    pub by: Option<KeyBy>,
    /// With --by: print the K keys with the most calls [default: 10; --json: all].
    #[arg(long, value_name = "K", requires = "by")]
    pub top: Option<usize>,
    /// Print one JSON object (`"schema": 1` first) after the `counting ...` line, instead of
    /// the figures' text.
    #[arg(long)]
    pub json: bool,
    /// With a glob FUNCTION: count at what validates, one line per refusal reason, exit 3 if any.
    #[arg(long)]
    pub best_effort: bool,
    /// Count only the calls of some tasks.
    #[command(flatten)]
    pub only: super::splice::OnlyArgs,
}

/// What `--json` prints without --by.
#[derive(Serialize)]
struct PlainReport<'a> {
    function: &'a str,
    site: &'a str,
    mechanism: String,
    /// How long the count was live: the --seconds given, or as measured when something else ended it.
    seconds: f64,
    /// What ended it: `time`, `command`, or the signal (`SIGINT`, `SIGTERM`, `SIGHUP`).
    ended: &'static str,
    hits: u64,
    missed: u64,
}

/// What `--json` prints for a glob: each function's count, most first, and the total.
#[derive(Serialize)]
struct GlobReport<'a> {
    glob: &'a str,
    seconds: f64,
    ended: &'static str,
    total: u64,
    functions: Vec<&'a instr_manager::ops::Unspliced>,
}

/// What `--by KEY --json` prints.
#[derive(Serialize)]
struct Report<'a> {
    function: &'a str,
    site: &'a str,
    mechanism: String,
    by: &'static str,
    /// How long the count was live: the --seconds given, or as measured when something else ended it.
    seconds: f64,
    /// What ended it: `time`, `command`, or the signal (`SIGINT`, `SIGTERM`, `SIGHUP`).
    ended: &'static str,
    /// The splice's hits, and those whose handler was skipped (a trap taken while a handler
    /// ran on that CPU): hits - missed ran the counting routine.
    hits: u64,
    missed: u64,
    /// Every key's count and the overflow (== hits - missed).
    total: u64,
    overflow: u64,
    /// Keys in the table (more than `top` when --top cut it).
    keys_total: usize,
    keys: &'a [KeyCount],
}

pub fn run(args: &Args) -> Result<()> {
    if instr_manager::glob::is_glob(&args.function) {
        return count_glob(args);
    }
    if args.best_effort {
        anyhow::bail!(
            "--best-effort is for a glob (`'tcp_v4_*'`); `{}` is one point",
            args.function
        );
    }
    if let Some(by) = args.by {
        return count_by(args, by);
    }
    let options = SpliceOptions {
        only: args.only.predicate(),
        ..Default::default()
    };
    let request = SpliceRequest {
        at: args.function.clone(),
        action: Action::Count,
        mechanism: args.mechanism,
        options,
    };
    // The hits come with the removal: no figures to read before it.
    let figures = super::splice::Figures {
        what: "the count",
        of_row: |_| Some(()),
        of_splice: |_, _| Ok(Some(())),
    };
    let announce = |row: &SpliceRow| {
        println!(
            "counting {} at {} {}",
            args.function,
            row.site,
            args.span.describe()
        )
    };
    super::splice::for_a_while(&request, &figures, &args.span, announce, |row, held| {
        let removed = &held.removed;
        if args.json {
            return super::splice::print_json(&PlainReport {
                function: &args.function,
                site: &row.site,
                mechanism: row.mechanism.clone(),
                seconds: args.span.seconds_held(&held.ended, held.elapsed),
                ended: held.ended.name(),
                hits: removed.hits,
                missed: removed.missed,
            });
        }
        let secs = held.elapsed.as_secs_f64();
        // Precision: counts below 2^53 are exact as f64; this is only the printed rate.
        #[allow(clippy::cast_precision_loss)]
        let rate = if secs > 0.0 {
            removed.hits as f64 / secs
        } else {
            0.0
        };
        println!(
            "{}: {} calls in {} s ({rate:.1}/s)",
            args.function,
            removed.hits,
            args.span.lasted(&held.ended, held.elapsed)
        );
        Ok(())
    })
}

/// `trapctl count 'GLOB'`: a count at the entry of every matching function, made in one batch
/// and removed in one batch; the functions' counts, most first, then the total.
fn count_glob(args: &Args) -> Result<()> {
    if args.by.is_some() {
        anyhow::bail!(
            "--by counts at one point; `{}` is a glob (count each function by name instead)",
            args.function
        );
    }
    let request = SpliceRequest {
        at: args.function.clone(),
        action: Action::Count,
        mechanism: args.mechanism,
        options: SpliceOptions {
            only: args.only.predicate(),
            ..Default::default()
        },
    };
    let announce = |applied: &instr_manager::ops::ApplyReport| {
        println!(
            "counting {} at {} functions {}",
            args.function,
            applied.spliced.len(),
            args.span.describe()
        )
    };
    super::splice::glob_for_a_while(&request, args.best_effort, &args.span, announce, |held| {
        if args.json {
            let mut functions: Vec<&instr_manager::ops::Unspliced> = held.removed.iter().collect();
            functions.sort_by(|a, b| b.hits.cmp(&a.hits).then_with(|| a.at.cmp(&b.at)));
            return super::splice::print_json(&GlobReport {
                glob: &args.function,
                seconds: args.span.seconds_held(&held.ended, held.elapsed),
                ended: held.ended.name(),
                total: held.removed.iter().map(|u| u.hits).sum(),
                functions,
            });
        }
        print!(
            "{}",
            render_glob(
                &args.function,
                &held.removed,
                &args.span.lasted(&held.ended, held.elapsed),
                held.elapsed
            )
        );
        Ok(())
    })
}

/// The counts of a glob's functions (`FUNCTION: N`), most first, then the total line.
fn render_glob(
    glob: &str,
    removed: &[instr_manager::ops::Unspliced],
    lasted: &str,
    elapsed: std::time::Duration,
) -> String {
    use std::fmt::Write as _;
    let mut rows: Vec<&instr_manager::ops::Unspliced> = removed.iter().collect();
    rows.sort_by(|a, b| b.hits.cmp(&a.hits).then_with(|| a.at.cmp(&b.at)));
    let mut out = String::new();
    for u in &rows {
        let _ = writeln!(out, "{}: {}", u.at, u.hits);
    }
    let total: u64 = removed.iter().map(|u| u.hits).sum();
    let secs = elapsed.as_secs_f64();
    // Precision: counts below 2^53 are exact as f64; this is only the printed rate.
    #[allow(clippy::cast_precision_loss)]
    let rate = if secs > 0.0 { total as f64 / secs } else { 0.0 };
    let _ = writeln!(
        out,
        "{glob}: {total} calls to {} functions in {lasted} s ({rate:.1}/s)",
        removed.len()
    );
    out
}

/// `--by KEY`: a keyed count, made, read before its removal (a removed one has no table), removed.
fn count_by(args: &Args, by: KeyBy) -> Result<()> {
    let request = SpliceRequest {
        at: args.function.clone(),
        action: Action::Count,
        mechanism: args.mechanism,
        options: SpliceOptions {
            by: Some(by),
            only: args.only.predicate(),
            ..Default::default()
        },
    };
    let figures = super::splice::Figures {
        what: "the keyed count",
        of_row: |r| r.keys.clone(),
        of_splice: |sp, id| sp.key_counts(id),
    };
    let announce = |row: &SpliceRow| {
        println!(
            "counting {} at {} by {} {}",
            args.function,
            row.site,
            by.name(),
            args.span.describe()
        )
    };
    super::splice::for_a_while(&request, &figures, &args.span, announce, |row, held| {
        keyed(args, by, row, held)
    })
}

/// Print a keyed count's top keys.
fn keyed(args: &Args, by: KeyBy, row: &SpliceRow, held: Held<KeyCounts>) -> Result<()> {
    let Held {
        figures: counts,
        removed,
        ended,
        elapsed,
    } = held;
    let total = counts.total();
    if args.json {
        let shown = args.top.unwrap_or(usize::MAX).min(counts.keys.len());
        let report = Report {
            function: &args.function,
            site: &row.site,
            mechanism: row.mechanism.clone(),
            by: by.name(),
            seconds: args.span.seconds_held(&ended, elapsed),
            ended: ended.name(),
            hits: removed.hits,
            missed: removed.missed,
            total,
            overflow: counts.overflow,
            keys_total: counts.keys.len(),
            keys: &counts.keys[..shown],
        };
        return super::splice::print_json(&report);
    }
    print!("{}", render(&counts, args.top.unwrap_or(10)));
    let secs = elapsed.as_secs_f64();
    // Precision: counts below 2^53 are exact as f64; this is only the printed rate.
    #[allow(clippy::cast_precision_loss)]
    let rate = if secs > 0.0 { total as f64 / secs } else { 0.0 };
    println!(
        "{}: {total} calls in {} s ({rate:.1}/s), {} keys by {}, overflow {}",
        args.function,
        args.span.lasted(&ended, elapsed),
        counts.keys.len(),
        by.name(),
        counts.overflow
    );
    if removed.hits.saturating_sub(removed.missed) != total {
        // Calls made between the read and the removal: the table is the earlier of the two.
        log::debug!(
            "{} hits ({} missed) at removal, {total} in the table read before",
            removed.hits,
            removed.missed
        );
    }
    Ok(())
}

/// The top `top` keys as bpftrace prints a count map (`@[KEY]: COUNT`), most first, and what
/// the cut left out.
fn render(counts: &KeyCounts, top: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for k in counts.keys.iter().take(top) {
        let _ = writeln!(out, "@[{}]: {}", k.key, k.count);
    }
    let rest = counts.keys.iter().skip(top);
    let (n, sum) = rest.fold((0usize, 0u64), |(n, s), k| (n + 1, s + k.count));
    if n > 0 {
        let _ = writeln!(
            out,
            "@[...]: {sum} ({n} more key{})",
            if n == 1 { "" } else { "s" }
        );
    }
    if counts.overflow > 0 {
        let _ = writeln!(out, "@[overflow]: {}", counts.overflow);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts() -> KeyCounts {
        let keys = [
            ("getppid_b", 2000),
            ("getppid_a", 1000),
            ("sh", 4),
            ("init", 1),
        ];
        KeyCounts {
            keys: keys
                .iter()
                .map(|&(k, c)| KeyCount {
                    key: k.into(),
                    count: c,
                })
                .collect(),
            overflow: 3,
        }
    }

    #[test]
    fn render_prints_the_top_keys_most_first_then_the_rest_and_the_overflow() {
        assert_eq!(
            render(&counts(), 2),
            "@[getppid_b]: 2000\n@[getppid_a]: 1000\n@[...]: 5 (2 more keys)\n@[overflow]: 3\n"
        );
    }

    #[test]
    fn render_names_one_key_left_out_in_the_singular() {
        assert!(render(&counts(), 3).contains("@[...]: 1 (1 more key)\n"));
    }

    #[test]
    fn render_of_every_key_without_overflow_has_no_summary_lines() {
        let c = KeyCounts {
            overflow: 0,
            ..counts()
        };
        assert_eq!(
            render(&c, 10),
            "@[getppid_b]: 2000\n@[getppid_a]: 1000\n@[sh]: 4\n@[init]: 1\n"
        );
    }
}
