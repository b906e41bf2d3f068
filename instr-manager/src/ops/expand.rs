//! Globs where a point is taken: a splice whose `at` is a glob (`tcp_v4_*`, `nf_*:nf_ct_*`)
//! stands for one splice per matching function of the target's symbols, each at the function's
//! entry as a plain `FUNC` point is, with the same action, mechanism and options. Expanded when
//! the splices are made, so that every one of them goes in the same batch. A function whose
//! name does not resolve to it alone (a static function's name that others share, as kallsyms
//! repeats them) is named with its address, `name@0xADDRESS`: a glob names functions, each copy
//! is one.

use serde::{Deserialize, Serialize};
use trapvec::Target;

use crate::cause::RefusalCause;
use crate::glob::{is_glob, matching_functions, FunctionGlob, GlobError};
use crate::point::choose;
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
        let symbols = sp.target().symbols();
        for f in found {
            let mut one = r.clone();
            let named = match &f.origin {
                Some(o) => format!("{o}:{}", f.name),
                None => f.name.clone(),
            };
            // The name alone, where it resolves to this function; else this copy by address.
            let alone = choose(&named, &f.name, f.origin.as_deref(), None, symbols)
                .is_ok_and(|s| s.addr == f.addr);
            one.at = if alone {
                named
            } else {
                format!("{named}@{:#x}", f.addr)
            };
            out.push(one);
        }
    }
    Ok((out, globbed))
}

/// The splices of a spec written by a front end: an owner every splice has is written once, as
/// the spec's `owner` (not once per splice: `trapctl cover`'s ten thousand splices of one
/// command made a spec four times as long, written and read as slowly).
#[derive(Serialize)]
struct Splices<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a crate::owner::Owner>,
    splice: std::borrow::Cow<'a, [SpliceRequest]>,
}

impl<'a> Splices<'a> {
    fn of(splices: &'a [SpliceRequest]) -> Splices<'a> {
        let common = splices
            .first()
            .and_then(|s| s.options.owner.as_ref())
            .filter(|&o| splices.iter().all(|s| s.options.owner.as_ref() == Some(o)));
        let Some(owner) = common else {
            return Splices {
                owner: None,
                splice: splices.into(),
            };
        };
        let bare = splices
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.options.owner = None;
                s
            })
            .collect::<Vec<_>>();
        Splices {
            owner: Some(owner),
            splice: bare.into(),
        }
    }
}

/// A spec of `splices` alone, as TOML text ([`crate::Spec::parse`] reads it back): how a front
/// end sends a glob of its command line as an `apply` of its own.
pub fn spec_text(splices: &[SpliceRequest]) -> Result<String, toml::ser::Error> {
    toml::to_string(&Splices::of(splices))
}

/// The same spec as JSON, for a file named `*.json` ([`crate::Spec::parse`] reads it back):
/// for 10,000 splices, read nine times and written thirty times as fast as the TOML.
pub fn spec_json(splices: &[SpliceRequest]) -> Result<String, serde_json::Error> {
    serde_json::to_string(&Splices::of(splices))
}

/// One refused point of a batch: the point, its error chain, and why, when the error says it
/// ([`crate::splicer::SpliceError::cause`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedPoint {
    pub at: String,
    pub chain: String,
    pub cause: Option<RefusalCause>,
}

impl RefusedPoint {
    /// The refusal `e` of the point `at`.
    pub fn of(at: &str, e: &crate::splicer::SpliceError) -> RefusedPoint {
        RefusedPoint {
            at: at.to_string(),
            chain: trapvec::error_chain(e),
            cause: e.cause(),
        }
    }

    /// The cause's name ([`RefusalCause::name`]), the refusal's kind wherever refusals are
    /// grouped; `None` for an error with no cause.
    pub fn kind(&self) -> Option<String> {
        self.cause.as_ref().map(|c| c.name().into_owned())
    }

    /// Why, without the point and the site: the cause's fixed sentence, or for an error with
    /// no cause its own text (see [`reason_of`]).
    pub fn reason(&self) -> String {
        match &self.cause {
            Some(c) => c.summary().into_owned(),
            None => reason_of(&self.at, &self.chain),
        }
    }
}

/// The refusals of a best-effort batch, one line per reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalGroup {
    /// Why, without the point and the site.
    pub reason: String,
    /// The cause's name (`too_short`, `kernel_jump_label`); none for an error that names no
    /// cause, grouped by its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
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

/// The reason of a refusal with no cause (`chain`, its error chain) of the splice at `at`: the
/// chain without the point it starts with, and the function's own name as `the function`. Every
/// refusal of the planner has a cause ([`RefusedPoint::cause`]); this is what is left for an
/// error that has none, which is then a line of its own.
pub fn reason_of(at: &str, chain: &str) -> String {
    let rest = chain
        .strip_prefix(at)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(chain);
    // A point refused before it was resolved names itself again: `point `f`: ...`.
    let quoted = format!("`{at}`");
    let rest = rest
        .strip_prefix("point ")
        .and_then(|r| r.strip_prefix(quoted.as_str()))
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(rest);
    let name = at.rsplit_once(':').map_or(at, |(_, n)| n);
    rest.replace(&format!("`{name}`"), "the function")
}

/// `refused` grouped by cause (an error with no cause by its text), the most frequent first
/// (ties in the order first seen).
pub fn summarize(refused: &[RefusedPoint]) -> Vec<RefusalGroup> {
    let mut groups: Vec<(String, RefusalGroup)> = Vec::new();
    for r in refused {
        let key = match &r.cause {
            Some(_) => r.kind().unwrap_or_default(),
            None => format!("text: {}", r.reason()),
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => {
                g.count += 1;
                if g.first.len() < FIRST_REFUSALS {
                    g.first.push(r.at.clone());
                }
            }
            None => groups.push((
                key,
                RefusalGroup {
                    reason: r.reason(),
                    cause: r.kind(),
                    count: 1,
                    first: vec![r.at.clone()],
                },
            )),
        }
    }
    groups.sort_by_key(|(_, g)| std::cmp::Reverse(g.count));
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests;
