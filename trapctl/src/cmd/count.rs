//! `trapctl count FUNCTION --seconds N`: KAPI's count_func. A count-only trap at the function's
//! entry (past the ftrace site): no handler, the dispatcher counts; removed at the end.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Mechanism;
use trapd::client;
use instr_manager::ops::{self, Unspliced};

use crate::kernel::Kernel;
use crate::route;

/// Count a kernel function's calls for a while.
#[derive(clap::Args)]
#[command(long_about = "\
Count the calls of FUNCTION for N seconds: a trap is spliced at its entry (past the 5-byte
ftrace site) with no handler; the module's dispatcher counts every hit and sends the CPU on
through a replay of the displaced instructions. When the time is up the splice is removed and
the total and the rate are printed.

Output: first `counting FUNCTION at 0xSITE for N s` once the trap is live (a script can wait for
that line before it drives the function), then `FUNCTION: TOTAL calls in N s (R/s)`.
With --mechanism jmp a counting trampoline counts instead (5 bytes written over the entry).
Without trapd, /dev/trapvec stays locked while counting: other trapctl commands wait until the
count is over. Through trapd (when one runs) the splice is made and removed by two requests, and
the daemon serves others in between. The splice is recorded while it lives, so if this command
is killed `trapctl unsplice FUNCTION` removes it.")]
pub struct Args {
    /// The function (or any point: `function+offset`, `0xADDRESS`).
    pub function: String,
    /// How long to count.
    #[arg(long, value_name = "N")]
    pub seconds: f64,
    /// trap (the dispatcher counts) or jmp (a counting trampoline).
    #[arg(long, default_value = "trap", value_parser = super::splice::parse_mechanism)]
    pub mechanism: Mechanism,
}

pub fn run(args: &Args) -> Result<()> {
    if !(args.seconds.is_finite() && args.seconds >= 0.0) {
        anyhow::bail!("--seconds {} is not a duration", args.seconds);
    }
    let request = SpliceRequest { at: args.function.clone(), action: Action::Count, mechanism: args.mechanism, options: Default::default() };
    if client::is_listening(route::socket()) {
        // Through trapd: two requests; the daemon serves others in between.
        let row = super::splice::make(&request)?;
        return count(args, &row.site, super::splice::remove);
    }
    // Straight to the module, which stays locked for the whole count.
    let mut k = Kernel::open()?;
    let (row, made) = ops::splice(&mut k.splicer, &request)?;
    // Saved while it lives: if this command is killed, the next trapctl knows the splice.
    k.commit_or_undo(&made)?;
    count(args, &row.site, |site| {
        let removed = ops::unsplice(&mut k.splicer, site)?;
        k.save()?;
        Ok(removed)
    })
}

/// Announce the live splice at `site`, wait, `remove` it, print the total and the rate.
fn count(args: &Args, site: &str, remove: impl FnOnce(&str) -> Result<Unspliced>) -> Result<()> {
    println!("counting {} at {site} for {} s", args.function, args.seconds);
    std::io::stdout().flush()?;
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(args.seconds));
    // By the site: the point as written could name a different splice made meanwhile.
    let removed = remove(site)?;
    let elapsed = start.elapsed().as_secs_f64();
    // Precision: counts below 2^53 are exact as f64; this is only the printed rate.
    #[allow(clippy::cast_precision_loss)]
    let rate = if elapsed > 0.0 { removed.hits as f64 / elapsed } else { 0.0 };
    println!("{}: {} calls in {} s ({rate:.1}/s)", args.function, removed.hits, args.seconds);
    Ok(())
}
