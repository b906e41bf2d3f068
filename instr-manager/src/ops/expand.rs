//! Globs where a point is taken: a splice whose `at` is a glob (`tcp_v4_*`, `nf_*:nf_ct_*`)
//! stands for one splice per matching function of the target's symbols, each at the function's
//! entry as a plain `FUNC` point is, with the same action, mechanism and options. Expanded when
//! the splices are made, so that every one of them goes in the same batch.

use serde::{Deserialize, Serialize};
use trapvec::Target;

use crate::glob::{is_glob, matching_functions, FunctionGlob, GlobError};
use crate::splice::SpliceRequest;
use crate::splicer::Splicer;

/// How many refused points a default (all or nothing) refusal or a summary line names.
pub const FIRST_REFUSALS: usize = 3;

/// Why a glob could not stand for its functions, or why its batch was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    #[error(transparent)]
    Bad(#[from] GlobError),
    #[error("the glob `{glob}` matches no function")]
    NoMatch { glob: String },
    /// All or nothing, and some of the expanded splices were refused: nothing was applied.
    #[error("{count} of {total} splices refused, nothing was applied (first: {}); --best-effort applies the rest", .first.join("; "))]
    Refused {
        count: usize,
        total: usize,
        first: Vec<String>,
    },
}

/// `requests` with each glob point replaced by one request per function it matches (in address
/// order), every other request kept as it is, in order. Whether any glob was there is returned
/// too.
pub fn expand<T: Target>(
    sp: &Splicer<T>,
    requests: &[SpliceRequest],
) -> Result<(Vec<SpliceRequest>, bool), ExpandError> {
    let mut out = Vec::with_capacity(requests.len());
    let mut globbed = false;
    for r in requests {
        if !is_glob(&r.at) {
            out.push(r.clone());
            continue;
        }
        globbed = true;
        let glob = FunctionGlob::new(&r.at)?;
        let found = matching_functions(sp.target().symbols(), std::slice::from_ref(&glob));
        if found.is_empty() {
            return Err(ExpandError::NoMatch {
                glob: glob.text().to_string(),
            });
        }
        for f in found {
            let mut one = r.clone();
            one.at = match &f.origin {
                Some(o) => format!("{o}:{}", f.name),
                None => f.name.clone(),
            };
            out.push(one);
        }
    }
    Ok((out, globbed))
}

/// A spec of `splices` alone, as TOML text ([`crate::Spec::parse`] reads it back): how a front
/// end sends a glob of its command line as an `apply` of its own.
pub fn spec_text(splices: &[SpliceRequest]) -> Result<String, toml::ser::Error> {
    #[derive(Serialize)]
    struct Splices<'a> {
        splice: &'a [SpliceRequest],
    }
    toml::to_string(&Splices { splice: splices })
}

/// The refusals of a best-effort batch, one line per reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalGroup {
    /// Why, without the point and the site.
    pub reason: String,
    pub count: usize,
    /// The first points refused for it (at most [`FIRST_REFUSALS`]).
    pub first: Vec<String>,
}

impl std::fmt::Display for RefusalGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused {}: {} (at {}",
            self.count,
            self.reason,
            self.first.join(", ")
        )?;
        if self.count > self.first.len() {
            write!(f, ", ...")?;
        }
        write!(f, ")")
    }
}

/// The reason of a refusal (`chain`, its error chain) of the splice at `at`: the chain without
/// the point it starts with and without the site and mechanism a planner refusal names, so that
/// the refusals of many functions for one reason read the same.
pub fn reason_of(at: &str, chain: &str) -> String {
    let rest = chain
        .strip_prefix(at)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(chain);
    if let Some(r) = rest.strip_prefix("cannot splice at ") {
        return r.split_once(": ").map_or(rest, |(_, why)| why).to_string();
    }
    // Others name the site (`the site 0x... is already spliced (by f1)`): without the
    // addresses and the other splice, one reason reads the same for every function.
    let rest = match rest.rfind(" (by ") {
        Some(i) if rest.ends_with(')') => &rest[..i],
        _ => rest,
    };
    rest.split(' ')
        .filter(|w| !w.starts_with("0x"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `refused` (point, error chain) grouped by reason, the most frequent first (ties in the order
/// first seen).
pub fn summarize(refused: &[(String, String)]) -> Vec<RefusalGroup> {
    let mut groups: Vec<RefusalGroup> = Vec::new();
    for (at, chain) in refused {
        let reason = reason_of(at, chain);
        match groups.iter_mut().find(|g| g.reason == reason) {
            Some(g) => {
                g.count += 1;
                if g.first.len() < FIRST_REFUSALS {
                    g.first.push(at.clone());
                }
            }
            None => groups.push(RefusalGroup {
                reason,
                count: 1,
                first: vec![at.clone()],
            }),
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(g.count));
    groups
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use trapvec::fake::FakeKernel;

    use super::*;
    use crate::ops::{apply, check};
    use crate::plan::Mechanism;
    use crate::spec::Spec;
    use crate::splice::Action;

    fn count(at: &str) -> SpliceRequest {
        SpliceRequest::new(at, Action::Count, Mechanism::Trap)
    }

    fn spec(splices: Vec<SpliceRequest>) -> Spec {
        Spec {
            splices,
            ..Spec::default()
        }
    }

    fn ats(rows: &[crate::ops::SpliceRow]) -> Vec<&str> {
        rows.iter().map(|r| r.at.as_str()).collect()
    }

    #[test]
    fn a_glob_makes_one_splice_per_matching_function_in_one_batch() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        let (report, made) =
            apply(&mut sp, &spec(vec![count("f[0-2]"), count("f3")]), false).unwrap();
        assert_eq!(ats(&report.spliced), ["f0", "f1", "f2", "f3"]);
        // Where a plain `FUNC` point goes (f3, written by name): past the fentry NOP.
        assert!(report.spliced.iter().all(|r| r.offset == 5));
        assert_eq!(report.requested, 4);
        assert_eq!(made.splices.len(), 4);
        assert_eq!(sp.last_batch().unwrap().splices, 4);
        for f in trapvec::fake::FUNCS {
            assert!(k.trapped(f), "{f}");
        }
    }

    #[test]
    fn a_glob_matching_nothing_is_an_error_naming_it() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        let e = apply(&mut sp, &spec(vec![count("f0"), count("tcp_*")]), false).unwrap_err();
        assert_eq!(e.to_string(), "the glob `tcp_*` matches no function");
        assert!(k.pristine());
        assert_eq!(sp.live().count(), 0);
    }

    #[test]
    fn by_default_a_refusal_applies_nothing_and_names_the_first_ones() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        sp.apply(&[count("f3")]).unwrap();
        let e = apply(&mut sp, &spec(vec![count("f*")]), false).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("1 of 4 splices refused, nothing was applied (first: f3: the site"),
            "{text}"
        );
        assert_eq!(sp.live().count(), 1);
        for f in ["f0", "f1", "f2"] {
            assert!(!k.trapped(f), "{f}");
        }
    }

    #[test]
    fn best_effort_applies_the_rest_and_sums_the_refusals_up_by_reason() {
        let k = FakeKernel::new();
        let mut sp = Splicer::new(k.clone());
        sp.apply(&[count("f3")]).unwrap();
        let call = SpliceRequest::new(
            "f[01]",
            Action::Call {
                handler: "nope".into(),
                cookie: 0,
            },
            Mechanism::Trap,
        );
        let (report, _) = apply(&mut sp, &spec(vec![call, count("f[23]")]), true).unwrap();
        assert_eq!(ats(&report.spliced), ["f2"]);
        assert!(k.trapped("f2") && !k.trapped("f0") && !k.trapped("f1"));
        assert_eq!(report.requested, 4);
        assert_eq!(report.refused.len(), 3);
        let lines: Vec<String> = report.refusals.iter().map(|g| g.to_string()).collect();
        assert_eq!(
            lines,
            [
                "refused 2: handler `nope` is not a symbol of any loaded component (at f0, f1)",
                "refused 1: the site is already spliced (at f3)",
            ]
        );
    }

    #[test]
    fn a_summary_line_names_the_first_three_points() {
        let pairs: Vec<(String, String)> = (0..5)
            .map(|i| {
                let at = format!("g{i}");
                let e = format!("{at}: cannot splice at {:#x} by jmp: too short", 0x1000 + i);
                (at, e)
            })
            .collect();
        let groups = summarize(&pairs);
        assert_eq!(groups.len(), 1);
        assert_eq!(
            groups[0].to_string(),
            "refused 5: too short (at g0, g1, g2, ...)"
        );
    }

    #[test]
    fn check_expands_globs_too() {
        let sp = Splicer::new(FakeKernel::new());
        let report = check(&sp, &spec(vec![count("f[12]")]));
        let at: Vec<&str> = report.ok.iter().map(|r| r.at.as_str()).collect();
        assert_eq!(at, ["f1", "f2"]);
        let report = check(&sp, &spec(vec![count("x?")]));
        assert_eq!(report.refused, ["the glob `x?` matches no function"]);
    }

    #[test]
    fn a_generated_spec_reads_back_as_its_splices() {
        let mut r = count("tcp_v4_*");
        r.mechanism = Mechanism::Jmp;
        r.options.by = Some(trapvec::keyed::KeyBy::Cpu);
        let text = spec_text(std::slice::from_ref(&r)).unwrap();
        let spec = Spec::parse(&text, Path::new("/"), Path::new("gen.toml")).unwrap();
        assert_eq!(spec.splices, [r]);
    }

    #[test]
    fn a_spec_takes_a_glob_and_refuses_a_bad_one() {
        let parse = |at: &str| {
            let text = format!("[[splice]]\nat = \"{at}\"\naction = \"count\"\n");
            Spec::parse(&text, Path::new("/"), Path::new("s.toml"))
        };
        assert_eq!(parse("tcp_v4_*").unwrap().splices[0].at, "tcp_v4_*");
        assert_eq!(parse("nf_*:nf_ct_?").unwrap().splices[0].at, "nf_*:nf_ct_?");
        let e = parse("tcp_[a-").unwrap_err().to_string();
        assert!(
            e.contains("splice[0].at") && e.contains("never closed"),
            "{e}"
        );
    }
}
