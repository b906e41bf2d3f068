//! The guest's root file system: a tree of directories, files, symlinks and device nodes,
//! written as a gzip-compressed newc cpio archive for the kernel to unpack.
//!
//! Owns the tree and the helpers that fill it from the host (busybox with its applet links,
//! programs with their shared libraries). What a vmtest guest contains is decided in
//! [`crate::runner`]; the byte format is [`crate::cpio`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cpio::{CpioError, CpioWriter, Header, S_IFCHR, S_IFDIR, S_IFLNK, S_IFREG};
use crate::ldd::{self, LddError};

/// Errors building or writing the tree.
#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    /// A guest path that is empty or has `.`/`..` components.
    #[error("guest path {path:?} must be a plain absolute or relative path")]
    BadPath {
        /// The path given.
        path: String,
    },
    /// A path is already a directory and would become something else, or the reverse.
    #[error("guest path /{path} is already a {existing}; cannot add a {new} there")]
    Conflict {
        /// The path.
        path: String,
        /// What it is.
        existing: &'static str,
        /// What was added.
        new: &'static str,
    },
    /// A host file to be copied cannot be read.
    #[error("reading {host} for guest path /{guest}")]
    ReadHost {
        /// The host file.
        host: PathBuf,
        /// Its guest path.
        guest: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// busybox is dynamically linked, so it would need libraries before /init could run.
    #[error(
        "{path} is dynamically linked; vmtest needs a static busybox (install busybox-static)"
    )]
    BusyboxNotStatic {
        /// The busybox binary.
        path: PathBuf,
    },
    /// `busybox --list-full` failed.
    #[error("listing the applets of {path}: {reason}")]
    BusyboxApplets {
        /// The busybox binary.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Resolving shared libraries failed.
    #[error(transparent)]
    Ldd(#[from] LddError),
    /// Writing the archive failed.
    #[error(transparent)]
    Cpio(#[from] CpioError),
    /// Compressing the archive failed.
    #[error("compressing the initramfs")]
    Gzip(#[source] std::io::Error),
}

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Read from this host file when the archive is written.
    Host(PathBuf),
    /// These bytes.
    Bytes(Vec<u8>),
}

/// One node of the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory (mode 0755).
    Dir,
    /// A regular file.
    File {
        /// Its bytes.
        source: Source,
        /// Permission bits.
        mode: u32,
    },
    /// A symbolic link to this target.
    Symlink(String),
    /// A character device node.
    CharDev {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
        /// Permission bits.
        mode: u32,
    },
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Dir => "directory",
            Node::File { .. } => "file",
            Node::Symlink(_) => "symlink",
            Node::CharDev { .. } => "device",
        }
    }
}

/// The guest tree, keyed by path without the leading `/`. The map's order puts every
/// directory before its contents, which is the order the kernel's unpacker needs.
#[derive(Debug, Default, Clone)]
pub struct Initramfs {
    nodes: BTreeMap<String, Node>,
}

impl Initramfs {
    /// An empty tree.
    pub fn new() -> Self {
        Self::default()
    }

    /// The node at `path`, if any.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(normalize(path).ok()?.as_str())
    }

    /// Every guest path, parents first.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Adds a directory (and its parents).
    pub fn dir(&mut self, path: &str) -> Result<(), InitramfsError> {
        let path = normalize(path)?;
        self.insert(path, Node::Dir)
    }

    /// Adds a file copied from the host when the archive is written.
    pub fn host_file(&mut self, guest: &str, host: &Path, mode: u32) -> Result<(), InitramfsError> {
        let path = normalize(guest)?;
        self.insert(
            path,
            Node::File {
                source: Source::Host(host.to_owned()),
                mode,
            },
        )
    }

    /// Adds a file with the given contents.
    pub fn bytes_file(
        &mut self,
        guest: &str,
        bytes: impl Into<Vec<u8>>,
        mode: u32,
    ) -> Result<(), InitramfsError> {
        let path = normalize(guest)?;
        self.insert(
            path,
            Node::File {
                source: Source::Bytes(bytes.into()),
                mode,
            },
        )
    }

    /// Adds a symbolic link.
    pub fn symlink(&mut self, guest: &str, target: &str) -> Result<(), InitramfsError> {
        let path = normalize(guest)?;
        self.insert(path, Node::Symlink(target.to_owned()))
    }

    /// Adds a character device node (no root needed: it only exists in the archive).
    pub fn char_device(
        &mut self,
        guest: &str,
        major: u32,
        minor: u32,
        mode: u32,
    ) -> Result<(), InitramfsError> {
        let path = normalize(guest)?;
        self.insert(path, Node::CharDev { major, minor, mode })
    }

    /// Adds host program `host` at guest path `guest` (mode 0755) and every shared library it
    /// loads, each at its host path (so the dynamic loader finds them where `ldd` did).
    pub fn program_with_libraries(
        &mut self,
        guest: &str,
        host: &Path,
    ) -> Result<(), InitramfsError> {
        self.host_file(guest, host, 0o755)?;
        for lib in ldd::shared_libraries(host)? {
            let guest_lib = lib.to_string_lossy().into_owned();
            if matches!(self.get(&guest_lib), Some(Node::File { .. })) {
                continue;
            }
            // Copy the file the name resolves to; the guest gets a plain file at the name.
            let real = std::fs::canonicalize(&lib).map_err(|source| InitramfsError::ReadHost {
                host: lib.clone(),
                guest: guest_lib.clone(),
                source,
            })?;
            self.host_file(&guest_lib, &real, 0o755)?;
        }
        Ok(())
    }

    /// Adds a static busybox at `/bin/busybox` and a symlink for each of its applets at the
    /// path busybox itself proposes (`busybox --list-full`), unless something is already there.
    /// Returns the number of applet links added.
    pub fn busybox(&mut self, host: &Path) -> Result<usize, InitramfsError> {
        if !ldd::shared_libraries(host)?.is_empty() {
            return Err(InitramfsError::BusyboxNotStatic {
                path: host.to_owned(),
            });
        }
        self.host_file("/bin/busybox", host, 0o755)?;
        let out = Command::new(host)
            .arg("--list-full")
            .output()
            .map_err(|e| InitramfsError::BusyboxApplets {
                path: host.to_owned(),
                reason: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(InitramfsError::BusyboxApplets {
                path: host.to_owned(),
                reason: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        let mut added = 0;
        for applet in String::from_utf8_lossy(&out.stdout).lines().map(str::trim) {
            if applet.is_empty() || applet.ends_with("/busybox") || self.get(applet).is_some() {
                continue;
            }
            self.symlink(applet, "/bin/busybox")?;
            added += 1;
        }
        log::debug!("busybox {}: {added} applet links", host.display());
        Ok(added)
    }

    /// Writes the tree as a gzip-compressed newc cpio archive to `out`.
    pub fn write_gz<W: Write>(&self, out: W) -> Result<W, InitramfsError> {
        let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
        let mut cpio = CpioWriter::new(gz);
        for (path, node) in &self.nodes {
            match node {
                Node::Dir => cpio.append(
                    path,
                    Header {
                        mode: S_IFDIR | 0o755,
                        rdev: (0, 0),
                    },
                    &[],
                )?,
                Node::File { source, mode } => {
                    let header = Header {
                        mode: S_IFREG | mode,
                        rdev: (0, 0),
                    };
                    match source {
                        Source::Bytes(bytes) => cpio.append(path, header, bytes)?,
                        Source::Host(host) => {
                            let bytes =
                                std::fs::read(host).map_err(|source| InitramfsError::ReadHost {
                                    host: host.clone(),
                                    guest: path.clone(),
                                    source,
                                })?;
                            cpio.append(path, header, &bytes)?;
                        }
                    }
                }
                Node::Symlink(target) => cpio.append(
                    path,
                    Header {
                        mode: S_IFLNK | 0o777,
                        rdev: (0, 0),
                    },
                    target.as_bytes(),
                )?,
                Node::CharDev { major, minor, mode } => cpio.append(
                    path,
                    Header {
                        mode: S_IFCHR | mode,
                        rdev: (*major, *minor),
                    },
                    &[],
                )?,
            }
        }
        let gz = cpio.finish()?;
        gz.finish().map_err(InitramfsError::Gzip)
    }

    fn insert(&mut self, path: String, node: Node) -> Result<(), InitramfsError> {
        // Parents first: each must be (or become) a directory.
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            let parent = &path[..end + slash];
            match self.nodes.get(parent) {
                None => {
                    self.nodes.insert(parent.to_owned(), Node::Dir);
                }
                Some(Node::Dir) => {}
                Some(other) => {
                    return Err(InitramfsError::Conflict {
                        path: parent.to_owned(),
                        existing: other.kind(),
                        new: "directory",
                    })
                }
            }
            end += slash + 1;
        }
        match (self.nodes.get(&path), &node) {
            (Some(Node::Dir), Node::Dir) | (None, _) => {}
            (Some(existing), new) if matches!(existing, Node::Dir) != matches!(new, Node::Dir) => {
                return Err(InitramfsError::Conflict {
                    path,
                    existing: existing.kind(),
                    new: new.kind(),
                })
            }
            (Some(existing), _) => log::debug!("guest /{path}: {} replaced", existing.kind()),
        }
        self.nodes.insert(path, node);
        Ok(())
    }
}

/// `/a/b` and `a/b` → `a/b`; refuses empty, `.` and `..` components.
fn normalize(path: &str) -> Result<String, InitramfsError> {
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    let ok = !trimmed.is_empty()
        && trimmed
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(trimmed.to_owned())
    } else {
        Err(InitramfsError::BadPath {
            path: path.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn parents_are_created_and_ordered_before_children() {
        let mut fs = Initramfs::new();
        fs.bytes_file("/usr/local/bin/x", b"x".to_vec(), 0o755)
            .unwrap();
        fs.bytes_file("/init", b"#!/bin/sh\n".to_vec(), 0o755)
            .unwrap();
        fs.dir("/usr-other").unwrap();
        let paths: Vec<_> = fs.paths().collect();
        assert_eq!(
            paths,
            [
                "init",
                "usr",
                "usr-other",
                "usr/local",
                "usr/local/bin",
                "usr/local/bin/x"
            ]
        );
    }

    #[test]
    fn a_file_replaces_a_symlink_but_never_a_directory() {
        let mut fs = Initramfs::new();
        fs.symlink("/sbin/tc", "/bin/busybox").unwrap();
        fs.bytes_file("/sbin/tc", b"real tc".to_vec(), 0o755)
            .unwrap();
        assert!(matches!(fs.get("/sbin/tc"), Some(Node::File { .. })));
        let err = fs.bytes_file("/sbin", b"".to_vec(), 0o644).unwrap_err();
        assert!(matches!(
            err,
            InitramfsError::Conflict {
                existing: "directory",
                ..
            }
        ));
        let err = fs
            .bytes_file("/sbin/tc/inner", b"".to_vec(), 0o644)
            .unwrap_err();
        assert!(matches!(
            err,
            InitramfsError::Conflict {
                existing: "file",
                new: "directory",
                ..
            }
        ));
    }

    #[test]
    fn dot_dot_and_empty_paths_are_refused() {
        let mut fs = Initramfs::new();
        for bad in ["", "/", "/a/../b", "a//b", "./a"] {
            assert!(
                matches!(fs.dir(bad), Err(InitramfsError::BadPath { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn written_archive_is_gzip_of_newc_with_every_node() {
        let host = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(host.path(), b"from the host").unwrap();
        let mut fs = Initramfs::new();
        fs.char_device("/dev/console", 5, 1, 0o600).unwrap();
        fs.host_file("/files/data", host.path(), 0o644).unwrap();
        fs.symlink("/bin/sh", "/bin/busybox").unwrap();
        let gz = fs.write_gz(Vec::new()).unwrap();

        assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");
        let mut cpio = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut cpio)
            .unwrap();
        let text = String::from_utf8_lossy(&cpio);
        // Names appear in tree order, each after a newc header.
        let order: Vec<_> = [
            "bin\0",
            "bin/sh\0",
            "dev\0",
            "dev/console\0",
            "files\0",
            "files/data\0",
            "TRAILER!!!\0",
        ]
        .iter()
        .map(|name| {
            text.find(name)
                .unwrap_or_else(|| panic!("{name:?} missing"))
        })
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        assert!(text.contains("from the host"));
        assert_eq!(text.matches("070701").count(), 7, "6 nodes and the trailer");
    }

    #[test]
    fn missing_host_file_is_reported_with_both_paths() {
        let mut fs = Initramfs::new();
        fs.host_file("/bin/gone", Path::new("/nonexistent/vmtest-gone"), 0o755)
            .unwrap();
        let err = fs.write_gz(Vec::new()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/vmtest-gone") && msg.contains("/bin/gone"),
            "{msg}"
        );
    }

    #[test]
    fn static_busybox_gets_links_for_sh_and_mount() {
        let Ok(busybox) = crate::host::find_program("busybox", "busybox-static") else {
            eprintln!("skipping: busybox is not installed");
            return;
        };
        let mut fs = Initramfs::new();
        match fs.busybox(&busybox) {
            Err(InitramfsError::BusyboxNotStatic { .. }) => {
                eprintln!("skipping: {} is not the static busybox", busybox.display());
            }
            result => {
                let links = result.unwrap();
                assert!(links > 100, "{links} applets");
                assert_eq!(
                    fs.get("/bin/sh"),
                    Some(&Node::Symlink("/bin/busybox".to_owned()))
                );
                assert!(fs.get("/bin/mount").is_some());
            }
        }
    }
}
