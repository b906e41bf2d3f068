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
///
/// Every trapctl command parses ~90,000 lines, so the kernel's layout is read at fixed
/// offsets; lines spaced otherwise are still understood, on a slower path.
pub fn parse(text: &str) -> Result<Vec<Symbol>, KallsymsError> {
    // A distribution kernel's lines are about 42 bytes long.
    let mut out = Vec::with_capacity(text.len() / 40);
    let mut any_address = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_ascii().is_empty() {
            continue;
        }
        let Some(Line {
            addr,
            letter,
            name,
            module,
        }) = Line::split(line)
        else {
            return Err(KallsymsError::Malformed {
                line: i + 1,
                text: line.to_string(),
            });
        };
        any_address |= addr != 0;
        out.push(Symbol {
            name: name.to_string(),
            addr,
            size: 0,
            kind: kind_of(letter),
            origin: module.map(str::to_string),
            version: None,
        });
    }
    if !out.is_empty() && !any_address {
        return Err(KallsymsError::AddressesHidden);
    }
    log::debug!("kallsyms: {} symbols", out.len());
    Ok(out)
}

/// One line of kallsyms, taken apart.
#[derive(Debug, PartialEq, Eq)]
struct Line<'a> {
    addr: u64,
    letter: char,
    name: &'a str,
    module: Option<&'a str>,
}

impl<'a> Line<'a> {
    /// `ADDRESS TYPE NAME` with an optional `\t[MODULE]`; `None` for any other shape (a field
    /// missing or extra, an address that is not hex, a type of more than one letter, a module
    /// not in brackets).
    fn split(line: &'a str) -> Option<Self> {
        Self::split_canonical(line).or_else(|| Self::split_spaced(line))
    }

    /// The kernel's own layout, `%016lx %c %s`: the fields are at fixed places, so only the
    /// name is searched (for its end). This is the path every line of `/proc/kallsyms` takes.
    fn split_canonical(line: &'a str) -> Option<Self> {
        let bytes = line.as_bytes();
        if bytes.len() < 20
            || bytes[16] != b' '
            || bytes[17].is_ascii_whitespace()
            || bytes[18] != b' '
        {
            return None;
        }
        let addr = hex(&bytes[..16])?;
        let letter = char::from(bytes[17]);
        // Byte 18 is a space, so byte 19 starts a character.
        let (name, module) = split_module(line.get(19..)?)?;
        Some(Line {
            addr,
            letter,
            name: plain_name(name.trim_ascii_end())?,
            module,
        })
    }

    /// Any spacing: fields separated by one or more spaces, space around the line.
    fn split_spaced(line: &'a str) -> Option<Self> {
        let (main, module) = split_module(line)?;
        let (addr, rest) = main.trim_ascii().split_once(' ')?;
        let (letter, name) = rest.trim_ascii_start().split_once(' ')?;
        let mut letters = letter.chars();
        let (Some(letter), None) = (letters.next(), letters.next()) else {
            return None;
        };
        Some(Line {
            addr: hex(addr.as_bytes())?,
            letter,
            name: plain_name(name.trim_ascii_start())?,
            module,
        })
    }
}

/// `text` and the module named after its first tab (`\t[MODULE]`, space allowed around it).
fn split_module(text: &str) -> Option<(&str, Option<&str>)> {
    match text.split_once('\t') {
        Some((main, module)) => Some((
            main,
            Some(module.trim_ascii().strip_prefix('[')?.strip_suffix(']')?),
        )),
        None => Some((text, None)),
    }
}

/// `name` when it is one word.
fn plain_name(name: &str) -> Option<&str> {
    (!name.is_empty() && !name.bytes().any(|b| b.is_ascii_whitespace())).then_some(name)
}

/// A hex number of 1 to 16 digits.
fn hex(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        Some(n << 4 | u64::from(char::from(d).to_digit(16)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_lines_split_into_address_letter_name_and_module() {
        assert_eq!(
            Line::split("ffffffff810b0f90 T __x64_sys_getppid"),
            Some(Line {
                addr: 0xffff_ffff_810b_0f90,
                letter: 'T',
                name: "__x64_sys_getppid",
                module: None
            })
        );
        assert_eq!(
            Line::split("ffffffffc0201ef0 t trapvec_entry\t[trapvec]"),
            Some(Line {
                addr: 0xffff_ffff_c020_1ef0,
                letter: 't',
                name: "trapvec_entry",
                module: Some("trapvec")
            })
        );
    }

    #[test]
    fn repeated_spaces_carriage_returns_and_space_after_the_module_are_accepted() {
        let canonical = Line::split("ffffffffc0201ef0 t trapvec_entry\t[trapvec]");
        for odd in [
            "  ffffffffc0201ef0   t  trapvec_entry\t[trapvec]",
            "ffffffffc0201ef0 t trapvec_entry \t [trapvec] \r",
            "ffffffffc0201ef0 t trapvec_entry\t[trapvec]\r",
        ] {
            assert_eq!(Line::split(odd), canonical, "{odd:?}");
        }
        let text = "ffffffff81000000 T _stext\r\n\r\n   \nffffffff81000010 t f\t[m]\r\n";
        let syms = parse(text).unwrap();
        assert_eq!(
            syms.iter()
                .map(|s| (s.name.as_str(), s.origin.as_deref()))
                .collect::<Vec<_>>(),
            [("_stext", None), ("f", Some("m"))]
        );
    }

    /// Lines that parse, in the kernel's layout and spaced otherwise.
    const GOOD: &[&str] = &[
        "ffffffff810b0f90 T __x64_sys_getppid",
        "ffffffffc0201ef0 t trapvec_entry\t[trapvec]",
        "ffffffffc0201ef0 t trapvec_entry \t [trapvec] \r",
        "ffffffff81000000 T name\r",
        "  ffffffffc0201ef0   t  trapvec_entry\t[trapvec]",
        "ffffffff81000000 T  name",
        "81000000 T name",
    ];

    /// Lines that do not: a field missing or extra, a bad address, letter or module.
    const BAD: &[&str] = &[
        "ffffffff81000000   name",
        "ffffffff81000000 T",
        "ffffffff81000000 T  ",
        "ffffffff81000000 T name extra",
        "ffffffff81000000 TT name",
        "ffffffff8100000g T name",
        "1ffffffff81000000 T name",
        "ffffffff81000000 T name\ttrapvec",
        "ffffffff81000000 T name\t[trapvec",
        "ffffffff81000000 T \t[trapvec]",
        "ffffffff81000000",
    ];

    #[test]
    fn lines_of_another_shape_are_refused() {
        for bad in BAD {
            assert_eq!(Line::split(bad), None, "{bad:?}");
        }
        for good in GOOD {
            assert!(Line::split(good).is_some(), "{good:?}");
        }
    }

    #[test]
    fn short_addresses_and_extra_spaces_take_the_spaced_path() {
        assert_eq!(Line::split_canonical("81000000 T name"), None);
        let short = Line::split("81000000 T name");
        assert_eq!(
            short,
            Some(Line {
                addr: 0x8100_0000,
                letter: 'T',
                name: "name",
                module: None
            })
        );
        assert_eq!(Line::split_canonical("ffffffff81000000 T  name"), None);
        assert_eq!(
            Line::split("ffffffff81000000 T  name").map(|l| l.name),
            Some("name")
        );
    }

    #[test]
    fn the_fixed_offset_path_agrees_with_the_spaced_path_wherever_it_answers() {
        let mut canonical = 0;
        for line in GOOD.iter().chain(BAD) {
            if let Some(fast) = Line::split_canonical(line) {
                canonical += 1;
                assert_eq!(Some(fast), Line::split_spaced(line), "{line:?}");
            }
        }
        assert_eq!(
            canonical, 4,
            "the kernel's own layout, with and without a module or space around it"
        );
    }
}
