//! What a front end asks of a running system: one [`Request`] per operation, as trapd's socket
//! protocol writes it (one JSON object, its operation named in `op`; see trapd/README.md for
//! every operation with an example). Unknown operations and unknown or missing fields are
//! errors that name them ([`BadRequest`]).
//!
//! The type lives here, in the operations layer, because its fields are this crate's types
//! ([`SpliceRequest`], [`super::Value`]) and because [`super::execute`] runs it; the
//! `trapvec-proto` crate re-exports it beside the wire format's other half (the reply
//! envelope, the client).

use std::path::PathBuf;

use crate::splicer::SpliceRequest;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Daemon state: active profile, counts, metrics.
    Status,
    /// Live splices with hit counts, loaded components, profiles.
    List,
    /// The hit counters of live splices and nothing more of them (id, site, hits): of the
    /// splices `ids` (each must be live; none is answered otherwise), else of every live one;
    /// only those hit at least `min_hits` times (default 0: all). The counters are read
    /// together and a row is made only for a splice that has the hits, so `"min_hits": 1` over
    /// thousands of sites costs little when few were hit: what `trapctl cover --mode once`
    /// looks with through trapd.
    Hits {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ids: Option<Vec<u64>>,
        #[serde(default, skip_serializing_if = "is_zero")]
        min_hits: u64,
    },
    /// Load a component object (a path on the daemon's machine) and apply the splices it
    /// declares.
    Load {
        path: PathBuf,
        #[serde(default)]
        name: Option<String>,
    },
    /// Unload a component by name (its declared splices go with it).
    Unload { name: String },
    /// Make one splice: the splice's flat form (`at`, `action`, `handler`, `mechanism`,
    /// `cookie`; see `instr_manager::splice`) beside `op`.
    Splice(SpliceRequest),
    /// Remove the splice at a point, or (`all`) every live splice in one batch.
    Unsplice {
        #[serde(default)]
        at: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
    /// Remove several splices in one batch, each named as `unsplice` names one (the point as
    /// spliced, its function, or the site's address), all or nothing: one that names no splice
    /// removes none. What `trapctl count 'GLOB'` and `trapctl time 'GLOB'` end with.
    Remove { at: Vec<String> },
    /// Apply a spec file (components, splices, variables) all or nothing; `best_effort`: every
    /// splice that validates; `check`: plan only, change nothing; `brief`: the report names each
    /// splice made by its id, point and site only (`placed`, no `spliced` rows: no hit counts
    /// read, no owner or displaced text written back), for a caller that keeps its own record
    /// of thousands of sites (`trapctl cover`); with `check` it changes nothing.
    Apply {
        spec: PathBuf,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        best_effort: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        check: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        brief: bool,
    },
    /// Write a component variable (`size`: 1, 2, 4 or 8; default the symbol's size, else 8);
    /// `value` is a number or a string (decimal, `-decimal`, `0x` hex).
    Set {
        symbol: String,
        value: super::Value,
        #[serde(default)]
        size: Option<usize>,
    },
    /// Read a component variable (`size` as for `set`).
    Get {
        symbol: String,
        #[serde(default)]
        size: Option<usize>,
    },
    /// Switch to a profile of the configuration in one batch.
    Activate { profile: String },
    /// Refuse the load of kernel module `module` when a pending point in it cannot be made
    /// there (as livepatch refuses a module it cannot patch); by default such a point is
    /// reported and the module loads.
    Require { module: String },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why a request line is not a request; its `trapvec::error_chain` is the reply's message.
#[derive(Debug, thiserror::Error)]
pub enum BadRequest {
    #[error("bad request")]
    Json(#[source] serde_json::Error),
    #[error("bad request: unsplice needs `at` or `\"all\": true`")]
    UnspliceWhat,
    #[error("bad request: unsplice takes `at` or `\"all\": true`, not both")]
    UnspliceBoth,
    #[error("bad request: apply takes `best_effort` or `check`, not both")]
    ApplyBoth,
}

impl Request {
    /// Parse one line.
    pub fn parse(line: &str) -> Result<Request, BadRequest> {
        let req: Request = serde_json::from_str(line).map_err(BadRequest::Json)?;
        match &req {
            Request::Unsplice {
                at: None,
                all: false,
            } => Err(BadRequest::UnspliceWhat),
            Request::Unsplice {
                at: Some(_),
                all: true,
            } => Err(BadRequest::UnspliceBoth),
            Request::Apply {
                best_effort: true,
                check: true,
                ..
            } => Err(BadRequest::ApplyBoth),
            _ => Ok(req),
        }
    }

    /// The request's `op`, as written on the wire (`"splice"`, `"status"`, ...).
    pub fn op(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::List => "list",
            Request::Hits { .. } => "hits",
            Request::Load { .. } => "load",
            Request::Unload { .. } => "unload",
            Request::Splice(_) => "splice",
            Request::Unsplice { .. } => "unsplice",
            Request::Remove { .. } => "remove",
            Request::Apply { .. } => "apply",
            Request::Set { .. } => "set",
            Request::Get { .. } => "get",
            Request::Activate { .. } => "activate",
            Request::Require { .. } => "require",
        }
    }

    /// Whether the request changes anything (and so is journaled).
    pub fn changes(&self) -> bool {
        !matches!(
            self,
            Request::Status
                | Request::List
                | Request::Hits { .. }
                | Request::Get { .. }
                | Request::Apply { check: true, .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Action, Mechanism};
    use serde_json::json;

    #[test]
    fn requests_parse_by_op_with_defaults() {
        assert_eq!(Request::parse(r#"{"op":"list"}"#).unwrap(), Request::List);
        assert_eq!(
            Request::parse(r#"{"op":"hits"}"#).unwrap(),
            Request::Hits {
                ids: None,
                min_hits: 0
            }
        );
        assert_eq!(
            Request::parse(r#"{"op":"hits","ids":[3,9],"min_hits":1}"#).unwrap(),
            Request::Hits {
                ids: Some(vec![3, 9]),
                min_hits: 1
            }
        );
        // Written back as short as it was asked.
        assert_eq!(
            serde_json::to_string(&Request::Hits {
                ids: None,
                min_hits: 1
            })
            .unwrap(),
            r#"{"op":"hits","min_hits":1}"#
        );
        assert_eq!(
            Request::parse(r#"{"op":"get","symbol":"v"}"#).unwrap(),
            Request::Get {
                symbol: "v".into(),
                size: None
            }
        );
        assert_eq!(
            Request::parse(r#"{"op":"splice","at":"f","action":"count","mechanism":"jmp"}"#)
                .unwrap(),
            Request::Splice(SpliceRequest {
                at: "f".into(),
                action: Action::Count,
                mechanism: Mechanism::Jmp,
                options: Default::default()
            })
        );
        assert_eq!(
            Request::parse(r#"{"op":"unsplice","all":true}"#).unwrap(),
            Request::Unsplice {
                at: None,
                all: true
            }
        );
        assert_eq!(
            Request::parse(r#"{"op":"set","symbol":"v","value":"-1"}"#).unwrap(),
            Request::Set {
                symbol: "v".into(),
                value: super::super::Value::Text("-1".into()),
                size: None
            }
        );
        // Journals written before `all`, `best_effort` and `check` existed still parse.
        assert_eq!(
            Request::parse(r#"{"op":"unsplice","at":"f"}"#).unwrap(),
            Request::Unsplice {
                at: Some("f".into()),
                all: false
            }
        );
    }

    #[test]
    fn malformed_requests_are_errors_that_name_the_problem() {
        let e = |l: &str| trapvec::error_chain(&Request::parse(l).unwrap_err());
        assert!(e(r#"{"op":"frobnicate"}"#).contains("frobnicate"));
        assert!(e(r#"{"op":"unsplice"}"#).contains("needs `at`"));
        assert!(e(r#"{"op":"unsplice","at":"f","all":true}"#).contains("not both"));
        assert!(
            e(r#"{"op":"apply","spec":"/s.toml","check":true,"best_effort":true}"#)
                .contains("not both")
        );
        assert!(e(r#"{"op":"set","symbol":"v","value":[1]}"#).starts_with("bad request"));
        assert!(e(r#"{"op":"unsplice","at":"f","extra":1}"#).contains("extra"));
        assert!(e(r#"{"op":"set","symbol":"v","value":-1}"#).starts_with("bad request"));
        assert!(e(r#"{"op":"hits","min_hits":-1}"#).starts_with("bad request"));
        assert!(e(r#"{"op":"hits","ids":"3"}"#).starts_with("bad request"));
        assert!(e(r#"{"op":"hits","since":3}"#).contains("since"));
        assert!(e("{\"op\":\"li").starts_with("bad request"));
        assert!(e("[1,2]").starts_with("bad request"));
        assert!(e("").starts_with("bad request"));
    }

    #[test]
    fn only_reads_are_not_changes() {
        assert!(!Request::List.changes() && !Request::Status.changes());
        assert!(!Request::Hits {
            ids: None,
            min_hits: 1
        }
        .changes());
        assert!(!Request::Apply {
            spec: "/s.toml".into(),
            best_effort: false,
            check: true,
            brief: false
        }
        .changes());
        assert!(Request::Apply {
            spec: "/s.toml".into(),
            best_effort: true,
            check: false,
            brief: false
        }
        .changes());
        assert!(Request::Activate {
            profile: "p".into()
        }
        .changes());
    }

    #[test]
    fn splice_requests_and_their_protocol_form_map_both_ways() {
        let requests = [
            SpliceRequest {
                at: "f".into(),
                action: Action::Call {
                    handler: "h".into(),
                    cookie: 7,
                },
                mechanism: Mechanism::Jmp,
                options: Default::default(),
            },
            SpliceRequest {
                at: "f+0x9".into(),
                action: Action::Replace { with: "g".into() },
                mechanism: Mechanism::Trap,
                options: Default::default(),
            },
            SpliceRequest {
                at: "0xffffffff81000000".into(),
                action: Action::Count,
                mechanism: Mechanism::Trap,
                options: Default::default(),
            },
        ];
        for r in requests {
            let line = serde_json::to_string(&Request::Splice(r.clone())).unwrap();
            assert!(line.starts_with(r#"{"op":"splice","at":"#), "{line}");
            assert_eq!(Request::parse(&line).unwrap(), Request::Splice(r));
        }
        // Journals written when `handler` and `mechanism` were serialized as null still parse.
        assert_eq!(
            Request::parse(r#"{"op":"splice","at":"f","action":"count","handler":null,"mechanism":null,"cookie":0}"#).unwrap(),
            Request::Splice(SpliceRequest { at: "f".into(), action: Action::Count, mechanism: Mechanism::Trap, options: Default::default() })
        );
        let e = |l: &str| trapvec::error_chain(&Request::parse(l).unwrap_err());
        assert!(e(r#"{"op":"splice","at":"f","action":"call"}"#)
            .starts_with("bad request: f: action `call` needs a `handler`"));
        assert!(e(r#"{"op":"splice","at":"f","action":"jump"}"#).contains("unknown action `jump`"));
        assert!(e(r#"{"op":"splice","at":"f","action":"count","extra":1}"#).contains("extra"));
    }

    #[test]
    fn op_is_the_op_written_on_the_wire() {
        let requests = [
            Request::Status,
            Request::List,
            Request::Hits {
                ids: Some(vec![1]),
                min_hits: 0,
            },
            Request::Load {
                path: "/c.o".into(),
                name: None,
            },
            Request::Unload { name: "c".into() },
            Request::Remove {
                at: vec!["f".into(), "0xffffffff81000000".into()],
            },
            Request::Splice(SpliceRequest {
                at: "f".into(),
                action: Action::Count,
                mechanism: Mechanism::Trap,
                options: Default::default(),
            }),
            Request::Unsplice {
                at: None,
                all: true,
            },
            Request::Apply {
                spec: "/s.toml".into(),
                best_effort: false,
                check: false,
                brief: false,
            },
            Request::Set {
                symbol: "v".into(),
                value: super::super::Value::Text("1".into()),
                size: None,
            },
            Request::Get {
                symbol: "v".into(),
                size: None,
            },
            Request::Activate {
                profile: "p".into(),
            },
            Request::Require { module: "m".into() },
        ];
        for r in requests {
            assert_eq!(
                serde_json::to_value(&r).unwrap()["op"],
                json!(r.op()),
                "{r:?}"
            );
        }
    }
}
