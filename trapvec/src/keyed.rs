//! Keyed counts: a splice's hits counted by who made them (bpftrace's `@[tid] = count()`), the
//! types of the [`crate::Target`] contract. The process runtime is [`crate::process::keyed`].
//!
//! A keyed count is an ordinary call splice whose handler is the target's counting routine
//! ([`KeySlot::entry`]): it reads the key of the hit and adds one to that key's entry in a
//! bounded table of the slot. A hit whose key finds the table full is counted as overflow, so
//! the entries and the overflow always add up to the splice's hits.

/// What the hits are counted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
pub enum KeyBy {
    /// The thread (its kernel thread id).
    Tid,
    /// The process (kernel: the task's `tgid`).
    Tgid,
    /// The task's `pid` (kernel; in the kernel's own words, a thread id).
    Pid,
    /// The task's name.
    Comm,
    /// The CPU the hit ran on.
    Cpu,
}

impl KeyBy {
    pub fn name(self) -> &'static str {
        match self {
            KeyBy::Tid => "tid",
            KeyBy::Tgid => "tgid",
            KeyBy::Pid => "pid",
            KeyBy::Comm => "comm",
            KeyBy::Cpu => "cpu",
        }
    }
}

impl std::str::FromStr for KeyBy {
    type Err = String;
    fn from_str(s: &str) -> Result<KeyBy, String> {
        match s {
            "tid" => Ok(KeyBy::Tid),
            "tgid" => Ok(KeyBy::Tgid),
            "pid" => Ok(KeyBy::Pid),
            "comm" => Ok(KeyBy::Comm),
            "cpu" => Ok(KeyBy::Cpu),
            other => Err(format!(
                "unknown key `{other}` (tid, pid, tgid, comm or cpu)"
            )),
        }
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
    /// The key as text: a number (`tid`, `pid`, `tgid`, `cpu`) or a name (`comm`).
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
