// SPDX-License-Identifier: GPL-2.0
/*
 * The pending set of a batch in flight, and the die notifier that sends a CPU meeting one of our
 * CCs where the site leads.
 *
 * Meanwhile a CPU that meets one of our CCs takes #BP: exc_int3 tries text_poke_bp()'s
 * handler, then kprobe_int3_handler() (6.1's backs the CPU up if the int3 is gone by then;
 * 6.12's has no such check), then the die chain, where trapvec_int3_notify() finds the site pending and sends the CPU
 * where the finished patch would: a trap through the dispatcher's own code (handler run,
 * hit counted once), a jmp to its target. A revert's site sends it where the live patch
 * still does (no out-of-line copy of the original instruction exists to run instead): its
 * trampoline replays that instruction and jumps back behind the window, which is right
 * until the revert completes, and the trap's dispatch entry cannot be removed meanwhile
 * (trapvec_mutex is held). A jmp of the batch that lands on a springboard of the same batch
 * is sent straight to the springboard's target (trapvec_pending_publish()): the springboard
 * is written in FINISH only, and until then its bytes are padding. A call in the window is refused
 * unless it is the window's last instruction (check.c): its return address would point into
 * the new bytes, and a task sleeping in the callee is quiescent for RCU-tasks.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bsearch.h>
#include <linux/kdebug.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/rcupdate.h>
#include <linux/sort.h>
#include <linux/sysfs.h>
#include <asm/text-patching.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

/*
 * The sites whose first byte is, or may be, our int3 while a batch is in flight: what the
 * die notifier reads. Published (RCU) before the first CC is written, withdrawn after the
 * last is gone, freed after synchronize_rcu() (the notifier runs with interrupts off, an
 * RCU-sched reader). Sorted by addr. Writers hold trapvec_mutex.
 */
struct trapvec_pending_site {
	unsigned long addr;
	unsigned long dest;	/* the jmp's target; 0: a trap, sent through the dispatch table */
};

struct trapvec_pending {
	u32 count;
	struct trapvec_pending_site sites[];
};

static struct trapvec_pending __rcu *trapvec_pending;

/*
 * CPUs the die notifier sent on from one of our pending CCs: what a test reads to see that
 * a CPU (an NMI) really ran a site while it was being written
 * (/sys/module/trapvec/parameters/int3_redirects).
 */
static atomic_long_t trapvec_int3_redirects = ATOMIC_LONG_INIT(0);

static int trapvec_get_redirects(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%ld\n", atomic_long_read(&trapvec_int3_redirects));
}

static const struct kernel_param_ops trapvec_redirects_ops = {
	.get = trapvec_get_redirects,
};
module_param_cb(int3_redirects, &trapvec_redirects_ops, NULL, 0444);
MODULE_PARM_DESC(int3_redirects, "CPUs sent on from a pending int3 of ours (read only)");

static int trapvec_cmp_pending(const void *a, const void *b)
{
	const struct trapvec_pending_site *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/*
 * Publish every site of ops for the die notifier, before any CC of ours is written there:
 * apply and revert alike. Where a CPU that meets the CC is sent: for an apply, where the new
 * patch sends it; for a revert, where the live patch still sends it (its trampoline replays
 * the original instruction and jumps back behind the window; its dispatch entry cannot go
 * while trapvec_mutex is held), which is right until the original first byte is back.
 */
struct trapvec_pending *trapvec_pending_publish(const struct trapvec_text_op *ops, u32 n,
					       gfp_t gfp)
{
	struct trapvec_pending_site key = {};
	const struct trapvec_pending_site *to;
	struct trapvec_pending *pend;
	u32 i;

	pend = trapvec_kvmalloc(TRAPVEC_MEM_PENDING, 1, struct_size(pend, sites, n), gfp);
	if (!pend)
		return NULL;
	pend->count = n;
	for (i = 0; i < n; i++) {
		pend->sites[i].addr = ops[i].rec->addr;
		pend->sites[i].dest = trapvec_rec_dest(ops[i].rec);
	}
	sort(pend->sites, pend->count, sizeof(pend->sites[0]), trapvec_cmp_pending, NULL);
	/*
	 * A jmp that lands on a springboard of the same batch (a jmp rel8 onto a jmp rel32 in
	 * padding) is sent to the springboard's target. ARM writes the CC of the jmp's window
	 * but not the springboard's, which FINISH writes after an RCU-tasks grace period: sent to
	 * the springboard meanwhile, a CPU would run its original bytes, padding that falls
	 * through into the function, to our CC again, for ever (both CPUs of a 6.12 guest at
	 * sched_balance_softirq+9, in a tick's softirq while FINISH's stop_machine() waited for
	 * them). Once written, the springboard leads to the same target. One hop: a springboard
	 * does not land on another patch (trapvec_link_springboards()).
	 */
	for (i = 0; i < n; i++) {
		if (!pend->sites[i].dest)
			continue;
		key.addr = pend->sites[i].dest;
		to = bsearch(&key, pend->sites, pend->count, sizeof(pend->sites[0]),
			     trapvec_cmp_pending);
		if (to && to->dest)
			pend->sites[i].dest = to->dest;
	}
	/* Orders the array's contents before the pointer; stop_machine() then orders it
	 * before the first CC.
	 */
	rcu_assign_pointer(trapvec_pending, pend);
	return pend;
}

/* Withdraw: no CC of ours is left; wait for notifiers still reading, then free. */
void trapvec_pending_withdraw(struct trapvec_pending *pend)
{
	lockdep_assert_held(&trapvec_mutex);
	RCU_INIT_POINTER(trapvec_pending, NULL);
	synchronize_rcu();
	trapvec_kvfree(TRAPVEC_MEM_PENDING, pend, struct_size(pend, sites, pend->count));
}

/*
 * DIE_INT3, after kprobe_int3_handler() (do_int3(); poke_int3_handler() came before it):
 * a kernel CPU stopped at one of our pending CCs is sent where the finished patch sends it.
 * A CC of ours that is gone again by the time this runs (the writer put the site's first byte
 * in between) is still found: the set is withdrawn only after synchronize_rcu(), and this CPU
 * has had interrupts off since it took the int3, so it is a reader that began before. That is
 * what 6.12 relies on: its kprobe_int3_handler() no longer backs up a CPU whose int3 is gone
 * (6.1's does, and then this never runs for it).
 *
 * Context: exc_int3 from kernel mode, irqentry_nmi_enter(), interrupts off, possibly inside
 * an NMI. No lock, no allocation, no call of a function a site could be placed in (the
 * binary search is written out here): an RCU-sched reader of trapvec_pending.
 */
static int trapvec_int3_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	const struct die_args *args = data;
	struct pt_regs *regs = args->regs;
	const struct trapvec_pending *pend;
	unsigned long site;
	int ret = NOTIFY_DONE;
	u32 lo, hi, mid;

	if (val != DIE_INT3 || !regs || user_mode(regs))
		return NOTIFY_DONE;
	site = regs->ip - INT3_INSN_SIZE;
	rcu_read_lock_sched_notrace();
	pend = rcu_dereference_sched(trapvec_pending);
	if (!pend)
		goto out;
	lo = 0;
	hi = pend->count;
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (pend->sites[mid].addr < site)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == pend->count || pend->sites[lo].addr != site)
		goto out;
	if (pend->sites[lo].dest) {
		/* A jmp: its target (a trampoline, or a springboard written by an earlier batch). */
		regs->ip = pend->sites[lo].dest;
		ret = NOTIFY_STOP;
	} else if (trapvec_dispatch_site(regs, site)) {
		/* A trap: what the trap would have done, counted once. */
		ret = NOTIFY_STOP;
	}
	if (ret == NOTIFY_STOP)
		atomic_long_inc(&trapvec_int3_redirects);
	/*
	 * Else a trap without its dispatch entry, which APPLY refuses and DISPATCH_REMOVE cannot
	 * do meanwhile (trapvec_mutex is held from the first CC to the last): die() says so.
	 */
out:
	rcu_read_unlock_sched_notrace();
	return ret;
}
NOKPROBE_SYMBOL(trapvec_int3_notify);

/*
 * First on the die chain (with kprobes' own, which is blacklisted): a die notifier that runs
 * before ours on an int3 could itself hold one of our pending CCs (uprobes' at INT_MAX - 1,
 * arch_uprobe_exception_notify(), is ordinary traceable text, so a site may be planned in it).
 * Then every int3 would run into that CC again before we could send the CPU on: an endless
 * recursion that froze a guest during a batch of 5,000 jmp splices. Running first, we clear a
 * pending CC before anything else on the chain runs.
 */
static struct notifier_block trapvec_int3_nb = {
	.notifier_call = trapvec_int3_notify,
	.priority = INT_MAX,
};

int trapvec_text_init(void)
{
	/* A trap patch's record, what kmod/README.md counts per count site. */
	BUILD_BUG_ON(sizeof(struct trapvec_live_patch) > 128);
	return register_die_notifier(&trapvec_int3_nb);
}

/* After trapvec_text_revert_all(): no batch is in flight. */
void trapvec_text_exit(void)
{
	unregister_die_notifier(&trapvec_int3_nb);
}
