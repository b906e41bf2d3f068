//! Kernel symbols from `/proc/kallsyms`, as owned [`Symbol`]s.
//!
//! A line is `ADDRESS TYPE NAME` with an optional `\t[MODULE]`. The type is `nm`'s letter:
//! `t`/`T` (and `w`/`W`, weak text such as `memcpy`) are functions; `d`/`D`, `b`/`B`, `r`/`R`
//! are objects; the rest (absolute, per-CPU offsets, …) is kept as [`SymbolKind::Other`].
//! kallsyms has no sizes: every size is 0 and the [`SymbolTable`](crate::SymbolTable) bounds a
//! function by the next one. A module's symbols carry its name as origin. Without
//! `CAP_SYSLOG` (or with `kptr_restrict`) the kernel prints every address as 0; that is an error
//! here, not an empty table.

use thiserror::Error;

use crate::target::{Symbol, SymbolKind};

/// What is wrong with a kallsyms text.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KallsymsError {
    #[error("line {line} of kallsyms is malformed: {text:?}")]
    Malformed { line: usize, text: String },
    #[error("every kallsyms address is 0: run as root (kernel.kptr_restrict hides addresses from others)")]
    AddressesHidden,
}

/// The kind of a symbol from its `nm` type letter.
pub fn kind_of(type_letter: char) -> SymbolKind {
    match type_letter {
        't' | 'T' | 'w' | 'W' => SymbolKind::Function,
        'd' | 'D' | 'b' | 'B' | 'r' | 'R' => SymbolKind::Object,
        _ => SymbolKind::Other,
    }
}

/// Parse the text of `/proc/kallsyms`; symbols come back in file order (kernel image first).
pub fn parse(text: &str) -> Result<Vec<Symbol>, KallsymsError> {
    let mut out = Vec::with_capacity(text.len() / 40);
    let mut any_address = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let malformed = || KallsymsError::Malformed { line: i + 1, text: line.to_string() };
        let (main, module) = match line.split_once('\t') {
            Some((main, rest)) => {
                let m = rest.trim().strip_prefix('[').and_then(|r| r.strip_suffix(']')).ok_or_else(malformed)?;
                (main, Some(m.to_string()))
            }
            None => (line, None),
        };
        let mut fields = main.split_ascii_whitespace();
        let (Some(addr), Some(ty), Some(name), None) = (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(malformed());
        };
        let addr = u64::from_str_radix(addr, 16).map_err(|_| malformed())?;
        let mut letters = ty.chars();
        let (Some(letter), None) = (letters.next(), letters.next()) else {
            return Err(malformed());
        };
        any_address |= addr != 0;
        out.push(Symbol { name: name.to_string(), addr, size: 0, kind: kind_of(letter), origin: module });
    }
    if !out.is_empty() && !any_address {
        return Err(KallsymsError::AddressesHidden);
    }
    log::debug!("kallsyms: {} symbols", out.len());
    Ok(out)
}
