//! Another process's objects: where libc and the agent are mapped (`/proc/PID/maps`), and the
//! address of a public symbol of theirs (the file's `.dynsym`, read with `object`).

use std::path::{Path, PathBuf};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("cannot read /proc/{pid}/maps: {source}")]
    Read { pid: i32, source: std::io::Error },
    #[error("process {pid} has no libc.so.6 mapped (a static binary, or another C library): trapvec's agent can only be loaded by glibc's dlopen")]
    NoLibc { pid: i32 },
    #[error("{object} is not mapped in process {pid} after its dlopen")]
    NotMapped { pid: i32, object: String },
    #[error("cannot read {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an ELF object: {source}")]
    Elf {
        path: PathBuf,
        source: object::Error,
    },
    #[error("{path} exports no `{name}`")]
    NoSymbol { path: PathBuf, name: String },
}

/// An object mapped in the process.
#[derive(Clone, Debug)]
pub struct Mapping {
    /// Its path as the maps name it.
    pub path: PathBuf,
    /// Load bias: where its first mapping (file offset 0) starts.
    pub base: u64,
    /// The start of its first executable mapping.
    pub exec_start: u64,
}

/// One line of `/proc/PID/maps`: start, permissions, file offset, path.
fn lines(pid: i32) -> Result<Vec<(u64, String, u64, String)>, MapsError> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|source| MapsError::Read { pid, source })?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?.to_string();
            let off = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.collect::<Vec<_>>().join(" ");
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            Some((start, perms, off, path))
        })
        .collect())
}

fn mapping_where(pid: i32, is: impl Fn(&str) -> bool) -> Result<Option<Mapping>, MapsError> {
    let all = lines(pid)?;
    let Some((base, _, _, path)) = all.iter().find(|(_, _, off, p)| *off == 0 && is(p)) else {
        return Ok(None);
    };
    let exec_start = all
        .iter()
        .find(|(_, perms, _, p)| p == path && perms.contains('x'))
        .map_or(*base, |m| m.0);
    Ok(Some(Mapping {
        path: PathBuf::from(path),
        base: *base,
        exec_start,
    }))
}

/// Whether the process has glibc mapped.
pub fn has_libc(pid: i32) -> Result<bool, MapsError> {
    Ok(mapping_where(pid, is_libc)?.is_some())
}

fn is_libc(p: &str) -> bool {
    Path::new(p).file_name().is_some_and(|n| n == "libc.so.6")
}

/// glibc as mapped in `pid`.
pub fn libc_of(pid: i32) -> Result<Mapping, MapsError> {
    mapping_where(pid, is_libc)?.ok_or(MapsError::NoLibc { pid })
}

/// The object at `path` as mapped in `pid`.
pub fn object_of(pid: i32, path: &Path) -> Result<Mapping, MapsError> {
    mapping_where(pid, |p| Path::new(p) == path)?.ok_or_else(|| MapsError::NotMapped {
        pid,
        object: path.display().to_string(),
    })
}

/// The file of the object named `object` mapped in `pid`, as the maps name it: matched as a
/// point's object part matches ([`instr_manager::point::object_matches`]: the path, the file
/// name, or the file name up to a dot), `None` when none is mapped.
pub fn object_named(pid: i32, object: &str) -> Result<Option<PathBuf>, MapsError> {
    Ok(mapping_where(pid, |p| {
        p.starts_with('/') && instr_manager::point::object_matches(p, object)
    })?
    .map(|m| m.path))
}

/// The offsets from its load bias of the public functions `names` of the object at `path` (as
/// the process names it), in `names`' order.
pub fn file_symbols(pid: i32, path: &Path, names: &[&str]) -> Result<Vec<u64>, MapsError> {
    // Through the process's root, so that a process in another mount namespace is read right.
    let file =
        PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    let data = std::fs::read(&file).map_err(|source| MapsError::File {
        path: file.clone(),
        source,
    })?;
    let elf = object::File::parse(&*data).map_err(|source| MapsError::Elf {
        path: path.into(),
        source,
    })?;
    // The load bias is where file offset 0 was mapped: a segment's address less its offset.
    let first = elf
        .segments()
        .map(|s| s.address() - s.file_range().0)
        .min()
        .unwrap_or(0);
    names
        .iter()
        .map(|name| {
            elf.dynamic_symbols()
                .find(|s| s.is_definition() && s.name() == Ok(*name))
                .map(|s| s.address() - first)
                .ok_or_else(|| MapsError::NoSymbol {
                    path: path.into(),
                    name: (*name).to_string(),
                })
        })
        .collect()
}

/// The `Seccomp:` mode of `/proc/PID/status` (0 none, 1 strict, 2 filter).
pub fn seccomp_mode(pid: i32) -> Option<u32> {
    status_field(pid, "Seccomp")?.trim().parse().ok()
}

/// A field of `/proc/PID/status`.
pub fn status_field(pid: i32, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::to_string))
}
