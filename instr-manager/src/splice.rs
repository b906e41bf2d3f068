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
//! All of them are the same flat form: `at`, `action` (`call`, `replace` or `count`),
//! `handler` (the handler of `call`, the replacement of `replace`), `mechanism` (`trap`, the
//! default, or `jmp`), `cookie` (for `call`, default 0). `call` and `replace` need a handler;
//! `count` takes none (one given is ignored, as is a cookie outside `call`). A refusal is a
//! sentence naming the point: `f: unknown action `jump` (call, replace or count)`.
//!
//! States saved before the form was flat wrote `action` as an object (`{"call": {"handler":
//! "h", "cookie": 0}}`, `{"replace": {"with": "g"}}`); they are still read.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

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
}

impl Action {
    /// The component symbol the action needs, if any.
    pub fn symbol(&self) -> Option<&str> {
        match self {
            Action::Call { handler, .. } => Some(handler),
            Action::Replace { with } => Some(with),
            Action::Count => None,
        }
    }

    /// The action's name in the flat form: `call`, `replace` or `count`.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Call { .. } => "call",
            Action::Replace { .. } => "replace",
            Action::Count => "count",
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

    /// The splice a component declares in a `.trapvec.splices` record.
    pub fn from_declared(d: &component_manager::DeclaredSplice) -> Result<SpliceRequest, SpliceFormError> {
        // The record's fields are strings; a JSON value map hands them to serde as such.
        let fields: serde_json::Map<String, serde_json::Value> = d.fields().map(|(k, v)| (k.to_string(), v.into())).collect();
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
                f.write_str("an action: `call`, `replace` or `count`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ActionField, E> {
                Ok(ActionField::Name(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ActionField, A::Error> {
                Action::deserialize(de::value::MapAccessDeserializer::new(map)).map(ActionField::Nested)
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
                "call" => Action::Call { handler: handler("call")?, cookie: f.cookie },
                "replace" => Action::Replace { with: handler("replace")? },
                "count" => Action::Count,
                other => return Err(format!("{at}: unknown action `{other}` (call, replace or count)")),
            },
        };
        Ok(SpliceRequest { at, action, mechanism: f.mechanism.unwrap_or(Mechanism::Trap) })
    }
}

impl From<SpliceRequest> for Flat {
    fn from(r: SpliceRequest) -> Flat {
        let name = ActionField::Name(r.action.name().to_string());
        let (handler, cookie) = match r.action {
            Action::Call { handler, cookie } => (Some(handler), cookie),
            Action::Replace { with } => (Some(with), 0),
            Action::Count => (None, 0),
        };
        Flat { at: r.at, action: name, handler, mechanism: Some(r.mechanism), cookie }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests() -> [SpliceRequest; 3] {
        [
            SpliceRequest { at: "f".into(), action: Action::Call { handler: "h".into(), cookie: 7 }, mechanism: Mechanism::Jmp },
            SpliceRequest { at: "f+0x9".into(), action: Action::Replace { with: "g".into() }, mechanism: Mechanism::Trap },
            SpliceRequest { at: "0xffffffff81000000".into(), action: Action::Count, mechanism: Mechanism::Trap },
        ]
    }

    #[test]
    fn splices_serialize_flat_and_read_back_the_same() {
        let json: Vec<String> = requests().iter().map(|r| serde_json::to_string(r).unwrap()).collect();
        assert_eq!(
            json,
            [
                r#"{"at":"f","action":"call","handler":"h","mechanism":"jmp","cookie":7}"#,
                r#"{"at":"f+0x9","action":"replace","handler":"g","mechanism":"trap","cookie":0}"#,
                r#"{"at":"0xffffffff81000000","action":"count","handler":null,"mechanism":"trap","cookie":0}"#,
            ]
        );
        for (r, j) in requests().iter().zip(&json) {
            assert_eq!(&serde_json::from_str::<SpliceRequest>(j).unwrap(), r);
        }
    }

    #[test]
    fn the_flat_form_has_defaults_and_refusals_that_name_the_point() {
        let read = |j: &str| serde_json::from_str::<SpliceRequest>(j);
        let r = read(r#"{"at":"f","action":"count","handler":null,"mechanism":null,"cookie":0}"#).unwrap();
        assert_eq!(r, SpliceRequest { at: "f".into(), action: Action::Count, mechanism: Mechanism::Trap });
        let r = read(r#"{"at":"f","action":"call","handler":"h"}"#).unwrap();
        assert_eq!(r.action, Action::Call { handler: "h".into(), cookie: 0 });
        let e = |j: &str| read(j).unwrap_err().to_string();
        assert!(e(r#"{"at":"f","action":"call"}"#).starts_with("f: action `call` needs a `handler`"));
        assert!(e(r#"{"at":"f","action":"replace","handler":" "}"#).starts_with("f: action `replace` needs a `handler`"));
        assert!(e(r#"{"at":"f","action":"jump"}"#).starts_with("f: unknown action `jump` (call, replace or count)"));
        assert!(e(r#"{"at":"f","action":"count","colour":"red"}"#).contains("colour"));
        assert!(e(r#"{"at":"f","action":"count","mechanism":"int3"}"#).contains("int3"));
    }

    #[test]
    fn states_saved_with_nested_actions_are_still_read() {
        let r: SpliceRequest =
            serde_json::from_str(r#"{"at":"f","action":{"call":{"handler":"h","cookie":7}},"mechanism":"jmp"}"#).unwrap();
        assert_eq!(r, requests()[0]);
        let r: SpliceRequest = serde_json::from_str(r#"{"at":"f+0x9","action":{"replace":{"with":"g"}},"mechanism":"trap"}"#).unwrap();
        assert_eq!(r, requests()[1]);
    }

    #[test]
    fn section_records_parse_like_the_header_macros_write_them() {
        let s = SpliceRequest::from_record("at=compute+0;action=call;handler=count_compute;mechanism=trap").unwrap();
        assert_eq!(s.at, "compute+0");
        assert_eq!((s.action, s.mechanism), (Action::Call { handler: "count_compute".into(), cookie: 0 }, Mechanism::Trap));
        let s = SpliceRequest::from_record("at=tcp_sync_mss;action=replace;handler=my_tcp_sync_mss;mechanism=jmp").unwrap();
        assert_eq!((s.action, s.mechanism), (Action::Replace { with: "my_tcp_sync_mss".into() }, Mechanism::Jmp));
        for bad in [
            "action=call;handler=h;mechanism=trap",
            "at=f;action=call;handler=h;mechanism=trap;colour=red",
            "at=f;action=kill;handler=h;mechanism=trap",
            "at=f;handler=h;mechanism=trap",
            "at=f;action=call;handler=h;mechanism=int3",
        ] {
            let e = SpliceRequest::from_record(bad).unwrap_err().to_string();
            assert!(!e.is_empty(), "{bad}");
        }
        let e = SpliceRequest::from_record("at=f;action=kill;handler=h;mechanism=trap").unwrap_err().to_string();
        assert_eq!(e, "f: unknown action `kill` (call, replace or count)");
    }
}
