//! Fig. 5 today: for every instruction boundary of the chosen functions, what trapvec's real
//! planner (`instr_manager::plan_*`) says each mechanism needs there, how much of the code each
//! mechanism covers, and the expected cost per hit as the patch buffer (where the trampoline
//! goes) moves away from the point.
//!
//! At each boundary and each distance `d` (trampoline at `site + d`), the planner is asked for
//! - a trap (`CD F5`, 2 bytes): possible, or the refusal;
//! - a `jmp rel32` (5 bytes), else a `jmp rel8` to a springboard in padding within ±127 bytes,
//!   else impossible (with the refusal).
//!
//! The distance enters the planner's answers only through reach: the `jmp rel32` (and the
//! springboard's) must reach the trampoline, and the displaced instructions, relocated into the
//! trampoline, must still reach their RIP-relative and call targets (the trap's too), all within
//! ±2 GiB. The buffer is put above the point, or below it for kernel addresses
//! ([`trampoline_at`]). A patch buffer closer than a function's own length would overlap the code, so the
//! distances start at 1 KiB (the paper's base offset).
//!
//! Expected cost per hit at `d`, every boundary equally likely to be the point (the paper weighs
//! instruction lengths by their frequency, which is the same thing), with the cycle costs
//! measured by `bench cost`: trap only (over the points a trap can splice), jmp only (over the
//! points jmp can splice: `jmp rel32` costs a jmp splice hit, a springboard one more taken jump),
//! and "jmp, else trap" (over every point either can splice).

use std::collections::BTreeMap;

use instr_manager::{analyze_function_with, AnalysisOptions, PlanInput, Refusal, SiteVerdict};
use trapvec::TargetInfo;

use crate::sets::CodeSet;
use instr_manager::image::CodeImage;

/// Distances (bytes from the point to the patch buffer) of the curves: 1 KiB … 1 TiB, with
/// points just inside and just outside rel32's ±2 GiB.
pub const DISTANCES: [u64; 10] = [
    1 << 10,
    1 << 14,
    1 << 18,
    1 << 22,
    1 << 26,
    1 << 30,
    (1 << 31) - (1 << 20),
    (1 << 31) + (1 << 20),
    1 << 34,
    1 << 40,
];

/// Cycle costs per hit (overhead over an unpatched call), from `bench cost`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HitCosts {
    pub trap: f64,
    pub jmp_rel32: f64,
    /// `jmp rel8` to a springboard, then its `jmp rel32`.
    pub jmp_springboard: f64,
}

/// What the jmp mechanism does at one point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JmpKind {
    Rel32,
    Rel8Springboard,
    Impossible,
}

/// A short, stable name for a refusal's kind (the full text is in the planner's message).
pub fn refusal_kind(r: &Refusal) -> &'static str {
    match r {
        Refusal::OutsideFunction { .. } => "outside the function",
        Refusal::NotInstructionBoundary { .. } => "not an instruction boundary",
        Refusal::Undecodable { .. } => "undecodable code",
        Refusal::FunctionTooShort { .. } => "function too short",
        Refusal::PastFunctionEnd { .. } => "window past the function's end",
        Refusal::BranchTargetInWindow { .. } => "branch target inside the window",
        Refusal::OutsideTargetInWindow { .. } => "branch target from outside inside the window",
        Refusal::LandingPadInWindow { .. } => "exception landing pad inside the window",
        Refusal::WindowCrossesBlock { .. } => "window crosses a basic block's end",
        Refusal::Unrelocatable { .. } => "displaced instruction cannot be relocated",
        Refusal::OverlapsFentry { .. } => "overlaps the ftrace NOP",
        Refusal::AlreadyPatched { .. } => "already patched",
        Refusal::CallReturnsIntoWindow { .. } => "a displaced call returns into the window",
        Refusal::NoRoomForJmp { .. } => "no padding for a springboard",
        Refusal::OutOfReach { .. } => "trampoline out of rel32 reach",
        Refusal::Encode { .. } => "cannot be encoded",
        #[allow(unreachable_patterns)]
        _ => "other",
    }
}

/// The planner's answers at one boundary and one distance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub trap: Result<(), &'static str>,
    pub jmp: JmpKind,
    /// Why jmp is impossible (the rel32 refusal when the window is the problem, else the
    /// springboard's).
    pub jmp_refusal: Option<&'static str>,
}

/// Counts at one distance.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct AtDistance {
    pub distance: u64,
    pub points: u64,
    pub trap_ok: u64,
    pub jmp_rel32: u64,
    pub jmp_springboard: u64,
    /// Points neither mechanism can splice.
    pub neither: u64,
    /// Trap refusals by kind.
    pub trap_refusals: BTreeMap<String, u64>,
    /// jmp refusals by kind.
    pub jmp_refusals: BTreeMap<String, u64>,
}

impl AtDistance {
    fn add(&mut self, a: &Answer) {
        self.points += 1;
        match a.trap {
            Ok(()) => self.trap_ok += 1,
            Err(k) => *self.trap_refusals.entry(k.to_string()).or_default() += 1,
        }
        match a.jmp {
            JmpKind::Rel32 => self.jmp_rel32 += 1,
            JmpKind::Rel8Springboard => self.jmp_springboard += 1,
            JmpKind::Impossible => {
                *self
                    .jmp_refusals
                    .entry(a.jmp_refusal.unwrap_or("other").to_string())
                    .or_default() += 1
            }
        }
        if a.trap.is_err() && a.jmp == JmpKind::Impossible {
            self.neither += 1;
        }
    }

    /// Add the counts of `o` (same distance) to these.
    pub fn merge(&mut self, o: &AtDistance) {
        self.points += o.points;
        self.trap_ok += o.trap_ok;
        self.jmp_rel32 += o.jmp_rel32;
        self.jmp_springboard += o.jmp_springboard;
        self.neither += o.neither;
        for (k, v) in &o.trap_refusals {
            *self.trap_refusals.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.jmp_refusals {
            *self.jmp_refusals.entry(k.clone()).or_default() += v;
        }
    }

    fn share(&self, n: u64) -> f64 {
        if self.points == 0 {
            0.0
        } else {
            n as f64 / self.points as f64
        }
    }

    /// Share of points a trap can splice.
    pub fn trap_coverage(&self) -> f64 {
        self.share(self.trap_ok)
    }

    /// Share of points jmp (either form) can splice.
    pub fn jmp_coverage(&self) -> f64 {
        self.share(self.jmp_rel32 + self.jmp_springboard)
    }

    /// Share of points at least one mechanism can splice.
    pub fn either_coverage(&self) -> f64 {
        self.share(self.points - self.neither)
    }

    /// Expected cycles per hit, trap only, over the points it covers.
    pub fn trap_cost(&self, c: &HitCosts) -> Option<f64> {
        (self.trap_ok > 0).then_some(c.trap)
    }

    /// Expected cycles per hit, jmp only, over the points it covers.
    pub fn jmp_cost(&self, c: &HitCosts) -> Option<f64> {
        let n = self.jmp_rel32 + self.jmp_springboard;
        (n > 0).then(|| {
            (self.jmp_rel32 as f64 * c.jmp_rel32 + self.jmp_springboard as f64 * c.jmp_springboard)
                / n as f64
        })
    }

    /// Expected cycles per hit when jmp is used where it can be and a trap elsewhere.
    pub fn hybrid_cost(&self, c: &HitCosts, trap_only_where_jmp_impossible: u64) -> Option<f64> {
        let n = self.jmp_rel32 + self.jmp_springboard + trap_only_where_jmp_impossible;
        (n > 0).then(|| {
            (self.jmp_rel32 as f64 * c.jmp_rel32
                + self.jmp_springboard as f64 * c.jmp_springboard
                + trap_only_where_jmp_impossible as f64 * c.trap)
                / n as f64
        })
    }
}

/// The planner's answers over a set, at every distance.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Coverage {
    pub set: String,
    pub functions: u64,
    /// Functions whose decoding stopped at an invalid instruction (their rest is not counted).
    pub undecodable_functions: u64,
    pub at: Vec<AtDistance>,
    /// Per distance: points where jmp is impossible but a trap works.
    pub trap_rescues: Vec<u64>,
}

/// One boundary's answers at every distance, for tests and the per-point listing.
#[derive(Clone, Debug)]
pub struct PointAnswers {
    pub site: u64,
    pub function: String,
    pub insn_len: usize,
    pub at: Vec<Answer>,
}

fn info_for(image: &CodeImage) -> TargetInfo {
    TargetInfo::for_code(image.kernel, image.name.clone())
}

/// Ask the planner about every boundary of `func_idx` of `image`, at every distance of `dists`;
/// `each` gets every boundary's answers.
pub fn plan_function(
    image: &CodeImage,
    func_idx: usize,
    dists: &[u64],
    mut each: impl FnMut(PointAnswers),
) -> bool {
    let fx = &image.functions[func_idx];
    let bytes = image.bytes_of(fx);
    let read = |a: u64, n: usize| image.read(a, n).map(<[u8]>::to_vec);
    let opts = AnalysisOptions {
        read: Some(&read),
        lenient: true,
        // As the splicer plans: in a process it knows every branch into a function from the
        // rest of its object; in the kernel it finds `.cold` parts by name only.
        object_targets: (!image.kernel).then(|| image.object_targets()),
    };
    let Ok(func) = analyze_function_with(&fx.name, fx.start, bytes, &opts) else {
        return false;
    };
    let info = info_for(image);
    let busy = |_: u64, _: u64| false;
    for insn in &func.insns {
        let site = insn.addr;
        let at = dists
            .iter()
            .map(|&d| {
                let input = PlanInput {
                    func: &func,
                    info: &info,
                    read: &read,
                    symbols: &image.symbols,
                    busy: &busy,
                    trampoline_near: Some(trampoline_at(site, d)),
                };
                answer(&input, site)
            })
            .collect();
        each(PointAnswers {
            site,
            function: fx.name.clone(),
            insn_len: insn.len,
            at,
        });
    }
    func.undecodable_from.is_none()
}

/// Where the patch buffer is put `d` bytes from `site`: above it, except in the upper half of
/// the address space (kernel text sits in its last 2 GiB), where it goes below so that the
/// distance is real and never wraps around the end.
pub fn trampoline_at(site: u64, d: u64) -> u64 {
    if site >= 1 << 63 {
        site - d
    } else {
        site + d
    }
}

/// The planner's answer at one site.
pub fn answer(input: &PlanInput<'_>, site: u64) -> Answer {
    let v = SiteVerdict::judge(input, site);
    let trap = v.trap.as_ref().map(|_| ()).map_err(refusal_kind);
    let (jmp, jmp_refusal) = match (&v.jmp_rel32, &v.jmp_springboard) {
        // No springboard was asked for: `jmp rel32` is possible.
        (Ok(_), _) | (_, None) => (JmpKind::Rel32, None),
        (Err(_), Some(Ok(_))) => (JmpKind::Rel8Springboard, None),
        // The 2-byte window passed but no padding holds a springboard: the reason is the
        // 5-byte window's refusal (named as a window that does not fit when it is its shape).
        // Otherwise the 2-byte window failed too, and its refusal says why, unless the
        // trampoline was out of reach to begin with.
        (Err(e32), Some(Err(Refusal::NoRoomForJmp { .. })))
            if !matches!(e32, Refusal::OutOfReach { .. }) =>
        {
            (
                JmpKind::Impossible,
                Some(match e32 {
                    Refusal::FunctionTooShort { .. }
                    | Refusal::PastFunctionEnd { .. }
                    | Refusal::BranchTargetInWindow { .. }
                    | Refusal::OutsideTargetInWindow { .. }
                    | Refusal::LandingPadInWindow { .. }
                    | Refusal::WindowCrossesBlock { .. } => {
                        "5-byte window does not fit, no springboard padding"
                    }
                    other => refusal_kind(other),
                }),
            )
        }
        (Err(e32), Some(Err(e8))) => (
            JmpKind::Impossible,
            Some(if matches!(e32, Refusal::OutOfReach { .. }) {
                refusal_kind(e32)
            } else {
                refusal_kind(e8)
            }),
        ),
    };
    Answer {
        trap,
        jmp,
        jmp_refusal,
    }
}

/// Coverage of `set` at `dists`, on `threads` threads; `progress` is called with the number of
/// functions done so far.
pub fn coverage(
    set: &CodeSet,
    dists: &[u64],
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Coverage {
    let threads = threads.max(1);
    let chunks: Vec<Vec<usize>> = (0..threads)
        .map(|t| {
            set.functions
                .iter()
                .copied()
                .skip(t)
                .step_by(threads)
                .collect()
        })
        .collect();
    let done = std::sync::atomic::AtomicU64::new(0);
    let parts: Vec<(Vec<AtDistance>, Vec<u64>, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let done = &done;
                s.spawn(move || {
                    let mut at: Vec<AtDistance> = dists
                        .iter()
                        .map(|&d| AtDistance {
                            distance: d,
                            ..Default::default()
                        })
                        .collect();
                    let mut rescues = vec![0u64; dists.len()];
                    let mut undecodable = 0u64;
                    for &fi in chunk {
                        let whole = plan_function(&set.image, fi, dists, |p| {
                            for (i, a) in p.at.iter().enumerate() {
                                at[i].add(a);
                                if a.jmp == JmpKind::Impossible && a.trap.is_ok() {
                                    rescues[i] += 1;
                                }
                            }
                        });
                        undecodable += u64::from(!whole);
                        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        progress(n);
                    }
                    (at, rescues, undecodable)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a planning thread panicked"))
            .collect()
    });
    let mut out = Coverage {
        set: set.name.clone(),
        functions: set.functions.len() as u64,
        at: dists
            .iter()
            .map(|&d| AtDistance {
                distance: d,
                ..Default::default()
            })
            .collect(),
        trap_rescues: vec![0; dists.len()],
        undecodable_functions: 0,
    };
    for (at, rescues, und) in parts {
        for (o, a) in out.at.iter_mut().zip(&at) {
            o.merge(a);
        }
        for (o, r) in out.trap_rescues.iter_mut().zip(rescues) {
            *o += r;
        }
        out.undecodable_functions += und;
    }
    out
}

/// One point of a cost curve.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CurvePoint {
    pub distance: u64,
    pub trap_coverage: f64,
    pub jmp_coverage: f64,
    pub either_coverage: f64,
    /// Cycles per hit; `None` where the mechanism covers no point.
    pub trap_cycles: Option<f64>,
    pub jmp_cycles: Option<f64>,
    pub hybrid_cycles: Option<f64>,
}

impl Coverage {
    /// The cost curves with `costs`.
    pub fn curve(&self, costs: &HitCosts) -> Vec<CurvePoint> {
        self.at
            .iter()
            .zip(&self.trap_rescues)
            .map(|(a, &r)| CurvePoint {
                distance: a.distance,
                trap_coverage: a.trap_coverage(),
                jmp_coverage: a.jmp_coverage(),
                either_coverage: a.either_coverage(),
                trap_cycles: a.trap_cost(costs),
                jmp_cycles: a.jmp_cost(costs),
                hybrid_cycles: a.hybrid_cost(costs, r),
            })
            .collect()
    }
}

/// `1 KiB`, `2 GiB - 1 MiB`, ... for distances.
pub fn human_distance(d: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
        (1, "B"),
    ];
    for &(u, name) in &UNITS {
        if d >= u && d.is_multiple_of(u) {
            return format!("{} {name}", d / u);
        }
    }
    if d > 1 << 31 {
        format!("2 GiB + {}", human_distance(d - (1 << 31)))
    } else if d < 1 << 31 && d > 1 << 30 {
        format!("2 GiB - {}", human_distance((1 << 31) - d))
    } else {
        format!("{d} B")
    }
}

/// Header of [`points_csv`].
pub const POINTS_CSV_HEADER: &str = "set,function,offset,site,insn_len,trap,jmp,jmp_refusal\n";

/// One CSV line per instruction boundary of `set`, with the patch buffer [`DISTANCES`]`[0]`
/// away: the trap's answer (`ok` or the refusal's kind) and the jmp's.
pub fn points_csv(set: &CodeSet) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for &fi in &set.functions {
        plan_function(&set.image, fi, &DISTANCES[..1], |p| {
            let a = p.at[0];
            let start = set.image.functions[fi].start;
            let jmp = match a.jmp {
                JmpKind::Rel32 => "rel32",
                JmpKind::Rel8Springboard => "rel8+springboard",
                JmpKind::Impossible => "impossible",
            };
            let _ = writeln!(
                s,
                "\"{}\",{},{},{:#x},{},{},{},{}",
                set.name,
                p.function,
                p.site - start,
                p.site,
                p.insn_len,
                a.trap.err().unwrap_or("ok"),
                jmp,
                a.jmp_refusal.unwrap_or("")
            );
        });
    }
    s
}
