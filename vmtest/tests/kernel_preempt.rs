//! Full preemption (`vmtest/scenarios/kernel_preempt.sh`): the guest runs with
//! `preempt=full` (at boot, or switched at run time through `/sys/kernel/debug/sched/preempt`)
//! under QEMU's `-singlestep` (one guest instruction per translation block, so an interrupt and
//! a preemption can land between `push rbx` and the call after it), both CPUs call getppid() in
//! a loop, and trap and jmp splices at `__x64_sys_getppid+5` (windows over two instructions)
//! are applied and removed again and again. The module writes them int3-first; vmtest fails the
//! run on any oops, BUG or WARNING.
//!
//! Counts: an ftrace-based kprobe at the function's entry counts every getppid() the kernel ran,
//! which must be exactly the calls the helper made (no call lost or run twice while windows
//! change under it), every answer must be right, and live splices of each mechanism count
//! exactly the calls made while they live.
//!
//! Cycles: [`CI_CYCLES`] by default (what fits in the CI budget under `-singlestep`);
//! `TRAPVEC_PREEMPT_CYCLES=2000 cargo test --release -p vmtest --test kernel_preempt` runs the
//! long one (README.md, "Kernel scenarios and benchmark", has its figures).

use vmtest::testing::{can_boot, Run, Scenario};

/// Cycles of the boot-time test in CI; the run-time switch test makes a quarter of them.
/// Under `-singlestep` a cycle takes about a second and every trapctl command about a minute
/// (it reads /proc/kallsyms), so this is what fits beside the boots.
const CI_CYCLES: u64 = 100;

fn cycles() -> u64 {
    match std::env::var("TRAPVEC_PREEMPT_CYCLES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("TRAPVEC_PREEMPT_CYCLES={v} is not a number")),
        Err(_) => CI_CYCLES,
    }
}

/// Boot with `append` and `-singlestep`, the scenario making `cycles` cycles.
fn run(append: &str, cycles: u64) -> Run {
    // Generous: a loaded host slows -singlestep boots to minutes.
    let timeout = 2400 + cycles * 3;
    Scenario::named("kernel_preempt.sh")
        .append(&format!("{append} trapvec_preempt.cycles={cycles}"))
        .qemu_arg("-singlestep")
        .timeout(timeout)
        .run(env!("CARGO_BIN_EXE_vmtest"))
}

/// The first number after `key=` in the scenario's line `KEY=... key=N ...`.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}=N in {line:?}"))
}

/// The stress: no oops (vmtest), every call counted by the kernel, the bytes restored.
fn check_stress(run: &Run, cycles: u64) {
    run.assert_passed();
    assert_eq!(
        run.expect("PREEMPT_MODEL"),
        "full",
        "the kernel runs with full preemption"
    );
    assert_eq!(run.expect("INT3_FIRST"), "Y", "the protocol is on");

    assert_eq!(run.number("CYCLES_DONE"), cycles);
    assert_eq!(
        run.expect("LOOP_OK"),
        "yes",
        "every getppid() answered the parent's pid"
    );
    let loop_line = run.expect("LOOP_CALLS");
    let calls = loop_line
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .expect("LOOP_CALLS=N");
    assert_eq!(field(loop_line, "WRONG"), 0);
    assert!(calls > 10_000, "the callers ran during the cycles: {calls}");
    assert_eq!(
        run.number("KPROBE_CALLS"),
        calls,
        "the kernel ran getppid() exactly as often as it was called"
    );
    let hits = run.number("SPLICE_HITS");
    assert!(
        hits > 0 && hits <= calls,
        "the splices counted some of the calls, never more: {hits} of {calls}"
    );
    assert_eq!(
        run.expect("RESTORED"),
        "yes",
        "__x64_sys_getppid byte for byte after the cycles"
    );
}

/// A live splice of each mechanism counted exactly the calls made while it lived.
fn check_exact(run: &Run) {
    for mech in ["trap", "jmp"] {
        let line = run.expect(&format!("EXACT_{mech}"));
        let mut words = line.split_whitespace();
        let splice: u64 = words
            .next()
            .and_then(|n| n.parse().ok())
            .expect("splice hits");
        let kprobe: u64 = words
            .next()
            .and_then(|n| n.parse().ok())
            .expect("kprobe hits");
        let made = field(line, "CALLS");
        assert_eq!(
            (splice, kprobe),
            (made, made),
            "{mech}: every call counted once by the splice and the kprobe"
        );
        assert_eq!(field(line, "WRONG"), 0, "{mech}: every answer right");
    }
    assert_eq!(run.expect("EXACT_RESTORED"), "yes");
}

#[test]
fn preempt_full_at_boot_single_step_cycles_of_two_instruction_windows_never_oops_and_count_exactly()
{
    if !can_boot("kernel scenario") {
        return;
    }
    let cycles = cycles();
    let run = run("preempt=full", cycles);
    check_stress(&run, cycles);
    check_exact(&run);
    println!(
        "kernel_preempt: {cycles} cycles in {} s",
        run.number("CYCLE_SECONDS")
    );
}

#[test]
fn switch_to_full_preemption_at_run_time_then_cycles_never_oops_and_count_exactly() {
    if !can_boot("kernel scenario") {
        return;
    }
    let cycles = (cycles() / 4).max(1);
    let run = run("trapvec_preempt.switch=1 trapvec_preempt.exact=0", cycles);
    check_stress(&run, cycles);
}
