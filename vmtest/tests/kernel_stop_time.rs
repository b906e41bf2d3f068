//! How long the module's stop_machine() holds every CPU (`vmtest/scenarios/kernel_stop_time.sh`,
//! issue 26, item 3). Count splices by trap in batches of 1, 100 and 1,000 functions, applied and
//! removed; the module's `stop_stats` parameter is read after every step. Asserted: each apply
//! and each removal is one batch of one or two stops (FINISH, after ARM when a window spans
//! several instructions) and the stop count grows by exactly that, every CPU was held some time
//! (held > 0), totals are at least the maxima, and a call of stop_machine() takes at least as
//! long as it holds the CPUs (for the same stop, per batch, and in total). The held time per
//! batch at 1, 100 and 1,000 sites is printed for the notes. A module without `stop_stats`
//! prints no figures and fails here.

use std::collections::HashMap;

use vmtest::testing::{can_boot, Run, Scenario};

/// The batch sizes of the scenario, in its order.
const SIZES: [u64; 3] = [1, 100, 1000];

/// The figures of `STOP_STATS_<step>=key=value ...`.
fn stats(run: &Run, step: &str) -> HashMap<String, u64> {
    run.pairs(&format!("STOP_STATS_{step}"))
}

fn get(s: &HashMap<String, u64>, step: &str, key: &str) -> u64 {
    *s.get(key)
        .unwrap_or_else(|| panic!("STOP_STATS_{step} has no {key}"))
}

/// Checks one batch (apply or removal) that took the stats from `before` to `step`'s.
fn check_batch(run: &Run, before: &HashMap<String, u64>, step: &str) -> u64 {
    let s = stats(run, step);
    let stops = get(&s, step, "stops") - get(before, step, "stops");
    let batch = get(&s, step, "last_batch_stops");
    assert!(
        (1..=2).contains(&batch),
        "{step}: a batch is FINISH, or ARM and FINISH ({batch} stops)"
    );
    assert_eq!(
        stops, batch,
        "{step}: the stop count grew by the batch's stops"
    );
    let held = get(&s, step, "last_batch_held_ns");
    let call = get(&s, step, "last_batch_call_ns");
    assert!(held > 0, "{step}: every CPU was held some time");
    assert!(
        call >= held,
        "{step}: the batch's calls ({call} ns) held ({held} ns)"
    );
    assert!(
        get(&s, step, "last_call_ns") >= get(&s, step, "last_held_ns"),
        "{step}: the last stop's call is at least its hold"
    );
    let (held_max, held_total) = (get(&s, step, "held_max_ns"), get(&s, step, "held_total_ns"));
    let (call_max, call_total) = (get(&s, step, "call_max_ns"), get(&s, step, "call_total_ns"));
    assert!(held_max > 0, "{step}: held_max_ns > 0");
    assert!(
        held_total >= held_max,
        "{step}: held_total_ns >= held_max_ns"
    );
    assert!(
        call_total >= call_max,
        "{step}: call_total_ns >= call_max_ns"
    );
    assert!(call_max >= held_max, "{step}: call_max_ns >= held_max_ns");
    assert!(
        call_total >= held_total,
        "{step}: call_total_ns >= held_total_ns"
    );
    assert_eq!(
        held_total - get(before, step, "held_total_ns"),
        held,
        "{step}: the batch's hold is what the total grew by"
    );
    println!(
        "stop_time {step}: {batch} stops, every CPU held {held} ns in all (max so far {held_max} ns), stop_machine() calls {call} ns"
    );
    held
}

#[test]
fn stop_machine_hold_is_measured_per_stop_and_batch() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("kernel_stop_time.sh")
        .timeout(300)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    assert!(
        run.stdout.contains("STOP_DONE"),
        "the scenario ran to its end"
    );
    let start = stats(&run, "start");
    assert_eq!(
        get(&start, "start", "stops"),
        0,
        "no stop before any splice"
    );
    let mut before = start;
    let mut figures = Vec::new();
    for n in SIZES {
        assert_eq!(run.number(&format!("STOP_LIVE_{n}")), n, "{n} splices live");
        let apply = format!("apply_{n}");
        let held_apply = check_batch(&run, &before, &apply);
        let revert = format!("revert_{n}");
        let held_revert = check_batch(&run, &stats(&run, &apply), &revert);
        figures.push(format!(
            "{n} sites: held {held_apply} ns (apply), {held_revert} ns (removal)"
        ));
        before = stats(&run, &revert);
    }
    assert_eq!(run.number("STOP_LEFT"), 0, "nothing left live");
    println!("STOP_TIME_FIGURES: {}", figures.join("; "));
}
