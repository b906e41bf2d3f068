//! `trapctl load COMPONENT.o [--name N]` and `trapctl unload NAME`.
//!
//! Loading links the component into the module's arena (symbols resolve against loaded
//! components, then kallsyms) and applies the splices it declares in `.trapvec.splices` in one
//! batch, like a livepatch; if that batch is refused the component is unloaded again. Unloading
//! removes those declared splices first; any other splice still using the component refuses it.

use std::path::PathBuf;

use anyhow::Result;
use instr_manager::ops::{Loaded, Unloaded};
use trapvec_proto::Request;

use crate::route;

/// Load a component into the kernel.
#[derive(clap::Args)]
#[command(long_about = "\
Load a kernel component (an ELF relocatable built with the kernel's flags through
components/Kbuild) into trapvec.ko's arena: its code is linked at its final address, its undefined
symbols resolved against loaded components, `__trapvec_orig_<fn>` original trampolines and
/proc/kallsyms, then written and sealed. Splices the component declares itself (TRAPVEC_SPLICE_*
in trapvec.h) are applied in one batch; if any is refused nothing stays loaded.

The component is known by NAME (default: the file name without .o) to `unload`, and its global
symbols by their names to `splice --call/--replace`, `set` and `get`.")]
pub struct LoadArgs {
    /// The component: an x86-64 ELF relocatable object (.o).
    pub component: PathBuf,
    /// Register it under this name instead of the file stem.
    #[arg(long)]
    pub name: Option<String>,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Unload a component.
#[derive(clap::Args)]
#[command(long_about = "\
Unload the component called NAME: the splices it declared itself are removed first, then its
code and data are freed once no CPU can be running them. Refused while a splice made with
`trapctl splice` or `apply` still uses one of its symbols, or another component imports from it.")]
pub struct UnloadArgs {
    /// The component's name (see `trapctl list`).
    pub name: String,
    /// Seconds to wait for tasks to leave the code of the splices removed with it (see
    /// `trapctl unsplice --wait`).
    #[arg(long, value_name = "SECONDS", value_parser = crate::cmd::splice::parse_wait)]
    pub wait: Option<std::time::Duration>,
    /// Print one JSON object (`"schema": 1` first) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn load(args: &LoadArgs) -> Result<()> {
    let path = route::absolute(&args.component)?;
    let request = Request::Load {
        path: path.clone(),
        name: args.name.clone(),
    };
    let loaded: Loaded = route::change(&request, |_| {})?;
    if args.json {
        return super::splice::print_json(&loaded);
    }
    let c = &loaded.component;
    println!(
        "loaded {} (crc32 {}): code {} ({} bytes), data {} ({} bytes), {} imports",
        c.name, c.crc32, c.code, c.code_len, c.data, c.data_len, c.imports
    );
    for s in &loaded.spliced {
        println!(
            "spliced {} at {} by {}: {}",
            s.at, s.site, s.mechanism, s.action
        );
    }
    Ok(())
}

pub fn unload(args: &UnloadArgs) -> Result<()> {
    let request = Request::Unload {
        name: args.name.clone(),
    };
    let u: Unloaded = route::change(&request, |sp| {
        if let Some(w) = args.wait {
            sp.set_quiesce_timeout(w);
        }
    })?;
    if args.json {
        return super::splice::print_json(&u);
    }
    let declared = if u.declared_removed == 0 {
        String::new()
    } else {
        format!(" and its {} declared splice(s)", u.declared_removed)
    };
    println!("unloaded {}{declared}", u.name);
    Ok(())
}
