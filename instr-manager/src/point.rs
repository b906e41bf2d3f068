//! Points: the text a user writes (`sym`, `sym+0x10`, `sym+16`, `0xffffffff81000000`), parsed
//! into a [`PointSpec`] and resolved against a [`SymbolTable`] into the containing function and
//! the site address.
//!
//! With [`TargetInfo::has_fentry`], a point at a function's entry whose first instruction is the
//! ftrace site (a 5-byte `call __fentry__`, or the 5-byte NOP ftrace turns it into) moves to
//! entry+5: the kernel rewrites those bytes by itself, so they are never spliced.

use std::fmt;
use std::str::FromStr;

use trapvec::{Symbol, SymbolKind, SymbolTable, TargetInfo};

use crate::error::PlanError;

/// Length of the ftrace `__fentry__` site at a function's entry.
pub const FENTRY_LEN: u64 = 5;

/// The 5-byte NOP ftrace writes over `call __fentry__` (`nop dword [rax+rax*1+0x0]`).
pub const NOP5: [u8; 5] = [0x0F, 0x1F, 0x44, 0x00, 0x00];

/// Whether `bytes` (at least 5, from a function's entry) start with an ftrace site: a 5-byte
/// `call rel32` or the 5-byte NOP.
pub fn is_fentry_site(bytes: &[u8]) -> bool {
    bytes.len() >= 5 && (bytes[0] == 0xE8 || bytes[..5] == NOP5)
}

/// A point as written by the user.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PointSpec {
    /// `name` or `name+offset` (offset in decimal or `0x` hex).
    Symbol { name: String, offset: u64 },
    /// `0xADDRESS`.
    Address(u64),
}

impl fmt::Display for PointSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointSpec::Symbol { name, offset: 0 } => write!(f, "{name}"),
            PointSpec::Symbol { name, offset } => write!(f, "{name}+{offset:#x}"),
            PointSpec::Address(a) => write!(f, "{a:#x}"),
        }
    }
}

fn parse_number(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse().ok()
    } else {
        None
    }
}

impl FromStr for PointSpec {
    type Err = PlanError;

    fn from_str(text: &str) -> Result<Self, PlanError> {
        let bad = |reason: &str| PlanError::BadPointSpec { text: text.to_string(), reason: reason.to_string() };
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        let (name, offset) = match t.split_once('+') {
            Some((n, o)) => {
                let off = parse_number(o.trim()).ok_or_else(|| bad(&format!("offset `{}` is not a number", o.trim())))?;
                (n.trim(), Some(off))
            }
            None => (t, None),
        };
        if name.is_empty() {
            return Err(bad("no symbol before `+`"));
        }
        if name.starts_with("0x") || name.starts_with("0X") {
            if offset.is_some() {
                return Err(bad("an address takes no offset"));
            }
            return parse_number(name).map(PointSpec::Address).ok_or_else(|| bad(&format!("`{name}` is not a hex address")));
        }
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(bad("addresses are written in hex with `0x`"));
        }
        if let Some(c) = name.chars().find(|c| c.is_whitespace() || matches!(c, '-' | '*' | '[' | ']' | ',' | ';')) {
            return Err(bad(&format!("`{c}` cannot appear in a symbol name")));
        }
        Ok(PointSpec::Symbol { name: name.to_string(), offset: offset.unwrap_or(0) })
    }
}

/// A point resolved to its function and site.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResolvedPoint {
    /// The point in canonical form (`sym`, `sym+0x10`, `0xADDR`), for messages; the text as
    /// the user wrote it stays with the caller (e.g. [`crate::SpliceSpec::at`]).
    pub spec_text: String,
    /// The containing function, with `size` set to its extent.
    pub function: Symbol,
    /// The address that will be spliced.
    pub site: u64,
}

/// Resolve `spec`. `fentry_check(entry)` says whether the function starting at `entry` begins
/// with an ftrace site (typically [`is_fentry_site`] over the target's bytes); it is consulted only
/// with `info.has_fentry` and for a point at a function's entry.
pub fn resolve_point(
    spec: &PointSpec,
    symbols: &SymbolTable,
    info: &TargetInfo,
    fentry_check: impl Fn(u64) -> bool,
) -> Result<ResolvedPoint, PlanError> {
    let text = spec.to_string();
    let (function, mut site) = match spec {
        PointSpec::Symbol { name, offset } => {
            let sym = symbols.lookup(name).ok_or_else(|| PlanError::UnknownSymbol { text: text.clone(), name: name.clone() })?;
            if sym.kind != SymbolKind::Function {
                return Err(PlanError::NotAFunction { text, name: name.clone(), addr: sym.addr });
            }
            let size = symbols.function_extent(sym);
            if size == 0 {
                return Err(PlanError::UnknownExtent { text, name: name.clone(), addr: sym.addr });
            }
            if *offset >= size {
                return Err(PlanError::OffsetPastEnd { text, name: name.clone(), offset: *offset, size });
            }
            (Symbol { size, ..sym.clone() }, sym.addr + offset)
        }
        PointSpec::Address(addr) => {
            let sym = symbols.function_containing(*addr).ok_or(PlanError::NoFunctionAt { text: text.clone(), addr: *addr })?;
            let size = symbols.function_extent(&sym);
            (Symbol { size, ..sym }, *addr)
        }
    };
    if info.has_fentry && site == function.addr && function.size > FENTRY_LEN && fentry_check(site) {
        log::debug!("point `{text}`: moved past the ftrace site of `{}` to {:#x}", function.name, site + FENTRY_LEN);
        site += FENTRY_LEN;
    }
    log::debug!("point `{text}` resolved to {site:#x} in `{}` [{:#x}, {:#x})", function.name, function.addr, function.addr + function.size);
    Ok(ResolvedPoint { spec_text: text, function, site })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(has_fentry: bool) -> TargetInfo {
        TargetInfo {
            description: "test".into(),
            red_zone: if has_fentry { 0 } else { 128 },
            save_vector_regs: !has_fentry,
            dispatcher_runs_handlers: false,
            dispatcher_counts_hits: false,
            has_fentry,
        }
    }

    fn func(name: &str, addr: u64, size: u64) -> Symbol {
        Symbol { name: name.into(), addr, size, kind: SymbolKind::Function, origin: None }
    }

    fn table() -> SymbolTable {
        SymbolTable::new(vec![
            func("compute", 0x1000, 0x40),
            func("tcp_sync_mss", 0x2000, 0), // kallsyms style: extent up to the next function
            func("next", 0x2100, 0x10),
            Symbol { name: "counter".into(), addr: 0x3000, size: 8, kind: SymbolKind::Object, origin: None },
        ])
    }

    #[test]
    fn parses_symbol_offset_and_address_forms() {
        assert_eq!("compute".parse::<PointSpec>().unwrap(), PointSpec::Symbol { name: "compute".into(), offset: 0 });
        assert_eq!("compute+0x10".parse::<PointSpec>().unwrap(), PointSpec::Symbol { name: "compute".into(), offset: 16 });
        assert_eq!("compute+16".parse::<PointSpec>().unwrap(), PointSpec::Symbol { name: "compute".into(), offset: 16 });
        assert_eq!("foo.isra.0+4".parse::<PointSpec>().unwrap(), PointSpec::Symbol { name: "foo.isra.0".into(), offset: 4 });
        assert_eq!("0xffffffff81000000".parse::<PointSpec>().unwrap(), PointSpec::Address(0xffff_ffff_8100_0000));
        assert_eq!(PointSpec::Symbol { name: "f".into(), offset: 16 }.to_string(), "f+0x10");
    }

    #[test]
    fn parse_errors_name_the_text() {
        for bad in ["", "+4", "f+x", "f+", "0xzz", "0x10+4", "1234", "a b"] {
            let err = bad.parse::<PointSpec>().unwrap_err();
            assert!(matches!(&err, PlanError::BadPointSpec { text, .. } if text == bad), "{bad}: {err:?}");
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn resolves_symbol_offset_to_site_with_extent() {
        let p = resolve_point(&"compute+0x10".parse().unwrap(), &table(), &info(false), |_| true).unwrap();
        assert_eq!(p.site, 0x1010);
        assert_eq!((p.function.name.as_str(), p.function.size), ("compute", 0x40));
        // kallsyms-style symbol: extent filled from the next function.
        let p = resolve_point(&"tcp_sync_mss+4".parse().unwrap(), &table(), &info(false), |_| true).unwrap();
        assert_eq!(p.function.size, 0x100);
    }

    #[test]
    fn resolves_an_address_to_its_containing_function() {
        let p = resolve_point(&PointSpec::Address(0x2104), &table(), &info(false), |_| true).unwrap();
        assert_eq!((p.function.name.as_str(), p.site, p.function.size), ("next", 0x2104, 0x10));
        let err = resolve_point(&PointSpec::Address(0x5000), &table(), &info(false), |_| true).unwrap_err();
        assert!(matches!(err, PlanError::NoFunctionAt { addr: 0x5000, .. }));
    }

    #[test]
    fn entry_point_moves_past_fentry_only_with_has_fentry_and_a_fentry_site() {
        let spec: PointSpec = "tcp_sync_mss".parse().unwrap();
        let p = resolve_point(&spec, &table(), &info(true), |a| a == 0x2000).unwrap();
        assert_eq!(p.site, 0x2005);
        let p = resolve_point(&spec, &table(), &info(true), |_| false).unwrap();
        assert_eq!(p.site, 0x2000, "no fentry call at the entry: stays");
        let p = resolve_point(&spec, &table(), &info(false), |_| true).unwrap();
        assert_eq!(p.site, 0x2000, "user space has no fentry");
        let p = resolve_point(&"tcp_sync_mss+1".parse().unwrap(), &table(), &info(true), |_| true).unwrap();
        assert_eq!(p.site, 0x2001, "only offset 0 moves");
    }

    #[test]
    fn resolution_errors_name_symbol_and_offset() {
        let t = table();
        let i = info(false);
        assert!(matches!(resolve_point(&"nosuch".parse().unwrap(), &t, &i, |_| false), Err(PlanError::UnknownSymbol { .. })));
        assert!(matches!(resolve_point(&"counter".parse().unwrap(), &t, &i, |_| false), Err(PlanError::NotAFunction { addr: 0x3000, .. })));
        let err = resolve_point(&"compute+0x40".parse().unwrap(), &t, &i, |_| false).unwrap_err();
        assert!(matches!(err, PlanError::OffsetPastEnd { offset: 0x40, size: 0x40, .. }));
        assert!(err.to_string().contains("compute"), "{err}");
        let lone = SymbolTable::new(vec![func("last", 0x9000, 0)]);
        assert!(matches!(resolve_point(&"last".parse().unwrap(), &lone, &i, |_| false), Err(PlanError::UnknownExtent { .. })));
    }

    #[test]
    fn fentry_site_detection_accepts_call_and_nop5_only() {
        assert!(is_fentry_site(&[0xE8, 0, 0, 0, 0, 0x55]));
        assert!(is_fentry_site(&NOP5));
        assert!(!is_fentry_site(&[0x55, 0x48, 0x89, 0xE5, 0x90]));
        assert!(!is_fentry_site(&[0xE8, 0]));
    }
}
