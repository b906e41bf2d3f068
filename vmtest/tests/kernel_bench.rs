//! The kernel benchmark (`vmtest/scenarios/bench.sh`) runs and prints its figures. Timing under
//! QEMU TCG is emulated and noisy, so nothing here asserts a speed: only that every figure is
//! there and is a positive number (the figures themselves are in the test's output).

use vmtest::testing::{can_boot, Scenario};

#[test]
fn kernel_benchmark_prints_hit_costs_and_batch_times() {
    if !can_boot("kernel scenario") {
        return;
    }
    let run = Scenario::named("bench.sh")
        .timeout(1200)
        .run(env!("CARGO_BIN_EXE_vmtest"));
    run.assert_passed();
    for key in [
        "BENCH_BASE_NS",
        "BENCH_TRAP_COUNT_NS",
        "BENCH_TRAP_EMPTY_NS",
        "BENCH_JMP_EMPTY_NS",
        "BENCH_KPROBE_NS",
        "BENCH_TRAP_SKIP_NS",
        "BENCH_JMP_SKIP_NS",
        "BENCH_RET_BASE_NS",
        "BENCH_RET_COUNT_NS",
        "BENCH_RET_TIME_NS",
        "BENCH_KRETPROBE_NS",
    ] {
        assert!(run.number(key) > 0, "{key}");
    }
    assert_eq!(run.number("BENCH_BATCH_POINTS"), 1000);
    for line in [
        "BENCH_HIT_NS",
        "BENCH_SKIP_HIT_NS",
        "BENCH_RET_HIT_NS",
        "BENCH_BATCH_TRAPVEC_MS",
        "BENCH_BATCH_KPROBES_MS",
    ] {
        assert!(
            run.stdout.lines().any(|l| l.starts_with(line)),
            "{line} printed"
        );
    }
    for key in [
        "BENCH_RATIO_TRAP_TO_KPROBE",
        "BENCH_RATIO_RET_COUNT_TO_KRETPROBE",
        "BENCH_RATIO_RET_TIME_TO_KRETPROBE",
        "BENCH_RATIO_KPROBES_ENABLE_TO_BATCH_COMMIT",
    ] {
        let ratio: f64 = run
            .expect(key)
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{key}={ratio}");
    }
}
