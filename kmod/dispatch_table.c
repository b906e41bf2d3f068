// SPDX-License-Identifier: GPL-2.0
/*
 * The dispatch table's writers, under trapvec_mutex: DISPATCH_ADD, DISPATCH_REPLACE,
 * DISPATCH_REMOVE, HITS, LIST, and what other files ask of the table. The readers (the trap
 * path) and the rules they follow are in dispatch.c: an entry is freed after synchronize_rcu().
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
#include "trapvec_arena.h"

/* Dispatch entries, 56 bytes each (trapvec_dispatch.h); created at load, destroyed at unload. */
static struct kmem_cache *trapvec_site_cache;

int trapvec_dispatch_init(void)
{
	/* A count site's entry: what trapctl list --stats and kmod/README.md promise. */
	BUILD_BUG_ON(sizeof(struct trapvec_site) > 56);
	trapvec_site_cache = KMEM_CACHE(trapvec_site, 0);
	return trapvec_site_cache ? 0 : -ENOMEM;
}

/* Unload, after trapvec_dispatch_clear(): every entry is freed. */
void trapvec_dispatch_exit(void)
{
	kmem_cache_destroy(trapvec_site_cache);
	trapvec_site_cache = NULL;
}

/*
 * The per-CPU counters of an entry count as a second object of its kind: hits and missed when
 * it has a side record, hits alone otherwise.
 */
static size_t trapvec_counts_bytes(bool call)
{
	return (call ? sizeof(struct trapvec_counts) : sizeof(u64)) * num_possible_cpus();
}

/*
 * A new entry, zeroed, with a side record (zeroed) if call: NULL when memory runs out, with
 * nothing left allocated.
 */
static struct trapvec_site *trapvec_site_alloc(bool call)
{
	struct trapvec_site *e;

	e = kmem_cache_zalloc(trapvec_site_cache, GFP_KERNEL);
	if (!e)
		return NULL;
	trapvec_mem_got(TRAPVEC_MEM_ENTRY, sizeof(*e));
	if (call) {
		e->call = trapvec_kvmalloc(TRAPVEC_MEM_ENTRY, 1, sizeof(*e->call),
					   GFP_KERNEL | __GFP_ZERO);
		if (!e->call)
			goto out_entry;
		e->counts = alloc_percpu(struct trapvec_counts);
	} else {
		/* hits alone: the only field a call-less entry touches is the first */
		e->counts = (struct trapvec_counts __percpu *)__alloc_percpu(sizeof(u64),
									      __alignof__(u64));
	}
	if (!e->counts)
		goto out_call;
	trapvec_mem_got(TRAPVEC_MEM_ENTRY, trapvec_counts_bytes(call));
	return e;

out_call:
	if (e->call)
		trapvec_kvfree(TRAPVEC_MEM_ENTRY, e->call, sizeof(*e->call));
out_entry:
	trapvec_mem_put(TRAPVEC_MEM_ENTRY, sizeof(*e));
	kmem_cache_free(trapvec_site_cache, e);
	return NULL;
}

/*
 * The code blocks e sends CPUs into (destination, handler, skip target) are pinned while e
 * exists: FREE of one is refused without walking the table (arena.c).
 */
static void trapvec_site_pin(const struct trapvec_site *e, int delta)
{
	trapvec_arena_pin(e->dest, delta);
	if (!e->call)
		return;
	if (e->call->handler)
		trapvec_arena_pin((unsigned long)e->call->handler, delta);
	if (e->call->only.match)
		trapvec_arena_pin(e->call->only.skip, delta);
}

static void trapvec_site_free(struct trapvec_site *e)
{
	bool call = e->call;

	trapvec_site_pin(e, -1);
	free_percpu(e->counts);
	trapvec_mem_put(TRAPVEC_MEM_ENTRY, trapvec_counts_bytes(call));
	if (call)
		trapvec_kvfree(TRAPVEC_MEM_ENTRY, e->call, sizeof(*e->call));
	trapvec_mem_put(TRAPVEC_MEM_ENTRY, sizeof(*e));
	kmem_cache_free(trapvec_site_cache, e);
}

/* The entry's handler, cookie and predicate as DISPATCH_ADD took them (zeros for none). */
static void trapvec_site_call_of(const struct trapvec_site *e, u64 *handler, u64 *cookie,
				 struct trapvec_task_match *only)
{
	if (e->call) {
		*handler = (unsigned long)e->call->handler;
		*cookie = (unsigned long)e->call->cookie;
		*only = e->call->only;
	} else {
		*handler = 0;
		*cookie = 0;
		memset(only, 0, sizeof(*only));
	}
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
		/* A call-less entry's counters are its hits alone. */
		if (e->call)
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
		const struct trapvec_dispatch_entry *d = &entries[i];
		/*
		 * A count site (no handler, cookie or predicate, no missed hits to keep) has no
		 * side record; anything else keeps what it was given, for LIST to read back.
		 */
		bool call = d->handler || d->cookie || memchr_inv(&d->only, 0, sizeof(d->only)) ||
			    (start && start[i].missed);

		made[i] = trapvec_site_alloc(call);
		if (!made[i])
			goto out_nomem;
		made[i]->site = d->site;
		made[i]->dest = d->dest;
		if (call) {
			made[i]->call->handler = (trapvec_handler_t *)(unsigned long)d->handler;
			made[i]->call->cookie = (void *)(unsigned long)d->cookie;
			made[i]->call->only = d->only;
		}
		trapvec_site_pin(made[i], 1);
		if (start) {
			struct trapvec_counts *c =
				per_cpu_ptr(made[i]->counts, cpumask_first(cpu_possible_mask));

			c->hits = start[i].hits;
			if (call)
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

/* An entry as LIST visits it: 16 bytes to sort, the entry beside its site. */
struct trapvec_list_key {
	u64 site;
	struct trapvec_site *e;
};

static int trapvec_cmp_key(const void *a, const void *b)
{
	const struct trapvec_list_key *x = a, *y = b;

	return x->site < y->site ? -1 : x->site > y->site;
}

/*
 * LIST (min_hits 0) and LIST_HIT (min_hits 1): of the entries hit at least min_hits times,
 * [start, start + capacity) in site order; *count: how many such entries there are. The
 * entries are sorted as 16-byte keys, and only the page asked for is filled in: a LIST that
 * asks how many (capacity 0) reads no entry, and a look of once-mode coverage at thousands of
 * sites, none hit since the last, copies nothing. (It sorted whole 96-byte entries, three
 * times per look with the count calls: 25-66 ms of emulated time for 9,941 sites, every
 * 100 ms.)
 */
int trapvec_dispatch_list(struct trapvec_list_entry *out, u64 start, u32 capacity, u64 min_hits,
			  u32 *count)
{
	struct trapvec_list_key *keys;
	struct trapvec_site *e;
	u64 hits, missed;
	unsigned int bkt;
	u32 n = 0, i, end;

	lockdep_assert_held(&trapvec_mutex);
	*count = trapvec_site_count;
	if (!trapvec_site_count || (!min_hits && (!capacity || start >= trapvec_site_count)))
		return 0;
	keys = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, trapvec_site_count, sizeof(*keys),
				GFP_KERNEL);
	if (!keys)
		return -ENOMEM;
	hash_for_each(trapvec_sites, bkt, e, node) {
		if (min_hits) {
			trapvec_sum(e, &hits, &missed);
			if (hits < min_hits)
				continue;
		}
		keys[n].site = e->site;
		keys[n].e = e;
		n++;
		if (!(n % 1024))
			cond_resched();
	}
	*count = n;
	if (start < n && capacity) {
		sort(keys, n, sizeof(*keys), trapvec_cmp_key, NULL);
		end = min_t(u64, n, start + capacity);
		for (i = start; i < end; i++) {
			struct trapvec_list_entry *o = &out[i - start];

			e = keys[i].e;
			memset(o, 0, sizeof(*o));
			o->site = e->site;
			o->dest = e->dest;
			trapvec_site_call_of(e, &o->handler, &o->cookie, &o->only);
			trapvec_sum(e, &o->hits, &o->missed);
			if (!((i + 1) % 1024))
				cond_resched();
		}
	}
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, keys, trapvec_site_count * sizeof(*keys));
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
		unsigned long h = e->call ? (unsigned long)e->call->handler : 0;
		unsigned long k = e->call && e->call->only.match ? e->call->only.skip : 0;

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
		if (e->call && (unsigned long)e->call->handler == handler &&
		    (u32)(unsigned long)e->call->cookie == slot)
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
