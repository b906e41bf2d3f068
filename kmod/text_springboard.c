// SPDX-License-Identifier: GPL-2.0
/*
 * Springboards: a jmp (rel8) that lands on another patch of ours (a jmp rel32 in padding).
 * Why their reverts wait, see "Removal" in text.c and trapvec_link_springboards() below.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/list.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

/* The live record (or new one of ops[0..n)) whose first byte is addr; NULL if none. */
static struct trapvec_live_patch *trapvec_rec_at(unsigned long addr,
						 const struct trapvec_text_op *ops, u32 n)
{
	struct trapvec_live_patch *r;
	u32 i;

	list_for_each_entry(r, &trapvec_live, node)
		if (r->addr == addr)
			return r;
	for (i = 0; i < n; i++)
		if (ops[i].rec && ops[i].rec->addr == addr)
			return ops[i].rec;
	return NULL;
}

/* A live jmp (or new one of ops[0..n)) that lands on addr; NULL if none. */
static struct trapvec_live_patch *trapvec_jmp_onto(unsigned long addr,
						   const struct trapvec_text_op *ops, u32 n)
{
	struct trapvec_live_patch *r;
	u32 i;

	list_for_each_entry(r, &trapvec_live, node)
		if (r->jmp && r->dest == addr)
			return r;
	for (i = 0; i < n; i++)
		if (ops[i].rec && !ops[i].undo && ops[i].rec->jmp && ops[i].rec->dest == addr)
			return ops[i].rec;
	return NULL;
}

/*
 * Springboards: a jmp (rel8) that lands on another patch of ours (a jmp rel32 in padding).
 * A task may be preempted on the springboard's first byte, having taken the jmp to it: the
 * springboard may only be reverted after every patch that lands on it, and an RCU-tasks grace
 * period later (its original bytes are padding, not code to resume in). So the revert of a
 * patch that a jmp has ever landed on is deferred, and refused while some of its jumpers
 * stay; a new jmp may not land on a patch this batch reverts. 0 or the ioctl's errno.
 */
int trapvec_link_springboards(struct trapvec_text_op *ops, u32 n, struct trapvec_apply *req)
{
	struct trapvec_live_patch *r, *to;
	u32 i, j, leaving;

	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (ops[i].undo || !r->jmp)
			continue;
		to = trapvec_rec_at(r->dest, ops, n);
		for (j = 0; to && j < n; j++) {
			if (ops[j].rec == to && ops[j].undo) {
				trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
				req->culprit = to->addr;
				return -EBUSY;
			}
		}
		r->lands_on = to;
	}
	/*
	 * One hop at most: a new jmp may land on a patch only if that patch does not land on
	 * one itself, and not while a jmp lands on the new one's own site. A springboard jumps
	 * into the arena; a chain of patches could close into a cycle (A lands on B, B on A,
	 * also when A went in before B existed), which the die notifier would follow from CC to
	 * CC without end while both are pending, and the finished text for ever.
	 */
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (ops[i].undo || !r->jmp || !r->lands_on)
			continue;
		to = r->lands_on->jmp ? trapvec_rec_at(r->lands_on->dest, ops, n) : NULL;
		if (to) {
			pr_debug("jmp at %pS lands on the patch at %pS, which lands on %pS\n",
				 (void *)r->addr, (void *)r->lands_on->addr, (void *)to->addr);
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = r->lands_on->addr;
			return -EBUSY;
		}
		to = trapvec_jmp_onto(r->addr, ops, n);
		if (to) {
			pr_debug("jmp at %pS lands on the patch at %pS, and the jmp at %pS on it\n",
				 (void *)r->addr, (void *)r->lands_on->addr, (void *)to->addr);
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = to->addr;
			return -EBUSY;
		}
	}
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (!ops[i].undo || !r->springboard)
			continue;
		leaving = 0;
		for (j = 0; j < n; j++)
			leaving += ops[j].undo && ops[j].rec->lands_on == r;
		if (leaving != r->jumpers) {
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			list_for_each_entry(to, &trapvec_live, node)
				if (to->lands_on == r)
					req->culprit = to->addr;
			return -EBUSY;
		}
		ops[i].deferred = true;
	}
	return 0;
}
