//! The subcommands that act on the running kernel through trapvec.ko, one module per group;
//! each exposes clap `Args` and `run(&args) -> anyhow::Result<()>`. Each builds its operation
//! once for both ways ([`crate::route`]): trapd's request, and the [`instr_manager::ops`] call made
//! on [`crate::kernel::Kernel`] (lock, restore the saved state, save it after a change) when no
//! daemon runs; then prints the report, which is the same either way.

pub mod apply;
pub mod component;
pub mod count;
pub mod cover;
pub mod cycle;
pub mod doctor;
pub mod list;
pub mod points;
pub mod profile;
pub mod progress;
pub mod read;
pub mod splice;
pub mod time;
pub mod trace;
pub mod under_agent;
pub mod var;

pub use instr_manager::ops::parse_u64;
