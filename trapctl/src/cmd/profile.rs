//! `trapctl status` and `trapctl activate PROFILE`: what only a running trapd knows and does.

use anyhow::Result;
use serde_json::Value;
use trapvec_proto::Request;

use crate::route;

/// Show trapd's state.
#[derive(clap::Args)]
#[command(long_about = "\
Show the running trapd's state: its pid and uptime, the active profile and the configured ones,
how many switches it made, the live splices and components, the generation of the state it keeps
in the module, its journal, and the last value of each metric. Needs trapd (see --socket).
--json prints the daemon's reply as it is.")]
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
}

pub fn status(args: &StatusArgs) -> Result<()> {
    let v: Value = route::daemon_only(&Request::Status)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let text = |k: &str| match &v[k] {
        Value::Null => "(none)".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    println!(
        "trapd pid {}, up {} s, journal {}",
        text("pid"),
        text("uptime_s"),
        text("journal")
    );
    println!(
        "profile {} (of {}), {} switch(es)",
        text("profile"),
        text("profiles"),
        text("switches")
    );
    println!(
        "{} splice(s), {} component(s), state generation {}",
        text("splices"),
        text("components"),
        text("generation")
    );
    if let Some(m) = v["metrics"].as_object() {
        for (name, value) in m {
            println!("metric {name} = {value}");
        }
    }
    if v["unrecorded"].as_u64().is_some_and(|n| n > 0) {
        println!(
            "{} unrecorded dispatch entr(ies): see `trapctl list`",
            text("unrecorded")
        );
    }
    Ok(())
}

pub fn activate(args: &ActivateArgs) -> Result<()> {
    let v: Value = route::daemon_only(&Request::Activate {
        profile: args.profile.clone(),
    })?;
    let mut notes = Vec::new();
    if let Some(n) = v["in_place"].as_u64().filter(|&n| n > 0) {
        notes.push(format!(
            "{n} trap site(s) the new profile splices differently changed hands in place"
        ));
    }
    if let Some(n) = v["handed_over"].as_u64().filter(|&n| n > 0) {
        notes.push(format!(
            "{n} site(s) changing mechanism were removed by a batch of their own first"
        ));
    }
    let handed = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    println!(
        "profile {} -> {}: {} splice(s) removed, {} added{handed}",
        v["previous"].as_str().unwrap_or("(none)"),
        args.profile,
        v["removed"],
        v["added"]
    );
    Ok(())
}
