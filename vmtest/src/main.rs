//! `vmtest run --scenario SCRIPT ...`: boot the Debian cloud kernel under QEMU TCG with the
//! trapvec module, trapctl, components and a scenario; exit with the scenario's status.
//! See README.md, "Running against a real kernel (vmtest)".

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use vmtest::runner::{self, RunOptions};
use vmtest::systemd::SystemdGuest;

#[derive(Debug, Parser)]
#[command(
    name = "vmtest",
    about = "Run a scenario against a real Linux kernel under QEMU"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build, pack, boot and run SCRIPT as root in the guest; exit with its status
    /// (124 on timeout, 1 if the guest died or the kernel reported a panic/oops/BUG/WARNING).
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Shell script run as root by busybox /bin/sh in the guest (as /scenario.sh).
    #[arg(long, value_name = "SCRIPT")]
    scenario: PathBuf,
    /// Copy a host file into the guest at /files/<its name> (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<PathBuf>,
    /// Seconds for boot, scenario and power-off together; qemu is killed after that.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    timeout: u64,
    /// Do not insmod /trapvec.ko before the scenario (it is still packed when it builds).
    #[arg(long)]
    no_load: bool,
    /// Kernel to boot: a series (6.1, 6.12: its newest /boot/vmlinuz-<series>*-cloud-amd64) or
    /// the path of a vmlinuz-<version> [default: $TRAPVEC_GUEST_KERNEL, else 6.1].
    #[arg(long, value_name = "SERIES|PATH")]
    kernel: Option<PathBuf>,
    /// Keep the initramfs (gzip'd cpio) at PATH.
    #[arg(long, value_name = "PATH")]
    keep_initramfs: Option<PathBuf>,
    /// Extra kernel command-line words, appended after vmtest's own (repeatable).
    #[arg(long, value_name = "WORDS")]
    append: Vec<String>,
    /// One more QEMU argument, after vmtest's own (repeatable; `--qemu-arg=-singlestep`, or
    /// `--qemu-arg -icount --qemu-arg shift=0`).
    #[arg(long = "qemu-arg", value_name = "ARG", allow_hyphen_values = true)]
    qemu_args: Vec<String>,
    /// Also pack this guest kernel module and its dependencies (sch_netem always is).
    #[arg(long = "with-module", value_name = "NAME")]
    with_modules: Vec<String>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512, value_name = "MIB")]
    memory: u32,
    /// Boot into systemd as PID 1 (the host's, with kmod): the scenario runs from a unit once
    /// multi-user.target is reached, and the module is not insmodded but installed in
    /// /lib/modules/VERSION/updates/dkms as DKMS does (the scenario runs depmod).
    #[arg(long)]
    systemd: bool,
    /// With --systemd: copy this host directory's contents to the guest's / (e.g. a
    /// `dpkg-deb -x` of a package; repeatable).
    #[arg(long = "tree", value_name = "DIR", requires = "systemd")]
    trees: Vec<PathBuf>,
    /// Repository to build from [default: the one vmtest was built from].
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match real_main() {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("vmtest: error: {}", trapvec::error_chain(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<u8> {
    let Cmd::Run(args) = Cli::parse().command;
    let repo = match args.repo {
        Some(repo) => repo,
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .context("vmtest's manifest directory has no parent")?
            .to_owned(),
    };
    let options = RunOptions {
        repo,
        scenario: args.scenario,
        files: args.files,
        timeout: Duration::from_secs(args.timeout),
        load_module: !args.no_load,
        kernel: args.kernel,
        keep_initramfs: args.keep_initramfs,
        append: args.append,
        qemu_args: args.qemu_args,
        extra_modules: args.with_modules,
        memory_mib: args.memory,
    };
    let mut stdout = std::io::stdout();
    let report = if args.systemd {
        runner::run_systemd(&options, &SystemdGuest { trees: args.trees }, &mut stdout)
    } else {
        runner::run(&options, &mut stdout)
    }
    .context("vmtest run")?;
    eprintln!("{}", report.summary(options.timeout));
    // Statuses are 0..=255 from the guest's shell; anything else would be a bug upstream.
    Ok(u8::try_from(report.exit_code()).unwrap_or(1))
}
