//! Who holds a splice for a while: the command (`trapctl count`, `trapctl time`) that made it
//! and means to remove it itself when it ends. The owner is recorded in the splice's request
//! ([`crate::SpliceOptions::owner`]), so it is saved with the state and travels through trapd;
//! a splice whose owner is gone (killed by SIGKILL, which nothing can catch) is *orphaned*:
//! listed as such and removed by `trapctl unsplice --orphans` ([`crate::ops::unsplice_orphans`]).
//!
//! A process is named by its pid and its start time (`/proc/PID/stat`, field 22, in clock
//! ticks after boot), so a pid the kernel has given to another process since is not taken for
//! the owner. A zombie (killed, not yet reaped by its parent) is gone: it will never remove
//! anything.

use serde::{Deserialize, Serialize};

/// The process that holds a splice.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// Its start time, clock ticks after boot (`/proc/PID/stat` field 22).
    pub start: u64,
    /// What it runs, for people: `trapctl time tcp_sendmsg`; at most [`COMMAND_MAX`] bytes
    /// and a note of the length, since every splice of the command records it.
    pub command: String,
}

/// The most of an owner's command line an [`Owner`] keeps. Every splice records its owner, in
/// the spec a front end sends and in the saved state: `trapctl cover` of every traceable
/// function (34,516 names, 600 KB of command line) over a million blocks would otherwise carry
/// 600 KB per splice (it ran a 3 GiB guest out of memory).
pub const COMMAND_MAX: usize = 160;

/// `command`, cut to [`COMMAND_MAX`] bytes at a character boundary with `… (N bytes)` after
/// it when it is longer.
fn bounded(command: String) -> String {
    if command.len() <= COMMAND_MAX {
        return command;
    }
    let mut end = COMMAND_MAX;
    while !command.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &command[..end], command.len())
}

/// Why this process could not name itself as an owner.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("reading /proc/self/stat (to record this command as the splice's owner)")]
    Read(#[source] std::io::Error),
    #[error("/proc/self/stat has no start time in field 22: `{text}`")]
    Parse { text: String },
}

impl Owner {
    /// This process, running `command`.
    pub fn current(command: impl Into<String>) -> Result<Owner, OwnerError> {
        let text = std::fs::read_to_string("/proc/self/stat").map_err(OwnerError::Read)?;
        let (_, start) = parse_stat(&text).ok_or_else(|| OwnerError::Parse {
            text: text.trim().to_string(),
        })?;
        Ok(Owner {
            pid: std::process::id(),
            start,
            command: bounded(command.into()),
        })
    }

    /// Whether the owner has ended: no process has its pid, the one that has it started at
    /// another time (a reused pid), or it is a zombie.
    pub fn is_gone(&self) -> bool {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return true;
        };
        match parse_stat(&text) {
            Some((state, start)) => start != self.start || matches!(state, 'Z' | 'X'),
            None => true,
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} `{}`", self.pid, self.command)
    }
}

/// What a kernel `trapctl trace` names the component it loads: `trace_PID`, after its own pid.
/// The trace removes it itself however it ends, except when killed by SIGKILL.
pub const TRACE_COMPONENT_PREFIX: &str = "trace_";

/// The pid of the `trapctl trace` that loaded component `name` (`trace_PID`), if it is one.
pub fn trace_component_pid(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(TRACE_COMPONENT_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&pid| pid > 0)
}

/// Whether component `name` is a trace's whose trapctl is gone (no process has its pid, or a
/// zombie does): orphaned, as a splice whose owner is gone. The name holds no start time: if
/// the pid has been given to another process since, the component is not taken for an orphan
/// (kept, never removed from under a live trace).
pub fn is_orphaned_trace(name: &str) -> bool {
    let Some(pid) = trace_component_pid(name) else {
        return false;
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => match parse_stat(&text) {
            Some((state, _)) => matches!(state, 'Z' | 'X'),
            None => true,
        },
        Err(_) => true,
    }
}

/// The state (field 3) and start time (field 22) of a `/proc/PID/stat` line. The command
/// (field 2) is in parentheses and may hold spaces and parentheses itself: the fields after it
/// begin behind the last `)`.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 was the state; field 22 is 19 further on.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_behind_the_last_parenthesis_of_the_command() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 0\n";
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_stat("4242 (x) S 1 2"), None, "too short");
    }

    #[test]
    fn a_trace_component_is_orphaned_when_no_process_has_its_pid() {
        assert_eq!(trace_component_pid("trace_4242"), Some(4242));
        for not_a_trace in [
            "trace_",
            "trace_12a",
            "trace_-1",
            "trace_0",
            "mytrace_1",
            "trace",
        ] {
            assert_eq!(trace_component_pid(not_a_trace), None, "{not_a_trace}");
            assert!(!is_orphaned_trace(not_a_trace), "{not_a_trace}");
        }
        let me = std::process::id();
        assert!(
            !is_orphaned_trace(&format!("trace_{me}")),
            "a live trapctl's"
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(
            is_orphaned_trace(&format!("trace_{pid}")),
            "an exited one's"
        );
    }

    #[test]
    fn a_long_command_line_is_kept_cut_with_its_length() {
        let short = "trapctl cover tcp_* --seconds 5";
        assert_eq!(Owner::current(short).unwrap().command, short);
        let names: Vec<String> = (0..40_000).map(|i| format!("f{i}")).collect();
        let long = format!("trapctl cover {}", names.join(" "));
        let kept = Owner::current(long.as_str()).unwrap().command;
        assert!(kept.starts_with("trapctl cover f0 f1 f2 "), "{kept}");
        assert!(
            kept.ends_with(&format!("… ({} bytes)", long.len())),
            "{kept}"
        );
        assert!(kept.len() < COMMAND_MAX + 32, "{}", kept.len());
        // Cut at a character boundary: `é` is two bytes and straddles the limit.
        let accents = format!("x{}", "é".repeat(COMMAND_MAX));
        let kept = Owner::current(accents.as_str()).unwrap().command;
        assert!(
            kept.starts_with(&format!("x{}… (", "é".repeat((COMMAND_MAX - 1) / 2))),
            "{kept}"
        );
    }

    #[test]
    fn this_process_is_its_own_live_owner_and_a_changed_start_or_pid_is_gone() {
        let me = Owner::current("test").unwrap();
        assert_eq!(me.pid, std::process::id());
        assert!(!me.is_gone());
        assert!(
            Owner {
                start: me.start + 1,
                ..me.clone()
            }
            .is_gone(),
            "a reused pid is another process"
        );
        assert!(Owner {
            pid: u32::MAX,
            ..me
        }
        .is_gone());
    }
}
