//! `bench`: jmp-vs-trap benchmarking.
//!
//! - `bench cost`: cycles per hit on this machine (process backend): an unpatched call, a jmp
//!   `call` splice hit, a trap `call` splice hit (empty handler), and the floors: a minimal C
//!   SIGSEGV handler that only advances RIP, and `int3` with an empty SIGTRAP handler. Medians of
//!   many rounds (the machine is shared and noisy), pinned to one CPU.
//! - `bench batch`: time to apply and to remove N splices in one batch.

use bench::{fixtures, timing};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bench", about = "jmp-vs-trap benchmarks of trapvec (process backend on this machine)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Cycles per hit: unpatched call, jmp splice, trap splice, and the signal floors (Table 1 today).
    Cost {
        /// Calls per round.
        #[arg(long, default_value_t = 2000)]
        iters: u32,
        /// Rounds; the median round is reported.
        #[arg(long, default_value_t = 31)]
        rounds: u32,
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

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TRAPVEC_LOG", "warn")).init();
    match Cli::parse().cmd {
        Cmd::Cost { iters, rounds, json } => cost(iters, rounds, json),
        Cmd::Batch { splices, mechanism } => batch(splices, mechanism.into()),
    }
}

fn cost(iters: u32, rounds: u32, json: bool) -> Result<()> {
    use instr_manager::session::Session;
    use instr_manager::Mechanism::{Jmp, Trap};
    timing::pin_to_one_cpu();
    let fx = fixtures::Fixture::build()?;
    let target = fx.sym("bench_target")?;
    // SAFETY: the fixture functions have exactly these C signatures.
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(target) };
    // SAFETY: as above.
    let floor_trap: extern "C" fn() = unsafe { std::mem::transmute(fx.sym("floor_trap")?) };
    // SAFETY: as above.
    let int3_trap: extern "C" fn() = unsafe { std::mem::transmute(fx.sym("int3_trap")?) };
    // SAFETY: as above.
    let floor_install: extern "C" fn() -> i32 = unsafe { std::mem::transmute(fx.sym("floor_install")?) };
    // SAFETY: as above.
    let floor_restore: extern "C" fn() -> i32 = unsafe { std::mem::transmute(fx.sym("floor_restore")?) };
    // SAFETY: as above.
    let int3_install: extern "C" fn() -> i32 = unsafe { std::mem::transmute(fx.sym("int3_install")?) };
    // SAFETY: as above.
    let int3_restore: extern "C" fn() -> i32 = unsafe { std::mem::transmute(fx.sym("int3_restore")?) };

    let session = Session::open()?;
    session.refresh_symbols()?;
    let comp = session.load(&fx.handler)?;

    let plain = timing::measure(rounds, iters, || {
        std::hint::black_box(f(std::hint::black_box(1)));
    });
    let jmp = {
        let _s = session.splice_call("bench_target", &comp, "empty_handler", Jmp)?;
        timing::measure(rounds, iters, || {
            std::hint::black_box(f(std::hint::black_box(1)));
        })
    };
    let trap = {
        let _s = session.splice_call("bench_target", &comp, "empty_handler", Trap)?;
        timing::measure(rounds, iters / 10 + 1, || {
            std::hint::black_box(f(std::hint::black_box(1)));
        })
    };
    // The floors: trapvec's SIGSEGV handler is replaced for the measurement and put back.
    anyhow::ensure!(floor_install() == 0, "installing the floor handler");
    let floor = timing::measure(rounds, iters / 10 + 1, || floor_trap());
    anyhow::ensure!(floor_restore() == 0, "restoring the SIGSEGV handler");
    anyhow::ensure!(int3_install() == 0, "installing the int3 handler");
    let int3 = timing::measure(rounds, iters / 10 + 1, || int3_trap());
    anyhow::ensure!(int3_restore() == 0, "restoring the SIGTRAP handler");

    let ghz = timing::tsc_ghz();
    let rows = [
        ("unpatched call", plain),
        ("jmp splice hit (call, empty handler)", jmp),
        ("trap splice hit (call, empty handler)", trap),
        ("floor: minimal C SIGSEGV handler (RIP += 2)", floor),
        ("floor: int3 + empty SIGTRAP handler", int3),
    ];
    let jmp_over = jmp.median - plain.median;
    let trap_over = trap.median - plain.median;
    let floor_over = floor.median - plain.median;
    let ratio_floor = trap_over / floor_over;
    let ratio_trap_jmp = trap_over / jmp_over.max(1.0);
    if json {
        let v = serde_json::json!({
            "tsc_ghz": ghz,
            "rows": rows.iter().map(|(n, s)| serde_json::json!({"name": n, "median_cycles": s.median, "p10": s.p10, "p90": s.p90})).collect::<Vec<_>>(),
            "trap_over_floor": ratio_floor,
            "jmp_overhead_ns": jmp_over / ghz,
            "trap_over_jmp": ratio_trap_jmp,
        });
        println!("{v:#}");
        return Ok(());
    }
    println!("cycles per call (TSC at {ghz:.2} GHz; median of {rounds} rounds, p10..p90 spread)");
    for (name, s) in rows {
        println!("  {name:<46} {:>9.0}   ({:.0}..{:.0})", s.median, s.p10, s.p90);
    }
    println!();
    println!("  jmp splice overhead over the unpatched call: {jmp_over:.0} cycles = {:.1} ns (target <= 20 ns)", jmp_over / ghz);
    println!("  trap splice overhead / C floor overhead:     {ratio_floor:.2}x (target <= 1.25x)");
    println!("  trap / jmp overhead:                         {ratio_trap_jmp:.0}x (the paper's Table 1: 1613/84 = 19x)");
    Ok(())
}

fn batch(n: usize, mech: instr_manager::Mechanism) -> Result<()> {
    use instr_manager::session::Session;
    use instr_manager::splicer::{Action, SpliceRequest};
    let fx = fixtures::Fixture::build()?;
    let (_so, handle) = fixtures::many_functions(n)?;
    let session = Session::open()?;
    session.refresh_symbols()?;
    let comp = session.load(&fx.handler)?;
    let requests: Vec<SpliceRequest> = (0..n)
        .map(|i| SpliceRequest { at: format!("f{i}"), action: Action::Call { handler: "empty_handler".into(), cookie: 0 }, mechanism: mech })
        .collect();
    let t0 = std::time::Instant::now();
    let ids = session.with(|s| s.apply(&requests)).context("applying the batch")?;
    let apply = t0.elapsed();
    // One call through a splice, to show it is live.
    let f0 = fixtures::dlsym(handle, "f0")?;
    // SAFETY: `f0` has the C signature `int f0(int)`.
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(f0) };
    anyhow::ensure!(f(41) == 42, "f0 through its splice");
    let t1 = std::time::Instant::now();
    session.with(|s| s.remove(&ids)).context("removing the batch")?;
    let remove = t1.elapsed();
    drop(comp);
    println!("{n} {mech} splices in one batch: apply {:.1} ms, remove {:.1} ms (target <= 100 ms each)", apply.as_secs_f64() * 1e3, remove.as_secs_f64() * 1e3);
    Ok(())
}
