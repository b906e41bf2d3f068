//! `trapctl status`, `trapctl activate PROFILE` and `trapctl require MODULE`: what only a running
//! trapd knows and does.

use anyhow::Result;
use instr_manager::ops::{Activated, Required, Status};
use trapvec_proto::Request;

use crate::route;

/// Show trapd's state.
#[derive(clap::Args)]
#[command(long_about = "\
Show the running trapd's state: its pid and uptime, the active profile and the configured ones,
how many switches it made, the live splices and components, the generation of the state it keeps
in the module, its journal, and the last value of each metric. Needs trapd (see --socket).
--json prints the daemon's reply as it is, after `\"schema\": 1`.")]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Switch trapd to a profile.
#[derive(clap::Args)]
#[command(long_about = "\
Ask the running trapd to switch to PROFILE (a [profile.NAME] of its configuration): its missing
components are loaded and its variables written, then in one all-or-nothing batch the active
profile's splices go and PROFILE's come. The daemon's rules may switch again later when their
metrics say so. Needs trapd (see --socket).")]
pub struct ActivateArgs {
    /// The profile's name.
    pub profile: String,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Make a module's pending points a condition of its load.
#[derive(clap::Args)]
#[command(long_about = "\
Ask the running trapd to refuse MODULE's load (insmod fails with EINVAL, and the kernel log says
which point) when one of the pending points it holds in MODULE cannot be made as the module comes
(no such symbol, a refused window), as livepatch refuses a module it cannot patch. Without it such
a point is reported (trapctl list, trapd's journal, dmesg) and the module loads all the same.
It lasts as long as trapd runs. Needs trapd (see --socket): pending points are trapd's.")]
pub struct RequireArgs {
    /// The kernel module's name, as lsmod shows it (`-` and `_` are the same).
    pub module: String,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn require(args: &RequireArgs) -> Result<()> {
    let r: Required = route::daemon_only(&Request::Require {
        module: args.module.clone(),
    })?;
    if args.json {
        return super::splice::print_json(&r);
    }
    println!(
        "module {} is required: its load is refused if a pending point in it cannot be made",
        r.require
    );
    Ok(())
}

pub fn status(args: &StatusArgs) -> Result<()> {
    let s: Status = route::daemon_only(&Request::Status)?;
    if args.json {
        super::splice::print_json(&s)?;
        return Ok(());
    }
    println!(
        "trapd pid {}, up {} s, journal {}",
        s.pid,
        s.uptime_s,
        s.journal.display()
    );
    println!(
        "profile {} (of {}), {} switch(es)",
        s.profile.as_deref().unwrap_or("(none)"),
        serde_json::to_string(&s.profiles)?,
        s.switches
    );
    println!(
        "{} splice(s), {} component(s), state generation {}",
        s.splices, s.components, s.generation
    );
    for (name, value) in &s.metrics {
        // As JSON writes it (3.0, not 3), as this line always read.
        println!("metric {name} = {}", serde_json::Value::from(*value));
    }
    if s.unrecorded > 0 {
        println!(
            "{} unrecorded dispatch entr(ies): see `trapctl list`",
            s.unrecorded
        );
    }
    Ok(())
}

pub fn activate(args: &ActivateArgs) -> Result<()> {
    let a: Activated = route::daemon_only(&Request::Activate {
        profile: args.profile.clone(),
    })?;
    if args.json {
        return super::splice::print_json(&a);
    }
    let sw = &a.switched;
    let mut notes = Vec::new();
    if sw.in_place > 0 {
        notes.push(format!(
            "{} trap site(s) the new profile splices differently changed hands in place",
            sw.in_place
        ));
    }
    if sw.handed_over > 0 {
        notes.push(format!(
            "{} site(s) changing mechanism were removed by a batch of their own first",
            sw.handed_over
        ));
    }
    let handed = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    println!(
        "profile {} -> {}: {} splice(s) removed, {} added{handed}",
        a.previous.as_deref().unwrap_or("(none)"),
        args.profile,
        sw.removed,
        sw.added
    );
    Ok(())
}
