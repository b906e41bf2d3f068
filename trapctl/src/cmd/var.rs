//! `trapctl set SYMBOL VALUE [--size N]` and `trapctl get SYMBOL [--size N]`: a component's
//! variable, written or read in place (KAPI's memcopy), e.g. to tune a policy live.

use anyhow::Result;
use instr_manager::ops::{Value, Var};
use trapvec_proto::Request;

use crate::route;

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
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
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
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

fn parse_size(text: &str) -> Result<usize, String> {
    match text {
        "1" | "2" | "4" | "8" => Ok(text.parse().expect("a digit")),
        _ => Err(format!("size `{text}` is not 1, 2, 4 or 8")),
    }
}

pub fn set(args: &SetArgs) -> Result<()> {
    let value = Value::Text(args.value.trim().to_string());
    let request = Request::Set {
        symbol: args.symbol.clone(),
        value: value.clone(),
        size: args.size,
    };
    let v: Var = route::change(&request, |_| {})?;
    if args.json {
        return super::splice::print_json(&v);
    }
    println!("{} = {} ({} bytes)", v.symbol, args.value.trim(), v.size);
    Ok(())
}

pub fn get(args: &GetArgs) -> Result<()> {
    let request = Request::Get {
        symbol: args.symbol.clone(),
        size: args.size,
    };
    let v: Var = route::read(&request)?;
    if args.json {
        return super::splice::print_json(&v);
    }
    println!("{}", v.value);
    Ok(())
}
