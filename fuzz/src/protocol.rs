//! trapd's protocol: each line through the request parser. A request that parses serializes
//! back to a line that parses to the same request; a `splice` request either becomes a splice
//! request (whose flat form reads back as itself) or is refused with a sentence, and so is its
//! point.

use instr_manager::PointSpec;
use trapd::protocol::{Request, MAX_LINE};

use crate::assert_sentence;

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.lines().take(16) {
        if line.len() > MAX_LINE {
            continue;
        }
        let req = match Request::parse(line) {
            Ok(r) => r,
            Err(e) => {
                assert_sentence("request", &trapvec::error_chain(&e));
                continue;
            }
        };
        let again = serde_json::to_string(&req).expect("a request serializes");
        let back = Request::parse(&again).unwrap_or_else(|e| {
            panic!("request `{line}` serializes as `{again}`, which does not parse: {e}")
        });
        assert_eq!(
            back, req,
            "request `{line}` serializes as `{again}`, which parses to another request"
        );
        let _ = req.changes();
        if let Request::Splice(r) = &req {
            // Whatever the line, what parsed prints as the one flat form and reads back alike.
            let flat = serde_json::to_string(r).expect("a splice serializes");
            let back: instr_manager::SpliceRequest =
                serde_json::from_str(&flat).unwrap_or_else(|e| {
                    panic!("splice `{line}` prints as `{flat}`, which does not parse: {e}")
                });
            assert_eq!(
                &back, r,
                "splice `{line}` prints as `{flat}`, which reads as another splice"
            );
            let at = &r.at;
            if let Err(e) = at.parse::<PointSpec>() {
                assert_sentence("point", &trapvec::error_chain(&e));
            }
        }
    }
}
