//! `trapctl list [--json | --prometheus]`: live splices with their counters, loaded components.

use anyhow::Result;
use instr_manager::ops::ListReply;
use trapvec_proto::exposition;
use trapvec_proto::Request;

use crate::route;

/// List live splices and loaded components.
#[derive(clap::Args)]
#[command(long_about = "\
List what trapctl made in the running kernel: every live splice (the point as written, the site,
its function and offset, the mechanism, the action, hits, and missed hits: traps taken while a
handler was already running on that CPU, whose handler was skipped, as kprobes' nmissed; for a
return point or a timer also its returns, its missed calls and the calls in progress; for a keyed
count (--count --by KEY) its key, the number of keys in its table, the top key, the overflow
and the total; for a splice that a running `trapctl count` or `trapctl time` holds, that
command, and `orphaned` once the command is gone without removing it) and every
loaded component (name, CRC32 of its file, code and data addresses and sizes, how many splices use
it). The saved state is checked against the module first. --json prints one JSON object.

When trapd runs, the listing is the daemon's: it adds the active profile, whether each splice is
part of it, and any dispatch entry live in the module that no recorded state describes.

--prometheus prints the Prometheus text exposition format (trapvec_splice_hits_total and
trapvec_splice_missed_total per splice, labelled point, site, function, mechanism, action and
handler; the numbers of splices and components), for node_exporter's textfile collector: write
it to a temporary file and rename that into the collector's directory (trapd/README.md, \"Prometheus
metrics\"). trapd serves the same families, and its own, on its `listen` address.")]
pub struct Args {
    /// Print JSON instead of tables.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the Prometheus text exposition format (node_exporter's textfile collector).
    #[arg(long)]
    pub prometheus: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let mut r: ListReply = route::read(&Request::List)?;
    // Whether an owner is gone is judged here, where its pid was taken (trapd may run in
    // another pid namespace than a trapctl that shares its socket).
    for s in &mut r.listing.splices {
        s.orphaned = s
            .owner
            .as_ref()
            .is_some_and(instr_manager::owner::Owner::is_gone);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if args.prometheus {
        print!("{}", exposition::render(&r.listing, None));
        return Ok(());
    }
    let l = &r.listing;
    let daemon = r.daemon.as_ref();
    if let Some(p) = daemon.and_then(|d| d.profile.as_ref()) {
        println!("trapd profile: {p}");
    }
    if l.splices.is_empty() {
        println!("no splices");
    } else {
        println!(
            "{:<28} {:<18} {:<4} {:<44} {:>10} {:>7}",
            "POINT", "SITE", "MECH", "ACTION", "HITS", "MISSED"
        );
        for s in &l.splices {
            println!(
                "{:<28} {:<18} {:<4} {:<44} {:>10} {:>7}",
                s.at, s.site, s.mechanism, s.action, s.hits, s.missed
            );
            if let Some(r) = &s.returns {
                // The hits above are the entries; a return point's own figures below.
                println!(
                    "  returns {}, missed {}, in progress {}",
                    r.returns, r.missed, r.active
                );
            }
            match (&s.owner, s.orphaned) {
                (Some(o), true) => println!("  orphaned: held by {o}, which is gone; `trapctl unsplice --orphans` removes it"),
                (Some(o), false) => println!("  held by {o}"),
                (None, _) => {}
            }
            if let (Some(by), Some(k)) = (s.by, &s.keys) {
                // The table's size; `trapctl list --json` has every key.
                let top = k
                    .keys
                    .first()
                    .map(|t| format!(", most @[{}]: {}", t.key, t.count))
                    .unwrap_or_default();
                println!(
                    "  by {}: {} keys{top}, overflow {}, total {}",
                    by.name(),
                    k.keys.len(),
                    k.overflow,
                    k.total()
                );
            }
        }
    }
    for s in &l.retiring {
        println!(
            "retiring: {} at {} ({}, {}): original bytes back, its code kept until no task is inside it; `trapctl unsplice {}` again finishes it",
            s.at, s.site, s.mechanism, s.action, s.at
        );
    }
    if l.components.is_empty() {
        println!("no components");
    } else {
        println!(
            "{:<20} {:<10} {:<24} {:<24} {:>4}",
            "COMPONENT", "CRC32", "CODE", "DATA", "REFS"
        );
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
    for u in daemon.iter().flat_map(|d| &d.unrecorded) {
        println!(
            "unrecorded dispatch entry at {} (to {}): {} hits; `rmmod trapvec` reverts it",
            u.site, u.dest, u.hits
        );
    }
    for p in daemon.iter().flat_map(|d| d.pending.iter().flatten()) {
        println!(
            "pending point {} ({}): {}; {} hits over {} load(s)",
            p.at, p.action, p.state, p.hits, p.loads
        );
    }
    Ok(())
}
