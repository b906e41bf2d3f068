//! trapvec's tracing and patching language: a bpftrace-shaped one-liner compiled straight to an
//! x86-64 component, with no C compiler and no LLVM.
//!
//! A program compiles ([`compile`]) to an ordinary relocatable ELF component (a `.o` written with
//! `object::write`, its code emitted by iced-x86's `CodeAssembler`) whose handlers follow
//! trapvec.h's call and return-handler ABI and whose maps are fixed-size open-addressed tables
//! in its `.bss`, plus the splices that put each handler at its probe. The component manager,
//! the splicer and the agent load and apply it as any other component. At the program's `exit`
//! a generated handler writes the data block to a file, which [`layout::Layout::decode`] reads
//! back.
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

pub use check::{CheckOptions, Checked, Const, Printf};
pub use error::{CompileError, Pos};
pub use layout::{render, Layout, Results};

use ast::ProbeSpec;

/// Buckets of `hist()`: negative, zero, then one per power of two.
pub const HIST_BUCKETS: usize = 66;
/// Slots per keyed map unless told otherwise.
pub const DEFAULT_SLOTS: usize = 4096;
/// The data block's symbol.
pub const DATA_SYMBOL: &str = "trapvec_trace_data";
/// The dump handler's symbol.
pub const DUMP_SYMBOL: &str = "trapvec_trace_dump";

/// How to compile.
#[derive(Clone, Debug)]
pub struct Options {
    pub allow_changes: bool,
    /// Slots per keyed map (a power of two).
    pub slots: usize,
    /// Where the dump handler writes the data block.
    pub dump_path: String,
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
}

impl Compiled {
    /// The spec: the component, one splice per probe (trap mechanism), and the dump handler at
    /// `exit_point` (e.g. `libc.so.6:exit`).
    pub fn spec(&self, component: &str, exit_point: &str) -> String {
        let q = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let mut s = format!("[[component]]\npath = {}\n\n", q(component));
        for sp in &self.splices {
            s += &format!(
                "[[splice]]\nat = {}\naction = \"{}\"\nhandler = {}\nmechanism = \"trap\"\n{}\n",
                q(&sp.at),
                if sp.replace { "replace" } else { "call" },
                q(&sp.handler),
                if sp.ret { "when = \"return\"\n" } else { "" }
            );
        }
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
        },
    )?;
    // Every (probe spec, function) pair is one handler.
    struct H<'a> {
        body: &'a check::Body,
        ret: bool,
        func: String,
        probe: String,
        at: String,
    }
    let mut hs = Vec::new();
    let mut sites = std::collections::HashMap::new();
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
                // A return point takes the entry's site: one splice per site.
                let site = point(object.as_deref(), &f, if *ret { 0 } else { *offset });
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
                hs.push(H {
                    body,
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
        });
        funcs.push((name, code));
    }
    let dump = codegen::dump(layout.size)?;
    let object = object_file::write(&funcs, &dump, layout.size, &opts.dump_path)
        .map_err(|e| Error::Object(e.to_string()))?;
    Ok(Compiled {
        object,
        splices,
        layout,
        strings: strings.0,
        begin: checked.begin,
        end: checked.end,
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
