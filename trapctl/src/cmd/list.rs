//! `trapctl list [--json]`: live splices with their counters, loaded components.

use anyhow::Result;
use serde::Serialize;

use crate::kernel::Kernel;

/// List live splices and loaded components.
#[derive(clap::Args)]
#[command(long_about = "\
List what trapctl made in the running kernel: every live splice (the point as written, the site,
its function and offset, the mechanism, the action, hits, and missed hits: traps taken while a
handler was already running on that CPU, whose handler was skipped, as kprobes' nmissed) and every
loaded component (name, CRC32 of its file, code and data addresses and sizes, how many splices use
it). The saved state is checked against the module first. --json prints one JSON object.")]
pub struct Args {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct SpliceRow {
    point: String,
    site: String,
    function: String,
    offset: u64,
    mechanism: String,
    action: String,
    /// The handler or replacement, if any.
    symbol: Option<String>,
    displaced: String,
    hits: u64,
    missed: u64,
}

#[derive(Serialize)]
struct ComponentRow {
    name: String,
    path: Option<String>,
    crc32: String,
    code: String,
    code_len: usize,
    data: String,
    data_len: usize,
    refs: usize,
}

#[derive(Serialize)]
struct Listing {
    splices: Vec<SpliceRow>,
    components: Vec<ComponentRow>,
}

fn listing(k: &Kernel) -> Result<Listing> {
    let mut splices = Vec::new();
    for s in k.splicer.live() {
        let hits = k.splicer.hits(s.id)?;
        splices.push(SpliceRow {
            point: s.request.at.clone(),
            site: format!("{:#x}", s.point.site),
            function: s.point.function.name.clone(),
            offset: s.point.site - s.point.function.addr,
            mechanism: s.plan.mechanism.to_string(),
            action: s.request.action.to_string(),
            symbol: s.request.action.symbol().map(str::to_string),
            displaced: s.plan.displaced_text.clone(),
            hits: hits.hits,
            missed: hits.missed,
        });
    }
    let components = k
        .splicer
        .components()
        .iter()
        .map(|c| ComponentRow {
            name: c.name.clone(),
            path: c.path.as_ref().map(|p| p.display().to_string()),
            crc32: format!("{:#010x}", c.file_crc32),
            code: format!("{:#x}", c.code_addr),
            code_len: c.code_len,
            data: format!("{:#x}", c.data_addr),
            data_len: c.data.size,
            refs: c.refs(),
        })
        .collect();
    Ok(Listing { splices, components })
}

pub fn run(args: &Args) -> Result<()> {
    let k = Kernel::open()?;
    let l = listing(&k)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&l)?);
        return Ok(());
    }
    if l.splices.is_empty() {
        println!("no splices");
    } else {
        println!("{:<28} {:<18} {:<4} {:<44} {:>10} {:>7}", "POINT", "SITE", "MECH", "ACTION", "HITS", "MISSED");
        for s in &l.splices {
            println!("{:<28} {:<18} {:<4} {:<44} {:>10} {:>7}", s.point, s.site, s.mechanism, s.action, s.hits, s.missed);
        }
    }
    if l.components.is_empty() {
        println!("no components");
    } else {
        println!("{:<20} {:<10} {:<24} {:<24} {:>4}", "COMPONENT", "CRC32", "CODE", "DATA", "REFS");
        for c in &l.components {
            println!(
                "{:<20} {:<10} {:<24} {:<24} {:>4}",
                c.name,
                c.crc32,
                format!("{}+{:#x}", c.code, c.code_len),
                format!("{}+{:#x}", c.data, c.data_len),
                c.refs
            );
        }
    }
    Ok(())
}
