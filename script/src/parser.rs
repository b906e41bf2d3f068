//! A hand-written lexer and recursive-descent parser.
//!
//! ```text
//! program   := probe*
//! probe     := spec (',' spec)* ('/' expr '/')? '{' (stmt (';' stmt)* ';'?)? '}'
//! spec      := 'BEGIN' | 'END' | 'interval:s:' N | 'interval:ms:' N
//!            | [object ':'] name ['+' offset] [':return']
//! stmt      := '@' name ['[' expr (',' expr)* ']'] '=' expr
//!            | '$' name '=' expr
//!            | ('retval' | 'argN' | 'reg' '(' string ')') '=' expr
//!            | 'printf' '(' string (',' expr)* ')' | 'exit' '(' ')'
//!            | 'delete' '(' map ')' | 'clear' '(' '@' name ')' | 'print' '(' '@' name ')'
//! expr      := or ; or := and ('||' and)* ; and := bitor ('&&' bitor)* ; bitor := xor ('|' xor)*
//! xor       := bitand ('^' bitand)* ; bitand := eq ('&' eq)* ; eq := rel (('=='|'!=') rel)*
//! rel       := shift (('<'|'<='|'>'|'>=') shift)* ; shift := add (('<<'|'>>') add)*
//! add       := mul (('+'|'-') mul)* ; mul := unary (('*'|'/'|'%') unary)*
//! unary     := ('-'|'!'|'~') unary | '*' '(' type '*' ')' unary | '(' type ')' unary | primary
//! primary   := integer | string | builtin | '$' name | '@' name ['[' keys ']']
//!            | name '(' args ')' | '(' expr ')'
//! ```
//! Inside a predicate `/.../` a division must be in parentheses (the `/` ends the predicate).

use crate::ast::*;
use crate::error::{err, Pos, Spanned};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Int(u64),
    Str(String),
    Ident(String),
    /// `@name` (the name may be empty: `@`).
    Map(String),
    /// `$name`
    Var(String),
    Punct(&'static str),
    Eof,
}

const PUNCTS: [&str; 32] = [
    "&&", "||", "==", "!=", "<=", ">=", "<<", ">>", "+", "-", "*", "/", "%", "&", "|", "^", "!",
    "~", "<", ">", "=", "(", ")", "{", "}", "[", "]", ",", ";", ":", ".", "?",
];

/// Parse a program's text.
pub(crate) fn parse(src: &str) -> Result<Program, Spanned> {
    let mut p = Parser {
        chars: src.chars().collect(),
        i: 0,
        line: 1,
        col: 1,
        peeked: None,
        in_predicate: false,
    };
    let mut probes = Vec::new();
    loop {
        p.skip_space()?;
        if p.i >= p.chars.len() {
            break;
        }
        probes.push(p.probe()?);
    }
    if probes.is_empty() {
        return err(Pos { line: 1, col: 1 }, "the program has no probe");
    }
    Ok(Program { probes })
}

struct Parser {
    chars: Vec<char>,
    i: usize,
    line: u32,
    col: u32,
    peeked: Option<(Tok, Pos)>,
    in_predicate: bool,
}

impl Parser {
    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            col: self.col,
        }
    }

    fn cur(&self) -> Option<char> {
        self.chars.get(self.i).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.cur()?;
        self.i += 1;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    /// Whitespace and comments (`//` to the end of the line, `/* */`).
    fn skip_space(&mut self) -> Result<(), Spanned> {
        loop {
            match self.cur() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('/') if self.chars.get(self.i + 1) == Some(&'/') => {
                    while self.cur().is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                Some('/') if self.chars.get(self.i + 1) == Some(&'*') => {
                    let start = self.pos();
                    self.bump();
                    self.bump();
                    loop {
                        match self.cur() {
                            None => return err(start, "unterminated comment"),
                            Some('*') if self.chars.get(self.i + 1) == Some(&'/') => {
                                self.bump();
                                self.bump();
                                break;
                            }
                            _ => {
                                self.bump();
                            }
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn lex(&mut self) -> Result<(Tok, Pos), Spanned> {
        self.skip_space()?;
        let pos = self.pos();
        let Some(c) = self.cur() else {
            return Ok((Tok::Eof, pos));
        };
        let ident = |p: &mut Parser| {
            let mut s = String::new();
            while let Some(c) = p.cur().filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
                s.push(c);
                p.bump();
            }
            s
        };
        if c.is_ascii_alphabetic() || c == '_' {
            return Ok((Tok::Ident(ident(self)), pos));
        }
        if c == '@' || c == '$' {
            self.bump();
            let name = ident(self);
            if c == '$' {
                if name.is_empty() {
                    return err(pos, "`$` must be followed by a variable name");
                }
                return Ok((Tok::Var(name), pos));
            }
            return Ok((Tok::Map(name), pos));
        }
        if c.is_ascii_digit() {
            let mut s = String::new();
            while let Some(c) = self
                .cur()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                s.push(c);
                self.bump();
            }
            let t = s.replace('_', "");
            let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                u64::from_str_radix(h, 16)
            } else {
                t.parse::<u64>()
            };
            return match v {
                Ok(v) => Ok((Tok::Int(v), pos)),
                Err(_) => err(pos, format!("bad integer '{s}' (or larger than 64 bits)")),
            };
        }
        if c == '"' {
            self.bump();
            let mut s = String::new();
            loop {
                match self.bump() {
                    None | Some('\n') => return err(pos, "unterminated string"),
                    Some('"') => break,
                    Some('\\') => match self.bump() {
                        Some('n') => s.push('\n'),
                        Some('t') => s.push('\t'),
                        Some('\\') => s.push('\\'),
                        Some('"') => s.push('"'),
                        Some(o) => {
                            return err(self.pos(), format!("unknown escape '\\{o}' in a string"))
                        }
                        None => return err(pos, "unterminated string"),
                    },
                    Some(o) => s.push(o),
                }
            }
            return Ok((Tok::Str(s), pos));
        }
        for p in PUNCTS {
            if p.chars()
                .enumerate()
                .all(|(k, pc)| self.chars.get(self.i + k) == Some(&pc))
            {
                for _ in 0..p.len() {
                    self.bump();
                }
                return Ok((Tok::Punct(p), pos));
            }
        }
        err(pos, format!("unexpected character '{c}'"))
    }

    fn peek(&mut self) -> Result<&(Tok, Pos), Spanned> {
        if self.peeked.is_none() {
            let t = self.lex()?;
            self.peeked = Some(t);
        }
        Ok(self.peeked.as_ref().expect("just set"))
    }

    fn next(&mut self) -> Result<(Tok, Pos), Spanned> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex(),
        }
    }

    fn is_punct(&mut self, p: &str) -> Result<bool, Spanned> {
        Ok(matches!(&self.peek()?.0, Tok::Punct(q) if *q == p))
    }

    fn eat(&mut self, p: &str) -> Result<bool, Spanned> {
        if self.is_punct(p)? {
            self.next()?;
            return Ok(true);
        }
        Ok(false)
    }

    fn expect(&mut self, p: &str) -> Result<Pos, Spanned> {
        let (t, pos) = self.next()?;
        match t {
            Tok::Punct(q) if q == p => Ok(pos),
            other => err(pos, format!("expected '{p}', found {}", describe(&other))),
        }
    }

    /// A probe's header, read as raw text up to whitespace, `,`, `/` or `{`.
    fn spec(&mut self) -> Result<(ProbeSpec, Pos), Spanned> {
        self.skip_space()?;
        let pos = self.pos();
        let mut raw = String::new();
        while let Some(c) = self
            .cur()
            .filter(|c| !c.is_whitespace() && !matches!(c, ',' | '/' | '{'))
        {
            raw.push(c);
            self.bump();
        }
        if raw.is_empty() {
            return err(
                pos,
                "expected a probe (FUNC, FUNC+OFF, FUNC:return, lib:sym, BEGIN or END)",
            );
        }
        match raw.as_str() {
            "BEGIN" => return Ok((ProbeSpec::Begin, pos)),
            "END" => return Ok((ProbeSpec::End, pos)),
            _ => {}
        }
        if let Some(rest) = raw.strip_prefix("interval:") {
            let (unit, n) = rest.split_once(':').unwrap_or((rest, ""));
            let scale = match unit {
                "s" => 1000,
                "ms" => 1,
                _ => {
                    return err(
                        pos,
                        format!("bad probe '{raw}': interval:s:N or interval:ms:N"),
                    )
                }
            };
            return match n.parse::<u64>() {
                Ok(n) if n > 0 && n <= 86_400_000 / scale => {
                    Ok((ProbeSpec::Interval { ms: n * scale }, pos))
                }
                _ => err(
                    pos,
                    format!("bad interval '{raw}': N must be an integer from 1 to a day"),
                ),
            };
        }
        let (rest, ret) = match raw.strip_suffix(":return") {
            Some(r) => (r, true),
            None => (raw.as_str(), false),
        };
        let (object, rest) = match rest.rsplit_once(':') {
            Some((o, r)) => (Some(o.to_string()), r),
            None => (None, rest),
        };
        let (name, offset) = match rest.split_once('+') {
            Some((n, off)) => {
                let v = match off.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => off.parse(),
                };
                match v {
                    Ok(v) => (n, v),
                    Err(_) => return err(pos, format!("bad offset '{off}' in probe '{raw}'")),
                }
            }
            None => (rest, 0),
        };
        let ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.*?[]!-".contains(c))
        };
        if !ok(name) || object.as_deref().is_some_and(|o| !ok(o)) {
            return err(pos, format!("bad probe '{raw}'"));
        }
        if ret && offset != 0 {
            return err(
                pos,
                format!("probe '{raw}': a return probe takes no offset"),
            );
        }
        Ok((
            ProbeSpec::Func {
                object,
                name: name.to_string(),
                offset,
                ret,
            },
            pos,
        ))
    }

    fn probe(&mut self) -> Result<Probe, Spanned> {
        let mut specs = vec![self.spec()?];
        self.skip_space()?;
        let pos = specs[0].1;
        while self.cur() == Some(',') {
            self.bump();
            specs.push(self.spec()?);
            self.skip_space()?;
        }
        let mut predicate = None;
        if self.cur() == Some('/') {
            self.bump();
            self.in_predicate = true;
            let e = self.expr()?;
            self.in_predicate = false;
            self.expect("/")?;
            predicate = Some(e);
        }
        let body = self.block()?;
        Ok(Probe {
            specs,
            predicate,
            body,
            pos,
        })
    }

    /// `{ stmt; stmt; ... }`: a `;` between statements, none needed after an `if`'s block.
    fn block(&mut self) -> Result<Vec<Stmt>, Spanned> {
        self.expect("{")?;
        let mut body = Vec::new();
        loop {
            if self.eat("}")? {
                break;
            }
            if self.eat(";")? {
                continue;
            }
            let s = self.stmt()?;
            let block_ended = matches!(s, Stmt::If { .. });
            body.push(s);
            if !block_ended && !self.is_punct("}")? {
                self.expect(";")?;
            }
        }
        Ok(body)
    }

    /// After `if`: `(cond) { ... }`, then `else { ... }` or `else if ...`.
    fn if_rest(&mut self, pos: Pos) -> Result<Stmt, Spanned> {
        self.expect("(")?;
        let cond = self.expr()?;
        self.expect(")")?;
        let then = self.block()?;
        let mut els = Vec::new();
        if matches!(&self.peek()?.0, Tok::Ident(e) if e == "else") {
            self.next()?;
            let (t, ipos) = self.peek()?.clone();
            if matches!(&t, Tok::Ident(i) if i == "if") {
                self.next()?;
                els.push(self.if_rest(ipos)?);
            } else {
                els = self.block()?;
            }
        }
        Ok(Stmt::If {
            cond,
            then,
            els,
            pos,
        })
    }

    fn stmt(&mut self) -> Result<Stmt, Spanned> {
        let (t, pos) = self.next()?;
        match t {
            Tok::Ident(name) if name == "if" && self.is_punct("(")? => self.if_rest(pos),
            Tok::Map(name) => {
                let keys = self.keys()?;
                self.expect("=")?;
                let value = self.expr()?;
                Ok(Stmt::MapAssign {
                    name,
                    keys,
                    value,
                    pos,
                })
            }
            Tok::Var(name) => {
                self.expect("=")?;
                let value = self.expr()?;
                Ok(Stmt::VarAssign { name, value, pos })
            }
            Tok::Ident(name) if name == "return" => {
                let value = self.expr()?;
                Ok(Stmt::Return { value, pos })
            }
            Tok::Ident(name) if name == "printf" => {
                self.expect("(")?;
                let (f, fpos) = self.next()?;
                let Tok::Str(format) = f else {
                    return err(fpos, "printf's first argument must be a format string");
                };
                let mut args = Vec::new();
                while self.eat(",")? {
                    args.push(self.expr()?);
                }
                self.expect(")")?;
                Ok(Stmt::Printf { format, args, pos })
            }
            Tok::Ident(name) if name == "exit" && self.is_punct("(")? => {
                self.expect("(")?;
                self.expect(")")?;
                Ok(Stmt::Exit { pos })
            }
            Tok::Ident(name)
                if matches!(name.as_str(), "delete" | "clear" | "print")
                    && self.is_punct("(")? =>
            {
                self.expect("(")?;
                let (m, mpos) = self.next()?;
                let Tok::Map(map) = m else {
                    return err(
                        mpos,
                        format!(
                            "{name}() takes a map: {name}(@name{})",
                            if name == "delete" { "[key]" } else { "" }
                        ),
                    );
                };
                let keys = self.keys()?;
                self.expect(")")?;
                if name != "delete" && !keys.is_empty() {
                    return err(
                        mpos,
                        format!("{name}() takes the whole map, without keys: {name}(@{map})"),
                    );
                }
                Ok(match name.as_str() {
                    "delete" => Stmt::Delete {
                        name: map,
                        keys,
                        pos,
                    },
                    "clear" => Stmt::Clear { name: map, pos },
                    _ => Stmt::Print { name: map, pos },
                })
            }
            Tok::Ident(name) => {
                let target = if name == "retval" {
                    Target::Retval
                } else if name == "reg" {
                    self.expect("(")?;
                    let (r, rpos) = self.next()?;
                    let Tok::Str(r) = r else {
                        return err(rpos, "reg() takes a register name in quotes: reg(\"rax\")");
                    };
                    self.expect(")")?;
                    Target::Reg(r)
                } else if let Some(n) = arg_index(&name) {
                    Target::Arg(n)
                } else {
                    return err(
                        pos,
                        format!("'{name}' cannot start a statement (a map, a $variable, printf, or a change of retval/argN/reg)"),
                    );
                };
                self.expect("=")?;
                let value = self.expr()?;
                Ok(Stmt::Change { target, value, pos })
            }
            other => err(
                pos,
                format!("expected a statement, found {}", describe(&other)),
            ),
        }
    }

    /// `[e, e]` after a map name, or nothing.
    fn keys(&mut self) -> Result<Vec<Expr>, Spanned> {
        let mut keys = Vec::new();
        if self.eat("[")? {
            keys.push(self.expr()?);
            while self.eat(",")? {
                keys.push(self.expr()?);
            }
            self.expect("]")?;
        }
        Ok(keys)
    }

    fn expr(&mut self) -> Result<Expr, Spanned> {
        self.binary(0)
    }

    fn binary(&mut self, level: usize) -> Result<Expr, Spanned> {
        const LEVELS: [&[(&str, BinOp)]; 10] = [
            &[("||", BinOp::LogOr)],
            &[("&&", BinOp::LogAnd)],
            &[("|", BinOp::Or)],
            &[("^", BinOp::Xor)],
            &[("&", BinOp::And)],
            &[("==", BinOp::Eq), ("!=", BinOp::Ne)],
            &[
                ("<=", BinOp::Le),
                (">=", BinOp::Ge),
                ("<", BinOp::Lt),
                (">", BinOp::Gt),
            ],
            &[("<<", BinOp::Shl), (">>", BinOp::Shr)],
            &[("+", BinOp::Add), ("-", BinOp::Sub)],
            &[("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Mod)],
        ];
        if level == LEVELS.len() {
            return self.unary();
        }
        let mut lhs = self.binary(level + 1)?;
        'outer: loop {
            for (p, op) in LEVELS[level] {
                if *p == "/" && self.in_predicate {
                    continue;
                }
                if self.is_punct(p)? {
                    let (_, pos) = self.next()?;
                    let rhs = self.binary(level + 1)?;
                    lhs = Expr {
                        kind: ExprKind::Binary(*op, Box::new(lhs), Box::new(rhs)),
                        pos,
                    };
                    continue 'outer;
                }
            }
            return Ok(lhs);
        }
    }

    /// After `(`: a type name and `)` (a cast) or `*)` (a pointer cast), if one follows.
    fn cast_ahead(&mut self) -> Result<Option<(IntTy, bool)>, Spanned> {
        // Look at raw characters: `(u32)`, `(u32 *)`.
        let save = (self.i, self.line, self.col);
        let mut j = self.i;
        let skip = |j: &mut usize, chars: &[char]| {
            while chars.get(*j).is_some_and(|c| c.is_whitespace()) {
                *j += 1;
            }
        };
        skip(&mut j, &self.chars);
        let start = j;
        while self.chars.get(j).is_some_and(|c| c.is_ascii_alphanumeric()) {
            j += 1;
        }
        let name: String = self.chars[start..j].iter().collect();
        let Some(ty) = IntTy::from_name(&name) else {
            return Ok(None);
        };
        skip(&mut j, &self.chars);
        let ptr = self.chars.get(j) == Some(&'*');
        if ptr {
            j += 1;
            skip(&mut j, &self.chars);
        }
        if self.chars.get(j) != Some(&')') {
            return Ok(None);
        }
        j += 1;
        while self.i < j {
            self.bump();
        }
        let _ = save;
        Ok(Some((ty, ptr)))
    }

    fn unary(&mut self) -> Result<Expr, Spanned> {
        let (t, pos) = self.peek()?.clone();
        let op = match t {
            Tok::Punct("-") => Some(UnOp::Neg),
            Tok::Punct("!") => Some(UnOp::Not),
            Tok::Punct("~") => Some(UnOp::BitNot),
            _ => None,
        };
        if let Some(op) = op {
            self.next()?;
            let e = self.unary()?;
            return Ok(Expr {
                kind: ExprKind::Unary(op, Box::new(e)),
                pos,
            });
        }
        if t == Tok::Punct("*") {
            self.next()?;
            // `*(T *)(e)`: the pointer cast says how much to read.
            let (t2, p2) = self.next()?;
            if t2 != Tok::Punct("(") {
                return err(
                    p2,
                    "a memory read is written *(TYPE *)(ADDRESS), e.g. *(u32 *)(arg0 + 8)",
                );
            }
            match self.cast_ahead()? {
                Some((ty, true)) => {
                    let e = self.unary()?;
                    return Ok(Expr {
                        kind: ExprKind::Deref(ty, Box::new(e)),
                        pos,
                    });
                }
                _ => {
                    return err(
                        p2,
                        "a memory read needs a pointer type: *(u8|u16|u32|u64|s8..s64 *)(ADDRESS)",
                    )
                }
            }
        }
        if t == Tok::Punct("(") {
            self.next()?;
            if let Some((ty, ptr)) = self.cast_ahead()? {
                if ptr {
                    return err(pos, "a pointer cast must be read through: *(T *)(ADDRESS)");
                }
                let e = self.unary()?;
                return Ok(Expr {
                    kind: ExprKind::Cast(ty, Box::new(e)),
                    pos,
                });
            }
            let saved = self.in_predicate;
            self.in_predicate = false;
            let e = self.expr()?;
            self.in_predicate = saved;
            self.expect(")")?;
            return Ok(e);
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, Spanned> {
        let (t, pos) = self.next()?;
        let kind = match t {
            Tok::Int(v) => ExprKind::Int(v),
            Tok::Str(s) => ExprKind::Str(s),
            Tok::Var(v) => ExprKind::Var(v),
            Tok::Map(m) => {
                let keys = self.keys()?;
                ExprKind::Map(m, keys)
            }
            Tok::Ident(name) => {
                if self.is_punct("(")? {
                    self.next()?;
                    let mut args = Vec::new();
                    if !self.is_punct(")")? {
                        args.push(self.expr()?);
                        while self.eat(",")? {
                            args.push(self.expr()?);
                        }
                    }
                    self.expect(")")?;
                    if name == "reg" {
                        match args.as_slice() {
                            [Expr {
                                kind: ExprKind::Str(r),
                                ..
                            }] => ExprKind::Reg(r.clone()),
                            _ => {
                                return err(
                                    pos,
                                    "reg() takes a register name in quotes: reg(\"rax\")",
                                )
                            }
                        }
                    } else {
                        ExprKind::Call(name, args)
                    }
                } else {
                    match builtin(&name) {
                        Some(b) => ExprKind::Builtin(b),
                        None => return err(pos, format!("unknown builtin '{name}'")),
                    }
                }
            }
            other => {
                return err(
                    pos,
                    format!("expected an expression, found {}", describe(&other)),
                )
            }
        };
        Ok(Expr { kind, pos })
    }
}

fn arg_index(name: &str) -> Option<u8> {
    let n = name.strip_prefix("arg")?;
    match n {
        "0" | "1" | "2" | "3" | "4" | "5" => n.parse().ok(),
        _ => None,
    }
}

fn builtin(name: &str) -> Option<Builtin> {
    Some(match name {
        "pid" => Builtin::Pid,
        "tid" => Builtin::Tid,
        "comm" => Builtin::Comm,
        "cpu" => Builtin::Cpu,
        "nsecs" => Builtin::Nsecs,
        "retval" => Builtin::Retval,
        "func" => Builtin::Func,
        "probe" => Builtin::Probe,
        _ => Builtin::Arg(arg_index(name)?),
    })
}

fn describe(t: &Tok) -> String {
    match t {
        Tok::Int(v) => format!("integer {v}"),
        Tok::Str(s) => format!("string \"{s}\""),
        Tok::Ident(s) => format!("'{s}'"),
        Tok::Map(m) => format!("map '@{m}'"),
        Tok::Var(v) => format!("variable '${v}'"),
        Tok::Punct(p) => format!("'{p}'"),
        Tok::Eof => "the end of the program".into(),
    }
}
