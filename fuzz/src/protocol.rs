//! trapd's protocol: each line through the request parser. A request that parses serializes
//! back to a line that parses to the same request; a `splice` request either becomes a splice
//! request or is refused with a sentence, and so is its point.

use instr_manager::PointSpec;
use trapctl::protocol::{splice_request, Request, MAX_LINE};

use crate::assert_sentence;

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for line in text.lines().take(16) {
        if line.len() > MAX_LINE {
            continue;
        }
        let req = match Request::parse(line) {
            Ok(r) => r,
            Err(e) => {
                assert_sentence("request", &e);
                continue;
            }
        };
        let again = serde_json::to_string(&req).expect("a request serializes");
        let back = Request::parse(&again).unwrap_or_else(|e| panic!("request `{line}` serializes as `{again}`, which does not parse: {e}"));
        assert_eq!(back, req, "request `{line}` serializes as `{again}`, which parses to another request");
        let _ = req.changes();
        if let Request::Splice { at, action, handler, mechanism, cookie } = &req {
            match splice_request(at, action, handler.as_deref(), *mechanism, *cookie) {
                Ok(r) => {
                    assert_eq!(&r.at, at);
                    assert_eq!(Request::splice(&r), Request::Splice {
                        at: at.clone(),
                        action: action.clone(),
                        handler: if action == "count" { None } else { handler.clone() },
                        mechanism: Some(mechanism.unwrap_or(instr_manager::Mechanism::Trap)),
                        cookie: if action == "call" { *cookie } else { 0 },
                    });
                }
                Err(e) => assert_sentence("splice request", &e),
            }
            if let Err(e) = at.parse::<PointSpec>() {
                assert_sentence("point", &e.to_string());
            }
        }
    }
}
