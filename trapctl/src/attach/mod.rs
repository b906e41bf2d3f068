//! Attaching to a running process: the checks that refuse before anything is changed
//! ([`check`]), the agent loaded by ptrace ([`inject`]), and the client of the agent's control
//! channel (trapd's wire format on the agent's own socket, see `agent/src/control.rs`).

pub mod inject;
pub mod maps;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use instr_manager::ops::{Reply, WrongReply};
use serde_json::Value;
use trapvec_proto::Request;

/// Why a process is not attached to; nothing was changed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("no process {pid}")]
    NoProcess { pid: i32 },
    #[error("process {pid} has exited (a zombie)")]
    Exited { pid: i32 },
    #[error("process {pid} belongs to uid {uid}, not to you (uid {me}): attach as that user, or as root")]
    OtherUser { pid: i32, uid: u32, me: u32 },
    #[error("process {pid} is already traced by process {tracer} ({comm}): only one tracer at a time; detach it first")]
    Traced { pid: i32, tracer: i32, comm: String },
    #[error("yama forbids it: kernel.yama.ptrace_scope is {scope} ({meaning}); {fix}")]
    Yama {
        scope: u32,
        meaning: &'static str,
        fix: &'static str,
    },
    #[error("process {pid} ({exe}) is statically linked (no program interpreter, no libc.so.6 mapped): the agent can only be loaded with glibc's dlopen")]
    Static { pid: i32, exe: String },
    #[error("process {pid} is in seccomp strict mode: it may make no system call the agent needs")]
    SeccompStrict { pid: i32 },
}

/// What yama's `ptrace_scope` allows us: `None`, or the refusal (`scope` as read from
/// /proc/sys/kernel/yama/ptrace_scope; `cap_sys_ptrace` ours; `descendant` whether the target
/// descends from us).
pub fn yama_refusal(scope: u32, cap_sys_ptrace: bool, descendant: bool) -> Option<Refusal> {
    let fix = "run `sysctl kernel.yama.ptrace_scope=0`, or attach as root (CAP_SYS_PTRACE)";
    match scope {
        0 => None,
        1 if cap_sys_ptrace || descendant => None,
        1 => Some(Refusal::Yama {
            scope,
            meaning: "restricted: only a parent may trace its descendants",
            fix,
        }),
        2 if cap_sys_ptrace => None,
        2 => Some(Refusal::Yama {
            scope,
            meaning: "admin-only attach",
            fix: "attach as root (CAP_SYS_PTRACE), or run `sysctl kernel.yama.ptrace_scope=0`",
        }),
        _ => Some(Refusal::Yama {
            scope,
            meaning: "no attach at all, until reboot",
            fix: "no process can be attached to until the next boot (the setting cannot be lowered); start the program under the agent instead (LD_PRELOAD, TRAPVEC_CONTROL=1)",
        }),
    }
}

/// Whether we have CAP_SYS_PTRACE (bit 19 of `CapEff`).
fn cap_sys_ptrace() -> bool {
    maps::status_field(std::process::id().cast_signed(), "CapEff")
        .and_then(|c| u64::from_str_radix(c.trim(), 16).ok())
        .is_some_and(|c| c & (1 << 19) != 0)
}

/// Whether `pid` descends from this process.
fn descends_from_us(pid: i32) -> bool {
    let me = std::process::id().cast_signed();
    let mut p = pid;
    for _ in 0..256 {
        if p == me {
            return true;
        }
        match maps::status_field(p, "PPid").and_then(|v| v.trim().parse::<i32>().ok()) {
            Some(pp) if pp > 0 => p = pp,
            _ => return false,
        }
    }
    false
}

/// The checks made before the process is touched: its owner, another tracer, yama, a static
/// binary, seccomp strict mode. (Forbidden executable mappings are probed once it is held,
/// before the agent is loaded: see [`inject`].)
pub fn check(pid: i32) -> Result<(), Refusal> {
    let Some(uids) = maps::status_field(pid, "Uid") else {
        return Err(Refusal::NoProcess { pid });
    };
    if maps::status_field(pid, "State")
        .is_some_and(|s| matches!(s.trim().chars().next(), Some('Z' | 'X')))
    {
        return Err(Refusal::Exited { pid });
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let root = me == 0 || cap_sys_ptrace();
    // The kernel wants the real, effective and saved uids all ours.
    if let Some(uid) = uids
        .split_whitespace()
        .take(3)
        .filter_map(|u| u.parse::<u32>().ok())
        .find(|u| *u != me)
    {
        if !root {
            return Err(Refusal::OtherUser { pid, uid, me });
        }
    }
    let tracer = maps::status_field(pid, "TracerPid")
        .and_then(|t| t.trim().parse::<i32>().ok())
        .unwrap_or(0);
    if tracer != 0 {
        let comm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        return Err(Refusal::Traced { pid, tracer, comm });
    }
    if let Some(scope) = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
    {
        if let Some(r) = yama_refusal(scope, cap_sys_ptrace(), descends_from_us(pid)) {
            return Err(r);
        }
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".into());
    // An unreadable executable is not called static here: the maps decide then.
    let interp = std::fs::read(format!("/proc/{pid}/exe")).map_or(true, |d| has_interp(&d));
    if !interp || !maps::has_libc(pid).unwrap_or(false) {
        return Err(Refusal::Static { pid, exe });
    }
    if maps::seccomp_mode(pid) == Some(1) {
        return Err(Refusal::SeccompStrict { pid });
    }
    Ok(())
}

/// Whether an ELF file has a PT_INTERP program header.
fn has_interp(data: &[u8]) -> bool {
    use object::elf::{FileHeader64, PT_INTERP};
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let Ok(h) = FileHeader64::<object::Endianness>::parse(data) else {
        return false;
    };
    let Ok(endian) = h.endian() else { return false };
    h.program_headers(endian, data)
        .map(|phs| phs.iter().any(|p| p.p_type(endian) == PT_INTERP))
        .unwrap_or(false)
}

/// Where the agent in `pid` may listen: under the process's `$XDG_RUNTIME_DIR`, else under
/// `/tmp/trapvec-UID`.
pub fn socket_candidates(pid: i32) -> Vec<PathBuf> {
    let name = format!("agent-{pid}.sock");
    let mut v = Vec::new();
    if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
        if let Some(dir) = env
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(b"XDG_RUNTIME_DIR="))
            .filter(|d| !d.is_empty())
        {
            use std::os::unix::ffi::OsStrExt as _;
            v.push(
                Path::new(std::ffi::OsStr::from_bytes(dir))
                    .join("trapvec")
                    .join(&name),
            );
        }
    }
    if let Some(uid) =
        maps::status_field(pid, "Uid").and_then(|u| u.split_whitespace().nth(1).map(str::to_string))
    {
        v.push(PathBuf::from(format!("/tmp/trapvec-{uid}")).join(&name));
    }
    v
}

/// The socket of the agent answering in `pid`, if one does.
pub fn agent_socket(pid: i32) -> Option<PathBuf> {
    socket_candidates(pid)
        .into_iter()
        .find(|p| UnixStream::connect(p).is_ok())
}

/// Attach to `pid` unless its agent already answers: the checks, then the agent loaded and its
/// channel started; the socket. `verbose`: print the figures (threads, time held) on stderr;
/// `call_timeout`: how long the injected `dlopen` may take before it is undone.
pub fn attach(pid: i32, agent: &Path, verbose: bool, call_timeout: Duration) -> Result<PathBuf> {
    if let Some(s) = agent_socket(pid) {
        return Ok(s);
    }
    check(pid)?;
    let agent = inject::agent_path(agent).with_context(|| agent.display().to_string())?;
    let plan = inject::Plan::new(pid, &agent)?;
    let start = Instant::now();
    let mut held = inject::Held::stop_all(pid, call_timeout)?;
    let stopped = start.elapsed();
    let loaded = held.load_agent(&plan);
    held.release();
    let total = start.elapsed();
    let f = &held.figures;
    if verbose {
        let mut us: Vec<u64> = f.held_us.iter().map(|(_, u)| *u).collect();
        us.sort_unstable();
        let p = |percent: usize| {
            us.get(us.len().saturating_sub(1) * percent / 100)
                .copied()
                .unwrap_or(0)
        };
        eprintln!(
            "attach: {} threads ({} in a restartable system call) stopped in {} µs; held stopped: p50 {} µs, p99 {} µs, max {} µs; calls made in thread {}; attach took {} µs",
            f.threads,
            f.in_syscall,
            stopped.as_micros(),
            p(50),
            p(99),
            us.last().copied().unwrap_or(0),
            f.caller,
            total.as_micros()
        );
    }
    loaded?;
    // The channel's thread runs now that the process goes on.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(s) = agent_socket(pid) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the agent was loaded into process {pid} but its control channel does not answer (tried {})",
                socket_candidates(pid)
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Send one request line to the agent at `socket`; its reply with `ok` true, else its error.
pub fn send(pid: i32, socket: &Path, request: &Value) -> Result<Value> {
    let mut s = UnixStream::connect(socket)
        .with_context(|| format!("the agent of process {pid} at {}", socket.display()))?;
    let mut line = String::new();
    writeln!(s, "{request}")
        .and_then(|()| BufReader::new(&s).read_line(&mut line))
        .with_context(|| format!("the agent of process {pid} at {}", socket.display()))?;
    if line.is_empty() {
        anyhow::bail!("the agent of process {pid} closed its channel without a reply");
    }
    let reply: Value = serde_json::from_str(&line)
        .with_context(|| format!("the agent of process {pid} answered `{}`", line.trim()))?;
    if reply["ok"] != Value::Bool(true) {
        anyhow::bail!(
            "process {pid}: {}",
            reply["error"].as_str().unwrap_or("request refused")
        );
    }
    Ok(reply)
}

/// Send `request` to the agent and read the typed reply `R` back.
pub fn ask<R: TryFrom<Reply, Error = WrongReply>>(
    pid: i32,
    socket: &Path,
    request: &Request,
) -> Result<R> {
    let mut fields = send(pid, socket, &serde_json::to_value(request)?)?;
    if let Value::Object(m) = &mut fields {
        m.remove("ok");
    }
    let reply = Reply::from_fields(request, fields)
        .with_context(|| format!("the agent's reply to `{}`", request.op()))?;
    Ok(R::try_from(reply)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yama_scope_1_refuses_a_non_descendant_without_cap_sys_ptrace_and_says_what_to_change() {
        assert_eq!(yama_refusal(0, false, false), None);
        assert_eq!(yama_refusal(1, false, true), None);
        assert_eq!(yama_refusal(1, true, false), None);
        let r = yama_refusal(1, false, false).expect("refused");
        assert!(
            r.to_string().contains("sysctl kernel.yama.ptrace_scope=0"),
            "{r}"
        );
        assert!(r.to_string().contains("CAP_SYS_PTRACE"), "{r}");
        assert!(
            yama_refusal(2, false, true).is_some(),
            "2: admin only, descendants too"
        );
        assert_eq!(yama_refusal(2, true, false), None);
        assert!(yama_refusal(3, true, true)
            .unwrap()
            .to_string()
            .contains("next boot"));
    }
}
