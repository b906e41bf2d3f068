//! `trapctl list [--json | --prometheus]`: live splices with their counters, loaded components;
//! `trapctl list --by pid`: the process backend's live splices, grouped by the process they
//! live in.

use anyhow::Result;
use instr_manager::ops::ListReply;
use serde::Serialize;
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
command, and `orphaned` once the command is gone without removing it, as is a splice whose
handler is in the component `trace_PID` of a `trapctl trace` that is gone) and every
loaded component (name, CRC32 of its file, code and data addresses and sizes, how many splices use
it). The saved state is checked against the module first. --json prints one JSON object.

--stats prints what the live sites cost, in bytes per site: the module's code and data arenas in
use, its heap (dispatch entries with their per-CPU counters, arena block records, live-patch
records, pending sets: /sys/module/trapvec/parameters/allocations) and the saved state user space
keeps in the module, each divided by the number of live splices, then their sum.

When trapd runs, the listing is the daemon's: it adds the active profile, whether each splice is
part of it, and any dispatch entry live in the module that no recorded state describes.

--prometheus prints the Prometheus text exposition format (trapvec_splice_hits_total and
trapvec_splice_missed_total per splice, labelled point, site, function, mechanism, action and
handler; the numbers of splices and components), for node_exporter's textfile collector: write
it to a temporary file and rename that into the collector's directory (trapd/README.md, \"Prometheus
metrics\"). trapd serves the same families, and its own, on its `listen` address.

--by pid lists the process backend's splices instead, grouped by the process they live in: every
process that has trapvec's agent mapped (/proc/PID/maps names libtrapvec_agent; those this user
may read) is asked for its listing through its agent's channel, as `trapctl -p PID list` asks
one; a process whose agent does not answer (no channel started: preloaded without
TRAPVEC_CONTROL=1) is named with the reason. Nothing is attached. --json prints
{\"schema\": 1, \"processes\": [{\"pid\", \"comm\", then the process's listing}], \"unanswered\": [...]}.")]
pub struct Args {
    /// Print one JSON object (`"schema": 1` first) instead of tables.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print the Prometheus text exposition format (node_exporter's textfile collector).
    #[arg(long)]
    pub prometheus: bool,
    /// Print the bytes each live site costs (arenas, module heap, saved state) instead.
    #[arg(long, conflicts_with_all = ["json", "prometheus"])]
    pub stats: bool,
    /// Group by pid: the process backend's splices, one group per process with the agent.
    #[arg(long, value_name = "KEY", value_enum, conflicts_with_all = ["prometheus", "stats"])]
    pub by: Option<ListBy>,
}

/// What `--by` groups the listing by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListBy {
    /// The process a splice lives in (process backend).
    Pid,
}

/// `list --by pid --json`: one group per process whose agent answered, then those whose
/// agent did not.
#[derive(Debug, Serialize)]
pub struct ByPid {
    pub processes: Vec<ProcessGroup>,
    pub unanswered: Vec<Unanswered>,
}

/// A process's live splices, as its agent lists them.
#[derive(Debug, Serialize)]
pub struct ProcessGroup {
    pub pid: i32,
    /// Its name (/proc/PID/comm).
    pub comm: String,
    #[serde(flatten)]
    pub listing: ListReply,
}

/// A process with the agent mapped whose agent's channel gave no listing.
#[derive(Debug, Serialize)]
pub struct Unanswered {
    pub pid: i32,
    pub comm: String,
    pub reason: String,
}

/// The file name the agent is mapped by.
const AGENT_SO: &str = "libtrapvec_agent";

/// Whether a /proc/PID/maps text has the agent mapped.
fn maps_the_agent(maps: &str) -> bool {
    maps.lines().any(|l| {
        // The path is the sixth field on, spaces in it included.
        let path = l.split_whitespace().skip(5).collect::<Vec<_>>().join(" ");
        path.starts_with('/')
            && path
                .rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with(AGENT_SO))
    })
}

/// The processes that have the agent mapped, by pid (those whose maps this user may read).
fn agent_pids() -> Result<Vec<i32>> {
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .map_err(|e| anyhow::anyhow!("reading /proc: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| maps_the_agent(&m))
        })
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// Ask every process with the agent for its listing.
fn by_pid() -> Result<ByPid> {
    let mut by = ByPid {
        processes: Vec::new(),
        unanswered: Vec::new(),
    };
    for pid in agent_pids()? {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim_end().to_string())
            .unwrap_or_default();
        let asked = match crate::attach::agent_socket(pid) {
            Some(socket) => crate::attach::ask(pid, &socket, &Request::List),
            None => Err(anyhow::anyhow!(
                "its agent's channel does not answer (not started: preloaded without \
                 TRAPVEC_CONTROL=1, or the process is ending)"
            )),
        };
        match asked {
            Ok(listing) => by.processes.push(ProcessGroup { pid, comm, listing }),
            Err(e) => by.unanswered.push(Unanswered {
                pid,
                comm,
                reason: trapvec::error_chain(e.as_ref()),
            }),
        }
    }
    Ok(by)
}

/// `--by pid`'s text: a header per process, then its listing as `-p PID list` prints it.
fn by_pid_text(by: &ByPid) -> String {
    let mut out = String::new();
    for g in &by.processes {
        out.push_str(&format!(
            "process {} ({}): {} splice(s)\n",
            g.pid,
            g.comm,
            g.listing.listing.splices.len()
        ));
        out.push_str(&crate::attach_cmd::listing_text(g.pid, &g.listing));
    }
    for u in &by.unanswered {
        out.push_str(&format!("process {} ({}): {}\n", u.pid, u.comm, u.reason));
    }
    let splices: usize = by
        .processes
        .iter()
        .map(|g| g.listing.listing.splices.len())
        .sum();
    out.push_str(&format!(
        "{splices} splice(s) in {} process(es) with the agent\n",
        by.processes.len()
    ));
    out
}

/// The module's live allocations, one line per kind (mem.c).
const ALLOCATIONS: &str = "/sys/module/trapvec/parameters/allocations";

/// The heap kinds (mem.c's names) a live site holds; "alias" (virtual mappings, a page each)
/// and "reserved"/"scratch" are not per-site heap.
const SITE_HEAP: [&str; 4] = ["entry", "block", "patch", "pending"];

/// Bytes per site, one line each: `sites N`, then `<part> <bytes> <per-site>`, then `total`.
fn site_stats(sites: u64, code_used: u64, data_used: u64, allocations: &str) -> Vec<String> {
    let mut heap: Vec<(String, u64)> = Vec::new();
    let mut state = 0;
    for l in allocations.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (Some(kind), Some(bytes)) = (w.first(), w.get(2).and_then(|b| b.parse().ok())) else {
            continue;
        };
        if SITE_HEAP.contains(kind) {
            heap.push(((*kind).to_owned(), bytes));
        } else if *kind == "state" {
            state = bytes;
        }
    }
    let heap_bytes: u64 = heap.iter().map(|(_, b)| b).sum();
    let per = |b: u64| match sites {
        0 => "-".to_owned(),
        n => format!("{:.1}", b as f64 / n as f64),
    };
    let detail: Vec<String> = heap.iter().map(|(k, b)| format!("{k} {b}")).collect();
    let total = code_used + data_used + heap_bytes + state;
    vec![
        format!("sites {sites}"),
        format!("code {code_used} bytes, {} per site", per(code_used)),
        format!("data {data_used} bytes, {} per site", per(data_used)),
        format!(
            "heap {heap_bytes} bytes, {} per site ({})",
            per(heap_bytes),
            detail.join(", ")
        ),
        format!("state {state} bytes, {} per site", per(state)),
        format!("total {total} bytes, {} per site (goal: 64)", per(total)),
    ]
}

/// `--stats`: the module's arenas and heap against the live splices.
fn print_stats(sites: usize) -> Result<()> {
    let info = trapvec::kernel::KernelTarget::open()?.module_info()?;
    let allocations = std::fs::read_to_string(ALLOCATIONS)
        .map_err(|e| anyhow::anyhow!("reading {ALLOCATIONS}: {e}"))?;
    for l in site_stats(sites as u64, info.code_used, info.data_used, &allocations) {
        println!("{l}");
    }
    Ok(())
}

pub fn run(args: &Args) -> Result<()> {
    if args.by == Some(ListBy::Pid) {
        let by = by_pid()?;
        if args.json {
            return super::splice::print_json(&by);
        }
        return crate::print(&by_pid_text(&by));
    }
    let mut r: ListReply = route::read(&Request::List)?;
    // Whether an owner is gone is judged here, where its pid was taken (trapd may run in
    // another pid namespace than a trapctl that shares its socket).
    // So is the pid a `trapctl trace` named its component after (`trace_PID`).
    let mut gone = instr_manager::ops::GoneOwners::default();
    for s in &mut r.listing.splices {
        s.orphaned = super::splice::is_orphan(s, &mut gone);
    }
    if args.stats {
        return print_stats(r.listing.splices.len());
    }
    if args.json {
        return super::splice::print_json(&r);
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
                (None, true) => println!(
                    "  orphaned: its handler is in {}, whose `trapctl trace` is gone; `trapctl unsplice --orphans` removes both",
                    s.component.as_deref().unwrap_or("a component")
                ),
                (None, false) => {}
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

#[cfg(test)]
mod tests {
    use super::{maps_the_agent, site_stats};

    #[test]
    fn a_process_has_the_agent_when_its_maps_name_the_library_file() {
        let with = "7f0000000000-7f0000001000 r-xp 00001000 08:01 42 /opt/trapvec/lib/libtrapvec_agent.so\n";
        assert!(maps_the_agent(with));
        let without = "7f0000000000-7f0000001000 r-xp 00001000 08:01 42 /usr/lib/libc.so.6\n\
                       7f0000002000-7f0000003000 rw-p 00000000 00:00 0 \n\
                       7f0000004000-7f0000005000 r--p 00000000 08:01 43 /home/u/libtrapvec_agent/notes.txt\n";
        assert!(!maps_the_agent(without));
    }

    #[test]
    fn stats_divide_arenas_heap_and_state_by_the_sites() {
        let allocations = "entry 2 224\nblock 4 352\npatch 2 200\nalias 3 16793600\npending 0 0\nstate 1 1000\nreserved 1 64\nscratch 0 0\n";
        let s = site_stats(2, 64, 32, allocations);
        assert_eq!(s[0], "sites 2");
        assert_eq!(s[1], "code 64 bytes, 32.0 per site");
        assert_eq!(s[2], "data 32 bytes, 16.0 per site");
        assert_eq!(
            s[3],
            "heap 776 bytes, 388.0 per site (entry 224, block 352, patch 200, pending 0)"
        );
        assert_eq!(s[4], "state 1000 bytes, 500.0 per site");
        assert_eq!(s[5], "total 1872 bytes, 936.0 per site (goal: 64)");
        assert_eq!(
            site_stats(0, 0, 0, "")[5],
            "total 0 bytes, - per site (goal: 64)"
        );
    }
}
