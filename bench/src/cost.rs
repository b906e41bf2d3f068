//! Table 1 today: cycles per hit of each mechanism on this machine, with the process backend
//! (the benchmark process splices its own code; `rdtsc`, pinned to one CPU, medians of rounds
//! with the 10th–90th percentile spread).
//!
//! Rows: an unpatched call; a jmp `call` splice hit (`jmp rel32`); a jmp splice hit through a
//! `jmp rel8` to a springboard (on a 3-byte function, beside its own unpatched call); a trap
//! `call` splice hit (empty handler); the floors: a minimal C SIGSEGV handler that only advances
//! RIP past `int $0xf5`, and `int3` with an empty SIGTRAP handler; and the kernel's own
//! trap-based user probe: a uprobe on the same function through
//! `/sys/kernel/tracing/uprobe_events` with its trace event enabled, where the machine allows it
//! (root, tracefs, `CONFIG_UPROBE_EVENTS`), and the reason where it does not.

use std::path::Path;

use instr_manager::session::{Session, SessionError};
use instr_manager::Mechanism::{Jmp, Trap};
use thiserror::Error;

use crate::coverage::HitCosts;
use crate::fixtures::{Fixture, FixtureError};
use crate::timing::{self, Stats};
use crate::uprobe;
use crate::vmcost::VmCost;

/// The paper's Table 1 (Pentium 4, 1.4 GHz, Linux 2.4.20): jmp 84.0012 cycles, trap 1613.5124.
pub const PAPER_JMP_CYCLES: f64 = 84.0012;
/// The paper's trap cost (Table 1).
pub const PAPER_TRAP_CYCLES: f64 = 1613.5124;

/// Measuring the table failed.
#[derive(Debug, Error)]
pub enum CostError {
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    #[error(transparent)]
    Session(Box<SessionError>),
    #[error("{what} failed")]
    Signal {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("switching the uprobe")]
    Uprobe(#[source] uprobe::UprobeError),
}

impl From<SessionError> for CostError {
    fn from(e: SessionError) -> Self {
        CostError::Session(Box::new(e))
    }
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostRow {
    /// Stable key: `unpatched`, `jmp_rel32`, `short_unpatched`, `jmp_springboard`, `trap`,
    /// `floor_sigsegv`, `floor_int3`, `floor_int3_cd03`, `uprobe`.
    pub key: String,
    pub name: String,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    /// Under emulation (QEMU TCG): only ratios within the same guest mean anything.
    pub emulated: bool,
}

/// The measured table.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostTable {
    pub tsc_ghz: f64,
    pub rounds: u32,
    pub iters: u32,
    pub rows: Vec<CostRow>,
    /// Why the uprobe row is missing, when it is.
    pub uprobe_unavailable: Option<String>,
    /// Kernel rows measured in the VM (emulated).
    #[serde(default)]
    pub vm: Option<VmCost>,
    /// Why there are no kernel rows, when there are none.
    #[serde(default)]
    pub vm_unavailable: Option<String>,
}

impl CostTable {
    pub fn row(&self, key: &str) -> Option<&CostRow> {
        self.rows.iter().find(|r| r.key == key)
    }

    fn median(&self, key: &str) -> f64 {
        self.row(key).map_or(f64::NAN, |r| r.median)
    }

    /// Overhead cycles of `key` over the unpatched call it replaces.
    pub fn overhead(&self, key: &str) -> f64 {
        let base = if key == "jmp_springboard" {
            "short_unpatched"
        } else {
            "unpatched"
        };
        self.median(key) - self.median(base)
    }

    /// The costs `plan` weighs points with.
    pub fn hit_costs(&self) -> HitCosts {
        HitCosts {
            trap: self.overhead("trap"),
            jmp_rel32: self.overhead("jmp_rel32"),
            jmp_springboard: self.overhead("jmp_springboard"),
        }
    }

    /// jmp splice overhead in ns (issue 2: target ≤ 20 ns).
    pub fn jmp_overhead_ns(&self) -> f64 {
        self.overhead("jmp_rel32") / self.tsc_ghz
    }

    /// Trap splice overhead / C SIGSEGV floor overhead (issue 2: target ≤ 1.25).
    pub fn trap_over_floor(&self) -> f64 {
        self.overhead("trap") / self.overhead("floor_sigsegv")
    }

    /// The 2-byte `int $3` (CD 03, SIGTRAP) floor / the `int $0xf5` (#GP, SIGSEGV) floor, when
    /// measured (issue 26, item 7).
    pub fn cd03_over_sigsegv(&self) -> Option<f64> {
        self.row("floor_int3_cd03")
            .map(|_| self.overhead("floor_int3_cd03") / self.overhead("floor_sigsegv"))
    }

    /// Trap overhead / jmp overhead (the paper: 19).
    pub fn trap_over_jmp(&self) -> f64 {
        self.overhead("trap") / self.overhead("jmp_rel32").max(1.0)
    }

    /// uprobe overhead / trap splice overhead, when measured.
    pub fn uprobe_over_trap(&self) -> Option<f64> {
        self.row("uprobe")
            .map(|_| self.overhead("uprobe") / self.overhead("trap"))
    }

    /// The text table.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "cycles per call (TSC at {:.2} GHz; median of {} rounds, p10..p90 spread)",
            self.tsc_ghz, self.rounds
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "  {:<52} {:>9.0}   ({:.0}..{:.0})",
                r.name, r.median, r.p10, r.p90
            );
        }
        if let Some(why) = &self.uprobe_unavailable {
            let _ = writeln!(
                s,
                "  {:<52} {:>9}   ({why})",
                "uprobe on the same function", "n/a"
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "  overhead over the unpatched call, cycles: jmp rel32 {:.0}, jmp rel8+springboard {:.0}, trap {:.0}",
            self.overhead("jmp_rel32"),
            self.overhead("jmp_springboard"),
            self.overhead("trap")
        );
        let _ = writeln!(
            s,
            "  jmp splice overhead:          {:.1} ns (issue 2 target <= 20 ns)",
            self.jmp_overhead_ns()
        );
        let _ = writeln!(
            s,
            "  trap splice / C SIGSEGV floor: {:.2}x (issue 2 target <= 1.25x)",
            self.trap_over_floor()
        );
        if let Some(r) = self.cd03_over_sigsegv() {
            let _ = writeln!(
                s,
                "  CD 03 floor / 0xF5 floor:      {r:.2}x (int $3 -> SIGTRAP vs int $0xf5 -> #GP -> SIGSEGV)"
            );
        }
        let _ = writeln!(s, "  trap / jmp:                    {:.0}x (the paper's Table 1: {PAPER_TRAP_CYCLES:.0}/{PAPER_JMP_CYCLES:.0} = {:.0}x)",
            self.trap_over_jmp(), PAPER_TRAP_CYCLES / PAPER_JMP_CYCLES);
        if let Some(u) = self.uprobe_over_trap() {
            let _ = writeln!(
                s,
                "  uprobe / trap splice:          {u:.1}x (the kernel's own trap-based probe, trace event on)"
            );
        }
        match (&self.vm, &self.vm_unavailable) {
            (Some(vm), _) => s.push_str(&vm.render()),
            (None, Some(why)) => {
                let _ = writeln!(s, "\n  kernel rows (VM): not measured: {why}");
            }
            (None, None) => {}
        }
        s
    }

    /// Add the kernel rows: boot the VM (`vmtest`) and run the scenario; a machine that cannot
    /// (no QEMU, no cloud kernel) gets the reason instead.
    pub fn add_vm_rows(&mut self, repo: &Path, kernel: Option<std::path::PathBuf>) {
        let bar = crate::report::spinner("kernel rows: booting the VM (vmtest)");
        let r = crate::vmcost::measure(repo, kernel);
        bar.finish_and_clear();
        match r {
            Ok(v) => self.vm = Some(v),
            Err(e) => {
                let why = trapvec::error_chain(&e);
                log::warn!("kernel rows: {why}");
                self.vm_unavailable = Some(why.lines().next().unwrap_or_default().to_string());
            }
        }
    }
}

fn row(key: &str, name: &str, st: Stats) -> CostRow {
    CostRow {
        key: key.to_string(),
        name: name.to_string(),
        median: st.median,
        p10: st.p10,
        p90: st.p90,
        emulated: false,
    }
}

/// Measure the process rows (`iters` calls per round, `rounds` rounds; the signal rows use a
/// tenth of the calls). `with_uprobe` tries the uprobe row.
pub fn measure(iters: u32, rounds: u32, with_uprobe: bool) -> Result<CostTable, CostError> {
    timing::pin_to_one_cpu();
    let fx = Fixture::build()?;
    // SAFETY: the fixture functions have exactly these C signatures (FIXTURE_C).
    let f: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(fx.sym("bench_target")?) };
    // SAFETY: as above; `bench_short` is `int bench_short(void)` (xor eax,eax; ret).
    let short: extern "C" fn() -> i32 = unsafe { std::mem::transmute(fx.sym("bench_short")?) };
    // SAFETY: as above.
    let floor_trap: extern "C" fn() = unsafe { std::mem::transmute(fx.sym("floor_trap")?) };
    // SAFETY: as above.
    let int3_trap: extern "C" fn() = unsafe { std::mem::transmute(fx.sym("int3_trap")?) };
    // SAFETY: as above (`void int3_long_trap(void)`, the 2-byte `int $3`, CD 03).
    let int3_long_trap: extern "C" fn() = unsafe { std::mem::transmute(fx.sym("int3_long_trap")?) };
    // SAFETY: `int3_long_strays` is an `unsigned long` of the fixture, written only by its
    // SIGTRAP handler on this thread; it is read here after the rounds, with no handler running.
    let strays = fx.sym("int3_long_strays")? as *const u64;
    // SAFETY: as above.
    let floor_install: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(fx.sym("floor_install")?) };
    // SAFETY: as above.
    let floor_restore: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(fx.sym("floor_restore")?) };
    // SAFETY: as above.
    let int3_install: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(fx.sym("int3_install")?) };
    // SAFETY: as above.
    let int3_restore: extern "C" fn() -> i32 =
        unsafe { std::mem::transmute(fx.sym("int3_restore")?) };
    let call = || {
        std::hint::black_box(f(std::hint::black_box(1)));
    };
    let call_short = || {
        std::hint::black_box(short());
    };
    let slow = iters / 10 + 1;

    let session = Session::open()?;
    session.refresh_symbols()?;
    let comp = session.load(&fx.handler)?;

    let plain = timing::measure(rounds, iters, call);
    let short_plain = timing::measure(rounds, iters, call_short);
    let jmp = {
        let _s = session.splice_call("bench_target", &comp, "empty_handler", Jmp)?;
        timing::measure(rounds, iters, call)
    };
    let springboard = {
        let _s = session.splice_call("bench_short", &comp, "empty_handler", Jmp)?;
        timing::measure(rounds, iters, call_short)
    };
    // A predicate that never matches (no thread has id u32::MAX): the guard's compare and the
    // replay, what every other thread pays for a splice made for one thread.
    let skipped = {
        let mut req = instr_manager::splicer::SpliceRequest::new(
            "bench_target",
            instr_manager::splicer::Action::Call {
                handler: "empty_handler".into(),
                cookie: 0,
            },
            Jmp,
        );
        req.options.only = trapvec::predicate::Predicate {
            tid: Some(u32::MAX),
            ..Default::default()
        };
        let _s = session.splice_request(req, Some(&comp))?;
        timing::measure(rounds, iters, call)
    };
    // Return points: the entry half (a jmp call splice into the runtime) and the return through
    // the instance's stub; a timer adds a clock read at each end.
    let returns = {
        let _s = session.count_returns("bench_target", None, Jmp)?;
        timing::measure(rounds, iters, call)
    };
    let timer = {
        let _s = session.time("bench_target", trapvec::returns::Clock::Wall, Jmp)?;
        timing::measure(rounds, iters, call)
    };
    // The signal rows are measured round by round in turn (trap, C floor, int3, uprobe), so
    // that the noise of a shared machine falls on all of them alike and their ratios hold.
    let check = |rc: i32, what: &'static str| {
        if rc == 0 {
            Ok(())
        } else {
            Err(CostError::Signal {
                what,
                source: std::io::Error::last_os_error(),
            })
        }
    };
    // SAFETY: `bench_target2` has the C signature `int bench_target2(int)` (FIXTURE_C).
    let f2: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(fx.sym("bench_target2")?) };
    let mut call2 = || {
        std::hint::black_box(f2(std::hint::black_box(1)));
    };
    let mut uprobe_unavailable = None;
    let probe = if with_uprobe {
        match uprobe::file_offset(&fx.so, "bench_target2")
            .and_then(|o| uprobe::Probe::add(&fx.so, o))
        {
            Ok(p) => Some(p),
            Err(why) => {
                uprobe_unavailable = Some(trapvec::error_chain(&why));
                None
            }
        }
    } else {
        uprobe_unavailable = Some("not asked for (--no-uprobe)".into());
        None
    };
    let trap_splice = session.splice_call("bench_target", &comp, "empty_handler", Trap)?;
    let (mut trap_r, mut floor_r, mut int3_r, mut cd03_r, mut uprobe_r) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut call_t, mut floor_t, mut int3_t, mut cd03_t) =
        (call, || floor_trap(), || int3_trap(), || int3_long_trap());
    for r in 0..=rounds {
        // Round 0 warms every path up and is not counted.
        let keep = r > 0;
        let t = timing::round(slow, &mut call_t);
        check(floor_install(), "installing the floor SIGSEGV handler")?;
        let fl = timing::round(slow, &mut floor_t);
        check(floor_restore(), "restoring the SIGSEGV handler")?;
        check(int3_install(), "installing the SIGTRAP handler")?;
        let i3 = timing::round(slow, &mut int3_t);
        let cd = timing::round(slow, &mut cd03_t);
        check(int3_restore(), "restoring the SIGTRAP handler")?;
        if let Some(p) = &probe {
            p.set_enabled(true).map_err(CostError::Uprobe)?;
            let u = timing::round(slow, &mut call2);
            p.set_enabled(false).map_err(CostError::Uprobe)?;
            if keep {
                uprobe_r.push(u);
            }
        }
        if keep {
            trap_r.push(t);
            floor_r.push(fl);
            int3_r.push(i3);
            cd03_r.push(cd);
        }
    }
    drop(trap_splice);
    // SAFETY: see `strays` above; the handler is restored, nothing writes it now.
    let strays = unsafe { strays.read_volatile() };
    // Every CC trap counts as a stray (its byte before RIP is the caller's): only the CD 03
    // traps must match. int3_trap ran `(rounds + 1) * slow` times.
    let cc_traps = u64::from(rounds + 1) * u64::from(slow);
    if strays != cc_traps {
        return Err(CostError::Signal {
            what: "telling CD 03 from CC by the bytes before RIP",
            source: std::io::Error::other(format!(
                "{strays} traps not CD 03 for {cc_traps} int3 (CC) traps"
            )),
        });
    }

    let mut rows = vec![
        row("unpatched", "unpatched call", plain),
        row(
            "jmp_rel32",
            "jmp splice hit (jmp rel32, call, empty handler)",
            jmp,
        ),
        row(
            "short_unpatched",
            "unpatched call of a 3-byte function",
            short_plain,
        ),
        row(
            "jmp_springboard",
            "jmp splice hit there (jmp rel8 + springboard)",
            springboard,
        ),
        row(
            "jmp_skip",
            "jmp splice hit by a thread its predicate excludes",
            skipped,
        ),
        row(
            "jmp_return",
            "return point hit by jmp (entry + stub)",
            returns,
        ),
        row(
            "jmp_timer",
            "timer hit by jmp (return point + 2 clocks)",
            timer,
        ),
        row(
            "trap",
            "trap splice hit (int 0xf5, call, empty handler)",
            timing::stats(trap_r),
        ),
        row(
            "floor_sigsegv",
            "floor: minimal C SIGSEGV handler (RIP += 2)",
            timing::stats(floor_r),
        ),
        row(
            "floor_int3",
            "floor: int3 + empty SIGTRAP handler",
            timing::stats(int3_r),
        ),
        row(
            "floor_int3_cd03",
            "floor: int $3 (CD 03, 2 bytes) + SIGTRAP handler",
            timing::stats(cd03_r),
        ),
    ];
    if let Some(p) = probe {
        let hits = p.hits();
        drop(p);
        log::debug!("uprobe hits in uprobe_profile: {hits:?}");
        match hits {
            Some(h) if h > 0 => rows.push(row(
                "uprobe",
                "uprobe on the same code (trace event on)",
                timing::stats(uprobe_r),
            )),
            _ => {
                uprobe_unavailable =
                    Some("the uprobe was registered but uprobe_profile shows no hit".into())
            }
        }
    }
    drop(comp);
    Ok(CostTable {
        tsc_ghz: timing::tsc_ghz(),
        rounds,
        iters,
        rows,
        uprobe_unavailable,
        vm: None,
        vm_unavailable: None,
    })
}

/// Reading a saved table failed.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot read {path}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a cost table")]
    Decode {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Read a table written by `bench cost --json` (or the report's `cost.json`).
pub fn load(path: &Path) -> Result<CostTable, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| LoadError::Decode {
        path: path.to_path_buf(),
        source,
    })
}
