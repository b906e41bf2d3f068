//! The shared libraries a dynamically linked host program needs in the guest, from `ldd`.
//!
//! Owns running `ldd` and reading its output; the libraries (and the dynamic loader, which
//! `ldd` lists by absolute path) are copied to the same paths in the guest by
//! [`crate::initramfs`].

use std::path::{Path, PathBuf};
use std::process::Command;

/// Errors resolving a program's libraries.
#[derive(Debug, thiserror::Error)]
pub enum LddError {
    /// `ldd` could not be run.
    #[error("running ldd on {binary}")]
    Spawn {
        /// The program inspected.
        binary: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `ldd` failed for another reason than a static binary.
    #[error("ldd {binary} failed: {stderr}")]
    Failed {
        /// The program inspected.
        binary: PathBuf,
        /// What ldd said.
        stderr: String,
    },
    /// A library the program needs is not installed on the host.
    #[error("{binary} needs {library}, which is not installed")]
    NotFound {
        /// The program inspected.
        binary: PathBuf,
        /// The missing library's soname.
        library: String,
    },
}

/// A library `ldd` lists as `not found` (what [`parse`] refuses).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("ldd lists {library} as not found")]
pub struct MissingLibrary {
    /// The library's soname.
    pub library: String,
}

/// Absolute paths of every shared library `binary` loads, the dynamic loader included; empty
/// for a statically linked program.
pub fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, LddError> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| LddError::Spawn {
            binary: binary.to_owned(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stderr.contains("not a dynamic executable")
            || stdout.contains("not a dynamic executable")
        {
            log::debug!("{} is statically linked", binary.display());
            return Ok(Vec::new());
        }
        return Err(LddError::Failed {
            binary: binary.to_owned(),
            stderr: stderr.trim().to_owned(),
        });
    }
    let libs = parse(&stdout).map_err(|MissingLibrary { library }| LddError::NotFound {
        binary: binary.to_owned(),
        library,
    })?;
    log::debug!(
        "{} needs {} libraries: {libs:?}",
        binary.display(),
        libs.len()
    );
    Ok(libs)
}

/// Reads `ldd` output: `name => /path (0x…)` and `/path/to/ld.so (0x…)` lines give paths; the
/// vDSO (no path) and `statically linked` give none; a `name => not found` is refused.
pub fn parse(output: &str) -> Result<Vec<PathBuf>, MissingLibrary> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim) {
        let target = match line.split_once("=>") {
            Some((name, rest)) => {
                let rest = rest.trim();
                if rest.starts_with("not found") {
                    return Err(MissingLibrary {
                        library: name.trim().to_owned(),
                    });
                }
                rest
            }
            None => line,
        };
        let path = target.split(" (").next().unwrap_or_default().trim();
        if path.starts_with('/') && !libs.iter().any(|l: &PathBuf| l == Path::new(path)) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const TC_LDD: &str = "\
\tlinux-vdso.so.1 (0x00007ff45f959000)
\tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007ff45f857000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007ff45f53a000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007ff45f95b000)
";

    #[test]
    fn parse_lists_libraries_and_loader_but_not_vdso() {
        let libs = parse(TC_LDD).unwrap();
        assert_eq!(
            libs,
            [
                "/lib/x86_64-linux-gnu/libbpf.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2",
            ]
            .map(PathBuf::from)
        );
    }

    #[test]
    fn parse_reports_a_missing_library_by_name() {
        let out =
            "\tlibfoo.so.3 => not found\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x1)\n";
        assert_eq!(
            parse(out),
            Err(MissingLibrary {
                library: "libfoo.so.3".to_owned()
            })
        );
    }

    #[test]
    fn parse_of_static_pie_output_is_empty() {
        assert_eq!(
            parse("\tstatically linked\n").unwrap(),
            Vec::<PathBuf>::new()
        );
    }

    #[test]
    fn ldd_of_a_dynamic_host_program_includes_libc_and_the_loader() {
        let Ok(ls) = crate::host::find_program("ls", "coreutils") else {
            return;
        };
        if crate::host::find_program("ldd", "libc-bin").is_err() {
            eprintln!("skipping: no ldd on this machine");
            return;
        }
        let libs = shared_libraries(&ls).unwrap();
        assert!(
            libs.iter()
                .any(|l| l.file_name().is_some_and(|n| n == "libc.so.6")),
            "{libs:?}"
        );
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
    }
}
