//! `trapctl points [GLOB...]`: what trapvec can do at the functions (or basic blocks) a glob
//! names, in the running kernel or in the objects of a program, without changing anything.
//!
//! The kernel's answer is the splicer's own: each function's point is planned as `trapctl
//! splice` would plan it (the same resolution past the entry, the same windows, the module's
//! CHECK without the kprobe cross-check), on a splicer with nothing live, against the text
//! without anyone's patches (`READ_ORIGINAL`). It opens `/dev/trapvec` without taking its lock
//! and reads the saved state of nobody, so it runs beside trapd and changes nothing. A program's
//! answer is `trapctl inspect`'s, for each function of each object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use instr_manager::analysis::Function;
use instr_manager::cover::{analyzed, analyzed_in};
use instr_manager::glob::{matching_functions, FunctionGlob};
use instr_manager::image::CodeImage;
use instr_manager::point::in_freed_init;
use instr_manager::splicer::{SpliceError, Splicer};
use instr_manager::{
    kernel_entry_len, Action, Mechanism, Plan, PlanInput, Refusal, SiteVerdict, SpliceRequest,
    KERNEL_ENTRY_MAX,
};
use serde::Serialize;
use trapvec::kernel::KernelTarget;
use trapvec::{Symbol, Target, TargetInfo};

/// The version of `--json`'s layout; it changes only when a field changes meaning or goes.
pub const SCHEMA: u32 = 1;

/// List functions (or basic blocks) and what trapvec can do there.
#[derive(clap::Args)]
#[command(long_about = "\
List the functions GLOB names (all of them without a GLOB) and, for each, whether a trap splice
(int 0xF5, 2 bytes) and a jmp splice (jmp rel32, or jmp rel8 to a springboard in nearby
padding) can be made at its point (its entry, past the kernel's endbr64 and ftrace site), or why
not. With --blocks, the same for the first instruction of every basic block.

GLOB is a shell glob over function names: `tcp_*`, `__x64_sys_get?id`, `ext4_[a-f]*`; `MOD:GLOB`
limits it to a kernel module (itself a glob, `nf_*:*`), `OBJECT:GLOB` to a program's object
(`libc.so.6:str*`). Quote globs from the shell.

By default the running kernel is asked (trapvec.ko must be loaded; nothing is changed and the
module's lock is not taken, so this runs beside trapd and other commands). The verdict is the
one `trapctl splice` would give now, but for text another live splice already holds (listed by
`trapctl list`) and the kprobe cross-check. --process PATH asks an executable or shared object
instead, --pid PID every object a running process maps (file addresses; no process is touched).

Prints one line per function (or block), then a summary: how many can take each mechanism and
how many were refused for each reason. --json prints one object with `\"schema\": 1`.")]
pub struct Args {
    /// Function globs (`tcp_*`, `MOD:GLOB`, `OBJECT:GLOB`); none: every function.
    pub globs: Vec<String>,
    /// Every basic block's first instruction, not only each function's point.
    #[arg(long)]
    pub blocks: bool,
    /// Ask this executable or shared object instead of the running kernel.
    #[arg(long, value_name = "PATH", conflicts_with = "pid")]
    pub process: Option<PathBuf>,
    /// Ask every object this running process maps (its executable and libraries).
    #[arg(short = 'p', long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Print only the summary.
    #[arg(long, conflicts_with = "json")]
    pub summary: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What one mechanism can do at one site.
#[derive(Serialize, Clone)]
struct Verdict {
    possible: bool,
    /// `trap`, `jmp rel32` or `jmp rel8 + springboard`.
    #[serde(skip_serializing_if = "Option::is_none")]
    form: Option<&'static str>,
    /// Bytes the splice would displace.
    #[serde(skip_serializing_if = "Option::is_none")]
    displaced_len: Option<usize>,
    /// The kind of refusal, for grouping: its cause's name (`window_crosses_block`,
    /// `kernel_reserved`, ...), as a glob's `--best-effort` summary and `trapctl cover` name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    refusal: Option<String>,
    /// The refusal's whole sentence.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl Verdict {
    fn possible(plan: &Plan) -> Verdict {
        Verdict {
            possible: true,
            form: Some(match (plan.mechanism, &plan.springboard) {
                (Mechanism::Trap, _) => "trap",
                (Mechanism::Jmp, None) => "jmp rel32",
                (Mechanism::Jmp, Some(_)) => "jmp rel8 + springboard",
            }),
            displaced_len: Some(plan.displaced_len),
            refusal: None,
            reason: None,
        }
    }

    fn refused(kind: String, reason: String) -> Verdict {
        Verdict {
            possible: false,
            form: None,
            displaced_len: None,
            refusal: Some(kind),
            reason: Some(reason),
        }
    }

    /// `yes`, `springboard`, or `no`.
    fn short(&self) -> &'static str {
        match self.form {
            Some("jmp rel8 + springboard") => "springboard",
            Some(_) => "yes",
            None => "no",
        }
    }
}

/// One site: a function's point or a block's first instruction.
#[derive(Serialize)]
struct Site {
    function: String,
    /// The module or object holding it; absent for vmlinux.
    #[serde(skip_serializing_if = "Option::is_none")]
    object: Option<String>,
    /// `function+0xOFF` (`function` at its point).
    point: String,
    addr: String,
    trap: Verdict,
    jmp: Verdict,
}

#[derive(Serialize, Default)]
struct Summary {
    functions: usize,
    sites: usize,
    trap: usize,
    jmp: usize,
    springboard: usize,
    neither: usize,
    /// Refusal kind -> how many sites (trap and jmp counted apart).
    trap_refusals: BTreeMap<String, usize>,
    jmp_refusals: BTreeMap<String, usize>,
}

#[derive(Serialize)]
struct Report {
    schema: u32,
    /// `kernel`, or the file or process asked.
    target: String,
    globs: Vec<String>,
    blocks: bool,
    sites: Vec<Site>,
    summary: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// A refusal's kind: its cause's name (`too_short`).
fn refusal_kind(r: &Refusal) -> String {
    r.cause().name().into_owned()
}

/// An error's kind: its cause's name (`kernel_jump_label`), or `other` for an error that is
/// no refusal of the point (its sentence says what).
fn splice_error_kind(e: &SpliceError) -> String {
    e.cause()
        .map_or_else(|| "other".to_string(), |c| c.name().into_owned())
}

fn from_splice(r: &Result<(instr_manager::ResolvedPoint, Plan), SpliceError>) -> Verdict {
    match r {
        Ok((_, p)) => Verdict::possible(p),
        Err(e) => Verdict::refused(
            splice_error_kind(e),
            // The error's own first line: `at` is in the row already.
            match e {
                SpliceError::Refused { refusal, .. } => refusal.to_string(),
                SpliceError::Target { source, .. } => trapvec::error_chain(source),
                e => trapvec::error_chain(e),
            },
        ),
    }
}

/// Run `trapctl points`.
pub fn run(args: &Args) -> Result<()> {
    let globs = args
        .globs
        .iter()
        .map(|g| FunctionGlob::new(g))
        .collect::<Result<Vec<_>, _>>()?;
    // Matching ifunc symbols: their address is a resolver's, not code anyone calls.
    let mut ifuncs = Vec::new();
    let (target, sites, functions) = match (&args.process, args.pid) {
        (Some(path), _) => {
            let (sites, n) = file_sites(path, &globs, args.blocks, &mut ifuncs)?;
            (path.display().to_string(), sites, n)
        }
        (None, Some(pid)) => {
            let mut sites = Vec::new();
            let mut n = 0;
            for object in mapped_objects(pid)? {
                match file_sites(&object, &globs, args.blocks, &mut ifuncs) {
                    Ok((s, k)) => {
                        sites.extend(s);
                        n += k;
                    }
                    Err(e) => log::warn!("{}: {}", object.display(), e),
                }
            }
            (format!("process {pid}"), sites, n)
        }
        (None, None) => {
            let (sites, n) = kernel_sites(&globs, args.blocks)?;
            ("kernel".to_string(), sites, n)
        }
    };
    ifuncs.sort();
    ifuncs.dedup();
    let ifunc_note = (!ifuncs.is_empty()).then(|| {
        format!(
            "{} ifunc symbol(s) left out ({}{}): the address is a resolver's; name the implementation the dynamic linker picks (e.g. `__strlen_avx2`), or splice the name in a running process, where the agent resolves it",
            ifuncs.len(),
            ifuncs.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            if ifuncs.len() > 5 { ", ..." } else { "" }
        )
    });
    if functions == 0 {
        bail!(
            "no function in {target} matches {}{}",
            if args.globs.is_empty() {
                "(every function was asked for)".to_string()
            } else {
                args.globs.join(" ")
            },
            ifunc_note.map(|n| format!("; {n}")).unwrap_or_default()
        );
    }
    let report = Report {
        schema: SCHEMA,
        target,
        globs: args.globs.clone(),
        blocks: args.blocks,
        summary: summarize(&sites, functions),
        sites,
        note: ifunc_note,
    };
    let out = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        render_text(&report, args.summary)
    };
    crate::print(&out)
}

/// The running kernel's sites, planned by the splicer.
fn kernel_sites(globs: &[FunctionGlob], blocks: bool) -> Result<(Vec<Site>, usize)> {
    let target = KernelTarget::open()?;
    let funcs: Vec<Symbol> = if globs.is_empty() {
        matching_functions(target.symbols(), &[FunctionGlob::new("*")?])
    } else {
        matching_functions(target.symbols(), globs)
    }
    .into_iter()
    .cloned()
    .collect();
    let info = target.info().clone();
    // (function, site, point text for the row)
    let mut wanted: Vec<(usize, u64, String)> = Vec::new();
    for (i, f) in funcs.iter().enumerate() {
        // Init code the kernel freed after boot: its bytes are not its code, so none are read;
        // the planner refuses its point as such.
        let freed = in_freed_init(f, target.symbols(), &info);
        let entry = f.addr
            + if info.has_fentry && !freed {
                target
                    .read_code(f.addr, KERNEL_ENTRY_MAX)
                    .map_or(0, |b| kernel_entry_len(&b) as u64)
            } else {
                0
            };
        // A name kallsyms repeats (static functions of different files) is written with the
        // copy's address, `name@0xADDRESS`, as a glob's expansion writes it.
        let unique = target.symbols().lookup(&f.name).map(|s| s.addr) == Some(f.addr);
        wanted.push((
            i,
            entry,
            if unique {
                f.name.clone()
            } else {
                format!("{}@{:#x}", f.name, f.addr)
            },
        ));
        if blocks && !freed {
            let read = |a: u64, n: usize| target.read_code(a, n).ok();
            if let Some((_, func)) = analyzed(f, target.symbols().function_extent(f), &read) {
                wanted.extend(
                    block_points(&func, entry)
                        .into_iter()
                        .map(|(site, point)| (i, site, point)),
                );
            }
        }
    }
    let splicer = Splicer::new(target);
    // Each site on its own, on a splicer with nothing live (two points of one batch would claim
    // each other's text), and each verdict kept as a row at once: 46,000 plans of the whole
    // kernel are never held together.
    let alone = |site: u64, mechanism| {
        let r = SpliceRequest::new(format!("{site:#x}"), Action::Count, mechanism);
        from_splice(
            &splicer
                .plan_each(std::slice::from_ref(&r))
                .pop()
                .expect("one result per request"),
        )
    };
    let sites = wanted
        .iter()
        .map(|(i, site, point)| Site {
            function: funcs[*i].name.clone(),
            object: funcs[*i].origin.clone(),
            point: point.clone(),
            addr: format!("{site:#x}"),
            trap: alone(*site, Mechanism::Trap),
            jmp: alone(*site, Mechanism::Jmp),
        })
        .collect();
    Ok((sites, funcs.len()))
}

/// The sites of one ELF file, as `trapctl inspect` judges them.
fn file_sites(
    path: &Path,
    globs: &[FunctionGlob],
    blocks: bool,
    ifuncs: &mut Vec<String>,
) -> Result<(Vec<Site>, usize)> {
    let image = CodeImage::from_path(path).with_context(|| format!("{}", path.display()))?;
    let object = path.display().to_string();
    // The object part of a glob names the file: match it with the file's path as the origin.
    let wanted = |s: &&Symbol| {
        globs.is_empty()
            || globs
                .iter()
                .any(|g| g.matches(&s.name, Some(&object)) || g.matches(&s.name, None))
    };
    ifuncs.extend(
        image
            .symbols
            .iter()
            .filter(|s| s.kind == trapvec::SymbolKind::Ifunc)
            .filter(wanted)
            .map(|s| s.name.clone()),
    );
    let mut funcs: Vec<&Symbol> = image
        .symbols
        .iter()
        .filter(|s| s.kind == trapvec::SymbolKind::Function)
        .filter(wanted)
        .collect();
    funcs.sort_by_key(|s| s.addr);
    funcs.dedup_by_key(|s| s.addr);
    let info = TargetInfo::for_code(image.kernel, "points (inspection)");
    let read = |a: u64, l: usize| image.read(a, l).map(<[u8]>::to_vec);
    let mut sites = Vec::new();
    for f in &funcs {
        let extent = image.symbols.function_extent(f);
        let Some((bytes, func)) = analyzed_in(f, extent, &read, image.object_targets()) else {
            continue;
        };
        let entry = f.addr
            + if info.has_fentry {
                kernel_entry_len(&bytes) as u64
            } else {
                0
            };
        let input = PlanInput::unspliced(&func, &info, &read, &image.symbols);
        let mut at = vec![(entry, f.name.clone())];
        if blocks {
            at.extend(block_points(&func, entry));
        }
        for (site, point) in at {
            let v = SiteVerdict::judge(&input, site);
            let verdict = |r: Result<&Plan, &Refusal>| match r {
                Ok(p) => Verdict::possible(p),
                Err(e) => Verdict::refused(refusal_kind(e), e.to_string()),
            };
            sites.push(Site {
                function: f.name.clone(),
                object: Some(object.clone()),
                point,
                addr: format!("{site:#x}"),
                trap: verdict(v.trap.as_ref()),
                jmp: verdict(v.jmp()),
            });
        }
    }
    Ok((sites, funcs.len()))
}

/// The first instruction of every basic block of `func` after its point `entry`, as a site
/// and its point's text (`f+0x1c`).
fn block_points(func: &Function, entry: u64) -> Vec<(u64, String)> {
    func.blocks
        .iter()
        .filter(|b| b.start > entry)
        .map(|b| {
            (
                b.start,
                format!("{}+{:#x}", func.name, b.start - func.start),
            )
        })
        .collect()
}

/// The ELF objects a process maps executable, from `/proc/PID/maps`, each once.
fn mapped_objects(pid: u32) -> Result<Vec<PathBuf>> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps = std::fs::read_to_string(&maps_path).with_context(|| {
        format!("reading {maps_path} (is {pid} a running process you may read?)")
    })?;
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let perms = fields.nth(1).unwrap_or("");
        let path = fields.nth(3).unwrap_or("");
        if perms.contains('x') && path.starts_with('/') {
            let p = PathBuf::from(path);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    if out.is_empty() {
        bail!("process {pid} maps no executable file");
    }
    Ok(out)
}

fn summarize(sites: &[Site], functions: usize) -> Summary {
    let mut s = Summary {
        functions,
        sites: sites.len(),
        ..Summary::default()
    };
    for site in sites {
        if site.trap.possible {
            s.trap += 1;
        } else if let Some(k) = &site.trap.refusal {
            *s.trap_refusals.entry(k.clone()).or_default() += 1;
        }
        match site.jmp.short() {
            "yes" => s.jmp += 1,
            "springboard" => s.springboard += 1,
            _ => {
                if let Some(k) = &site.jmp.refusal {
                    *s.jmp_refusals.entry(k.clone()).or_default() += 1;
                }
            }
        }
        if !site.trap.possible && !site.jmp.possible {
            s.neither += 1;
        }
    }
    s
}

fn render_text(r: &Report, summary_only: bool) -> String {
    // Writing to a String cannot fail: the `fmt::Result`s below are always Ok.
    let mut o = String::new();
    if !summary_only {
        let width = r
            .sites
            .iter()
            .map(|s| s.point.len())
            .max()
            .unwrap_or(8)
            .clamp(8, 48);
        let _ = writeln!(
            o,
            "{:<width$}  {:<18}  {:<4}  {:<11}  WHY NOT",
            "POINT", "SITE", "TRAP", "JMP"
        );
        for s in &r.sites {
            let why = match (&s.trap.reason, &s.jmp.reason) {
                (Some(t), _) => format!("trap: {t}"),
                (None, Some(j)) => format!("jmp: {j}"),
                (None, None) => String::new(),
            };
            let point = match &s.object {
                Some(o) if r.target == "kernel" => format!("{o}:{}", s.point),
                _ => s.point.clone(),
            };
            let _ = writeln!(
                o,
                "{point:<width$}  {:<18}  {:<4}  {:<11}  {why}",
                s.addr,
                s.trap.short(),
                s.jmp.short()
            );
        }
    }
    let m = &r.summary;
    let _ = writeln!(
        o,
        "{}: {} function(s), {} site(s): trap possible at {}, jmp rel32 at {}, jmp by springboard at {}, neither at {}",
        r.target, m.functions, m.sites, m.trap, m.jmp, m.springboard, m.neither
    );
    for (what, refusals) in [("trap", &m.trap_refusals), ("jmp", &m.jmp_refusals)] {
        let mut by_count: Vec<(&String, &usize)> = refusals.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (kind, n) in by_count {
            let _ = writeln!(o, "  {what} refused at {n}: {kind}");
        }
    }
    if let Some(n) = &r.note {
        let _ = writeln!(o, "note: {n}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use trapvec::TargetError;

    #[test]
    fn refusal_kinds_are_the_causes_names() {
        let r = Refusal::NoRoomForJmp {
            site: 1,
            reason: "x".into(),
        };
        assert_eq!(refusal_kind(&r), "no_room_for_jmp");
        let r = Refusal::AlreadyPatched {
            site: 1,
            lo: 1,
            hi: 2,
        };
        assert_eq!(refusal_kind(&r), "already_patched");
        let e = SpliceError::Target {
            at: "f".into(),
            source: TargetError::SiteRefused {
                addr: 1,
                reason: trapvec::kernel::SiteRefusal::JumpLabel,
            },
        };
        assert_eq!(splice_error_kind(&e), "kernel_jump_label");
        let e = SpliceError::Point {
            at: "f".into(),
            source: instr_manager::PlanError::InitFreed {
                text: "f".into(),
                name: "f".into(),
                addr: 1,
            },
        };
        assert_eq!(splice_error_kind(&e), "init_freed");
        assert_eq!(splice_error_kind(&SpliceError::UnknownSplice(3)), "other");
    }
}
