/* SPDX-License-Identifier: GPL-2.0 */
/* The dispatch table, shared by the trap path (dispatch.c) and its writers (dispatch_table.c). */
#ifndef TRAPVEC_DISPATCH_H
#define TRAPVEC_DISPATCH_H

#include <linux/hash.h>
#include <linux/hashtable.h>

#include "../components/include/trapvec.h"
#include "trapvec_internal.h"

/*
 * The per-CPU counters of an entry. An entry without a handler never counts a missed hit, so
 * one without a side record (trapvec_site.call NULL) gets hits alone, 8 bytes per CPU: its
 * missed is never read or written.
 */
struct trapvec_counts {
	u64 hits;
	u64 missed;
};

/* What only an entry with a handler or a task predicate needs (trapvec_site.call). */
struct trapvec_site_call {
	trapvec_handler_t *handler;	/* NULL: none (a predicate alone) */
	void *cookie;
	/* A task predicate (match != 0): other tasks go to only.skip, uncounted. */
	struct trapvec_task_match only;
};

/*
 * A dispatch entry: 56 bytes for a count site, which the dispatcher counts and sends to its
 * replay (issue 26: a count site costs tens of bytes; it was 104), from a slab cache of its
 * own so that it takes no more than that (kmalloc would round it up to 64). A handler, its
 * cookie and a task predicate live in a side record that only the entries with one pay for.
 */
struct trapvec_site {
	struct hlist_node node;		/* in trapvec_sites, RCU */
	unsigned long site;
	unsigned long dest;
	/* struct trapvec_counts when call is set, else its hits alone (8 bytes per CPU) */
	struct trapvec_counts __percpu *counts;
	/*
	 * A handler or a task predicate, or NULL: count and go to dest. Also set (handler NULL,
	 * no predicate) when DISPATCH_REPLACE starts an entry with missed hits to keep.
	 */
	struct trapvec_site_call *call;
	/*
	 * DISPATCH_REMOVE has taken it (its trap is reverted): a trap still met here is retried
	 * at the site, and the entry is unlinked one grace period later (trapvec_dispatch()).
	 */
	bool gone;
};

/*
 * 2^16 buckets (512 KiB): the trap path walks one bucket, a few entries long at 200,000
 * sites (it was 49 with 2^12).
 */
#define TRAPVEC_SITE_BITS	16
extern struct hlist_head trapvec_sites[1 << TRAPVEC_SITE_BITS];
extern u64 trapvec_site_count;		/* under trapvec_mutex */

static __always_inline struct hlist_head *trapvec_bucket(unsigned long site)
{
	return &trapvec_sites[hash_long(site, TRAPVEC_SITE_BITS)];
}

struct trapvec_site *trapvec_lookup_locked(unsigned long site);

#endif /* TRAPVEC_DISPATCH_H */
