//! One `vmtest run`: find the guest kernel and host tools, build the repository's guest
//! artifacts, lay out the guest's file system, boot it, and turn what the console said into a
//! verdict and an exit code.
//!
//! Guest layout (documented in README.md, "Running against a real kernel (vmtest)"):
//!
//! | guest path | what |
//! |---|---|
//! | `/init` | [`crate::init`] |
//! | `/scenario.sh` | the scenario, run as root by `/bin/sh` |
//! | `/lib/scenario.sh` | what scenarios share (`vmtest/scenarios/lib/scenario.sh`: `refuse`, `addr`, `fastest_rounds`) |
//! | `/trapvec.ko` | the module (absent only with `--no-load` when it cannot be built) |
//! | `/bin/trapctl` | release trapctl (libraries at their host paths) |
//! | `/bin/<helper>` | static helpers from `vmtest/helpers/*.c` (`tcpmss`) |
//! | `/components/*.o` | kernel components from `components/*.c` |
//! | `/files/<name>` | each `--file` |
//! | `/bin/busybox` + applet links, `/sbin/tc` (iproute2) | tools |
//! | `/lib/modules/<version>/…` | `sch_netem` (and `--with-module`s) with a trimmed modules.dep |

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::build::{BuildError, Builder};
use crate::host::{self, HostError, KernelInstall};
use crate::init::{self, paths, InitOptions};
use crate::initramfs::{Initramfs, InitramfsError};
use crate::kmods::{KmodError, ModulesDep, DEFAULT_MODULES};
use crate::monitor::{VcpuState, SAMPLES, SAMPLE_GAP};
use crate::qemu::{self, Boot, Outcome, QemuConfig, QemuError};
use crate::systemd::{self, SystemdError, SystemdGuest};

/// Exit code for a run that timed out (as coreutils `timeout` uses).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit code when the guest died without a verdict, or the kernel reported a problem during a
/// scenario that itself succeeded.
pub const EXIT_KERNEL_FAILURE: i32 = 1;

/// Everything that can stop a run before the guest reports.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The scenario script does not exist.
    #[error("scenario {path} is not a file")]
    NoScenario {
        /// The path given.
        path: PathBuf,
    },
    /// A `--file` does not exist or is not a regular file.
    #[error("--file {path} is not a file")]
    NoFile {
        /// The path given.
        path: PathBuf,
    },
    /// Two `--file`s would land at the same `/files/<name>`.
    #[error("--file {first} and --file {second} both become /files/{name}")]
    DuplicateFile {
        /// The guest name.
        name: String,
        /// The first path.
        first: PathBuf,
        /// The second path.
        second: PathBuf,
    },
    /// The guest kernel or a host program is missing.
    #[error(transparent)]
    Host(#[from] HostError),
    /// Building an artifact failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The guest kernel's modules could not be resolved.
    #[error(transparent)]
    Kmod(#[from] KmodError),
    /// Laying out or writing the initramfs failed.
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    /// Writing the initramfs file failed.
    #[error("writing the initramfs to {path}")]
    WriteInitramfs {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Reading a host file (modules.dep) failed.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// QEMU could not be run.
    #[error(transparent)]
    Qemu(#[from] QemuError),
    /// The systemd guest could not be laid out.
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

/// What `vmtest run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The repository (workspace root) to build from.
    pub repo: PathBuf,
    /// The scenario script.
    pub scenario: PathBuf,
    /// Files copied to `/files/<name>`.
    pub files: Vec<PathBuf>,
    /// Limit for boot + scenario + power-off.
    pub timeout: Duration,
    /// `insmod /trapvec.ko` before the scenario.
    pub load_module: bool,
    /// The kernel to boot; `None`: the newest `/boot/vmlinuz-*-cloud-amd64`.
    pub kernel: Option<PathBuf>,
    /// Keep the initramfs at this path (otherwise it is a temporary file).
    pub keep_initramfs: Option<PathBuf>,
    /// Extra kernel command-line words.
    pub append: Vec<String>,
    /// Extra QEMU arguments (after vmtest's own).
    pub qemu_args: Vec<String>,
    /// Guest kernel modules to pack besides [`DEFAULT_MODULES`].
    pub extra_modules: Vec<String>,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct Report {
    /// What the boot produced.
    pub boot: Boot,
    /// The guest kernel's version.
    pub kernel_version: String,
    /// On a timeout: where each vCPU was ([`describe_vcpus`]), its kernel addresses named by
    /// the guest's own kallsyms; empty otherwise.
    pub vcpus: Vec<String>,
}

impl Report {
    /// The process exit code: the scenario's status when it ran cleanly; [`EXIT_TIMEOUT`] on a
    /// timeout; [`EXIT_KERNEL_FAILURE`] when the guest died without a verdict or the kernel
    /// reported a problem during a scenario that exited 0 (a failing scenario keeps its status).
    pub fn exit_code(&self) -> i32 {
        match self.boot.outcome {
            Outcome::Finished { status } if self.boot.problems.is_empty() => status,
            Outcome::Finished { status: 0 } => EXIT_KERNEL_FAILURE,
            Outcome::Finished { status } => status,
            Outcome::NoVerdict { .. } => EXIT_KERNEL_FAILURE,
            Outcome::TimedOut => EXIT_TIMEOUT,
        }
    }

    /// A human summary for stderr: the verdict, then any kernel problems.
    pub fn summary(&self, timeout: Duration) -> String {
        let secs = self.boot.elapsed.as_secs_f64();
        let mut s = match self.boot.outcome {
            Outcome::Finished { status } => {
                format!("vmtest: scenario exited with status {status} ({secs:.1} s, kernel {})", self.kernel_version)
            }
            Outcome::NoVerdict { qemu } => format!(
                "vmtest: the guest stopped without reporting a verdict (qemu {qemu}, after {secs:.1} s)"
            ),
            Outcome::TimedOut => format!(
                "vmtest: timed out after {} s (--timeout); qemu was killed",
                timeout.as_secs()
            ),
        };
        if !self.boot.problems.is_empty() {
            s.push_str("\nvmtest: the kernel reported problems:");
            for p in &self.boot.problems {
                s.push_str("\n  ");
                s.push_str(p);
            }
        }
        if !matches!(self.boot.outcome, Outcome::Finished { .. }) {
            s.push_str("\nvmtest: last console lines:");
            let skip = self.boot.tail.len().saturating_sub(15);
            for line in &self.boot.tail[skip..] {
                s.push_str("\n  | ");
                s.push_str(line);
            }
        }
        if !self.vcpus.is_empty() {
            s.push_str(&format!(
                "\nvmtest: the vCPUs before qemu was killed ({SAMPLES} samples {} ms apart):",
                SAMPLE_GAP.as_millis()
            ));
            for line in &self.vcpus {
                s.push_str("\n  @ ");
                s.push_str(line);
            }
        }
        s
    }
}

/// Runs a scenario, copying the console to `console`.
pub fn run(options: &RunOptions, console: &mut dyn Write) -> Result<Report, RunError> {
    run_guest(options, None, console, true)
}

/// Runs a scenario in a guest whose PID 1 is systemd ([`crate::systemd`]): `/scenario.sh` is
/// started by a unit once `multi-user.target` is reached. The module is not insmodded by init
/// (whatever `options.load_module` says) but installed where DKMS puts it.
pub fn run_systemd(
    options: &RunOptions,
    guest: &SystemdGuest,
    console: &mut dyn Write,
) -> Result<Report, RunError> {
    run_guest(options, Some(guest), console, true)
}

/// Boots one guest. `name_stalls`: on a timeout, boot another guest to name the kernel
/// addresses the vCPUs were at ([`name_addresses`]); that guest itself does not.
fn run_guest(
    options: &RunOptions,
    systemd_guest: Option<&SystemdGuest>,
    console: &mut dyn Write,
    name_stalls: bool,
) -> Result<Report, RunError> {
    if !options.scenario.is_file() {
        return Err(RunError::NoScenario {
            path: options.scenario.clone(),
        });
    }
    let kernel = match &options.kernel {
        Some(kernel) => KernelInstall::choose(&kernel.to_string_lossy())?,
        None => KernelInstall::newest()?,
    };
    let qemu = host::find_program("qemu-system-x86_64", "install qemu-system-x86")?;

    let builder = Builder::new(&options.repo, &kernel)?;
    let initramfs_path;
    let _temp;
    {
        let _lock = builder.lock()?;
        let tree = guest_tree(options, &kernel, &builder, systemd_guest)?;
        (initramfs_path, _temp) = match &options.keep_initramfs {
            Some(path) => (path.clone(), None),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("initramfs-")
                    .suffix(".cpio.gz")
                    .tempfile_in(builder.work_dir())
                    .map_err(|source| RunError::WriteInitramfs {
                        path: builder.work_dir(),
                        source,
                    })?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        let file =
            std::fs::File::create(&initramfs_path).map_err(|source| RunError::WriteInitramfs {
                path: initramfs_path.clone(),
                source,
            })?;
        let file = tree.write_gz(std::io::BufWriter::new(file))?;
        file.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .map_err(|source| RunError::WriteInitramfs {
                path: initramfs_path.clone(),
                source,
            })?;
        log::info!(
            "initramfs {} ({} entries)",
            initramfs_path.display(),
            tree.paths().count()
        );
    }

    let config = QemuConfig {
        qemu,
        kernel: kernel.vmlinuz.clone(),
        initramfs: initramfs_path,
        memory_mib: options.memory_mib,
        cpus: 2,
        append: match systemd_guest {
            Some(_) => systemd::CMDLINE
                .iter()
                .map(|w| (*w).to_owned())
                .chain(options.append.iter().cloned())
                .collect(),
            None => options.append.clone(),
        },
        qemu_args: guest_cpu_args(&kernel.version)
            .into_iter()
            .chain(options.qemu_args.iter().cloned())
            .collect(),
        timeout: options.timeout,
    };
    let boot = qemu::boot(&config, console)?;
    let vcpus = match &boot.vcpus {
        None => Vec::new(),
        Some(Err(why)) => vec![why.clone()],
        Some(Ok(samples)) => {
            let kernel_rips: BTreeSet<u64> = samples
                .iter()
                .flatten()
                .filter(|v| v.cpl == 0)
                .map(|v| v.rip)
                .collect();
            let names = if !name_stalls || kernel_rips.is_empty() {
                Ok(BTreeMap::new())
            } else {
                eprintln!(
                    "vmtest: timed out; booting the kernel once more to name the vCPUs' addresses"
                );
                name_addresses(options, &kernel_rips)
            };
            let mut lines = describe_vcpus(samples, names.as_ref().unwrap_or(&BTreeMap::new()));
            if let Err(why) = names {
                lines.push(format!("(kernel addresses not named: {why})"));
            }
            lines
        }
    };
    Ok(Report {
        boot,
        kernel_version: kernel.version,
        vcpus,
    })
}

/// The marker of [`name_addresses`]' answers on the console.
const SYMBOL_MARK: &str = "VMTEST-SYMBOL ";

/// Names kernel addresses by booting the same kernel (and module, when the run loads it) and
/// asking its `/proc/kallsyms` for the nearest text symbol at or below each. The guest runs
/// `nokaslr`, so the kernel's addresses are those of the stalled boot; a module's are those of
/// this boot, the same as long as modules load in the same order (they do: the same init).
/// Returns `sym+0xoff` (with ` [module]`) per address it could name.
pub fn name_addresses(
    options: &RunOptions,
    addrs: &BTreeSet<u64>,
) -> Result<BTreeMap<u64, String>, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let scenario = dir.path().join("name_addresses.sh");
    std::fs::write(&scenario, name_addresses_scenario(addrs))
        .map_err(|e| format!("writing {}: {e}", scenario.display()))?;
    let opts = RunOptions {
        scenario,
        files: Vec::new(),
        timeout: Duration::from_secs(300),
        keep_initramfs: None,
        qemu_args: Vec::new(),
        ..options.clone()
    };
    let mut console = Vec::new();
    let report =
        run_guest(&opts, None, &mut console, false).map_err(|e| trapvec::error_chain(&e))?;
    if report.exit_code() != 0 {
        return Err(report.summary(opts.timeout));
    }
    Ok(parse_named_addresses(&String::from_utf8_lossy(&console)))
}

/// The guest side of [`name_addresses`]: one pass of busybox awk over `/proc/kallsyms`,
/// comparing 16-digit hex addresses as strings (awk's numbers cannot hold 64 bits).
fn name_addresses_scenario(addrs: &BTreeSet<u64>) -> String {
    let want = addrs
        .iter()
        .map(|a| format!("{a:016x}"))
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        r#"awk -v want="{want}" 'BEGIN {{ n = split(want, w, " ") }}
$2 ~ /^[tTwW]$/ {{ for (i = 1; i <= n; i++) if (("x" $1) <= ("x" w[i]) && ("x" $1) > ("x" best[i])) {{ best[i] = $1; name[i] = $3 ($4 == "" ? "" : " " $4) }} }}
END {{ for (i = 1; i <= n; i++) if (best[i] != "") print "{SYMBOL_MARK}" w[i] " " best[i] " " name[i] }}' /proc/kallsyms
"#
    )
}

/// The answers of [`name_addresses_scenario`] on a console: `address → sym+0xoff [module]`.
fn parse_named_addresses(console: &str) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    for line in console.lines() {
        let Some((_, rest)) = line.trim_end_matches('\r').split_once(SYMBOL_MARK) else {
            continue;
        };
        let mut words = rest.splitn(3, ' ');
        let (Some(want), Some(base), Some(name)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let (Ok(want), Ok(base)) = (u64::from_str_radix(want, 16), u64::from_str_radix(base, 16))
        else {
            continue;
        };
        let (sym, module) = name.split_once(' ').map_or((name, ""), |(s, m)| (s, m));
        let module = if module.is_empty() {
            String::new()
        } else {
            format!(" {module}")
        };
        out.insert(want, format!("{sym}+{:#x}{module}", want - base));
    }
    out
}

/// One line per vCPU: each place it was seen at, in order of first sight, with how many of
/// the samples found it there, e.g. `cpu1: 3× ffffffff81234567 foo+0x17, 2× user 40112a`.
pub fn describe_vcpus(samples: &[Vec<VcpuState>], names: &BTreeMap<u64, String>) -> Vec<String> {
    let cpus: BTreeSet<u32> = samples.iter().flatten().map(|v| v.cpu).collect();
    cpus.into_iter()
        .map(|cpu| {
            let mut seen: Vec<(VcpuState, usize)> = Vec::new();
            for v in samples.iter().flatten().filter(|v| v.cpu == cpu) {
                match seen
                    .iter_mut()
                    .find(|(s, _)| (s.rip, s.cpl, s.halted) == (v.rip, v.cpl, v.halted))
                {
                    Some((_, n)) => *n += 1,
                    None => seen.push((*v, 1)),
                }
            }
            let places: Vec<String> = seen
                .iter()
                .map(|(v, n)| {
                    let at = if v.cpl == 0 {
                        format!(
                            "{:016x} {}",
                            v.rip,
                            names.get(&v.rip).map_or("(not named)", String::as_str)
                        )
                    } else {
                        format!("user {:x}", v.rip)
                    };
                    format!("{n}× {at}{}", if v.halted { " (halted)" } else { "" })
                })
                .collect();
            format!("cpu{cpu}: {}", places.join(", "))
        })
        .collect()
}

/// Builds the artifacts and lays out the guest's file system.
fn guest_tree(
    options: &RunOptions,
    kernel: &KernelInstall,
    builder: &Builder<'_>,
    systemd_guest: Option<&SystemdGuest>,
) -> Result<Initramfs, RunError> {
    let busybox = host::find_program("busybox", "install busybox-static")?;
    // busybox's tc cannot add qdiscs such as netem: scenarios get iproute2's.
    let tc = host::find_program("tc", "install iproute2")?;

    let module = match builder.module() {
        Ok(module) => Some(module),
        Err(err) if !options.load_module && systemd_guest.is_none() => {
            eprintln!(
                "vmtest: warning: {}; the guest has no {}",
                trapvec::error_chain(&err),
                paths::MODULE
            );
            None
        }
        Err(err) => return Err(err.into()),
    };
    let components = builder.components()?;
    let trapctl = builder.trapctl()?;
    let helpers = builder.helpers()?;

    let mut fs = Initramfs::new();
    fs.busybox(&busybox)?;
    for dir in [
        "/proc",
        "/sys",
        "/dev",
        "/tmp",
        "/root",
        "/run",
        "/etc",
        paths::FILES,
        paths::COMPONENTS,
    ] {
        fs.dir(dir)?;
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    fs.char_device("/dev/console", 5, 1, 0o600)?;
    fs.bytes_file(
        "/etc/passwd",
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
        0o644,
    )?;
    fs.bytes_file("/etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644)?;
    let applet_overrides = vec![("tc".to_owned(), "/sbin/tc".to_owned())];
    let init = init::render(&InitOptions {
        load_module: options.load_module,
        applet_overrides: applet_overrides.clone(),
        ..InitOptions::default()
    });
    fs.bytes_file("/init", init, 0o755)?;
    fs.host_file(paths::SCENARIO, &options.scenario, 0o755)?;
    fs.host_file(
        paths::SCENARIO_LIB,
        &options.repo.join("vmtest/scenarios/lib/scenario.sh"),
        0o644,
    )?;

    if let Some(module) = &module {
        fs.host_file(paths::MODULE, module, 0o644)?;
    }
    for object in &components {
        fs.host_file(&guest_path(paths::COMPONENTS, object), object, 0o644)?;
    }
    fs.program_with_libraries("/bin/trapctl", &trapctl)?;
    for helper in &helpers {
        fs.program_with_libraries(&guest_path("/bin", helper), helper)?;
    }
    fs.program_with_libraries("/sbin/tc", &tc)?;
    for dist_dir in ["/usr/lib/x86_64-linux-gnu/tc", "/usr/lib/tc"] {
        add_dir_files(&mut fs, Path::new(dist_dir))?;
    }
    add_files(&mut fs, &options.files)?;
    add_kernel_modules(&mut fs, kernel, &options.extra_modules)?;
    if let Some(guest) = systemd_guest {
        // `module` is Some: without the module a systemd guest is an error above.
        let module = module
            .as_deref()
            .expect("a systemd guest's module was built");
        systemd::add(&mut fs, guest, &kernel.version, module, &applet_overrides)?;
    }
    Ok(fs)
}

/// `dir/<file name of host>`.
fn guest_path(dir: &str, host: &Path) -> String {
    format!(
        "{dir}/{}",
        host.file_name().unwrap_or_default().to_string_lossy()
    )
}

fn add_files(fs: &mut Initramfs, files: &[PathBuf]) -> Result<(), RunError> {
    let mut seen: Vec<(String, &PathBuf)> = Vec::new();
    for file in files {
        if !file.is_file() {
            return Err(RunError::NoFile { path: file.clone() });
        }
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if let Some((_, first)) = seen.iter().find(|(n, _)| *n == name) {
            return Err(RunError::DuplicateFile {
                name,
                first: (*first).clone(),
                second: file.clone(),
            });
        }
        let mode = if is_executable(file) { 0o755 } else { 0o644 };
        fs.host_file(&format!("{}/{name}", paths::FILES), file, mode)?;
        seen.push((name, file));
    }
    Ok(())
}

/// Copies the regular files of a host directory to the same path in the guest, if it exists.
fn add_dir_files(fs: &mut Initramfs, dir: &Path) -> Result<(), RunError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_file() {
            fs.host_file(&path.to_string_lossy(), &path, 0o644)?;
        }
    }
    Ok(())
}

fn add_kernel_modules(
    fs: &mut Initramfs,
    kernel: &KernelInstall,
    extra: &[String],
) -> Result<(), RunError> {
    let dep_path = kernel.modules.join("modules.dep");
    let text = std::fs::read_to_string(&dep_path).map_err(|source| RunError::Read {
        path: dep_path,
        source,
    })?;
    let dep = ModulesDep::parse(&text)?;
    let names: BTreeSet<&str> = DEFAULT_MODULES
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .collect();
    let names: Vec<&str> = names.into_iter().collect();
    let paths = dep.closure(&names)?;
    let guest_dir = format!("/lib/modules/{}", kernel.version);
    for rel in &paths {
        fs.host_file(
            &format!("{guest_dir}/{rel}"),
            &kernel.modules.join(rel),
            0o644,
        )?;
    }
    fs.bytes_file(
        &format!("{guest_dir}/modules.dep"),
        dep.render_subset(&paths),
        0o644,
    )?;
    // So that modprobe of a built-in module (e.g. a qdisc compiled in) succeeds quietly.
    for index in ["modules.builtin", "modules.builtin.modinfo"] {
        let host = kernel.modules.join(index);
        if host.is_file() {
            fs.host_file(&format!("{guest_dir}/{index}"), &host, 0o644)?;
        }
    }
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// QEMU arguments a guest kernel needs before the caller's (a later `-cpu` wins). Kernels after
/// 6.1 get a CPU without CMPXCHG16B: 6.12's SLUB takes `this_cpu_cmpxchg128` (a
/// `cmpxchg16b %gs:(…)`) on every allocation, and under this QEMU's multi-threaded TCG that
/// instruction intermittently corrupts RFLAGS and the stack, a double fault in
/// `kmem_cache_alloc_noprof` before any module loads (seen in two boots of three without our
/// module; none in four without the feature, when SLUB falls back to its slab lock). 6.1 keeps
/// QEMU's default CPU, as every figure so far was taken with it.
pub fn guest_cpu_args(version: &str) -> Vec<String> {
    if host::in_series(version, host::DEFAULT_SERIES) {
        Vec::new()
    } else {
        vec!["-cpu".to_owned(), "qemu64,-cx16".to_owned()]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_kernels_after_6_1_boot_without_cmpxchg16b() {
        assert!(super::guest_cpu_args("6.1.0-56-cloud-amd64").is_empty());
        assert_eq!(
            super::guest_cpu_args("6.12.95+deb12-cloud-amd64"),
            ["-cpu", "qemu64,-cx16"]
        );
    }

    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn report(outcome: Outcome, problems: &[&str]) -> Report {
        Report {
            boot: Boot {
                outcome,
                problems: problems.iter().map(|s| (*s).to_owned()).collect(),
                tail: vec!["last line".into()],
                elapsed: Duration::from_secs(3),
                vcpus: None,
            },
            kernel_version: "6.1.0-56-cloud-amd64".into(),
            vcpus: Vec::new(),
        }
    }

    #[test]
    fn exit_code_is_the_scenario_status_when_the_kernel_stayed_clean() {
        assert_eq!(report(Outcome::Finished { status: 0 }, &[]).exit_code(), 0);
        assert_eq!(report(Outcome::Finished { status: 3 }, &[]).exit_code(), 3);
    }

    #[test]
    fn kernel_problem_fails_a_passing_scenario_and_keeps_a_failing_status() {
        let warn = ["WARNING: CPU: 0 PID: 1 at x"];
        assert_eq!(
            report(Outcome::Finished { status: 0 }, &warn).exit_code(),
            EXIT_KERNEL_FAILURE
        );
        assert_eq!(
            report(Outcome::Finished { status: 4 }, &warn).exit_code(),
            4
        );
        let summary =
            report(Outcome::Finished { status: 0 }, &warn).summary(Duration::from_secs(60));
        assert!(
            summary.contains("the kernel reported problems:\n  WARNING: CPU: 0"),
            "{summary}"
        );
    }

    #[test]
    fn timeout_and_missing_verdict_have_their_own_codes_and_show_the_console_tail() {
        let timed_out = report(Outcome::TimedOut, &[]);
        assert_eq!(timed_out.exit_code(), EXIT_TIMEOUT);
        let summary = timed_out.summary(Duration::from_secs(20));
        assert!(summary.contains("timed out after 20 s"), "{summary}");
        assert!(summary.contains("| last line"), "{summary}");
        let died = report(
            Outcome::NoVerdict {
                qemu: std::process::ExitStatus::from_raw(0),
            },
            &["Kernel panic - not syncing: x"],
        );
        assert_eq!(died.exit_code(), EXIT_KERNEL_FAILURE);
    }

    #[test]
    fn vcpus_are_described_per_cpu_with_names_and_counts() {
        let v = |cpu, rip, cpl, halted| VcpuState {
            cpu,
            rip,
            cpl,
            halted,
        };
        let samples = vec![
            vec![
                v(0, 0xffff_ffff_8100_1000, 0, true),
                v(1, 0xffff_ffff_8120_0017, 0, false),
            ],
            vec![
                v(0, 0xffff_ffff_8100_1000, 0, true),
                v(1, 0x40_112a, 3, false),
            ],
            vec![
                v(0, 0xffff_ffff_8100_1000, 0, true),
                v(1, 0xffff_ffff_8120_0017, 0, false),
            ],
        ];
        let names = BTreeMap::from([(0xffff_ffff_8120_0017, "foo+0x17 [trapvec]".to_owned())]);
        assert_eq!(
            describe_vcpus(&samples, &names),
            [
                "cpu0: 3× ffffffff81001000 (not named) (halted)",
                "cpu1: 2× ffffffff81200017 foo+0x17 [trapvec], 1× user 40112a",
            ]
        );
        let mut r = report(Outcome::TimedOut, &[]);
        r.vcpus = describe_vcpus(&samples, &names);
        let summary = r.summary(Duration::from_secs(20));
        assert!(
            summary.contains(
                "the vCPUs before qemu was killed (5 samples 200 ms apart):\n  @ cpu0: 3×"
            ),
            "{summary}"
        );
    }

    #[test]
    fn named_addresses_are_read_from_the_console() {
        let script = name_addresses_scenario(&BTreeSet::from([
            0xffff_ffff_8120_0017,
            0xffff_ffff_c000_0042,
        ]));
        assert!(
            script.contains(r#"want="ffffffff81200017 ffffffffc0000042""#),
            "{script}"
        );
        let console = "[ 1.0] noise\r\nVMTEST-SYMBOL ffffffff81200017 ffffffff81200000 do_idle\r\n\
                       VMTEST-SYMBOL ffffffffc0000042 ffffffffc0000040 tv_trap [trapvec]\r\nVMTEST-SYMBOL junk\n";
        assert_eq!(
            parse_named_addresses(console),
            BTreeMap::from([
                (0xffff_ffff_8120_0017, "do_idle+0x17".to_owned()),
                (0xffff_ffff_c000_0042, "tv_trap+0x2 [trapvec]".to_owned()),
            ])
        );
    }

    #[test]
    fn files_land_in_files_dir_and_duplicates_are_refused() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(a.path().join("spec.toml"), b"x").unwrap();
        std::fs::write(b.path().join("spec.toml"), b"y").unwrap();
        let mut fs = Initramfs::new();
        add_files(&mut fs, &[a.path().join("spec.toml")]).unwrap();
        assert!(fs.get("/files/spec.toml").is_some());
        let err = add_files(
            &mut Initramfs::new(),
            &[a.path().join("spec.toml"), b.path().join("spec.toml")],
        )
        .unwrap_err();
        assert!(matches!(err, RunError::DuplicateFile { ref name, .. } if name == "spec.toml"));
        let err = add_files(&mut Initramfs::new(), &[a.path().join("absent")]).unwrap_err();
        assert!(matches!(err, RunError::NoFile { .. }));
    }
}
