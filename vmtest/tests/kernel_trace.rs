//! `trapctl trace` in the kernel (`vmtest/scenarios/kernel_trace.sh`, issue 29), in one boot:
//! eighteen one-liners compiled for the kernel, each with the result the scenario
//! knows in advance (calls a helper makes, offsets it seeks to, a file it opens), three of them
//! against a kprobe event in the same guest; each way a trace ends (COMMAND, --seconds,
//! SIGTERM) prints the maps; afterwards no splice and no component is left and the traced
//! function's bytes are back.

use serde_json::Value;
use vmtest::testing::{can_boot, Run, Scenario};

/// A KEY line: COMMAND's output (if any), then the `--json` report; the report.
fn report(run: &Run, key: &str) -> (String, Value) {
    let line = run.expect(key);
    let at = line
        .find('{')
        .unwrap_or_else(|| panic!("{key} has no JSON report: {line}"));
    let json = serde_json::from_str(&line[at..])
        .unwrap_or_else(|e| panic!("{key} is not JSON: {e}: {line}"));
    (line[..at].to_string(), json)
}

/// The map named `name` of a report.
fn map<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["maps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no map @{name} in {r}"))
}

/// The value of the entry of map `name` whose key is `key`.
fn entry(r: &Value, name: &str, key: &Value) -> Value {
    map(r, name)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == *key)
        .map(|e| e["value"].clone())
        .unwrap_or_else(|| panic!("@{name} has no key {key}: {r}"))
}

/// `CALLS=n` of a ppidloop's output (which also says every answer was right).
fn calls(out: &str, what: &str) -> u64 {
    assert!(out.contains("WRONG=0"), "{what}: {out}");
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("CALLS="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no CALLS= in `{out}`"))
}

#[test]
fn kernel_one_liners_give_their_exact_results_and_leave_nothing() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("kernel_trace.sh")
        .timeout(600)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert_eq!(run.expect("TRACE"), "done");
    let no_reads_failed = |r: &Value, what: &str| {
        assert_eq!(r["failed_reads"], serde_json::json!([]), "{what}: {r}");
    };

    // COUNT (ended by its COMMAND): getppid_a's row is its calls, as the kprobe event counts.
    assert_eq!(run.expect("COUNT_RC"), "0");
    let (out, r) = report(&run, "COUNT");
    let n = calls(&out, "COUNT");
    assert_eq!(n, 3001, "-n 3000 and one call to learn the answer");
    assert_eq!(entry(&r, "", &serde_json::json!(["getppid_a"])), n);
    assert_eq!(r["exit"], 0);
    let oracle = run.expect("ORACLE_COUNT");
    assert_eq!(
        oracle.split_whitespace().next(),
        Some(n.to_string().as_str()),
        "the kprobe event counted as many: {oracle}"
    );

    // SUM and HIST: lseek's offsets read from the wrapper's pt_regs; the kprobe's sum agrees.
    assert_eq!(run.expect("SUM_RC"), "0");
    let (_, r) = report(&run, "SUM");
    let sum = 3 + 4 * 5 + 2 * 100;
    assert_eq!(entry(&r, "s", &serde_json::json!([])), sum);
    assert_eq!(
        run.expect("ORACLE_SUM"),
        format!("9 {sum}"),
        "the kprobe event saw 9 calls and the same sum"
    );
    let hist = entry(&r, "h", &serde_json::json!([]));
    let buckets: Vec<(i64, u64)> = hist
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["count"].as_u64() != Some(0))
        .map(|b| (b["lo"].as_i64().unwrap(), b["count"].as_u64().unwrap()))
        .collect();
    assert_eq!(buckets, [(1, 3), (4, 4), (64, 2)], "{hist}");
    no_reads_failed(&r, "SUM");

    // RET: the return value at the return point.
    assert_eq!(run.expect("RET_RC"), "0");
    let (_, r) = report(&run, "RET");
    assert_eq!(entry(&r, "r", &serde_json::json!([100])), 10);
    assert_eq!(map(&r, "r")["entries"].as_array().unwrap().len(), 1, "{r}");

    // STR: the name cat opened, read from user memory.
    assert_eq!(run.expect("STR_RC"), "0");
    let (out, r) = report(&run, "STR");
    assert_eq!(out, "hello");
    assert_eq!(entry(&r, "", &serde_json::json!(["/tmp/tv_trace_file"])), 1);
    no_reads_failed(&r, "STR");

    // USTR: the name read from cat's memory (a user pointer) at do_sys_openat2.
    assert_eq!(run.expect("USTR_RC"), "0");
    let (out, r) = report(&run, "USTR");
    assert_eq!(out, "hello");
    assert_eq!(entry(&r, "", &serde_json::json!(["/tmp/tv_trace_file"])), 1);
    no_reads_failed(&r, "USTR");

    // UFAULT: the reads that failed are the ones the kernel's own (kprobe) read faulted at, and
    // there was one (a page not faulted in); a failed read is the empty string, counted.
    assert_eq!(run.expect("UFAULT_RC"), "0");
    let (_, r) = report(&run, "UFAULT");
    let oracle = run.expect("ORACLE_UFAULT");
    let (faults, reads) = oracle.split_once(' ').expect("ORACLE_UFAULT=FAULTS READS");
    let faults: u64 = faults.parse().unwrap();
    let reads: u64 = reads.parse().unwrap();
    assert!(faults >= 1, "the kprobe faulted at least once: {oracle}");
    assert_eq!(
        r["failed_reads"],
        serde_json::json!([{"probe": "getname_flags", "count": faults}]),
        "the kprobe's faults: {oracle}"
    );
    let hits: u64 = map(&r, "")["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["value"].as_u64().unwrap())
        .sum();
    assert_eq!(hits, faults + reads, "every call counted once: {r}");
    assert_eq!(entry(&r, "", &serde_json::json!([""])), faults, "{r}");

    // CPU: each call counted on the CPU it ran on: the first run's 301 and the second's 200
    // (ppidloop's thread pinned to CPU 0) on CPU 0, the second's first call (taskset -c 1)
    // on CPU 1.
    assert_eq!(run.expect("CPU_RC"), "0");
    let (_, r) = report(&run, "CPU");
    let mut cpus: Vec<(u64, u64)> = map(&r, "")["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"][0].as_u64().unwrap(), e["value"].as_u64().unwrap()))
        .collect();
    cpus.sort();
    assert_eq!(cpus, [(0, 501), (1, 1)], "{r}");

    // GLOB: one handler per function, `func` naming it; getppid_a calls only getppid of them.
    assert_eq!(run.expect("GLOB_RC"), "0");
    let (out, r) = report(&run, "GLOB");
    let n = calls(&out, "GLOB");
    assert_eq!(entry(&r, "", &serde_json::json!(["__x64_sys_getppid"])), n);

    // BEGINEND: BEGIN's line before the probes are live, END's after the trace, then the map.
    assert_eq!(run.expect("BEGINEND_RC"), "0");
    let be = run.expect("BEGINEND");
    assert!(
        be.starts_with("hello 42|tracing 1 probe(s) while") && be.contains("|bye now|@calls: 201|"),
        "BEGIN first, then END and the map: {be}"
    );

    // FAILED: every read of address 8 failed and was counted at its probe.
    assert_eq!(run.expect("FAILED_RC"), "0");
    let (out, r) = report(&run, "FAILED");
    let n = calls(&out, "FAILED");
    assert_eq!(
        r["failed_reads"],
        serde_json::json!([{"probe": "__x64_sys_getppid", "count": n}])
    );
    assert_eq!(entry(&r, "bad", &serde_json::json!([])), 0);

    // SECONDS: ended by the time, status 0, the map printed.
    assert_eq!(run.expect("SECONDS_RC"), "0");
    assert_eq!(run.expect("SECONDS_LIVE"), "tracing 1 probe(s) for 1 s");
    let (_, r) = report(&run, "SECONDS");
    assert_eq!(map(&r, "c")["kind"], "count");

    // PID: only the process named by the predicate, its calls exactly; SIGTERM printed the
    // maps, then trapctl died by it.
    assert_eq!(run.expect("PID_RC"), "143", "128 + SIGTERM");
    let pa: u64 = run.expect("PID_PA").parse().unwrap();
    let n = calls(run.expect("PID_A"), "PID_A");
    let (_, r) = report(&run, "PID");
    let entries = map(&r, "")["entries"].as_array().unwrap().clone();
    assert_eq!(
        entries,
        [serde_json::json!({"key": ["getppid_a", pa], "value": n})],
        "getppid_b's calls are not counted: {r}"
    );

    // CHANGE: lseeks saw the changed return value at every call, and the right one after.
    assert_eq!(
        run.expect("CHANGE_RC"),
        "1",
        "lseeks exits 1 on wrong answers"
    );
    let (out, r) = report(&run, "CHANGE");
    assert_eq!(out, "calls=10 wrong=10");
    assert_eq!(entry(&r, "n", &serde_json::json!([])), 10);
    assert_eq!(r["exit"], 1);
    assert_eq!(run.expect("CHANGE_AFTER"), "calls=10 wrong=0");

    // ENTRYRET: both probes of ksys_lseek saw each of the ten calls, at offset 100.
    assert_eq!(run.expect("ENTRYRET_RC"), "0");
    let (out, r) = report(&run, "ENTRYRET");
    assert_eq!(out, "calls=10 wrong=0");
    assert_eq!(entry(&r, "e", &serde_json::json!([100])), 10, "{r}");
    assert_eq!(entry(&r, "r", &serde_json::json!([100])), 10, "{r}");

    // RETPRED: lseeks' ten calls were replaced (5, not 100), lseekb's ran the function.
    assert_eq!(run.expect("RETPRED_RC"), "0");
    let (_, r) = report(&run, "RETPRED");
    assert_eq!(entry(&r, "n", &serde_json::json!([])), 10, "{r}");
    assert_eq!(run.expect("RETPRED_A"), "calls=10 wrong=10");
    assert_eq!(run.expect("RETPRED_B"), "calls=10 wrong=0");
    assert_eq!(run.expect("RETPRED_AFTER"), "calls=10 wrong=0");

    // IF: each call took one branch: 4 at offset 100, 3 at offset 7, none at 0.
    assert_eq!(run.expect("IF_RC"), "0");
    let (_, r) = report(&run, "IF");
    assert_eq!(entry(&r, "big", &serde_json::json!([])), 4, "{r}");
    assert_eq!(entry(&r, "small", &serde_json::json!([])), 3, "{r}");
    let zero = r["maps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "zero");
    assert!(
        zero.is_none_or(|m| m["entries"].as_array().is_none_or(Vec::is_empty)),
        "{r}"
    );

    // PRINTF: one line per call, in order, between the announcement and lseeks' own line.
    assert_eq!(run.expect("PRINTF_RC"), "0");
    let printed = run.expect("PRINTF");
    let lines: Vec<&str> = printed
        .split('|')
        .filter(|l| l.starts_with("lseek "))
        .collect();
    assert_eq!(lines, ["lseek 7 -> 7"; 3], "{printed}");

    // EXIT: the first call counted, then exit(): lseeks killed, trapctl's status 0.
    assert_eq!(run.expect("EXIT_RC"), "0");
    let (out, r) = report(&run, "EXIT");
    assert!(!out.contains("calls="), "lseeks was killed: {out}");
    assert_eq!(entry(&r, "n", &serde_json::json!([])), 1, "{r}");

    // INTERVAL: the interval printed its line and ended the trace long before its 60 s.
    assert_eq!(run.expect("INTERVAL_RC"), "0");
    let secs: u64 = run.expect("INTERVAL_SECS").parse().unwrap();
    assert!(
        secs < 30,
        "exit() in the interval ended the trace: {secs} s"
    );
    let (_, r) = report(&run, "INTERVAL");
    assert_eq!(r["printed"], serde_json::json!(["tick\n"]), "{r}");
    assert_eq!(r["exit"], 0);

    // Nothing left.
    assert_eq!(
        run.expect("LEFT"),
        r#"{"schema":1,"splices":[],"components":[]}"#
    );
    assert_eq!(run.expect("BYTES"), "same");
}
