//! The spec: TOML text through instr-manager's spec parser, and each line through the parser of
//! the `.trapvec.splices` records a component declares. What parses is consistent: each point
//! prints as text that parses back to the same point, each value fits its size, each component
//! path is absolute (resolved against the spec's folder).

use std::path::Path;

use instr_manager::{PointSpec, Spec, SpliceRequest};

use crate::assert_sentence;

fn check_point(at: &str, point: &PointSpec) {
    let printed = point.to_string();
    let again: PointSpec = printed.parse().unwrap_or_else(|e| {
        panic!("point `{at}` prints as `{printed}`, which does not parse: {e}")
    });
    assert_eq!(
        &again, point,
        "point `{at}` prints as `{printed}`, which parses to another point"
    );
}

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Spec::parse(text, Path::new("/specs"), Path::new("/specs/fuzz.toml")) {
        Ok(spec) => {
            for c in &spec.components {
                assert!(
                    c.path.is_absolute(),
                    "component path {} is not resolved against the spec's folder",
                    c.path.display()
                );
            }
            for s in &spec.splices {
                check_point(
                    &s.at,
                    &s.point().unwrap_or_else(|e| {
                        panic!("splice point `{}` was taken but does not parse: {e}", s.at)
                    }),
                );
                if let Some(h) = s.action.symbol() {
                    assert!(
                        !h.trim().is_empty(),
                        "splice `{}` has an empty handler",
                        s.at
                    );
                }
            }
            for s in &spec.sets {
                // No size: the value is an 8-byte two's complement, fitted when written.
                if let Some(size) = s.size {
                    assert!(
                        matches!(size, 1 | 2 | 4 | 8),
                        "set `{}` has size {size}",
                        s.symbol
                    );
                    if size < 8 {
                        assert_eq!(
                            s.value >> (8 * size),
                            0,
                            "set `{}`: value {:#x} does not fit {size} bytes",
                            s.symbol,
                            s.value
                        );
                    }
                }
            }
        }
        Err(e) => assert_sentence("spec", &trapvec::error_chain(&e)),
    }
    for line in text.lines().take(64) {
        match SpliceRequest::from_record(line) {
            Ok(s) => {
                if let Ok(point) = s.point() {
                    check_point(&s.at, &point);
                }
                if let Some(h) = s.action.symbol() {
                    assert!(!h.trim().is_empty(), "record `{line}` has an empty handler");
                }
            }
            Err(e) => assert_sentence("splice record", &trapvec::error_chain(&e)),
        }
    }
}
