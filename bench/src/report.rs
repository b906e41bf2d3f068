//! `bench report`: runs cost, batch, sizes, plan and speed, and writes under the results folder
//! JSON and CSV of each, the figures as PNG and SVG ([`crate::plots`]) and `summary.md`.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over `len` steps (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:<32} [{bar:40}] {pos}/{len} {elapsed}/{duration}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// A spinner for a step of unknown length.
pub fn spinner(what: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_message(what.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

use std::fmt::Write as _;
use std::path::PathBuf;

use thiserror::Error;

use crate::batch::{self, BatchError, BatchTiming};
use crate::cost::{self, CostError, CostTable, PAPER_JMP_CYCLES, PAPER_TRAP_CYCLES};
use crate::coverage::{self, human_distance, Coverage, HitCosts, DISTANCES};
use crate::frida::FridaError;
use crate::kernel::{KernelError, Sources};
use crate::peers::{self, Peers};
use crate::plots::{self, PlotError};
use crate::sets::{self, SetOptions};
use crate::sizes::{self, SizesRow, MAX_LEN};
use crate::speed::{self, Speed, SpeedError};

#[derive(Debug, Error)]
pub enum ReportError {
    #[error(transparent)]
    Cost(#[from] CostError),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Peers(#[from] FridaError),
    #[error(transparent)]
    Plot(#[from] PlotError),
    #[error(transparent)]
    Speed(#[from] SpeedError),
    #[error("writing {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serialising {what}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// What `bench report` runs.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    pub sets: SetOptions,
    pub iters: u32,
    pub rounds: u32,
    pub uprobe: bool,
    /// Measure the kernel rows in the VM.
    pub vm: bool,
    pub objdump: bool,
    pub batch: bool,
    /// Run `bench peers` (Frida on the host; fentry, ftrace, livepatch in the VM with `vm`).
    pub peers: bool,
    pub threads: usize,
    pub out: PathBuf,
}

/// What a report run produced.
#[derive(Debug)]
pub struct Report {
    pub summary_path: PathBuf,
    pub files: Vec<PathBuf>,
}

struct Writer {
    out: PathBuf,
    files: Vec<PathBuf>,
}

impl Writer {
    fn text(&mut self, name: &str, text: &str) -> Result<(), ReportError> {
        let path = self.out.join(name);
        std::fs::write(&path, text).map_err(|source| ReportError::Io {
            path: path.clone(),
            source,
        })?;
        self.files.push(path);
        Ok(())
    }

    fn json(
        &mut self,
        name: &str,
        what: &'static str,
        v: &impl serde::Serialize,
    ) -> Result<(), ReportError> {
        let text =
            serde_json::to_string_pretty(v).map_err(|source| ReportError::Json { what, source })?;
        self.text(name, &text)
    }

    fn plots(&mut self, files: [PathBuf; 2]) {
        self.files.extend(files);
    }
}

/// CSV of Table 1: `key,name,median_cycles,p10,p90,emulated`.
pub fn cost_csv(t: &CostTable) -> String {
    let mut s = String::from("key,name,median_cycles,p10,p90,emulated\n");
    for r in &t.rows {
        let _ = writeln!(
            s,
            "{},\"{}\",{:.1},{:.1},{:.1},{}",
            r.key, r.name, r.median, r.p10, r.p90, r.emulated
        );
    }
    s
}

/// CSV of Fig. 4: one row per set, the count of each length.
pub fn sizes_csv(rows: &[SizesRow]) -> String {
    let mut s = String::from("set,functions,instructions");
    for n in 1..=MAX_LEN {
        let _ = write!(s, ",len{n}");
    }
    s.push_str(",padding_bytes,undecodable_functions\n");
    for r in rows {
        let h = &r.histogram;
        let _ = write!(s, "\"{}\",{},{}", r.set, h.functions, h.total());
        for n in 1..=MAX_LEN {
            let _ = write!(s, ",{}", h.counts[n]);
        }
        let _ = writeln!(s, ",{},{}", h.padding_bytes, h.undecodable_functions);
    }
    s
}

/// CSV of Fig. 5: one row per set and distance.
pub fn plan_csv(all: &[Coverage], costs: &HitCosts) -> String {
    let mut s = String::from(
        "set,distance_bytes,points,trap_ok,jmp_rel32,jmp_springboard,neither,trap_coverage,jmp_coverage,trap_cycles,jmp_cycles,jmp_else_trap_cycles\n",
    );
    let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.1}"));
    for c in all {
        for (a, p) in c.at.iter().zip(c.curve(costs)) {
            let _ = writeln!(
                s,
                "\"{}\",{},{},{},{},{},{},{:.4},{:.4},{},{},{}",
                c.set,
                a.distance,
                a.points,
                a.trap_ok,
                a.jmp_rel32,
                a.jmp_springboard,
                a.neither,
                p.trap_coverage,
                p.jmp_coverage,
                f(p.trap_cycles),
                f(p.jmp_cycles),
                f(p.hybrid_cycles)
            );
        }
    }
    s
}

/// Run everything and write the results folder.
pub fn run(opts: &ReportOptions) -> Result<Report, ReportError> {
    std::fs::create_dir_all(&opts.out).map_err(|source| ReportError::Io {
        path: opts.out.clone(),
        source,
    })?;
    let mut w = Writer {
        out: opts.out.clone(),
        files: Vec::new(),
    };

    let bar = spinner("bench cost: cycles per hit");
    let table = cost::measure(opts.iters, opts.rounds, opts.uprobe);
    bar.finish_and_clear();
    let mut table = table?;
    if opts.vm {
        table.add_vm_rows(&opts.sets.repo, opts.sets.image.clone());
    } else {
        table.vm_unavailable = Some("not asked for (--no-vm)".into());
    }
    w.json("cost.json", "the cost table", &table)?;
    w.text("cost.csv", &cost_csv(&table))?;
    w.plots(plots::draw_table1(&opts.out.join("table1"), &table)?);

    let mut batches = Vec::new();
    if opts.batch {
        for mech in [
            instr_manager::Mechanism::Trap,
            instr_manager::Mechanism::Jmp,
        ] {
            let bar = spinner(&format!("bench batch: 10,000 {mech} splices"));
            let b = batch::measure(10_000, mech);
            bar.finish_and_clear();
            batches.push(b?);
        }
        w.json("batch.json", "the batch timings", &batches)?;
    }

    let peers = if opts.peers {
        let bar = spinner("bench peers: Frida here, fentry/ftrace/livepatch in the VM");
        let p = peers::measure(
            &opts.sets.repo,
            opts.iters,
            opts.rounds,
            5,
            true,
            opts.vm,
            false,
        );
        bar.finish_and_clear();
        let p = p?;
        w.json("peers.json", "the peer rows", &p)?;
        w.text("peers.csv", &p.csv())?;
        w.plots(plots::draw_peers(&opts.out.join("peers"), &p.goals())?);
        Some(p)
    } else {
        None
    };

    let bar = spinner("loading vmlinux, kallsyms and modules");
    let loaded = sets::load(&opts.sets);
    bar.finish_and_clear();
    let loaded = loaded?;
    let rows = sizes::sizes(&loaded.sets);
    w.json("sizes.json", "the length histograms", &rows)?;
    w.text("sizes.csv", &sizes_csv(&rows))?;
    w.plots(plots::draw_fig4(&opts.out.join("fig4"), &rows)?);

    let costs = table.hit_costs();
    let mut all = Vec::new();
    for set in loaded.sets.iter().filter(|s| !s.whole_kernel) {
        let bar = progress(
            set.functions.len() as u64,
            &format!("planning {}", set.name),
        );
        let c = coverage::coverage(set, &DISTANCES, opts.threads, &|n| bar.set_position(n));
        bar.finish_and_clear();
        all.push(c);
    }
    let plan_json: Vec<_> = all
        .iter()
        .map(|c| serde_json::json!({ "coverage": c, "curve": c.curve(&costs) }))
        .collect();
    w.json(
        "plan.json",
        "the plan coverage",
        &serde_json::json!({ "costs": costs, "sets": plan_json }),
    )?;
    w.text("plan.csv", &plan_csv(&all, &costs))?;
    if !all.is_empty() {
        w.plots(plots::draw_fig5(&opts.out.join("fig5"), &all, &costs)?);
    }

    let speed = match (&loaded.vmlinux, &loaded.sources) {
        (Some(img), Some(src)) => {
            let s = speed::measure(img, &src.vmlinux, opts.threads, opts.objdump)?;
            w.json("speed.json", "the speed measurement", &s)?;
            Some(s)
        }
        _ => None,
    };

    let mut md = summary(
        &table,
        &batches,
        &rows,
        &all,
        &costs,
        speed.as_ref(),
        loaded.sources.as_ref(),
    );
    if let Some(p) = &peers {
        md.push_str(&peers_summary(p));
    }
    w.text("summary.md", &md)?;
    Ok(Report {
        summary_path: opts.out.join("summary.md"),
        files: w.files,
    })
}

/// The summary's section on the peers (issue 13): the goals, then every row as measured.
pub fn peers_summary(p: &Peers) -> String {
    let mut s = String::from(
        "\n## Beside the peers: BPF fentry, ftrace, livepatch (VM, emulated) and Frida (host)\n\n",
    );
    s.push_str(&p.goals_markdown());
    s.push_str("\nVM rows are emulated time under QEMU TCG (ratios within one guest only); host rows are cycles. Every round:\n\n```\n");
    s.push_str(&p.render());
    s.push_str("```\n\nFiles: peers.json, peers.csv, peers.png/.svg.\n");
    s
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

/// The Markdown summary.
pub fn summary(
    t: &CostTable,
    batches: &[BatchTiming],
    rows: &[SizesRow],
    all: &[Coverage],
    costs: &HitCosts,
    speed: Option<&Speed>,
    sources: Option<&Sources>,
) -> String {
    let mut s = String::from("# trapvec bench report\n\n");
    let _ = writeln!(s, "Generated by `bench report` (bench/README.md says how). Cycle figures are from this host's TSC at {:.2} GHz.\n", t.tsc_ghz);

    s.push_str("## Table 1 today: cost of one hit\n\n![Table 1](table1.png)\n\n");
    s.push_str("| mechanism | median cycles | p10 | p90 |\n|---|---:|---:|---:|\n");
    for r in &t.rows {
        let _ = writeln!(
            s,
            "| {}{} | {:.0} | {:.0} | {:.0} |",
            r.name,
            if r.emulated { " (emulated)" } else { "" },
            r.median,
            r.p10,
            r.p90
        );
    }
    if let Some(why) = &t.uprobe_unavailable {
        let _ = writeln!(s, "| uprobe on the same function | n/a: {why} | | |");
    }
    let _ = writeln!(
        s,
        "\nOverhead over the unpatched call: jmp rel32 {:.0} cycles, jmp rel8 + springboard {:.0}, trap {:.0}. \
         **trap / jmp = {:.0}x**, beside the paper's {:.0}x ({PAPER_TRAP_CYCLES:.0} / {PAPER_JMP_CYCLES:.0} cycles on a Pentium 4, Linux 2.4).",
        costs.jmp_rel32, costs.jmp_springboard, costs.trap, t.trap_over_jmp(), PAPER_TRAP_CYCLES / PAPER_JMP_CYCLES
    );
    if let Some(u) = t.uprobe_over_trap() {
        let _ = writeln!(
            s,
            "The kernel's own uprobe (trace event on) costs {u:.2}x a trapvec trap splice hit."
        );
    }
    match (&t.vm, &t.vm_unavailable) {
        (Some(vm), _) => {
            let _ = writeln!(
                s,
                "\n### Kernel rows, in the VM ({}, {}): emulated\n",
                vm.kernel, vm.point
            );
            s.push_str("Under QEMU TCG these are emulated nanoseconds: only the ratios between rows mean anything.\n\n| mechanism | emulated ns per call | overhead |\n|---|---:|---:|\n");
            for r in &vm.rows {
                let _ = writeln!(
                    s,
                    "| {} (emulated) | {:.0} | {:.0} |",
                    r.name,
                    r.ns,
                    vm.overhead(&r.key).unwrap_or(0.0)
                );
            }
            if let (Some(a), Some(b)) = (vm.trap_over_jmp(), vm.trap_over_kprobe()) {
                let _ = writeln!(
                    s,
                    "\nIn the guest: trap / jmp = {a:.1}x, trap / kprobe = {b:.2}x (kprobe with tracing_on=0)."
                );
            }
            for n in &vm.notes {
                let _ = writeln!(s, "\nNote: {n}.");
            }
        }
        (None, Some(why)) => {
            let _ = writeln!(s, "\nKernel rows (VM): not measured: {why}.");
        }
        (None, None) => {}
    }
    s.push_str("\n### Issue 2's targets\n\n| target | measured | verdict |\n|---|---:|---|\n");
    let _ = writeln!(
        s,
        "| trap splice hit overhead <= 1.25x the minimal C SIGSEGV handler | {:.2}x | {} |",
        t.trap_over_floor(),
        verdict(t.trap_over_floor() <= 1.25)
    );
    let _ = writeln!(
        s,
        "| jmp `call` splice hit overhead <= 20 ns | {:.1} ns | {} |",
        t.jmp_overhead_ns(),
        verdict(t.jmp_overhead_ns() <= 20.0)
    );
    for b in batches {
        for (what, ms) in [("apply", b.apply_ms), ("remove", b.remove_ms)] {
            let _ = writeln!(
                s,
                "| {what} {} {} splices in one batch <= 100 ms | {ms:.1} ms | {} |",
                b.splices,
                b.mechanism,
                verdict(ms <= 100.0)
            );
        }
    }

    s.push_str("\n## Fig. 4 today: instruction lengths\n\n![Fig. 4](fig4.png)\n\n");
    if let Some(src) = sources {
        let _ = writeln!(
            s,
            "vmlinux extracted from `{}` ({}); function bounds from {}.\n",
            src.vmlinuz.display(),
            src.compression,
            src.kallsyms
        );
    }
    s.push_str("| set | functions | instructions |");
    for n in 1..=MAX_LEN {
        let _ = write!(s, " {n} |");
    }
    s.push_str(" >= 5 | mean |\n|---|---:|---:|");
    for _ in 0..=MAX_LEN + 1 {
        s.push_str("---:|");
    }
    s.push('\n');
    for r in rows {
        let h = &r.histogram;
        let _ = write!(s, "| {} | {} | {} |", r.set, h.functions, h.total());
        for n in 1..=MAX_LEN {
            let _ = write!(s, " {:.1} |", 100.0 * h.share(n));
        }
        let _ = writeln!(
            s,
            " {:.1} | {:.2} |",
            100.0 * h.share_at_least(5),
            h.mean_len()
        );
    }
    s.push_str("\nPercent of instructions by length. The `call __fentry__` at traced functions' entries is counted as the 5-byte NOP the running kernel has made of it; trailing int3/NOP fill is left out.\n");

    s.push_str("\n## Fig. 5 today: what the planner says, and the expected cost\n\n![Fig. 5](fig5.png)\n\n");
    let _ = writeln!(s, "Every instruction boundary of each set asked of trapvec's planner, with the patch buffer at each distance. Costs per hit: trap {:.0}, jmp rel32 {:.0}, jmp rel8 + springboard {:.0} cycles (Table 1).\n", costs.trap, costs.jmp_rel32, costs.jmp_springboard);
    s.push_str("| set | points | trap | jmp rel32 | jmp rel8 + springboard | neither | cycles/hit jmp-else-trap (near) | beyond ±2 GiB: trap | jmp |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for c in all {
        let near = &c.at[0];
        let far = c.at.last().unwrap_or(near);
        let pct = |n: u64, of: &coverage::AtDistance| 100.0 * n as f64 / of.points.max(1) as f64;
        let curve = c.curve(costs);
        let _ = writeln!(
            s,
            "| {} | {} | {:.1}% | {:.1}% | {:.1}% | {:.1}% | {:.0} | {:.1}% | {:.1}% |",
            c.set,
            near.points,
            pct(near.trap_ok, near),
            pct(near.jmp_rel32, near),
            pct(near.jmp_springboard, near),
            pct(near.neither, near),
            curve[0].hybrid_cycles.unwrap_or(f64::NAN),
            pct(far.trap_ok, far),
            pct(far.jmp_rel32 + far.jmp_springboard, far)
        );
    }
    if let Some(c) = all.first() {
        let _ = writeln!(
            s,
            "\n\"near\" is {}; \"beyond\" is {}. Per-distance figures are in plan.csv.",
            human_distance(c.at[0].distance),
            human_distance(c.at.last().map_or(0, |a| a.distance))
        );
    }

    if let Some(sp) = speed {
        s.push_str("\n## Speed of the analysis\n\n```\n");
        s.push_str(&sp.render());
        s.push_str("```\n");
    }
    s.push_str("\n## Files\n\ncost.json/.csv, batch.json, sizes.json/.csv, plan.json/.csv, speed.json; table1, fig4, fig5 as .png and .svg.\n");
    s
}
