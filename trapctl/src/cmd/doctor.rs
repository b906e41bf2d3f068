//! `trapctl doctor`: what this machine allows trapvec to do, and why, with the fix beside each
//! thing that is missing.
//!
//! Every check reads files the kernel exports (`/proc`, `/sys`, `/dev`), relative to `--root`
//! (hidden; `/` unless a test points it at a tree of its own), so each verdict can be tested
//! without the machine it describes. Only the module's ABI is asked of the module itself (the
//! INFO ioctl, when the root is `/` and the device opens).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

/// The kernels CI boots (vmtest): Debian 12's cloud kernel and bookworm-backports' 6.12.
const TESTED: [(&str, &str); 2] = [
    ("6.1.", "Debian 12's 6.1 cloud kernel"),
    (
        "6.12.",
        "bookworm-backports' 6.12 cloud kernel (Debian 13's series)",
    ),
];

/// The EFI variable that says whether Secure Boot is on (its last byte).
const SECURE_BOOT_VAR: &str =
    "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

#[derive(clap::Args)]
#[command(
    about = "What this machine allows trapvec to do, each missing piece with its fix",
    after_help = "Checks the kernel (version, x86-64, whether CI tests it), kernel lockdown and \
Secure Boot, kernel.modules_disabled, kprobes and ftrace, trapvec.ko and its ioctl ABI, root, trapd \
and the process agent. Each line is `ok`, `note` (works, with something to know) or `missing` \
(with the fix under it).\n\nExit status: 0 when nothing is missing for the kernel commands, 1 \
otherwise (process commands need only the agent)."
)]
pub struct Args {
    /// One JSON object: `schema`, `ready` and `checks` (name, state, detail, fix).
    #[arg(long)]
    json: bool,
    /// Read /proc, /sys and /dev under DIR instead of / (for tests).
    #[arg(long, hide = true, value_name = "DIR", default_value = "/")]
    root: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum State {
    Ok,
    Note,
    Missing,
}

#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    state: State,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

impl Check {
    fn new(name: &'static str, state: State, detail: impl Into<String>) -> Check {
        Check {
            name,
            state,
            detail: detail.into(),
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

/// `--json`'s object, in this order (`schema` first).
#[derive(Serialize)]
struct Report<'a> {
    schema: u32,
    ready: bool,
    checks: &'a [Check],
}

pub fn run(args: &Args) -> Result<()> {
    let m = Machine {
        root: args.root.clone(),
    };
    let checks = m.checks();
    let ready = checks.iter().all(|c| c.state != State::Missing);
    let out = if args.json {
        let report = Report {
            schema: 1,
            ready,
            checks: &checks,
        };
        format!("{}\n", serde_json::to_string_pretty(&report)?)
    } else {
        text(&checks, ready)
    };
    crate::print(&out)?;
    if !ready {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        // The lines above said what and why; the exit status says "not ready".
        std::process::exit(1);
    }
    Ok(())
}

fn text(checks: &[Check], ready: bool) -> String {
    let mut out = String::new();
    for c in checks {
        let state = match c.state {
            State::Ok => "ok",
            State::Note => "note",
            State::Missing => "missing",
        };
        let _ = writeln!(out, "{state:<8} {:<16} {}", c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "{:25}fix: {fix}", "");
        }
    }
    out.push_str(if ready {
        "ready: the kernel commands can run here\n"
    } else {
        "not ready: fix the `missing` lines above\n"
    });
    out
}

struct Machine {
    root: PathBuf,
}

impl Machine {
    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path(rel)).ok()
    }

    fn live(&self) -> bool {
        self.root == Path::new("/")
    }

    fn checks(&self) -> Vec<Check> {
        vec![
            self.kernel(),
            self.lockdown(),
            self.secure_boot(),
            self.modules_disabled(),
            self.kprobes(),
            self.ftrace(),
            self.module(),
            self.root_user(),
            trapd(),
            agent(),
        ]
    }

    fn kernel(&self) -> Check {
        let Some(release) = self.read("proc/sys/kernel/osrelease") else {
            return Check::new(
                "kernel",
                State::Missing,
                "cannot read /proc/sys/kernel/osrelease",
            )
            .fix("mount /proc");
        };
        let release = release.trim();
        let arch = self
            .read("proc/sys/kernel/arch")
            .map(|a| a.trim().to_string());
        if arch.as_deref().is_some_and(|a| a != "x86_64") {
            return Check::new(
                "kernel",
                State::Missing,
                format!(
                    "{release} on {}: trapvec patches x86-64 code only",
                    arch.unwrap_or_default()
                ),
            );
        }
        match TESTED
            .iter()
            .find(|(prefix, _)| release.starts_with(prefix))
        {
            Some((_, what)) => Check::new(
                "kernel",
                State::Ok,
                format!("{release}: the series of {what}, which CI boots"),
            ),
            None => Check::new(
                "kernel",
                State::Note,
                format!(
                    "{release} is not a kernel CI boots (6.1 and 6.12): trapvec plans from the \
running text and refuses what it cannot prove, but this kernel is untested"
                ),
            ),
        }
    }

    fn lockdown(&self) -> Check {
        let Some(text) = self.read("sys/kernel/security/lockdown") else {
            let mounted = std::fs::read_dir(self.path("sys/kernel/security"))
                .is_ok_and(|mut d| d.next().is_some());
            if !mounted {
                return Check::new(
                    "lockdown",
                    State::Note,
                    "securityfs is not mounted, so the lockdown mode cannot be read (trapvec.ko refuses to write text itself when lockdown forbids it)",
                )
                .fix("mount -t securityfs securityfs /sys/kernel/security");
            }
            return Check::new(
                "lockdown",
                State::Ok,
                "no lockdown LSM: kernel text may be written",
            );
        };
        // "none [integrity] confidentiality": the bracketed word is the mode.
        let mode = text
            .split_whitespace()
            .find(|w| w.starts_with('['))
            .map(|w| w.trim_matches(['[', ']']).to_string())
            .unwrap_or_else(|| text.trim().to_string());
        if mode == "none" {
            Check::new("lockdown", State::Ok, "none: kernel text may be written")
        } else {
            Check::new(
                "lockdown",
                State::Missing,
                format!("{mode}: the kernel forbids writing its text, so trapvec.ko refuses every splice (reason LOCKDOWN); process commands still work"),
            )
            .fix("boot with Secure Boot off (Debian locks the kernel down under Secure Boot), or with `lockdown=none` where the kernel was built to allow it")
        }
    }

    fn secure_boot(&self) -> Check {
        if !self.path("sys/firmware/efi").exists() {
            return Check::new("secure boot", State::Ok, "not booted through EFI");
        }
        match std::fs::read(self.path(SECURE_BOOT_VAR)) {
            Ok(v) if v.last() == Some(&1) => Check::new(
                "secure boot",
                State::Note,
                "on: the module must be signed by a key the kernel trusts, and Debian locks the kernel down (see lockdown)",
            )
            .fix("enrol DKMS's key: `mokutil --import /var/lib/dkms/mok.pub`, reboot, accept it in MokManager"),
            Ok(_) => Check::new("secure boot", State::Ok, "off"),
            Err(_) => Check::new("secure boot", State::Ok, "EFI without a SecureBoot variable: off"),
        }
    }

    fn modules_disabled(&self) -> Check {
        match self.read("proc/sys/kernel/modules_disabled").as_deref().map(str::trim) {
            Some("1") => Check::new(
                "modules",
                State::Missing,
                "kernel.modules_disabled=1: no module can be loaded, and trapvec.ko refuses to write text (reason MODULES_DISABLED)",
            )
            .fix("it stays set until reboot: boot without whatever sets it (a sysctl.d file or a hardening service)"),
            _ => Check::new("modules", State::Ok, "modules may be loaded"),
        }
    }

    /// The module takes kprobe_mutex and reads the kprobe blacklist: it needs CONFIG_KPROBES.
    fn kprobes(&self) -> Check {
        let listed = self
            .read("proc/kallsyms")
            .is_some_and(|k| k.lines().any(|l| l.ends_with(" register_kprobe")));
        if listed {
            Check::new("kprobes", State::Ok, "present (trapvec.ko keeps out of their way through kprobe_mutex and the blacklist)")
        } else {
            Check::new("kprobes", State::Missing, "register_kprobe is not in /proc/kallsyms: trapvec.ko needs a kernel built with CONFIG_KPROBES")
                .fix("use a distribution kernel (Debian's has kprobes) or rebuild with CONFIG_KPROBES=y")
        }
    }

    fn ftrace(&self) -> Check {
        let found = ["sys/kernel/tracing", "sys/kernel/debug/tracing"]
            .iter()
            .find(|d| self.path(d).join("available_filter_functions").exists());
        match found {
            Some(d) => Check::new("ftrace", State::Ok, format!("/{d}: functions ftrace can trace are listed (the peer of `trapctl count`)")),
            None => Check::new("ftrace", State::Note, "tracefs is not mounted: trapvec works without it (its __fentry__ sites are refused either way), but bench's peers need it")
                .fix("mount -t tracefs nodev /sys/kernel/tracing"),
        }
    }

    fn module(&self) -> Check {
        let loaded = self.path("sys/module/trapvec").is_dir();
        let device = self.path("dev/trapvec").exists();
        let load = "load it: `modprobe trapvec` (package trapvec-dkms), or `make -C kmod` and `insmod kmod/trapvec.ko` from a checkout";
        match (loaded, device) {
            (false, _) => Check::new("module", State::Missing, "trapvec.ko is not loaded").fix(load),
            (true, false) => Check::new("module", State::Missing, "trapvec.ko is loaded but /dev/trapvec is missing")
                .fix("udev did not create it: `mknod /dev/trapvec c $(cut -d: -f1 /sys/class/misc/trapvec/dev) $(cut -d: -f2 /sys/class/misc/trapvec/dev)`, or reload the module"),
            (true, true) if !self.live() => Check::new("module", State::Ok, "loaded, /dev/trapvec present (ABI not asked: not the running system)"),
            (true, true) => match trapvec::kernel::KernelTarget::open() {
                Ok(_) => Check::new(
                    "module",
                    State::Ok,
                    format!("loaded, ioctl ABI {} as this trapctl", trapvec::abi::TRAPVEC_ABI_VERSION),
                ),
                Err(e) => Check::new("module", State::Missing, trapvec::error_chain(&e))
                    .fix("run as root, with trapctl and trapvec.ko built from the same tree (or the same package version)"),
            },
        }
    }

    fn root_user(&self) -> Check {
        if nix::unistd::geteuid().is_root() {
            Check::new("user", State::Ok, "root")
        } else {
            Check::new("user", State::Note, "not root: the kernel commands open /dev/trapvec and read /proc/kallsyms, which need root; process commands do not")
                .fix("run the kernel commands with sudo")
        }
    }
}

fn trapd() -> Check {
    let socket = crate::route::socket();
    if trapvec_proto::client::is_listening(socket) {
        Check::new(
            "trapd",
            State::Ok,
            format!(
                "listening on {}: kernel commands go through it",
                socket.display()
            ),
        )
    } else {
        Check::new(
            "trapd",
            State::Note,
            format!("not listening on {}: kernel commands open /dev/trapvec themselves", socket.display()),
        )
        .fix("for a daemon that keeps splices and profiles: `systemctl start trapd` (package trapvec-tools)")
    }
}

fn agent() -> Check {
    match super::cover::find_agent(None) {
        Ok(p) => Check::new("agent", State::Ok, format!("{} (process commands preload it)", p.display())),
        Err(e) => Check::new("agent", State::Note, format!("{e}: process commands cannot run"))
            .fix("`cargo build --release` builds target/release/libtrapvec_agent.so; the trapvec-tools package installs it"),
    }
}
