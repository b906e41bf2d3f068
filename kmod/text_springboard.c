// SPDX-License-Identifier: GPL-2.0
/*
 * Springboards: a jmp (rel8) that lands on another patch of ours (a jmp rel32 in padding).
 * Why their reverts wait, see "Removal" in text.c and trapvec_link_springboards() below.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bsearch.h>
#include <linux/list.h>
#include <linux/sort.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

/* The live record (or new one of the batch) whose first byte is addr; NULL if none. */
static struct trapvec_live_patch *trapvec_rec_at(unsigned long addr,
						 const struct trapvec_batch_index *batch)
{
	struct trapvec_live_patch *r = trapvec_live_at(addr);

	if (r)
		return r;
	r = trapvec_batch_overlap(batch, addr, 1);
	return r && r->addr == addr ? r : NULL;
}

/* By dest: the new jmps of a batch (trapvec_jmp_onto()). */
struct trapvec_by_dest {
	unsigned long dest;
	struct trapvec_live_patch *rec;
};

static int trapvec_cmp_dest(const void *a, const void *b)
{
	const struct trapvec_by_dest *x = a, *y = b;

	return x->dest < y->dest ? -1 : x->dest > y->dest;
}

/*
 * A live jmp (or new one of the batch, sorted by dest in jmps[0..njmps)) that lands on addr;
 * NULL if none.
 */
static struct trapvec_live_patch *trapvec_jmp_onto(unsigned long addr,
						   const struct trapvec_by_dest *jmps, u32 njmps)
{
	struct trapvec_by_dest key = { .dest = addr };
	const struct trapvec_by_dest *found;
	struct trapvec_live_patch *r = trapvec_live_jmp_onto(addr);

	if (r)
		return r;
	found = bsearch(&key, jmps, njmps, sizeof(*jmps), trapvec_cmp_dest);
	return found ? found->rec : NULL;
}

/*
 * Springboards: a jmp (rel8) that lands on another patch of ours (a jmp rel32 in padding).
 * A task may be preempted on the springboard's first byte, having taken the jmp to it: the
 * springboard may only be reverted after every patch that lands on it, and an RCU-tasks grace
 * period later (its original bytes are padding, not code to resume in). So the revert of a
 * patch that a jmp has ever landed on is deferred, and refused while some of its jumpers
 * stay; a new jmp may not land on a patch this batch reverts. 0 or the ioctl's errno.
 */
int trapvec_link_springboards(struct trapvec_text_op *ops, u32 n,
			      const struct trapvec_batch_index *batch, struct trapvec_apply *req)
{
	struct trapvec_by_dest *jmps = NULL;
	struct trapvec_live_patch *r, *to;
	u32 i, njmps = 0, landing = 0;
	int ret = 0;

	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (ops[i].undo || !r->j)
			continue;
		to = trapvec_rec_at(r->j->dest, batch);
		/* A live record this batch reverts is marked with its serial (text.c). */
		if (to && to->undo_batch == batch->serial) {
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = to->addr;
			return -EBUSY;
		}
		r->j->lands_on = to;
		landing += !!to;
	}
	/*
	 * One hop at most: a new jmp may land on a patch only if that patch does not land on
	 * one itself, and not while a jmp lands on the new one's own site. A springboard jumps
	 * into the arena; a chain of patches could close into a cycle (A lands on B, B on A,
	 * also when A went in before B existed), which the die notifier would follow from CC to
	 * CC without end while both are pending, and the finished text for ever.
	 */
	if (landing) {
		/* The batch's new jmps by dest, for trapvec_jmp_onto(): one sort, not a scan each. */
		jmps = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, n, sizeof(*jmps), GFP_KERNEL);
		if (!jmps)
			return -ENOMEM;
		for (i = 0; i < n; i++) {
			if (!ops[i].undo && ops[i].rec->j) {
				jmps[njmps].dest = ops[i].rec->j->dest;
				jmps[njmps].rec = ops[i].rec;
				njmps++;
			}
		}
		sort(jmps, njmps, sizeof(*jmps), trapvec_cmp_dest, NULL);
	}
	for (i = 0; landing && i < n; i++) {
		r = ops[i].rec;
		if (ops[i].undo || !trapvec_rec_lands_on(r))
			continue;
		to = r->j->lands_on->j ? trapvec_rec_at(r->j->lands_on->j->dest, batch) : NULL;
		if (to) {
			pr_debug("jmp at %pS lands on the patch at %pS, which lands on %pS\n",
				 (void *)r->addr, (void *)r->j->lands_on->addr, (void *)to->addr);
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = r->j->lands_on->addr;
			ret = -EBUSY;
			goto out;
		}
		to = trapvec_jmp_onto(r->addr, jmps, njmps);
		if (to) {
			pr_debug("jmp at %pS lands on the patch at %pS, and the jmp at %pS on it\n",
				 (void *)r->addr, (void *)r->j->lands_on->addr, (void *)to->addr);
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = to->addr;
			ret = -EBUSY;
			goto out;
		}
	}
	/*
	 * How many of each reverted springboard's jumpers this batch reverts too: counted in one
	 * pass, not one per revert (leaving is read of the reverted records only, reset here).
	 */
	for (i = 0; i < n; i++)
		if (ops[i].undo)
			ops[i].rec->leaving = 0;
	for (i = 0; i < n; i++)
		if (ops[i].undo && trapvec_rec_lands_on(ops[i].rec))
			trapvec_rec_lands_on(ops[i].rec)->leaving++;
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (!ops[i].undo || !r->springboard)
			continue;
		if (r->leaving != r->jumpers) {
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			list_for_each_entry(to, &trapvec_live, node)
				if (trapvec_rec_lands_on(to) == r)
					req->culprit = to->addr;
			ret = -EBUSY;
			goto out;
		}
		ops[i].deferred = true;
	}
out:
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, jmps, n * sizeof(*jmps));
	return ret;
}
