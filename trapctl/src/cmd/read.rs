//! `trapctl read ADDR|SYM [LEN]`: kernel memory through the module, as a hex dump (to compare a
//! function's bytes before and after splicing).

use anyhow::{Context, Result};
use trapvec::kernel::KernelTarget;
use trapvec::Target;

use crate::cmd::parse_u64;

/// Dump kernel memory.
#[derive(clap::Args)]
#[command(long_about = "\
Print LEN bytes of kernel memory at ADDR (0x hex) or at a symbol (`function`, `function+off`),
read through trapvec.ko, 16 per line as `ADDRESS: BYTES`. Without LEN a function is dumped whole
(up to the next kallsyms symbol). Reads only; takes no lock and needs no saved state.")]
pub struct Args {
    /// `0xADDRESS`, `symbol` or `symbol+offset`.
    pub at: String,
    /// Bytes to read (decimal or 0x hex); default: the function's extent.
    #[arg(value_parser = parse_u64)]
    pub len: Option<u64>,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// What `--json` prints.
#[derive(serde::Serialize)]
struct Report<'a> {
    at: &'a str,
    /// The first byte's address, `0x` hex.
    address: String,
    len: usize,
    /// The bytes as hex pairs separated by spaces, as the text lines show them.
    bytes: String,
}

/// `(address, default length)` of `at`.
fn locate(target: &KernelTarget, at: &str) -> Result<(u64, Option<u64>)> {
    if at.starts_with("0x") || at.starts_with("0X") {
        return Ok((parse_u64(at)?, None));
    }
    let (name, off) = match at.split_once('+') {
        Some((n, o)) => (n, parse_u64(o)?),
        None => (at, 0),
    };
    let sym = target
        .symbols()
        .lookup(name)
        .with_context(|| format!("no kernel symbol `{name}`"))?;
    let extent = target.symbols().function_extent(sym);
    Ok((sym.addr + off, (extent > off).then(|| extent - off)))
}

/// `ADDRESS: b0 b1 ...` lines, 16 bytes each.
pub fn hex_dump(addr: u64, bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        out.push_str(&format!(
            "{:016x}: {}\n",
            addr + 16 * i as u64,
            trapvec::error::hex(line)
        ));
    }
    out
}

pub fn run(args: &Args) -> Result<()> {
    let target = KernelTarget::open()?;
    let (addr, extent) = locate(&target, &args.at)?;
    let len = args
        .len
        .or(extent)
        .with_context(|| format!("`{}`: give LEN (its extent is unknown)", args.at))?;
    let len = usize::try_from(len).context("LEN")?;
    let bytes = target.read(addr, len)?;
    if args.json {
        return super::splice::print_json(&Report {
            at: &args.at,
            address: format!("{addr:#x}"),
            len: bytes.len(),
            bytes: trapvec::error::hex(&bytes),
        });
    }
    print!("{}", hex_dump(addr, &bytes));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_dump_is_sixteen_bytes_a_line_with_the_address() {
        let bytes: Vec<u8> = (0..20).collect();
        let d = super::hex_dump(0xffff_ffff_8100_0000, &bytes);
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            "ffffffff81000000: 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f"
        );
        assert_eq!(lines[1], "ffffffff81000010: 10 11 12 13");
    }
}
