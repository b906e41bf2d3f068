// SPDX-License-Identifier: GPL-2.0
/*
 * tv_nmi_victim - NMIs that run a function while trapvec.ko writes its text
 * (vmtest/scenarios/kernel_textwrite.sh, issue 24 item 1).
 *
 * tv_victim() is a noinline function whose body after the fentry NOP is one 10-byte
 * instruction (movabs), so that a trap (2 bytes) and a jmp (5 bytes) spliced at its entry
 * each cover one instruction: the windows trapvec wrote byte by byte inside stop_machine()
 * before issue 24, with no int3 first.
 *
 * NMIs come in chains that cross stop_machine(): a kthread starts a chain of `chain` NMIs
 * at the other CPU, and each NMI handler, after calling tv_victim(), passes the chain on to
 * the other CPU. Interrupts being off does not stop a chain, so NMIs keep arriving on both
 * CPUs while trapvec's writer stores bytes and while the other CPU spins in the stop
 * callback: the writer itself is interrupted between its stores.
 *
 * Counts (read-only parameters): nmis (NMIs this module sent and claimed), calls (calls
 * of tv_victim()), wrong (calls whose result was not the movabs constant ^ x), marks (calls of
 * tv_splice_mark(), the handler a splice runs through components/tv_nmi_mark.c) and spliced
 * (calls of tv_victim() during which that handler ran, read on the same CPU in the same NMI).
 *
 * Only for a guest with two CPUs: with two, every IPI a CPU sends by destination (not by
 * shortcut) goes to the other one, so an NMI sent from inside an NMI that interrupted an
 * xAPIC send between its ICR2 and ICR writes leaves ICR2 as it found it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/delay.h>
#include <linux/kthread.h>
#include <linux/module.h>
#include <linux/percpu.h>
#include <asm/apic.h>
#include <asm/nmi.h>

#define TV_VICTIM_CONST 0x0123456789abcdefULL

static unsigned int chain = 64;
module_param(chain, uint, 0644);
MODULE_PARM_DESC(chain, "NMIs per chain");

/* Set by writing 1 to run; the kthread starts chains while it is set. */
static bool run;
module_param(run, bool, 0644);
MODULE_PARM_DESC(run, "1: keep sending chains of NMIs");

static atomic_long_t nv_nmis, nv_calls, nv_wrong, nv_marks, nv_spliced, nv_chains;

static DEFINE_PER_CPU(atomic_t, nv_pending);	/* NMIs sent to this CPU, not yet claimed */
static DEFINE_PER_CPU(int, nv_mark_flag);	/* tv_splice_mark() ran in this NMI */
static atomic_t nv_left;			/* NMIs still to send in the current chain */
static atomic_t nv_inflight;			/* 1 while a chain's NMI is on its way */
static struct task_struct *nv_thread;

static int nv_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%ld\n", atomic_long_read(kp->arg));
}

static const struct kernel_param_ops nv_count_ops = { .get = nv_get };
module_param_cb(nmis, &nv_count_ops, &nv_nmis, 0444);
module_param_cb(calls, &nv_count_ops, &nv_calls, 0444);
module_param_cb(wrong, &nv_count_ops, &nv_wrong, 0444);
module_param_cb(marks, &nv_count_ops, &nv_marks, 0444);
module_param_cb(spliced, &nv_count_ops, &nv_spliced, 0444);
module_param_cb(chains, &nv_count_ops, &nv_chains, 0444);

/* What a splice on tv_victim() calls (components/tv_nmi_mark.c); NMI context. */
noinline void tv_splice_mark(void)
{
	this_cpu_write(nv_mark_flag, 1);
	atomic_long_inc(&nv_marks);
}

/* The victim: after the fentry NOP, one 10-byte instruction, then the xor and the return. */
noinline u64 tv_victim(u64 x)
{
	u64 r;

	asm volatile("movabs %1, %0" : "=r"(r) : "i"(TV_VICTIM_CONST));
	return r ^ x;
}

static void nv_send(void)
{
	unsigned int cpu = cpumask_next(smp_processor_id(), cpu_online_mask);

	if (cpu >= nr_cpu_ids)
		cpu = cpumask_first(cpu_online_mask);
	atomic_set(&nv_inflight, 1);
	atomic_inc(per_cpu_ptr(&nv_pending, cpu));
	apic->send_IPI(cpu, NMI_VECTOR);
}

static int nv_nmi(unsigned int type, struct pt_regs *regs)
{
	u64 x = (u64)atomic_long_read(&nv_calls);

	/* Not one of ours: let the other handlers (and the unknown-NMI path) have it. */
	if (!atomic_add_unless(this_cpu_ptr(&nv_pending), -1, 0))
		return NMI_DONE;
	atomic_long_inc(&nv_nmis);
	this_cpu_write(nv_mark_flag, 0);
	if (tv_victim(x) != (TV_VICTIM_CONST ^ x))
		atomic_long_inc(&nv_wrong);
	atomic_long_inc(&nv_calls);
	if (this_cpu_read(nv_mark_flag))
		atomic_long_inc(&nv_spliced);
	if (atomic_dec_if_positive(&nv_left) >= 0)
		nv_send();
	else
		atomic_set(&nv_inflight, 0);
	return NMI_HANDLED;
}

static int nv_thread_fn(void *unused)
{
	while (!kthread_should_stop()) {
		if (READ_ONCE(run) && !atomic_read(&nv_inflight)) {
			atomic_set(&nv_left, chain);
			atomic_long_inc(&nv_chains);
			preempt_disable();
			nv_send();
			preempt_enable();
		}
		usleep_range(200, 400);
	}
	return 0;
}

static int __init nv_init(void)
{
	int ret;

	if (num_online_cpus() != 2) {
		pr_err("needs exactly 2 online CPUs, not %u (see the comment at the top)\n",
		       num_online_cpus());
		return -EINVAL;
	}
	ret = register_nmi_handler(NMI_LOCAL, nv_nmi, 0, "tv_nmi_victim");
	if (ret)
		return ret;
	nv_thread = kthread_run(nv_thread_fn, NULL, "tv_nmi_victim");
	if (IS_ERR(nv_thread)) {
		unregister_nmi_handler(NMI_LOCAL, "tv_nmi_victim");
		return PTR_ERR(nv_thread);
	}
	pr_info("tv_victim at %pS\n", tv_victim);
	return 0;
}

static void __exit nv_exit(void)
{
	kthread_stop(nv_thread);
	/* The last chain ends by itself: no more are started, and each is finite. */
	while (atomic_read(&nv_inflight))
		msleep(1);
	unregister_nmi_handler(NMI_LOCAL, "tv_nmi_victim");
}

module_init(nv_init);
module_exit(nv_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("NMIs calling a victim function while trapvec.ko writes its text (test)");
