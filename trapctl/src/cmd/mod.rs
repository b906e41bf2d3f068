//! The subcommands that act on the running kernel through trapvec.ko, one module per group;
//! each exposes clap `Args` and `run(&args) -> anyhow::Result<()>`. Every one of them opens
//! [`crate::kernel::Kernel`] (lock, restore the saved state), does its work, and saves the
//! state again when it changed anything.

pub mod apply;
pub mod component;
pub mod count;
pub mod cycle;
pub mod list;
pub mod read;
pub mod splice;
pub mod var;

/// A number written in decimal or with `0x` (hex).
pub fn parse_u64(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("`{text}` is not a number (decimal, or hex with 0x)"))
}
