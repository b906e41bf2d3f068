//! `trapctl load COMPONENT.o [--name N]` and `trapctl unload NAME`.
//!
//! Loading links the component into the module's arena (symbols resolve against loaded
//! components, then kallsyms) and applies the splices it declares in `.trapvec.splices` in one
//! batch, like a livepatch; if that batch is refused the component is unloaded again. Unloading
//! removes those declared splices first; any other splice still using the component refuses it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use component_manager::{ComponentId, LoadOptions};
use instr_manager::apply::request_of;
use instr_manager::splicer::{SpliceId, SpliceRequest, Splicer};
use instr_manager::SpliceSpec;
use trapvec::kernel::KernelTarget;

use crate::kernel::Kernel;

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
}

/// The requests a component declares in `.trapvec.splices`.
fn declared_requests(splicer: &Splicer<KernelTarget>, id: ComponentId) -> Result<Vec<SpliceRequest>> {
    let Some(c) = splicer.components().get(id) else { return Ok(Vec::new()) };
    c.declared_splices
        .iter()
        .map(|d| {
            let record = format!("at={};action={};handler={};mechanism={}", d.at, d.action, d.handler, d.mechanism);
            let spec = SpliceSpec::from_record(&record).with_context(|| format!("component {}", c.label))?;
            Ok(request_of(&spec))
        })
        .collect()
}

pub fn load(args: &LoadArgs) -> Result<()> {
    let mut k = Kernel::open()?;
    let opts = LoadOptions { near: k.near(), expected_crc32: None, name: args.name.clone() };
    let id = k.splicer.load_component(&args.component, &opts).with_context(|| format!("loading {}", args.component.display()))?;
    let requests = declared_requests(&k.splicer, id)?;
    let spliced = if requests.is_empty() {
        Vec::new()
    } else {
        match k.splicer.apply(&requests) {
            Ok(ids) => ids,
            Err(e) => {
                if let Err(u) = k.splicer.unload_component(id) {
                    log::error!("unloading {} after its splices were refused: {u}", args.component.display());
                }
                return Err(anyhow::Error::new(e)
                    .context(format!("{}: a splice it declares was refused; nothing was loaded", args.component.display())));
            }
        }
    };
    k.commit_or_undo(|sp| {
        if !spliced.is_empty() {
            sp.remove(&spliced)?;
        }
        Ok(sp.unload_component(id)?)
    })?;
    let c = k.splicer.components().get(id).expect("just loaded");
    println!(
        "loaded {} (crc32 {:#010x}): code {:#x} ({} bytes), data {:#x} ({} bytes), {} imports",
        c.name,
        c.file_crc32,
        c.code_addr,
        c.code_len,
        c.data_addr,
        c.data.size,
        c.imports.len()
    );
    for (r, id) in requests.iter().zip(&spliced) {
        let s = k.splicer.get(*id).expect("just spliced");
        println!("spliced {} at {:#x} by {}: {}", r.at, s.point.site, s.plan.mechanism, r.action);
    }
    Ok(())
}

pub fn unload(args: &UnloadArgs) -> Result<()> {
    let mut k = Kernel::open()?;
    let Some(id) = k.splicer.components().by_name(&args.name) else {
        let loaded: Vec<String> = k.splicer.components().iter().map(|c| c.name.clone()).collect();
        bail!(
            "no component named `{}` is loaded ({})",
            args.name,
            if loaded.is_empty() { "none is".to_string() } else { format!("loaded: {}", loaded.join(", ")) }
        );
    };
    let declared = declared_requests(&k.splicer, id)?;
    let own: Vec<SpliceId> = k
        .splicer
        .live()
        .filter(|s| s.component == Some(id) && declared.iter().any(|d| d.at == s.request.at && d.action == s.request.action))
        .map(|s| s.id)
        .collect();
    let users: Vec<String> = k.splicer.live().filter(|s| s.component == Some(id) && !own.contains(&s.id)).map(|s| s.request.at.clone()).collect();
    if !users.is_empty() {
        bail!("component `{}` is used by the splice(s) at {}: unsplice them first", args.name, users.join(", "));
    }
    if !own.is_empty() {
        k.splicer.remove(&own)?;
    }
    k.splicer.unload_component(id)?;
    k.save()?;
    println!("unloaded {}{}", args.name, if own.is_empty() { String::new() } else { format!(" and its {} declared splice(s)", own.len()) });
    Ok(())
}
