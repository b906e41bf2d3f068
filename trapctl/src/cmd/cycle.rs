//! `trapctl cycle AT ... --times N` (hidden): splice and unsplice the same point N times in one
//! process, checking after every removal that the function's bytes are the originals. A test aid
//! for stress scenarios (a trapctl process per cycle would spend its time reading kallsyms);
//! nothing stays spliced, so the saved state is not touched. SIGINT, SIGTERM and SIGHUP are
//! taken between cycles ([`crate::hold::Watch`]): the cycle in progress ends with its removal,
//! the cycles made are printed, and trapctl ends by the signal; a splice the state does not
//! know is never left behind.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use instr_manager::splicer::{Action, SpliceRequest};
use instr_manager::Mechanism;
use trapvec::error::hex;
use trapvec::Target;

use crate::kernel::Kernel;

/// Splice and unsplice a point N times (test aid).
#[derive(clap::Args)]
#[command(long_about = "\
Splice AT and remove the splice again, N times, in one process; after every removal the whole
function is read back and compared with its bytes before the first cycle. --call or --replace
as for `splice` (neither: a count-only splice). --mechanism both alternates trap and jmp. Prints
the cycles made, the hits counted and the time taken. A test aid (hidden from --help).")]
pub struct Args {
    /// `function`, `function+offset` or `0xADDRESS`.
    pub at: String,
    /// Run this component function at the point.
    #[arg(long, value_name = "SYM", conflicts_with = "replace")]
    pub call: Option<String>,
    /// Run this component function instead of the function.
    #[arg(long, value_name = "SYM")]
    pub replace: Option<String>,
    /// trap, jmp, or both (alternating).
    #[arg(long, default_value = "trap", value_parser = ["trap", "jmp", "both"])]
    pub mechanism: String,
    /// Number of cycles.
    #[arg(long, value_name = "N")]
    pub times: u32,
}

pub fn run(args: &Args) -> Result<()> {
    let action = match (&args.call, &args.replace) {
        (Some(h), None) => Action::Call {
            handler: h.clone(),
            cookie: 0,
        },
        (None, Some(f)) => Action::Replace { with: f.clone() },
        _ => Action::Count,
    };
    let mechanisms: Vec<Mechanism> = match args.mechanism.as_str() {
        "both" => vec![Mechanism::Trap, Mechanism::Jmp],
        m => vec![m.parse().map_err(anyhow::Error::msg)?],
    };
    crate::route::direct_only("cycle")?;
    let watch = crate::hold::Watch::start()?;
    let mut k = Kernel::open()?;
    let point = k.splicer.resolve(&args.at)?;
    let function = point.function.clone();
    let len = usize::try_from(function.size).context("function size")?;
    let original = k.target().read(function.addr, len)?;
    let start = Instant::now();
    let mut hits = 0u64;
    let mut made = 0u32;
    let mut stopped = None;
    for i in 0..args.times {
        if let Some(signal) = watch.pending()? {
            stopped = Some(signal);
            break;
        }
        let mechanism = mechanisms[i as usize % mechanisms.len()];
        let request = SpliceRequest {
            at: args.at.clone(),
            action: action.clone(),
            mechanism,
            options: Default::default(),
        };
        let id = k
            .splicer
            .apply(std::slice::from_ref(&request))
            .with_context(|| format!("cycle {i}: splicing by {mechanism}"))?[0];
        hits += k
            .splicer
            .remove(&[id])
            .with_context(|| format!("cycle {i}: unsplicing"))?[0]
            .hits;
        let now = k.target().read(function.addr, len)?;
        if now != original {
            let at = now
                .iter()
                .zip(&original)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            bail!(
                "cycle {i} ({mechanism}): {}+{at:#x} holds {} after the splice was removed, not {}",
                function.name,
                hex(&now[at..(at + 8).min(len)]),
                hex(&original[at..(at + 8).min(len)])
            );
        }
        made += 1;
    }
    println!(
        "{made} cycles of {} at {:#x} ({}): every byte of {} ({len} bytes) restored each time; {hits} hits; {:.1} s",
        args.mechanism,
        point.site,
        action,
        function.name,
        start.elapsed().as_secs_f64()
    );
    match stopped {
        Some(signal) => crate::hold::finish(&watch, crate::hold::Ended::Signal(signal)),
        None => Ok(()),
    }
}
