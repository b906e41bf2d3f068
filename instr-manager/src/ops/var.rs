//! Component variables: one size policy ([`var_size`]) and one way to write them that records
//! the old value ([`write`]), for `set`, a spec's `[[set]]` and a profile's alike.

use serde::{Deserialize, Serialize};
use trapvec::Target;

use super::report::Var;
use super::{Made, OpError, Written};
use crate::splicer::Splicer;

/// A number that could not be read, or does not fit its variable.
#[derive(Debug, thiserror::Error)]
#[error("`{text}` {why}")]
pub struct NumberError {
    pub text: String,
    pub why: String,
}

impl NumberError {
    fn new(text: impl Into<String>, why: impl Into<String>) -> Self {
        NumberError {
            text: text.into(),
            why: why.into(),
        }
    }
}

/// A value for `set`: a number, or text to parse for the variable's size (decimal, `-decimal`
/// in two's complement, or `0x` hex).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Number(u64),
    Text(String),
}

/// The size to access `symbol` with: `asked`, else the symbol's own size (when 1, 2, 4 or 8),
/// else 8. More than the symbol's size is refused (it would write past it).
pub fn var_size<T: Target>(
    sp: &Splicer<T>,
    symbol: &str,
    asked: Option<usize>,
) -> Result<usize, OpError> {
    if let Some(a) = asked.filter(|a| ![1, 2, 4, 8].contains(a)) {
        return Err(OpError::Size(a));
    }
    let components = sp.components();
    let known = components
        .lookup(symbol)
        .and_then(|(id, _)| components.get(id))
        .and_then(|c| c.symbol(symbol))
        .map(|s| s.size)
        .filter(|s| matches!(s, 1 | 2 | 4 | 8))
        .and_then(|s| usize::try_from(s).ok());
    match (asked, known) {
        (Some(size), Some(len)) if size > len => Err(OpError::PastEnd {
            symbol: symbol.to_string(),
            len,
            size,
        }),
        (Some(a), _) => Ok(a),
        (None, k) => Ok(k.unwrap_or(8)),
    }
}

/// `text` as the bits of a `size`-byte value, if it fits as a signed or an unsigned number.
pub fn parse_value(text: &str, size: usize) -> Result<u64, NumberError> {
    let bad = |why: &str| NumberError::new(text, why);
    let t = text.trim();
    let bits = u32::try_from(size * 8).map_err(|_| bad("has no size"))?;
    let mask = mask(size);
    let (negative, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    let magnitude = parse_u64(digits)
        .map_err(|_| bad("is not a number (decimal, -decimal, or hex with 0x)"))?;
    let fits = if negative {
        magnitude <= 1u64 << (bits - 1)
    } else {
        magnitude <= mask
    };
    if !fits {
        return Err(bad(&format!("does not fit in {size} byte(s)")));
    }
    Ok(if negative {
        magnitude.wrapping_neg() & mask
    } else {
        magnitude
    })
}

/// The largest unsigned value of `size` bytes.
fn mask(size: usize) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size * 8)) - 1
    }
}

/// A number written in decimal or with `0x` (hex).
pub fn parse_u64(text: &str) -> Result<u64, NumberError> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| NumberError::new(text, "is not a number (decimal, or hex with 0x)"))
}

/// The 8-byte two's complement `bits` (a spec's value with no size) as a `size`-byte value, if
/// it fits as a signed or an unsigned number of that size.
pub(super) fn fit_signed(bits: u64, size: usize) -> Result<u64, NumberError> {
    let signed = i64::from_ne_bytes(bits.to_ne_bytes());
    let shown = if signed < 0 {
        signed.to_string()
    } else {
        bits.to_string()
    };
    parse_value(&shown, size)
}

/// Write `value` to `symbol` at `size` (`None`: [`var_size`]'s choice), returning what it held.
pub(super) fn write<T: Target>(
    sp: &mut Splicer<T>,
    symbol: &str,
    value: u64,
    size: Option<usize>,
) -> Result<Written, OpError> {
    let size = var_size(sp, symbol, size)?;
    if value > mask(size) {
        return Err(
            NumberError::new(value.to_string(), format!("does not fit in {size} byte(s)")).into(),
        );
    }
    let set_err = |source| OpError::Set {
        symbol: symbol.to_string(),
        source,
    };
    let before = sp.get_var(symbol, size).map_err(set_err)?;
    sp.set_var(symbol, value, size).map_err(set_err)?;
    Ok(Written {
        symbol: symbol.to_string(),
        before,
        size,
    })
}

/// Write a component variable.
pub fn set<T: Target>(
    sp: &mut Splicer<T>,
    symbol: &str,
    value: &Value,
    size: Option<usize>,
) -> Result<(Var, Made), OpError> {
    let bits = match value {
        Value::Number(n) => *n,
        Value::Text(t) => parse_value(t, var_size(sp, symbol, size)?)?,
    };
    let w = write(sp, symbol, bits, size)?;
    let var = Var {
        symbol: symbol.to_string(),
        value: bits,
        size: w.size,
    };
    Ok((
        var,
        Made {
            vars: vec![w],
            ..Made::default()
        },
    ))
}

/// Read a component variable.
pub fn get<T: Target>(sp: &Splicer<T>, symbol: &str, size: Option<usize>) -> Result<Var, OpError> {
    let size = var_size(sp, symbol, size)?;
    Ok(Var {
        symbol: symbol.to_string(),
        value: sp.get_var(symbol, size)?,
        size,
    })
}
