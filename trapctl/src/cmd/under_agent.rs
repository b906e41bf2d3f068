//! Running a command with the LD_PRELOAD agent and a spec, for the process forms of `trapctl
//! cover` and `trapctl trace`.

use std::io::{BufRead as _, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

/// The agent's exit status when a spec cannot be applied (`agent::EXIT_SPEC_FAILED`).
pub const SPEC_FAILED: i32 = 86;

/// How a command run under the agent ended.
pub struct Ended {
    /// Its exit status, or 128 + the signal that ended it.
    pub exit: i32,
    /// The agent's reason when it could not apply the spec (the command exited with
    /// [`SPEC_FAILED`] and the agent said why on stderr).
    pub refused: Option<String>,
}

/// A command started under the agent, its stderr passed on by a thread of ours.
pub struct Running {
    child: std::process::Child,
    stderr: Option<std::thread::JoinHandle<Option<String>>>,
}

impl Running {
    /// The command's process (to signal it or look whether it has exited).
    pub fn child(&mut self) -> &mut std::process::Child {
        &mut self.child
    }

    /// Wait until it has exited and its stderr is passed on.
    pub fn wait(mut self) -> Result<Ended> {
        let refused = self.stderr.take().and_then(|t| t.join().ok().flatten());
        let status = self.child.wait().context("waiting for the command")?;
        let exit = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Ok(Ended {
            exit,
            refused: refused.filter(|_| exit == SPEC_FAILED),
        })
    }
}

/// Run `command` (its `program` resolved) with `agent` preloaded in front of any LD_PRELOAD we
/// have, TRAPVEC_SPEC set to `spec` and the other variables of `env`, and wait for it. The
/// command's stderr goes on to ours as it comes; the agent's refusal line of `spec` is kept,
/// and passed on too only if `echo_refusal`.
pub fn run(
    program: &Path,
    command: &[String],
    agent: &Path,
    spec: &Path,
    env: &[(&str, &Path)],
    echo_refusal: bool,
) -> Result<Ended> {
    spawn(program, command, agent, spec, env, echo_refusal)?.wait()
}

/// Start `command` as [`run`] does, without waiting.
pub fn spawn(
    program: &Path,
    command: &[String],
    agent: &Path,
    spec: &Path,
    env: &[(&str, &Path)],
    echo_refusal: bool,
) -> Result<Running> {
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{} {p}", agent.display()),
        _ => agent.display().to_string(),
    };
    let mut child = Command::new(program)
        .arg0(&command[0])
        .args(&command[1..])
        .env("LD_PRELOAD", preload)
        .env("TRAPVEC_SPEC", spec)
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
    let prefix = format!("trapvec: cannot apply {}: ", spec.display());
    let stderr = child.stderr.take().map(|err| {
        std::thread::spawn(move || {
            let mut refused = None;
            let mut reader = std::io::BufReader::new(err);
            let mut line = Vec::new();
            let mut stderr = std::io::stderr();
            while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
                let text = String::from_utf8_lossy(&line);
                match text.strip_prefix(&prefix) {
                    Some(rest) => {
                        refused = Some(rest.trim_end().to_string());
                        if echo_refusal {
                            let _ = stderr.write_all(&line);
                        }
                    }
                    None => {
                        let _ = stderr.write_all(&line);
                    }
                }
                line.clear();
            }
            refused
        })
    });
    Ok(Running { child, stderr })
}
