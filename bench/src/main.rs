//! `bench`: jmp-vs-trap benchmarking and kernel-code analysis (the trap-based-modification
//! paper's Table 1, Fig. 4 and Fig. 5 redone). See bench/README.md for each subcommand.

use std::path::PathBuf;

use anyhow::{Context, Result};
use bench::coverage::{self, human_distance, HitCosts, DISTANCES};
use bench::groups::Group;
use bench::sets::{self, SetOptions};
use bench::{batch, cost, livecover, peers, report, script, sizes, speed};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bench",
    about = "jmp-vs-trap benchmarks and kernel-code analysis of trapvec"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Table 1 today: cycles per hit of each mechanism on this machine (process backend).
    Cost {
        #[command(flatten)]
        cost: CostArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Time to apply and to remove N splices in one batch.
    Batch {
        #[arg(long, default_value_t = 10_000)]
        splices: usize,
        #[arg(long, value_enum, default_value_t = Mech::Trap)]
        mechanism: Mech,
    },
    /// Live coverage at scale (issue 27's goals) in the VM (emulated): the TCP group armed
    /// through trapd under traffic, the arm rate vs kprobes, once mode after warm-up; with
    /// --whole-kernel every traceable function at once.
    Cover {
        /// Also cover every function of available_filter_functions at once (LIVECOVER_WHOLE=1;
        /// a 3 GiB guest, long under TCG).
        #[arg(long)]
        whole_kernel: bool,
        /// kprobes registered on a sample of this many of the TCP group's sites.
        #[arg(long, default_value_t = 500)]
        sample: u32,
        /// Timed runs of the once-mode workload per configuration (and twice that unspliced).
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Loopback TCP connections per run of the workload (tcpmss -n).
        #[arg(long, default_value_t = 60)]
        conns: u32,
        /// Read the figures from a console log saved by an earlier run instead of booting.
        #[arg(long, value_name = "FILE")]
        from_log: Option<PathBuf>,
        /// Write the guest's console log here too.
        #[arg(long, value_name = "FILE")]
        save_log: Option<PathBuf>,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Beside the peers (issue 13): Frida on this host; with --vm BPF fentry, ftrace and
    /// livepatch in the VM (emulated); each goal with its ratio.
    Peers {
        /// Calls per round of the hit rows.
        #[arg(long, default_value_t = 2000)]
        iters: u32,
        /// Rounds of the hit rows; the median round is reported.
        #[arg(long, default_value_t = 31)]
        rounds: u32,
        /// Rounds of the 1,000-function attach (Frida and trapvec's batch).
        #[arg(long, default_value_t = 5)]
        attach_rounds: u32,
        /// Also run the guest rows (vmtest, vmtest/scenarios/peers.sh; minutes under TCG).
        #[arg(long)]
        vm: bool,
        /// With --vm: add N = 10,000 to the mass-attach rows (PEERS_10K=1; long under TCG).
        #[arg(long)]
        ten_thousand: bool,
        /// Leave out the Frida rows.
        #[arg(long)]
        no_frida: bool,
        #[arg(long)]
        json: bool,
    },
    /// Write the vmlinux inside a vmlinuz (every compression extract-vmlinux tries).
    Extract {
        /// The image; default: the newest /boot/vmlinuz-*-cloud-amd64.
        #[arg(long)]
        image: Option<PathBuf>,
        /// Where to write the ELF.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Fig. 4 today: instruction-length distribution of kernel code, by group.
    Sizes {
        #[command(flatten)]
        code: CodeArgs,
        #[arg(long)]
        json: bool,
    },
    /// Fig. 5 today: what the planner says at every instruction boundary; coverage and expected
    /// cost per hit vs the distance to the patch buffer.
    Plan {
        #[command(flatten)]
        code: CodeArgs,
        /// Only these functions (repeatable).
        #[arg(long = "function")]
        functions: Vec<String>,
        /// Also plan every point of the whole of vmlinux (millions of points: minutes).
        #[arg(long)]
        whole_kernel: bool,
        /// Also write every boundary's answers (patch buffer 1 KiB away) to this CSV file.
        #[arg(long)]
        points: Option<PathBuf>,
        /// Cycle costs from `bench cost --json`; default: measure them now.
        #[arg(long)]
        costs: Option<PathBuf>,
        #[command(flatten)]
        cost: CostArgs,
        #[arg(long)]
        json: bool,
    },
    /// A `trapctl trace` one-liner from its text to its planned splices, on the host: compile,
    /// write the component, parse the spec, plan every probe against this process (changing
    /// nothing); medians per one-liner (issue 29's goal: under 10 ms).
    Script {
        /// Runs per one-liner.
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Decode + basic blocks of all of vmlinux's text, timed beside `objdump -d` of the same file.
    Speed {
        #[command(flatten)]
        code: CodeArgs,
        /// Skip objdump (its run takes a minute or more).
        #[arg(long)]
        no_objdump: bool,
    },
    /// All of the above: JSON + CSV, PNG + SVG plots and a Markdown summary under a results folder.
    Report {
        #[command(flatten)]
        code: CodeArgs,
        #[command(flatten)]
        cost: CostArgs,
        /// The results folder.
        #[arg(long, default_value = "bench-results")]
        out: PathBuf,
        /// Skip objdump in the speed comparison.
        #[arg(long)]
        no_objdump: bool,
        /// Skip the 10,000-splice batch timings.
        #[arg(long)]
        no_batch: bool,
        /// Skip `bench peers` (Frida; fentry, ftrace and livepatch in the VM).
        #[arg(long)]
        no_peers: bool,
    },
}

#[derive(Args, Clone)]
struct CostArgs {
    /// Calls per round.
    #[arg(long, default_value_t = 2000)]
    iters: u32,
    /// Rounds; the median round is reported.
    #[arg(long, default_value_t = 31)]
    rounds: u32,
    /// Skip the uprobe row.
    #[arg(long)]
    no_uprobe: bool,
    /// Also measure the kernel rows in the VM (vmtest; emulated). `report` does unless --no-vm.
    #[arg(long)]
    vm: bool,
    /// Leave the kernel rows out of `report`.
    #[arg(long)]
    no_vm: bool,
}

#[derive(Args, Clone)]
struct CodeArgs {
    /// The kernel image (vmlinuz or vmlinux); default: the newest /boot/vmlinuz-*-cloud-amd64.
    #[arg(long)]
    image: Option<PathBuf>,
    /// kallsyms of that kernel (e.g. its /proc/kallsyms, read as root); default: boot it in the
    /// VM with vmtest (nokaslr) once and cache the result.
    #[arg(long)]
    kallsyms: Option<PathBuf>,
    /// Network driver modules from /lib/modules/<version>/kernel/drivers/net/ (name or path).
    #[arg(long = "net-driver", default_values_t = ["virtio_net".to_string()])]
    net_drivers: Vec<String>,
    /// Groups of vmlinux by symbol, NAME=GLOB[,GLOB...] (repeatable); default: scheduler, slab
    /// allocator, page allocator, TCP.
    #[arg(long = "group", value_parser = Group::parse)]
    groups: Vec<Group>,
    /// Other ELF files to analyse (executables, shared objects, .o, .ko).
    #[arg(long = "elf")]
    elfs: Vec<PathBuf>,
    /// Leave the installed kernel out (only --elf files).
    #[arg(long)]
    no_kernel: bool,
    /// Cache of extracted vmlinux and kallsyms files.
    #[arg(long)]
    cache: Option<PathBuf>,
}

impl CodeArgs {
    fn options(&self) -> SetOptions {
        SetOptions {
            kernel: !self.no_kernel,
            image: self.image.clone(),
            kallsyms: self.kallsyms.clone(),
            cache: self
                .cache
                .clone()
                .unwrap_or_else(bench::kernel::default_cache_dir),
            repo: repo(),
            groups: self.groups.clone(),
            net_drivers: self.net_drivers.clone(),
            elfs: self.elfs.clone(),
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Mech {
    Trap,
    Jmp,
}

impl From<Mech> for instr_manager::Mechanism {
    fn from(m: Mech) -> Self {
        match m {
            Mech::Trap => instr_manager::Mechanism::Trap,
            Mech::Jmp => instr_manager::Mechanism::Jmp,
        }
    }
}

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TRAPVEC_LOG", "warn")).init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {}", trapvec::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Cost { cost, json } => {
            let mut t = cost::measure(cost.iters, cost.rounds, !cost.no_uprobe)?;
            if cost.vm {
                t.add_vm_rows(&repo(), None);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                print!("{}", t.render());
            }
            Ok(())
        }
        Cmd::Batch { splices, mechanism } => {
            let b = batch::measure(splices, mechanism.into())?;
            println!("{}", b.render());
            Ok(())
        }
        Cmd::Peers {
            iters,
            rounds,
            attach_rounds,
            vm,
            ten_thousand,
            no_frida,
            json,
        } => {
            let p = peers::measure(
                &repo(),
                iters,
                rounds,
                attach_rounds,
                !no_frida,
                vm,
                ten_thousand,
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                print!("{}", p.render());
            }
            Ok(())
        }
        Cmd::Cover {
            whole_kernel,
            sample,
            rounds,
            conns,
            from_log,
            save_log,
            json,
        } => {
            if sample == 0 || rounds == 0 || conns == 0 {
                anyhow::bail!("--sample, --rounds and --conns must be at least 1");
            }
            let v = match from_log {
                Some(path) => {
                    let text = std::fs::read(&path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    livecover::LiveCover::parse(&String::from_utf8_lossy(&text))
                }
                None => livecover::measure_vm(
                    &repo(),
                    &livecover::Options {
                        whole_kernel,
                        sample,
                        rounds,
                        conns,
                        console: save_log,
                    },
                ),
            }
            .map_err(|why| anyhow::anyhow!("bench cover: {why}"))?;
            if json {
                let goals = v.goals();
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "figures": v, "goals": goals })
                    )?
                );
            } else {
                print!("{}", v.render());
            }
            Ok(())
        }
        Cmd::Extract { image, output } => {
            let k = bench::kernel::KernelImage::find(image.as_deref())?;
            let data = std::fs::read(&k.vmlinuz)
                .with_context(|| format!("reading {}", k.vmlinuz.display()))?;
            let x = bench::vmlinux::extract_vmlinux(&data, &k.vmlinuz.display().to_string())?;
            std::fs::write(&output, &x.elf)
                .with_context(|| format!("writing {}", output.display()))?;
            println!(
                "{}: {} stream at {:#x}, {} bytes of ELF written to {}",
                k.vmlinuz.display(),
                x.compression,
                x.offset,
                x.elf.len(),
                output.display()
            );
            Ok(())
        }
        Cmd::Sizes { code, json } => {
            let loaded = sets::load(&code.options())?;
            let rows = sizes::sizes(&loaded.sets);
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                if let Some(s) = &loaded.sources {
                    println!(
                        "vmlinux: {} ({}), symbols: {}",
                        s.vmlinuz.display(),
                        s.compression,
                        s.kallsyms
                    );
                }
                print!("{}", sizes::render(&rows));
            }
            Ok(())
        }
        Cmd::Plan {
            code,
            functions,
            whole_kernel,
            points,
            costs,
            cost,
            json,
        } => {
            let loaded = sets::load(&code.options())?;
            let costs = match costs {
                Some(p) => cost::load(&p)?.hit_costs(),
                None => {
                    eprintln!("bench: measuring the cycle costs (bench cost) ...");
                    cost::measure(cost.iters, cost.rounds, false)?.hit_costs()
                }
            };
            let mut all = Vec::new();
            let mut point_rows = String::new();
            for set in loaded
                .sets
                .iter()
                .filter(|s| whole_kernel || !s.whole_kernel)
            {
                let set = if functions.is_empty() {
                    set.clone()
                } else {
                    set.only(&functions)
                };
                if set.functions.is_empty() {
                    continue;
                }
                let bar = report::progress(
                    set.functions.len() as u64,
                    &format!("planning {}", set.name),
                );
                let c = coverage::coverage(&set, &DISTANCES, threads(), &|n| bar.set_position(n));
                bar.finish_and_clear();
                all.push(c);
                if points.is_some() {
                    point_rows.push_str(&coverage::points_csv(&set));
                }
            }
            if let Some(p) = &points {
                let text = format!("{}{point_rows}", coverage::POINTS_CSV_HEADER);
                std::fs::write(p, text).with_context(|| format!("writing {}", p.display()))?;
            }
            if json {
                let v: Vec<_> = all
                    .iter()
                    .map(|c| serde_json::json!({"coverage": c, "curve": c.curve(&costs)}))
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({"costs": costs, "sets": v}))?
                );
            } else {
                print!("{}", render_plan(&all, &costs));
            }
            Ok(())
        }
        Cmd::Script { runs, json } => {
            let rows = script::measure(runs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                script::print(&rows);
            }
            Ok(())
        }
        Cmd::Speed { code, no_objdump } => {
            let loaded = sets::load(&code.options())?;
            let (img, src) = loaded
                .vmlinux
                .zip(loaded.sources)
                .context("the speed comparison needs the kernel (drop --no-kernel)")?;
            let s = speed::measure(&img, &src.vmlinux, threads(), !no_objdump)?;
            print!("{}", s.render());
            Ok(())
        }
        Cmd::Report {
            code,
            cost,
            out,
            no_objdump,
            no_batch,
            no_peers,
        } => {
            let opts = report::ReportOptions {
                sets: code.options(),
                iters: cost.iters,
                rounds: cost.rounds,
                uprobe: !cost.no_uprobe,
                vm: !cost.no_vm,
                objdump: !no_objdump,
                batch: !no_batch,
                peers: !no_peers,
                threads: threads(),
                out,
            };
            let r = report::run(&opts)?;
            println!("{}", r.summary_path.display());
            Ok(())
        }
    }
}

/// The workspace vmtest builds the module, components and trapctl from.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn render_plan(all: &[coverage::Coverage], costs: &HitCosts) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "cycle costs per hit, the PROCESS backend's (bench cost: trap = int 0xf5 -> #GP -> SIGSEGV; \
         the kernel's trap, handled in the kernel, is far cheaper relative to jmp): \
         trap {:.0}, jmp rel32 {:.0}, jmp rel8+springboard {:.0}",
        costs.trap, costs.jmp_rel32, costs.jmp_springboard
    );
    for c in all {
        let near = &c.at[0];
        let _ = writeln!(
            s,
            "\n{}: {} functions, {} instruction boundaries{}",
            c.set,
            c.functions,
            near.points,
            if c.undecodable_functions > 0 {
                format!(
                    " ({} functions partly undecodable)",
                    c.undecodable_functions
                )
            } else {
                String::new()
            }
        );
        let pct = |n: u64| 100.0 * n as f64 / near.points.max(1) as f64;
        let _ = writeln!(s, "  trap: {:.1}%   jmp rel32: {:.1}%   jmp rel8+springboard: {:.1}%   jmp impossible: {:.1}%   neither: {:.1}%   (patch buffer {} away)",
            pct(near.trap_ok), pct(near.jmp_rel32), pct(near.jmp_springboard),
            pct(near.points - near.jmp_rel32 - near.jmp_springboard), pct(near.neither), human_distance(near.distance));
        let _ = writeln!(
            s,
            "  trap refused: {}",
            reasons(&near.trap_refusals, near.points)
        );
        let _ = writeln!(
            s,
            "  jmp refused:  {}",
            reasons(&near.jmp_refusals, near.points)
        );
        let _ = writeln!(
            s,
            "  {:>16} {:>7} {:>7} {:>7} {:>10} {:>10} {:>12}",
            "distance", "trap%", "jmp%", "either%", "trap cyc", "jmp cyc", "jmp|trap cyc"
        );
        for p in c.curve(costs) {
            let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.0}"));
            let _ = writeln!(
                s,
                "  {:>16} {:>7.1} {:>7.1} {:>7.1} {:>10} {:>10} {:>12}",
                human_distance(p.distance),
                100.0 * p.trap_coverage,
                100.0 * p.jmp_coverage,
                100.0 * p.either_coverage,
                f(p.trap_cycles),
                f(p.jmp_cycles),
                f(p.hybrid_cycles)
            );
        }
    }
    s
}

fn reasons(m: &std::collections::BTreeMap<String, u64>, total: u64) -> String {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    if v.is_empty() {
        return "never".into();
    }
    v.iter()
        .map(|(k, n)| format!("{k} {:.1}%", 100.0 * **n as f64 / total.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}
