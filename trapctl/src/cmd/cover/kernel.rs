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

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use instr_manager::cover::{kernel_blocks, lcov_with, symbol_records, BlockHits, BlockRefusal};
use instr_manager::cover::{CoverBlock, KernelBlock, LineTable};
use instr_manager::glob::{matching_functions, FunctionGlob};
use instr_manager::ops::{self, ApplyReport, ListReply};
use instr_manager::owner::Owner;
use instr_manager::splicer::SpliceId;
use instr_manager::{Action, Mechanism, SpliceRequest};
use serde::{Deserialize, Serialize};
use trapvec::kernel::KernelTarget;
use trapvec::Target as _;
use trapvec_proto::client;
use trapvec_proto::Request;

use super::debugfile::{DebugFile, NoLines};
use super::table::{self, BlockRow, FunctionRow, Home, RefusedBlock, Tally, Total};
use super::{saved, Args, SCHEMA};
use crate::hold::{self, Ended, Span};
use crate::kernel::Kernel;
use crate::route;

#[cfg(test)]
mod tests {
    #[test]
    fn blocks_over_the_batch_limit_are_refused_in_order() {
        use instr_manager::cover::{BlockRefusal, CoverBlock, KernelBlock};
        use instr_manager::Mechanism;
        let block = |start: u64, site: Result<Mechanism, BlockRefusal>| KernelBlock {
            block: CoverBlock {
                function: "f".into(),
                func_addr: 0x1000,
                start,
                end: start + 4,
                site,
                succs: Vec::new(),
                branch: None,
                shared_name: false,
            },
            module: None,
            site: start,
        };
        let refused = || {
            Err(BlockRefusal {
                kind: "undefined_opcode".into(),
                reason: "ud2".into(),
            })
        };
        let mut blocks = vec![
            block(0x1000, Ok(Mechanism::Trap)),
            block(0x1004, refused()),
            block(0x1008, Ok(Mechanism::Trap)),
            block(0x100c, Ok(Mechanism::Trap)),
            block(0x1010, Ok(Mechanism::Trap)),
        ];
        assert_eq!(super::cap_to_batch(&mut blocks, 2), 2);
        let kinds: Vec<String> = blocks
            .iter()
            .map(|b| match &b.block.site {
                Ok(_) => "site".into(),
                Err(r) => r.kind.clone(),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "site",
                "undefined_opcode",
                "site",
                super::OVER_BATCH,
                super::OVER_BATCH
            ]
        );
        let Err(r) = &blocks[4].block.site else {
            unreachable!()
        };
        assert!(
            r.reason
                .starts_with("one batch of the module takes at most 2 sites and 4 blocks"),
            "{}",
            r.reason
        );
        assert_eq!(
            super::cap_to_batch(&mut blocks, 2),
            0,
            "within the limit now"
        );
    }

    #[test]
    fn refusal_kinds_leave_the_addresses_out() {
        assert_eq!(
            super::kind_of("the window [0xffffffff810b0fc3, 0xffffffff810b0fc5) crosses `int3`"),
            "the window [.., ..) crosses `int3`"
        );
        assert_eq!(super::kind_of("in noinstr text"), "in noinstr text");
    }

    /// `/sys/kernel/notes` as a kernel has it: another note first (Xen's), then GNU's build-id.
    #[test]
    fn the_build_id_is_found_among_the_kernels_notes() {
        let note = |name: &[u8], kind: u32, desc: &[u8]| {
            let mut n = Vec::new();
            n.extend(u32::try_from(name.len()).unwrap().to_le_bytes());
            n.extend(u32::try_from(desc.len()).unwrap().to_le_bytes());
            n.extend(kind.to_le_bytes());
            n.extend(name);
            n.resize(n.len().div_ceil(4) * 4, 0);
            n.extend(desc);
            n.resize(n.len().div_ceil(4) * 4, 0);
            n
        };
        let id: Vec<u8> = (0..20).collect();
        let mut notes = note(b"Xen\0", 6, b"linux\0");
        assert_eq!(super::gnu_build_id(&notes), None);
        notes.extend(note(b"GNU\0", 3, &id));
        assert_eq!(
            super::gnu_build_id(&notes).as_deref(),
            Some("000102030405060708090a0b0c0d0e0f10111213")
        );
        // Cut short: none, no panic.
        assert_eq!(super::gnu_build_id(&notes[..notes.len() - 3]), None);
    }
}

/// The kernel's own fields of a block's row ([`BlockRow`]).
#[derive(Serialize, Deserialize)]
pub(super) struct InKernel {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) module: Option<String>,
    /// Where its trap went (past the entry bytes for an entry block), if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) site: Option<String>,
    /// The site's hits (`None`: no site).
    pub(super) count: Option<u64>,
}

/// The kernel's report (`--json`), also as `--from-json` reads it back.
#[derive(Serialize, Deserialize)]
pub(super) struct Report {
    schema: u32,
    target: String,
    /// The kernel covered: its release (`uname -r`), its GNU build-id (from
    /// `/sys/kernel/notes`, as the debug file's `.note.gnu.build-id` has it) and the run-time
    /// address of `_text` (vmlinux's KASLR slide is this less the debug file's `_text`), so that
    /// a saved report's lines can be made later against the right debug file.
    #[serde(default)]
    release: Option<String>,
    #[serde(default)]
    build_id: Option<String>,
    #[serde(default)]
    text_address: Option<String>,
    globs: Vec<String>,
    command: Vec<String>,
    mode: String,
    /// What ended the run: `time`, `command`, or the signal (`SIGINT`, `SIGTERM`, `SIGHUP`).
    ended: String,
    seconds: f64,
    /// Milliseconds to arm every site (the one batch, as the caller sees it) and to disarm them.
    arm_ms: f64,
    disarm_ms: f64,
    /// `once` mode: how many batches disarmed hit sites while the run lasted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disarm_batches: Option<usize>,
    /// Where the time to arm went, before and inside the batch.
    stages: Stages,
    functions: Vec<FunctionRow>,
    blocks: Vec<BlockRow<InKernel>>,
    total: Total,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
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

/// The refusal kind of the blocks over [`cap_to_batch`]'s limit.
const OVER_BATCH: &str = "over_batch_limit";

/// Keep at most `max` of `blocks`' sites (the first, in the order of `blocks`: functions by
/// address, blocks in order), the module's limit for one batch (`TRAPVEC_BATCH_MAX`, 262,144):
/// every later block is refused with its reason. Without it, a batch over the limit would be
/// planned and built whole (a million blocks for the whole traceable text, gigabytes of user
/// memory) and then refused by the module whole. Returns how many were refused so.
fn cap_to_batch(blocks: &mut [KernelBlock], max: usize) -> usize {
    let with_site = blocks.iter().filter(|b| b.block.site.is_ok()).count();
    let mut kept = 0;
    let mut over = 0;
    for b in blocks.iter_mut().filter(|b| b.block.site.is_ok()) {
        if kept < max {
            kept += 1;
            continue;
        }
        over += 1;
        b.block.site = Err(BlockRefusal {
            kind: OVER_BATCH.into(),
            reason: format!(
                "one batch of the module takes at most {max} sites and {with_site} blocks could take one: the first {max} (functions in address order) are armed; cover the rest with narrower globs in another run"
            ),
        });
    }
    over
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
    // JSON: read about nine times as fast as the same spec in TOML (instr_manager::spec).
    let text = ops::expand::spec_json(requests)?;
    let path = std::env::temp_dir().join(format!("trapctl-cover-{}.json", std::process::id()));
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
    // `placed` from a brief apply, `spliced` rows from a trapd that does not know it.
    let made = report.placed.iter().map(|p| (p.id, &p.at, &p.site));
    let rows = report.spliced.iter().map(|r| (r.id, &r.at, &r.site));
    for (id, at, site) in made.chain(rows) {
        if let Some(&i) = by_at.get(at.as_str()) {
            live.insert(i, (id, site.clone()));
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
    let (mut route, (nfuncs, mut blocks), id) = if client::is_listening(route::socket()) {
        let target = KernelTarget::open()?;
        stages.open_ms = ms(t_open.elapsed());
        let t = Instant::now();
        let b = blocks(&target, &globs);
        stages.decode_ms = ms(t.elapsed());
        (Route::Daemon, b, Identity::of(&target))
    } else {
        let k = Kernel::open()?;
        stages.open_ms = ms(t_open.elapsed());
        let t = Instant::now();
        let b = blocks(k.target(), &globs);
        stages.decode_ms = ms(t.elapsed());
        let id = Identity::of(k.target());
        (Route::Direct(Box::new(k)), b, id)
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
    let over = cap_to_batch(&mut blocks, trapvec::abi::TRAPVEC_BATCH_MAX as usize);
    if over > 0 {
        eprintln!(
            "{over} block(s) over the module's {} sites per batch are not armed (refused as {OVER_BATCH})",
            trapvec::abi::TRAPVEC_BATCH_MAX
        );
    }
    let wanted = requests(&blocks, &owner);
    let only: Vec<SpliceRequest> = wanted.iter().map(|(_, r)| r.clone()).collect();
    let path = write_spec(&only)?;
    stages.spec_ms = ms(t_spec.elapsed());
    // Brief: the reply names each site by id, point and site, all this command reads of it
    // (a whole row each was 3.2 MB for the TCP group's 10,112 sites, with their hits read).
    let apply = |brief| Request::Apply {
        spec: path.clone(),
        best_effort: true,
        check: false,
        brief,
    };
    let t0 = Instant::now();
    let applied: Result<ApplyReport> = if only.is_empty() {
        Ok(ApplyReport {
            components: Vec::new(),
            spliced: Vec::new(),
            placed: Vec::new(),
            refused: Vec::new(),
            refused_reasons: Vec::new(),
            refused_causes: Vec::new(),
            refusals: Vec::new(),
            requested: 0,
            timings: None,
        })
    } else {
        match &mut route {
            Route::Daemon => match route::change(&apply(true), |_| {}) {
                Err(e) if client::is_unknown_field(&e, "brief") => {
                    // Refused whole, nothing changed: the request as an older trapd knows it.
                    log::warn!("trapd does not know the `brief` apply (it is older than this trapctl): its reply has a whole row per site");
                    route::change(&apply(false), |_| {})
                }
                other => other,
            },
            Route::Direct(k) => {
                route::execute::<ApplyReport>(k, &apply(true)).and_then(|(r, made)| {
                    k.commit_or_undo(&made)?;
                    Ok(r)
                })
            }
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
    // Armed and saved: other trapctl commands (the covered command's own too) may use the
    // module while this one waits; each later change takes the lock back.
    if let Route::Direct(k) = &mut route {
        k.unlock();
    }
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
                id,
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
/// next batch after its first hit. The module keeps no state of its own for it: a look reads
/// the hit sites' counters only (the module's LIST_HIT, on the module held or inside trapd's
/// `hits` request), and the removal is the one `count` mode ends with (one batch on the
/// module, or `remove` requests to trapd).
#[derive(Default)]
struct Once {
    /// The hits each disarmed block had when it was disarmed (at least 1).
    hits: HashMap<usize, u64>,
    batches: usize,
    /// trapd does not know the `hits` request (older than this trapctl): look with `list`.
    old_trapd: bool,
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
        let now = live_hits(route, live, &mut self.old_trapd)?;
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

/// The hits of the sites of `live` hit at least once, per block index: on the module held, from
/// its listing of the hit sites ([`Splicer::hit_among`](instr_manager::splicer::Splicer::hit_among)),
/// through trapd from its `hits` request ([`daemon_hits`]), which reads them the same way.
fn live_hits(
    route: &mut Route,
    live: &HashMap<usize, (u64, String)>,
    old_trapd: &mut bool,
) -> Result<HashMap<usize, u64>> {
    let mut out = HashMap::with_capacity(live.len());
    match route {
        Route::Direct(k) => {
            let order: Vec<(usize, u64)> = live.iter().map(|(&i, (id, _))| (i, *id)).collect();
            let ids: Vec<SpliceId> = order.iter().map(|&(_, id)| SpliceId(id)).collect();
            // The hit ones only (the module's LIST_HIT): a site not among them was not hit.
            let index: HashMap<u64, usize> = order.iter().map(|&(i, id)| (id, i)).collect();
            let hit = k
                .splicer
                .hit_among(&ids)
                .context("reading the coverage sites' hits")?;
            for (id, h) in hit {
                out.insert(index[&id.0], h.hits);
            }
        }
        Route::Daemon => {
            let by_site = daemon_hits(old_trapd)?;
            for (&i, (_, site)) in live {
                if let Some(&n) = by_site.get(site.as_str()) {
                    out.insert(i, n);
                }
            }
        }
    }
    Ok(out)
}

/// The hits of trapd's live splices hit at least once, by site: one `hits` request with
/// `min_hits` 1 (trapd reads the counters together and answers a row for a hit site only,
/// whoever's it is: the caller keeps its own), not the whole `list` of every site, which for
/// thousands of coverage sites kept the guest busy for seconds each look. A trapd older than
/// that request answers that it does not know it: then, and in the looks after, the `list`.
fn daemon_hits(old_trapd: &mut bool) -> Result<HashMap<String, u64>> {
    if !*old_trapd {
        let ask = Request::Hits {
            ids: None,
            min_hits: 1,
        };
        match route::read::<ops::HitsReply>(&ask) {
            Ok(r) => return Ok(r.splices.into_iter().map(|r| (r.site, r.hits)).collect()),
            Err(e) if client::is_unknown_op(&e, ask.op()) => {
                log::warn!("trapd does not know the `hits` request (it is older than this trapctl): once mode reads the whole `list` each look, which is slow for many sites");
                *old_trapd = true;
            }
            Err(e) => return Err(e.context("reading the hit coverage sites from trapd")),
        }
    }
    let listing = route::read::<ListReply>(&Request::List)
        .context("reading the coverage sites' hits from trapd")?
        .listing;
    Ok(listing
        .splices
        .into_iter()
        .map(|r| (r.site, r.hits))
        .collect())
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
            if order.is_empty() {
                return Ok(hits);
            }
            k.relock()?;
            // A site another command removed while this one waited: its count is lost.
            let (order, gone): (Vec<_>, Vec<_>) = order
                .into_iter()
                .partition(|&(_, id, _)| k.splicer.get(SpliceId(id)).is_some());
            if !gone.is_empty() {
                eprintln!(
                    "{} coverage site(s) were removed by another command meanwhile: their counts are lost (0 here)",
                    gone.len()
                );
                hits.extend(gone.iter().map(|&(i, _, _)| (i, 0)));
            }
            let ids: Vec<SpliceId> = order.iter().map(|&(_, id, _)| SpliceId(id)).collect();
            let got = k.splicer.remove(&ids);
            // Whatever was removed is saved (a quiescence refused leaves them retiring).
            let saved = k.save();
            let got = got.context("removing the coverage sites")?;
            saved?;
            for (&(i, _, _), h) in order.iter().zip(got) {
                hits.insert(i, h.hits);
            }
            k.unlock();
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

/// The kernel covered, as the report records it ([`Report`]'s `release`, `build_id`,
/// `text_address`).
struct Identity {
    release: Option<String>,
    build_id: Option<String>,
    text: Option<u64>,
}

impl Identity {
    fn of(target: &KernelTarget) -> Identity {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|r| r.trim().to_string());
        let build_id = std::fs::read("/sys/kernel/notes")
            .ok()
            .and_then(|n| gnu_build_id(&n));
        let text = target
            .symbols()
            .lookup("_text")
            .filter(|s| s.origin.is_none())
            .map(|s| s.addr);
        Identity {
            release,
            build_id,
            text,
        }
    }
}

/// The GNU build-id (hex) among ELF notes (`/sys/kernel/notes`: `namesz`, `descsz`, `type`,
/// then the name and the descriptor, each padded to 4 bytes), if there is one.
pub(super) fn gnu_build_id(mut notes: &[u8]) -> Option<String> {
    let word = |b: &[u8], i: usize| -> Option<usize> {
        let w: [u8; 4] = b.get(i..i + 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(w)).ok()
    };
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let (namesz, descsz, kind) = (word(notes, 0)?, word(notes, 4)?, word(notes, 8)?);
        let name = notes.get(12..12 + namesz)?;
        let desc_at = 12 + pad(namesz);
        let desc = notes.get(desc_at..desc_at + descsz)?;
        // NT_GNU_BUILD_ID
        if kind == 3 && name == b"GNU\0" {
            return Some(super::debugfile::hex(desc));
        }
        notes = notes.get(desc_at + pad(descsz)..)?;
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn report_of(
    args: &Args,
    span: &Span,
    blocks: &[KernelBlock],
    hits: &HashMap<usize, u64>,
    nfuncs: usize,
    (ended, elapsed, arm, disarm): (Ended, Duration, Duration, Duration),
    stages: Stages,
    id: Identity,
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
        let list: Vec<KernelHits<'_>> = blocks
            .iter()
            .enumerate()
            .map(|(i, b)| (&b.block, b.module.as_deref(), hits.get(&i).copied()))
            .collect();
        let how = KernelLines {
            debuginfo: args.debuginfo.as_deref(),
            release: id.release.as_deref(),
            build_id: id.build_id.as_deref(),
            text: id.text,
            branches: args.mode == super::Mode::Count,
            strict: false,
        };
        let text = lcov_text(&list, &how, &mut notes)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(Report {
        schema: SCHEMA,
        target: "kernel".into(),
        release: id.release,
        build_id: id.build_id,
        text_address: id.text.map(|a| format!("{a:#x}")),
        globs: args.globs.clone(),
        command: args.command.clone(),
        mode: match args.mode {
            super::Mode::Count => "count",
            super::Mode::Once => "once",
        }
        .into(),
        ended: ended.name().into(),
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

/// vmlinux's debug file: --debuginfo, else where Debian's and Fedora's debug packages put it
/// for `release`.
fn vmlinux_debuginfo(debuginfo: Option<&Path>, release: Option<&str>) -> Option<PathBuf> {
    if let Some(d) = debuginfo {
        return Some(d.to_path_buf());
    }
    let release = release?;
    [
        format!("/usr/lib/debug/boot/vmlinux-{release}"),
        format!("/usr/lib/debug/lib/modules/{release}/vmlinux"),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// How the lines of a kernel report are made: the debug file given (`--debuginfo`), what the
/// report says of the kernel (to find and check the file), whether the counts give branches
/// (count mode), and `strict`: a debug file that does not match (or one given that cannot be
/// read) is an error (`--from-json`), not a note (a live run, whose report must not be lost).
pub(super) struct KernelLines<'a> {
    pub debuginfo: Option<&'a Path>,
    pub release: Option<&'a str>,
    pub build_id: Option<&'a str>,
    pub text: Option<u64>,
    pub branches: bool,
    pub strict: bool,
}

/// A kernel block for the lcov file: the block (run-time addresses), its module (`None`:
/// vmlinux) and its hits (`None`: no site).
pub(super) type KernelHits<'a> = (&'a CoverBlock, Option<&'a str>, Option<u64>);

/// The lcov file: source lines for vmlinux's blocks when its debug file is known and matches
/// (its build-id, and every function at its run-time address less the KASLR slide:
/// [`DebugFile::kaslr_slide`]), symbol+offset records for the rest, with a note saying why.
pub(super) fn lcov_text(
    blocks: &[KernelHits<'_>],
    how: &KernelLines<'_>,
    notes: &mut Vec<String>,
) -> Result<String> {
    let (vmlinux, modules): (Vec<_>, Vec<_>) = blocks.iter().partition(|(_, m, _)| m.is_none());
    let mut out = String::new();
    let records = |list: &[&KernelHits<'_>], shift: u64| -> Vec<(CoverBlock, Option<u64>)> {
        list.iter()
            .map(|(b, _, hits)| {
                let mut c = (*b).clone();
                c.func_addr = c.func_addr.wrapping_sub(shift);
                c.start = c.start.wrapping_sub(shift);
                c.end = c.end.wrapping_sub(shift);
                c.succs.iter_mut().for_each(|s| *s = s.wrapping_sub(shift));
                if let Some(br) = &mut c.branch {
                    br.insn = br.insn.wrapping_sub(shift);
                    br.taken = br.taken.wrapping_sub(shift);
                    br.fallthrough = br.fallthrough.wrapping_sub(shift);
                }
                (c, *hits)
            })
            .collect()
    };
    if !vmlinux.is_empty() {
        let lines = match vmlinux_debuginfo(how.debuginfo, how.release) {
            None => Err(NoLines::Unavailable(format!(
                "no debug file for vmlinux (give --debuginfo, or install the kernel's debug package: /usr/lib/debug/boot/vmlinux-{})",
                how.release.unwrap_or("RELEASE")
            ))),
            Some(path) => vmlinux_lines(&path, &vmlinux, how),
        };
        match lines {
            Ok((table, shift)) => {
                let recs = records(&vmlinux, shift);
                // Branch counts need every hit counted: not in once mode.
                out.push_str(&lcov_with(
                    "trapctl_cover",
                    &as_hits(&recs),
                    &table,
                    how.branches,
                ));
            }
            Err(NoLines::Mismatch(why)) if how.strict => bail!("{why}"),
            Err(NoLines::Unavailable(why)) if how.strict && how.debuginfo.is_some() => {
                bail!("{why}")
            }
            Err(no) => {
                let why = no.why();
                notes.push(format!(
                    "vmlinux: symbol+offset records in the lcov file: {why}"
                ));
                let recs = records(&vmlinux, 0);
                out.push_str(&symbol_records("vmlinux", why, &as_hits(&recs)));
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
    Ok(out)
}

/// vmlinux's line table from `path` and the KASLR slide, once the file is found to match.
fn vmlinux_lines(
    path: &Path,
    blocks: &[&KernelHits<'_>],
    how: &KernelLines<'_>,
) -> Result<(LineTable, u64), NoLines> {
    let file = DebugFile::read(path)?;
    file.check_build_id(how.build_id, "the covered kernel")?;
    let functions: BTreeSet<(String, u64)> = blocks
        .iter()
        .map(|(b, _, _)| (b.function.clone(), b.func_addr))
        .collect();
    let slide = file.kaslr_slide(&functions, how.text)?;
    drop(file);
    let table =
        LineTable::read(path).map_err(|e| NoLines::Unavailable(trapvec::error_chain(&e)))?;
    Ok((table, slide))
}

fn as_hits(recs: &[(CoverBlock, Option<u64>)]) -> Vec<BlockHits<'_>> {
    recs.iter()
        .map(|(block, hits)| BlockHits { block, hits: *hits })
        .collect()
}

/// `--from-json`: the saved kernel report `r` (read from `path`) again, its lines made now
/// ([`super::saved`]).
pub(super) fn from_saved(args: &Args, path: &Path, mut r: Report) -> Result<()> {
    let blocks = r
        .blocks
        .iter()
        .map(|row| row.block(Mechanism::Trap))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut tally = Tally::default();
    for (row, b) in r.blocks.iter().zip(&blocks) {
        saved::check_hit(path, row, row.on.count)?;
        let module = row.on.module.as_deref();
        let home = Home {
            object: None,
            module,
            qualifier: module,
        };
        tally.add(home, b, row.hit);
    }
    r.refused = saved::table_again(
        path,
        tally,
        &mut r.functions,
        &r.total,
        &mut r.notes,
        &r.blocks,
        args.lcov.is_some(),
    )?;
    if let Some(lcov) = &args.lcov {
        let list: Vec<KernelHits<'_>> = r
            .blocks
            .iter()
            .zip(&blocks)
            .map(|(row, b)| (b, row.on.module.as_deref(), row.on.count))
            .collect();
        let text_address = match &r.text_address {
            Some(t) => Some(
                t.strip_prefix("0x")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .with_context(|| {
                        format!(
                            "{}: `text_address` {t:?} is not a hex address",
                            path.display()
                        )
                    })?,
            ),
            None => None,
        };
        let how = KernelLines {
            debuginfo: args.debuginfo.as_deref(),
            release: r.release.as_deref(),
            build_id: r.build_id.as_deref(),
            text: text_address,
            branches: r.mode == "count",
            strict: true,
        };
        let mut notes = Vec::new();
        let text = lcov_text(&list, &how, &mut notes)?;
        std::fs::write(lcov, text).with_context(|| format!("writing {}", lcov.display()))?;
        r.notes.extend(notes);
    }
    output(args, r)
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
