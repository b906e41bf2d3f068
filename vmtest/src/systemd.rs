//! A guest whose PID 1 is systemd (`vmtest run --systemd`), for what only a real service
//! manager checks: a unit's sandbox (`ProtectSystem=`, `PrivateTmp=`, `CapabilityBoundingSet=`,
//! seccomp, the device cgroup ...), its `ExecStartPre=`, restarts and `systemctl`.
//!
//! Owns what such a guest holds besides the busybox guest of [`crate::runner`]: the host's
//! systemd (PID 1, journald, `systemctl`, `journalctl`) with its libraries, the host's kmod
//! (`/sbin/modprobe`, `depmod`, ... as a service's `ExecStartPre=/sbin/modprobe` runs in the
//! field, not busybox's), a minimal unit set, `--tree` directories copied to `/` (e.g. an
//! extracted `.deb`), the module where DKMS installs it, and the two scripts that replace the
//! busybox guest's `/init`:
//!
//! * `/init` (busybox) copies the initramfs into a tmpfs and `switch_root`s into systemd there,
//!   so that `/` is an ordinary mount as on a real machine (systemd's namespaces bind-mount and
//!   remount it) and not the initial rootfs;
//! * `/vmtest-run`, started by `vmtest-scenario.service` once `multi-user.target` is reached,
//!   runs `/scenario.sh` with its output on the console, prints the verdict as the busybox
//!   guest does and powers off.

use std::path::{Path, PathBuf};

use crate::console::EXIT_MARKER;
use crate::host::{self, HostError};
use crate::init::{paths, SETUP_FAILED};
use crate::initramfs::{Initramfs, InitramfsError};
use crate::ldd;

/// systemd's binary, PID 1 after the switch.
pub const SYSTEMD: &str = "/lib/systemd/systemd";
/// The journal daemon, so that services' output can be read with `journalctl -u`.
pub const JOURNALD: &str = "/lib/systemd/systemd-journald";
/// Where unit files live in the guest (and where Debian packages put theirs).
pub const UNIT_DIR: &str = "/lib/systemd/system";
/// The unit that runs the scenario.
pub const SCENARIO_UNIT: &str = "vmtest-scenario.service";
/// The script that unit starts.
pub const RUNNER: &str = "/vmtest-run";
/// The tmpfs `/init` fills and switches into.
pub const NEW_ROOT: &str = "/newroot";
/// Where DKMS installs a module below `/lib/modules/<version>` (kmod/dkms.conf's
/// `DEST_MODULE_LOCATION`).
pub const DKMS_DIR: &str = "updates/dkms";
/// Kernel command-line words a systemd guest adds: no boot status lines on the console (they
/// would interleave with the scenario's output).
pub const CMDLINE: &[&str] = &["systemd.show_status=0"];

/// The guest's `/etc/machine-id` (fixed: every boot is the same installed machine's).
pub const MACHINE_ID: &str = "7472617076656374766d746573740001\n";

/// The host's unit files the guest needs: the targets on the way to `multi-user.target` and
/// journald with its sockets. Nothing else is started (no udev, getty, logind, networkd).
pub const HOST_UNITS: &[&str] = &[
    "basic.target",
    "sysinit.target",
    "sockets.target",
    "timers.target",
    "paths.target",
    "slices.target",
    "local-fs-pre.target",
    "local-fs.target",
    "swap.target",
    "multi-user.target",
    "shutdown.target",
    "systemd-journald.service",
    "systemd-journald.socket",
    "systemd-journald-dev-log.socket",
    "systemd-journald-audit.socket",
];

/// `(unit, wanted by)`: the links Debian's systemd package ships for journald.
const WANTS: &[(&str, &str)] = &[
    ("systemd-journald.socket", "sockets.target"),
    ("systemd-journald-dev-log.socket", "sockets.target"),
    ("systemd-journald-audit.socket", "sockets.target"),
    ("systemd-journald.service", "sysinit.target"),
];

/// kmod's programs, each a link to `/bin/kmod`, at Debian's paths (busybox's are replaced).
pub const KMOD_LINKS: &[&str] = &[
    "/sbin/modprobe",
    "/sbin/depmod",
    "/sbin/modinfo",
    "/sbin/insmod",
    "/sbin/rmmod",
    "/sbin/lsmod",
];

/// What a systemd guest holds besides the defaults.
#[derive(Debug, Clone, Default)]
pub struct SystemdGuest {
    /// Host directories whose contents are copied to `/` (files, links, modes), e.g. a
    /// `dpkg-deb -x` of a package; executables get their shared libraries too.
    pub trees: Vec<PathBuf>,
}

/// Errors laying out a systemd guest.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// A host program (systemd, kmod) is missing.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A file systemd needs is not on the host.
    #[error("{path} is missing on the host (install {package})")]
    MissingHostFile {
        /// The file.
        path: PathBuf,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// A `--tree` is not a directory, or reading it failed.
    #[error("--tree {path}")]
    Tree {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Adding to the tree failed.
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    /// Resolving a library failed.
    #[error(transparent)]
    Ldd(#[from] ldd::LddError),
}

/// Turns the busybox guest `fs` into a systemd guest: systemd, kmod, the units, the trees, the
/// module `module` at `/lib/modules/<kernel_version>/updates/dkms/` (no depmod: the scenario runs
/// it, as DKMS does when it installs), and the two scripts (`applet_overrides` as in
/// [`crate::init::InitOptions`]).
pub fn add(
    fs: &mut Initramfs,
    guest: &SystemdGuest,
    kernel_version: &str,
    module: &Path,
    applet_overrides: &[(String, String)],
) -> Result<(), SystemdError> {
    for (guest_path, host_path) in [(SYSTEMD, SYSTEMD), (JOURNALD, JOURNALD)] {
        let host_path = Path::new(host_path);
        if !host_path.is_file() {
            return Err(SystemdError::MissingHostFile {
                path: host_path.to_owned(),
                package: "systemd",
            });
        }
        fs.program_with_libraries(guest_path, host_path)?;
    }
    for program in ["systemctl", "journalctl"] {
        let host_path = host::find_program(program, "install systemd")?;
        fs.program_with_libraries(&format!("/bin/{program}"), &host_path)?;
    }
    let kmod = host::find_program("kmod", "install kmod")?;
    fs.program_with_libraries("/bin/kmod", &kmod)?;
    for link in KMOD_LINKS {
        fs.symlink(link, "/bin/kmod")?;
    }

    for unit in HOST_UNITS {
        let host_path = Path::new(UNIT_DIR).join(unit);
        if !host_path.is_file() {
            return Err(SystemdError::MissingHostFile {
                path: host_path,
                package: "systemd",
            });
        }
        fs.host_file(&format!("{UNIT_DIR}/{unit}"), &host_path, 0o644)?;
    }
    for (unit, target) in WANTS {
        fs.symlink(
            &format!("{UNIT_DIR}/{target}.wants/{unit}"),
            &format!("../{unit}"),
        )?;
    }
    fs.bytes_file(
        &format!("{UNIT_DIR}/{SCENARIO_UNIT}"),
        scenario_unit(),
        0o644,
    )?;
    fs.symlink(
        "/etc/systemd/system/default.target",
        &format!("{UNIT_DIR}/multi-user.target"),
    )?;
    fs.symlink(
        &format!("/etc/systemd/system/multi-user.target.wants/{SCENARIO_UNIT}"),
        &format!("{UNIT_DIR}/{SCENARIO_UNIT}"),
    )?;
    // What a Debian root has and systemd or the services expect.
    for dir in [
        "/var/lib",
        "/var/tmp",
        "/var/log",
        "/home",
        "/mnt",
        "/srv",
        "/opt",
        "/usr/sbin",
        NEW_ROOT,
    ] {
        fs.dir(dir)?;
    }
    if let Ok(os_release) = std::fs::read("/etc/os-release") {
        fs.bytes_file("/etc/os-release", os_release, 0o644)?;
    }
    fs.bytes_file("/etc/hostname", "vmtest\n", 0o644)?;
    // An installed machine's: without one systemd takes the boot for a first boot and enables
    // every unit by preset (a package's unit would be started before the scenario runs).
    fs.bytes_file("/etc/machine-id", MACHINE_ID, 0o444)?;

    for tree in &guest.trees {
        log::debug!("systemd guest: --tree {} copied to /", tree.display());
        add_tree(fs, tree)?;
    }
    fs.host_file(
        &format!("/lib/modules/{kernel_version}/{DKMS_DIR}/trapvec.ko"),
        module,
        0o644,
    )?;
    fs.bytes_file("/init", switch_root_init(), 0o755)?;
    fs.bytes_file(RUNNER, runner_script(applet_overrides), 0o755)?;
    Ok(())
}

/// Copies the contents of host directory `tree` to the same paths under the guest's `/`:
/// directories, symlinks, and files with their permission bits; each executable file also
/// gets its shared libraries.
pub fn add_tree(fs: &mut Initramfs, tree: &Path) -> Result<(), SystemdError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| SystemdError::Tree { path, source }
    };
    let mut stack = vec![tree.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(err(&dir))? {
            let entry = entry.map_err(err(&dir))?;
            let path = entry.path();
            let guest = format!(
                "/{}",
                path.strip_prefix(tree)
                    .expect("entries lie under the tree")
                    .display()
            );
            let meta = std::fs::symlink_metadata(&path).map_err(err(&path))?;
            if meta.is_dir() {
                fs.dir(&guest)?;
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).map_err(err(&path))?;
                fs.symlink(&guest, &target.to_string_lossy())?;
            } else if meta.is_file() {
                let mode = meta.permissions().mode() & 0o7777;
                if mode & 0o111 != 0 {
                    log::debug!(
                        "--tree {}: {guest} is executable, packing its libraries",
                        tree.display()
                    );
                    fs.program_with_libraries(&guest, &path)?;
                }
                // After program_with_libraries, which adds the file as 0755: the tree's mode.
                fs.host_file(&guest, &path, mode)?;
            } else {
                log::debug!(
                    "--tree {}: {guest} is neither a file, a directory nor a link; skipped",
                    tree.display()
                );
            }
        }
    }
    Ok(())
}

/// The unit that runs the scenario once `multi-user.target` is reached, its output on the
/// console.
pub fn scenario_unit() -> String {
    format!(
        "# Generated by vmtest (vmtest/src/systemd.rs): runs {scenario}, reports, powers off.
[Unit]
Description=vmtest scenario {scenario}
After=multi-user.target

[Service]
Type=simple
ExecStart={runner}
StandardInput=null
StandardOutput=tty
StandardError=inherit
TTYPath=/dev/console
",
        scenario = paths::SCENARIO,
        runner = RUNNER,
    )
}

/// `/init` of a systemd guest: the initramfs copied into a tmpfs, then `switch_root` into
/// systemd there (which mounts /proc, /sys, /dev, /run and the cgroup tree itself).
pub fn switch_root_init() -> String {
    format!(
        r#"#!/bin/sh
# /init of a trapvec vmtest systemd guest (generated by vmtest; see vmtest/src/systemd.rs).
export PATH={path}

fail() {{
	echo "vmtest: guest setup failed: $*"
	printf '\n{marker}%d\n' {setup_failed}
	poweroff -f
	while :; do sleep 60; done
}}

mount -t proc proc /proc || fail mount /proc
mount -t tmpfs -o mode=0755 tmpfs {new_root} || fail mount tmpfs {new_root}
for entry in /*; do
	case "$entry" in
	/proc | /sys | /dev | {new_root}) ;;
	*) cp -a "$entry" {new_root}/ || fail cp -a "$entry" ;;
	esac
done
mkdir -p {new_root}/proc {new_root}/sys {new_root}/dev {new_root}/run
umount /proc
exec switch_root {new_root} {systemd}
fail switch_root {new_root} {systemd}
"#,
        path = paths::PATH,
        marker = EXIT_MARKER,
        setup_failed = SETUP_FAILED,
        new_root = NEW_ROOT,
        systemd = SYSTEMD,
    )
}

/// `/vmtest-run`: the scenario as the busybox guest runs it (same shell, `$0`, overrides),
/// then the verdict on the console and power-off.
pub fn runner_script(applet_overrides: &[(String, String)]) -> String {
    let overrides: String = applet_overrides
        .iter()
        .map(|(name, path)| format!("{name}() {{ {path} \"$@\"; }}; "))
        .collect();
    format!(
        r#"#!/bin/sh
# Started by {unit} (generated by vmtest; see vmtest/src/systemd.rs).
export PATH={path}
export HOME=/root
cd /
/bin/sh -c '{overrides}. "$0"' {scenario} </dev/null
status=$?
printf '\n{marker}%d\n' "$status"
sync
poweroff -f
"#,
        unit = SCENARIO_UNIT,
        path = paths::PATH,
        scenario = paths::SCENARIO,
        marker = EXIT_MARKER,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh_n(text: &str) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let status = std::process::Command::new("sh")
            .arg("-n")
            .arg(file.path())
            .status()
            .unwrap();
        assert!(status.success(), "sh -n rejected:\n{text}");
    }

    #[test]
    fn init_copies_everything_but_the_api_mounts_then_switches_into_systemd() {
        let text = switch_root_init();
        sh_n(&text);
        let at = |needle: &str| {
            text.find(needle)
                .unwrap_or_else(|| panic!("{needle} missing:\n{text}"))
        };
        assert!(
            at("mount -t tmpfs -o mode=0755 tmpfs /newroot") < at("cp -a \"$entry\" /newroot/")
        );
        assert!(
            at("/proc | /sys | /dev | /newroot) ;;")
                < at("exec switch_root /newroot /lib/systemd/systemd")
        );
        assert!(
            text.contains("printf '\\nTRAPVEC-VMTEST-EXIT=%d\\n' 125"),
            "setup failures report 125:\n{text}"
        );
    }

    #[test]
    fn runner_reports_the_scenario_status_and_keeps_the_overrides() {
        let text = runner_script(&[("tc".into(), "/sbin/tc".into())]);
        sh_n(&text);
        assert!(text.contains("/bin/sh -c 'tc() { /sbin/tc \"$@\"; }; . \"$0\"' /scenario.sh </dev/null\nstatus=$?\n"), "{text}");
        assert!(
            text.contains("printf '\\nTRAPVEC-VMTEST-EXIT=%d\\n' \"$status\""),
            "{text}"
        );
        assert!(text.ends_with("poweroff -f\n"));
    }

    #[test]
    fn scenario_unit_runs_the_runner_on_the_console() {
        let unit = scenario_unit();
        for line in [
            "ExecStart=/vmtest-run",
            "StandardOutput=tty",
            "TTYPath=/dev/console",
            "After=multi-user.target",
        ] {
            assert!(unit.lines().any(|l| l == line), "{line} missing:\n{unit}");
        }
    }

    #[test]
    fn a_tree_lands_at_the_root_with_modes_and_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/trapvec")).unwrap();
        let toml = dir.path().join("etc/trapvec/trapd.toml");
        std::fs::write(&toml, "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&toml, std::fs::Permissions::from_mode(0o640)).unwrap();
        std::fs::create_dir_all(dir.path().join("usr/share/empty")).unwrap();
        std::os::unix::fs::symlink("trapd.toml", dir.path().join("etc/trapvec/link")).unwrap();
        let mut fs = Initramfs::new();
        add_tree(&mut fs, dir.path()).unwrap();
        assert!(matches!(
            fs.get("/etc/trapvec/trapd.toml"),
            Some(crate::initramfs::Node::File { mode: 0o640, .. })
        ));
        assert_eq!(
            fs.get("/etc/trapvec/link"),
            Some(&crate::initramfs::Node::Symlink("trapd.toml".into()))
        );
        assert_eq!(
            fs.get("/usr/share/empty"),
            Some(&crate::initramfs::Node::Dir)
        );
        let err = add_tree(&mut Initramfs::new(), &dir.path().join("absent")).unwrap_err();
        assert!(matches!(err, SystemdError::Tree { .. }), "{err}");
    }
}
