//! The program as parsed.

use crate::error::Pos;

/// An integer type of a cast or a memory read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntTy {
    /// 1, 2, 4 or 8.
    pub bytes: u8,
    pub signed: bool,
}

impl IntTy {
    /// `u8`..`u64`, `s8`..`s64` (also `i8`..`i64`).
    pub fn from_name(name: &str) -> Option<IntTy> {
        let (signed, bits) = match name.as_bytes().first()? {
            b'u' => (false, &name[1..]),
            b's' | b'i' => (true, &name[1..]),
            _ => return None,
        };
        let bytes = match bits {
            "8" => 1,
            "16" => 2,
            "32" => 4,
            "64" => 8,
            _ => return None,
        };
        Some(IntTy { bytes, signed })
    }
}

/// Where a probe fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeSpec {
    Begin,
    End,
    /// `interval:s:N`, `interval:ms:N`: run by the tracer every `ms` milliseconds.
    Interval {
        ms: u64,
    },
    /// `FUNC`, `FUNC+OFF`, `FUNC:return`, `lib:sym`, a glob.
    Func {
        /// `lib` of `lib:sym`.
        object: Option<String>,
        /// The function (or a glob over function names).
        name: String,
        offset: u64,
        ret: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub specs: Vec<(ProbeSpec, Pos)>,
    pub predicate: Option<Expr>,
    pub body: Vec<Stmt>,
    pub pos: Pos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    LogAnd,
    LogOr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
    BitNot,
}

/// A builtin without arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Pid,
    Tid,
    /// The thread's name (16 bytes, NUL-padded).
    Comm,
    Cpu,
    Nsecs,
    Retval,
    Func,
    Probe,
    /// `arg0`..`arg5`.
    Arg(u8),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprKind {
    Int(u64),
    Str(String),
    Builtin(Builtin),
    /// `reg("rax")`: the index of the register in `trapvec_regs`.
    Reg(String),
    Var(String),
    /// `@name[keys]` read (a plain value map).
    Map(String, Vec<Expr>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `(u32)e`
    Cast(IntTy, Box<Expr>),
    /// `*(u32 *)(e)`
    Deref(IntTy, Box<Expr>),
    /// `name(args)`: an aggregation or another function, judged by the checker.
    Call(String, Vec<Expr>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    pub kind: ExprKind,
    pub pos: Pos,
}

/// What an assignment changes at the point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Retval,
    Arg(u8),
    Reg(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    /// `@name[keys] = value`
    MapAssign {
        name: String,
        keys: Vec<Expr>,
        value: Expr,
        pos: Pos,
    },
    /// `$name = value`
    VarAssign { name: String, value: Expr, pos: Pos },
    /// `retval = e`, `argN = e`, `reg("r") = e`
    Change {
        target: Target,
        value: Expr,
        pos: Pos,
    },
    /// `return EXPR` at a function's entry: the function is skipped and returns EXPR.
    Return { value: Expr, pos: Pos },
    /// `printf("fmt", args)`
    Printf {
        format: String,
        args: Vec<Expr>,
        pos: Pos,
    },
    /// `exit()`: end the trace as Ctrl-C does.
    Exit { pos: Pos },
    /// `delete(@name[keys])`: remove one entry.
    Delete {
        name: String,
        keys: Vec<Expr>,
        pos: Pos,
    },
    /// `clear(@name)`: remove every entry.
    Clear { name: String, pos: Pos },
    /// `print(@name)`: print the map now (an interval probe).
    Print { name: String, pos: Pos },
    /// `if (cond) { then } else { els }` (`else if` is an `If` alone in `els`).
    If {
        cond: Expr,
        then: Vec<Stmt>,
        els: Vec<Stmt>,
        pos: Pos,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Program {
    pub probes: Vec<Probe>,
}
