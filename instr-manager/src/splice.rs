//! The one description of a splice: where ([`SpliceRequest::at`]), by what mechanism, doing what
//! ([`Action`]). Every way a splice is written down arrives here through serde, with no string
//! in between:
//!
//! | written as | by | read with |
//! |---|---|---|
//! | a `[[splice]]` table of a spec (TOML) | users, the agent, `trapctl apply` | [`crate::Spec::parse`] |
//! | a `.trapvec.splices` record of a component | `TRAPVEC_SPLICE_*` in `trapvec.h` | [`SpliceRequest::from_declared`] |
//! | a `splice` line of trapd's protocol, a profile's `splice` table | clients, trapd's config | `serde_json`, `toml` |
//! | a live splice's `request` in the saved state | the splicer ([`crate::splicer::state`]) | `serde_json` |
//!
//! All of them are the same flat form: `at`, `action` (`call`, `replace`, `count` or `time`),
//! `handler` (the handler of `call`, the replacement of `replace`), `mechanism` (`trap`, the
//! default, or `jmp`), `cookie` (for `call`, default 0), and the [`SpliceOptions`]: `when`
//! (`entry`, the default, or `return`: the action runs when the function returns, see
//! [`trapvec::returns`]), `maxactive` (a return point's calls in progress at once, default
//! [`trapvec::returns::DEFAULT_MAXACTIVE`]), `clock` (`wall`, the default, or `cpu`, for
//! `time`) and `by` (`tid`, the thread, `pid`, the process, `comm` or `cpu`: a `count` keyed by
//! who hit the point, see [`trapvec::keyed`]), and the task predicate's `pid` (the process),
//! `tid` (the thread) and `comm`. `call` and `replace` need a handler; `count` and `time` take none (one given is
//! ignored, as is a cookie outside `call`). `time` is a return point by nature (`when` may be
//! left out); `replace` has no return form. A refusal is a sentence naming the point:
//! `f: unknown action `jump` (call, replace, count or time)`.
//!
//! `pid` is the process (the kernel's `task->tgid`) and `tid` the thread (`gettid()`, the
//! kernel's `task->pid`), as in bpftrace, perf and ps, and both are written so. Before, the form
//! used the kernel's names (`pid` a thread, `tgid` the process): `tgid` is still read, as `pid`,
//! with one warning per run ([`OLD_TGID`], [`trapvec::keyed::OLD_TGID`] for a key); a predicate's
//! `pid` alone cannot be told from the new spelling and means the process. A key `pid` in a state
//! saved before version 5 is read as it meant then, `tid` ([`OldKeys`]).
//!
//! States saved before the form was flat wrote `action` as an object (`{"call": {"handler":
//! "h", "cookie": 0}}`, `{"replace": {"with": "g"}}`); they are still read.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use trapvec::keyed::KeyBy;
use trapvec::predicate::Predicate;
use trapvec::returns::Clock;

use crate::owner::Owner;
use crate::plan::Mechanism;

/// What a splice does when its point is reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Run `handler(regs, cookie)`, then the displaced instructions, then continue.
    Call { handler: String, cookie: u64 },
    /// Go to `with` instead (the point must be a function's entry).
    Replace { with: String },
    /// Only count: no handler. A kernel trap is a dispatch entry without a handler (the
    /// dispatcher counts) whose destination is the replay; elsewhere a counting replay
    /// trampoline (KAPI's `count_func`).
    Count,
    /// Time each call from its entry to its return into a log2 histogram (a return point).
    Time { clock: Clock },
}

/// When a splice's action runs: at its point, or when the function that begins there returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum When {
    #[default]
    Entry,
    Return,
}

impl When {
    pub fn name(self) -> &'static str {
        match self {
            When::Entry => "entry",
            When::Return => "return",
        }
    }
}

/// What a splice may say beyond where, how and what (each has a default).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpliceOptions {
    pub when: When,
    /// A return point's most calls in progress at once (kretprobe's `maxactive`); `None`: the
    /// default, [`trapvec::returns::DEFAULT_MAXACTIVE`].
    pub maxactive: Option<u32>,
    /// A `count` keyed by this ([`trapvec::keyed`]): the hits per thread, CPU, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<KeyBy>,
    /// Only for these tasks ([`trapvec::predicate`]): `tid` (a process's thread), `pid`,
    /// `tgid`, `comm` (the kernel's task fields). Other tasks' hits run nothing and are not
    /// counted.
    #[serde(default, skip_serializing_if = "Predicate::is_empty")]
    pub only: Predicate,
    /// The command that holds this splice for its own length and removes it when it ends
    /// (`trapctl count`, `trapctl time`); set by that command, not written in specs. A splice
    /// whose owner is gone is orphaned ([`crate::owner`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

impl Action {
    /// The component symbol the action needs, if any.
    pub fn symbol(&self) -> Option<&str> {
        match self {
            Action::Call { handler, .. } => Some(handler),
            Action::Replace { with } => Some(with),
            Action::Count | Action::Time { .. } => None,
        }
    }

    /// The action's name in the flat form: `call`, `replace`, `count` or `time`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Call { .. } => "call",
            Action::Replace { .. } => "replace",
            Action::Count => "count",
            Action::Time { .. } => "time",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Call { handler, cookie: 0 } => write!(f, "call {handler}"),
            Action::Call { handler, cookie } => write!(f, "call {handler} (cookie {cookie:#x})"),
            Action::Replace { with } => write!(f, "replace by {with}"),
            Action::Count => f.write_str("count"),
            Action::Time { clock } => write!(f, "time ({} clock)", clock.name()),
        }
    }
}

/// One splice: the point as written, what to do there and by which mechanism.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Flat", into = "Flat")]
pub struct SpliceRequest {
    /// The point as written by the user: `sym`, `sym+off` or `0xADDR`.
    pub at: String,
    pub action: Action,
    pub mechanism: Mechanism,
    pub options: SpliceOptions,
}

/// Why a declared splice or a record is not a splice.
#[derive(Debug, thiserror::Error)]
pub enum SpliceFormError {
    #[error(transparent)]
    Record(#[from] component_manager::parse::ParseError),
    #[error(transparent)]
    Declared(serde_json::Error),
}

impl SpliceRequest {
    /// The point, parsed from [`SpliceRequest::at`].
    pub fn point(&self) -> Result<crate::point::PointSpec, crate::PlanError> {
        self.at.parse()
    }

    /// A splice at its point (`when = entry`) with the default options.
    pub fn new(at: impl Into<String>, action: Action, mechanism: Mechanism) -> SpliceRequest {
        SpliceRequest {
            at: at.into(),
            action,
            mechanism,
            options: SpliceOptions::default(),
        }
    }

    /// Whether the action runs at the function's return (a return point: `when = return`, or a
    /// timer).
    pub fn at_return(&self) -> bool {
        self.options.when == When::Return || matches!(self.action, Action::Time { .. })
    }

    /// The splice a component declares in a `.trapvec.splices` record.
    pub fn from_declared(
        d: &component_manager::DeclaredSplice,
    ) -> Result<SpliceRequest, SpliceFormError> {
        // The record's fields are strings; a JSON value map hands them to serde as such.
        let fields: serde_json::Map<String, serde_json::Value> =
            d.fields().map(|(k, v)| (k.to_string(), v.into())).collect();
        SpliceRequest::deserialize(serde_json::Value::Object(fields))
            .map_err(SpliceFormError::Declared)
    }

    /// The splice of one `.trapvec.splices` record's text (`at=...;action=...;...`).
    pub fn from_record(record: &str) -> Result<SpliceRequest, SpliceFormError> {
        SpliceRequest::from_declared(&component_manager::DeclaredSplice::parse(record)?)
    }
}

/// The flat form every format shares (see the module docs).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Flat {
    at: String,
    action: ActionField,
    #[serde(default)]
    handler: Option<String>,
    #[serde(default)]
    mechanism: Option<Mechanism>,
    #[serde(default)]
    cookie: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    when: Option<When>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    maxactive: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    clock: Option<Clock>,
    // The key as written (`tgid` is read as `pid`; states saved before version 5 meant the
    // thread by `pid`: see [`OldKeys`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tgid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<Owner>,
}

/// The warning, once per run, for the old spelling `tgid` of a predicate.
pub const OLD_TGID: &str = "`tgid` is the old spelling of `pid` (the process, the kernel's \
task->tgid), read as `pid`; `tid` is the thread";

/// Warn [`OLD_TGID`] the first time it applies in this process.
fn warn_old_tgid() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| log::warn!("{OLD_TGID}"));
}

thread_local! {
    static OLD_KEYS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While one lives, the splices read on this thread were saved before `pid` meant the process
/// (states before version 5): their key `pid` is read as `tid` (the thread, as it meant then)
/// and `tgid` as `pid`, silently ([`KeyBy::parse_old`]).
pub(crate) struct OldKeys(bool);

impl OldKeys {
    /// Read old keys on this thread until the guard is dropped, when `old`.
    pub(crate) fn when(old: bool) -> OldKeys {
        OldKeys(OLD_KEYS.replace(old))
    }
}

impl Drop for OldKeys {
    fn drop(&mut self) {
        OLD_KEYS.set(self.0);
    }
}

/// `by` as written: `tgid` is read as `pid` with a warning on stderr, once
/// ([`trapvec::keyed::OLD_TGID`]), except in an old state ([`OldKeys`]).
fn key_of(at: &str, written: &str) -> Result<KeyBy, String> {
    let by = if OLD_KEYS.get() {
        KeyBy::parse_old(written)
    } else {
        written.parse()
    };
    by.map_err(|e| format!("{at}: {e}"))
}

/// `action` as written: its name, or (states saved before the flat form) the whole action.
enum ActionField {
    Name(String),
    Nested(Action),
}

impl Serialize for ActionField {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ActionField::Name(n) => s.serialize_str(n),
            ActionField::Nested(a) => a.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ActionField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ActionField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an action: `call`, `replace`, `count` or `time`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ActionField, E> {
                Ok(ActionField::Name(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ActionField, A::Error> {
                Action::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ActionField::Nested)
            }
        }
        d.deserialize_any(V)
    }
}

impl TryFrom<Flat> for SpliceRequest {
    type Error = String;

    fn try_from(f: Flat) -> Result<SpliceRequest, String> {
        let at = f.at;
        let handler = |what: &str| match f.handler.as_deref().map(str::trim) {
            Some(h) if !h.is_empty() => Ok(h.to_string()),
            _ => Err(format!("{at}: action `{what}` needs a `handler`")),
        };
        let action = match f.action {
            ActionField::Nested(a) => a,
            ActionField::Name(n) => match n.as_str() {
                "call" => Action::Call {
                    handler: handler("call")?,
                    cookie: f.cookie,
                },
                "replace" => Action::Replace {
                    with: handler("replace")?,
                },
                "count" => Action::Count,
                "time" => Action::Time {
                    clock: f.clock.unwrap_or_default(),
                },
                other => {
                    return Err(format!(
                        "{at}: unknown action `{other}` (call, replace, count or time)"
                    ))
                }
            },
        };
        let when = match (&action, f.when) {
            (Action::Time { .. }, Some(When::Entry)) => {
                return Err(format!("{at}: action `time` measures from the entry to the return; `when = entry` contradicts it"))
            }
            (Action::Time { .. }, _) => When::Return,
            (Action::Replace { .. }, Some(When::Return)) => {
                return Err(format!("{at}: action `replace` has no `when = return` (a replacement already runs instead of the whole function)"))
            }
            (_, w) => w.unwrap_or_default(),
        };
        if f.clock.is_some() && !matches!(action, Action::Time { .. }) {
            return Err(format!(
                "{at}: `clock` belongs to action `time`, not `{}`",
                action.name()
            ));
        }
        if f.maxactive.is_some() && when != When::Return {
            return Err(format!(
                "{at}: `maxactive` belongs to return points (`when = return` or action `time`)"
            ));
        }
        if f.maxactive == Some(0) {
            return Err(format!("{at}: `maxactive` must be at least 1"));
        }
        if f.by.is_some() && (!matches!(action, Action::Count) || when != When::Entry) {
            return Err(format!(
                "{at}: `by` keys the hits of action `count` at the point (not `{}`{})",
                action.name(),
                if when == When::Return {
                    " at the return"
                } else {
                    ""
                }
            ));
        }
        // `pid` is the process and `tid` the thread; `tgid` the process's old spelling.
        if f.tgid.is_some() {
            warn_old_tgid();
        }
        let tgid = match (f.pid, f.tgid) {
            (Some(p), Some(t)) if p != t => {
                return Err(format!(
                    "{at}: `pid` {p} and `tgid` {t}: both name the process (`tgid` is `pid`'s old spelling); give `tid` for a thread"
                ))
            }
            (p, t) => p.or(t),
        };
        let only = Predicate {
            tid: f.tid,
            pid: None,
            tgid,
            comm: f.comm,
        };
        only.check().map_err(|e| format!("{at}: {e}"))?;
        let by = f.by.as_deref().map(|b| key_of(&at, b)).transpose()?;
        let options = SpliceOptions {
            when,
            maxactive: f.maxactive,
            by,
            only,
            owner: f.owner,
        };
        Ok(SpliceRequest {
            at,
            action,
            mechanism: f.mechanism.unwrap_or(Mechanism::Trap),
            options,
        })
    }
}

impl From<SpliceRequest> for Flat {
    fn from(r: SpliceRequest) -> Flat {
        let name = ActionField::Name(r.action.name().to_string());
        let (handler, cookie, clock) = match r.action {
            Action::Call { handler, cookie } => (Some(handler), cookie, None),
            Action::Replace { with } => (Some(with), 0, None),
            Action::Count => (None, 0, None),
            Action::Time { clock } => (None, 0, Some(clock)),
        };
        let when = (r.options.when == When::Return).then_some(When::Return);
        // Written as the conventions spell them: the thread (a process's `tid`, the kernel's
        // task->pid) as `tid`, the process (task->tgid) as `pid`.
        let Predicate {
            tid,
            pid: kernel_pid,
            tgid,
            comm,
        } = r.options.only;
        let (tid, pid, tgid) = (tid.or(kernel_pid), tgid, None);
        Flat {
            at: r.at,
            action: name,
            handler,
            mechanism: Some(r.mechanism),
            cookie,
            when,
            maxactive: r.options.maxactive,
            clock,
            by: r.options.by.map(|b| b.name().to_string()),
            tid,
            pid,
            tgid,
            comm,
            owner: r.options.owner,
        }
    }
}

#[cfg(test)]
mod tests;
