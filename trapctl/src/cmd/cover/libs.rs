//! Libraries a program loads later (`dlopen`): the file an `OBJECT:GLOB`'s object part names,
//! found before the program runs so that its blocks can be listed; the agent arms them when the
//! program maps the library (its deferred splices, agent/src/deferred.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

use instr_manager::glob::{is_glob, FunctionGlob};

/// The object part of `glob` (`libfoo.so.1` of `libfoo.so.1:foo_*`), if it has one.
pub(crate) fn object_part(glob: &FunctionGlob) -> Option<&str> {
    glob.text().rsplit_once(':').map(|(o, _)| o)
}

/// The file a library named `object` is, as the dynamic loader would find it for a `dlopen`
/// made by the agent: a path as it is; a file name in `$LD_LIBRARY_PATH`, then the loader's
/// cache (`ldconfig -p`), then the default directories. `None` for a glob or a name not found.
pub(crate) fn find_library(object: &str) -> Option<PathBuf> {
    if is_glob(object) {
        return None;
    }
    if object.contains('/') {
        let p = PathBuf::from(object);
        return p.is_file().then_some(p);
    }
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split([':', ';'])
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    if let Some(p) = dirs.iter().map(|d| d.join(object)).find(|p| p.is_file()) {
        return Some(p);
    }
    if let Some(p) = from_ld_cache(object) {
        return Some(p);
    }
    dirs = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    dirs.iter().map(|d| d.join(object)).find(|p| p.is_file())
}

/// `object`'s x86-64 entry in the loader's cache, as `ldconfig -p` prints it
/// (`\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1`).
fn from_ld_cache(object: &str) -> Option<PathBuf> {
    let out = Command::new("ldconfig")
        .arg("-p")
        .output()
        .or_else(|_| Command::new("/sbin/ldconfig").arg("-p").output())
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (left, path) = l.split_once(" => ")?;
        let (name, kind) = left.trim().split_once(' ')?;
        (name == object && kind.contains("x86-64"))
            .then(|| PathBuf::from(path.trim()))
            .filter(|p| Path::new(p).is_file())
    })
}
