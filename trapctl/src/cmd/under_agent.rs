//! Running a command with the LD_PRELOAD agent and a spec, for the process forms of `trapctl
//! cover` and `trapctl trace`.

use std::io::{BufRead as _, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// `name` as the shell finds it: a path when it has a `/`, else the first match on `$PATH`.
pub fn find_command(name: &str) -> Result<PathBuf> {
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("`{name}` is not found on $PATH"))
}

/// How deep `#!` lines may nest (the kernel's `BINPRM_MAX_RECURSION`).
const MAX_SCRIPT_DEPTH: usize = 4;

/// The executable that runs when `program` is executed: `program` itself, or for a script the
/// interpreter its `#!` line names (followed as the kernel does, through at most four
/// scripts). Its code is the process's main image: a script's "own" functions are its
/// interpreter's, and the libraries it links are the interpreter's.
pub fn executable_image(program: &Path) -> Result<PathBuf> {
    let mut at = program.to_path_buf();
    for _ in 0..=MAX_SCRIPT_DEPTH {
        let mut head = [0u8; 256];
        let n = {
            use std::io::Read as _;
            let mut f =
                std::fs::File::open(&at).with_context(|| format!("opening {}", at.display()))?;
            f.read(&mut head)
                .with_context(|| format!("reading {}", at.display()))?
        };
        let Some(line) = head[..n].strip_prefix(b"#!") else {
            return Ok(at);
        };
        let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
        let text = String::from_utf8_lossy(line);
        let Some(interpreter) = text.split_whitespace().next() else {
            bail!("{}: its `#!` line names no interpreter", at.display());
        };
        log::debug!("{}: a script run by {interpreter}", at.display());
        at = PathBuf::from(interpreter);
    }
    bail!(
        "{}: `#!` interpreters nest more than {MAX_SCRIPT_DEPTH} deep",
        program.display()
    )
}

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
