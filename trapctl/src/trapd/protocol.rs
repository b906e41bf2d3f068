//! The socket protocol: one JSON object per line each way. A request names its operation in
//! `op`; the reply is `{"ok": true, ...}` with the operation's fields, or
//! `{"ok": false, "error": "..."}`. Unknown operations and unknown or missing fields are errors
//! (the reply names them); see README.md, "trapd: the reconfiguration daemon", for every
//! operation with an example.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// The longest request line accepted (a longer one is answered with an error and dropped).
pub const MAX_LINE: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Daemon state: active profile, counts, metrics.
    Status,
    /// Live splices with hit counts, loaded components, profiles.
    List,
    /// Load a component object (a path on the daemon's machine).
    Load { path: PathBuf, #[serde(default)] name: Option<String> },
    /// Unload a component by name.
    Unload { name: String },
    /// Make one splice.
    Splice {
        at: String,
        action: String,
        #[serde(default)]
        handler: Option<String>,
        #[serde(default)]
        mechanism: Option<instr_manager::Mechanism>,
        #[serde(default)]
        cookie: u64,
    },
    /// Remove the splice at a point.
    Unsplice { at: String },
    /// Apply a spec file (components, splices, variables) all or nothing.
    Apply { spec: PathBuf },
    /// Write a component variable (`size`: 1, 2, 4 or 8; default the symbol's size, else 8).
    Set { symbol: String, value: u64, #[serde(default)] size: Option<usize> },
    /// Read a component variable (`size` as for `set`).
    Get { symbol: String, #[serde(default)] size: Option<usize> },
    /// Switch to a profile of the configuration in one batch.
    Activate { profile: String },
}

impl Request {
    /// Parse one line; the error is the reply's message.
    pub fn parse(line: &str) -> Result<Request, String> {
        serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))
    }

    /// Whether the request changes anything (and so is journaled).
    pub fn changes(&self) -> bool {
        !matches!(self, Request::Status | Request::List | Request::Get { .. })
    }
}

/// A successful reply with `fields` (an object) merged after `"ok": true`.
pub fn ok(fields: Value) -> Value {
    let mut m = Map::new();
    m.insert("ok".into(), Value::Bool(true));
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    Value::Object(m)
}

/// An error reply.
pub fn error(message: impl std::fmt::Display) -> Value {
    json!({ "ok": false, "error": message.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_op_with_defaults() {
        assert_eq!(Request::parse(r#"{"op":"list"}"#).unwrap(), Request::List);
        assert_eq!(Request::parse(r#"{"op":"get","symbol":"v"}"#).unwrap(), Request::Get { symbol: "v".into(), size: None });
        assert_eq!(
            Request::parse(r#"{"op":"splice","at":"f","action":"count","mechanism":"jmp"}"#).unwrap(),
            Request::Splice { at: "f".into(), action: "count".into(), handler: None, mechanism: Some(instr_manager::Mechanism::Jmp), cookie: 0 }
        );
    }

    #[test]
    fn malformed_requests_are_errors_that_name_the_problem() {
        let e = |l: &str| Request::parse(l).unwrap_err();
        assert!(e(r#"{"op":"frobnicate"}"#).contains("frobnicate"));
        assert!(e(r#"{"op":"unsplice"}"#).contains("missing field `at`"));
        assert!(e(r#"{"op":"unsplice","at":"f","extra":1}"#).contains("extra"));
        assert!(e(r#"{"op":"set","symbol":"v","value":-1}"#).starts_with("bad request"));
        assert!(e("{\"op\":\"li").starts_with("bad request"));
        assert!(e("[1,2]").starts_with("bad request"));
        assert!(e("").starts_with("bad request"));
    }

    #[test]
    fn only_reads_are_not_changes() {
        assert!(!Request::List.changes() && !Request::Status.changes());
        assert!(Request::Activate { profile: "p".into() }.changes());
    }

    #[test]
    fn replies_carry_ok_and_the_fields_or_the_error_message() {
        assert_eq!(ok(json!({"value": 3})), json!({"ok": true, "value": 3}));
        assert_eq!(error("no"), json!({"ok": false, "error": "no"}));
    }
}
