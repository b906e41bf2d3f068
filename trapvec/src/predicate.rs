//! Task predicates: a splice that acts only for one thread, process or command (bpftrace's
//! `/pid == 42/`, SystemTap's `if (pid() != 42) next`), the types of the [`crate::Target`]
//! contract.
//!
//! A predicate is a conjunction of field tests on the task that hits the point: `tid` (a
//! process's thread, its kernel thread id), `pid` and `tgid` (the kernel's `task->pid`, a
//! thread, and `task->tgid`, a process) and `comm` (the kernel's `task->comm`, at most 15
//! bytes). A hit whose task does not match runs no handler, is not counted and goes straight
//! to the displaced instructions: it costs the test and nothing else.
//!
//! Where the test runs:
//! - in code: a *guard* in front of the splice's trampoline ([`TargetInfo::predicate_test`] says
//!   how the current task's fields are reached: the thread pointer `fs` in a process, the
//!   per-CPU `current_task` through `gs` in the kernel);
//! - in the kernel's trap dispatcher, for the traps it handles itself ([`TaskMatch`] in the
//!   [`crate::DispatchEntry`]): a non-matching trap goes to the entry's `skip`.
//!
//! [`TargetInfo::predicate_test`]: crate::TargetInfo::predicate_test

use std::fmt;

/// The length of the kernel's `task->comm` with its terminating NUL (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// Which tasks a splice acts for: every field given must match (none given: every task).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Predicate {
    /// A thread of a process (its kernel thread id, `gettid()`).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub tid: Option<u32>,
    /// Kernel: `task->pid` (a thread).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub pid: Option<u32>,
    /// Kernel: `task->tgid` (a process).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub tgid: Option<u32>,
    /// Kernel: `task->comm`, the task's name (at most 15 bytes).
    #[cfg_attr(
        feature = "serde",
        serde(default, skip_serializing_if = "Option::is_none")
    )]
    pub comm: Option<String>,
}

impl Predicate {
    /// No field given: every task matches.
    pub fn is_empty(&self) -> bool {
        self.tid.is_none() && self.pid.is_none() && self.tgid.is_none() && self.comm.is_none()
    }

    /// `comm` as the kernel keeps it: the name and NUL bytes up to [`COMM_LEN`]. A name the
    /// kernel could not hold (empty, 16 bytes or more, a NUL inside) is refused, naming it:
    /// the kernel truncates longer names to 15 bytes, so the test would never match.
    pub fn comm_bytes(comm: &str) -> Result<[u8; COMM_LEN], String> {
        let b = comm.as_bytes();
        if b.is_empty() || b.len() >= COMM_LEN || b.contains(&0) {
            let hint = match b.len() >= COMM_LEN {
                true => format!(
                    " (the kernel keeps the first 15: `{}`)",
                    String::from_utf8_lossy(&b[..COMM_LEN - 1])
                ),
                false => String::new(),
            };
            return Err(format!(
                "comm `{comm}`: a task name has 1 to 15 bytes and no NUL{hint}"
            ));
        }
        let mut out = [0u8; COMM_LEN];
        out[..b.len()].copy_from_slice(b);
        Ok(out)
    }

    /// The first field the check refuses, as a sentence (a bad `comm`).
    pub fn check(&self) -> Result<(), String> {
        match &self.comm {
            Some(c) => Predicate::comm_bytes(c).map(|_| ()),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::with_capacity(4);
        for (name, v) in [("tid", self.tid), ("pid", self.pid), ("tgid", self.tgid)] {
            if let Some(v) = v {
                parts.push(format!("{name} {v}"));
            }
        }
        if let Some(c) = &self.comm {
            parts.push(format!("comm {c}"));
        }
        match parts.is_empty() {
            true => f.write_str("every task"),
            false => f.write_str(&parts.join(", ")),
        }
    }
}

/// How code reaches the fields of the task running it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskBase {
    /// At `fs:[offset]`: the thread's control block (a process; glibc's `struct pthread`).
    ThreadPointer,
    /// At `[task + offset]` with `task = gs:[per_cpu]`: the kernel's `current_task`, whose
    /// per-CPU offset this is.
    CurrentTask { per_cpu: u64 },
}

/// One 4-byte compare of the guard: the dword at `offset` from the task base equals `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FieldTest {
    pub offset: i32,
    pub value: u32,
}

/// What a guard tests: every field compare must hold.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PredicateTest {
    pub base: TaskBase,
    pub tests: Vec<FieldTest>,
}

/// The fields of a task the target tests, by offset from its [`TaskBase`] (read from the
/// running system: the kernel module's `offsetof`, the process's TCB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    pub base: TaskBase,
    pub tid: Option<i32>,
    pub pid: Option<i32>,
    pub tgid: Option<i32>,
    pub comm: Option<i32>,
}

impl TaskLayout {
    /// The compares of `p` (a 4-byte compare per id, four per name), or the first field this
    /// target does not have, as a sentence naming it and `why`.
    pub fn test(
        &self,
        p: &Predicate,
        why: impl Fn(&str) -> String,
    ) -> Result<PredicateTest, String> {
        let mut tests = Vec::with_capacity(6);
        for (name, want, at) in [
            ("tid", p.tid, self.tid),
            ("pid", p.pid, self.pid),
            ("tgid", p.tgid, self.tgid),
        ] {
            if let Some(v) = want {
                let offset = at.ok_or_else(|| why(name))?;
                tests.push(FieldTest { offset, value: v });
            }
        }
        if let Some(c) = &p.comm {
            let offset = self.comm.ok_or_else(|| why("comm"))?;
            let bytes = Predicate::comm_bytes(c)?;
            for (i, w) in (0i32..).zip(bytes.chunks_exact(4)) {
                tests.push(FieldTest {
                    offset: offset + 4 * i,
                    value: u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
                });
            }
        }
        Ok(PredicateTest {
            base: self.base,
            tests,
        })
    }
}

/// A predicate as the kernel's trap dispatcher tests it (`struct trapvec_dispatch_entry`'s
/// `match`, `pid`, `tgid`, `comm`): a trap whose task does not match is sent to `skip`
/// (the replay of the displaced instructions) without being counted or running the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TaskMatch {
    pub pid: Option<u32>,
    pub tgid: Option<u32>,
    pub comm: Option<[u8; COMM_LEN]>,
    pub skip: u64,
}

impl TaskMatch {
    /// The dispatcher's form of `p` (whose `tid` is the kernel's `pid`), going to `skip` when it
    /// does not match; `None` for the empty predicate.
    pub fn of(p: &Predicate, skip: u64) -> Result<Option<TaskMatch>, String> {
        if p.is_empty() {
            return Ok(None);
        }
        if let (Some(t), Some(pid)) = (p.tid, p.pid) {
            if t != pid {
                return Err(format!(
                    "tid {t} and pid {pid}: in the kernel both name task->pid"
                ));
            }
        }
        let comm = p.comm.as_deref().map(Predicate::comm_bytes).transpose()?;
        Ok(Some(TaskMatch {
            pid: p.pid.or(p.tid),
            tgid: p.tgid,
            comm,
            skip,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_held_as_the_kernel_holds_them_or_refused_naming_why() {
        let b = Predicate::comm_bytes("nginx").unwrap();
        assert_eq!(&b[..6], b"nginx\0");
        assert!(b[5..].iter().all(|&x| x == 0));
        assert!(Predicate::comm_bytes("fifteen-bytes!!").is_ok());
        let e = Predicate::comm_bytes("systemd-journald").unwrap_err();
        assert_eq!(e, "comm `systemd-journald`: a task name has 1 to 15 bytes and no NUL (the kernel keeps the first 15: `systemd-journal`)");
        assert!(Predicate::comm_bytes("").is_err());
        assert!(Predicate::comm_bytes("a\0b").is_err());
    }

    #[test]
    fn a_layout_turns_a_predicate_into_dword_compares_or_names_the_missing_field() {
        let kernel = TaskLayout {
            base: TaskBase::CurrentTask { per_cpu: 0x1fbc0 },
            tid: Some(0x590),
            pid: Some(0x590),
            tgid: Some(0x594),
            comm: Some(0x738),
        };
        let p = Predicate {
            pid: Some(42),
            comm: Some("sh".into()),
            ..Predicate::default()
        };
        let t = kernel.test(&p, |f| f.to_string()).unwrap();
        assert_eq!(t.base, TaskBase::CurrentTask { per_cpu: 0x1fbc0 });
        assert_eq!(
            t.tests,
            [
                FieldTest {
                    offset: 0x590,
                    value: 42
                },
                FieldTest {
                    offset: 0x738,
                    value: u32::from_le_bytes(*b"sh\0\0")
                },
                FieldTest {
                    offset: 0x73c,
                    value: 0
                },
                FieldTest {
                    offset: 0x740,
                    value: 0
                },
                FieldTest {
                    offset: 0x744,
                    value: 0
                },
            ]
        );
        let process = TaskLayout {
            base: TaskBase::ThreadPointer,
            tid: Some(0x2d0),
            pid: None,
            tgid: None,
            comm: None,
        };
        let why = |f: &str| format!("`{f}` is a kernel field");
        assert_eq!(
            process
                .test(
                    &Predicate {
                        tgid: Some(1),
                        ..Predicate::default()
                    },
                    why
                )
                .unwrap_err(),
            "`tgid` is a kernel field"
        );
        let t = process
            .test(
                &Predicate {
                    tid: Some(7),
                    ..Predicate::default()
                },
                why,
            )
            .unwrap();
        assert_eq!(
            (t.base, t.tests),
            (
                TaskBase::ThreadPointer,
                vec![FieldTest {
                    offset: 0x2d0,
                    value: 7
                }]
            )
        );
    }

    #[test]
    fn the_dispatcher_form_reads_tid_as_pid_and_refuses_two_different_threads() {
        assert_eq!(TaskMatch::of(&Predicate::default(), 9).unwrap(), None);
        let m = TaskMatch::of(
            &Predicate {
                tid: Some(5),
                ..Predicate::default()
            },
            9,
        )
        .unwrap()
        .unwrap();
        assert_eq!((m.pid, m.tgid, m.comm, m.skip), (Some(5), None, None, 9));
        assert!(TaskMatch::of(
            &Predicate {
                tid: Some(5),
                pid: Some(6),
                ..Predicate::default()
            },
            9
        )
        .is_err());
        assert_eq!(
            Predicate {
                pid: Some(1),
                comm: Some("x".into()),
                ..Predicate::default()
            }
            .to_string(),
            "pid 1, comm x"
        );
    }
}
