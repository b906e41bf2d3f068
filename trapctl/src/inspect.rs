//! `trapctl inspect <ELF file> <symbol>[+off]`: disassemble a function of any x86-64 ELF file,
//! show its basic blocks, and say for each instruction boundary (or the one point asked for)
//! whether a trap splice and a jmp splice are possible there, what they would displace, and why
//! not. Nothing is modified; the planning is exactly what a splice would do, with nothing else
//! patched and the trampoline assumed within reach.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use instr_manager::analysis::landing::{landing_pads, EhFrameHdr, HdrTable, LandingError};
use instr_manager::analysis::parts::part_names;
use instr_manager::analysis::{analyze_function_with, AnalysisOptions, Function};
use instr_manager::image::{CodeImage, ElfKind, EXTERNAL};
use instr_manager::plan::{has_fentry_site, kernel_entry};
use instr_manager::{
    kernel_entry_len, resolve_point, Plan, PlanInput, PointSpec, Refusal, SiteVerdict,
};
use serde::Serialize;
use trapvec::error::hex;
use trapvec::TargetInfo;

/// Where trap and jmp splices are possible in a function of an ELF file.
#[derive(clap::Args)]
#[command(long_about = "\
Disassemble a function of an x86-64 ELF file (Intel syntax, with addresses and bytes), mark its
basic blocks, and say for every instruction boundary whether a trap splice (int 0xF5, 2 bytes) and
a jmp splice (jmp rel32, or jmp rel8 to a springboard in nearby padding) are possible there, what
they would displace, and why not when not. With `symbol+offset` only that point is examined (a
point at a traced kernel function's entry moves past its ftrace site, as a splice would).

Executables and shared objects use their symbol table and virtual addresses. Relocatable objects
(.o) and kernel modules (.ko) are laid out with the section holding the symbol at 0, so addresses
are offsets in that section, and their other executable sections after it; references to data and
undefined symbols show as 0x40000000. Kernel code (a .ko, a
vmlinux, or an object calling __fentry__) is planned with the kernel's rules: ftrace site at entry,
no red zone.")]
pub struct Args {
    /// ELF file: executable, shared object, relocatable object (.o), kernel module (.ko), vmlinux.
    pub file: PathBuf,
    /// The function, `name`, or one point in it: `name+0x10`, `name+16`, `0xADDRESS`.
    pub point: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Plan as kernel code (ftrace sites, no red zone) or as user code, instead of detecting it.
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Auto,
    Kernel,
    User,
}

/// A verdict for one mechanism at one site.
#[derive(Serialize)]
struct Verdict {
    possible: bool,
    /// `trap`, `jmp rel32` or `jmp rel8 + springboard`.
    form: Option<&'static str>,
    displaced: Vec<String>,
    displaced_len: usize,
    springboard: Option<String>,
    reason: Option<String>,
    /// For jmp: why `jmp rel32` is impossible, when it is.
    rel32_reason: Option<String>,
}

impl Verdict {
    fn from_plan(p: &Plan, form: &'static str) -> Verdict {
        Verdict {
            possible: true,
            form: Some(form),
            displaced: p.displaced.iter().map(|i| i.intel()).collect(),
            displaced_len: p.displaced_len,
            springboard: p.springboard.as_ref().map(|s| format!("{:#x}", s.addr)),
            reason: None,
            rel32_reason: None,
        }
    }

    fn refused(e: &Refusal) -> Verdict {
        Verdict {
            possible: false,
            form: None,
            displaced: Vec::new(),
            displaced_len: 0,
            springboard: None,
            reason: Some(e.to_string()),
            rel32_reason: None,
        }
    }
}

#[derive(Serialize)]
struct SiteReport {
    addr: String,
    /// Empty when the site is not an instruction boundary.
    bytes: String,
    asm: String,
    block_start: bool,
    trap: Verdict,
    jmp: Verdict,
}

#[derive(Serialize)]
struct BlockReport {
    start: String,
    end: String,
    succs: Vec<String>,
}

#[derive(Serialize)]
struct FunctionReport {
    name: String,
    start: String,
    end: String,
    instructions: usize,
    fentry_site: bool,
    indirect_jumps: Vec<String>,
    unresolved_indirect_jumps: Vec<String>,
    /// Exception landing pads (from `.gcc_except_table`): branch targets only the unwinder jumps to.
    landing_pads: Vec<String>,
    undecodable_from: Option<String>,
}

#[derive(Serialize)]
struct Report {
    file: String,
    kind: ElfKind,
    kernel: bool,
    /// `virtual` or `offsets in <section>`.
    addresses: String,
    point: String,
    /// The examined site when one point was asked for.
    site: Option<String>,
    notes: Vec<String>,
    function: FunctionReport,
    blocks: Vec<BlockReport>,
    sites: Vec<SiteReport>,
}

fn target_info(kernel: bool) -> TargetInfo {
    TargetInfo::for_code(
        kernel,
        if kernel {
            "kernel code (inspection)"
        } else {
            "user code (inspection)"
        },
    )
}

fn site_report(input: &PlanInput<'_>, site: u64) -> SiteReport {
    let func = input.func;
    let insn = func.insn_at(site);
    let v = SiteVerdict::judge(input, site);
    let trap = match &v.trap {
        Ok(p) => Verdict::from_plan(p, "trap"),
        Err(e) => Verdict::refused(e),
    };
    let jmp = match (&v.jmp_rel32, &v.jmp_springboard) {
        (Ok(p), _) => Verdict::from_plan(p, "jmp rel32"),
        (Err(e32), sb) => {
            let mut v = match sb {
                Some(Ok(p)) => Verdict::from_plan(p, "jmp rel8 + springboard"),
                Some(Err(e)) => Verdict::refused(e),
                None => Verdict::refused(e32),
            };
            v.rel32_reason = Some(e32.to_string());
            v
        }
    };
    SiteReport {
        addr: format!("{site:#x}"),
        bytes: insn.map(|i| hex(func.insn_bytes(i))).unwrap_or_default(),
        asm: insn.map(|i| i.intel()).unwrap_or_default(),
        block_start: func.is_block_start(site),
        trap,
        jmp,
    }
}

fn function_report(func: &Function, info: &TargetInfo) -> FunctionReport {
    FunctionReport {
        name: func.name.clone(),
        start: format!("{:#x}", func.start),
        end: format!("{:#x}", func.end),
        instructions: func.insns.len(),
        fentry_site: has_fentry_site(func, info),
        indirect_jumps: func
            .indirect_jumps
            .iter()
            .map(|j| format!("{:#x}", j.addr))
            .collect(),
        unresolved_indirect_jumps: func
            .unresolved_indirect_jumps()
            .map(|j| format!("{:#x}", j.addr))
            .collect(),
        landing_pads: func
            .landing_pads
            .iter()
            .map(|a| format!("{a:#x}"))
            .collect(),
        undecodable_from: func.undecodable_from.map(|a| format!("{a:#x}")),
    }
}

fn build(args: &Args) -> Result<Report> {
    let spec: PointSpec = args.point.parse()?;
    let single = args.point.contains('+') || matches!(spec, PointSpec::Address(_));
    let name = match &spec {
        PointSpec::Symbol { name, .. } => Some(name.as_str()),
        PointSpec::Address(_) => None,
    };
    let image = CodeImage::from_path_around(&args.file, name)?;
    if image.kind.is_relocatable() && matches!(spec, PointSpec::Address(_)) {
        bail!(
            "{}: addresses mean nothing in a relocatable file; name the function (`symbol+offset`)",
            args.file.display()
        );
    }
    let kernel = match args.mode {
        Mode::Auto => image.kernel,
        Mode::Kernel => true,
        Mode::User => false,
    };
    let info = target_info(kernel);
    let read = |a: u64, l: usize| image.read(a, l).map(<[u8]>::to_vec);
    let point = resolve_point(&spec, &image.symbols, &info, |a| {
        read(a, 9).map_or(0, |b| kernel_entry_len(&b))
    })
    .with_context(|| format!("in {}", args.file.display()))?;
    let sym = &point.function;
    let size = usize::try_from(sym.size)?;
    let bytes = read(sym.addr, size).with_context(|| {
        format!(
            "the bytes of `{}` [{:#x}, {:#x}) are not in the file",
            sym.name,
            sym.addr,
            sym.addr + sym.size
        )
    })?;
    let mut func = analyze_function_with(
        &sym.name,
        sym.addr,
        &bytes,
        &AnalysisOptions {
            read: Some(&read),
            lenient: true,
            // Jumps into it from the rest of the file (unnamed `.cold` parts).
            object_targets: Some(image.object_targets()),
        },
    )?;

    let mut notes = Vec::new();
    if !func.outside_targets.is_empty() {
        let list: Vec<String> = func
            .outside_targets
            .iter()
            .map(|(t, from)| format!("{t:#x} (from {from:#x})"))
            .collect();
        notes.push(format!("branch targets that code outside the function jumps or calls to (a split-off .cold part, another function): {}", list.join(", ")));
    }
    if let Some((addr, len)) = image.eh_frame_hdr {
        match file_landing_pads(&image, &func, EhFrameHdr { addr, len }) {
            Ok(pads) => {
                func.add_landing_pads(pads);
                if !func.landing_pads.is_empty() {
                    let list: Vec<String> = func
                        .landing_pads
                        .iter()
                        .map(|a| format!("{a:#x}"))
                        .collect();
                    notes.push(format!("exception landing pads (from .gcc_except_table; only the unwinder jumps there): {}", list.join(", ")));
                }
            }
            Err(e) => notes.push(format!("warning: {e}; windows are checked without them")),
        }
    } else if image.has_except_table {
        notes.push("warning: exception landing pads are not read in a relocatable file; windows are checked without them".to_string());
    }
    if let Some(sec) = &image.section {
        notes.push(format!(
            "addresses are offsets in section {sec} (relocatable file; its other executable sections follow it); references to data and undefined symbols show as {:#x}",
            EXTERNAL
        ));
    }
    if let Some((endbr, end)) = kernel_entry(&func, &info) {
        notes.push(format!(
            "kernel code: [{:#x}, {end:#x}) is the function's entry ({}), which the kernel owns; a point at the entry moves past it",
            func.start,
            match (endbr > 0, has_fentry_site(&func, &info)) {
                (true, true) => "endbr64 for indirect calls, then the ftrace __fentry__ site",
                (true, false) => "endbr64 for indirect calls",
                _ => "the ftrace __fentry__ site, which the kernel rewrites",
            }
        ));
    }
    if single
        && point.site != func.start + spec_offset(&spec)
        && matches!(spec, PointSpec::Symbol { .. })
    {
        notes.push(format!(
            "the point moved to {:#x}, past the ftrace site",
            point.site
        ));
    }
    for j in func.unresolved_indirect_jumps() {
        notes.push(format!(
            "warning: the indirect jmp at {:#x} has no recognised jump table; windows are checked against the known branch targets only",
            j.addr
        ));
    }
    if let Some(a) = func.undecodable_from {
        notes.push(format!(
            "warning: the function cannot be decoded from {a:#x} on"
        ));
    }

    let input = PlanInput::unspliced(&func, &info, &read, &image.symbols);
    let sites: Vec<SiteReport> = if single {
        vec![site_report(&input, point.site)]
    } else {
        func.insns
            .iter()
            .map(|i| site_report(&input, i.addr))
            .collect()
    };
    Ok(Report {
        file: args.file.display().to_string(),
        kind: image.kind,
        kernel,
        addresses: image
            .section
            .as_ref()
            .map_or_else(|| "virtual".to_string(), |s| format!("offsets in {s}")),
        point: args.point.clone(),
        site: single.then(|| format!("{:#x}", point.site)),
        notes,
        function: function_report(&func, &info),
        blocks: func
            .blocks
            .iter()
            .map(|b| BlockReport {
                start: format!("{:#x}", b.start),
                end: format!("{:#x}", b.end),
                succs: b.succs.iter().map(|s| format!("{s:#x}")).collect(),
            })
            .collect(),
        sites,
    })
}

/// The landing pads inside `func` that the LSDAs of its FDEs, and of its cold parts' (found by
/// name, as the splicer finds them), name.
fn file_landing_pads(
    image: &CodeImage,
    func: &Function,
    hdr: EhFrameHdr,
) -> Result<Vec<u64>, LandingError> {
    let read = |a: u64, l: usize| image.read(a, l).map(<[u8]>::to_vec);
    let table = HdrTable::read(&read, &func.name, hdr)?;
    let mut ranges = vec![(func.start, func.end)];
    for name in part_names(&func.name) {
        for s in image.symbols.lookup_all(&name) {
            let size = image.symbols.function_extent(s);
            if s.addr != func.start && size > 0 {
                ranges.push((s.addr, s.addr + size));
            }
        }
    }
    let mut pads = Vec::new();
    for (lo, hi) in ranges {
        pads.extend(
            landing_pads(&read, &func.name, &table, lo, hi)?
                .into_iter()
                .map(|p| p.addr),
        );
    }
    Ok(pads)
}

fn spec_offset(spec: &PointSpec) -> u64 {
    match spec {
        PointSpec::Symbol { offset, .. } => *offset,
        PointSpec::Address(_) => 0,
    }
}

fn verdict_text(v: &Verdict) -> String {
    if v.possible {
        let mut s = match v.form {
            Some("trap") | None => "yes".to_string(),
            Some(form) => format!("yes, {form}"),
        };
        if let Some(sb) = &v.springboard {
            s.push_str(&format!(" at {sb}"));
        }
        s.push_str(&format!(
            ", displaces `{}` ({} bytes)",
            v.displaced.join("; "),
            v.displaced_len
        ));
        if let Some(r) = &v.rel32_reason {
            s.push_str(&format!("; jmp rel32: no, {r}"));
        }
        s
    } else {
        let mut s = format!("no, {}", v.reason.as_deref().unwrap_or("?"));
        if let Some(r) = v
            .rel32_reason
            .as_ref()
            .filter(|r| !v.reason.as_deref().unwrap_or("").contains(r.as_str()))
        {
            s.push_str(&format!("; jmp rel32: no, {r}"));
        }
        s
    }
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn render_text(r: &Report) -> String {
    // Writing to a String cannot fail: the `fmt::Result`s below are always Ok.
    let mut o = String::new();
    let f = &r.function;
    let _ = writeln!(
        o,
        "{}: {}{}",
        r.file,
        r.kind.describe(),
        if r.kernel { ", kernel code" } else { "" }
    );
    let _ = writeln!(
        o,
        "function `{}` [{}, {}): {}, {}; addresses are {}",
        f.name,
        f.start,
        f.end,
        plural(f.instructions, "instruction"),
        plural(r.blocks.len(), "basic block"),
        r.addresses
    );
    for n in &r.notes {
        let _ = writeln!(o, "note: {n}");
    }
    if let Some(site) = &r.site {
        let _ = writeln!(o, "point `{}` -> {site}", r.point);
    }
    for s in &r.sites {
        if s.block_start {
            if let Some(b) = r.blocks.iter().find(|b| b.start == s.addr) {
                let succ = if b.succs.is_empty() {
                    "(no successor in the function)".to_string()
                } else {
                    b.succs.join(", ")
                };
                let _ = writeln!(o, "block [{}, {}) -> {succ}", b.start, b.end);
            }
        }
        if s.asm.is_empty() {
            let _ = writeln!(o, "  {:<18}  (not an instruction boundary)", s.addr);
        } else {
            let _ = writeln!(o, "  {:<18}  {:<30}  {}", s.addr, s.bytes, s.asm);
        }
        let _ = writeln!(o, "        trap: {}", verdict_text(&s.trap));
        let _ = writeln!(o, "        jmp:  {}", verdict_text(&s.jmp));
    }
    o
}

/// Run `trapctl inspect`.
pub fn run(args: &Args) -> Result<()> {
    let report = build(args)?;
    if args.json {
        // `"schema": 1` first, as every command's --json.
        return crate::cmd::splice::print_json(&report);
    }
    crate::print(&render_text(&report))
}
