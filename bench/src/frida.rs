//! The user-space peer: Frida (`pip install frida`), `Interceptor.attach` with a CModule
//! `onEnter` (native code, no JavaScript on the hot path), beside trapvec's process backend on
//! the same bytes. Host rows, real cycles.
//!
//! Frida instruments another process: `peers/frida_target.c` (built here with `cc`) loads
//! bench's fixture and `f0 .. f999` of [`fixtures::many_functions`], and `peers/frida_peer.py`
//! (run by the Python that has `frida`) attaches to it, times the hits in it with the same
//! fenced `rdtsc` loop as [`crate::timing`], and times attaching to all 1,000 functions. Frida
//! refuses `bench cost`'s `bench_target` (4 bytes), so the hit rows are on `f0` (9 bytes), for
//! trapvec too (a jmp `call` splice with the empty handler, in this process). The mass attach is
//! set beside [`crate::batch`] of 1,000 jmp splices.
//!
//! The Python is `$TRAPVEC_FRIDA_PYTHON`, else `target/frida-venv/bin/python3` (what
//! `.ci/install-frida` makes); without it the rows say why and the rest of `bench` runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use instr_manager::session::{Session, SessionError};
use instr_manager::Mechanism;
use thiserror::Error;

use crate::batch::{self, BatchError, BatchTiming};
use crate::fixtures::{self, Fixture, FixtureError};
use crate::timing;

const TARGET_C: &str = include_str!("../peers/frida_target.c");
const PEER_PY: &str = include_str!("../peers/frida_peer.py");

/// Functions attached to at once.
pub const MASS: usize = 1000;

#[derive(Debug, Error)]
pub enum FridaError {
    /// No Python with `frida` here: the rows are left out with this reason.
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Fixture(#[from] FixtureError),
    #[error(transparent)]
    Session(Box<SessionError>),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("{what}: {detail}")]
    Run { what: &'static str, detail: String },
}

impl From<SessionError> for FridaError {
    fn from(e: SessionError) -> Self {
        FridaError::Session(Box::new(e))
    }
}

/// What the Python side reports (frida_peer.py's JSON).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FridaRun {
    pub frida_version: String,
    /// Cycles per call of f0 per round, in the Frida target, before attaching.
    pub plain: Vec<f64>,
    /// The same with the CModule onEnter attached.
    pub hooked: Vec<f64>,
    pub bench_target_refused: Option<String>,
    pub hits: u64,
    pub expected_hits: u64,
    pub functions: usize,
    /// Per round: Interceptor.attach on every fi + flush, ms (inside the agent).
    pub attach_ms: Vec<f64>,
    /// The same seen from Python (with the RPC round trip).
    pub attach_rpc_ms: Vec<f64>,
    pub detach_ms: Vec<f64>,
    /// The counter after one call of each fi, per round (must be `functions`).
    pub mass_hits: Vec<u64>,
}

/// The Frida rows beside trapvec's.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FridaRows {
    pub python: String,
    pub tsc_ghz: f64,
    pub iters: u32,
    pub rounds: u32,
    pub frida: FridaRun,
    /// Cycles per call of f0 per round in this process, unspliced and with a jmp `call` splice
    /// (empty handler).
    pub jmp_plain: Vec<f64>,
    pub jmp: Vec<f64>,
    /// `bench batch` of [`MASS`] jmp splices, one per round.
    pub batches: Vec<BatchTiming>,
}

fn median(v: &[f64]) -> f64 {
    timing::stats(v.to_vec()).median
}

impl FridaRows {
    /// Frida's overhead per hit (median round minus the unhooked median).
    pub fn frida_overhead(&self) -> f64 {
        median(&self.frida.hooked) - median(&self.frida.plain)
    }

    /// trapvec's jmp overhead per hit on the same function.
    pub fn jmp_overhead(&self) -> f64 {
        median(&self.jmp) - median(&self.jmp_plain)
    }

    /// Frida's overhead / jmp's (goal >= 5).
    pub fn frida_over_jmp(&self) -> Option<f64> {
        let j = self.jmp_overhead();
        (j > 0.0).then(|| self.frida_overhead() / j)
    }

    /// Median Frida attach (agent-side) / median trapvec batch apply of the same count.
    pub fn attach_over_batch(&self) -> Option<f64> {
        let b = median(&self.batches.iter().map(|b| b.apply_ms).collect::<Vec<_>>());
        (b > 0.0 && !self.frida.attach_ms.is_empty()).then(|| median(&self.frida.attach_ms) / b)
    }

    /// Whether these rows can stand as figures: Frida's onEnter ran once per call and once per
    /// function, every round is there, every cost is a positive number, and both overheads are
    /// positive (a hook that costs nothing did not run). The error names the first that is not.
    pub fn check(&self) -> Result<(), String> {
        let f = &self.frida;
        if f.hits != f.expected_hits {
            return Err(format!(
                "Frida's onEnter ran {} times for {} calls",
                f.hits, f.expected_hits
            ));
        }
        if f.mass_hits.len() != self.batches.len()
            || f.mass_hits.iter().any(|&h| h != f.functions as u64)
        {
            return Err(format!(
                "Frida's onEnter ran {:?} times for {} functions, in {} rounds",
                f.mass_hits,
                f.functions,
                self.batches.len()
            ));
        }
        let rounds = self.rounds as usize;
        for (what, v) in [
            ("Frida's unhooked", &f.plain),
            ("Frida's hooked", &f.hooked),
            ("trapvec's unspliced", &self.jmp_plain),
            ("trapvec's jmp", &self.jmp),
        ] {
            if v.len() != rounds {
                return Err(format!("{what} rounds: {} of {rounds}", v.len()));
            }
            if let Some(c) = v.iter().find(|c| !(c.is_finite() && **c > 0.0)) {
                return Err(format!("{what} cycles per call: {c}"));
            }
        }
        // Attach (1,000 functions) takes milliseconds; detach may read 0 on Date.now()'s clock.
        for (what, v, least) in [
            ("Frida's attach", &f.attach_ms, f64::MIN_POSITIVE),
            ("Frida's detach", &f.detach_ms, 0.0),
        ] {
            if v.len() != self.batches.len() || v.iter().any(|x| !(x.is_finite() && *x >= least)) {
                return Err(format!("{what} ms per round: {v:?}"));
            }
        }
        if let Some(b) = self
            .batches
            .iter()
            .find(|b| b.splices != f.functions || !(b.apply_ms > 0.0 && b.remove_ms > 0.0))
        {
            return Err(format!("trapvec's batch: {}", b.render()));
        }
        let (frida, jmp) = (self.frida_overhead(), self.jmp_overhead());
        if !(frida > 0.0 && jmp > 0.0) {
            return Err(format!(
                "overheads per hit not positive: Frida {frida:.1}, jmp {jmp:.1} cycles"
            ));
        }
        Ok(())
    }

    /// Every figure, for the CSV.
    pub fn figures(&self) -> Vec<(String, f64)> {
        let b =
            |f: fn(&BatchTiming) -> f64| median(&self.batches.iter().map(f).collect::<Vec<_>>());
        vec![
            ("frida_plain_cycles".into(), median(&self.frida.plain)),
            ("frida_hooked_cycles".into(), median(&self.frida.hooked)),
            ("frida_overhead_cycles".into(), self.frida_overhead()),
            ("jmp_plain_cycles".into(), median(&self.jmp_plain)),
            ("jmp_hooked_cycles".into(), median(&self.jmp)),
            ("jmp_overhead_cycles".into(), self.jmp_overhead()),
            ("frida_attach_1000_ms".into(), median(&self.frida.attach_ms)),
            (
                "frida_attach_1000_rpc_ms".into(),
                median(&self.frida.attach_rpc_ms),
            ),
            ("frida_detach_1000_ms".into(), median(&self.frida.detach_ms)),
            ("jmp_batch_apply_1000_ms".into(), b(|t| t.apply_ms)),
            ("jmp_batch_remove_1000_ms".into(), b(|t| t.remove_ms)),
        ]
    }

    pub fn render(&self) -> String {
        use std::fmt::Write;
        let list = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut s = format!(
            "host rows (process backend vs Frida {}, cycles at {:.2} GHz, {} rounds of {} calls, medians)\n",
            self.frida.frida_version, self.tsc_ghz, self.rounds, self.iters
        );
        let _ = writeln!(
            s,
            "  f0 unpatched (this process)               {:>8.0}   rounds: {}",
            median(&self.jmp_plain),
            list(&self.jmp_plain)
        );
        let _ = writeln!(
            s,
            "  f0 jmp splice hit, empty handler           {:>8.0}   rounds: {}",
            median(&self.jmp),
            list(&self.jmp)
        );
        let _ = writeln!(
            s,
            "  f0 unpatched (Frida's target)              {:>8.0}   rounds: {}",
            median(&self.frida.plain),
            list(&self.frida.plain)
        );
        let _ = writeln!(
            s,
            "  f0 Frida CModule onEnter (counts)          {:>8.0}   rounds: {}",
            median(&self.frida.hooked),
            list(&self.frida.hooked)
        );
        let _ = writeln!(
            s,
            "  overhead per hit: jmp {:.0}, Frida {:.0} cycles; Frida / jmp = {}",
            self.jmp_overhead(),
            self.frida_overhead(),
            self.frida_over_jmp()
                .map_or("n/a".into(), |r| format!("{r:.1}x"))
        );
        let _ = writeln!(
            s,
            "  Frida onEnter ran {} times for {} calls",
            self.frida.hits, self.frida.expected_hits
        );
        if let Some(why) = &self.frida.bench_target_refused {
            let _ = writeln!(
                s,
                "  Frida on bench_target (bench cost's jmp row, 4 bytes): {why}"
            );
        }
        let _ = writeln!(
            s,
            "  attach to {} functions: Frida {} ms (rounds: {}; with RPC: {}), detach {} ms; trapvec jmp batch apply {} ms, remove {} ms",
            self.frida.functions,
            median(&self.frida.attach_ms),
            list(&self.frida.attach_ms),
            list(&self.frida.attach_rpc_ms),
            list(&self.frida.detach_ms),
            self.batches.iter().map(|b| format!("{:.1}", b.apply_ms)).collect::<Vec<_>>().join(" "),
            self.batches.iter().map(|b| format!("{:.1}", b.remove_ms)).collect::<Vec<_>>().join(" "),
        );
        let _ = writeln!(
            s,
            "  Frida attach / trapvec batch = {}",
            self.attach_over_batch()
                .map_or("n/a".into(), |r| format!("{r:.1}x"))
        );
        s
    }
}

/// The Python that has `frida`: `$TRAPVEC_FRIDA_PYTHON`, else `<repo>/target/frida-venv`.
pub fn python(repo: &Path) -> Result<PathBuf, FridaError> {
    let p = match std::env::var_os("TRAPVEC_FRIDA_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => repo.join("target/frida-venv/bin/python3"),
    };
    if !p.is_file() {
        return Err(FridaError::Unavailable(format!(
            "no Python with frida at {} (run .ci/install-frida, or set TRAPVEC_FRIDA_PYTHON)",
            p.display()
        )));
    }
    log::debug!("Frida's Python: {}", p.display());
    Ok(p)
}

/// Per-round cycles per call of `f` (after a warm-up), as [`timing::measure`] takes them.
fn rounds_of(rounds: u32, iters: u32, mut f: impl FnMut()) -> Vec<f64> {
    for _ in 0..iters.min(100) {
        f();
    }
    (0..rounds.max(1))
        .map(|_| timing::round(iters, &mut f))
        .collect()
}

/// Measure the Frida rows and trapvec's beside them. `repo` locates the default Python.
pub fn measure(
    repo: &Path,
    iters: u32,
    rounds: u32,
    attach_rounds: u32,
) -> Result<FridaRows, FridaError> {
    let python = python(repo)?;
    timing::pin_to_one_cpu();
    let tsc_ghz = timing::tsc_ghz();

    // trapvec's batches first: each loads its own libmany.so, found by name while its file
    // exists, so no other copy may be on disk meanwhile.
    let batches = (0..attach_rounds.max(1))
        .map(|_| batch::measure(MASS, Mechanism::Jmp))
        .collect::<Result<Vec<_>, _>>()?;

    // trapvec on f0, in this process.
    let fx = Fixture::build()?;
    let (many_dir, many) = fixtures::many_functions(MASS)?;
    let session = Session::open()?;
    session.refresh_symbols()?;
    let comp = session.load(&fx.handler)?;
    // SAFETY: `f0` has the C signature `int f0(int)` (fixtures::many_functions).
    let f0: extern "C" fn(i32) -> i32 = unsafe { std::mem::transmute(many.sym("f0")?) };
    let call = || {
        std::hint::black_box(f0(std::hint::black_box(1)));
    };
    let jmp_plain = rounds_of(rounds, iters, call);
    let jmp = {
        let _s = session.splice_call("f0", &comp, "empty_handler", Mechanism::Jmp)?;
        rounds_of(rounds, iters, call)
    };
    drop(comp);
    drop(session);

    // Frida on the same bytes, in its target process.
    let dir = tempfile::tempdir().map_err(|e| FridaError::Run {
        what: "a temporary directory",
        detail: e.to_string(),
    })?;
    let src = dir.path().join("frida_target.c");
    let target = dir.path().join("frida_target");
    let script = dir.path().join("frida_peer.py");
    for (path, text) in [(&src, TARGET_C), (&script, PEER_PY)] {
        std::fs::write(path, text).map_err(|e| FridaError::Run {
            what: "writing the Frida peer",
            detail: e.to_string(),
        })?;
    }
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-o"])
        .arg(&target)
        .arg(&src)
        .arg("-ldl")
        .output()
        .map_err(|e| FridaError::Run {
            what: "cc frida_target.c",
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(FridaError::Run {
            what: "cc frida_target.c",
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let many_so = many_dir.path().join("libmany.so");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&target)
        .arg(&fx.so)
        .arg(&many_so)
        .args([
            MASS.to_string(),
            iters.to_string(),
            rounds.to_string(),
            attach_rounds.max(1).to_string(),
        ])
        .output()
        .map_err(|e| FridaError::Run {
            what: "running frida_peer.py",
            detail: e.to_string(),
        })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        return Err(FridaError::Unavailable(format!(
            "{} cannot import frida: {}",
            python.display(),
            stderr.trim()
        )));
    }
    if !out.status.success() {
        return Err(FridaError::Run {
            what: "frida_peer.py",
            detail: format!("{}: {}", out.status, stderr.trim()),
        });
    }
    let frida: FridaRun = serde_json::from_slice(&out.stdout).map_err(|e| FridaError::Run {
        what: "reading frida_peer.py's JSON",
        detail: e.to_string(),
    })?;
    if frida.hits != frida.expected_hits || frida.mass_hits.iter().any(|&h| h != MASS as u64) {
        return Err(FridaError::Run {
            what: "Frida's onEnter",
            detail: format!(
                "ran {} times for {} calls, and {:?} times for {MASS} functions",
                frida.hits, frida.expected_hits, frida.mass_hits
            ),
        });
    }
    Ok(FridaRows {
        python: python.display().to_string(),
        tsc_ghz,
        iters,
        rounds,
        frida,
        jmp_plain,
        jmp,
        batches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> FridaRows {
        let batch = BatchTiming {
            splices: MASS,
            mechanism: "jmp".into(),
            apply_ms: 2.0,
            remove_ms: 1.5,
        };
        FridaRows {
            python: "python3".into(),
            tsc_ghz: 2.0,
            iters: 500,
            rounds: 3,
            frida: FridaRun {
                frida_version: "16".into(),
                plain: vec![10.0, 11.0, 10.0],
                hooked: vec![300.0, 310.0, 305.0],
                bench_target_refused: None,
                hits: 1600,
                expected_hits: 1600,
                functions: MASS,
                attach_ms: vec![40.0, 41.0],
                attach_rpc_ms: vec![42.0, 43.0],
                detach_ms: vec![20.0, 21.0],
                mass_hits: vec![MASS as u64, MASS as u64],
            },
            jmp_plain: vec![10.0, 10.0, 11.0],
            jmp: vec![30.0, 31.0, 30.0],
            batches: vec![batch.clone(), batch],
        }
    }

    #[test]
    fn rows_that_hold_up_pass_the_check() {
        let r = rows();
        assert_eq!(r.check(), Ok(()));
        assert_eq!(r.frida_over_jmp().map(|x| x.round()), Some(15.0));
    }

    #[test]
    fn each_wrong_figure_fails_the_check_naming_it() {
        type Spoil = fn(&mut FridaRows);
        let cases: [(&str, Spoil); 8] = [
            ("ran 1599 times for 1600 calls", |r| r.frida.hits = 1599),
            ("ran [1000, 999] times", |r| r.frida.mass_hits[1] = 999),
            ("trapvec's jmp rounds: 2 of 3", |r| {
                r.jmp.pop();
            }),
            ("Frida's hooked cycles per call: NaN", |r| {
                r.frida.hooked[0] = f64::NAN
            }),
            // The jmp splice cost nothing: it did not run.
            (
                "overheads per hit not positive: Frida 295.0, jmp 0.0",
                |r| r.jmp = r.jmp_plain.clone(),
            ),
            ("overheads per hit not positive: Frida -1.0", |r| {
                r.frida.hooked = vec![9.0; 3]
            }),
            ("Frida's attach ms per round", |r| {
                r.frida.attach_ms = vec![]
            }),
            ("trapvec's batch: 999 jmp splices", |r| {
                r.batches[0].splices = 999
            }),
        ];
        for (why, spoil) in cases {
            let mut r = rows();
            spoil(&mut r);
            let err = r.check().unwrap_err();
            assert!(err.contains(why), "`{err}` should say `{why}`");
        }
    }
}
