//! The type checker: every name known, every map used one way, changes only where they mean
//! something (and only with `--allow-changes`), BEGIN/END only printing constants.

use std::collections::HashMap;

use crate::ast::*;
use crate::error::{err, Pos, Spanned};

/// A value's type: a 64-bit integer (signed or not), a constant string (its index in the
/// string table), or bytes read at run time (`comm`, `str(p, n)`: a NUL-padded buffer of this
/// many bytes, a multiple of 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Int { signed: bool },
    Str,
    Bytes(usize),
}

impl Ty {
    /// 8-byte words the value takes as a map key.
    pub fn words(self) -> usize {
        match self {
            Ty::Bytes(n) => n / 8,
            _ => 1,
        }
    }
}

/// The longest `str(p, n)`.
pub const MAX_STR: u64 = 128;

/// The buffer of `str(p, n)`: `n` (checked) rounded up to words.
pub fn str_bytes(args: &[Expr]) -> usize {
    match args.get(1).map(|e| &e.kind) {
        Some(ExprKind::Int(n)) => (usize::try_from(*n).unwrap_or(0) + 7) & !7,
        _ => 8,
    }
}

/// What a map holds per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum MapKind {
    Count,
    Sum,
    Min,
    Max,
    Avg,
    Hist,
    Lhist {
        lo: i64,
        hi: i64,
        step: i64,
    },
    /// `@x = EXPR`: the last value stored.
    Value,
}

impl MapKind {
    fn name(self) -> &'static str {
        match self {
            MapKind::Count => "count()",
            MapKind::Sum => "sum()",
            MapKind::Min => "min()",
            MapKind::Max => "max()",
            MapKind::Avg => "avg()",
            MapKind::Hist => "hist()",
            MapKind::Lhist { .. } => "lhist()",
            MapKind::Value => "a plain value",
        }
    }

    /// 8-byte words of a slot's value.
    pub fn value_words(self) -> usize {
        match self {
            MapKind::Count | MapKind::Sum | MapKind::Min | MapKind::Max | MapKind::Value => 1,
            MapKind::Avg => 2,
            MapKind::Hist => crate::HIST_BUCKETS,
            MapKind::Lhist { lo, hi, step } => lhist_buckets(lo, hi, step),
        }
    }
}

/// `lhist`'s buckets: below `lo`, one per `step` in `[lo, hi)`, then `hi` and above.
pub fn lhist_buckets(lo: i64, hi: i64, step: i64) -> usize {
    usize::try_from((hi - lo + step - 1) / step).unwrap_or(0) + 2
}

/// A map as the program uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapInfo {
    pub name: String,
    pub kind: MapKind,
    pub keys: Vec<Ty>,
    /// Whether values print as signed numbers.
    pub signed: bool,
    pub pos: Pos,
}

/// A checked function probe body (one per probe; a probe with several specs shares it).
#[derive(Clone, Debug)]
pub struct Body {
    pub predicate: Option<Expr>,
    pub stmts: Vec<Stmt>,
    /// `$name` -> (stack slot, type).
    pub vars: HashMap<String, (usize, Ty)>,
}

impl Body {
    /// The body ends in `return EXPR`: its handler replaces the function.
    pub fn replaces(&self) -> bool {
        matches!(self.stmts.last(), Some(Stmt::Return { .. }))
    }
}

/// A line BEGIN or END prints (constant arguments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Printf {
    pub format: String,
    pub args: Vec<Const>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Const {
    Int(i64),
    Str(String),
}

/// A printf argument's type as its format is listed: integers print as signed whatever the
/// checker last knew of a variable's signedness (the conversion decides: `%u`, `%x`).
pub fn printf_ty(t: Ty) -> Ty {
    match t {
        Ty::Int { .. } => Ty::Int { signed: true },
        other => other,
    }
}

/// The most 8-byte words of a probe's printf arguments (a record of the printf ring).
pub const PRINTF_WORDS: usize = 16;

/// What an interval probe does, run by the tracer against the data it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Printf(Printf),
    /// Print the map (by name) as the end prints it.
    Print(String),
    /// Forget the map's entries (the tracer prints what came since).
    Clear(String),
    Exit,
}

/// `interval:s:N` / `interval:ms:N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    pub ms: u64,
    pub actions: Vec<Action>,
}

/// The whole program, checked.
#[derive(Clone, Debug)]
pub struct Checked {
    pub maps: Vec<MapInfo>,
    /// Function probes: their specs (with positions) and their body.
    pub probes: Vec<(Vec<(ProbeSpec, Pos)>, Body)>,
    pub begin: Vec<Printf>,
    pub end: Vec<Printf>,
    /// The formats of the probes' printf statements and their arguments' types: a ring
    /// record names its format by its index here.
    pub formats: Vec<(String, Vec<Ty>)>,
    /// A probe calls `exit()`.
    pub exits: bool,
    pub intervals: Vec<Interval>,
}

/// Options the checker needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Changes of retval, arguments or registers are allowed (`--allow-changes`).
    pub allow_changes: bool,
    /// The program is compiled for the kernel.
    pub kernel: bool,
}

/// Where an expression is evaluated.
#[derive(Clone, Copy)]
struct At {
    ret: bool,
    offset: u64,
}

pub(crate) fn check(p: &Program, opts: CheckOptions) -> Result<Checked, Spanned> {
    let mut c = Checker {
        maps: Vec::new(),
        index: HashMap::new(),
        opts,
        formats: Vec::new(),
        exits: false,
        uses: Vec::new(),
    };
    let mut intervals = Vec::new();
    let mut probes = Vec::new();
    let mut begin = Vec::new();
    let mut end = Vec::new();
    for probe in &p.probes {
        if let Some((ProbeSpec::Interval { ms }, ipos)) = probe
            .specs
            .iter()
            .find(|(s, _)| matches!(s, ProbeSpec::Interval { .. }))
        {
            if probe.specs.len() > 1 {
                return err(*ipos, "an interval probe cannot share a probe with others");
            }
            if let Some(pred) = &probe.predicate {
                return err(pred.pos, "an interval probe takes no predicate");
            }
            let mut actions = Vec::new();
            for s in &probe.body {
                actions.push(match s {
                    Stmt::Printf { format, args, pos } => {
                        Action::Printf(constant_printf(format, args, *pos)?)
                    }
                    Stmt::Print { name, pos } => {
                        c.uses.push(Use { name: name.clone(), keys: None, pos: *pos, what: Used::Print });
                        Action::Print(name.clone())
                    }
                    Stmt::Clear { name, pos } => {
                        c.uses.push(Use { name: name.clone(), keys: None, pos: *pos, what: Used::IntervalClear });
                        Action::Clear(name.clone())
                    }
                    Stmt::Exit { .. } => Action::Exit,
                    other => return err(
                        stmt_pos(other),
                        "an interval probe runs in trapctl: only printf of constants, print(@m), clear(@m) and exit() are allowed there",
                    ),
                });
            }
            intervals.push(Interval { ms: *ms, actions });
            continue;
        }
        let special: Vec<_> = probe
            .specs
            .iter()
            .filter(|(s, _)| matches!(s, ProbeSpec::Begin | ProbeSpec::End))
            .collect();
        if !special.is_empty() {
            if probe.specs.len() > 1 {
                return err(
                    special[0].1,
                    "BEGIN and END cannot share a probe with others",
                );
            }
            if let Some(pred) = &probe.predicate {
                return err(pred.pos, "BEGIN and END take no predicate");
            }
            let mut lines = Vec::new();
            for s in &probe.body {
                let Stmt::Printf { format, args, pos } = s else {
                    return err(
                        stmt_pos(s),
                        "BEGIN and END run in trapctl: only printf is allowed there",
                    );
                };
                lines.push(constant_printf(format, args, *pos)?);
            }
            if special[0].0 == ProbeSpec::Begin {
                begin.extend(lines);
            } else {
                end.extend(lines);
            }
            continue;
        }
        // A body shared by several specs is checked against each (entry vs return).
        let mut body = None;
        for (spec, _) in &probe.specs {
            let ProbeSpec::Func { ret, offset, .. } = spec else {
                unreachable!("BEGIN/END handled above")
            };
            body = Some(c.body(
                probe,
                At {
                    ret: *ret,
                    offset: *offset,
                },
            )?);
        }
        probes.push((probe.specs.clone(), body.expect("a probe has a spec")));
    }
    c.resolve_uses()?;
    Ok(Checked {
        maps: c.maps,
        probes,
        begin,
        end,
        formats: c.formats,
        exits: c.exits,
        intervals,
    })
}

/// A printf of constants (BEGIN, END, an interval).
fn constant_printf(format: &str, args: &[Expr], pos: Pos) -> Result<Printf, Spanned> {
    let args = args.iter().map(constant).collect::<Result<Vec<_>, _>>()?;
    let tys: Vec<Ty> = args
        .iter()
        .map(|a| match a {
            Const::Int(_) => Ty::Int { signed: true },
            Const::Str(_) => Ty::Str,
        })
        .collect();
    check_format(format, &tys, pos)?;
    Ok(Printf {
        format: format.to_string(),
        args,
    })
}

/// How a map is used besides its assignments (checked once every map is known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Used {
    Read,
    Delete,
    Clear,
    IntervalClear,
    Print,
}

struct Use {
    name: String,
    /// The keys' types (read, delete).
    keys: Option<Vec<Ty>>,
    pos: Pos,
    what: Used,
}

fn stmt_pos(s: &Stmt) -> Pos {
    match s {
        Stmt::MapAssign { pos, .. }
        | Stmt::VarAssign { pos, .. }
        | Stmt::Change { pos, .. }
        | Stmt::Return { pos, .. }
        | Stmt::Printf { pos, .. }
        | Stmt::Exit { pos }
        | Stmt::Delete { pos, .. }
        | Stmt::Clear { pos, .. }
        | Stmt::Print { pos, .. }
        | Stmt::If { pos, .. } => *pos,
    }
}

/// A constant printf argument of BEGIN/END.
fn constant(e: &Expr) -> Result<Const, Spanned> {
    match &e.kind {
        ExprKind::Str(s) => Ok(Const::Str(s.clone())),
        ExprKind::Int(v) => Ok(Const::Int(i64::from_ne_bytes(v.to_ne_bytes()))),
        ExprKind::Unary(UnOp::Neg, inner) => match constant(inner)? {
            Const::Int(v) => Ok(Const::Int(v.wrapping_neg())),
            Const::Str(_) => err(e.pos, "a string cannot be negated"),
        },
        _ => err(
            e.pos,
            "BEGIN and END print constants only (they run in trapctl, not at a probe)",
        ),
    }
}

/// `%d %i %u %x %X %s %%`, with flags and a width, one per argument of the right type.
pub(crate) fn check_format(format: &str, args: &[Ty], pos: Pos) -> Result<(), Spanned> {
    let mut n = 0;
    let mut it = format.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            continue;
        }
        while it.peek().is_some_and(|c| "-0123456789l".contains(*c)) {
            it.next();
        }
        let conv = it.next();
        let want_str = match conv {
            Some('%') => continue,
            Some('d' | 'i' | 'u' | 'x' | 'X') => false,
            Some('s') => true,
            Some(o) => return err(pos, format!("printf: unknown conversion '%{o}'")),
            None => return err(pos, "printf: the format ends in '%'"),
        };
        match args.get(n) {
            None => return err(pos, format!("printf: conversion {} has no argument", n + 1)),
            Some(Ty::Str | Ty::Bytes(_)) if !want_str => {
                return err(
                    pos,
                    format!(
                        "printf: argument {} is a string, the conversion wants an integer",
                        n + 1
                    ),
                )
            }
            Some(Ty::Int { .. }) if want_str => {
                return err(
                    pos,
                    format!(
                        "printf: argument {} is an integer, %s wants a string",
                        n + 1
                    ),
                )
            }
            _ => {}
        }
        n += 1;
    }
    if n != args.len() {
        return err(
            pos,
            format!("printf: {} argument(s) for {n} conversion(s)", args.len()),
        );
    }
    Ok(())
}

/// The registers of `trapvec_regs` by name, with their byte offset.
pub const REGS: [(&str, i32); 18] = [
    ("r15", 0),
    ("r14", 8),
    ("r13", 16),
    ("r12", 24),
    ("r11", 32),
    ("r10", 40),
    ("r9", 48),
    ("r8", 56),
    ("rdi", 64),
    ("rsi", 72),
    ("rbp", 80),
    ("rbx", 88),
    ("rdx", 96),
    ("rcx", 104),
    ("rax", 112),
    ("rsp", 120),
    ("rip", 128),
    ("rflags", 136),
];

pub fn reg_offset(name: &str) -> Option<i32> {
    REGS.iter().find(|(n, _)| *n == name).map(|(_, o)| *o)
}

struct Checker {
    maps: Vec<MapInfo>,
    index: HashMap<String, usize>,
    opts: CheckOptions,
    formats: Vec<(String, Vec<Ty>)>,
    exits: bool,
    uses: Vec<Use>,
}

/// The expression's type, assuming it checked.
pub fn ty_of(e: &Expr, vars: &HashMap<String, (usize, Ty)>) -> Ty {
    let int = |signed| Ty::Int { signed };
    match &e.kind {
        ExprKind::Int(_) => int(true),
        ExprKind::Str(_) => Ty::Str,
        ExprKind::Builtin(Builtin::Func | Builtin::Probe) => Ty::Str,
        ExprKind::Builtin(Builtin::Retval) => int(true),
        ExprKind::Builtin(Builtin::Comm) => Ty::Bytes(16),
        ExprKind::Call(f, args) if f == "str" => Ty::Bytes(str_bytes(args)),
        ExprKind::Builtin(_) | ExprKind::Reg(_) => int(false),
        ExprKind::Var(v) => vars.get(v).map_or(int(true), |(_, t)| *t),
        ExprKind::Map(..) | ExprKind::Call(..) => int(true),
        ExprKind::Unary(UnOp::Not, _) => int(true),
        ExprKind::Unary(_, a) => ty_of(a, vars),
        ExprKind::Cast(t, _) | ExprKind::Deref(t, _) => int(t.signed),
        ExprKind::Binary(op, a, b) => match op {
            BinOp::Eq
            | BinOp::Ne
            | BinOp::Lt
            | BinOp::Le
            | BinOp::Gt
            | BinOp::Ge
            | BinOp::LogAnd
            | BinOp::LogOr => int(true),
            _ => int(operands_signed(a, b, vars)),
        },
    }
}

/// Whether a binary operation on `a` and `b` is signed: a literal takes the other side's
/// signedness; otherwise signed only when both are.
pub fn operands_signed(a: &Expr, b: &Expr, vars: &HashMap<String, (usize, Ty)>) -> bool {
    let s = |e: &Expr| matches!(ty_of(e, vars), Ty::Int { signed: true });
    let lit = |e: &Expr| matches!(e.kind, ExprKind::Int(_));
    match (lit(a), lit(b)) {
        (true, false) => s(b),
        (false, true) => s(a),
        _ => s(a) && s(b),
    }
}

impl Checker {
    /// Every read, delete, clear and print names a map the program assigns, with its keys.
    fn resolve_uses(&self) -> Result<(), Spanned> {
        for u in &self.uses {
            let Some(&i) = self.index.get(&u.name) else {
                return err(u.pos, format!("map '@{}' is never assigned", u.name));
            };
            let m = &self.maps[i];
            if let Some(keys) = &u.keys {
                if keys.len() != m.keys.len() {
                    return err(
                        u.pos,
                        format!(
                            "map '@{}' has {} key(s) (at {}:{}), here {}",
                            u.name,
                            m.keys.len(),
                            m.pos.line,
                            m.pos.col,
                            keys.len()
                        ),
                    );
                }
                for (k, (a, b)) in m.keys.iter().zip(keys).enumerate() {
                    let same = match (a, b) {
                        (Ty::Int { .. }, Ty::Int { .. }) => true,
                        _ => a == b,
                    };
                    if !same {
                        return err(
                            u.pos,
                            format!(
                                "map '@{}': key {} is not of the kind it has at {}:{}",
                                u.name,
                                k + 1,
                                m.pos.line,
                                m.pos.col
                            ),
                        );
                    }
                }
            }
            match (u.what, m.kind) {
                (Used::Read, MapKind::Hist | MapKind::Lhist { .. }) => {
                    return err(
                        u.pos,
                        format!("map '@{}' holds {}: a histogram cannot be read in an expression", u.name, m.kind.name()),
                    )
                }
                (Used::IntervalClear, MapKind::Min | MapKind::Max | MapKind::Value) => {
                    return err(
                        u.pos,
                        format!("clear(@{}) in an interval: the tracer clears a map by subtracting what it held, which {} cannot do; clear it in a function probe", u.name, m.kind.name()),
                    )
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn body(&mut self, probe: &Probe, at: At) -> Result<Body, Spanned> {
        let mut vars: HashMap<String, (usize, Ty)> = HashMap::new();
        if let Some(p) = &probe.predicate {
            self.int(p, at, &vars)?;
        }
        self.stmts(&probe.body, at, &mut vars, true)?;
        Ok(Body {
            predicate: probe.predicate.clone(),
            stmts: probe.body.clone(),
            vars,
        })
    }

    /// Check `stmts` in order (`top`: the probe's own, not an `if`'s), `vars` the variables
    /// assigned so far (an `if`'s branches add theirs: a slot starts at 0, so a variable only
    /// one branch assigns reads 0 after the other).
    fn stmts(
        &mut self,
        stmts: &[Stmt],
        at: At,
        vars: &mut HashMap<String, (usize, Ty)>,
        top: bool,
    ) -> Result<(), Spanned> {
        for (i, s) in stmts.iter().enumerate() {
            match s {
                Stmt::Return { value, pos } => {
                    self.int(value, at, vars)?;
                    if at.ret || at.offset != 0 {
                        return err(*pos, "return skips the function: only at its entry (FUNC, not :return or FUNC+OFF)");
                    }
                    if !top {
                        return err(*pos, "return cannot be inside an if: put the condition in the probe's predicate (/cond/)");
                    }
                    if i + 1 != stmts.len() {
                        return err(*pos, "return must be the probe's last statement");
                    }
                    if !self.opts.allow_changes {
                        return err(*pos, "return (skipping the function) needs --allow-changes");
                    }
                }
                Stmt::Printf { format, args, pos } => {
                    let mut tys = Vec::new();
                    for a in args {
                        tys.push(self.expr(a, at, vars)?);
                    }
                    check_format(format, &tys, *pos)?;
                    let words: usize = tys.iter().map(|t| t.words()).sum();
                    if words > PRINTF_WORDS {
                        return err(*pos, format!("printf's arguments take {words} words, at most {PRINTF_WORDS} fit a record (an integer is 1, comm 2, str(p, n) n/8)"));
                    }
                    let key = (format.clone(), tys.into_iter().map(printf_ty).collect());
                    if !self.formats.contains(&key) {
                        self.formats.push(key);
                    }
                }
                Stmt::Exit { .. } => self.exits = true,
                Stmt::Delete { name, keys, pos } => {
                    let mut tys = Vec::new();
                    for k in keys {
                        tys.push(self.expr(k, at, vars)?);
                    }
                    self.uses.push(Use { name: name.clone(), keys: Some(tys), pos: *pos, what: Used::Delete });
                }
                Stmt::Clear { name, pos } => {
                    self.uses.push(Use { name: name.clone(), keys: None, pos: *pos, what: Used::Clear });
                }
                Stmt::Print { pos, .. } => {
                    return err(*pos, "print(@m) runs in trapctl: only in an interval probe (the end prints every map)")
                }
                Stmt::VarAssign { name, value, pos } => {
                    let t = self.int(value, at, vars)?;
                    let n = vars.len();
                    match vars.get(name) {
                        Some((_, old)) if *old != t => {
                            // Signedness may change with the value; keep the newest.
                            let slot = vars[name].0;
                            vars.insert(name.clone(), (slot, t));
                        }
                        Some(_) => {}
                        None => {
                            let _ = pos;
                            vars.insert(name.clone(), (n, t));
                        }
                    }
                }
                Stmt::Change { target, value, pos } => {
                    self.int(value, at, vars)?;
                    let what = match target {
                        Target::Retval => "retval".to_string(),
                        Target::Arg(n) => format!("arg{n}"),
                        Target::Reg(r) => format!("reg(\"{r}\")"),
                    };
                    match target {
                        Target::Retval if !at.ret => {
                            return err(*pos, "retval can only be changed at a :return probe")
                        }
                        Target::Arg(_) if at.ret => {
                            return err(*pos, format!("{what} can only be changed at a function's entry (a :return probe sees the entry's copies)"))
                        }
                        Target::Arg(_) if at.offset != 0 => {
                            return err(*pos, format!("{what} is the argument at the entry: change it at FUNC (offset 0), or change a register with reg()"))
                        }
                        Target::Reg(r) => match reg_offset(r) {
                            None => return err(*pos, format!("unknown register '{r}'")),
                            Some(_) if matches!(r.as_str(), "rsp" | "rip") => {
                                return err(*pos, format!("{r} cannot be changed (a handler's write to it is ignored)"))
                            }
                            Some(_) if at.ret && !matches!(r.as_str(), "rax" | "rdx") => {
                                return err(*pos, format!("at a :return probe only rax and rdx (the return value) can be changed, not {r}"))
                            }
                            Some(_) => {}
                        },
                        _ => {}
                    }
                    if !self.opts.allow_changes {
                        return err(*pos, format!("changing {what} needs --allow-changes"));
                    }
                }
                Stmt::MapAssign {
                    name,
                    keys,
                    value,
                    pos,
                } => {
                    let mut key_tys = Vec::new();
                    for k in keys {
                        key_tys.push(self.expr(k, at, vars)?);
                    }
                    let (kind, signed) = self.map_value(value, at, vars)?;
                    self.use_map(name, kind, key_tys, signed, *pos)?;
                }
                Stmt::If {
                    cond, then, els, ..
                } => {
                    self.int(cond, at, vars)?;
                    self.stmts(then, at, vars, false)?;
                    self.stmts(els, at, vars, false)?;
                }
            }
        }
        Ok(())
    }

    fn use_map(
        &mut self,
        name: &str,
        kind: MapKind,
        keys: Vec<Ty>,
        signed: bool,
        pos: Pos,
    ) -> Result<(), Spanned> {
        if let Some(&i) = self.index.get(name) {
            let m = &mut self.maps[i];
            if m.kind != kind {
                return err(
                    pos,
                    format!(
                        "map '@{name}' holds {} (at {}:{}), here {}",
                        m.kind.name(),
                        m.pos.line,
                        m.pos.col,
                        kind.name()
                    ),
                );
            }
            if m.keys.len() != keys.len() {
                return err(
                    pos,
                    format!(
                        "map '@{name}' has {} key(s) (at {}:{}), here {}",
                        m.keys.len(),
                        m.pos.line,
                        m.pos.col,
                        keys.len()
                    ),
                );
            }
            for (k, (a, b)) in m.keys.iter().zip(&keys).enumerate() {
                match (a, b) {
                    (Ty::Int { .. }, Ty::Int { .. }) => {}
                    (Ty::Int { .. }, _) | (_, Ty::Int { .. }) => {
                        return err(
                            pos,
                            format!("map '@{name}': key {} is a string in one place and an integer in another", k + 1),
                        );
                    }
                    _ if a != b => {
                        return err(
                            pos,
                            format!("map '@{name}': key {} is a string of another kind than at {}:{} (a literal, func or probe; comm; str() of another size)", k + 1, m.pos.line, m.pos.col),
                        );
                    }
                    _ => {}
                }
            }
            m.signed |= signed;
            return Ok(());
        }
        self.index.insert(name.to_string(), self.maps.len());
        self.maps.push(MapInfo {
            name: name.to_string(),
            kind,
            keys,
            signed,
            pos,
        });
        Ok(())
    }

    /// The right-hand side of `@m = ...`: an aggregation or a plain value.
    fn map_value(
        &mut self,
        value: &Expr,
        at: At,
        vars: &HashMap<String, (usize, Ty)>,
    ) -> Result<(MapKind, bool), Spanned> {
        let ExprKind::Call(f, args) = &value.kind else {
            let t = self.int(value, at, vars)?;
            return Ok((MapKind::Value, t == Ty::Int { signed: true }));
        };
        let arity = |n: usize| -> Result<(), Spanned> {
            if args.len() != n {
                return err(
                    value.pos,
                    format!("{f}() takes {n} argument(s), {} given", args.len()),
                );
            }
            Ok(())
        };
        let kind = match f.as_str() {
            "count" => {
                arity(0)?;
                return Ok((MapKind::Count, false));
            }
            "sum" => MapKind::Sum,
            "min" => MapKind::Min,
            "max" => MapKind::Max,
            "avg" => MapKind::Avg,
            "hist" => MapKind::Hist,
            "lhist" => {
                arity(4)?;
                self.int(&args[0], at, vars)?;
                let mut c = [0i64; 3];
                for (k, a) in args[1..].iter().enumerate() {
                    match constant(a) {
                        Ok(Const::Int(v)) => c[k] = v,
                        _ => {
                            return err(a.pos, "lhist's lo, hi and step must be integer constants")
                        }
                    }
                }
                let [lo, hi, step] = c;
                if step <= 0 || hi <= lo {
                    return err(
                        value.pos,
                        "lhist(x, lo, hi, step) needs lo < hi and step > 0",
                    );
                }
                if (hi - lo) / step > 1000 {
                    return err(
                        value.pos,
                        "lhist has more than 1000 buckets: use a larger step",
                    );
                }
                return Ok((MapKind::Lhist { lo, hi, step }, true));
            }
            _ => {
                return self
                    .call_elsewhere(f, value.pos)
                    .map(|_| (MapKind::Value, false))
            }
        };
        arity(1)?;
        let t = self.int(&args[0], at, vars)?;
        Ok((kind, t == Ty::Int { signed: true } || kind == MapKind::Hist))
    }

    fn call_elsewhere(&self, f: &str, pos: Pos) -> Result<Ty, Spanned> {
        match f {
            "count" | "sum" | "min" | "max" | "avg" | "hist" | "lhist" => err(
                pos,
                format!("{f}() is an aggregation: it can only be a map's whole value (@m[k] = {f}(...))"),
            ),
            "str" => err(
                pos,
                "str() gives a string: it can only be a map key or compared with a string literal",
            ),
            "delete" | "clear" | "exit" | "print" => err(
                pos,
                format!("{f}() is a statement of its own, not a value"),
            ),
            "kstack" | "ustack" => {
                err(pos, format!("{f}() is not supported yet"))
            }
            _ => err(pos, format!("unknown function '{f}'")),
        }
    }

    /// An expression that must be an integer.
    fn int(
        &mut self,
        e: &Expr,
        at: At,
        vars: &HashMap<String, (usize, Ty)>,
    ) -> Result<Ty, Spanned> {
        let t = self.expr(e, at, vars)?;
        if let Ty::Bytes(_) = t {
            return err(
                e.pos,
                "comm and str() can only be map keys or compared with a string literal (== or !=)",
            );
        }
        if t == Ty::Str {
            return err(
                e.pos,
                "a string can only be a map key (or a printf argument in BEGIN/END)",
            );
        }
        Ok(t)
    }

    fn expr(
        &mut self,
        e: &Expr,
        at: At,
        vars: &HashMap<String, (usize, Ty)>,
    ) -> Result<Ty, Spanned> {
        match &e.kind {
            ExprKind::Int(_) | ExprKind::Str(_) => {}
            ExprKind::Builtin(Builtin::Retval) if !at.ret => {
                return err(e.pos, "retval is only known at a :return probe")
            }
            ExprKind::Builtin(_) => {}
            ExprKind::Reg(r) => {
                if reg_offset(r).is_none() {
                    return err(e.pos, format!("unknown register '{r}'"));
                }
            }
            ExprKind::Var(v) => {
                if !vars.contains_key(v) {
                    return err(
                        e.pos,
                        format!("variable '${v}' is used before it is assigned"),
                    );
                }
            }
            ExprKind::Map(m, keys) => {
                let mut tys = Vec::new();
                for k in keys {
                    tys.push(self.expr(k, at, vars)?);
                }
                self.uses.push(Use {
                    name: m.clone(),
                    keys: Some(tys),
                    pos: e.pos,
                    what: Used::Read,
                });
            }
            ExprKind::Call(f, args) if f == "str" => {
                if args.len() != 2 {
                    return err(
                        e.pos,
                        format!("str() takes 2 arguments (str(p, n)), {} given", args.len()),
                    );
                }
                self.int(&args[0], at, vars)?;
                match args[1].kind {
                    ExprKind::Int(n) if (1..=MAX_STR).contains(&n) => {}
                    _ => {
                        return err(
                            args[1].pos,
                            format!("str(p, n): n must be an integer constant from 1 to {MAX_STR}"),
                        )
                    }
                }
            }
            ExprKind::Call(f, _) => return self.call_elsewhere(f, e.pos),
            ExprKind::Binary(BinOp::Eq | BinOp::Ne, a, b)
                if [a, b]
                    .iter()
                    .any(|x| matches!(ty_of(x, vars), Ty::Bytes(_))) =>
            {
                let (bytes, lit) = match (&a.kind, &b.kind) {
                    (_, ExprKind::Str(s)) => (a, s),
                    (ExprKind::Str(s), _) => (b, s),
                    _ => {
                        return err(
                            e.pos,
                            "comm and str() can only be compared with a string literal",
                        )
                    }
                };
                let Ty::Bytes(n) = self.expr(bytes, at, vars)? else {
                    return err(bytes.pos, "comm or str() is compared with a string literal");
                };
                let most = match bytes.kind {
                    ExprKind::Builtin(Builtin::Comm) => 15,
                    ExprKind::Call(_, ref args) => match args[1].kind {
                        ExprKind::Int(k) => usize::try_from(k).unwrap_or(n),
                        _ => n,
                    },
                    _ => n,
                };
                if lit.len() > most || lit.contains('\0') {
                    return err(
                        e.pos,
                        format!("the literal \"{lit}\" can never match: it has {} bytes, the string at most {most} (and no NUL)", lit.len()),
                    );
                }
            }
            ExprKind::Unary(_, a) | ExprKind::Cast(_, a) | ExprKind::Deref(_, a) => {
                self.int(a, at, vars)?;
            }
            ExprKind::Binary(_, a, b) => {
                self.int(a, at, vars)?;
                self.int(b, at, vars)?;
            }
        }
        Ok(ty_of(e, vars))
    }
}
