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
 * Writers hold trapvec_mutex.
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

struct trapvec_counts {
	u64 hits;
	u64 missed;
};

struct trapvec_site {
	struct hlist_node node;		/* in trapvec_sites, RCU */
	unsigned long site;
	unsigned long dest;
	trapvec_handler_t *handler;
	void *cookie;
	struct trapvec_counts __percpu *counts;
	/* A task predicate (match != 0): other tasks go to only.skip, uncounted. */
	struct trapvec_task_match only;
	/*
	 * DISPATCH_REMOVE has taken it (its trap is reverted): a trap still met here is retried
	 * at the site, and the entry is unlinked one grace period later (trapvec_dispatch()).
	 */
	bool gone;
};

#define TRAPVEC_SITE_BITS	12
static DEFINE_HASHTABLE(trapvec_sites, TRAPVEC_SITE_BITS);
static u64 trapvec_site_count;		/* under trapvec_mutex */

/* Set while this CPU runs a handler: a trap taken meanwhile skips its handler. */
static DEFINE_PER_CPU(bool, trapvec_in_handler);
static DEFINE_PER_CPU(u64, trapvec_unknown_traps);
static DEFINE_PER_CPU(u64, trapvec_retried_traps);
static DEFINE_PER_CPU(u64, trapvec_rcu_idle_traps);

static __always_inline struct hlist_head *trapvec_bucket(unsigned long site)
{
	return &trapvec_sites[hash_long(site, TRAPVEC_SITE_BITS)];
}

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
	struct trapvec_site *e;

	rcu_read_lock_sched_notrace();
	e = trapvec_lookup_rcu(site);
	if (e && READ_ONCE(e->gone) && !trapvec_trap_still_at(site)) {
		found = TRAPVEC_FOUND_GONE;
	} else if (e && e->only.match && !trapvec_task_matches(&e->only)) {
		/* Another task: straight to the displaced instructions, not counted. */
		regs->ip = e->only.skip;
		found = TRAPVEC_FOUND_LIVE;
	} else if (e) {
		/* One incq %gs:...: an NMI that traps in between cannot lose a count. */
		this_cpu_inc(e->counts->hits);
		if (e->handler) {
			if (!__this_cpu_read(trapvec_in_handler)) {
				struct trapvec_regs tregs;

				__this_cpu_write(trapvec_in_handler, true);
				trapvec_regs_from(&tregs, regs, site);
				e->handler(&tregs, e->cookie);
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

static struct trapvec_site *trapvec_lookup_locked(unsigned long site)
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

/* The per-CPU counters of an entry count as a second object of its kind. */
#define TRAPVEC_COUNTS_BYTES	(sizeof(struct trapvec_counts) * num_possible_cpus())

static struct trapvec_site *trapvec_site_alloc(void)
{
	struct trapvec_site *e;

	e = trapvec_kvmalloc(TRAPVEC_MEM_ENTRY, 1, sizeof(*e), GFP_KERNEL | __GFP_ZERO);
	if (!e)
		return NULL;
	e->counts = alloc_percpu(struct trapvec_counts);
	if (!e->counts) {
		trapvec_kvfree(TRAPVEC_MEM_ENTRY, e, sizeof(*e));
		return NULL;
	}
	trapvec_mem_got(TRAPVEC_MEM_ENTRY, TRAPVEC_COUNTS_BYTES);
	return e;
}

static void trapvec_site_free(struct trapvec_site *e)
{
	free_percpu(e->counts);
	trapvec_mem_put(TRAPVEC_MEM_ENTRY, TRAPVEC_COUNTS_BYTES);
	trapvec_kvfree(TRAPVEC_MEM_ENTRY, e, sizeof(*e));
}

/*
 * A site is text of the kernel or of a live module, outside this module; or of a COMING
 * module whose load the module watch holds for the watcher arming it (modwatch.c).
 */
static bool trapvec_site_plausible(unsigned long site)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	struct module *mod;
	bool ok;

	if (trapvec_in_own_module(site, TRAPVEC_TRAP_LEN))
		return false;
	if (site >= k->stext && site + TRAPVEC_TRAP_LEN <= k->etext)
		return true;
	preempt_disable();
	mod = k->module_text_address(site);
	ok = mod && (mod->state == MODULE_STATE_LIVE ||
		     (mod->state == MODULE_STATE_COMING && trapvec_modwatch_arming(mod)));
	preempt_enable();
	return ok;
}

static int trapvec_cmp_pair(const void *a, const void *b)
{
	const u64 *x = a, *y = b;

	if (x[0] != y[0])
		return x[0] < y[0] ? -1 : 1;
	return x[1] < y[1] ? -1 : x[1] > y[1];
}

/*
 * The first index of sites[] (count elements of stride bytes) that repeats an earlier one,
 * or count: one sort of (site, index) pairs instead of comparing every pair, which for
 * TRAPVEC_BATCH_MAX elements would hold the CPU for billions of compares.
 */
static int trapvec_first_repeat(const void *sites, size_t stride, u32 count, u32 *first)
{
	u64 *pairs;
	u32 i;

	*first = count;
	if (count < 2)
		return 0;
	pairs = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, 2 * sizeof(u64), GFP_KERNEL);
	if (!pairs)
		return -ENOMEM;
	for (i = 0; i < count; i++) {
		pairs[2 * i] = *(const u64 *)(sites + i * stride);
		pairs[2 * i + 1] = i;
	}
	/* Sorted by site, then by index: the later of two equal sites follows the earlier. */
	sort(pairs, count, 2 * sizeof(u64), trapvec_cmp_pair, NULL);
	for (i = 1; i < count; i++)
		if (pairs[2 * i] == pairs[2 * i - 2])
			*first = min_t(u32, *first, pairs[2 * i + 1]);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, pairs, count * 2 * sizeof(u64));
	return 0;
}

static void trapvec_sum(const struct trapvec_site *e, u64 *hits, u64 *missed)
{
	int cpu;

	*hits = 0;
	*missed = 0;
	for_each_possible_cpu(cpu) {
		const struct trapvec_counts *c = per_cpu_ptr(e->counts, cpu);

		*hits += READ_ONCE(c->hits);
		*missed += READ_ONCE(c->missed);
	}
}

/* DISPATCH_ADD's and DISPATCH_REPLACE's checks of one entry, table aside: 0 or an errno. */
static int trapvec_entry_check(const struct trapvec_dispatch_entry *d)
{
	if (!trapvec_site_plausible(d->site)) {
		pr_debug("dispatch: site %llx is not kernel or module text\n", d->site);
		return -EINVAL;
	}
	if (!trapvec_arena_in_sealed_code(d->dest)) {
		pr_debug("dispatch: dest %llx of site %llx is not in a sealed code block\n",
			 d->dest, d->site);
		return -EFAULT;
	}
	if (d->handler && !trapvec_arena_in_sealed_code(d->handler) &&
	    !trapvec_returns_is_entry(d->handler) && !trapvec_keys_is_entry(d->handler)) {
		pr_debug("dispatch: handler %llx of site %llx is not in a sealed code block\n",
			 d->handler, d->site);
		return -EFAULT;
	}
	if ((d->only.match & ~TRAPVEC_MATCH_ALL) || d->only.pad ||
	    (d->only.match && !trapvec_arena_in_sealed_code(d->only.skip))) {
		pr_debug("dispatch: predicate of site %llx: match %x, skip %llx\n",
			 d->site, d->only.match, d->only.skip);
		return -EINVAL;
	}
	return 0;
}

/*
 * New, unlinked table entries for entries[] (an array of count of them, to be freed by the
 * caller), their counters starting from start[] when given (on one CPU: only the sum is
 * read); NULL when memory runs out, with nothing left allocated.
 */
static struct trapvec_site **trapvec_sites_made(const struct trapvec_dispatch_entry *entries,
						u32 count, const struct trapvec_hits *start)
{
	struct trapvec_site **made;
	u32 i;

	made = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, sizeof(*made), GFP_KERNEL | __GFP_ZERO);
	if (!made)
		return NULL;
	for (i = 0; i < count; i++) {
		made[i] = trapvec_site_alloc();
		if (!made[i])
			goto out_nomem;
		made[i]->site = entries[i].site;
		made[i]->dest = entries[i].dest;
		made[i]->handler = (trapvec_handler_t *)(unsigned long)entries[i].handler;
		made[i]->cookie = (void *)(unsigned long)entries[i].cookie;
		made[i]->only = entries[i].only;
		if (start) {
			struct trapvec_counts *c =
				per_cpu_ptr(made[i]->counts, cpumask_first(cpu_possible_mask));

			c->hits = start[i].hits;
			c->missed = start[i].missed;
		}
		cond_resched();
	}
	return made;

out_nomem:
	while (i--)
		trapvec_site_free(made[i]);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, made, count * sizeof(*made));
	return NULL;
}

int trapvec_dispatch_add(const struct trapvec_dispatch_entry *entries, u32 count,
			 u32 *failed_index)
{
	struct trapvec_site **made;
	u32 i, repeat;
	int ret = 0;

	lockdep_assert_held(&trapvec_mutex);
	*failed_index = TRAPVEC_NO_INDEX;

	ret = trapvec_first_repeat(&entries[0].site, sizeof(*entries), count, &repeat);
	if (ret)
		return ret;
	/* Check everything first: the batch goes in whole or not at all. */
	for (i = 0; i < count; i++) {
		ret = trapvec_entry_check(&entries[i]);
		if (!ret && (trapvec_lookup_locked(entries[i].site) || i == repeat))
			ret = -EEXIST;
		if (ret) {
			*failed_index = i;
			return ret;
		}
		cond_resched();
	}

	made = trapvec_sites_made(entries, count, NULL);
	if (!made)
		return -ENOMEM;
	/* Publish: hash_add_rcu() orders each entry's initialisation before its link. */
	for (i = 0; i < count; i++)
		hash_add_rcu(trapvec_sites, &made[i]->node, made[i]->site);
	trapvec_site_count += count;
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, made, count * sizeof(*made));
	return 0;
}

/*
 * DISPATCH_REPLACE: each site's entry swapped for a new one by hlist_replace_rcu(), so a
 * trap at the site (whose bytes do not change) meets the old entry or the new. The old
 * entries' counters are final once no CPU can be in the dispatcher with them (interrupts-off
 * readers: synchronize_rcu()); they are read into counts[], then the entries are freed. A CPU
 * the old entry already sent to its destination runs on there: its code blocks are the
 * caller's to retire (QUIESCE), as after DISPATCH_REMOVE.
 */
int trapvec_dispatch_replace(const struct trapvec_dispatch_entry *entries,
			     struct trapvec_hits *counts, u32 count, u32 *failed_index)
{
	struct trapvec_site **made, **old;
	u32 i, repeat;
	int ret;

	lockdep_assert_held(&trapvec_mutex);
	*failed_index = TRAPVEC_NO_INDEX;

	ret = trapvec_first_repeat(&entries[0].site, sizeof(*entries), count, &repeat);
	if (ret)
		return ret;
	old = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, sizeof(*old), GFP_KERNEL | __GFP_ZERO);
	if (!old)
		return -ENOMEM;
	for (i = 0; i < count; i++) {
		ret = trapvec_entry_check(&entries[i]);
		if (!ret && i == repeat)
			ret = -EEXIST;
		if (!ret) {
			old[i] = trapvec_lookup_locked(entries[i].site);
			ret = old[i] ? 0 : -ENOENT;
		}
		if (ret) {
			pr_debug("dispatch: cannot replace site %llx: %d\n", entries[i].site, ret);
			*failed_index = i;
			goto out;
		}
		cond_resched();
	}
	made = trapvec_sites_made(entries, count, counts);
	if (!made) {
		ret = -ENOMEM;
		goto out;
	}
	/* hlist_replace_rcu() orders each new entry's initialisation before its link. */
	for (i = 0; i < count; i++)
		hlist_replace_rcu(&old[i]->node, &made[i]->node);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, made, count * sizeof(*made));
	synchronize_rcu();
	for (i = 0; i < count; i++) {
		counts[i].site = old[i]->site;
		trapvec_sum(old[i], &counts[i].hits, &counts[i].missed);
		trapvec_site_free(old[i]);
	}
out:
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, old, count * sizeof(*old));
	return ret;
}

/*
 * DISPATCH_REMOVE. An entry whose trap is still written (a live patch of ours begins with it)
 * stays: a trap taken there would find no entry and be chained to the spurious-interrupt
 * handler, which returns behind the trap and skips the displaced instructions. -EBUSY.
 */
int trapvec_dispatch_remove(const u64 *sites, u32 count, u32 *failed_index)
{
	struct trapvec_site **gone;
	u32 i, repeat;
	int ret;

	lockdep_assert_held(&trapvec_mutex);
	*failed_index = TRAPVEC_NO_INDEX;

	ret = trapvec_first_repeat(sites, sizeof(*sites), count, &repeat);
	if (ret)
		return ret;
	gone = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, sizeof(*gone), GFP_KERNEL | __GFP_ZERO);
	if (!gone)
		return -ENOMEM;
	for (i = 0; i < count; i++) {
		gone[i] = i == repeat ? NULL : trapvec_lookup_locked(sites[i]);	/* named twice */
		ret = gone[i] ? 0 : -ENOENT;
		if (!ret && trapvec_text_trap_live(sites[i]))
			ret = -EBUSY;
		if (ret) {
			pr_debug("dispatch: cannot remove site %llx: %d\n", sites[i], ret);
			*failed_index = i;
			trapvec_kvfree(TRAPVEC_MEM_SCRATCH, gone, count * sizeof(*gone));
			return ret;
		}
		cond_resched();
	}
	/*
	 * Gone first, unlinked a grace period later: a CPU that trapped at one of the sites
	 * before its revert is still an RCU-sched reader and finds the entry (see
	 * trapvec_dispatch()), which sends it back to the original instruction.
	 */
	for (i = 0; i < count; i++)
		WRITE_ONCE(gone[i]->gone, true);
	synchronize_rcu();
	for (i = 0; i < count; i++)
		hash_del_rcu(&gone[i]->node);
	trapvec_site_count -= count;
	/* No CPU is still in the dispatcher with one of them (interrupts-off readers). */
	synchronize_rcu();
	for (i = 0; i < count; i++)
		trapvec_site_free(gone[i]);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, gone, count * sizeof(*gone));
	return 0;
}

int trapvec_dispatch_hits(struct trapvec_hits *h)
{
	struct trapvec_site *e;

	lockdep_assert_held(&trapvec_mutex);
	e = trapvec_lookup_locked(h->site);
	if (!e)
		return -ENOENT;
	trapvec_sum(e, &h->hits, &h->missed);
	return 0;
}

static int trapvec_cmp_site(const void *a, const void *b)
{
	const struct trapvec_list_entry *x = a, *y = b;

	return x->site < y->site ? -1 : x->site > y->site;
}

/* LIST: entries [start, start + capacity) of the table in site order; count: all of them. */
int trapvec_dispatch_list(struct trapvec_list_entry *out, u64 start, u32 capacity, u32 *count)
{
	struct trapvec_list_entry *all;
	struct trapvec_site *e;
	unsigned int bkt;
	u32 n = 0;

	lockdep_assert_held(&trapvec_mutex);
	*count = trapvec_site_count;
	if (!trapvec_site_count || start >= trapvec_site_count)
		return 0;
	all = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, trapvec_site_count, sizeof(*all),
			       GFP_KERNEL | __GFP_ZERO);
	if (!all)
		return -ENOMEM;
	hash_for_each(trapvec_sites, bkt, e, node) {
		all[n].site = e->site;
		all[n].dest = e->dest;
		all[n].handler = (unsigned long)e->handler;
		all[n].cookie = (unsigned long)e->cookie;
		all[n].only = e->only;
		trapvec_sum(e, &all[n].hits, &all[n].missed);
		n++;
		if (!(n % 1024))
			cond_resched();
	}
	sort(all, n, sizeof(*all), trapvec_cmp_site, NULL);
	memcpy(out, all + start, min_t(u64, n - start, capacity) * sizeof(*all));
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, all, *count * sizeof(*all));
	return 0;
}

/*
 * FREE's check: the site of a dispatch entry that sends CPUs (dest, only.skip) or calls
 * (handler) into [start, end), or 0 (no site is 0: sites are kernel text).
 */
unsigned long trapvec_dispatch_targets(unsigned long start, unsigned long end)
{
	struct trapvec_site *e;
	unsigned int bkt;

	lockdep_assert_held(&trapvec_mutex);
	hash_for_each(trapvec_sites, bkt, e, node) {
		unsigned long h = (unsigned long)e->handler;
		unsigned long k = e->only.match ? e->only.skip : 0;

		if ((e->dest >= start && e->dest < end) || (h >= start && h < end) ||
		    (k >= start && k < end))
			return e->site;
	}
	return 0;
}

/*
 * The site of a dispatch entry whose handler is handler with a cookie naming slot in its low
 * 32 bits (the entry half of a return point or a keyed count), or 0: to name a patch in a
 * message.
 */
unsigned long trapvec_dispatch_site_calling(unsigned long handler, u32 slot)
{
	struct trapvec_site *e;
	unsigned int bkt;

	lockdep_assert_held(&trapvec_mutex);
	hash_for_each(trapvec_sites, bkt, e, node)
		if ((unsigned long)e->handler == handler && (u32)(unsigned long)e->cookie == slot)
			return e->site;
	return 0;
}

/* Unload: the text is reverted and the gate restored; no CPU can reach an entry. */
void trapvec_dispatch_clear(void)
{
	struct trapvec_site *e;
	struct hlist_node *tmp;
	unsigned int bkt;

	lockdep_assert_held(&trapvec_mutex);
	hash_for_each_safe(trapvec_sites, bkt, tmp, e, node) {
		hash_del_rcu(&e->node);
		trapvec_site_free(e);
	}
	trapvec_site_count = 0;
}

u64 trapvec_dispatch_count(void)
{
	return trapvec_site_count;
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
