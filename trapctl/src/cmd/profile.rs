//! `trapctl status` and `trapctl activate PROFILE`: what only a running trapd knows and does.

use anyhow::Result;
use instr_manager::ops::{Activated, Status};
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
