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
/// the refusals of many functions for one reason read the same. What names one function rather
/// than the cause goes too: addresses and ranges, the bytes of an instruction that does not
/// decode, the instruction text of one that cannot be relocated (`an instruction`), the
/// function's own name (`the function`), and an ambiguous name's candidates.
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
    let rest = match rest.strip_prefix("cannot splice at ") {
        Some(r) => r.split_once(": ").map_or(rest, |(_, why)| why),
        None => rest,
    };
    // Others name the site (`the site 0x... is already spliced (by f1)`): without the
    // addresses and the other splice, one reason reads the same for every function.
    let rest = match rest.rfind(" (by ") {
        Some(i) if rest.ends_with(')') => &rest[..i],
        _ => rest,
    };
    // An ambiguous name: its candidates and how to qualify it name the function.
    if let Some(i) = rest.find(" is ambiguous: ") {
        if rest[..i] == quoted {
            return "the name is ambiguous (functions of that name in several places); a glob \
                    cannot qualify it"
                .to_string();
        }
    }
    let name = at.rsplit_once(':').map_or(at, |(_, n)| n);
    let mut out = rest.replace(&format!("`{name}`"), "the function");
    for (varying, by) in VARYING.iter() {
        out = varying.replace_all(&out, *by).into_owned();
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The parts of a refusal's reason that differ from one function to the next for the same
/// cause, in the order they are taken out, and what stands for each.
static VARYING: std::sync::LazyLock<Vec<(regex::Regex, &'static str)>> =
    std::sync::LazyLock::new(|| {
        [
            // `invalid instruction in f at 0x.. (bytes 0f 0b ..)`.
            (r" ?\(bytes[0-9a-f ]*\)", ""),
            // `(window at 0x..)`.
            (r" ?\(window at 0x[0-9a-f]+\)", ""),
            // An instruction with operands: `mov rax, gs:[0x1fb88]`.
            (r"`[^`]* [^`]*`", "an instruction"),
            // Ranges `[0x.., 0x..)`, then any address with what introduces it.
            (r" ?\[0x[0-9a-f]+, 0x[0-9a-f]+\)", ""),
            (r"( at| from the new address)? 0x[0-9a-f]+,?", ""),
            // What is left of `... at 0x..` at the end or before a clause.
            (r" at($|[,;)])", "$1"),
        ]
        .into_iter()
        .map(|(re, by)| (regex::Regex::new(re).expect("a valid pattern"), by))
        .collect()
    });

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

    /// Refusals of 6.1's `[iut][cdp]*` (vmtest/scenarios/kernel_glob.sh): one line per cause,
    /// not per function.
    #[test]
    fn one_cause_reads_the_same_for_every_function() {
        let reasons = |pairs: &[(&str, &str)]| -> Vec<String> {
            pairs
                .iter()
                .map(|(at, chain)| reason_of(at, chain))
                .collect()
        };
        let r = reasons(&[
            ("tcp_init", "tcp_init: invalid instruction in `tcp_init` at 0xffffffff83a0b8c0 (bytes 61 74 74 72 00 00)"),
            ("ip_init", "ip_init: invalid instruction in `ip_init` at 0xffffffff83a0a000 (bytes 61 74)"),
        ]);
        assert_eq!(r[0], "invalid instruction in the function");
        assert_eq!(r[0], r[1]);
        let r = reasons(&[
            ("up_write", "up_write: cannot splice at 0xffffffff811034f5 by trap: `inc dword ptr gs:[0x1fb40]` at 0xffffffff811034f5 (window at 0xffffffff811034f5) cannot be relocated: its memory operand 0x1fb40 is more than ±2 GiB from the new address 0xffffffff811034f5"),
            ("update_spec_ctrl_cond", "update_spec_ctrl_cond: cannot splice at 0xffffffff81048625 by trap: `mov rax, gs:[0x1fb88]` at 0xffffffff81048625 (window at 0xffffffff81048625) cannot be relocated: its memory operand 0x1fb88 is more than ±2 GiB from the new address 0xffffffff81048625"),
        ]);
        assert_eq!(
            r[0],
            "an instruction cannot be relocated: its memory operand is more than ±2 GiB"
        );
        assert_eq!(r[0], r[1]);
        let r = reasons(&[
            ("tp_stub_func", "tp_stub_func: cannot splice at 0xffffffff8119cb45 by trap: the window [0xffffffff8119cb45, 0xffffffff8119cb47) crosses the end of its basic block [0xffffffff8119cb40, 0xffffffff8119cb46) after `ret`"),
            ("update_curr_idle", "update_curr_idle: cannot splice at 0xffffffff810e9965 by trap: the window [0xffffffff810e9965, 0xffffffff810e9967) crosses the end of its basic block [0xffffffff810e9960, 0xffffffff810e9966) after `ret`"),
        ]);
        assert_eq!(
            r[0],
            "the window crosses the end of its basic block after `ret`"
        );
        assert_eq!(r[0], r[1]);
        let r = reasons(&[
            ("tcp4_proc_init", "tcp4_proc_init: the instruction of `tcp4_proc_init` at 0xffffffff83a0c000 runs past the function's end at 0xffffffff83a0c010"),
            ("udp4_proc_init", "udp4_proc_init: the instruction of `udp4_proc_init` at 0xffffffff83a0d000 runs past the function's end at 0xffffffff83a0d00c"),
        ]);
        assert_eq!(
            r[0],
            "the instruction of the function runs past the function's end"
        );
        assert_eq!(r[0], r[1]);
        let r = reasons(&[
            ("id_show", "point `id_show`: `id_show` is ambiguous: main:id_show at 0xffffffff81001000, main:id_show at 0xffffffff81002000; qualify it as `object:id_show` or `id_show@VERSION`, or give an address"),
            ("udp_lib_hash", "point `udp_lib_hash`: `udp_lib_hash` is ambiguous: main:udp_lib_hash at 0xffffffff81003000, main:udp_lib_hash at 0xffffffff81004000, main:udp_lib_hash at 0xffffffff81005000; qualify it as `object:udp_lib_hash` or `udp_lib_hash@VERSION`, or give an address"),
        ]);
        assert!(r[0].starts_with("the name is ambiguous"), "{}", r[0]);
        assert_eq!(r[0], r[1]);
        // Causes that name no function are left as they are.
        let jl = "the kernel refuses to patch overlaps a jump label (static key) site, which the kernel rewrites by itself";
        assert_eq!(
            reason_of(
                "tcp_twsk_destructor",
                &format!("tcp_twsk_destructor: cannot splice at 0xffffffff81001000 by trap: {jl}")
            ),
            jl
        );
        assert_eq!(
            reason_of("ipv4_cow_metrics", "ipv4_cow_metrics: cannot splice at 0xffffffff8183ca65 by trap: `ud2` at 0xffffffff8183ca65 (window at 0xffffffff8183ca65) cannot be relocated: an undefined-opcode trap is identified by its address (the kernel's BUG/WARN table)"),
            "`ud2` cannot be relocated: an undefined-opcode trap is identified by its address (the kernel's BUG/WARN table)"
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
