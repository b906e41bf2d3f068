//! Booting the guest: `qemu-system-x86_64 -accel tcg` with the kernel and initramfs, the serial
//! console on stdio streamed to the caller as it arrives, and a wall-clock timeout.
//!
//! TCG only: nested KVM hangs on the machines this runs on. `nokaslr` keeps kernel addresses
//! stable between boots; `panic=-1` with `-no-reboot` turns a panic into QEMU exiting.
//! `-display none -serial stdio` rather than `-nographic`: with `-nographic` SeaBIOS mirrors its
//! screen to the serial port, terminal-reset escapes included, which would clear the terminal
//! of whoever watches the console. The monitor listens on a Unix socket in a temporary
//! directory: when the timeout passes, [`crate::monitor`] reads where each vCPU is before QEMU
//! is killed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::console::ConsoleScanner;
use crate::monitor::{self, VcpuState};

/// The kernel command line every guest gets; [`QemuConfig::append`] goes after it (so a
/// later `loglevel=` wins).
pub const BASE_CMDLINE: &[&str] = &[
    "console=ttyS0",
    "nokaslr",
    "panic=-1",
    "printk.time=1",
    // Show KERN_WARNING and above (WARNING: splats) on the console, not the boot chatter.
    "loglevel=5",
    "rdinit=/init",
    // Under TCG on a busy host the boot-time check that the timer interrupt arrives through the
    // IO-APIC can fail and panic the kernel ("IO-APIC + timer doesn't work!"); cloud images
    // skip it for the same reason.
    "no_timer_check",
];

/// How long QEMU gets to power off after the guest reported its verdict.
const POWEROFF_GRACE: Duration = Duration::from_secs(20);

/// Errors running QEMU (not a failed scenario: that is an [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// QEMU could not be started.
    #[error("starting {qemu}")]
    Spawn {
        /// The QEMU binary.
        qemu: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Waiting for or killing QEMU failed.
    #[error("waiting for qemu")]
    Wait(#[source] std::io::Error),
}

/// One boot.
#[derive(Debug, Clone)]
pub struct QemuConfig {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// The kernel image (`-kernel`).
    pub kernel: PathBuf,
    /// The gzip'd cpio (`-initrd`).
    pub initramfs: PathBuf,
    /// Guest RAM (`-m`).
    pub memory_mib: u32,
    /// Guest CPUs (`-smp`).
    pub cpus: u32,
    /// Extra kernel command-line words.
    pub append: Vec<String>,
    /// Extra QEMU arguments, after vmtest's own (e.g. `-singlestep`: one guest instruction per
    /// translation block, so that an interrupt can land between any two instructions). An
    /// `-accel` among them replaces vmtest's own `-accel tcg` (QEMU would take the first one
    /// that works), e.g. `-accel tcg,thread=single`.
    pub qemu_args: Vec<String>,
    /// Wall-clock limit for the whole boot, scenario and power-off.
    pub timeout: Duration,
}

/// How a boot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The guest printed the exit marker with the scenario's status.
    Finished {
        /// The scenario's exit status.
        status: i32,
    },
    /// QEMU exited without the marker (panic, triple fault, init died).
    NoVerdict {
        /// QEMU's exit status.
        qemu: ExitStatus,
    },
    /// The timeout passed before the guest reported; QEMU was killed.
    TimedOut,
}

/// The result of a boot: the outcome, kernel problems seen on the console, the last lines.
#[derive(Debug, Clone)]
pub struct Boot {
    /// How it ended.
    pub outcome: Outcome,
    /// Kernel panics, oopses, `BUG:` and `WARNING:` messages from the console.
    pub problems: Vec<String>,
    /// The last console lines, for error messages.
    pub tail: Vec<String>,
    /// Wall-clock time from start to QEMU's exit.
    pub elapsed: Duration,
    /// On a timeout, the vCPUs sampled through the monitor before QEMU was killed
    /// ([`monitor::SAMPLES`] samples, [`monitor::SAMPLE_GAP`] apart), or why they could not be.
    pub vcpus: Option<Result<Vec<Vec<VcpuState>>, String>>,
}

impl QemuConfig {
    /// The kernel command line.
    pub fn cmdline(&self) -> String {
        BASE_CMDLINE
            .iter()
            .map(|s| (*s).to_owned())
            .chain(self.append.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The QEMU command, its monitor on the Unix socket `monitor` (stdin, stdout and stderr
    /// are set by [`boot`]).
    pub fn command(&self, monitor: &Path) -> Command {
        let mut cmd = Command::new(&self.qemu);
        if !self.qemu_args.iter().any(|a| a == "-accel") {
            cmd.args(["-accel", "tcg"]);
        }
        cmd.arg("-smp")
            .arg(self.cpus.to_string())
            .arg("-m")
            .arg(format!("{}M", self.memory_mib))
            .args(["-display", "none", "-serial", "stdio"])
            .arg("-monitor")
            .arg(format!("unix:{},server=on,wait=off", monitor.display()))
            .args(["-no-reboot", "-nic", "none"])
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&self.initramfs)
            .arg("-append")
            .arg(self.cmdline())
            .args(&self.qemu_args);
        cmd
    }
}

/// Boots the guest, copying the console to `console` as it arrives, until QEMU exits or the
/// timeout passes.
pub fn boot(config: &QemuConfig, console: &mut dyn Write) -> Result<Boot, QemuError> {
    let start = Instant::now();
    let monitor_dir = tempfile::Builder::new()
        .prefix("vmtest-monitor-")
        .tempdir()
        .map_err(QemuError::Wait)?;
    let monitor_socket = monitor_dir.path().join("monitor.sock");
    let mut cmd = config.command(&monitor_socket);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    log::debug!("starting {cmd:?}");
    let mut child = cmd.spawn().map_err(|source| QemuError::Spawn {
        qemu: config.qemu.clone(),
        source,
    })?;
    let mut stdout = child.stdout.take().expect("stdout is piped");

    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });

    let mut scanner = ConsoleScanner::new();
    let mut echo = true;
    let deadline = start + config.timeout;
    let mut poweroff_by: Option<Instant> = None;
    let ended_by_eof = loop {
        let limit = poweroff_by.map_or(deadline, |p| p.min(deadline));
        let now = Instant::now();
        if now >= limit {
            break false;
        }
        match rx.recv_timeout(limit - now) {
            Ok(chunk) => {
                if echo
                    && console
                        .write_all(&chunk)
                        .and_then(|()| console.flush())
                        .is_err()
                {
                    // The reader of our stdout went away; keep running the scenario.
                    echo = false;
                }
                scanner.feed(&chunk);
                if scanner.exit_status().is_some() && poweroff_by.is_none() {
                    poweroff_by = Some(Instant::now() + POWEROFF_GRACE);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break true,
        }
    };
    scanner.finish();

    let timed_out = !ended_by_eof && scanner.exit_status().is_none();
    let vcpus = timed_out.then(|| {
        monitor::sample(&monitor_socket, monitor::SAMPLES, monitor::SAMPLE_GAP).map_err(|e| {
            format!(
                "reading the vCPUs from QEMU's monitor {}: {e}",
                monitor_socket.display()
            )
        })
    });
    let qemu_status = if ended_by_eof {
        wait_or_kill(&mut child, Duration::from_secs(10))?
    } else {
        log::debug!("killing qemu (pid {})", child.id());
        child.kill().map_err(QemuError::Wait)?;
        child.wait().map_err(QemuError::Wait)?
    };
    // Not joined: the reader ends when the pipe closes, which a leftover child of QEMU holding
    // the pipe could delay indefinitely.
    drop(reader);

    let outcome = match scanner.exit_status() {
        Some(status) => Outcome::Finished { status },
        None if ended_by_eof => Outcome::NoVerdict { qemu: qemu_status },
        None => Outcome::TimedOut,
    };
    Ok(Boot {
        outcome,
        problems: scanner.problems().to_vec(),
        tail: scanner.tail().map(str::to_owned).collect(),
        elapsed: start.elapsed(),
        vcpus,
    })
}

/// Waits up to `grace` for `child` to exit by itself, then kills it.
fn wait_or_kill(child: &mut Child, grace: Duration) -> Result<ExitStatus, QemuError> {
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Some(status) = child.try_wait().map_err(QemuError::Wait)? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().map_err(QemuError::Wait)?;
    child.wait().map_err(QemuError::Wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> QemuConfig {
        QemuConfig {
            qemu: "qemu-system-x86_64".into(),
            kernel: "/boot/vmlinuz-6.1.0-56-cloud-amd64".into(),
            initramfs: "/tmp/initramfs.cpio.gz".into(),
            memory_mib: 512,
            cpus: 2,
            append: vec!["loglevel=7".into()],
            qemu_args: Vec::new(),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn command_uses_tcg_two_cpus_no_reboot_and_serial_stdio() {
        let cmd = config().command(Path::new("/tmp/m.sock"));
        let args: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let pair = |flag: &str| {
            let at = args
                .iter()
                .position(|a| a == flag)
                .unwrap_or_else(|| panic!("{flag} missing: {args:?}"));
            args[at + 1].clone()
        };
        assert_eq!(pair("-accel"), "tcg");
        assert_eq!(pair("-smp"), "2");
        assert_eq!(pair("-m"), "512M");
        assert_eq!(pair("-serial"), "stdio");
        assert_eq!(pair("-kernel"), "/boot/vmlinuz-6.1.0-56-cloud-amd64");
        assert_eq!(pair("-initrd"), "/tmp/initramfs.cpio.gz");
        assert!(args.iter().any(|a| a == "-no-reboot"));
        assert_eq!(pair("-display"), "none");
        assert_eq!(pair("-monitor"), "unix:/tmp/m.sock,server=on,wait=off");
        assert!(!args.iter().any(|a| a.contains("kvm")), "{args:?}");
    }

    #[test]
    fn extra_qemu_args_come_last_in_order() {
        let config = QemuConfig {
            qemu_args: vec!["-singlestep".into(), "-icount".into(), "shift=0".into()],
            ..config()
        };
        let args: Vec<_> = config
            .command(Path::new("m"))
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args[args.len() - 3..],
            ["-singlestep", "-icount", "shift=0"],
            "{args:?}"
        );
    }

    #[test]
    fn an_extra_accel_replaces_the_default_one() {
        let args = |config: QemuConfig| -> Vec<String> {
            config
                .command(Path::new("m"))
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let default = args(config());
        assert_eq!(default.iter().filter(|a| *a == "-accel").count(), 1);
        assert!(default.windows(2).any(|w| w == ["-accel", "tcg"]));
        let single = args(QemuConfig {
            qemu_args: vec!["-accel".into(), "tcg,thread=single".into()],
            ..config()
        });
        assert_eq!(
            single.iter().filter(|a| *a == "-accel").count(),
            1,
            "{single:?}"
        );
        assert!(single
            .windows(2)
            .any(|w| w == ["-accel", "tcg,thread=single"]));
    }

    #[test]
    fn cmdline_has_nokaslr_and_extra_words_last() {
        let line = config().cmdline();
        assert!(line.starts_with("console=ttyS0 nokaslr panic=-1"), "{line}");
        assert!(line.contains("rdinit=/init"));
        assert!(line.ends_with(" loglevel=7"), "{line}");
    }

    /// The streaming and timeout logic, with a shell script standing in for QEMU.
    fn fake_qemu(script: &str, timeout: Duration) -> (Boot, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-qemu");
        std::fs::write(&fake, format!("#!/bin/sh\n{script}\n")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let config = QemuConfig {
            qemu: fake,
            timeout,
            ..config()
        };
        let mut console = Vec::new();
        let boot = boot(&config, &mut console).unwrap();
        (boot, console)
    }

    #[test]
    fn marker_gives_finished_with_the_status_and_console_is_copied() {
        let (boot, console) = fake_qemu(
            r"printf 'booting\r\n[    1.000000] WARNING: CPU: 0 PID: 1 at x\r\nTRAPVEC-VMTEST-EXIT=3\r\n'",
            Duration::from_secs(30),
        );
        assert_eq!(boot.outcome, Outcome::Finished { status: 3 });
        assert_eq!(boot.problems, ["WARNING: CPU: 0 PID: 1 at x"]);
        assert!(String::from_utf8_lossy(&console).contains("booting\r\n"));
    }

    #[test]
    fn exit_without_marker_is_no_verdict_with_qemus_status() {
        let (boot, _) = fake_qemu(
            "echo '[    2.0] Kernel panic - not syncing: x'; exit 7",
            Duration::from_secs(30),
        );
        match boot.outcome {
            Outcome::NoVerdict { qemu } => assert_eq!(qemu.code(), Some(7)),
            other => panic!("{other:?}"),
        }
        assert_eq!(boot.problems.len(), 1);
    }

    #[test]
    fn silence_past_the_timeout_kills_qemu() {
        let (boot, _) = fake_qemu("echo started; exec sleep 600", Duration::from_millis(800));
        assert_eq!(boot.outcome, Outcome::TimedOut);
        assert!(boot.elapsed < Duration::from_secs(30), "{:?}", boot.elapsed);
        assert_eq!(boot.tail, ["started"]);
        // No monitor behind the fake: the reason is kept, not a panic or a hang.
        assert!(
            matches!(&boot.vcpus, Some(Err(e)) if e.contains("monitor")),
            "{:?}",
            boot.vcpus
        );
    }
}
