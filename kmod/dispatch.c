// SPDX-License-Identifier: GPL-2.0
/*
 * The dispatch table (site -> destination) and the dispatcher on the trap path.
 *
 * Readers: trapvec_dispatch(), entered from entry.S with interrupts off (the gate is an
 * interrupt gate). An interrupts-off region is an RCU read-side critical section for
 * synchronize_rcu(), so the table is read with rcu_read_lock_sched_notrace() (which only
 * documents it: no function call) and entries are freed after synchronize_rcu(). That holds
 * only where RCU is watching: a trap taken in RCU-idle code makes it watch first.
 *
 * The trap path takes no lock, allocates nothing, logs nothing and calls no function that
 * a site could be placed in: every helper it uses is inline, the handler call goes through
 * the retpoline thunk (refused as a site), and counters are per CPU, read later.
 *
 * Writers hold trapvec_mutex; they are in dispatch_table.c (DISPATCH_ADD, REPLACE, REMOVE,
 * HITS, LIST and what other files ask of the table), with what both share in
 * trapvec_dispatch.h.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/hash.h>
#include <linux/hashtable.h>
#include <linux/kprobes.h>
#include <linux/moduleparam.h>
#include <linux/percpu.h>
#include <linux/rculist.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>

#include "../components/include/trapvec.h"
#include "trapvec_internal.h"
#include "trapvec_dispatch.h"

DEFINE_HASHTABLE(trapvec_sites, TRAPVEC_SITE_BITS);
u64 trapvec_site_count;		/* under trapvec_mutex */

/* Set while this CPU runs a handler: a trap taken meanwhile skips its handler. */
static DEFINE_PER_CPU(bool, trapvec_in_handler);
static DEFINE_PER_CPU(u64, trapvec_unknown_traps);
static DEFINE_PER_CPU(u64, trapvec_retried_traps);
static DEFINE_PER_CPU(u64, trapvec_rcu_idle_traps);

static __always_inline struct trapvec_site *trapvec_lookup_rcu(unsigned long site)
{
	struct trapvec_site *e;

	hlist_for_each_entry_rcu_notrace(e, trapvec_bucket(site), node)
		if (e->site == site)
			return e;
	return NULL;
}

/* The general registers of regs, as a handler sees them (rsp and rip are informational). */
static __always_inline void trapvec_regs_from(struct trapvec_regs *t,
					      const struct pt_regs *regs, unsigned long site)
{
	t->r15 = regs->r15;
	t->r14 = regs->r14;
	t->r13 = regs->r13;
	t->r12 = regs->r12;
	t->r11 = regs->r11;
	t->r10 = regs->r10;
	t->r9 = regs->r9;
	t->r8 = regs->r8;
	t->rdi = regs->di;
	t->rsi = regs->si;
	t->rbp = regs->bp;
	t->rbx = regs->bx;
	t->rdx = regs->dx;
	t->rcx = regs->cx;
	t->rax = regs->ax;
	t->rsp = regs->sp;
	t->rip = site;
	t->rflags = regs->flags;
}

/* Write back what a handler may change: the general registers, not rsp, rip or rflags. */
static __always_inline void trapvec_regs_to(struct pt_regs *regs, const struct trapvec_regs *t)
{
	regs->r15 = t->r15;
	regs->r14 = t->r14;
	regs->r13 = t->r13;
	regs->r12 = t->r12;
	regs->r11 = t->r11;
	regs->r10 = t->r10;
	regs->r9 = t->r9;
	regs->r8 = t->r8;
	regs->di = t->rdi;
	regs->si = t->rsi;
	regs->bp = t->rbp;
	regs->bx = t->rbx;
	regs->dx = t->rdx;
	regs->cx = t->rcx;
	regs->ax = t->rax;
}

/*
 * Does current have every field the entry's predicate names? Inline loads only (no memcmp
 * call on the trap path): comm is compared as two words, NUL padding included, which the
 * kernel keeps (__set_task_comm() pads with strscpy_pad()).
 */
static __always_inline bool trapvec_task_matches(const struct trapvec_task_match *m)
{
	const struct task_struct *t = current;
	const u64 *want = (const u64 *)m->comm, *have = (const u64 *)t->comm;

	if ((m->match & TRAPVEC_MATCH_PID) && t->pid != m->pid)
		return false;
	if ((m->match & TRAPVEC_MATCH_TGID) && t->tgid != m->tgid)
		return false;
	if ((m->match & TRAPVEC_MATCH_COMM) &&
	    (READ_ONCE(have[0]) != want[0] || READ_ONCE(have[1]) != want[1]))
		return false;
	return true;
}

/*
 * Does site still hold our trap (CD vector)? Plain loads of text this CPU has just executed
 * (inline: the trap path calls nothing a site could be in).
 */
static __always_inline bool trapvec_trap_still_at(unsigned long site)
{
	const u8 *b = (const u8 *)site;

	return READ_ONCE(b[0]) == 0xcd && READ_ONCE(b[1]) == trapvec_vector;
}

enum trapvec_found {
	TRAPVEC_FOUND_NONE,	/* no entry: not one of our sites */
	TRAPVEC_FOUND_LIVE,	/* regs->ip is set */
	TRAPVEC_FOUND_GONE,	/* an entry DISPATCH_REMOVE is taking away: nothing done */
};

/*
 * A claimed trap always moves the CPU on. An entry marked gone is retried at its site only
 * once the site no longer holds our trap (its revert is written): sending a CPU back to a
 * `CD vector` that is still there would take the same trap again, with interrupts off when
 * the interrupted code had them off (the idle task in __schedule()), for ever. While the trap
 * is there the gone entry still says where it leads (it is freed two grace periods after it
 * is unlinked, and this CPU is a reader), so it is dispatched as a live one. DISPATCH_REMOVE
 * refuses a site whose trap is live, so this is a guard, not a path the ioctls take.
 */

/*
 * A CPU at site: count the hit, run the handler, set regs->ip to the destination, when site has
 * a live entry. Interrupts are off; the caller is an RCU-sched reader or this function is.
 */
static __always_inline enum trapvec_found trapvec_dispatch_lookup(struct pt_regs *regs,
								   unsigned long site)
{
	enum trapvec_found found = TRAPVEC_FOUND_NONE;
	struct trapvec_site_call *call;
	struct trapvec_site *e;

	rcu_read_lock_sched_notrace();
	e = trapvec_lookup_rcu(site);
	call = e ? e->call : NULL;
	if (e && READ_ONCE(e->gone) && !trapvec_trap_still_at(site)) {
		found = TRAPVEC_FOUND_GONE;
	} else if (call && call->only.match && !trapvec_task_matches(&call->only)) {
		/* Another task: straight to the displaced instructions, not counted. */
		regs->ip = call->only.skip;
		found = TRAPVEC_FOUND_LIVE;
	} else if (e) {
		/* One incq %gs:...: an NMI that traps in between cannot lose a count. */
		this_cpu_inc(e->counts->hits);
		if (call && call->handler) {
			if (!__this_cpu_read(trapvec_in_handler)) {
				struct trapvec_regs tregs;

				__this_cpu_write(trapvec_in_handler, true);
				trapvec_regs_from(&tregs, regs, site);
				call->handler(&tregs, call->cookie);
				trapvec_regs_to(regs, &tregs);
				__this_cpu_write(trapvec_in_handler, false);
			} else {
				/* A handler trapped (or an NMI hit a site under one). */
				this_cpu_inc(e->counts->missed);
			}
		}
		regs->ip = e->dest;
		found = TRAPVEC_FOUND_LIVE;
	}
	rcu_read_unlock_sched_notrace();
	return found;
}

/*
 * The trap (trapvec_dispatch()) and a pending int3 of a trap patch that is being written
 * (text.c's die notifier) both come here, so a call is counted once whichever of the two it
 * meets. Returns false, doing nothing, when site has no live entry.
 */
notrace bool trapvec_dispatch_site(struct pt_regs *regs, unsigned long site)
{
	return trapvec_dispatch_lookup(regs, site) == TRAPVEC_FOUND_LIVE;
}
NOKPROBE_SYMBOL(trapvec_dispatch_site);

/*
 * Called from entry.S with interrupts off, on the interrupted context's stack. Returns 0
 * when regs->ip has been set (iretq there), 1 when the trap is not ours (chain).
 *
 * regs->ip - 2 is a trap site only when the CPU got here by executing our "int" there. The
 * vector can also arrive as an interrupt (a stray IPI or MSI naming it, a buggy driver): then
 * regs->ip is any instruction boundary and the two bytes before it are not an instruction at
 * all. Sending such a CPU back to ip - 2 would run the middle of an instruction, and would
 * leave the local APIC's in-service bit of the vector set (nothing acknowledges it), masking
 * every interrupt below it on that CPU. So a site is retried only when it is known to have
 * been ours: its entry is still in the table, marked gone by DISPATCH_REMOVE. That covers
 * every trap that needs it: DISPATCH_REMOVE runs only after the site's trap is reverted (it
 * refuses a live one), marks the entries gone, and unlinks them a grace period later; a CPU
 * that executed the "int" before the revert has had interrupts off since (this is an
 * interrupt gate), so it is an RCU-sched reader that began before that grace period and still
 * finds the entry, live or gone. A CPU cannot execute the "int" after the revert (every CPU is
 * serialized when text is written). Anything else is chained to the old gate, the kernel's
 * spurious-interrupt entry, which acknowledges a real interrupt and counts it.
 */
__visible notrace int trapvec_dispatch(struct pt_regs *regs)
{
	unsigned long site = regs->ip - TRAPVEC_TRAP_LEN;
	bool rcu_idle = !trapvec_rcu_watching();
	int ret = 0;

	/*
	 * A trap taken where RCU is not watching (the idle loop after ct_idle_enter(): poll_idle's
	 * local_clock() and cpuidle_poll_time(), an ACPI idle state's helpers, the CPU-offline path
	 * after rcu_report_dead()): an RCU-sched reader there is invisible to synchronize_rcu(), so
	 * DISPATCH_REMOVE could free the entry, and QUIESCE the handler, under this CPU. Enter RCU
	 * the way an NMI does (ct_nmi_enter() nests in any context, interrupts off, as here), and
	 * leave it before the iretq. Both are noinstr: no site can be placed in them.
	 */
	if (unlikely(rcu_idle)) {
		trapvec_ksyms.ct_nmi_enter();
		__this_cpu_inc(trapvec_rcu_idle_traps);
	}
	switch (trapvec_dispatch_lookup(regs, site)) {
	case TRAPVEC_FOUND_LIVE:
		break;
	case TRAPVEC_FOUND_GONE:
		/* Its trap was reverted under this CPU: run the original instruction, back in place. */
		__this_cpu_inc(trapvec_retried_traps);
		regs->ip = site;
		break;
	case TRAPVEC_FOUND_NONE:
		__this_cpu_inc(trapvec_unknown_traps);
		ret = 1;
		break;
	}
	if (unlikely(rcu_idle))
		trapvec_ksyms.ct_nmi_exit();
	return ret;
}
NOKPROBE_SYMBOL(trapvec_dispatch);

struct trapvec_site *trapvec_lookup_locked(unsigned long site)
{
	struct trapvec_site *e;

	lockdep_assert_held(&trapvec_mutex);
	hash_for_each_possible(trapvec_sites, e, node, site)
		if (e->site == site)
			return e;
	return NULL;
}

bool trapvec_dispatch_has(unsigned long site)
{
	return trapvec_lookup_locked(site);
}

void trapvec_dispatch_stats(u64 *unknown, u64 *retried)
{
	int cpu;

	*unknown = 0;
	*retried = 0;
	for_each_possible_cpu(cpu) {
		*unknown += READ_ONCE(per_cpu(trapvec_unknown_traps, cpu));
		*retried += READ_ONCE(per_cpu(trapvec_retried_traps, cpu));
	}
}

static u64 trapvec_dispatch_rcu_idle(void)
{
	u64 n = 0;
	int cpu;

	for_each_possible_cpu(cpu)
		n += READ_ONCE(per_cpu(trapvec_rcu_idle_traps, cpu));
	return n;
}

/*
 * /sys/module/trapvec/parameters/traps: the dispatcher's own counters, one "name count" line
 * each, for tests and for an operator wondering where a stray vector went: unknown (chained to
 * the old gate: not one of our sites, e.g. the vector delivered as an interrupt), retried (a
 * site whose entry DISPATCH_REMOVE was taking away, sent back to its original instruction),
 * rcu_idle (traps taken where RCU was not watching, which the dispatcher made it watch).
 */
static int trapvec_traps_get(char *buf, const struct kernel_param *kp)
{
	u64 unknown, retried;

	trapvec_dispatch_stats(&unknown, &retried);
	return sysfs_emit(buf, "unknown %llu\nretried %llu\nrcu_idle %llu\n", unknown, retried,
			  trapvec_dispatch_rcu_idle());
}

static const struct kernel_param_ops trapvec_traps_ops = {
	.get = trapvec_traps_get,
};
module_param_cb(traps, &trapvec_traps_ops, NULL, 0444);
MODULE_PARM_DESC(traps, "the dispatcher's counters: unknown, retried, rcu_idle (read only)");
