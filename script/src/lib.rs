//! trapvec's tracing and patching language: a bpftrace-shaped one-liner compiled straight to an
//! x86-64 component, with no C compiler and no LLVM.
//!
//! A program compiles ([`compile`]) to an ordinary relocatable ELF component (a `.o` written with
//! `object::write`, its code emitted by iced-x86's `CodeAssembler`) whose handlers follow
//! trapvec.h's call and return-handler ABI and whose maps are fixed-size open-addressed tables
//! in its `.bss`, plus the splices that put each handler at its probe. The component manager,
//! the splicer and the agent load and apply it as any other component. At the program's `exit`
//! a generated handler writes the data block to a file, which [`layout::Layout::decode`] reads
//! back. A kernel program ([`Options::kernel`]) has no such handler: trapctl reads its data
//! block out of the kernel's repository.
//!
//! This crate is pure: it parses, checks and emits bytes; it never loads, splices or runs
//! anything (`trapctl trace` does). See docs/trace.md for the language.

pub mod ast;
pub mod check;
pub mod codegen;
pub mod error;
pub mod layout;
mod object_file;
mod parser;

pub use check::{Action, CheckOptions, Checked, Const, Interval, Printf, Ty};
pub use error::{CompileError, Pos};
pub use layout::{render, render_map, Drain, Layout, Results};

use ast::ProbeSpec;

/// Buckets of `hist()`: negative, zero, then one per power of two.
pub const HIST_BUCKETS: usize = 66;
/// Slots per keyed map unless told otherwise.
pub const DEFAULT_SLOTS: usize = 4096;
/// The data block's symbol.
pub const DATA_SYMBOL: &str = "trapvec_trace_data";
/// The dump handler's symbol.
pub const DUMP_SYMBOL: &str = "trapvec_trace_dump";

/// Where a kernel program finds the running task's fields, as trapvec.ko's INFO reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelTask {
    /// The per-CPU offset of the running task's pointer (`gs:[current_task]`).
    pub current_task: u64,
    /// `offsetof(struct task_struct, pid)` (the thread), `tgid` (the process) and `comm`.
    pub pid: i32,
    pub tgid: i32,
    pub comm: i32,
}

/// How to compile.
#[derive(Clone, Debug)]
pub struct Options {
    pub allow_changes: bool,
    /// Slots per keyed map (a power of two).
    pub slots: usize,
    /// Where the dump handler writes the data block (a process program).
    pub dump_path: String,
    /// Compile for the kernel: no dump handler, the task's fields from `current`, kernel
    /// functions for the time and the fault-safe reads.
    pub kernel: Option<KernelTask>,
}

/// Why a program did not compile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Codegen(#[from] codegen::CodegenError),
    #[error("writing the component: {0}")]
    Object(String),
    #[error("--map-size {0} is not a power of two between 1 and 2^24")]
    Slots(usize),
}

/// A splice the trace needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Splice {
    /// The point (`compute`, `compute+8`, `libc.so.6:malloc`).
    pub at: String,
    /// At the function's return.
    pub ret: bool,
    /// The handler replaces the function (`return EXPR` at its entry).
    pub replace: bool,
    pub handler: String,
    /// An entry probe of a function that also has a `:return` probe (in the kernel or in a
    /// process): the return point's entry half takes the entry's site, so this probe belongs at
    /// the instruction after that site's window ([`after_window`]); the caller, which can read
    /// the function's bytes, moves `at` there before splicing.
    pub beside_return: bool,
}

/// A compiled program.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The component (ELF relocatable).
    pub object: Vec<u8>,
    pub splices: Vec<Splice>,
    pub layout: Layout,
    /// String values (`func`, `probe`, literals) by index.
    pub strings: Vec<String>,
    pub begin: Vec<Printf>,
    pub end: Vec<Printf>,
    /// The probes' printf formats and argument types, by a ring record's format index.
    pub formats: Vec<(String, Vec<Ty>)>,
    /// A probe calls `exit()`.
    pub exits: bool,
    pub intervals: Vec<Interval>,
}

impl Compiled {
    /// The tracer must read the data block while the probes run: to print the probes'
    /// printf lines, to see `exit()`, to run the intervals.
    pub fn polls(&self) -> bool {
        !self.formats.is_empty() || self.exits || !self.intervals.is_empty()
    }

    /// A kernel program's spec: the component and one splice per probe (trap mechanism).
    pub fn kernel_spec(&self, component: &str) -> String {
        self.kernel_spec_by(component, "trap")
    }

    /// [`Compiled::kernel_spec`] with every probe spliced by `mechanism` (`trap` or `jmp`, as a
    /// spec names it: the planner refuses a probe whose site cannot take a jmp).
    pub fn kernel_spec_by(&self, component: &str, mechanism: &str) -> String {
        let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let mut s = format!("[[component]]\npath = {}\n\n", q(component));
        for sp in &self.splices {
            s += &format!(
                "[[splice]]\nat = {}\naction = \"{}\"\nhandler = {}\nmechanism = {}\n{}\n",
                q(&sp.at),
                if sp.replace { "replace" } else { "call" },
                q(&sp.handler),
                q(mechanism),
                if sp.ret { "when = \"return\"\n" } else { "" }
            );
        }
        s
    }

    /// The spec: the component, one splice per probe (trap mechanism), and the dump handler at
    /// `exit_point` (e.g. `libc.so.6:exit`).
    pub fn spec(&self, component: &str, exit_point: &str) -> String {
        self.spec_by(component, exit_point, "trap")
    }

    /// [`Compiled::spec`] with every probe spliced by `mechanism`; the dump handler at
    /// `exit_point` keeps the trap.
    pub fn spec_by(&self, component: &str, exit_point: &str, mechanism: &str) -> String {
        let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let mut s = self.kernel_spec_by(component, mechanism);
        s += &format!(
            "[[splice]]\nat = {}\naction = \"call\"\nhandler = {}\nmechanism = \"trap\"\n",
            q(exit_point),
            q(DUMP_SYMBOL)
        );
        s
    }
}

/// Parse and check a program (no code).
pub fn check(src: &str, opts: CheckOptions) -> Result<Checked, CompileError> {
    let program = parser::parse(src).map_err(|e| CompileError::new(src, e.pos, e.message))?;
    check::check(&program, opts).map_err(|e| CompileError::new(src, e.pos, e.message))
}

/// The point text of a probe on function `name`.
fn point(object: Option<&str>, name: &str, offset: u64) -> String {
    let base = match object {
        Some(o) => format!("{o}:{name}"),
        None => name.to_string(),
    };
    if offset == 0 {
        base
    } else {
        format!("{base}+{offset:#x}")
    }
}

/// What a probe's function name stands for: `(object, name)` -> the functions.
pub type Expand<'a> = dyn FnMut(Option<&str>, &str) -> Result<Vec<String>, String> + 'a;

/// Compile a program. `expand` gives the functions a probe's name stands for (the name itself
/// unless it is a glob); an empty list or an error is reported at the probe.
pub fn compile(src: &str, opts: &Options, expand: &mut Expand<'_>) -> Result<Compiled, Error> {
    if !opts.slots.is_power_of_two() || opts.slots > 1 << 24 {
        return Err(Error::Slots(opts.slots));
    }
    let checked = check(
        src,
        CheckOptions {
            allow_changes: opts.allow_changes,
            kernel: opts.kernel.is_some(),
        },
    )?;
    // Every (probe spec, function) pair is one handler.
    struct H<'a> {
        body: &'a check::Body,
        beside_return: bool,
        ret: bool,
        func: String,
        probe: String,
        at: String,
    }
    let mut hs = Vec::new();
    let mut sites = std::collections::HashMap::new();
    // An entry probe and a :return probe of one function may go together: the entry probe
    // moves past the return point's site (see Splice::beside_return).
    let mut returns = std::collections::HashSet::new();
    for (specs, _) in &checked.probes {
        for (spec, pos) in specs {
            if let ProbeSpec::Func {
                object,
                name,
                ret: true,
                ..
            } = spec
            {
                let names =
                    expand(object.as_deref(), name).map_err(|m| CompileError::new(src, *pos, m))?;
                returns.extend(names.into_iter().map(|f| point(object.as_deref(), &f, 0)));
            }
        }
    }
    for (specs, body) in &checked.probes {
        for (spec, pos) in specs {
            let ProbeSpec::Func {
                object,
                name,
                offset,
                ret,
            } = spec
            else {
                continue;
            };
            let names =
                expand(object.as_deref(), name).map_err(|m| CompileError::new(src, *pos, m))?;
            if names.is_empty() {
                return Err(CompileError::new(
                    src,
                    *pos,
                    format!("probe '{name}' matches no function"),
                )
                .into());
            }
            for f in names {
                let at = point(object.as_deref(), &f, *offset);
                let beside_return = !*ret && *offset == 0 && returns.contains(&at);
                // A return point takes the entry's site: one splice per site.
                let site = if beside_return {
                    format!("{at} (beside its return)")
                } else {
                    point(object.as_deref(), &f, if *ret { 0 } else { *offset })
                };
                if let Some(other) = sites.insert(
                    site.clone(),
                    format!("{at}{}", if *ret { ":return" } else { "" }),
                ) {
                    return Err(CompileError::new(
                        src,
                        *pos,
                        format!("probe '{other}' already uses the site of {site}: a site takes one probe (an entry and a :return probe of one function share it)"),
                    )
                    .into());
                }
                let probe = if *ret {
                    format!("{at}:return")
                } else {
                    at.clone()
                };
                if beside_return && body.replaces() {
                    return Err(CompileError::new(
                        src,
                        *pos,
                        format!(
                            "'{at}' has a :return probe: its entry cannot also skip it with return"
                        ),
                    )
                    .into());
                }
                hs.push(H {
                    body,
                    beside_return,
                    ret: *ret,
                    func: f,
                    probe,
                    at,
                });
            }
        }
    }
    let layout = Layout::new(
        &checked.maps,
        hs.iter().map(|h| h.probe.clone()).collect(),
        opts.slots,
        !checked.formats.is_empty(),
    );
    let mut strings = layout::Strings::default();
    let mut funcs = Vec::new();
    let mut splices = Vec::new();
    for (i, h) in hs.iter().enumerate() {
        let func = strings.intern(&h.func);
        let probe = strings.intern(&h.probe);
        let code = codegen::handler(
            &codegen::Handler {
                body: h.body,
                ret: h.ret,
                failed: layout.handlers[i].failed,
                func,
                probe,
                kernel: opts.kernel,
                formats: &checked.formats,
                exits: checked.exits,
                orig: Some(format!("__trapvec_orig_{}", h.func)),
            },
            &layout,
            &mut strings,
        )?;
        let name = format!("trapvec_trace_h{i}");
        splices.push(Splice {
            at: h.at.clone(),
            ret: h.ret,
            replace: h.body.replaces(),
            handler: name.clone(),
            beside_return: h.beside_return,
        });
        funcs.push((name, code));
    }
    let dump = match opts.kernel {
        Some(_) => None,
        None => Some(codegen::dump(layout.size)?),
    };
    let object = object_file::write(
        &funcs,
        dump.as_deref().map(|d| (d, opts.dump_path.as_str())),
        layout.size,
    )
    .map_err(|e| Error::Object(e.to_string()))?;
    Ok(Compiled {
        object,
        splices,
        layout,
        strings: strings.0,
        begin: checked.begin,
        end: checked.end,
        formats: checked.formats,
        exits: checked.exits,
        intervals: checked.intervals,
    })
}

/// A BEGIN/END line, formatted as C's printf would.
pub fn format_printf(p: &Printf) -> String {
    let mut out = String::new();
    let mut args = p.args.iter();
    let mut it = p.format.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut flags = String::new();
        while let Some(&f) = it.peek().filter(|c| "-0123456789l".contains(**c)) {
            if f != 'l' {
                flags.push(f);
            }
            it.next();
        }
        let conv = it.next().unwrap_or('%');
        let text = match (conv, args.next()) {
            ('%', _) => "%".to_string(),
            ('s', Some(Const::Str(s))) => s.clone(),
            ('x', Some(Const::Int(v))) => format!("{:x}", u64::from_ne_bytes(v.to_ne_bytes())),
            ('X', Some(Const::Int(v))) => format!("{:X}", u64::from_ne_bytes(v.to_ne_bytes())),
            ('u', Some(Const::Int(v))) => format!("{}", u64::from_ne_bytes(v.to_ne_bytes())),
            (_, Some(Const::Int(v))) => v.to_string(),
            (_, Some(Const::Str(s))) => s.clone(),
            (_, None) => String::new(),
        };
        let left = flags.starts_with('-');
        let zero = flags.starts_with('0');
        let width: usize = flags.trim_start_matches(['-', '0']).parse().unwrap_or(0);
        if text.len() >= width {
            out += &text;
        } else if left {
            out += &format!("{text:<width$}");
        } else if zero {
            out += &format!("{text:0>width$}");
        } else {
            out += &format!("{text:>width$}");
        }
    }
    out
}

#[cfg(test)]
mod tests;

/// Why an entry probe cannot go beside its function's return point.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("the function's bytes end inside its first instructions (undecodable at +{0:#x})")]
    Undecodable(usize),
    #[error("`{instr}` at +{at:#x}, before the entry probe's place, writes {reg}: the probe would not see the entry's argument")]
    WritesArg {
        instr: String,
        at: usize,
        reg: &'static str,
    },
    #[error("`{instr}` at +{at:#x} leaves the function's first instructions (a branch): no place after the return point's site")]
    Branch { instr: String, at: usize },
}

/// The offset, in `code` (a function's bytes from its entry, at address `ip`), of the first
/// instruction after the window a trap of `window` bytes at `start` displaces: where an entry
/// probe goes when the function's return point takes `start`. The instructions it skips must
/// not branch and must not write an argument register, so that `argN` there are the entry's.
pub fn after_window(
    code: &[u8],
    ip: u64,
    start: usize,
    window: usize,
) -> Result<usize, WindowError> {
    use iced_x86::{
        Decoder, DecoderOptions, FlowControl, InstructionInfoFactory, OpAccess, Register,
    };
    const ARGS: [(Register, &str); 6] = [
        (Register::RDI, "rdi"),
        (Register::RSI, "rsi"),
        (Register::RDX, "rdx"),
        (Register::RCX, "rcx"),
        (Register::R8, "r8"),
        (Register::R9, "r9"),
    ];
    let mut at = start;
    let mut info = InstructionInfoFactory::new();
    while at < start + window {
        let rest = code.get(at..).unwrap_or_default();
        let mut d = Decoder::with_ip(64, rest, ip + at as u64, DecoderOptions::NONE);
        let i = d.decode();
        if i.is_invalid() || i.len() > rest.len() {
            return Err(WindowError::Undecodable(at));
        }
        if i.flow_control() != FlowControl::Next {
            return Err(WindowError::Branch {
                instr: i.to_string(),
                at,
            });
        }
        for r in info.info(&i).used_registers() {
            if !matches!(
                r.access(),
                OpAccess::Write
                    | OpAccess::ReadWrite
                    | OpAccess::CondWrite
                    | OpAccess::ReadCondWrite
            ) {
                continue;
            }
            let full = r.register().full_register();
            if let Some((_, reg)) = ARGS.iter().find(|(a, _)| *a == full) {
                return Err(WindowError::WritesArg {
                    instr: i.to_string(),
                    at,
                    reg,
                });
            }
        }
        at += i.len();
    }
    Ok(at)
}
