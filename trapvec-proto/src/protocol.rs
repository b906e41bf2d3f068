//! The wire format of trapd's socket: one JSON object per line each way. A request
//! ([`Request`], defined in `instr_manager::ops::request`) names its operation in `op`; the reply
//! is `{"ok": true, ...}` with the fields of its typed [`Reply`] ([`Reply::to_fields`], read back
//! by [`Reply::from_fields`]), or `{"ok": false, "error": "..."}`.

use serde_json::{json, Map, Value};

pub use instr_manager::ops::request::{BadRequest, Request};
pub use instr_manager::ops::Reply;

/// The longest request line accepted (a longer one is answered with an error and dropped): 1 MiB,
/// so that a `remove` of some 45,000 kernel sites is one request (one text batch, one wait for
/// quiescence), where 64 KiB cut the 9,941 of `trapctl cover`'s TCP group into four.
pub const MAX_LINE: usize = 1024 * 1024;

/// A successful reply with `fields` (an object) merged after `"ok": true`.
pub fn ok(fields: Value) -> Value {
    let mut m = Map::new();
    m.insert("ok".into(), Value::Bool(true));
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    Value::Object(m)
}

/// An error reply: a sentence (`&str`, `String`), or an error, whose whole
/// [`trapvec::error_chain`] is the message (so the reply names the culprit and the cause).
pub fn error<'a>(message: impl Into<Box<dyn std::error::Error + 'a>>) -> Value {
    json!({ "ok": false, "error": trapvec::error_chain(&*message.into()) })
}

/// The version of every JSON document a command prints (`trapctl ... --json`): its first key,
/// `"schema"`. Raised when a field changes meaning or goes away (a new field does not raise it).
pub const SCHEMA: u32 = 1;

/// `report` as the pretty JSON object a command prints for `--json`: `"schema": SCHEMA` first,
/// then the report's own fields. One helper for every command, so that every output says its
/// version the same way. A report that is not an object (a list, a number) is an error.
pub fn json_output<T: serde::Serialize + ?Sized>(report: &T) -> serde_json::Result<String> {
    #[derive(serde::Serialize)]
    struct Versioned<'a, T: ?Sized> {
        schema: u32,
        #[serde(flatten)]
        report: &'a T,
    }
    serde_json::to_string_pretty(&Versioned {
        schema: SCHEMA,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_output_puts_the_schema_first_then_the_reports_fields() {
        #[derive(serde::Serialize)]
        struct R {
            b: u32,
            a: &'static str,
        }
        let out = json_output(&R { b: 2, a: "x" }).unwrap();
        assert!(out.starts_with("{\n  \"schema\": 1,\n  \"b\": 2,"), "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v, json!({"schema": 1, "b": 2, "a": "x"}));
        assert!(json_output(&json!({"k": 1}))
            .unwrap()
            .starts_with("{\n  \"schema\": 1,"));
        assert!(
            json_output(&[1, 2]).is_err(),
            "a list has no place for the schema"
        );
    }

    #[test]
    fn replies_carry_ok_and_the_fields_or_the_error_message() {
        assert_eq!(ok(json!({"value": 3})), json!({"ok": true, "value": 3}));
        assert_eq!(error("no"), json!({"ok": false, "error": "no"}));
        let io = std::io::Error::other("disk on fire");
        let e = instr_manager::ops::OpError::Spec(instr_manager::SpecError::Io {
            file: "s.toml".into(),
            source: io,
        });
        assert_eq!(
            error(e),
            json!({"ok": false, "error": "cannot read spec s.toml: disk on fire"}),
            "the reply carries the chain"
        );
    }
}
