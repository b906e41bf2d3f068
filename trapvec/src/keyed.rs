//! Keyed counts: a splice's hits counted by who made them (bpftrace's `@[tid] = count()`,
//! `@[pid] = count()`), the
//! types of the [`crate::Target`] contract. The process runtime is [`crate::process::keyed`].
//!
//! A keyed count is an ordinary call splice whose handler is the target's counting routine
//! ([`KeySlot::entry`]): it reads the key of the hit and adds one to that key's entry in a
//! bounded table of the slot. A hit whose key finds the table full is counted as overflow, so
//! the entries and the overflow always add up to the splice's hits.

/// What the hits are counted by. `pid` is the process and `tid` the thread, as in bpftrace, perf
/// and ps: in the kernel `pid` is the task's `tgid` and `tid` its `pid` (the kernel's thread id);
/// in a process `pid` is `getpid()` (one key) and `tid` `gettid()`.
///
/// `tgid`, the old spelling of `pid`, is still read as `pid` ([`KeyBy::parse`] says so, and
/// [`str::parse`] warns on stderr once, [`OLD_TGID`]); serde reads it silently. Before this
/// release `pid` was the kernel's task->pid (a thread): what was saved then is read with
/// [`KeyBy::parse_old`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum KeyBy {
    /// The thread (kernel: the task's `pid`; a process: `gettid()`).
    Tid,
    /// The process (kernel: the task's `tgid`; a process: `getpid()`).
    #[cfg_attr(feature = "serde", serde(alias = "tgid"))]
    Pid,
    /// The task's name.
    Comm,
    /// The CPU the hit ran on.
    Cpu,
}

/// The warning for the old spelling `tgid` of a key, printed on stderr once per run.
pub const OLD_TGID: &str = "trapvec: warning: key `tgid` is the old spelling of `pid` (the \
process), read as `pid`; `tid` is the thread";

/// The keys' names, as help texts list them.
pub const KEY_NAMES: &[&str] = &["tid", "pid", "comm", "cpu"];

impl KeyBy {
    pub fn name(self) -> &'static str {
        match self {
            KeyBy::Tid => "tid",
            KeyBy::Pid => "pid",
            KeyBy::Comm => "comm",
            KeyBy::Cpu => "cpu",
        }
    }

    /// A key as written now, and whether it was the old spelling `tgid` (read as `pid`).
    pub fn parse(s: &str) -> Result<(KeyBy, bool), String> {
        match s {
            "tid" => Ok((KeyBy::Tid, false)),
            "pid" => Ok((KeyBy::Pid, false)),
            "tgid" => Ok((KeyBy::Pid, true)),
            "comm" => Ok((KeyBy::Comm, false)),
            "cpu" => Ok((KeyBy::Cpu, false)),
            other => Err(format!(
                "unknown key `{other}` (tid: the thread, pid: the process, comm or cpu)"
            )),
        }
    }

    /// A key as written before `pid` meant the process: `pid` was the kernel's task->pid (the
    /// thread, now `tid`) and `tgid` the process (now `pid`).
    pub fn parse_old(s: &str) -> Result<KeyBy, String> {
        match s {
            "pid" => Ok(KeyBy::Tid),
            other => KeyBy::parse(other).map(|(by, _)| by),
        }
    }
}

/// Print [`OLD_TGID`] on stderr, the first time in this process.
pub fn warn_old_tgid() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| eprintln!("{OLD_TGID}"));
}

/// [`KeyBy::parse`], warning ([`warn_old_tgid`]) for `tgid`.
impl std::str::FromStr for KeyBy {
    type Err = String;
    fn from_str(s: &str) -> Result<KeyBy, String> {
        let (by, old) = KeyBy::parse(s)?;
        if old {
            warn_old_tgid();
        }
        Ok(by)
    }
}

/// A keyed count's place in a target's runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KeySlot {
    pub index: u32,
    /// The call splice's handler: the target's counting routine.
    pub entry: u64,
    /// The call splice's cookie.
    pub cookie: u64,
}

/// One key and its hits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KeyCount {
    /// The key as text: a number (`tid`, `pid`, `cpu`) or a name (`comm`).
    pub key: String,
    pub count: u64,
}

/// A keyed count's table, most hits first (ties by key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct KeyCounts {
    pub keys: Vec<KeyCount>,
    /// Hits whose key found the table full.
    pub overflow: u64,
}

impl KeyCounts {
    /// Sort as reports show the table: most hits first, then by key.
    pub fn sorted(mut self) -> KeyCounts {
        self.keys
            .sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        self
    }

    /// The total of every entry and the overflow (the splice's hits).
    pub fn total(&self) -> u64 {
        self.keys.iter().map(|k| k.count).sum::<u64>() + self.overflow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_is_the_process_tid_the_thread_and_tgid_the_old_spelling_of_pid() {
        let read = |s: &str| KeyBy::parse(s);
        assert_eq!(read("pid"), Ok((KeyBy::Pid, false)));
        assert_eq!(read("tid"), Ok((KeyBy::Tid, false)));
        assert_eq!(
            read("tgid"),
            Ok((KeyBy::Pid, true)),
            "tgid is pid, flagged old"
        );
        assert_eq!(read("comm"), Ok((KeyBy::Comm, false)));
        assert_eq!(read("cpu"), Ok((KeyBy::Cpu, false)));
        let e = read("thread").unwrap_err();
        assert!(
            e.contains("`thread`") && e.contains("pid: the process"),
            "{e}"
        );
        assert_eq!("tgid".parse::<KeyBy>(), Ok(KeyBy::Pid));
        assert_eq!("pid".parse::<KeyBy>(), Ok(KeyBy::Pid));
        for by in [KeyBy::Tid, KeyBy::Pid, KeyBy::Comm, KeyBy::Cpu] {
            assert_eq!(by.name().parse::<KeyBy>(), Ok(by), "the name reads back");
            assert!(KEY_NAMES.contains(&by.name()));
        }
        assert!(OLD_TGID.contains("`pid`") && OLD_TGID.contains("`tid` is the thread"));
    }

    #[test]
    fn keys_saved_before_the_change_keep_their_meaning() {
        // `pid` was task->pid (a thread), `tgid` the process.
        assert_eq!(KeyBy::parse_old("pid"), Ok(KeyBy::Tid));
        assert_eq!(KeyBy::parse_old("tgid"), Ok(KeyBy::Pid));
        assert_eq!(KeyBy::parse_old("tid"), Ok(KeyBy::Tid));
        assert_eq!(KeyBy::parse_old("comm"), Ok(KeyBy::Comm));
        assert_eq!(KeyBy::parse_old("cpu"), Ok(KeyBy::Cpu));
        assert!(KeyBy::parse_old("x").is_err());
    }
}
