//! Building what a guest needs from the repository: the trapvec module and the kernel
//! components (through the guest kernel's Kbuild), `trapctl` (release, through cargo) and the
//! static test helpers in `vmtest/helpers/*.c`.
//!
//! Build output goes to stderr so that stdout carries only the guest console. Concurrent vmtest
//! runs (parallel tests) serialize their builds on a lock file in the target directory: Kbuild
//! in one directory is not safe to run twice at once.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use nix::fcntl::{Flock, FlockArg};

use crate::host::KernelInstall;

/// Errors building guest artifacts.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// kmod/ has no Kbuild (or Makefile) yet.
    #[error(
        "the trapvec module cannot be built: {dir} has no Kbuild or Makefile yet \
         (boot without the module with --no-load)"
    )]
    NoModuleSource {
        /// The module's directory.
        dir: PathBuf,
    },
    /// A build command could not be started.
    #[error("{what}: cannot run `{command}`")]
    Spawn {
        /// What was being built.
        what: String,
        /// The command line.
        command: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A build command failed.
    #[error("{what}: `{command}` failed ({status}); its output is above")]
    Failed {
        /// What was being built.
        what: String,
        /// The command line.
        command: String,
        /// How it ended.
        status: ExitStatus,
    },
    /// A build succeeded but its product is not where it should be.
    #[error("{what}: build succeeded but {path} does not exist")]
    MissingOutput {
        /// What was being built.
        what: String,
        /// The expected product.
        path: PathBuf,
    },
    /// Cargo's JSON output did not say where something is.
    #[error("cargo {what}: {reason}")]
    Cargo {
        /// Which cargo call.
        what: &'static str,
        /// What was wrong with its output.
        reason: String,
    },
    /// A file-system operation failed.
    #[error("{path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The build lock could not be taken.
    #[error("locking {path}: {errno}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        errno: nix::errno::Errno,
    },
}

/// Builds guest artifacts from the repository at `repo` against the guest kernel.
#[derive(Debug)]
pub struct Builder<'k> {
    repo: PathBuf,
    kernel: &'k KernelInstall,
    target_dir: PathBuf,
}

/// Held while building; dropping it lets the next vmtest build.
#[derive(Debug)]
pub struct BuildLock {
    _lock: Flock<File>,
}

impl<'k> Builder<'k> {
    /// A builder for the workspace at `repo`; asks cargo where its target directory is.
    /// `repo` is made absolute first: Kbuild runs in the headers' directory, where a relative
    /// `M=` would name the wrong place.
    pub fn new(repo: &Path, kernel: &'k KernelInstall) -> Result<Self, BuildError> {
        let repo = &std::path::absolute(repo).unwrap_or_else(|_| repo.to_owned());
        let out = cargo()
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(repo)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|source| BuildError::Spawn {
                what: "locating the target directory".into(),
                command: "cargo metadata".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(BuildError::Failed {
                what: "locating the target directory".into(),
                command: "cargo metadata".into(),
                status: out.status,
            });
        }
        let meta: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| BuildError::Cargo {
                what: "metadata",
                reason: e.to_string(),
            })?;
        let target_dir = meta["target_directory"]
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| BuildError::Cargo {
                what: "metadata",
                reason: "no target_directory".into(),
            })?;
        log::debug!(
            "repository {}, target directory {}",
            repo.display(),
            target_dir.display()
        );
        Ok(Self {
            repo: repo.to_owned(),
            kernel,
            target_dir,
        })
    }

    /// `<target>/vmtest`: where vmtest keeps what it builds (helpers, the stripped trapctl).
    pub fn work_dir(&self) -> PathBuf {
        self.target_dir.join("vmtest")
    }

    /// Takes the build lock (blocking until other vmtest builds are done).
    pub fn lock(&self) -> Result<BuildLock, BuildError> {
        let dir = self.work_dir();
        std::fs::create_dir_all(&dir).map_err(|source| BuildError::Io {
            path: dir.clone(),
            source,
        })?;
        let path = dir.join("build.lock");
        let file = File::create(&path).map_err(|source| BuildError::Io {
            path: path.clone(),
            source,
        })?;
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| BuildError::Lock { path, errno })?;
        Ok(BuildLock { _lock: lock })
    }

    /// Builds `kmod/trapvec.ko` with `make -C <headers> M=<repo>/kmod modules`.
    pub fn module(&self) -> Result<PathBuf, BuildError> {
        let dir = self.repo.join("kmod");
        if !dir.join("Kbuild").is_file() && !dir.join("Makefile").is_file() {
            return Err(BuildError::NoModuleSource { dir });
        }
        self.kbuild("the trapvec module", &dir, &["modules"])?;
        expect_output("the trapvec module", dir.join("trapvec.ko"))
    }

    /// Builds the out-of-tree module in `dir` (its own Kbuild) against the guest kernel and
    /// returns `dir/<name>.ko`: a benchmark peer such as `vmtest/peers/livepatch`.
    pub fn external_module(&self, dir: &Path, name: &str) -> Result<PathBuf, BuildError> {
        let what = format!("module {name}");
        self.kbuild(&what, dir, &["modules"])?;
        expect_output(&what, dir.join(format!("{name}.ko")))
    }

    /// Builds every `components/*.c` into `components/*.o` with the kernel's flags (through
    /// `components/Kbuild`); returns the objects, sorted by name.
    pub fn components(&self) -> Result<Vec<PathBuf>, BuildError> {
        let dir = self.repo.join("components");
        let sources = files_with_extension(&dir, "c")?;
        if sources.is_empty() {
            log::debug!("no components in {}", dir.display());
            return Ok(Vec::new());
        }
        self.kbuild("kernel components", &dir, &[])?;
        sources
            .iter()
            .map(|src| expect_output("kernel components", src.with_extension("o")))
            .collect()
    }

    /// Builds `trapctl` in release mode and returns a copy without debug info (the initramfs
    /// is unpacked in guest RAM; symbols stay for backtraces).
    pub fn trapctl(&self) -> Result<PathBuf, BuildError> {
        let mut cmd = cargo();
        cmd.args([
            "build",
            "--release",
            "-p",
            "trapctl",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(&self.repo)
        .stderr(Stdio::inherit());
        let command = describe(&cmd);
        log::debug!("running {command}");
        let out = cmd.output().map_err(|source| BuildError::Spawn {
            what: "trapctl".into(),
            command: command.clone(),
            source,
        })?;
        if !out.status.success() {
            return Err(BuildError::Failed {
                what: "trapctl".into(),
                command,
                status: out.status,
            });
        }
        let exe = trapctl_executable(&String::from_utf8_lossy(&out.stdout))?;
        let stripped = self.work_dir().join("trapctl");
        let mut strip = Command::new("strip");
        strip
            .arg("--strip-debug")
            .arg("-o")
            .arg(&stripped)
            .arg(&exe);
        run(&mut strip, "stripping trapctl")?;
        expect_output("trapctl", stripped)
    }

    /// Compiles each `vmtest/helpers/*.c` with `cc -static -O2` into `<target>/vmtest/helpers/`.
    pub fn helpers(&self) -> Result<Vec<PathBuf>, BuildError> {
        let src_dir = self.repo.join("vmtest").join("helpers");
        let out_dir = self.work_dir().join("helpers");
        std::fs::create_dir_all(&out_dir).map_err(|source| BuildError::Io {
            path: out_dir.clone(),
            source,
        })?;
        let cc = std::env::var_os("CC").unwrap_or_else(|| OsString::from("cc"));
        let mut built = Vec::new();
        for src in files_with_extension(&src_dir, "c")? {
            let name = src.file_stem().map(OsString::from).unwrap_or_default();
            let out = out_dir.join(&name);
            let mut cmd = Command::new(&cc);
            cmd.args(["-static", "-O2", "-Wall", "-Wextra", "-o"])
                .arg(&out)
                .arg(&src);
            run(&mut cmd, &format!("helper {}", name.to_string_lossy()))?;
            built.push(expect_output("helpers", out)?);
        }
        Ok(built)
    }

    fn kbuild(&self, what: &str, dir: &Path, targets: &[&str]) -> Result<(), BuildError> {
        let mut cmd = Command::new("make");
        // A make above us (`make test`) must not leak its jobserver or variables (V=1, ...)
        // into Kbuild.
        for var in ["MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"] {
            cmd.env_remove(var);
        }
        cmd.arg("-C")
            .arg(&self.kernel.headers)
            .arg(format!("M={}", dir.display()))
            .arg("-j2");
        cmd.args(targets);
        run(&mut cmd, what)
    }
}

/// Builds the benchmark peers of `<repo>/vmtest/peers/` that `vmtest/scenarios/peers.sh` takes
/// with `--file`: `fentry_count` and `kmulti_count` (static, with libbpf, libelf and zlib:
/// libbpf-dev, libelf-dev, zlib1g-dev) into `out`, the livepatch module `tv_lp_mss.ko` and the per-call bench module
/// `tv_mss_bench.ko` (Kbuild against `kernel`'s headers, each in its own directory, under
/// vmtest's build lock, then copied into `out`). Returns their paths.
pub fn peers(repo: &Path, kernel: &KernelInstall, out: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let builder = Builder::new(repo, kernel)?;
    let src = builder.repo.join("vmtest").join("peers");
    let fentry = out.join("fentry_count");
    let cc = std::env::var_os("CC").unwrap_or_else(|| OsString::from("cc"));
    let mut cmd = Command::new(&cc);
    cmd.args(["-static", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&fentry)
        .arg(src.join("fentry_count.c"))
        .args(["-lbpf", "-lelf", "-lz"]);
    run(
        &mut cmd,
        "peer fentry_count (needs libbpf-dev, libelf-dev, zlib1g-dev)",
    )?;
    let fentry = expect_output("peer fentry_count", fentry)?;
    // The kprobe_multi loader, the same way (it runs only where the kernel has CONFIG_FPROBE).
    let kmulti = out.join("kmulti_count");
    let mut cmd = Command::new(&cc);
    cmd.args(["-static", "-O2", "-Wall", "-Wextra", "-o"])
        .arg(&kmulti)
        .arg(src.join("kmulti_count.c"))
        .args(["-lbpf", "-lelf", "-lz"]);
    run(
        &mut cmd,
        "peer kmulti_count (needs libbpf-dev, libelf-dev, zlib1g-dev)",
    )?;
    let kmulti = expect_output("peer kmulti_count", kmulti)?;
    let _lock = builder.lock()?;
    let livepatch = builder.external_module(&src.join("livepatch"), "tv_lp_mss")?;
    let livepatch = copy_into(&livepatch, out)?;
    let mss_bench = builder.external_module(&src.join("mssbench"), "tv_mss_bench")?;
    let mss_bench = copy_into(&mss_bench, out)?;
    Ok(vec![fentry, kmulti, livepatch, mss_bench])
}

/// Copies `file` into the directory `out` (same name), written aside and renamed into place,
/// and returns the copy. A module's Kbuild directory is shared by every kernel: a test that
/// boots one kernel takes the copy made under the build lock, which a build for the other
/// kernel (the 6.1 and 6.12 tests of one binary run in parallel) cannot overwrite.
pub fn copy_into(file: &Path, out: &Path) -> Result<PathBuf, BuildError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| BuildError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let name = file.file_name().ok_or_else(|| BuildError::Io {
        path: file.to_owned(),
        source: std::io::Error::other("no file name"),
    })?;
    let dest = out.join(name);
    let aside = out.join(format!(
        ".{}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::copy(file, &aside).map_err(io(file))?;
    std::fs::rename(&aside, &dest).map_err(io(&dest))?;
    Ok(dest)
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

/// The `executable` of trapctl's `compiler-artifact` message in cargo's JSON output.
fn trapctl_executable(json_lines: &str) -> Result<PathBuf, BuildError> {
    for line in json_lines.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "trapctl" {
            if let Some(exe) = msg["executable"].as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    Err(BuildError::Cargo {
        what: "build -p trapctl",
        reason: "no trapctl executable in its output".into(),
    })
}

/// Runs a build command with its stdout sent to our stderr.
fn run(cmd: &mut Command, what: &str) -> Result<(), BuildError> {
    let command = describe(cmd);
    log::debug!("running {command}");
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| BuildError::Spawn {
            what: what.to_owned(),
            command: command.clone(),
            source,
        })?;
    let status = cmd
        .stdout(Stdio::from(stderr))
        .status()
        .map_err(|source| BuildError::Spawn {
            what: what.to_owned(),
            command: command.clone(),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(BuildError::Failed {
            what: what.to_owned(),
            command,
            status,
        })
    }
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn expect_output(what: &str, path: PathBuf) -> Result<PathBuf, BuildError> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(BuildError::MissingOutput {
            what: what.to_owned(),
            path,
        })
    }
}

/// The files `dir/*.<ext>`, sorted; an absent directory has none.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, BuildError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(BuildError::Io {
                path: dir.to_owned(),
                source,
            })
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| BuildError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        if path.is_file() && path.extension().is_some_and(|e| e == ext) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trapctl_path_comes_from_its_compiler_artifact_message() {
        let out = r#"{"reason":"compiler-artifact","target":{"name":"trapvec","kind":["lib"]},"executable":null}
{"reason":"compiler-artifact","target":{"name":"trapctl","kind":["bin"]},"executable":"/t/release/trapctl"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            trapctl_executable(out).unwrap(),
            PathBuf::from("/t/release/trapctl")
        );
    }

    #[test]
    fn missing_trapctl_artifact_is_an_error() {
        let out = r#"{"reason":"build-finished","success":true}"#;
        assert!(matches!(
            trapctl_executable(out),
            Err(BuildError::Cargo { .. })
        ));
    }

    #[test]
    fn sources_are_listed_sorted_and_only_with_the_extension() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.c", "a.c", "a.o", "README.md"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("include.c")).unwrap();
        let found = files_with_extension(dir.path(), "c").unwrap();
        assert_eq!(found, [dir.path().join("a.c"), dir.path().join("b.c")]);
        assert!(files_with_extension(&dir.path().join("absent"), "c")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn module_without_kbuild_says_so_and_suggests_no_load() {
        let repo = tempfile::tempdir().unwrap();
        std::fs::create_dir(repo.path().join("kmod")).unwrap();
        let kernel = KernelInstall {
            version: "6.1.0-56-cloud-amd64".into(),
            vmlinuz: "/boot/vmlinuz-6.1.0-56-cloud-amd64".into(),
            headers: "/usr/src/linux-headers-6.1.0-56-cloud-amd64".into(),
            modules: "/lib/modules/6.1.0-56-cloud-amd64".into(),
        };
        let builder = Builder {
            repo: repo.path().to_owned(),
            kernel: &kernel,
            target_dir: repo.path().join("target"),
        };
        let err = builder.module().unwrap_err();
        assert!(matches!(err, BuildError::NoModuleSource { .. }));
        assert!(err.to_string().contains("--no-load"));
    }
}
