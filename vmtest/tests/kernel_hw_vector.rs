//! The trap vector delivered as a hardware interrupt in kernel mode
//! (`vmtest/scenarios/kernel_hw_vector.sh`, issue 24 item 7): the helper module
//! `vmtest/kmods/selfipi` sends three self-IPIs of vector 0xf5 through the local APIC. No trap
//! precedes the interrupted ip, so the dispatcher must chain each to the old gate, the kernel's
//! spurious entry (which acknowledges and counts it), and never send the CPU back to ip - 2.
//! Asserted: three unknown traps and no retried one in the module's counters, three more
//! spurious interrupts in /proc/interrupts with their "Acked" lines, both CPUs still taking
//! interrupts, a trap splice still counting every call, no oops (vmtest).
//!
//! `TRAPVEC_HW_VECTOR_MODULE=/path/trapvec.ko` tests that module instead of the tree's: the
//! dispatcher before this fix retried the IPI at ip - 2, leaving the vector in service.

use vmtest::testing::{can_boot, can_boot_kernel, guest_module, guest_module_for, Scenario};

#[test]
fn a_hardware_delivered_trap_vector_is_chained_to_the_old_gate_and_never_retried() {
    if !can_boot("kernel scenario") {
        return;
    }
    hw_vector(Scenario::named("kernel_hw_vector.sh").file(guest_module("selfipi", "tv_selfipi")));
}

/// The same on Debian 13's kernel (the splice past its endbr64 and ftrace site, at +9).
#[test]
fn a_hardware_delivered_trap_vector_is_chained_to_the_old_gate_on_6_12_too() {
    if !can_boot_kernel("kernel scenario on 6.12", "6.12") {
        return;
    }
    hw_vector(
        Scenario::named("kernel_hw_vector.sh")
            .kernel("6.12")
            .file(guest_module_for("6.12", "selfipi", "tv_selfipi")),
    );
}

fn hw_vector(scenario: Scenario) {
    let scenario = scenario
        .timeout(300)
        .module_under_test("TRAPVEC_HW_VECTOR_MODULE", "tv_hw_vector");
    let run = scenario.run(env!("CARGO_BIN_EXE_vmtest"));
    println!("{}", run.stdout);
    run.assert_passed();
    assert!(
        run.stdout.contains("HW_VECTOR_DONE"),
        "the scenario ran to its end"
    );
    assert_eq!(run.number("CPUS"), 2);
    assert!(
        run.expect("GATE").contains("gate -> trapvec_entry"),
        "trapvec's gate was installed: {}",
        run.expect("GATE")
    );
    assert_eq!(run.expect("SELFIPI"), "yes");
    assert!(
        run.expect("SELFIPI_LINE")
            .contains("sent 3 self-IPI(s) of vector 0xf5"),
        "{}",
        run.expect("SELFIPI_LINE")
    );
    assert_eq!(
        run.number("RETRIED_DELTA"),
        0,
        "no interrupt was retried at ip - 2"
    );
    assert_eq!(
        run.number("UNKNOWN_DELTA"),
        3,
        "each interrupt was chained as not ours"
    );
    assert_eq!(
        run.number("SPU_DELTA"),
        3,
        "the spurious entry counted each"
    );
    assert_eq!(
        run.number("ACKED_DELTA"),
        3,
        "... and acknowledged each (its dmesg line)"
    );
    assert_eq!(
        run.expect("SLEPT_ON_0"),
        "yes",
        "CPU 0 still takes timer interrupts"
    );
    assert_eq!(
        run.expect("SLEPT_ON_1"),
        "yes",
        "CPU 1 still takes timer interrupts"
    );
    let hits = run.number("GETPPID_HITS");
    assert!(
        (1000..2000).contains(&hits),
        "the trap splice counted the 1000 getppid calls (and a few of the shell's): {hits}"
    );
    assert_eq!(run.expect("UNSPLICED"), "yes");
    assert_eq!(
        run.number("UNKNOWN_END"),
        3,
        "the splice's traps were all found"
    );
}
