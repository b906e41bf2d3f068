//! The code a process trace's probes name, read from the files before anything is spliced: the
//! program's and its libraries' functions, for globs (`parse_*`, `libfx.so:fx_*`), and a
//! function's first instructions, for an entry probe beside the function's `:return` probe.
//!
//! A library a probe names (`libfx.so` of `libfx.so:fx_*`) is found as the agent would find it
//! in the process:
//! - with `-p PID`, the object the process has mapped under that name (`/proc/PID/maps`, matched
//!   as points match objects: the path, the file name, or the file name up to a dot), read
//!   through `/proc/PID/root`;
//! - for a command trace starts, the file the dynamic loader would load for that name: a path as
//!   it is, else `$LD_LIBRARY_PATH`, the loader's cache (`ldconfig -p`), the default directories
//!   (as `trapctl cover` finds a library; a program's RPATH/RUNPATH is not read).
//!
//! A library glob stands for the library's defined functions (its `.symtab` where it has one,
//! else its exported `.dynsym`), IFUNCs included (the agent splices the implementation the
//! loader picked), versions hidden from links left out, each address once.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use instr_manager::glob::{is_glob, FunctionGlob};
use instr_manager::image::CodeImage;
use trapvec::SymbolKind;

use crate::cmd::cover::libs::find_library;

/// The files a process trace's probes name, each read once.
pub struct Functions<'a> {
    program: &'a Path,
    /// The running process (`-p PID`), whose mapped libraries are the ones meant.
    pid: Option<i32>,
    /// By object (`None`: the program): the file and its code.
    images: HashMap<Option<String>, (PathBuf, CodeImage)>,
}

impl<'a> Functions<'a> {
    pub fn new(program: &'a Path, pid: Option<i32>) -> Functions<'a> {
        Functions {
            program,
            pid,
            images: HashMap::new(),
        }
    }

    /// The file of library `object` (see the module docs).
    fn library(&self, object: &str) -> Result<PathBuf, String> {
        if is_glob(object) {
            return Err(format!(
                "the library part of a probe names one library, not a glob: `{object}`"
            ));
        }
        if let Some(pid) = self.pid {
            let mapped = crate::attach::maps::object_named(pid, object)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!("process {pid} has no library {object} mapped (/proc/{pid}/maps)")
                })?;
            return Ok(PathBuf::from(format!("/proc/{pid}/root"))
                .join(mapped.strip_prefix("/").unwrap_or(&mapped)));
        }
        find_library(object).ok_or_else(|| {
            format!("library {object} is not found ($LD_LIBRARY_PATH, ldconfig -p, /lib, /usr/lib): give its path (/path/to/{object}:NAME)")
        })
    }

    /// The file and code of `object` (`None`: the program).
    fn image(&mut self, object: Option<&str>) -> Result<&(PathBuf, CodeImage), String> {
        let key = object.map(str::to_string);
        if !self.images.contains_key(&key) {
            let path = match object {
                Some(o) => self.library(o)?,
                None => self.program.to_path_buf(),
            };
            let image = CodeImage::from_path(&path)
                .map_err(|e| format!("{}: {}", path.display(), trapvec::error_chain(&e)))?;
            self.images.insert(key.clone(), (path, image));
        }
        Ok(&self.images[&key])
    }

    /// The functions a probe's name stands for: itself, or for a glob the program's own
    /// functions it matches, or with an object (`libfx.so:fx_*`) that library's. A library glob
    /// matching nothing is an error naming the glob and the library's file.
    pub fn expand(&mut self, object: Option<&str>, name: &str) -> Result<Vec<String>, String> {
        if !is_glob(name) {
            return Ok(vec![name.to_string()]);
        }
        let glob = FunctionGlob::new(name).map_err(|e| e.to_string())?;
        let (path, image) = self.image(object)?;
        let Some(object) = object else {
            return Ok(image.functions_matching(&glob));
        };
        let names = library_functions(image, &glob);
        if names.is_empty() {
            return Err(format!(
                "probe '{object}:{name}' matches no function of {object} ({})",
                path.display()
            ));
        }
        log::debug!(
            "{object}:{name}: {} function(s) of {}",
            names.len(),
            path.display()
        );
        Ok(names)
    }

    /// Move each entry probe of a function that also has a `:return` probe (the return point's
    /// entry half takes the entry's site) to the first instruction after that site's window of
    /// `window` bytes, read from the function's file ([`trapvec_script::after_window`] refuses a
    /// window that branches or writes an argument register, so that `argN` there are still the
    /// entry's).
    pub fn place_beside_returns(
        &mut self,
        compiled: &mut trapvec_script::Compiled,
        window: usize,
    ) -> Result<()> {
        for sp in compiled.splices.iter_mut().filter(|s| s.beside_return) {
            let (object, name) = match sp.at.rsplit_once(':') {
                Some((o, n)) => (Some(o), n),
                None => (None, sp.at.as_str()),
            };
            let (path, image) = self.image(object).map_err(anyhow::Error::msg)?;
            let defined = |kind: SymbolKind| {
                image
                    .symbols
                    .iter()
                    .find(|s| s.name == name && s.kind == kind && !hidden(s))
            };
            let Some(sym) = defined(SymbolKind::Function) else {
                if defined(SymbolKind::Ifunc).is_some() {
                    bail!(
                        "probe {}: {name} is an IFUNC in {} (the loader picks its code at run time): an entry probe cannot go beside its :return probe",
                        sp.at,
                        path.display()
                    );
                }
                bail!("probe {}: no function {name} in {}", sp.at, path.display());
            };
            let f = image
                .functions
                .iter()
                .find(|f| f.start == sym.addr)
                .with_context(|| {
                    format!("probe {}: {name} has no code in {}", sp.at, path.display())
                })?;
            super::past_return_site(sp, image.bytes_of(f), f.start, 0, window)?;
        }
        Ok(())
    }
}

/// A version a link does not bind to (`name@VER`, not `name@@VER`).
fn hidden(s: &trapvec::Symbol) -> bool {
    s.version.as_deref().is_some_and(|v| !v.starts_with("@@"))
}

/// The names of a library's functions `glob` matches, sorted: one name per address (aliases
/// are one function; the first of those not starting with `_`, else the first), hidden
/// versions left out.
fn library_functions(image: &CodeImage, glob: &FunctionGlob) -> Vec<String> {
    let mut by_addr: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for s in image.symbols.iter() {
        if matches!(s.kind, SymbolKind::Function | SymbolKind::Ifunc)
            && !hidden(s)
            && glob.matches(&s.name, None)
        {
            by_addr.entry(s.addr).or_default().push(&s.name);
        }
    }
    let mut names: Vec<String> = by_addr
        .into_values()
        .map(|mut names| {
            names.sort_by_key(|n| (n.starts_with('_'), *n));
            names[0].to_string()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}
