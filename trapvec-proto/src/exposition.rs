//! What trapvec holds, in the Prometheus text exposition format (version 0.0.4): one renderer
//! for `trapctl list --prometheus` (a file for node_exporter's textfile collector) and for
//! trapd's `/metrics` endpoint, so both say the same thing in the same words.
//!
//! The renderer is pure: it formats a [`Listing`] (the same one `list` prints) and, for trapd,
//! the [`DaemonStats`] built from its `status` reply and its request counters. Nothing here
//! reads the kernel.
//!
//! Families (each with `# HELP` and `# TYPE`, samples sorted as listed):
//!
//! | family | type | labels |
//! |---|---|---|
//! | `trapvec_splice_hits_total` | counter | `point`, `function`, `off`, `mechanism`, `action`, `handler` |
//! | `trapvec_splice_missed_total` | counter | the same |
//! | `trapvec_timer_seconds` | histogram | the same: a timer's (`trapctl time`, `action = "time"`) calls, `_bucket{le}`, `_sum`, `_count` |
//! | `trapvec_splice_key_hits_total` | counter | the same and `by`, `key`: a keyed count's [`TOP_KEYS`] top keys, the rest summed as `key="(other)"`, the table's overflow as `key="(overflow)"` |
//!
//! A splice is labelled by its function and the offset in it (decimal), never by its address:
//! the kernel's addresses move at every boot (KASLR), and so would every series.
//! | `trapvec_splices`, `trapvec_splices_retiring`, `trapvec_components` | gauge | |
//! | `trapd_profile_active` | gauge | `profile`: 1 for the active one, 0 for each other configured one |
//! | `trapd_profile_switches_total` | counter | |
//! | `trapd_metric_value` | gauge | `metric`: the last value of each of its rules' metrics |
//! | `trapd_requests_total`, `trapd_request_errors_total` | counter | `op` (`invalid`: a line that is not a request) |
//! | `trapd_uptime_seconds`, `trapd_unrecorded_dispatch_entries` | gauge | |

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use instr_manager::ops::{Listing, SpliceRow};

/// The content type of the text format, for an HTTP reply.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What trapd knows beyond the listing: the fields of its `status` reply it exposes, and the
/// requests it served.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct DaemonStats {
    /// The active profile, if any.
    pub profile: Option<String>,
    /// Every configured profile.
    #[serde(default)]
    pub profiles: Vec<String>,
    /// Profile switches since the daemon started.
    #[serde(default)]
    pub switches: u64,
    #[serde(default)]
    pub uptime_s: u64,
    /// Dispatch entries live in the module that no stored state describes.
    #[serde(default)]
    pub unrecorded: u64,
    /// The last value of each metric the rules read.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// Requests served, by `op` (not part of `status`: the server counts them).
    #[serde(skip)]
    pub requests: BTreeMap<String, RequestCount>,
}

/// How many requests of one kind were answered, and how many of those with an error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCount {
    pub total: u64,
    pub errors: u64,
}

/// The exposition of `listing`, and of `daemon` when trapd renders it.
pub fn render(listing: &Listing, daemon: Option<&DaemonStats>) -> String {
    let mut out = Exposition::default();
    out.family(
        "trapvec_splice_hits_total",
        "counter",
        "Traps taken at a live splice (handler run, or counted).",
    );
    for s in &listing.splices {
        out.sample(
            "trapvec_splice_hits_total",
            &refs(&splice_labels(s)),
            s.hits as f64,
        );
    }
    out.family(
        "trapvec_splice_missed_total",
        "counter",
        "Traps at a live splice taken while a handler already ran on that CPU (handler skipped).",
    );
    for s in &listing.splices {
        out.sample(
            "trapvec_splice_missed_total",
            &refs(&splice_labels(s)),
            s.missed as f64,
        );
    }
    out.family(
        "trapvec_timer_seconds",
        "histogram",
        "Duration of the calls a timer measured (its clock: wall or on-CPU time).",
    );
    for s in &listing.splices {
        if let Some(h) = s.returns.as_ref().and_then(|r| r.histogram.as_ref()) {
            out.histogram("trapvec_timer_seconds", &refs(&splice_labels(s)), h);
        }
    }
    out.family(
        "trapvec_splice_key_hits_total",
        "counter",
        "Hits of a keyed count (trapctl splice --count --by KEY) by key: the top keys, the rest as (other), the full table's as (overflow).",
    );
    for s in &listing.splices {
        let (Some(by), Some(keys)) = (s.by, s.keys.as_ref()) else {
            continue;
        };
        let base = splice_labels(s);
        let mut sample = |key: &str, n: u64| {
            let mut labels = refs(&base);
            labels.push(("by", by.name()));
            labels.push(("key", key));
            out.sample("trapvec_splice_key_hits_total", &labels, n as f64);
        };
        for k in keys.keys.iter().take(TOP_KEYS) {
            sample(&k.key, k.count);
        }
        if keys.keys.len() > TOP_KEYS {
            sample(
                "(other)",
                keys.keys[TOP_KEYS..].iter().map(|k| k.count).sum(),
            );
        }
        sample("(overflow)", keys.overflow);
    }
    out.family("trapvec_splices", "gauge", "Live splices.");
    out.sample("trapvec_splices", &[], listing.splices.len() as f64);
    out.family(
        "trapvec_splices_retiring",
        "gauge",
        "Splices whose removal waits for a task to leave their code.",
    );
    out.sample(
        "trapvec_splices_retiring",
        &[],
        listing.retiring.len() as f64,
    );
    out.family("trapvec_components", "gauge", "Loaded components.");
    out.sample("trapvec_components", &[], listing.components.len() as f64);
    let Some(d) = daemon else { return out.text };

    out.family(
        "trapd_profile_active",
        "gauge",
        "1 for trapd's active profile, 0 for each other configured profile.",
    );
    let mut profiles: Vec<&str> = d.profiles.iter().map(String::as_str).collect();
    // A journaled profile may have left the configuration; it is still the active one.
    if let Some(p) = d.profile.as_deref().filter(|p| !profiles.contains(p)) {
        profiles.push(p);
    }
    profiles.sort_unstable();
    for p in profiles {
        let active = d.profile.as_deref() == Some(p);
        out.sample(
            "trapd_profile_active",
            &[("profile", p)],
            if active { 1.0 } else { 0.0 },
        );
    }
    out.family(
        "trapd_profile_switches_total",
        "counter",
        "Profile switches since trapd started.",
    );
    out.sample("trapd_profile_switches_total", &[], d.switches as f64);
    out.family(
        "trapd_metric_value",
        "gauge",
        "Last sampled value of each metric trapd's rules read.",
    );
    for (name, value) in &d.metrics {
        out.sample("trapd_metric_value", &[("metric", name)], *value);
    }
    out.family(
        "trapd_requests_total",
        "counter",
        "Requests answered on trapd's socket, by op (invalid: not a request).",
    );
    for (op, n) in &d.requests {
        out.sample("trapd_requests_total", &[("op", op)], n.total as f64);
    }
    out.family(
        "trapd_request_errors_total",
        "counter",
        "Requests answered with an error, by op.",
    );
    for (op, n) in &d.requests {
        out.sample("trapd_request_errors_total", &[("op", op)], n.errors as f64);
    }
    out.family(
        "trapd_uptime_seconds",
        "gauge",
        "Seconds since trapd started.",
    );
    out.sample("trapd_uptime_seconds", &[], d.uptime_s as f64);
    out.family(
        "trapd_unrecorded_dispatch_entries",
        "gauge",
        "Dispatch entries live in the module that no stored state describes (rmmod trapvec reverts them).",
    );
    out.sample(
        "trapd_unrecorded_dispatch_entries",
        &[],
        d.unrecorded as f64,
    );
    out.text
}

/// Labels with owned values, borrowed as [`Exposition::sample`] takes them.
fn refs<'a>(labels: &'a [(&'a str, String)]) -> Vec<(&'a str, &'a str)> {
    labels.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The most keys of one keyed count exported as series of their own (a table holds 256): the
/// label's values stay bounded, whatever the tasks' names.
pub const TOP_KEYS: usize = 20;

/// A splice's labels. `action` is the kind (`call`, `replace`, `count`: the first word of the
/// row's action text), `handler` the handler or replacement (empty for `count`), `off` the
/// offset in `function` (decimal): stable across boots, where the site's address is not.
fn splice_labels(s: &SpliceRow) -> [(&str, String); 6] {
    let kind = s.action.split_whitespace().next().unwrap_or_default();
    [
        ("point", s.at.clone()),
        ("function", s.function.clone()),
        ("off", s.offset.to_string()),
        ("mechanism", s.mechanism.clone()),
        ("action", kind.to_string()),
        ("handler", s.symbol.clone().unwrap_or_default()),
    ]
}

#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// A histogram's samples: a cumulative `_bucket` per log2 bucket of nanoseconds up to the
    /// last one used (`le`: the bucket's largest value, in seconds) and `+Inf`, `_sum`, `_count`.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &trapvec::returns::Histogram) {
        let last = h.buckets.iter().rposition(|&c| c > 0).unwrap_or(0);
        let mut cumulative = 0u64;
        let with = |le: &'_ str| -> Vec<(&str, String)> {
            let mut l: Vec<(&str, String)> =
                labels.iter().map(|(k, v)| (*k, v.to_string())).collect();
            l.push(("le", le.to_string()));
            l
        };
        // Bucket 64 holds 2^63 ns and up: only +Inf bounds it.
        for (k, &c) in h.buckets.iter().enumerate().take((last + 1).min(64)) {
            cumulative += c;
            let (_, end) = trapvec::returns::bucket_range(k);
            // Whole nanoseconds: the bucket's largest value is end - 1.
            let le = number((end - 1) as f64 / 1e9);
            self.sample(
                &format!("{name}_bucket"),
                &refs(&with(&le)),
                cumulative as f64,
            );
        }
        self.sample(
            &format!("{name}_bucket"),
            &refs(&with("+Inf")),
            h.count() as f64,
        );
        self.sample(&format!("{name}_sum"), labels, h.sum as f64 / 1e9);
        self.sample(&format!("{name}_count"), labels, h.count() as f64);
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape_label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", number(value));
    }
}

/// A sample value as the format writes it (Go's ParseFloat reads it back): integers without a
/// fraction, `NaN`, `+Inf`, `-Inf`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Rust's shortest round-trip form: `5`, `0.25`, `1e-7`; all valid for the format.
        format!("{v}")
    }
}

/// A label value: `\` → `\\`, `"` → `\"`, newline → `\n`.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A `# HELP` text: `\` → `\\`, newline → `\n`.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use instr_manager::ops::ComponentRow;
    use prometheus_parse::{Sample, Scrape, Value};

    fn row(
        id: u64,
        at: &str,
        mechanism: &str,
        action: &str,
        symbol: Option<&str>,
        hits: u64,
        missed: u64,
    ) -> SpliceRow {
        SpliceRow {
            id,
            at: at.into(),
            site: format!("{:#x}", 0xffff_ffff_8100_0000_u64 + id * 0x10),
            function: at.split('+').next().unwrap().into(),
            offset: 5,
            mechanism: mechanism.into(),
            action: action.into(),
            symbol: symbol.map(str::to_string),
            displaced: "push rbp; mov rbp, rsp".into(),
            hits,
            missed,
            in_profile: None,
            returns: None,
            by: None,
            keys: None,
            owner: None,
            orphaned: false,
            component: None,
        }
    }

    fn listing() -> Listing {
        Listing {
            splices: vec![
                row(
                    1,
                    "tcp_sync_mss",
                    "trap",
                    "replace by mss_clamp_tcp_sync_mss",
                    Some("mss_clamp_tcp_sync_mss"),
                    948,
                    0,
                ),
                row(
                    2,
                    "tcp_v4_rcv+0x1f",
                    "jmp",
                    "call h (cookie 0x7)",
                    Some("h"),
                    12,
                    3,
                ),
                row(3, "do_sys_openat2", "trap", "count", None, 0, 0),
            ],
            components: vec![ComponentRow {
                id: 0,
                name: "mss_clamp".into(),
                path: Some("/components/mss_clamp.o".into()),
                crc32: "0x12345678".into(),
                code: "0xffffffffc0000000".into(),
                code_len: 64,
                data: "0xffffffffc0001000".into(),
                data_len: 8,
                imports: 1,
                refs: 1,
            }],
            retiring: vec![row(4, "gone", "trap", "count", None, 0, 0)],
        }
    }

    fn stats() -> DaemonStats {
        let mut d = DaemonStats {
            profile: Some("lossy".into()),
            profiles: vec!["clean".into(), "lossy".into()],
            switches: 4,
            uptime_s: 77,
            unrecorded: 0,
            metrics: BTreeMap::from([
                ("retrans".to_string(), 15.384_615),
                ("rate".to_string(), 0.0),
            ]),
            requests: BTreeMap::new(),
        };
        d.requests.insert(
            "list".into(),
            RequestCount {
                total: 10,
                errors: 0,
            },
        );
        d.requests.insert(
            "activate".into(),
            RequestCount {
                total: 3,
                errors: 1,
            },
        );
        d.requests.insert(
            "invalid".into(),
            RequestCount {
                total: 7,
                errors: 7,
            },
        );
        d
    }

    /// Parse with prometheus-parse, and check that it understood every sample line (it skips
    /// what it cannot read instead of failing).
    fn parse(text: &str) -> Scrape {
        let lines: Vec<std::io::Result<String>> = text.lines().map(|l| Ok(l.to_string())).collect();
        let scrape =
            Scrape::parse(lines.into_iter()).expect("prometheus-parse reads the exposition");
        let sample_lines = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        assert_eq!(
            scrape.samples.len(),
            sample_lines,
            "every sample line parsed:\n{text}"
        );
        scrape
    }

    fn value(s: &Sample) -> f64 {
        match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{}: not a scalar: {other:?}", s.metric),
        }
    }

    fn find<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> &'a Sample {
        let found: Vec<&Sample> = scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            })
            .collect();
        assert_eq!(found.len(), 1, "{metric}{labels:?}: {found:?}");
        found[0]
    }

    #[test]
    fn a_timer_renders_as_a_prometheus_histogram_in_seconds() {
        let mut l = listing();
        let mut h = trapvec::returns::Histogram::default();
        // 1 us and 3 us: buckets 10 (512..1023 ns) and 12 (2048..4095 ns).
        for ns in [1000u64, 3000, 3000] {
            h.buckets[trapvec::returns::bucket_of(ns)] += 1;
            h.sum += ns;
        }
        l.splices[2].action = "time (wall clock)".into();
        l.splices[2].returns = Some(trapvec::returns::ReturnStats {
            returns: 3,
            missed: 0,
            active: 0,
            histogram: Some(h),
        });
        let text = render(&l, None);
        assert!(
            text.contains("# TYPE trapvec_timer_seconds histogram\n"),
            "{text}"
        );
        let labels = "point=\"do_sys_openat2\",function=\"do_sys_openat2\",off=\"5\",mechanism=\"trap\",action=\"time\",handler=\"\"";
        for (le, n) in [
            ("0.000001023", 1),
            ("0.000002047", 1),
            ("0.000004095", 3),
            ("+Inf", 3),
        ] {
            let line = format!("trapvec_timer_seconds_bucket{{{labels},le=\"{le}\"}} {n}\n");
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        assert!(
            !text.contains("le=\"0.000008191\""),
            "no bucket past the last used: {text}"
        );
        assert!(
            text.contains(&format!("trapvec_timer_seconds_sum{{{labels}}} 0.000007\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("trapvec_timer_seconds_count{{{labels}}} 3\n")),
            "{text}"
        );
        // One histogram sample to a Prometheus parser (`parse` above counts one per line).
        let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
        let hist = find(
            &scrape,
            "trapvec_timer_seconds",
            &[("point", "do_sys_openat2")],
        );
        assert!(matches!(hist.value, Value::Histogram(_)), "{hist:?}");
    }

    #[test]
    fn a_keyed_count_renders_its_top_keys_the_rest_and_the_overflow() {
        let mut l = listing();
        let keys: Vec<trapvec::keyed::KeyCount> = (0..TOP_KEYS + 5)
            .map(|i| trapvec::keyed::KeyCount {
                key: format!("task{i}"),
                count: 100 - i as u64,
            })
            .collect();
        l.splices[2].by = Some(trapvec::keyed::KeyBy::Comm);
        l.splices[2].keys = Some(trapvec::keyed::KeyCounts { keys, overflow: 7 });
        let scrape = parse(&render(&l, None));
        let key = |k: &str| {
            value(find(
                &scrape,
                "trapvec_splice_key_hits_total",
                &[
                    ("function", "do_sys_openat2"),
                    ("off", "5"),
                    ("by", "comm"),
                    ("key", k),
                ],
            ))
        };
        assert_eq!(key("task0"), 100.0);
        assert_eq!(
            key(&format!("task{}", TOP_KEYS - 1)),
            (100 - TOP_KEYS + 1) as f64
        );
        // The 5 keys past the top: 100-20 .. 100-24.
        assert_eq!(key("(other)"), (76..=80).sum::<u64>() as f64);
        assert_eq!(key("(overflow)"), 7.0);
        let series = scrape
            .samples
            .iter()
            .filter(|s| s.metric == "trapvec_splice_key_hits_total")
            .count();
        assert_eq!(series, TOP_KEYS + 2, "bounded");
    }

    #[test]
    fn splices_render_as_counters_with_point_mechanism_and_action_labels() {
        let scrape = parse(&render(&listing(), None));
        let hits = find(
            &scrape,
            "trapvec_splice_hits_total",
            &[("point", "tcp_sync_mss")],
        );
        assert!(matches!(hits.value, Value::Counter(_)), "{hits:?}");
        assert_eq!(value(hits), 948.0);
        assert_eq!(hits.labels.get("mechanism"), Some("trap"));
        assert_eq!(hits.labels.get("action"), Some("replace"));
        assert_eq!(hits.labels.get("handler"), Some("mss_clamp_tcp_sync_mss"));
        assert_eq!(hits.labels.get("function"), Some("tcp_sync_mss"));
        assert_eq!(hits.labels.get("off"), Some("5"));
        assert_eq!(
            hits.labels.get("site"),
            None,
            "no address: it moves at every boot"
        );
        let call = find(
            &scrape,
            "trapvec_splice_missed_total",
            &[("point", "tcp_v4_rcv+0x1f")],
        );
        assert_eq!(value(call), 3.0);
        assert_eq!(call.labels.get("mechanism"), Some("jmp"));
        assert_eq!(call.labels.get("action"), Some("call"));
        let count = find(
            &scrape,
            "trapvec_splice_hits_total",
            &[("point", "do_sys_openat2")],
        );
        assert_eq!(
            (
                value(count),
                count.labels.get("action"),
                count.labels.get("handler")
            ),
            (0.0, Some("count"), Some(""))
        );
        assert_eq!(value(find(&scrape, "trapvec_splices", &[])), 3.0);
        assert_eq!(value(find(&scrape, "trapvec_splices_retiring", &[])), 1.0);
        assert_eq!(value(find(&scrape, "trapvec_components", &[])), 1.0);
        // Without a daemon there is nothing of trapd's.
        assert!(scrape
            .samples
            .iter()
            .all(|s| s.metric.starts_with("trapvec_")));
        assert_eq!(
            scrape.docs["trapvec_splice_hits_total"],
            "Traps taken at a live splice (handler run, or counted)."
        );
    }

    #[test]
    fn daemon_stats_render_the_profile_switches_metrics_and_requests() {
        let scrape = parse(&render(&listing(), Some(&stats())));
        assert_eq!(
            value(find(
                &scrape,
                "trapd_profile_active",
                &[("profile", "lossy")]
            )),
            1.0
        );
        assert_eq!(
            value(find(
                &scrape,
                "trapd_profile_active",
                &[("profile", "clean")]
            )),
            0.0
        );
        let switches = find(&scrape, "trapd_profile_switches_total", &[]);
        assert!(
            matches!(switches.value, Value::Counter(4.0)),
            "{switches:?}"
        );
        assert_eq!(
            value(find(
                &scrape,
                "trapd_metric_value",
                &[("metric", "retrans")]
            )),
            15.384_615
        );
        assert_eq!(
            value(find(&scrape, "trapd_metric_value", &[("metric", "rate")])),
            0.0
        );
        assert_eq!(
            value(find(&scrape, "trapd_requests_total", &[("op", "activate")])),
            3.0
        );
        assert_eq!(
            value(find(
                &scrape,
                "trapd_request_errors_total",
                &[("op", "activate")]
            )),
            1.0
        );
        assert_eq!(
            value(find(
                &scrape,
                "trapd_request_errors_total",
                &[("op", "invalid")]
            )),
            7.0
        );
        assert_eq!(value(find(&scrape, "trapd_uptime_seconds", &[])), 77.0);
        assert_eq!(
            value(find(&scrape, "trapd_unrecorded_dispatch_entries", &[])),
            0.0
        );
    }

    #[test]
    fn no_active_profile_leaves_every_profile_at_zero_and_a_dropped_one_is_still_shown() {
        let mut d = stats();
        d.profile = None;
        let scrape = parse(&render(&Listing::default(), Some(&d)));
        let active: Vec<f64> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == "trapd_profile_active")
            .map(value)
            .collect();
        assert_eq!(active, vec![0.0, 0.0]);
        d.profile = Some("removed".into());
        let scrape = parse(&render(&Listing::default(), Some(&d)));
        assert_eq!(
            value(find(
                &scrape,
                "trapd_profile_active",
                &[("profile", "removed")]
            )),
            1.0
        );
    }

    #[test]
    fn label_values_and_help_are_escaped_as_the_format_says() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        assert_eq!(escape_help("x\\y\nz \"q\""), "x\\\\y\\nz \"q\"");
        let mut l = Listing::default();
        l.splices
            .push(row(9, "we\"ird\\pt", "trap", "count", None, 1, 0));
        let text = render(&l, None);
        assert!(text.contains(r#"point="we\"ird\\pt""#), "{text}");
    }

    #[test]
    fn values_are_written_as_go_parses_them() {
        assert_eq!(number(5.0), "5");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(1e-7).parse::<f64>().unwrap(), 1e-7);
        assert_eq!(number(18_446_744_073_709_551_615.0), "18446744073709552000");
    }

    /// promtool (the Prometheus project's own parser and linter) accepts the whole exposition.
    /// Skipped with a reason when promtool is not installed, failed under CI=true.
    #[test]
    fn promtool_checks_the_exposition_clean() {
        let text = render(&listing(), Some(&stats()));
        let Some(out) = promtool_check(&text) else {
            return;
        };
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "lint findings: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A value that promtool must refuse, to show the check above can fail.
    #[test]
    fn promtool_refuses_a_broken_exposition() {
        let Some(out) = promtool_check("# TYPE x counter\nx{a=\"unterminated} 1\n") else {
            return;
        };
        assert!(!out.status.success(), "promtool accepted a broken line");
    }

    fn promtool_check(text: &str) -> Option<std::process::Output> {
        use std::io::Write;
        let child = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                assert!(std::env::var("CI").as_deref() != Ok("true"), "promtool (Debian package prometheus, .ci/install-deps) is missing under CI: {e}");
                eprintln!("skipping: promtool not found ({e}); apt-get install prometheus");
                return None;
            }
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        Some(child.wait_with_output().unwrap())
    }
}
