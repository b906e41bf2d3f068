//! `trapctl set SYMBOL VALUE [--size N]` and `trapctl get SYMBOL [--size N]`: a component's
//! variable, written or read in place (KAPI's memcopy), e.g. to tune a policy live.

use anyhow::{bail, Result};

use crate::kernel::Kernel;

/// Write a component variable.
#[derive(clap::Args)]
#[command(long_about = "\
Write VALUE into the variable SYMBOL of a loaded component, little endian, in one store when the
variable is naturally aligned (another CPU never sees half of it). VALUE is decimal, negative
(two's complement) or 0x hex, and must fit the size. The size is --size, else the variable's own
size from its symbol table (1, 2, 4 or 8), else 8; a size larger than the variable is refused.")]
pub struct SetArgs {
    /// A global variable of a loaded component.
    pub symbol: String,
    /// The value: decimal, -decimal, or 0x hex.
    #[arg(allow_hyphen_values = true)]
    pub value: String,
    /// Bytes to write: 1, 2, 4 or 8.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<usize>,
}

/// Read a component variable.
#[derive(clap::Args)]
#[command(long_about = "\
Print the value of the variable SYMBOL of a loaded component alone, as an unsigned decimal number
(for scripts). The size is chosen as for `set`.")]
pub struct GetArgs {
    /// A global variable of a loaded component.
    pub symbol: String,
    /// Bytes to read: 1, 2, 4 or 8.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<usize>,
}

fn parse_size(text: &str) -> Result<usize, String> {
    match text {
        "1" | "2" | "4" | "8" => Ok(text.parse().expect("a digit")),
        _ => Err(format!("size `{text}` is not 1, 2, 4 or 8")),
    }
}

/// The size to use for `symbol`: `--size`, else its symbol's size, else 8.
fn size_of(k: &Kernel, symbol: &str, asked: Option<usize>) -> Result<usize> {
    let known = k
        .splicer
        .components()
        .lookup(symbol)
        .and_then(|(id, _)| k.splicer.components().get(id))
        .and_then(|c| c.symbol(symbol))
        .map(|s| s.size)
        .filter(|&s| matches!(s, 1 | 2 | 4 | 8))
        .and_then(|s| usize::try_from(s).ok());
    match (asked, known) {
        (Some(a), Some(k)) if a > k => bail!("`{symbol}` is {k} bytes long; --size {a} would write past it"),
        (Some(a), _) => Ok(a),
        (None, Some(k)) => Ok(k),
        (None, None) => Ok(8),
    }
}

/// `text` as the bits of a `size`-byte value, if it fits as a signed or an unsigned number.
pub fn parse_value(text: &str, size: usize) -> Result<u64> {
    let t = text.trim();
    let bits = u32::try_from(size * 8).expect("size is at most 8");
    let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let (negative, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t),
    };
    let magnitude = super::parse_u64(digits).map_err(anyhow::Error::msg)?;
    let value = if negative {
        if magnitude > 1u64 << (bits - 1) {
            bail!("{text} does not fit in {size} byte(s)");
        }
        magnitude.wrapping_neg() & mask
    } else {
        if magnitude > mask {
            bail!("{text} does not fit in {size} byte(s)");
        }
        magnitude
    };
    Ok(value)
}

pub fn set(args: &SetArgs) -> Result<()> {
    let mut k = Kernel::open()?;
    let size = size_of(&k, &args.symbol, args.size)?;
    let value = parse_value(&args.value, size)?;
    k.splicer.set_var(&args.symbol, value, size)?;
    println!("{} = {} ({size} bytes)", args.symbol, args.value.trim());
    Ok(())
}

pub fn get(args: &GetArgs) -> Result<()> {
    let k = Kernel::open()?;
    let size = size_of(&k, &args.symbol, args.size)?;
    println!("{}", k.splicer.get_var(&args.symbol, size)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_value;

    #[test]
    fn values_fit_their_size_signed_or_unsigned() {
        assert_eq!(parse_value("1400", 4).unwrap(), 1400);
        assert_eq!(parse_value("0x578", 4).unwrap(), 1400);
        assert_eq!(parse_value("-1", 1).unwrap(), 0xff);
        assert_eq!(parse_value("-128", 1).unwrap(), 0x80);
        assert_eq!(parse_value("255", 1).unwrap(), 255);
        assert_eq!(parse_value("-1", 8).unwrap(), u64::MAX);
        assert_eq!(parse_value("18446744073709551615", 8).unwrap(), u64::MAX);
        for (bad, size) in [("256", 1), ("-129", 1), ("0x1_0000_0000", 4), ("4294967296", 4), ("twelve", 8), ("", 8)] {
            assert!(parse_value(bad, size).is_err(), "{bad} in {size} bytes");
        }
    }
}
