//! What the host provides for a VM run: the guest kernel (the newest Debian
//! `/boot/vmlinuz-<series>.*-cloud-amd64` of the chosen series, its headers and its modules) and
//! the programs vmtest calls.
//!
//! The host's running kernel is never consulted (no `uname -r`): the guest kernel is whatever
//! `linux-image-cloud-amd64` installed, whatever the host runs. Two series are tested: Debian 12's
//! 6.1 (the default) and 6.12 from bookworm-backports (Debian 13's kernel). The series is chosen by
//! `vmtest run --kernel 6.12` or, for every test and benchmark at once, by the environment
//! variable [`GUEST_KERNEL_ENV`] (`TRAPVEC_GUEST_KERNEL=6.12 cargo test ...`); either may also be
//! the path of a `vmlinuz-<version>`.

use std::cmp::Ordering;
use std::env;
use std::path::{Path, PathBuf};

/// Where Debian installs kernels.
pub const BOOT_DIR: &str = "/boot";
/// Where Debian installs kernel headers (`linux-headers-<version>`).
pub const HEADERS_DIR: &str = "/usr/src";
/// Where Debian installs kernel modules (`<version>/kernel/...`).
pub const MODULES_DIR: &str = "/lib/modules";
/// The flavour whose kernels vmtest boots.
pub const FLAVOUR_SUFFIX: &str = "-cloud-amd64";
/// The kernel series booted unless another is asked for: Debian 12's.
pub const DEFAULT_SERIES: &str = "6.1";
/// The environment variable that picks the guest kernel for every test: a series (`6.1`,
/// `6.12`) or the path of a `vmlinuz-<version>`.
pub const GUEST_KERNEL_ENV: &str = "TRAPVEC_GUEST_KERNEL";

/// What [`GUEST_KERNEL_ENV`] asks for, else [`DEFAULT_SERIES`].
pub fn guest_kernel() -> String {
    env::var(GUEST_KERNEL_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_SERIES.to_owned())
}

/// Does the kernel release `version` belong to `series` (`6.1` holds `6.1.0-56-cloud-amd64`,
/// not `6.12.95+deb12-cloud-amd64`)?
pub fn in_series(version: &str, series: &str) -> bool {
    version
        .strip_prefix(series)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-', '+']))
}

/// Errors finding the guest kernel or a program.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No `vmlinuz-<series>*-cloud-amd64` in the boot directory.
    #[error("no kernel vmlinuz-{series}*{FLAVOUR_SUFFIX} in {dir} (install linux-image-cloud-amd64; for 6.12 run .ci/install-deps --kernel 6.12)")]
    NoKernel {
        /// The directory searched.
        dir: PathBuf,
        /// The series asked for.
        series: String,
    },
    /// A kernel was named whose file name is not `vmlinuz-<version>`.
    #[error("{path} is not named vmlinuz-<version>, so its headers and modules cannot be found")]
    NotAKernelName {
        /// The path given.
        path: PathBuf,
    },
    /// The kernel file does not exist.
    #[error("kernel image {path} does not exist")]
    MissingKernel {
        /// The path given.
        path: PathBuf,
    },
    /// The kernel's headers are not installed.
    #[error("headers for kernel {version} are not installed at {path} (install linux-headers-{version})")]
    MissingHeaders {
        /// Kernel version.
        version: String,
        /// Where they were expected.
        path: PathBuf,
    },
    /// The kernel's modules are not installed.
    #[error("modules for kernel {version} are not installed at {path}")]
    MissingModules {
        /// Kernel version.
        version: String,
        /// Where they were expected.
        path: PathBuf,
    },
    /// A program is not on `PATH`.
    #[error("{program} is not installed (not found on PATH); {hint}")]
    ProgramNotFound {
        /// The program.
        program: String,
        /// Which package provides it.
        hint: &'static str,
    },
    /// Reading a directory failed.
    #[error("reading {dir}")]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// One installed kernel: image, headers and modules of the same version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInstall {
    /// The release string, e.g. `6.1.0-56-cloud-amd64`.
    pub version: String,
    /// `/boot/vmlinuz-<version>`.
    pub vmlinuz: PathBuf,
    /// `/usr/src/linux-headers-<version>`, the directory to `make -C` for external builds.
    pub headers: PathBuf,
    /// `/lib/modules/<version>`.
    pub modules: PathBuf,
}

impl KernelInstall {
    /// The guest kernel [`guest_kernel`] names (by default the newest 6.1
    /// `vmlinuz-*-cloud-amd64` in [`BOOT_DIR`]), with its headers and modules.
    pub fn newest() -> Result<Self, HostError> {
        Self::choose(&guest_kernel())
    }

    /// A series (`6.12`: its newest image in [`BOOT_DIR`]) or the path of a `vmlinuz-<version>`.
    pub fn choose(kernel: &str) -> Result<Self, HostError> {
        let image = if kernel.contains('/') {
            PathBuf::from(kernel)
        } else {
            newest_image_of(Path::new(BOOT_DIR), kernel)?
        };
        Self::for_image(&image, Path::new(HEADERS_DIR), Path::new(MODULES_DIR))
    }

    /// The install that `image` (a `vmlinuz-<version>`) belongs to, with headers under
    /// `headers_root` and modules under `modules_root`.
    pub fn for_image(
        image: &Path,
        headers_root: &Path,
        modules_root: &Path,
    ) -> Result<Self, HostError> {
        if !image.is_file() {
            return Err(HostError::MissingKernel {
                path: image.to_owned(),
            });
        }
        let version = image
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("vmlinuz-"))
            .filter(|v| !v.is_empty())
            .ok_or_else(|| HostError::NotAKernelName {
                path: image.to_owned(),
            })?
            .to_owned();
        let headers = headers_root.join(format!("linux-headers-{version}"));
        if !headers.join("Makefile").is_file() {
            return Err(HostError::MissingHeaders {
                version,
                path: headers,
            });
        }
        let modules = modules_root.join(&version);
        if !modules.join("modules.dep").is_file() {
            return Err(HostError::MissingModules {
                version,
                path: modules,
            });
        }
        log::debug!(
            "guest kernel {version}: {} (headers {})",
            image.display(),
            headers.display()
        );
        Ok(Self {
            version,
            vmlinuz: image.to_owned(),
            headers,
            modules,
        })
    }
}

/// The guest kernel's image in `dir`: [`guest_kernel`]'s path, or the newest of its series.
pub fn newest_image(dir: &Path) -> Result<PathBuf, HostError> {
    let kernel = guest_kernel();
    if kernel.contains('/') {
        return Ok(PathBuf::from(kernel));
    }
    newest_image_of(dir, &kernel)
}

/// The `vmlinuz-<series>*-cloud-amd64` in `dir` with the highest version.
pub fn newest_image_of(dir: &Path, series: &str) -> Result<PathBuf, HostError> {
    let entries = std::fs::read_dir(dir).map_err(|source| HostError::ReadDir {
        dir: dir.to_owned(),
        source,
    })?;
    let mut best: Option<(String, PathBuf)> = None;
    for entry in entries {
        let entry = entry.map_err(|source| HostError::ReadDir {
            dir: dir.to_owned(),
            source,
        })?;
        let name = entry.file_name();
        let Some(version) = name
            .to_str()
            .and_then(|n| n.strip_prefix("vmlinuz-"))
            .filter(|v| v.ends_with(FLAVOUR_SUFFIX) && in_series(v, series))
        else {
            continue;
        };
        if best
            .as_ref()
            .is_none_or(|(b, _)| compare_versions(version, b) == Ordering::Greater)
        {
            best = Some((version.to_owned(), entry.path()));
        }
    }
    best.map(|(_, path)| path)
        .ok_or_else(|| HostError::NoKernel {
            dir: dir.to_owned(),
            series: series.to_owned(),
        })
}

/// Orders kernel release strings as `sort -V` does: runs of digits compare as numbers, the rest
/// as text, so `6.1.0-9` < `6.1.0-56` < `6.10.0-1`.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a, b);
    loop {
        match (a.is_empty(), b.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            (false, false) => {}
        }
        let a_digit = a.starts_with(|c: char| c.is_ascii_digit());
        let b_digit = b.starts_with(|c: char| c.is_ascii_digit());
        // Length of the leading run of digits (or of non-digits).
        let run = |s: &str, digits: bool| {
            s.find(|c: char| c.is_ascii_digit() != digits)
                .unwrap_or(s.len())
        };
        let (la, lb) = (run(a, a_digit), run(b, b_digit));
        let (ta, tb) = (&a[..la], &b[..lb]);
        let order = match (a_digit, b_digit) {
            (true, true) => {
                let (ta, tb) = (ta.trim_start_matches('0'), tb.trim_start_matches('0'));
                ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb))
            }
            // A number sorts after text at the same position (as in `sort -V`'s ~-less cases).
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => ta.cmp(tb),
        };
        if order != Ordering::Equal {
            return order;
        }
        a = &a[la..];
        b = &b[lb..];
    }
}

/// The first `program` on `PATH`, or an error naming the package that provides it.
pub fn find_program(program: &str, hint: &'static str) -> Result<PathBuf, HostError> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| HostError::ProgramNotFound {
            program: program.to_owned(),
            hint,
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically_per_component() {
        assert_eq!(
            compare_versions("6.1.0-9-cloud-amd64", "6.1.0-56-cloud-amd64"),
            Ordering::Less
        );
        assert_eq!(
            compare_versions("6.10.0-1-cloud-amd64", "6.1.0-56-cloud-amd64"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.1.0-56-cloud-amd64", "6.1.0-56-cloud-amd64"),
            Ordering::Equal
        );
        assert_eq!(compare_versions("6.1.0-056", "6.1.0-56"), Ordering::Equal);
        assert_eq!(compare_versions("6.1", "6.1.0"), Ordering::Less);
    }

    #[test]
    fn newest_image_picks_highest_cloud_kernel_and_ignores_other_flavours() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "vmlinuz-6.1.0-9-cloud-amd64",
            "vmlinuz-6.1.0-56-cloud-amd64",
            "vmlinuz-6.12.0-1-amd64",
            "config-6.1.0-99-cloud-amd64",
            "initrd.img-6.1.0-99-cloud-amd64",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let found = newest_image_of(dir.path(), "6.1").unwrap();
        assert_eq!(found, dir.path().join("vmlinuz-6.1.0-56-cloud-amd64"));
    }

    #[test]
    fn a_series_picks_its_own_kernels_only() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "vmlinuz-6.1.0-56-cloud-amd64",
            "vmlinuz-6.12.95+deb12-cloud-amd64",
            "vmlinuz-6.12.9+deb12-cloud-amd64",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(
            newest_image_of(dir.path(), "6.1").unwrap(),
            dir.path().join("vmlinuz-6.1.0-56-cloud-amd64")
        );
        assert_eq!(
            newest_image_of(dir.path(), "6.12").unwrap(),
            dir.path().join("vmlinuz-6.12.95+deb12-cloud-amd64")
        );
        let err = newest_image_of(dir.path(), "6.6").unwrap_err();
        assert!(
            err.to_string().contains("vmlinuz-6.6*-cloud-amd64"),
            "{err}"
        );
        assert!(
            in_series("6.1.0-56-cloud-amd64", "6.1")
                && !in_series("6.12.95+deb12-cloud-amd64", "6.1")
        );
    }

    #[test]
    fn newest_image_without_cloud_kernel_names_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vmlinuz-6.12.0-1-amd64"), b"").unwrap();
        let err = newest_image_of(dir.path(), "6.1").unwrap_err();
        assert!(matches!(err, HostError::NoKernel { .. }));
        assert!(err.to_string().contains(&dir.path().display().to_string()));
    }

    #[test]
    fn install_requires_matching_headers_and_modules() {
        let root = tempfile::tempdir().unwrap();
        let boot = root.path().join("boot");
        let src = root.path().join("src");
        let lib = root.path().join("modules");
        std::fs::create_dir_all(&boot).unwrap();
        let image = boot.join("vmlinuz-6.1.0-56-cloud-amd64");
        std::fs::write(&image, b"").unwrap();

        let err = KernelInstall::for_image(&image, &src, &lib).unwrap_err();
        assert!(
            matches!(err, HostError::MissingHeaders { ref version, .. } if version == "6.1.0-56-cloud-amd64")
        );

        let headers = src.join("linux-headers-6.1.0-56-cloud-amd64");
        std::fs::create_dir_all(&headers).unwrap();
        std::fs::write(headers.join("Makefile"), b"").unwrap();
        let err = KernelInstall::for_image(&image, &src, &lib).unwrap_err();
        assert!(matches!(err, HostError::MissingModules { .. }));

        let modules = lib.join("6.1.0-56-cloud-amd64");
        std::fs::create_dir_all(&modules).unwrap();
        std::fs::write(modules.join("modules.dep"), b"").unwrap();
        let install = KernelInstall::for_image(&image, &src, &lib).unwrap();
        assert_eq!(install.version, "6.1.0-56-cloud-amd64");
        assert_eq!(install.headers, headers);
        assert_eq!(install.modules, modules);
    }
}
