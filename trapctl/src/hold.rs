//! How long a command that holds a splice (`trapctl count`, `trapctl time`) holds it, and how
//! it ends: `--seconds N`, until a signal (SIGINT, SIGTERM, SIGHUP: Ctrl-C, `kill`, a closed
//! terminal), or while `-- COMMAND ARGS` runs. Whichever way, the splice is removed and the
//! figures printed before trapctl exits, as `perf stat` and bpftrace do.
//!
//! The signals are *blocked* and read from a signalfd ([`Watch`]), never caught by a handler:
//! nothing runs in signal context, and a signal that arrives while the splice is being made
//! waits, pending, until trapctl looks (it then removes the splice at once). The watch starts
//! before the splice is made. A signal ignored when trapctl started (nohup's SIGHUP, the
//! SIGINT of a background job of a non-interactive shell) stays ignored: it is not watched.
//!
//! How trapctl ends ([`finish`]):
//! - the time is up: status 0;
//! - a signal, without a command: the splice removed and the figures printed, trapctl ends by
//!   the same signal (its default action, as `perf stat` re-raises it), so a shell sees
//!   "killed by SIGINT" (status 130 in `$?`) and a script stops as it would for any program;
//! - with a command: the command's status (its exit code; 128+N if it died of signal N), unless
//!   trapctl itself got a signal, which it then ends by, as above. A signal sent to trapctl by
//!   a process (`kill`) is forwarded to the command, and trapctl waits for the command to exit;
//!   one the kernel sent (a terminal's Ctrl-C or hangup) reached the command already, as the
//!   terminal signals its whole foreground process group, and is not sent again. A signal
//!   that came while the splice was being made ends the hold before the command starts.
//!
//! The command gets an empty signal mask (trapctl's blocked signals are unblocked in the child
//! before exec; Rust's `Command` keeps the parent's mask) and the dispositions trapctl started
//! with.

use std::cell::Cell;
use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, Signal};
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

/// The signals that end a hold.
const WATCHED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// The longest single wait (poll's timeout is an i32 of milliseconds); a longer span waits
/// again. The wait sleeps in poll() on the signalfd, woken only by a watched signal, SIGCHLD
/// or the deadline: a hold makes no system calls of its own meanwhile (a timer on
/// do_nanosleep measures the workload, not trapctl).
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// How long a command holds its splice: `--seconds N`, or `-- COMMAND ARGS`, or neither
/// (until a signal).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Span {
    /// How long to hold the splice [default: until SIGINT (Ctrl-C), SIGTERM or SIGHUP].
    #[arg(long, value_name = "N", value_parser = parse_seconds, conflicts_with = "command")]
    pub seconds: Option<f64>,
    /// Run COMMAND ARGS (after `--`) and hold the splice while it runs; trapctl exits with its status.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// A `--seconds` that is no duration.
#[derive(Debug, thiserror::Error)]
#[error("`{text}` is not a duration in seconds (a finite, non-negative number)")]
pub struct SecondsError {
    text: String,
}

fn parse_seconds(text: &str) -> Result<f64, SecondsError> {
    match text.parse::<f64>() {
        Ok(s) if s.is_finite() && s >= 0.0 => Ok(s),
        _ => Err(SecondsError {
            text: text.to_string(),
        }),
    }
}

impl Span {
    /// As the announcing line says it: `for 5 s`, `until Ctrl-C`, `while `make -j2` runs`.
    pub fn describe(&self) -> String {
        match (self.seconds, self.command.is_empty()) {
            (Some(s), _) => format!("for {s} s"),
            (None, true) => "until Ctrl-C (SIGINT, SIGTERM or SIGHUP)".to_string(),
            (None, false) => format!("while `{}` runs", self.command_text()),
        }
    }

    fn command_text(&self) -> String {
        self.command
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// How long it lasted, as the last line says it: the `--seconds` given when the time ran
    /// out, else the time measured.
    pub fn lasted(&self, ended: &Ended, elapsed: Duration) -> String {
        match (ended, self.seconds) {
            (Ended::Elapsed, Some(s)) => format!("{s}"),
            _ => format!("{:.2}", elapsed.as_secs_f64()),
        }
    }

    /// The seconds to report in JSON: the `--seconds` given when the time ran out, else the
    /// time measured.
    pub fn seconds_held(&self, ended: &Ended, elapsed: Duration) -> f64 {
        match (ended, self.seconds) {
            (Ended::Elapsed, Some(s)) => s,
            _ => elapsed.as_secs_f64(),
        }
    }
}

/// Why a hold ended.
#[derive(Clone, Copy, Debug)]
pub enum Ended {
    /// `--seconds` ran out.
    Elapsed,
    /// trapctl got this signal (and, with a command, the command has exited since).
    Signal(Signal),
    /// The command exited by itself.
    Command(ExitStatus),
}

impl Ended {
    /// For reports: `time`, `command`, or the signal's name (`SIGTERM`).
    pub fn name(&self) -> &'static str {
        match self {
            Ended::Elapsed => "time",
            Ended::Signal(signal) => signal.as_str(),
            Ended::Command(_) => "command",
        }
    }
}

/// The watched signals, blocked and readable from a signalfd.
pub struct Watch {
    fd: SignalFd,
    /// The first watched signal trapctl got while holding a command, kept across
    /// [`Watch::wait`]s: a caller that waits in slices (a trace that looks at its probes'
    /// data between them) must still end by it when the command exits in a later slice.
    got: Cell<Option<Signal>>,
}

impl Watch {
    /// Block the signals that end a hold (except those inherited as ignored) in this thread,
    /// before the splice is made. trapctl has no other thread, so none can take them.
    pub fn start() -> Result<Watch> {
        let ignored = inherited_ignored();
        let mut watched = SigSet::empty();
        for s in WATCHED {
            if ignored.contains(s) {
                log::debug!("{s} was ignored when trapctl started: it stays ignored");
            } else {
                watched.add(s);
            }
        }
        // SIGCHLD only wakes the wait when a command exits; it is never a reason to stop.
        watched.add(Signal::SIGCHLD);
        watched
            .thread_block()
            .context("blocking SIGINT, SIGTERM, SIGHUP and SIGCHLD")?;
        let fd = SignalFd::with_flags(&watched, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .context("opening a signalfd")?;
        Ok(Watch {
            fd,
            got: Cell::new(None),
        })
    }

    /// The next pending watched signal, and whether the kernel sent it (a terminal's Ctrl-C or
    /// hangup, sent to the whole foreground process group) rather than a process.
    fn next(&self) -> Result<Option<(Signal, bool)>> {
        loop {
            let Some(info) = self.fd.read_signal().context("reading the signalfd")? else {
                return Ok(None);
            };
            let Ok(signo) = i32::try_from(info.ssi_signo) else {
                continue;
            };
            let Ok(signal) = Signal::try_from(signo) else {
                continue;
            };
            if signal == Signal::SIGCHLD {
                continue;
            }
            return Ok(Some((signal, info.ssi_code == libc::SI_KERNEL)));
        }
    }

    /// A watched signal that is pending now, if any (for a loop that checks between steps).
    pub fn pending(&self) -> Result<Option<Signal>> {
        Ok(self.next()?.map(|(signal, _)| signal))
    }

    /// Wait until `span` is over: the time is up, a signal came (with a command: and the
    /// command has exited), or the command exited.
    pub fn wait(
        &self,
        span: &Span,
        mut child: Option<&mut Child>,
        start: Instant,
    ) -> Result<Ended> {
        let deadline = span.seconds.map(|s| start + Duration::from_secs_f64(s));
        loop {
            while let Some((signal, from_kernel)) = self.next()? {
                log::debug!(
                    "{signal} ({})",
                    if from_kernel {
                        "from the kernel"
                    } else {
                        "from a process"
                    }
                );
                if self.got.get().is_none() {
                    self.got.set(Some(signal));
                }
                match child.as_deref() {
                    None => return Ok(Ended::Signal(signal)),
                    Some(c) if !from_kernel => {
                        let pid =
                            Pid::from_raw(i32::try_from(c.id()).context("the command's pid")?);
                        // The command may have exited meanwhile (not reaped yet: the pid is still its).
                        if let Err(e) = nix::sys::signal::kill(pid, signal) {
                            log::debug!("forwarding {signal} to the command: {e}");
                        }
                    }
                    Some(_) => {}
                }
            }
            if let Some(c) = child.as_deref_mut() {
                if let Some(status) = c.try_wait().context("waiting for the command")? {
                    log::debug!("the command exited: {status}");
                    return Ok(self.got.get().map_or(Ended::Command(status), Ended::Signal));
                }
            }
            let now = Instant::now();
            let wait = match deadline {
                Some(d) if now >= d => return Ok(Ended::Elapsed),
                Some(d) => LONGEST_WAIT.min(d - now),
                None => LONGEST_WAIT,
            };
            // Rounded up: woken a little early, the loop would only wait again.
            let ms = i32::try_from(wait.as_millis() + 1).unwrap_or(i32::MAX);
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(e).context("waiting on the signalfd"),
            }
        }
    }

    /// End this process by `signal`'s default action: raised while blocked, then unblocked.
    fn die_by(&self, signal: Signal) {
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        if nix::sys::signal::raise(signal).is_ok() {
            let _ = SigSet::from(signal).thread_unblock();
        }
    }
}

/// Start `span`'s command, if it has one.
pub fn spawn(span: &Span) -> Result<Option<Child>> {
    let Some((program, args)) = span.command.split_first() else {
        return Ok(None);
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: it makes one, sigprocmask (pthread_sigmask), and neither allocates nor
    // locks (an empty SigSet is a value on the stack).
    unsafe {
        cmd.pre_exec(|| {
            SigSet::empty()
                .thread_set_mask()
                .map_err(std::io::Error::from)
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("running `{}`", span.command_text()))?;
    Ok(Some(child))
}

/// End trapctl as the hold ended (see the module docs): return for status 0, exit with the
/// command's status, or die by the signal trapctl got.
pub fn finish(watch: &Watch, ended: Ended) -> Result<()> {
    let status = match ended {
        Ended::Elapsed => return Ok(()),
        Ended::Signal(signal) => {
            watch.die_by(signal);
            // Not reached unless the signal could not be raised.
            128 + signal as i32
        }
        Ended::Command(status) => match (status.code(), status.signal()) {
            (Some(0), _) => return Ok(()),
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => 1,
        },
    };
    let _ = std::io::stdout().flush();
    std::process::exit(status)
}

/// The signals this process started with ignored (`SigIgn:` in /proc/self/status), among
/// [`WATCHED`]; none if it cannot be read.
fn inherited_ignored() -> SigSet {
    let mut set = SigSet::empty();
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return set;
    };
    let Some(mask) = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
    else {
        return set;
    };
    for s in WATCHED {
        // Bit N-1 is signal N.
        if mask & (1u64 << (s as u32 - 1)) != 0 {
            set.add(s);
        }
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_must_be_a_finite_non_negative_number() {
        assert_eq!(parse_seconds("1.5").unwrap(), 1.5);
        for bad in ["-1", "inf", "NaN", "soon"] {
            assert!(
                parse_seconds(bad)
                    .unwrap_err()
                    .to_string()
                    .contains(&format!("`{bad}`")),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_span_is_announced_as_it_was_given() {
        assert_eq!(
            Span {
                seconds: Some(5.0),
                command: vec![]
            }
            .describe(),
            "for 5 s"
        );
        assert_eq!(
            Span::default().describe(),
            "until Ctrl-C (SIGINT, SIGTERM or SIGHUP)"
        );
        assert_eq!(
            Span {
                seconds: None,
                command: vec!["sleep".into(), "1".into()]
            }
            .describe(),
            "while `sleep 1` runs"
        );
    }

    /// A signal forwarded to the command in one slice of a sliced wait (a trace looks at its
    /// probes' data every 50 ms), the command exiting in a later one: the hold ends by the
    /// signal, not as if the command had ended by itself.
    #[test]
    fn a_signal_forwarded_in_one_slice_still_ends_the_hold_when_the_command_exits_later() {
        use std::io::BufRead as _;
        // The command handles SIGTERM by taking 300 ms to exit 0 (longer than a slice).
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "trap 'sleep 0.3; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        let watch = Watch::start().unwrap();
        // From a process (not the kernel), to this thread, where it is blocked and pending.
        // SAFETY: tgkill with this process's and this thread's ids and a valid signal.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                libc::gettid(),
                libc::SIGTERM,
            )
        };
        assert_eq!(rc, 0);
        let slice = Span {
            seconds: Some(0.05),
            command: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut slices = 0;
        let ended = loop {
            assert!(Instant::now() < deadline, "the command did not exit");
            match watch
                .wait(&slice, Some(&mut child), Instant::now())
                .unwrap()
            {
                Ended::Elapsed => slices += 1,
                other => break other,
            }
        };
        assert!(slices >= 1, "the command exited within the first slice");
        assert!(
            matches!(ended, Ended::Signal(Signal::SIGTERM)),
            "ended as {}",
            ended.name()
        );
    }
}
