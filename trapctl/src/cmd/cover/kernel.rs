//! `trapctl cover GLOB... [--seconds N | -- COMMAND ARGS...]`: block coverage of the running
//! kernel.
//!
//! Every basic block of every kallsyms function the globs name ([`kernel_blocks`]) gets a count
//! trap at its first instruction (the entry block's past the kernel's entry bytes), all sent as
//! ONE best-effort `apply` of a generated spec (through trapd when it runs, else straight to
//! the module, as `trapctl apply` goes): a block the planner or the module refuses is listed
//! with its reason, never fatal. The command runs (or the time passes, or a signal comes: the
//! watch of [`crate::hold`] starts before anything is armed, so SIGINT and SIGTERM still end
//! in the removal), then every site is removed and its final hits, which the removal returns,
//! are the block's count. Without trapd the removal is one batch on the module, held locked
//! meanwhile; through trapd it is one `remove` request of every site.

use std::collections::HashMap;
use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use instr_manager::cover::{kernel_blocks, lcov_with, symbol_records, BlockHits, BlockRefusal};
use instr_manager::cover::{KernelBlock, LineTable};
use instr_manager::glob::{matching_functions, FunctionGlob};
use instr_manager::image::CodeImage;
use instr_manager::ops::{self, ApplyReport, ListReply};
use instr_manager::owner::Owner;
use instr_manager::splicer::SpliceId;
use instr_manager::{Action, Mechanism, SpliceRequest};
use serde::Serialize;
use trapvec::kernel::KernelTarget;
use trapvec::Target as _;
use trapvec_proto::client;
use trapvec_proto::Request;

use super::table::{self, BlockRow, FunctionRow, Home, RefusedBlock, Tally, Total};
use super::{Args, SCHEMA};
use crate::hold::{self, Ended, Span};
use crate::kernel::Kernel;
use crate::route;

#[cfg(test)]
mod tests {
    #[test]
    fn refusal_kinds_leave_the_addresses_out() {
        assert_eq!(
            super::kind_of("the window [0xffffffff810b0fc3, 0xffffffff810b0fc5) crosses `int3`"),
            "the window [.., ..) crosses `int3`"
        );
        assert_eq!(super::kind_of("in noinstr text"), "in noinstr text");
    }
}

/// The kernel's own fields of a block's row ([`BlockRow`]).
#[derive(Serialize)]
pub(super) struct InKernel {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) module: Option<String>,
    /// Where its trap went (past the entry bytes for an entry block), if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) site: Option<String>,
    /// The site's hits (`None`: no site).
    pub(super) count: Option<u64>,
}

#[derive(Serialize)]
struct Report {
    schema: u32,
    target: &'static str,
    globs: Vec<String>,
    command: Vec<String>,
    mode: &'static str,
    /// What ended the run: `time`, `command`, or the signal (`SIGINT`, `SIGTERM`, `SIGHUP`).
    ended: &'static str,
    seconds: f64,
    /// Milliseconds to arm every site (the one batch, as the caller sees it) and to disarm them.
    arm_ms: f64,
    disarm_ms: f64,
    /// `once` mode: how many batches disarmed hit sites while the run lasted.
    #[serde(skip_serializing_if = "Option::is_none")]
    disarm_batches: Option<usize>,
    /// Where the time to arm went, before and inside the batch.
    stages: Stages,
    functions: Vec<FunctionRow>,
    blocks: Vec<BlockRow<InKernel>>,
    total: Total,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// The text's refused blocks (`blocks` says the same in JSON).
    #[serde(skip)]
    refused: Vec<RefusedBlock>,
}

/// Where the time to arm the sites went, in milliseconds: opening the target (`/proc/kallsyms`
/// read and parsed, the module's or trapd's state), decoding the functions into blocks and
/// choosing their sites, writing the spec, and the apply (`arm_ms`), of which the batch's own
/// plan (and of it the module's checks), build (the module's ALLOC, WRITE and SEAL ioctls) and
/// commit (the text batch) when the route reports them.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Stages {
    open_ms: f64,
    decode_ms: f64,
    spec_ms: f64,
    apply_ms: f64,
    plan_ms: Option<f64>,
    /// Of `plan_ms`, the module's checks of the windows (its CHECK, one per site).
    check_ms: Option<f64>,
    build_ms: Option<f64>,
    commit_ms: Option<f64>,
}

/// The blocks of the functions `globs` name, read from `target`.
fn blocks(target: &KernelTarget, globs: &[FunctionGlob]) -> (usize, Vec<KernelBlock>) {
    let funcs = matching_functions(target.symbols(), globs);
    let read = |a: u64, n: usize| target.read_code(a, n).ok();
    let blocks = kernel_blocks(&funcs, target.symbols(), &read, target.info().has_fentry);
    (funcs.len(), blocks)
}

/// The spec's points: every block with a site, by its site's address (unambiguous where
/// kallsyms repeats a name, and the same text for vmlinux and modules).
fn requests(blocks: &[KernelBlock], owner: &Owner) -> Vec<(usize, SpliceRequest)> {
    blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.block.site.is_ok())
        .map(|(i, b)| {
            let mut r =
                SpliceRequest::new(format!("{:#x}", b.site), Action::Count, Mechanism::Trap);
            r.options.owner = Some(owner.clone());
            (i, r)
        })
        .collect()
}

/// The spec file of `requests`, written where only this command writes.
fn write_spec(requests: &[SpliceRequest]) -> Result<std::path::PathBuf> {
    let text = ops::expand::spec_text(requests)?;
    let path = std::env::temp_dir().join(format!("trapctl-cover-{}.toml", std::process::id()));
    let _ = std::fs::remove_file(&path);
    // create_new: never through a file (or link) someone else put there.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Mark the blocks the batch refused with their reasons (a refusal's chain starts with its
/// point), and return, per block index, its live splice: (id, site text).
fn armed(
    blocks: &mut [KernelBlock],
    wanted: &[(usize, SpliceRequest)],
    report: &ApplyReport,
) -> HashMap<usize, (u64, String)> {
    let by_at: HashMap<&str, usize> = wanted.iter().map(|(i, r)| (r.at.as_str(), *i)).collect();
    let mut live = HashMap::new();
    for row in &report.spliced {
        if let Some(&i) = by_at.get(row.at.as_str()) {
            live.insert(i, (row.id, row.site.clone()));
        }
    }
    // (chain, reason, cause): the reason is the cause's sentence when the report has one.
    let mut reasons: HashMap<&str, (&str, Option<&str>, Option<&str>)> = HashMap::new();
    for (i, chain) in report.refused.iter().enumerate() {
        if let Some((at, _)) = chain.split_once(": ") {
            let reason = report.refused_reasons.get(i).map(String::as_str);
            let cause = report.refused_causes.get(i).and_then(Option::as_deref);
            reasons.entry(at).or_insert((chain, reason, cause));
        }
    }
    for (i, r) in wanted {
        if live.contains_key(i) {
            continue;
        }
        let (chain, reason, cause) = reasons.get(r.at.as_str()).copied().unwrap_or((
            "refused by the batch (no reason given)",
            None,
            None,
        ));
        // The cause's name, as `trapctl points` and a glob's summary name it; an error with
        // none is counted by its text, addresses left out.
        let kind = cause.map_or_else(
            || {
                kind_of(
                    &reason.map_or_else(|| ops::expand::reason_of(&r.at, chain), str::to_string),
                )
            },
            str::to_string,
        );
        blocks[*i].block.site = Err(BlockRefusal {
            kind,
            reason: chain.to_string(),
        });
    }
    live
}

/// The reason of a refusal with no cause, its addresses left out (`the window [.., ..)
/// crosses ...`), so that the blocks refused for one such reason are counted together.
fn kind_of(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len());
    let mut rest = reason;
    while let Some(i) = rest.find("0x") {
        out.push_str(&rest[..i]);
        let hex = rest[i + 2..]
            .find(|c: char| !c.is_ascii_hexdigit())
            .map_or(rest.len(), |n| i + 2 + n);
        out.push_str("..");
        rest = &rest[hex..];
    }
    out.push_str(rest);
    out
}

/// Where the sites live: trapd, or the module held by this command from arming to removal.
enum Route {
    Daemon,
    Direct(Box<Kernel>),
}

/// Run `trapctl cover` on the kernel.
pub fn run(args: &Args) -> Result<()> {
    if let Some(s) = args.seconds {
        if !(s.is_finite() && s >= 0.0) {
            bail!("--seconds {s}: give a finite, non-negative number of seconds");
        }
    }
    let globs = args
        .globs
        .iter()
        .map(|g| FunctionGlob::new(g))
        .collect::<Result<Vec<_>, _>>()?;
    let span = Span {
        seconds: args.seconds,
        command: args.command.iter().map(Into::into).collect(),
    };
    // Before anything is armed: a signal from now on waits, pending, until the sites are
    // removed.
    let watch = hold::Watch::start()?;
    let mut stages = Stages::default();
    let t_open = Instant::now();
    let (mut route, (nfuncs, mut blocks)) = if client::is_listening(route::socket()) {
        let target = KernelTarget::open()?;
        stages.open_ms = ms(t_open.elapsed());
        let t = Instant::now();
        let b = blocks(&target, &globs);
        stages.decode_ms = ms(t.elapsed());
        (Route::Daemon, b)
    } else {
        let k = Kernel::open()?;
        stages.open_ms = ms(t_open.elapsed());
        let t = Instant::now();
        let b = blocks(k.target(), &globs);
        stages.decode_ms = ms(t.elapsed());
        (Route::Direct(Box::new(k)), b)
    };
    if nfuncs == 0 {
        bail!(
            "no kernel function matches {} (globs name /proc/kallsyms functions; `MOD:GLOB` for a module's)",
            args.globs.join(" ")
        );
    }
    let command: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let owner = Owner::current(command.join(" "))?;
    let t_spec = Instant::now();
    let wanted = requests(&blocks, &owner);
    let only: Vec<SpliceRequest> = wanted.iter().map(|(_, r)| r.clone()).collect();
    let path = write_spec(&only)?;
    stages.spec_ms = ms(t_spec.elapsed());
    let apply = Request::Apply {
        spec: path.clone(),
        best_effort: true,
        check: false,
    };
    let t0 = Instant::now();
    let applied: Result<ApplyReport> = if only.is_empty() {
        Ok(ApplyReport {
            components: Vec::new(),
            spliced: Vec::new(),
            refused: Vec::new(),
            refused_reasons: Vec::new(),
            refused_causes: Vec::new(),
            refusals: Vec::new(),
            requested: 0,
            timings: None,
        })
    } else {
        match &mut route {
            Route::Daemon => route::change(&apply, |_| {}),
            Route::Direct(k) => route::execute::<ApplyReport>(k, &apply).and_then(|(r, made)| {
                k.commit_or_undo(&made)?;
                Ok(r)
            }),
        }
    };
    let _ = std::fs::remove_file(&path);
    // The batch refused as a whole (not one block: the module's own error): nothing is armed.
    let report = applied.context("arming the coverage sites (nothing was armed)")?;
    let arm = t0.elapsed();
    stages.apply_ms = ms(arm);
    if let Some(t) = report.timings {
        stages.plan_ms = Some(t.plan_ms);
        stages.check_ms = Some(t.check_ms);
        stages.build_ms = Some(t.build_ms);
        stages.commit_ms = Some(t.commit_ms);
    }
    let live = armed(&mut blocks, &wanted, &report);
    eprintln!(
        "covering {} block(s) of {nfuncs} function(s) {} ({} refused; armed in {:.1} ms)",
        live.len(),
        span.describe(),
        blocks.len() - live.len(),
        ms(arm)
    );
    let start = Instant::now();
    let mut live = live;
    let mut once = Once::default();
    let waited = match watch.pending() {
        Ok(Some(signal)) => Ok(Ended::Signal(signal)),
        Ok(None) => hold::spawn(&span).and_then(|mut c| match args.mode {
            super::Mode::Count => watch.wait(&span, c.as_mut(), start),
            super::Mode::Once => once.wait(&watch, &span, c.as_mut(), start, &mut route, &mut live),
        }),
        Err(e) => Err(e),
    };
    let elapsed = start.elapsed();
    // Whatever happened, the sites go.
    let t1 = Instant::now();
    let removed = remove(&mut route, &live).map(|mut hits| {
        hits.extend(once.hits.iter().map(|(&i, &n)| (i, n)));
        hits
    });
    let disarm = t1.elapsed();
    let ended = match (waited, removed) {
        (Ok(ended), Ok(hits)) => {
            let mut r = report_of(
                args,
                &span,
                &blocks,
                &hits,
                nfuncs,
                (ended, elapsed, arm, disarm),
                stages,
            )?;
            if args.mode == super::Mode::Once {
                r.disarm_batches = Some(once.batches);
            }
            output(args, r)?;
            ended
        }
        (Err(e), Ok(_)) => return Err(e),
        (Ok(_), Err(r)) => return Err(r),
        (Err(e), Err(r)) => {
            return Err(e.context(format!(
                "and removing the coverage sites failed: {}",
                trapvec::error_chain(r.as_ref())
            )))
        }
    };
    hold::finish(&watch, ended)
}

/// How often `once` mode reads the live sites' hits and disarms those hit.
const ONCE_PERIOD: Duration = Duration::from_millis(100);

/// `once` mode: while the run lasts, every [`ONCE_PERIOD`] the sites hit since the last look are
/// disarmed in one batch (their original bytes back), so a block costs a trap only until the
/// next batch after its first hit. The module keeps no state of its own for it: the hits of the
/// live sites are read as `trapctl list` reads them, and the removal is the one `count` mode
/// ends with (one batch on the module, or one `remove` request to trapd).
#[derive(Default)]
struct Once {
    /// The hits each disarmed block had when it was disarmed (at least 1).
    hits: HashMap<usize, u64>,
    batches: usize,
}

impl Once {
    /// [`hold::Watch::wait`] in steps of [`ONCE_PERIOD`], disarming the hit sites of `live`
    /// (and moving them out of it) after each step that ends on time.
    fn wait(
        &mut self,
        watch: &hold::Watch,
        span: &Span,
        mut child: Option<&mut std::process::Child>,
        start: Instant,
        route: &mut Route,
        live: &mut HashMap<usize, (u64, String)>,
    ) -> Result<Ended> {
        loop {
            let now = Instant::now();
            let left = span
                .seconds
                .map(|s| Duration::from_secs_f64(s).saturating_sub(now - start));
            let step = Span {
                seconds: Some(
                    left.map_or(ONCE_PERIOD, |l| l.min(ONCE_PERIOD))
                        .as_secs_f64(),
                ),
                command: Vec::new(),
            };
            let ended = watch.wait(&step, child.as_deref_mut(), now)?;
            let over = !matches!(ended, Ended::Elapsed) || left.is_some_and(|l| l <= ONCE_PERIOD);
            if over {
                return Ok(ended);
            }
            self.disarm_hit(route, live)?;
        }
    }

    /// Disarm, in one batch, every site of `live` that was hit.
    fn disarm_hit(
        &mut self,
        route: &mut Route,
        live: &mut HashMap<usize, (u64, String)>,
    ) -> Result<()> {
        let now = live_hits(route, live)?;
        let hit: HashMap<usize, (u64, String)> = live
            .iter()
            .filter(|(i, _)| now.get(i).is_some_and(|&n| n > 0))
            .map(|(&i, v)| (i, v.clone()))
            .collect();
        if hit.is_empty() {
            return Ok(());
        }
        let got = remove(route, &hit).context("disarming the sites hit (once mode)")?;
        self.batches += 1;
        for (i, n) in got {
            live.remove(&i);
            self.hits.insert(i, n);
        }
        Ok(())
    }
}

/// The hits of every site of `live` now, per block index.
fn live_hits(
    route: &mut Route,
    live: &HashMap<usize, (u64, String)>,
) -> Result<HashMap<usize, u64>> {
    let mut out = HashMap::with_capacity(live.len());
    match route {
        Route::Direct(k) => {
            let order: Vec<(usize, u64)> = live.iter().map(|(&i, (id, _))| (i, *id)).collect();
            let ids: Vec<SpliceId> = order.iter().map(|&(_, id)| SpliceId(id)).collect();
            let hits = k
                .splicer
                .hits_many(&ids)
                .context("reading the coverage sites' hits")?;
            for (&(i, _), h) in order.iter().zip(hits) {
                out.insert(i, h.hits);
            }
        }
        Route::Daemon => {
            let listing = route::read::<ListReply>(&Request::List)
                .context("reading the coverage sites' hits from trapd")?
                .listing;
            let by_site: HashMap<&str, u64> = listing
                .splices
                .iter()
                .map(|r| (r.site.as_str(), r.hits))
                .collect();
            for (&i, (_, site)) in live {
                if let Some(&n) = by_site.get(site.as_str()) {
                    out.insert(i, n);
                }
            }
        }
    }
    Ok(out)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Remove every live site in one batch: on the module held, or by one `remove` request to trapd.
/// The final hits per block index.
fn remove(route: &mut Route, live: &HashMap<usize, (u64, String)>) -> Result<HashMap<usize, u64>> {
    let mut order: Vec<(usize, u64, &str)> = live
        .iter()
        .map(|(&i, (id, site))| (i, *id, site.as_str()))
        .collect();
    order.sort_unstable();
    let mut hits = HashMap::new();
    match route {
        Route::Direct(k) => {
            let ids: Vec<SpliceId> = order.iter().map(|&(_, id, _)| SpliceId(id)).collect();
            if ids.is_empty() {
                return Ok(hits);
            }
            let got = k.splicer.remove(&ids);
            // Whatever was removed is saved (a quiescence refused leaves them retiring).
            let saved = k.save();
            let got = got.context("removing the coverage sites")?;
            saved?;
            for (&(i, _, _), h) in order.iter().zip(got) {
                hits.insert(i, h.hits);
            }
        }
        Route::Daemon => {
            if order.is_empty() {
                return Ok(hits);
            }
            let at: Vec<String> = order.iter().map(|&(_, _, s)| s.to_string()).collect();
            let removed = route::remove(at).context("removing the coverage sites through trapd")?;
            let by_site: HashMap<&str, u64> =
                removed.iter().map(|u| (u.site.as_str(), u.hits)).collect();
            for &(i, _, site) in &order {
                let n = by_site.get(site).with_context(|| {
                    format!("trapd's removal of the coverage sites does not list {site}")
                })?;
                hits.insert(i, *n);
            }
        }
    }
    Ok(hits)
}

fn report_of(
    args: &Args,
    span: &Span,
    blocks: &[KernelBlock],
    hits: &HashMap<usize, u64>,
    nfuncs: usize,
    (ended, elapsed, arm, disarm): (Ended, Duration, Duration, Duration),
    stages: Stages,
) -> Result<Report> {
    let mut rows = Vec::with_capacity(blocks.len());
    let mut tally = Tally::default();
    for (i, b) in blocks.iter().enumerate() {
        let count = hits.get(&i).copied();
        let hit = count.is_some_and(|n| n > 0);
        let home = Home {
            object: None,
            module: b.module.as_deref(),
            qualifier: b.module.as_deref(),
        };
        tally.add(home, &b.block, hit);
        let on = InKernel {
            module: b.module.clone(),
            site: count.map(|_| format!("{:#x}", b.site)),
            count,
        };
        rows.push(BlockRow::of(&b.block, hit, on));
    }
    let table = tally.finish(nfuncs);
    let mut notes = Vec::new();
    if let Some(path) = &args.lcov {
        let text = lcov_text(args, blocks, hits, &mut notes);
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(Report {
        schema: SCHEMA,
        target: "kernel",
        globs: args.globs.clone(),
        command: args.command.clone(),
        mode: match args.mode {
            super::Mode::Count => "count",
            super::Mode::Once => "once",
        },
        ended: ended.name(),
        seconds: span.seconds_held(&ended, elapsed),
        arm_ms: ms(arm),
        disarm_ms: ms(disarm),
        disarm_batches: None,
        stages,
        total: table.total,
        functions: table.functions,
        blocks: rows,
        notes,
        refused: table.refused,
    })
}

/// vmlinux's debug file: --debuginfo, else where Debian's and Fedora's debug packages put it.
fn vmlinux_debuginfo(args: &Args) -> Option<std::path::PathBuf> {
    if let Some(d) = &args.debuginfo {
        return Some(d.clone());
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let release = release.trim();
    [
        format!("/usr/lib/debug/boot/vmlinux-{release}"),
        format!("/usr/lib/debug/lib/modules/{release}/vmlinux"),
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_file())
}

/// The lcov file: source lines for vmlinux's blocks when its debug file is known (run-time
/// addresses moved back by the KASLR offset, `_text` here against `_text` there), symbol+offset
/// records for the rest, with a note saying why.
fn lcov_text(
    args: &Args,
    blocks: &[KernelBlock],
    hits: &HashMap<usize, u64>,
    notes: &mut Vec<String>,
) -> String {
    let (vmlinux, modules): (Vec<_>, Vec<_>) = blocks
        .iter()
        .enumerate()
        .partition(|(_, b)| b.module.is_none());
    let mut out = String::new();
    let records =
        |list: &[(usize, &KernelBlock)], shift: u64| -> Vec<(KernelBlockAt, Option<u64>)> {
            list.iter()
                .map(|(i, b)| {
                    let mut c = b.block.clone();
                    c.func_addr = c.func_addr.wrapping_sub(shift);
                    c.start = c.start.wrapping_sub(shift);
                    c.end = c.end.wrapping_sub(shift);
                    (c, hits.get(i).copied())
                })
                .collect()
        };
    if !vmlinux.is_empty() {
        let lines = vmlinux_debuginfo(args)
            .ok_or_else(|| {
                "no debug file for vmlinux (give --debuginfo, or install the kernel's debug package: /usr/lib/debug/boot/vmlinux-RELEASE)".to_string()
            })
            .and_then(|path| {
                let shift = kaslr_shift(&path, blocks)?;
                let table = LineTable::read(&path)
                    .map_err(|e| trapvec::error_chain(&e))?;
                Ok((table, shift))
            });
        match lines {
            Ok((table, shift)) => {
                let recs = records(&vmlinux, shift);
                let bh: Vec<BlockHits<'_>> = recs
                    .iter()
                    .map(|(block, hits)| BlockHits { block, hits: *hits })
                    .collect();
                // Branch counts need every hit counted: not in once mode.
                out.push_str(&lcov_with(
                    "trapctl_cover",
                    &bh,
                    &table,
                    args.mode == super::Mode::Count,
                ));
            }
            Err(why) => {
                notes.push(format!(
                    "vmlinux: symbol+offset records in the lcov file: {why}"
                ));
                let recs = records(&vmlinux, 0);
                out.push_str(&symbol_records("vmlinux", &why, &as_hits(&recs)));
            }
        }
    }
    if !modules.is_empty() {
        let why = "module debug files are not read yet";
        notes.push(format!(
            "modules: symbol+offset records in the lcov file: {why}"
        ));
        let recs = records(&modules, 0);
        out.push_str(&symbol_records("modules", why, &as_hits(&recs)));
    }
    out
}

type KernelBlockAt = instr_manager::cover::CoverBlock;

fn as_hits(recs: &[(KernelBlockAt, Option<u64>)]) -> Vec<BlockHits<'_>> {
    recs.iter()
        .map(|(block, hits)| BlockHits { block, hits: *hits })
        .collect()
}

/// How far the running kernel's text is from the debug file's (KASLR): a vmlinux function's
/// run-time address minus its address in the file.
fn kaslr_shift(path: &std::path::Path, blocks: &[KernelBlock]) -> Result<u64, String> {
    let image = CodeImage::from_path(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let b = blocks
        .iter()
        .find(|b| b.module.is_none())
        .ok_or("no vmlinux block")?;
    let file = image
        .symbols
        .lookup(&b.block.function)
        .ok_or_else(|| format!("{} has no symbol {}", path.display(), b.block.function))?;
    Ok(b.block.func_addr.wrapping_sub(file.addr))
}

fn output(args: &Args, r: Report) -> Result<()> {
    let out = if args.json {
        serde_json::to_string_pretty(&r)? + "\n"
    } else {
        render_text(&r)
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            crate::print(&out)?;
            let _ = std::io::stdout().flush();
            Ok(())
        }
    }
}

fn render_text(r: &Report) -> String {
    let ended = format!(
        "ended by {} after {:.2} s; armed in {:.1} ms, disarmed in {:.1} ms",
        r.ended, r.seconds, r.arm_ms, r.disarm_ms
    );
    table::render(&r.functions, &r.refused, &r.total, &ended, &r.notes)
}
