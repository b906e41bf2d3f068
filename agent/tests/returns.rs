//! Return points and timers from a spec, in a real program under the agent (`fixtures/returns.cc`,
//! built with g++ at test time): recursion counted exactly, calls left by `longjmp` and by
//! exceptions counted missed, a component's declared return point (`TRAPVEC_SPLICE_RETURN`)
//! seeing every return value with its argument, a timer's histogram in the stats; the program's
//! output is the unspliced one but for what the handler adds.

use std::path::Path;

mod common;
use common::{cc, gxx, repo, Program, Run};

/// The program, and the component that declares pick's return point beside it.
fn fixture() -> Program {
    let p = gxx("returns", &["returns.cc"]);
    let inc = repo().join("components/include");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pick_return.c");
    let obj = p.dir.join("pick_return.o");
    cc(&[
        "-c",
        "-O2",
        "-fPIC",
        "-I",
        inc.to_str().unwrap(),
        "-o",
        obj.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    p
}

fn run(f: &Program, spec: Option<&str>) -> Run {
    f.run(spec, &["20"])
}

/// Calls of fib(n) made by fib(n) itself included.
fn fib_calls(n: u64) -> u64 {
    if n < 2 {
        1
    } else {
        1 + fib_calls(n - 1) + fib_calls(n - 2)
    }
}

#[test]
fn return_points_and_a_timer_from_a_spec_report_exact_returns_missed_calls_and_a_histogram() {
    let f = fixture();
    let plain = run(&f, None);
    assert!(plain.out.status.success(), "{}", plain.stderr());
    let text = plain.stdout();
    let sum: i64 = text.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(text, format!("fib 6765 sum {sum} jumps 5 caught 4\n"));
    for mech in ["trap", "jmp"] {
        let spec = format!(
            r#"
[[component]]
path = "pick_return.o"

[[splice]]
at = "fib"
action = "count"
when = "return"
maxactive = 64
mechanism = "{mech}"

[[splice]]
at = "jumper"
action = "count"
when = "return"
mechanism = "{mech}"

[[splice]]
at = "thrower"
action = "count"
when = "return"
mechanism = "{mech}"

[[splice]]
at = "nap"
action = "time"
mechanism = "{mech}"

[[splice]]
at = "usleep"
action = "count"
by = "tid"
mechanism = "{mech}"
"#
        );
        let r = run(&f, Some(&spec));
        assert!(
            r.out.status.success(),
            "{mech}: {:?} {}",
            r.out.status,
            r.stderr()
        );
        // pick's declared return handler added 1000 to each of its 20 return values, having
        // found each equal to what pick computes from the argument the entry kept.
        assert_eq!(
            r.stdout(),
            format!("fib 6765 sum {} jumps 5 caught 4\n", sum + 20 * 1000),
            "{mech}"
        );
        let stats = r
            .stats
            .as_ref()
            .unwrap_or_else(|| panic!("no stats: {}", r.stderr()));
        let row = |at: &str| {
            stats["splices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["at"] == at)
                .unwrap_or_else(|| panic!("{at}: {stats}"))
                .clone()
        };
        let figures = |at: &str| {
            let s = row(at);
            assert_eq!(s["when"], "return", "{at}: {s}");
            [&s["hits"], &s["returns"], &s["missed"], &s["active"]].map(|v| v.as_u64().unwrap())
        };
        let n = fib_calls(20);
        assert_eq!(
            figures("fib"),
            [n, n, 0, 0],
            "{mech}: every call of the recursion returned through its stub"
        );
        // 4, 8, 12, 16 and 20 leave by longjmp; each left call is dropped (missed) at the next
        // entry of a return point from main's loops (its return address overwrites the left
        // call's): the next jumper call, and for the last one the first thrower call.
        assert_eq!(figures("jumper"), [20, 15, 5, 0], "{mech}");
        // 5, 10, 15 and 20 throw; likewise (the last one at the first nap call).
        assert_eq!(figures("thrower"), [20, 16, 4, 0], "{mech}");
        assert_eq!(
            figures("pick"),
            [20, 20, 0, 0],
            "{mech}: the declared return point"
        );
        // The program's one thread made every usleep call (from nap): one key, its tid, 5 hits.
        let keyed = row("usleep");
        assert_eq!(keyed["by"], "tid", "{mech}: {keyed}");
        assert_eq!(
            (keyed["hits"].as_u64(), keyed["overflow"].as_u64()),
            (Some(5), Some(0)),
            "{mech}: {keyed}"
        );
        let keys = keyed["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "{mech}: {keyed}");
        assert_eq!(
            (
                keys[0]["key"].as_str().map(str::parse::<u32>),
                keys[0]["count"].as_u64()
            ),
            (Some(Ok(r.pid.unwrap())), Some(5)),
            "{mech}: {keyed}"
        );
        let nap = row("nap");
        let h = &nap["histogram"];
        assert_eq!(
            (nap["returns"].as_u64(), h["count"].as_u64()),
            (Some(5), Some(5)),
            "{mech}: {nap}"
        );
        // Three 1 ms sleeps below the 20 ms ones' bucket [16M, 32M) ns, two from there on.
        let buckets = h["buckets"].as_array().unwrap();
        let count_in = |lo: u64, hi: u64| -> u64 {
            buckets
                .iter()
                .filter(|b| b["lo"].as_u64().unwrap() >= lo && b["hi"].as_u64().unwrap() <= hi)
                .map(|b| b["count"].as_u64().unwrap())
                .sum()
        };
        assert_eq!(count_in(1 << 19, 1 << 24), 3, "{mech}: {h}");
        assert_eq!(count_in(1 << 24, u64::MAX), 2, "{mech}: {h}");
        assert!(
            h["max_ns"].as_u64().unwrap() >= 20_000_000
                && h["p99_ns"].as_u64().unwrap() >= 20_000_000,
            "{mech}: {h}"
        );
    }
}
