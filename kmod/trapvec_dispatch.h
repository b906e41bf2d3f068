/* SPDX-License-Identifier: GPL-2.0 */
/* The dispatch table, shared by the trap path (dispatch.c) and its writers (dispatch_table.c). */
#ifndef TRAPVEC_DISPATCH_H
#define TRAPVEC_DISPATCH_H

#include <linux/hash.h>
#include <linux/hashtable.h>

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
