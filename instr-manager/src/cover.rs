//! Block coverage (`trapctl cover`): every basic block of the functions a glob names, each with
//! the site a counting splice would take at its first instruction (or why none can), the lines
//! of source a block's addresses cover (DWARF line tables, read with gimli), and the lcov
//! tracefile written from the blocks' hits.
//!
//! A line is executed when a block whose address range covers one of the line's address ranges
//! (a row of the line table up to the next row) was hit.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSection as _};
use thiserror::Error;
use trapvec::{Symbol, SymbolKind, TargetInfo};

use crate::analysis::{Function, ReadFn};
use crate::glob::FunctionGlob;
use crate::image::CodeImage;
use crate::plan::{PlanInput, SiteVerdict};
use crate::{Mechanism, RefusalCause};

/// Why a block gets no site: a kind for grouping, the refusal's cause
/// ([`crate::RefusalCause::name`]: `no_room_for_jmp`, as `trapctl points` and a glob's summary
/// name it), and the whole sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRefusal {
    pub kind: String,
    pub reason: String,
}

/// One basic block of a covered function.
#[derive(Clone, Debug)]
pub struct CoverBlock {
    pub function: String,
    /// The function's address (file addresses throughout).
    pub func_addr: u64,
    pub start: u64,
    /// Exclusive.
    pub end: u64,
    /// The mechanism of its counting splice, or why it has none.
    pub site: Result<Mechanism, BlockRefusal>,
    /// Starts of the blocks of the function control can flow to from it (the decoder's CFG).
    pub succs: Vec<u64>,
    /// The conditional branch that ends it, if one does (and its function has no indirect
    /// jump, whose targets the CFG may not know).
    pub branch: Option<Branch>,
    /// Other functions of its object have its function's name (static functions of several
    /// files): its point names the function by its address too (`name@0xADDRESS`).
    pub shared_name: bool,
}

/// A conditional branch ending a block: its instruction, where it goes when taken, and where
/// control falls through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Branch {
    pub insn: u64,
    pub taken: u64,
    pub fallthrough: u64,
}

/// The conditional branch (a near `jcc`, `jrcxz`, `loop*` to a block of `func`) that ends `b`.
fn branch_of(func: &Function, b: &crate::analysis::BasicBlock) -> Option<Branch> {
    if func.has_indirect_jumps {
        return None;
    }
    let i = func
        .insns
        .partition_point(|i| i.addr < b.end)
        .checked_sub(1)?;
    let last = &func.insns[i];
    if last.end() != b.end || last.instr.flow_control() != iced_x86::FlowControl::ConditionalBranch
    {
        return None;
    }
    let taken = last.instr.near_branch_target();
    (taken != b.end && b.succs.contains(&taken) && b.succs.contains(&b.end)).then_some(Branch {
        insn: last.addr,
        taken,
        fallthrough: b.end,
    })
}

impl CoverBlock {
    /// `function+0xOFF`, the block's first instruction as a point (the entry block: `function+0`);
    /// `function@0xADDRESS+0xOFF` when the name is shared ([`CoverBlock::shared_name`]; the
    /// address in the file, which a process target matches as it matches a run-time one).
    pub fn point(&self) -> String {
        let off = self.start - self.func_addr;
        if self.shared_name {
            format!("{}@{:#x}+{off:#x}", self.function, self.func_addr)
        } else {
            format!("{}+{off:#x}", self.function)
        }
    }
}

/// The functions of one object that `globs` name, with their blocks.
#[derive(Clone, Debug, Default)]
pub struct ObjectBlocks {
    pub functions: usize,
    pub blocks: Vec<CoverBlock>,
}

/// A refusal's kind: its cause's name (`no_room_for_jmp`).
fn kind_of(r: &crate::Refusal) -> String {
    r.cause().name().into_owned()
}

/// Whether `glob` has an object part (`OBJECT:NAME`), as [`FunctionGlob::new`] splits it.
pub fn glob_names_object(glob: &FunctionGlob) -> bool {
    glob.text().contains(':')
}

/// Every basic block of every function of `image` (the file `origin`) that one of `globs`
/// names, each judged as a process splice would be (with the object's branch targets from
/// outside each function, [`CodeImage::object_targets`]): a jmp rel32 where one fits (cheaper per
/// hit), else a trap, else a jmp by springboard, else refused with the planner's reason. `main_program`: globs without an
/// object part name the main program's functions (and only them). A name the object defines
/// at several addresses (static functions of several files) is kept, each copy's points naming
/// it by its address in the file ([`CoverBlock::point`]).
pub fn object_blocks(
    image: &CodeImage,
    origin: &str,
    globs: &[FunctionGlob],
    main_program: bool,
) -> ObjectBlocks {
    let wanted = |s: &Symbol| {
        globs.iter().any(|g| {
            if glob_names_object(g) {
                g.matches(&s.name, Some(origin))
            } else {
                main_program && g.matches(&s.name, None)
            }
        })
    };
    // Every address a name has, its IFUNCs' too: glibc's `memcpy@GLIBC_2.2.5` is a function
    // and `memcpy@@GLIBC_2.14` an IFUNC that a process binds to its implementation, so the
    // function is named by its address, never by the bare name the IFUNC takes.
    let mut by_name: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for s in image.symbols.iter() {
        if matches!(s.kind, SymbolKind::Function | SymbolKind::Ifunc) {
            by_name.entry(&s.name).or_default().insert(s.addr);
        }
    }
    let mut funcs: Vec<&Symbol> = image
        .symbols
        .iter()
        .filter(|s| s.kind == SymbolKind::Function && wanted(s))
        .collect();
    funcs.sort_by_key(|s| s.addr);
    funcs.dedup_by_key(|s| s.addr);
    let info = TargetInfo::for_code(image.kernel, "coverage");
    let read = |a: u64, l: usize| image.read(a, l).map(<[u8]>::to_vec);
    let mut out = ObjectBlocks {
        functions: funcs.len(),
        blocks: Vec::new(),
    };
    // Where each site went, and in whose function: hand-written code (GMP's assembly) has
    // functions that enter one another's code, so one block may be two functions'.
    let mut sites: BTreeMap<u64, (&str, u64)> = BTreeMap::new();
    for f in funcs {
        // Code outside a function that jumps into it (a stripped binary's unnamed `.cold`
        // parts, calls to static functions a symbol's extent covers): the object's code is
        // scanned once, for its first function.
        let targets = image.object_targets();
        let Some((_, func)) = analyzed_in(f, image.symbols.function_extent(f), &read, targets)
        else {
            continue;
        };
        let shared_name = by_name.get(f.name.as_str()).map_or(0, BTreeSet::len) > 1;
        let input = PlanInput::unspliced(&func, &info, &read, &image.symbols);
        for b in &func.blocks {
            // A jmp rel32 first (cheap per hit, takes nothing shared), then a trap, then a jmp
            // by springboard: springboards share the padding nearby, which a batch of every
            // block soon uses up.
            if let Some(&(other, at)) = sites.get(&b.start) {
                out.blocks.push(CoverBlock {
                    function: f.name.clone(),
                    func_addr: f.addr,
                    start: b.start,
                    end: b.end,
                    site: Err(BlockRefusal {
                        kind: RefusalCause::AlreadyPatched.name().into_owned(),
                        reason: format!(
                            "{:#x} is also {other}+{:#x}, which takes its site: code two functions share is counted once",
                            b.start,
                            b.start - at
                        ),
                    }),
                    succs: b.succs.clone(),
                    branch: branch_of(&func, b),
                    shared_name,
                });
                continue;
            }
            let v = SiteVerdict::judge(&input, b.start);
            let site = match (&v.jmp_rel32, &v.trap, v.jmp()) {
                (Ok(_), _, _) => Ok(Mechanism::Jmp),
                (_, Ok(_), _) => Ok(Mechanism::Trap),
                (_, _, Ok(_)) => Ok(Mechanism::Jmp),
                (_, Err(e), Err(_)) => Err(BlockRefusal {
                    kind: kind_of(e),
                    reason: e.to_string(),
                }),
            };
            if site.is_ok() {
                sites.insert(b.start, (&f.name, f.addr));
            }
            out.blocks.push(CoverBlock {
                function: f.name.clone(),
                func_addr: f.addr,
                start: b.start,
                end: b.end,
                site,
                succs: b.succs.clone(),
                branch: branch_of(&func, b),
                shared_name,
            });
        }
    }
    out
}

/// A block of a kernel function to cover, with the site its count trap takes: the block's first
/// instruction, or for the entry block the first one past the kernel's own entry bytes (an
/// `endbr64`, the ftrace `call __fentry__`), which the kernel rewrites itself (a plain `FUNC`
/// point moves past them the same way).
#[derive(Clone, Debug)]
pub struct KernelBlock {
    /// `site` is `Ok(Mechanism::Trap)` until the batch says otherwise.
    pub block: CoverBlock,
    /// The module the function is in (`None`: vmlinux).
    pub module: Option<String>,
    pub site: u64,
}

/// Every basic block of the kernel functions `funcs` (their bytes read by `read`; `has_fentry`:
/// traced functions start with the ftrace site), each with its site; `int3` padding is left out. A function that cannot be
/// read or decoded is one block over its whole extent, refused as such, and so is one in the
/// init memory the kernel freed after boot (never read: [`crate::point::freed_init`]); a block
/// that holds only the entry bytes is refused (the kernel rewrites them): never fatal.
pub fn kernel_blocks(
    funcs: &[&Symbol],
    symbols: &trapvec::SymbolTable,
    read: ReadFn<'_>,
    has_fentry: bool,
) -> Vec<KernelBlock> {
    let mut out = Vec::new();
    let init = if has_fentry {
        crate::point::freed_init(symbols)
    } else {
        None
    };
    for f in funcs {
        let extent = symbols.function_extent(f);
        let refused = |start: u64, end: u64, kind: &str, reason: String| KernelBlock {
            block: CoverBlock {
                function: f.name.clone(),
                func_addr: f.addr,
                start,
                end,
                site: Err(BlockRefusal {
                    kind: kind.into(),
                    reason,
                }),
                succs: Vec::new(),
                branch: None,
                shared_name: false,
            },
            module: f.origin.clone(),
            site: start,
        };
        if f.origin.is_none() && init.is_some_and(|(lo, hi)| (lo..hi).contains(&f.addr)) {
            out.push(refused(
                f.addr,
                f.addr + extent.max(1),
                &crate::RefusalCause::InitFreed.name(),
                format!(
                    "{} ({:#x}) is init code, which the kernel freed after boot",
                    f.name, f.addr
                ),
            ));
            continue;
        }
        let (bytes, func) = match analyzed_or_why(f, extent, read) {
            Ok(x) => x,
            Err(cause) => {
                out.push(refused(
                    f.addr,
                    f.addr + extent.max(1),
                    &cause.name(),
                    format!(
                        "{} ({:#x}, {extent} bytes) cannot be read or decoded: {}",
                        f.name,
                        f.addr,
                        cause.summary()
                    ),
                ));
                continue;
            }
        };
        let entry = f.addr
            + if has_fentry {
                crate::kernel_entry_len(&bytes)
            } else {
                0
            };
        for b in &func.blocks {
            // `int3` padding after the last instruction (the compilers' straight-line
            // speculation fill, alignment): decoded as blocks, never run, not covered.
            let padding = usize::try_from(b.start - f.addr)
                .ok()
                .zip(usize::try_from(b.end - f.addr).ok())
                .and_then(|(s, e)| bytes.get(s..e))
                .is_some_and(|x| !x.is_empty() && x.iter().all(|&c| c == 0xCC));
            if padding {
                continue;
            }
            let site = b.start.max(entry);
            if site >= b.end {
                // No window there misses the entry bytes: the cause a point at them gets.
                out.push(refused(
                    b.start,
                    b.end,
                    &crate::RefusalCause::OverlapsFentry.name(),
                    format!(
                        "the block at {}+{:#x} holds only the kernel's entry bytes (endbr64, ftrace site), which the kernel rewrites itself",
                        f.name,
                        b.start - f.addr
                    ),
                ));
                continue;
            }
            out.push(KernelBlock {
                block: CoverBlock {
                    function: f.name.clone(),
                    func_addr: f.addr,
                    start: b.start,
                    end: b.end,
                    site: Ok(Mechanism::Trap),
                    succs: b.succs.clone(),
                    branch: branch_of(&func, b),
                    shared_name: false,
                },
                module: f.origin.clone(),
                site,
            });
        }
    }
    out
}

/// Why a file's line table cannot be read.
#[derive(Debug, Error)]
pub enum DebugInfoError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an ELF file: {source}")]
    Elf {
        path: PathBuf,
        source: object::read::Error,
    },
    #[error("{path} has no DWARF line table (no .debug_line section: build it with -g, or give --debuginfo)")]
    NoLines { path: PathBuf },
    /// gimli's error (without its `std` feature, not a `std::error::Error`), as text.
    #[error("{path}: malformed DWARF: {reason}")]
    Dwarf { path: PathBuf, reason: String },
}

/// One row of a line table, up to the next row: `[start, end)` is code of `line` of `files[file]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineRange {
    pub start: u64,
    pub end: u64,
    pub file: usize,
    pub line: u32,
}

/// A file's line tables, flattened.
#[derive(Clone, Debug, Default)]
pub struct LineTable {
    /// Source paths (absolute where the compilation directory says so).
    pub files: Vec<String>,
    /// Sorted by start.
    pub ranges: Vec<LineRange>,
}

impl LineTable {
    /// Read the line tables of the ELF file at `path` (the program built with `-g`, or its
    /// separate debug file).
    pub fn read(path: &Path) -> Result<LineTable, DebugInfoError> {
        let data = std::fs::read(path).map_err(|source| DebugInfoError::Read {
            path: path.into(),
            source,
        })?;
        let file = object::File::parse(&*data).map_err(|source| DebugInfoError::Elf {
            path: path.into(),
            source,
        })?;
        if file.section_by_name(".debug_line").is_none() {
            return Err(DebugInfoError::NoLines { path: path.into() });
        }
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let load = |id: gimli::SectionId| -> Result<Cow<'_, [u8]>, gimli::Error> {
            Ok(file
                .section_by_name(id.name())
                .and_then(|s| s.uncompressed_data().ok())
                .unwrap_or(Cow::Borrowed(&[])))
        };
        let dwarf_err = |e: gimli::Error| DebugInfoError::Dwarf {
            path: path.into(),
            reason: e.to_string(),
        };
        let sections = gimli::DwarfSections::load(load).map_err(dwarf_err)?;
        let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
        Self::from_dwarf(&dwarf).map_err(dwarf_err)
    }

    fn from_dwarf(
        dwarf: &gimli::Dwarf<gimli::EndianSlice<'_, gimli::RunTimeEndian>>,
    ) -> Result<LineTable, gimli::Error> {
        let mut table = LineTable::default();
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        let mut units = dwarf.units();
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let comp_dir = unit
                .comp_dir
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut rows = program.rows();
            // The row before, whose range ends at this row's address.
            let mut open: Option<(u64, usize, u32)> = None;
            while let Some((header, row)) = rows.next_row()? {
                if let Some((start, file, line)) = open.take() {
                    if row.address() > start && line > 0 {
                        table.ranges.push(LineRange {
                            start,
                            end: row.address(),
                            file,
                            line,
                        });
                    }
                }
                if row.end_sequence() {
                    continue;
                }
                let Some(entry) = row.file(header) else {
                    continue;
                };
                let name = dwarf
                    .attr_string(&unit, entry.path_name())?
                    .to_string_lossy()
                    .into_owned();
                let dir = match entry.directory(header) {
                    Some(d) => dwarf.attr_string(&unit, d)?.to_string_lossy().into_owned(),
                    None => String::new(),
                };
                let mut path = PathBuf::from(&comp_dir);
                path.push(dir);
                path.push(name);
                let path = path.to_string_lossy().into_owned();
                let next = table.files.len();
                let file = *index.entry(path.clone()).or_insert(next);
                if file == next {
                    table.files.push(path);
                }
                let line = row
                    .line()
                    .map_or(0, |l| u32::try_from(l.get()).unwrap_or(0));
                open = Some((row.address(), file, line));
            }
        }
        table.ranges.sort_by_key(|r| (r.start, r.end));
        Ok(table)
    }

    /// The ranges overlapping `[start, end)`.
    pub fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = &LineRange> {
        // Ranges are short: the ones that can overlap start within the longest range before.
        let first = self.ranges.partition_point(|r| r.start < start);
        let back = self.ranges[..first]
            .iter()
            .rev()
            .take_while(move |r| r.end > start || r.start + 4096 > start);
        back.chain(
            self.ranges[first..]
                .iter()
                .take_while(move |r| r.start < end),
        )
        .filter(move |r| r.start < end && r.end > start)
    }
}

/// A block and what the run said of it: `None` for a block without a site.
pub struct BlockHits<'a> {
    pub block: &'a CoverBlock,
    pub hits: Option<u64>,
}

/// The lcov tracefile of one object's blocks: per source file, `FN`/`FNDA` for each covered
/// function whose entry has a line, `DA` for every line a block of theirs covers (its count:
/// the most hits of a block over it), `LF`/`LH`, `FNF`/`FNH`, and `BRDA`/`BRF`/`BRH` for the
/// conditional branches whose edges the block counts give (`Edges::branch_counts`). Blocks without a
/// site count as not executed.
pub fn lcov(test_name: &str, blocks: &[BlockHits<'_>], lines: &LineTable) -> String {
    lcov_with(test_name, blocks, lines, true)
}

/// The block counts of an object, indexed for [`Edges::branch_counts`].
struct Edges {
    /// (function, block start) -> the block's hits (`None`: no site).
    count: std::collections::HashMap<(u64, u64), Option<u64>>,
    /// (function, block start) -> how many predecessors it has.
    preds: std::collections::HashMap<(u64, u64), usize>,
}

impl Edges {
    fn new(all: &[BlockHits<'_>]) -> Edges {
        let mut e = Edges {
            count: Default::default(),
            preds: Default::default(),
        };
        for x in all {
            let f = x.block.func_addr;
            e.count.insert((f, x.block.start), x.hits);
            // The function's entry has the caller as a predecessor.
            if x.block.start == f {
                *e.preds.entry((f, f)).or_default() += 1;
            }
            for &s in &x.block.succs {
                *e.preds.entry((f, s)).or_default() += 1;
            }
        }
        e
    }

    /// How often `b`'s conditional branch was taken and not taken, from block counts: the
    /// fall-through edge is the fall-through block's count when `b` is its only predecessor
    /// (then taken = `b`'s count minus that), else the taken edge is the target's count when
    /// `b` is the target's only predecessor. `None` when neither has that one predecessor (the
    /// edge counts are not in the block counts then) or a count is missing (no site).
    fn branch_counts(&self, b: &BlockHits<'_>) -> Option<(u64, u64)> {
        let br = b.block.branch?;
        let hits = b.hits?;
        let f = b.block.func_addr;
        let only_pred = |at: u64| self.preds.get(&(f, at)) == Some(&1);
        let count = |at: u64| self.count.get(&(f, at)).copied().flatten();
        if only_pred(br.fallthrough) {
            let not_taken = count(br.fallthrough)?;
            return Some((hits.checked_sub(not_taken)?, not_taken));
        }
        if only_pred(br.taken) {
            let taken = count(br.taken)?;
            return Some((taken, hits.checked_sub(taken)?));
        }
        None
    }
}

/// One file's branch records: (line, branch address) -> (block executed, taken, not taken).
type BranchRows = BTreeMap<(u32, u64), (bool, u64, u64)>;

/// [`lcov`], with `BRDA` lines only if `branches` (block counts that are exact: not once mode,
/// where a count stops at the site's disarming).
pub fn lcov_with(
    test_name: &str,
    blocks: &[BlockHits<'_>],
    lines: &LineTable,
    branches: bool,
) -> String {
    // file -> line -> hits; file -> function -> (line, entry hits)
    let mut da: BTreeMap<usize, BTreeMap<u32, u64>> = BTreeMap::new();
    let mut fns: BTreeMap<usize, BTreeMap<String, (u32, u64)>> = BTreeMap::new();
    for b in blocks {
        let hits = b.hits.unwrap_or(0);
        for r in lines.overlapping(b.block.start, b.block.end) {
            let e = da.entry(r.file).or_default().entry(r.line).or_insert(0);
            *e = (*e).max(hits);
        }
        if b.block.start == b.block.func_addr {
            if let Some(r) = lines.overlapping(b.block.start, b.block.start + 1).next() {
                fns.entry(r.file)
                    .or_default()
                    .insert(b.block.function.clone(), (r.line, hits));
            }
        }
    }
    // file -> (line, branch address) -> (executed, taken, not taken)
    let mut brda: BTreeMap<usize, BranchRows> = BTreeMap::new();
    let edges = Edges::new(if branches { blocks } else { &[] });
    for b in blocks.iter().filter(|_| branches) {
        let Some(br) = b.block.branch else { continue };
        let Some((taken, not_taken)) = edges.branch_counts(b) else {
            continue;
        };
        if let Some(r) = lines.overlapping(br.insn, br.insn + 1).next() {
            brda.entry(r.file).or_default().insert(
                (r.line, br.insn),
                (b.hits.unwrap_or(0) > 0, taken, not_taken),
            );
        }
    }
    let mut o = String::new();
    for (file, lines_hit) in &da {
        let _ = writeln!(o, "TN:{test_name}");
        let _ = writeln!(o, "SF:{}", lines.files[*file]);
        let f = fns.get(file).cloned().unwrap_or_default();
        for (name, (line, _)) in &f {
            let _ = writeln!(o, "FN:{line},{name}");
        }
        for (name, (_, hits)) in &f {
            let _ = writeln!(o, "FNDA:{hits},{name}");
        }
        let _ = writeln!(o, "FNF:{}", f.len());
        let _ = writeln!(o, "FNH:{}", f.values().filter(|(_, h)| *h > 0).count());
        for (line, hits) in lines_hit {
            let _ = writeln!(o, "DA:{line},{hits}");
        }
        if let Some(brs) = brda.get(file) {
            let mut per_line: BTreeMap<u32, u32> = BTreeMap::new();
            let (mut found, mut hit) = (0, 0);
            for (&(line, _), &(executed, taken, not_taken)) in brs {
                let n = per_line.entry(line).or_insert(0);
                for (k, count) in [(0, taken), (1, not_taken)] {
                    found += 1;
                    hit += usize::from(count > 0);
                    let count = if executed {
                        count.to_string()
                    } else {
                        "-".to_string()
                    };
                    let _ = writeln!(o, "BRDA:{line},{n},{k},{count}");
                }
                *n += 1;
            }
            let _ = writeln!(o, "BRF:{found}");
            let _ = writeln!(o, "BRH:{hit}");
        }
        let _ = writeln!(o, "LF:{}", lines_hit.len());
        let _ = writeln!(o, "LH:{}", lines_hit.values().filter(|h| **h > 0).count());
        let _ = writeln!(o, "end_of_record");
    }
    o
}

/// Symbol+offset records for an object without a line table: one `# BLOCK` comment line per
/// block (`function+0xOFF length hits`), after a `#` line saying `why`. lcov's tools skip them;
/// they are for reading.
pub fn symbol_records(object: &str, why: &str, blocks: &[BlockHits<'_>]) -> String {
    let mut o = format!("# {object}: no source lines: {why}\n");
    for b in blocks {
        let _ = writeln!(
            o,
            "# BLOCK {} {} {}",
            b.block.point(),
            b.block.end - b.block.start,
            b.hits.map_or("-".to_string(), |h| h.to_string())
        );
    }
    o
}

mod analyzed;
pub use analyzed::{analyzed, analyzed_in, analyzed_or_why};

#[cfg(test)]
mod tests;
