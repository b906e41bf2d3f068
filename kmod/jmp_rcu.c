// SPDX-License-Identifier: GPL-2.0
/*
 * A jmp splice's handler where RCU is not watching.
 *
 * A trap enters RCU the way an NMI does (dispatch.c) before it looks at anything; a jmp goes
 * from the site straight to its call trampoline in the arena, which calls the handler. In
 * text the idle loop runs after ct_idle_enter() (6.1: cpuidle_enter_state() enters RCU-idle
 * before ->enter(): poll_idle()'s cpuidle_poll_time() and local_clock(), acpi_idle_enter()'s
 * helpers), the handler would run with RCU not watching: its RCU readers protect nothing, and
 * RCU-protected data it reads may be freed under it.
 *
 * Which functions those are cannot be told from the code (->enter() is an indirect call, and
 * drivers differ), so every kernel call trampoline asks at run time: it calls
 * trapvec_jmp_rcu_enter() after saving the registers and trapvec_jmp_rcu_exit() after the
 * handler when the first returned 1 (instr-manager/src/trampoline.rs). Where RCU watches (every
 * site outside idle) that is a call, a per-CPU load, a test and a return, and a test after the
 * handler. Where it does not, RCU is entered as an NMI enters it (ct_nmi_enter() nests in any
 * context), with preemption off until the exit so that both run on the same CPU (an idle CPU in
 * RCU-idle is never preempted anyway). The removal of such a splice waits for idle CPUs
 * through the RCU-tasks-rude grace period QUIESCE already takes (arena.c).
 *
 * Both functions run in any context a site can be in, so they are notrace, NOKPROBE and refused
 * as sites (they are in this module).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/moduleparam.h>
#include <linux/percpu.h>
#include <linux/preempt.h>
#include <linux/sysfs.h>

#include "trapvec_internal.h"
#include "trapvec_idle.h"

/* Handlers of jmp splices run with RCU entered here (jmp_rcu_idle). */
static DEFINE_PER_CPU(u64, trapvec_jmp_rcu_idle_calls);

/*
 * 0: RCU is watching, nothing to do. 1: RCU was not watching and now is; the trampoline calls
 * trapvec_jmp_rcu_exit() after the handler. Preemption may be on here (a site in preemptible
 * code): the per-CPU state read may then be another CPU's, which is harmless either way (a CPU
 * in RCU-idle is never preempted, so "watching" is never wrong for it; "not watching" read
 * for a CPU that watches makes ct_nmi_enter() nest, which it may).
 */
__visible notrace unsigned long trapvec_jmp_rcu_enter(void)
{
	unsigned long flags;

	if (likely(trapvec_rcu_watching()))
		return 0;
	preempt_disable_notrace();
	/* ct_nmi_enter() expects interrupts off, as in an NMI; poll_idle() runs with them on. */
	raw_local_irq_save(flags);
	trapvec_ksyms.ct_nmi_enter();
	raw_local_irq_restore(flags);
	this_cpu_inc(trapvec_jmp_rcu_idle_calls);
	return 1;
}
NOKPROBE_SYMBOL(trapvec_jmp_rcu_enter);

/* After the handler, when trapvec_jmp_rcu_enter() returned 1: back to RCU-idle. */
__visible notrace void trapvec_jmp_rcu_exit(void)
{
	unsigned long flags;

	raw_local_irq_save(flags);
	trapvec_ksyms.ct_nmi_exit();
	raw_local_irq_restore(flags);
	/* An idle CPU's preempt count stays above 0 here: no reschedule from RCU-idle. */
	preempt_enable_notrace();
}
NOKPROBE_SYMBOL(trapvec_jmp_rcu_exit);

static int trapvec_jmp_rcu_idle_get(char *buf, const struct kernel_param *kp)
{
	u64 n = 0;
	int cpu;

	for_each_possible_cpu(cpu)
		n += READ_ONCE(per_cpu(trapvec_jmp_rcu_idle_calls, cpu));
	return sysfs_emit(buf, "%llu\n", n);
}

static const struct kernel_param_ops trapvec_jmp_rcu_idle_ops = {
	.get = trapvec_jmp_rcu_idle_get,
};
module_param_cb(jmp_rcu_idle, &trapvec_jmp_rcu_idle_ops, NULL, 0444);
MODULE_PARM_DESC(jmp_rcu_idle,
		 "handlers of jmp splices run with RCU entered for them (read only)");
