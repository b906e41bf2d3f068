//! The wire format of trapd's socket: one JSON object per line each way. A request
//! ([`Request`], defined in `instr_manager::ops::request`) names its operation in `op`; the reply
//! is `{"ok": true, ...}` with the fields of its typed [`Reply`] ([`Reply::to_fields`], read back
//! by [`Reply::from_fields`]), or `{"ok": false, "error": "..."}`.

use serde_json::{json, Map, Value};

pub use instr_manager::ops::request::{BadRequest, Request};
pub use instr_manager::ops::Reply;

/// The longest request line accepted (a longer one is answered with an error and dropped).
pub const MAX_LINE: usize = 64 * 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

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
