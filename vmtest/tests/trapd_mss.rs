//! trapd against the real kernel in the VM (vmtest/scenarios/trapd_mss.sh): the retransmission
//! rate under `netem loss` switches to the `lossy` profile (mss_clamp replaces tcp_sync_mss, new
//! connections report the clamped MSS) and back to `clean` when the loss goes; after `kill -9`
//! while `lossy` is live the restarted daemon lists exactly the live splice and still switches;
//! `trapctl` commands while the daemon holds the module go through it (count, splice, set, get,
//! list, unsplice); a non-root client is refused; 10,000 malformed lines and requests cut off mid-line leave the
//! daemon serving and the kernel unchanged. Its Prometheus endpoint, scraped in the guest with
//! busybox wget, and `trapctl list --prometheus` parse (prometheus-parse here, and `promtool check
//! metrics` when installed) to the live splice's hits, the profile, the switches and the requests.
//! trapd runs with trapd.service's capability bounding set, and not without either capability.
//!
//! Without QEMU, the kernel or busybox the test says why and skips; with `CI=true` it fails.

use std::collections::BTreeMap;
use std::process::Command;

use prometheus_parse::{Scrape, Value};

use vmtest::testing::{build_trapd, can_boot, can_boot_kernel, Scenario};

/// xorshift64: the same lines on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }
}

/// Requests that are whole JSON but wrong: each must be refused without changing anything.
const WRONG: &[&str] = &[
    r#"{"op":"activate","profile":"nope"}"#,
    r#"{"op":"unsplice","at":"tcp_v4_rcv"}"#,
    r#"{"op":"unsplice","at":"no_such_function"}"#,
    r#"{"op":"load","path":"/nonexistent.o"}"#,
    r#"{"op":"unload","name":"nope"}"#,
    r#"{"op":"set","symbol":"nope","value":1}"#,
    r#"{"op":"set","symbol":"mss_clamp_mtu","value":1,"size":3}"#,
    r#"{"op":"get","symbol":"nope"}"#,
    r#"{"op":"splice","at":"tcp_sync_mss","action":"replace","handler":"no_such_handler"}"#,
    r#"{"op":"splice","at":"tcp_sync_mss","action":"jump"}"#,
    r#"{"op":"apply","spec":"/nonexistent.toml"}"#,
    r#"{"op":"frobnicate"}"#,
    r#"{"op":42}"#,
    r#"{"profile":"lossy"}"#,
    r#"{"op":"activate","profile":7}"#,
    r#"[{"op":"list"}]"#,
    "null",
    "42",
    r#""op""#,
];

/// Whole requests that would change the kernel: only ever sent cut short.
const CHANGING: &[&str] = &[
    r#"{"op":"activate","profile":"lossy"}"#,
    r#"{"op":"load","path":"/components/mss_clamp.o"}"#,
    r#"{"op":"splice","at":"tcp_sync_mss","action":"count"}"#,
    r#"{"op":"set","symbol":"mss_clamp_mtu","value":500,"size":4}"#,
];

/// 10,000 lines: random bytes, cut-off requests, wrong requests and a few reads. Returns the
/// text and how many lines are reads (each answered `"ok":true`).
fn fuzz_lines() -> (Vec<u8>, usize) {
    let mut rng = Rng(0x7472_6170_6421_u64);
    let mut out = Vec::new();
    let mut reads = 0;
    for _ in 0..10_000 {
        match rng.below(4) {
            0 => {
                let len = rng.below(200);
                out.extend((0..len).map(|_| loop {
                    let b = u8::try_from(rng.next() & 0xff).unwrap();
                    if b != b'\n' {
                        break b;
                    }
                }));
            }
            1 => {
                let all: Vec<&str> = CHANGING.iter().chain(WRONG).copied().collect();
                let r = all[rng.below(all.len())].as_bytes();
                out.extend_from_slice(&r[..rng.below(r.len())]);
            }
            2 => out.extend_from_slice(WRONG[rng.below(WRONG.len())].as_bytes()),
            _ => {
                reads += 1;
                out.extend_from_slice(if rng.below(2) == 0 {
                    br#"{"op":"list"}"#
                } else {
                    br#"{"op":"status"}"#
                });
            }
        }
        out.push(b'\n');
    }
    (out, reads)
}

/// The exposition the scenario printed as `NAME|line` lines, checked against its `NAME_BYTES`.
fn exposition(run: &vmtest::testing::Run, name: &str) -> String {
    let prefix = format!("{name}|");
    let text: String = run
        .stdout
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix(&prefix))
        .flat_map(|l| [l, "\n"])
        .collect();
    assert_eq!(
        text.len().to_string(),
        run.expect(&format!("{name}_BYTES")).trim(),
        "{name} came through the console whole:\n{text}"
    );
    text
}

/// `text` parsed by prometheus-parse, every sample line understood, and accepted by promtool
/// (the Prometheus project's parser and linter) when it is installed (under CI it must be).
fn parse(name: &str, text: &str) -> Scrape {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    assert_eq!(
        scrape.samples.len(),
        sample_lines,
        "{name}: every sample line parsed:\n{text}"
    );
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success() && said.is_empty(),
                "{name}: promtool check metrics: {said}\n{text}"
            );
        }
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool (Debian package prometheus) is missing under CI: {e}"
            );
            eprintln!("{name}: promtool not found ({e}); checked with prometheus-parse only");
        }
    }
    scrape
}

/// Every value of `metric` whose labels include `labels`, by the whole label set (`k=v,...`,
/// sorted: the parser keeps labels in a HashMap).
fn values(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> BTreeMap<String, f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| {
            let v = match s.value {
                Value::Counter(v) | Value::Gauge(v) => v,
                ref other => panic!("{metric}: {other:?}"),
            };
            let sorted: BTreeMap<&String, &String> = s.labels.iter().collect();
            (
                sorted
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                v,
            )
        })
        .collect()
}

/// The one value of `metric` with `labels`.
fn one(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    let v = values(scrape, metric, labels);
    assert_eq!(v.len(), 1, "{metric}{labels:?}: {v:?}");
    v.into_values().next().unwrap()
}

#[test]
fn fuzz_lines_hold_no_whole_changing_request() {
    let (text, reads) = fuzz_lines();
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    assert_eq!(lines.len(), 10_001, "10,000 newline-terminated lines");
    for c in CHANGING {
        assert!(!lines.contains(&c.as_bytes()), "{c} is never sent whole");
    }
    assert!(reads > 2000 && reads < 3000, "{reads}");
}

#[test]
fn trapd_adapts_mss_to_loss_survives_kill_9_refuses_nobody_and_malformed_lines() {
    if !can_boot("VM test") {
        return;
    }
    trapd_mss(Scenario::named("trapd_mss.sh"));
}

/// The same on Debian 13's kernel (the clamp spliced at tcp_sync_mss+0x9).
#[test]
fn trapd_adapts_mss_to_loss_on_6_12_too() {
    if !can_boot_kernel("VM test on 6.12", "6.12") {
        return;
    }
    trapd_mss(Scenario::named("trapd_mss.sh").kernel("6.12"));
}

fn trapd_mss(scenario: Scenario) {
    let trapd = build_trapd();
    let dir = tempfile::tempdir().unwrap();
    let (fuzz, reads) = fuzz_lines();
    let fuzz_path = dir.path().join("trapd_fuzz.txt");
    std::fs::write(&fuzz_path, fuzz).unwrap();
    let run = scenario
        .timeout(900)
        .file(&trapd)
        .file(&fuzz_path)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert_eq!(run.expect("MSS_BEFORE"), "32741");
    assert_eq!(
        run.expect("MSS_LOSSY"),
        "948",
        "lossy: tcp_sync_mss clamps the path MTU to 1000"
    );
    assert_eq!(
        run.expect("MSS_CLEAN"),
        "32741",
        "clean: the kernel's own policy is back"
    );
    assert_eq!(
        run.expect("MSS_ORPHANED"),
        "948",
        "kill -9 leaves the splice live in the kernel"
    );
    assert_eq!(
        run.expect("RESTART_PROFILE"),
        "lossy",
        "the journal names the active profile"
    );
    assert_eq!(
        run.expect("LIVE_SPLICES").trim(),
        r#""at":"tcp_sync_mss""#,
        "exactly the live splice"
    );
    assert_eq!(
        run.expect("UNRECORDED"),
        r#""unrecorded":[]"#,
        "nothing live is unknown to the restarted daemon"
    );
    assert_eq!(run.expect("MSS_AFTER_RESTART"), "32741");
    // trapctl while trapd holds /dev/trapvec: each command goes through the daemon.
    let count = run.expect("TRAPCTL_COUNT");
    assert!(
        count.starts_with("tcp_sync_mss: 10 calls in 6 s"),
        "5 calls per loopback connection, 2 connections: {count}"
    );
    assert_eq!(run.expect("TRAPCTL_GET"), "1400");
    assert_eq!(
        run.expect("MSS_TRAPCTL"),
        "1348",
        "trapctl's splice and set, made by the daemon"
    );
    assert_eq!(
        run.expect("TRAPCTL_LIST_PROFILE"),
        "clean",
        "trapctl list is the daemon's listing"
    );
    assert_eq!(run.expect("TRAPCTL_LIST_SPLICES"), "1");
    assert_eq!(
        run.expect("IN_PROFILE"),
        r#""in_profile":false"#,
        "the daemon knows trapctl's splice is not the profile's"
    );
    assert!(
        run.expect("TRAPCTL_UNSPLICE")
            .starts_with("unspliced tcp_sync_mss at 0x"),
        "{}",
        run.expect("TRAPCTL_UNSPLICE")
    );
    assert_eq!(run.expect("MSS_AFTER_TRAPCTL"), "32741");
    assert_eq!(run.expect("NOBODY_STATUS"), "1");
    assert!(
        run.expect("NOBODY_REPLY").contains("permission denied"),
        "{}",
        run.expect("NOBODY_REPLY")
    );
    assert_eq!(run.expect("PROFILE_AFTER_NOBODY"), "clean");
    assert_eq!(
        run.expect("FUZZ_REPLIES").trim(),
        "10000",
        "one reply per line"
    );
    assert_eq!(
        run.expect("FUZZ_OK_REPLIES").trim(),
        reads.to_string(),
        "only the reads succeed"
    );
    assert_eq!(run.expect("FUZZ_KERNEL_UNCHANGED"), "yes");
    assert_eq!(run.expect("PROFILE_AFTER_FUZZ"), "clean");
    check_prometheus(&run, reads);
    // packaging/trapd.service's CapabilityBoundingSet=CAP_SYS_MODULE CAP_SYSLOG is enough, and
    // each of the two is needed: /proc/kallsyms hides addresses without CAP_SYSLOG, and every
    // /dev/trapvec ioctl checks CAP_SYS_MODULE.
    assert_eq!(
        run.expect("CAPS_SERVICE"),
        "up ok=2",
        "trapd serves a splice and an unsplice with the service's capabilities"
    );
    let no_syslog = run.expect("CAPS_NO_SYSLOG");
    assert!(
        no_syslog.starts_with("down: ") && no_syslog.contains("kallsyms"),
        "{no_syslog}"
    );
    let no_module = run.expect("CAPS_NO_SYS_MODULE");
    assert!(no_module.starts_with("down: "), "{no_module}");
    assert_eq!(run.expect("SCENARIO_DONE"), "yes");
}

/// The scrapes: while trapctl's `tcp_sync_mss` replacement is live (after the restart, so the
/// daemon's counters start there), `trapctl list --prometheus` right after it, and after the
/// 10,000 lines.
fn check_prometheus(run: &vmtest::testing::Run, reads: usize) {
    let spliced = parse("PROM_SPLICED", &exposition(run, "PROM_SPLICED"));
    let splice = [
        ("point", "tcp_sync_mss"),
        ("function", "tcp_sync_mss"),
        ("mechanism", "trap"),
        ("action", "replace"),
        ("handler", "mss_clamp_tcp_sync_mss"),
    ];
    let hits = one(&spliced, "trapvec_splice_hits_total", &splice);
    assert!(
        hits >= 5.0,
        "at least the 5 calls of the connection measured: {hits}"
    );
    assert_eq!(
        one(&spliced, "trapvec_splice_missed_total", &splice),
        0.0,
        "a replacement is never skipped"
    );
    assert_eq!(one(&spliced, "trapvec_splices", &[]), 1.0);
    assert_eq!(
        one(&spliced, "trapd_profile_active", &[("profile", "clean")]),
        1.0
    );
    assert_eq!(
        one(&spliced, "trapd_profile_active", &[("profile", "lossy")]),
        0.0
    );
    assert_eq!(
        one(&spliced, "trapd_profile_switches_total", &[]),
        1.0,
        "the restarted daemon's one switch: lossy -> clean"
    );
    // The metric has a value only for an interval in which segments were sent; a percentage
    // (between the rules' thresholds `clean` stays, so it may be anything below 5 and more).
    for (labels, v) in values(&spliced, "trapd_metric_value", &[]) {
        assert_eq!(labels, "metric=retrans");
        assert!((0.0..=100.0).contains(&v), "retrans {v} is a percentage");
    }
    assert_eq!(
        one(&spliced, "trapd_requests_total", &[("op", "splice")]),
        2.0,
        "trapctl count's, trapctl splice's"
    );
    assert_eq!(one(&spliced, "trapd_requests_total", &[("op", "set")]), 1.0);
    assert_eq!(
        values(&spliced, "trapd_request_errors_total", &[])
            .values()
            .sum::<f64>(),
        0.0,
        "no request failed yet"
    );

    // trapctl's textfile, a moment later: the same splice and no trapd family.
    let textfile = parse("PROM_TEXTFILE", &exposition(run, "PROM_TEXTFILE"));
    assert!(
        one(&textfile, "trapvec_splice_hits_total", &splice) >= hits,
        "counters only grow"
    );
    assert!(
        textfile
            .samples
            .iter()
            .all(|s| s.metric.starts_with("trapvec_")),
        "the textfile has only trapvec_* families"
    );
    let site = |s: &Scrape| {
        values(s, "trapvec_splice_hits_total", &splice)
            .into_keys()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        site(&textfile),
        site(&spliced),
        "the same labels (site included) from both renderers"
    );

    // After the 10,000 lines: each was answered and counted; only the reads succeeded.
    let after = parse("PROM_AFTER_FUZZ", &exposition(run, "PROM_AFTER_FUZZ"));
    let total: f64 = values(&after, "trapd_requests_total", &[]).values().sum();
    assert!(total >= 10_000.0, "{total}");
    let errors = values(&after, "trapd_request_errors_total", &[]);
    assert_eq!(
        one(&after, "trapd_request_errors_total", &[("op", "denied")]),
        1.0,
        "su nobody"
    );
    let wrong: f64 = errors
        .iter()
        .filter(|(k, _)| k.as_str() != "op=denied")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        wrong,
        (10_000 - reads) as f64,
        "every fuzz line that is not a read is an error, nothing else failed: {errors:?}"
    );
    assert!(one(&after, "trapd_request_errors_total", &[("op", "invalid")]) > 0.0);
    assert_eq!(one(&after, "trapvec_splices", &[]), 0.0);
}
