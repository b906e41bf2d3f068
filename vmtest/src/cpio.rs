//! The SVR4 "newc" cpio format, as the kernel's initramfs unpacker reads it
//! (Documentation/driver-api/early-userspace/buffer-format.rst).
//!
//! Owns the byte layout only: a 110-byte ASCII header of 13 eight-digit hex fields, the name
//! with its NUL, padding to 4 bytes, the data, padding to 4 bytes, and the `TRAILER!!!` record.
//! Owners, times and inode numbers are fixed (root, 0, a counter) so archives are reproducible.
//! What goes into the archive is decided by [`crate::initramfs`].

use std::io::{self, Write};

/// The file-type field of `st_mode`.
pub const S_IFMT: u32 = 0o170_000;
/// Directory (file-type bits of `st_mode`, as cpio stores them).
pub const S_IFDIR: u32 = 0o040_000;
/// Regular file.
pub const S_IFREG: u32 = 0o100_000;
/// Symbolic link; the data is the link target.
pub const S_IFLNK: u32 = 0o120_000;
/// Character device; `rdev` names it.
pub const S_IFCHR: u32 = 0o020_000;

const MAGIC: &[u8; 6] = b"070701";
const TRAILER: &str = "TRAILER!!!";

/// Errors while writing an archive.
#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    /// The underlying writer failed.
    #[error("writing cpio record for {name}")]
    Io {
        /// The record being written.
        name: String,
        /// The I/O error.
        source: io::Error,
    },
    /// A field does not fit the format's 32-bit hex fields.
    #[error("cpio record {name}: {field} {value} does not fit in 32 bits")]
    TooLarge {
        /// The record.
        name: String,
        /// Which header field.
        field: &'static str,
        /// The value that did not fit.
        value: u64,
    },
    /// Names must be non-empty, relative-or-absolute paths without NUL bytes.
    #[error("cpio record name {name:?} is empty or contains NUL")]
    BadName {
        /// The offending name.
        name: String,
    },
}

/// One record's metadata; the data is passed separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `st_mode`: file type bits | permission bits.
    pub mode: u32,
    /// Device numbers for [`S_IFCHR`] records (`rdevmajor`, `rdevminor`); 0 otherwise.
    pub rdev: (u32, u32),
}

/// Writes newc records to `W`, counting bytes so padding is right.
#[derive(Debug)]
pub struct CpioWriter<W: Write> {
    out: W,
    written: u64,
    next_ino: u32,
}

impl<W: Write> CpioWriter<W> {
    /// Starts an archive on `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            written: 0,
            next_ino: 1,
        }
    }

    /// Appends one record: `name` (no leading `/` needed), its header, and `data` (file
    /// contents, or the target of a symlink; empty for directories and devices).
    pub fn append(&mut self, name: &str, header: Header, data: &[u8]) -> Result<(), CpioError> {
        if name.is_empty() || name.contains('\0') {
            return Err(CpioError::BadName {
                name: name.to_owned(),
            });
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.record(name, ino, header, data)
    }

    /// Writes the trailer and returns the underlying writer.
    pub fn finish(mut self) -> Result<W, CpioError> {
        self.record(
            TRAILER,
            0,
            Header {
                mode: 0,
                rdev: (0, 0),
            },
            &[],
        )?;
        self.out.flush().map_err(|source| CpioError::Io {
            name: TRAILER.to_owned(),
            source,
        })?;
        Ok(self.out)
    }

    fn record(
        &mut self,
        name: &str,
        ino: u32,
        header: Header,
        data: &[u8],
    ) -> Result<(), CpioError> {
        let field = |field: &'static str, value: usize| {
            u32::try_from(value).map_err(|_| CpioError::TooLarge {
                name: name.to_owned(),
                field,
                value: value as u64,
            })
        };
        let filesize = field("filesize", data.len())?;
        let namesize = field("namesize", name.len() + 1)?;
        let nlink = if header.mode & S_IFMT == S_IFDIR {
            2
        } else {
            1
        };
        let mut head = String::with_capacity(110);
        head.push_str(std::str::from_utf8(MAGIC).expect("magic is ASCII"));
        // ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor,
        // rdevminor, namesize, check
        for value in [
            ino,
            header.mode,
            0,
            0,
            nlink,
            0,
            filesize,
            0,
            0,
            header.rdev.0,
            header.rdev.1,
            namesize,
            0,
        ] {
            head.push_str(&format!("{value:08X}"));
        }
        debug_assert_eq!(head.len(), 110);
        let io = |source| CpioError::Io {
            name: name.to_owned(),
            source,
        };
        self.put(head.as_bytes()).map_err(io)?;
        self.put(name.as_bytes()).map_err(io)?;
        self.put(&[0]).map_err(io)?;
        self.pad().map_err(io)?;
        self.put(data).map_err(io)?;
        self.pad().map_err(io)
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let rem = self.written % 4;
        if rem == 0 {
            return Ok(());
        }
        const ZEROS: [u8; 3] = [0; 3];
        // rem is 1..=3, so 4 - rem is 1..=3 and fits ZEROS.
        let len = usize::try_from(4 - rem).expect("padding is at most 3 bytes");
        self.put(&ZEROS[..len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(record: &[u8], index: usize) -> u32 {
        let start = 6 + index * 8;
        let text = std::str::from_utf8(&record[start..start + 8]).unwrap();
        u32::from_str_radix(text, 16).unwrap()
    }

    #[test]
    fn file_record_has_newc_header_name_and_padded_data() {
        let mut w = CpioWriter::new(Vec::new());
        w.append(
            "init",
            Header {
                mode: S_IFREG | 0o755,
                rdev: (0, 0),
            },
            b"#!/bin/sh\n",
        )
        .unwrap();
        let bytes = w.finish().unwrap();

        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(field(&bytes, 0), 1, "first inode");
        assert_eq!(field(&bytes, 1), 0o100_755, "mode");
        assert_eq!(field(&bytes, 4), 1, "nlink");
        assert_eq!(field(&bytes, 6), 10, "filesize");
        assert_eq!(field(&bytes, 11), 5, "namesize counts the NUL");
        // 110-byte header + "init\0" = 115, padded to 116; data 10 bytes padded to 12.
        assert_eq!(&bytes[110..116], b"init\0\0");
        assert_eq!(&bytes[116..126], b"#!/bin/sh\n");
        assert_eq!(&bytes[126..128], &[0, 0]);
        // Then the trailer record.
        assert_eq!(&bytes[128..134], b"070701");
        assert_eq!(&bytes[128 + 110..128 + 110 + 11], b"TRAILER!!!\0");
        assert_eq!(bytes.len() % 4, 0);
    }

    #[test]
    fn device_record_carries_rdev_and_no_data() {
        let mut w = CpioWriter::new(Vec::new());
        w.append(
            "dev/console",
            Header {
                mode: S_IFCHR | 0o600,
                rdev: (5, 1),
            },
            &[],
        )
        .unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(field(&bytes, 1), 0o020_600);
        assert_eq!(field(&bytes, 6), 0);
        assert_eq!((field(&bytes, 9), field(&bytes, 10)), (5, 1));
    }

    #[test]
    fn names_with_nul_or_empty_are_refused() {
        let mut w = CpioWriter::new(Vec::new());
        let h = Header {
            mode: S_IFREG | 0o644,
            rdev: (0, 0),
        };
        assert!(matches!(
            w.append("", h, &[]),
            Err(CpioError::BadName { .. })
        ));
        assert!(matches!(
            w.append("a\0b", h, &[]),
            Err(CpioError::BadName { .. })
        ));
    }

    /// GNU cpio is the reference reader: what it extracts must be exactly what was written.
    #[test]
    fn gnu_cpio_extracts_files_dirs_and_symlinks_byte_for_byte() {
        let Ok(status) = std::process::Command::new("cpio").arg("--version").output() else {
            eprintln!("skipping: no cpio tool on this machine");
            return;
        };
        assert!(status.status.success());
        let mut w = CpioWriter::new(Vec::new());
        let dir = Header {
            mode: S_IFDIR | 0o755,
            rdev: (0, 0),
        };
        w.append("bin", dir, &[]).unwrap();
        w.append(
            "bin/tool",
            Header {
                mode: S_IFREG | 0o755,
                rdev: (0, 0),
            },
            b"\x7fELF odd len",
        )
        .unwrap();
        w.append(
            "bin/alias",
            Header {
                mode: S_IFLNK | 0o777,
                rdev: (0, 0),
            },
            b"tool",
        )
        .unwrap();
        w.append("etc", dir, &[]).unwrap();
        w.append(
            "etc/empty",
            Header {
                mode: S_IFREG | 0o644,
                rdev: (0, 0),
            },
            b"",
        )
        .unwrap();
        let archive = w.finish().unwrap();

        let out = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("cpio")
            .args(["-i", "-d", "--quiet", "--no-absolute-filenames"])
            .current_dir(out.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&archive).unwrap();
        assert!(child.wait().unwrap().success());

        assert_eq!(
            std::fs::read(out.path().join("bin/tool")).unwrap(),
            b"\x7fELF odd len"
        );
        assert_eq!(
            std::fs::read_link(out.path().join("bin/alias"))
                .unwrap()
                .to_str(),
            Some("tool")
        );
        assert_eq!(std::fs::read(out.path().join("etc/empty")).unwrap(), b"");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(out.path().join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
    }
}
