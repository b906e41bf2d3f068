// SPDX-License-Identifier: GPL-2.0
/*
 * CHECK_MANY: CHECK (with TRAPVEC_CHECK_NO_KPROBE) of a whole array of windows in one ioctl.
 *
 * A planner checks every window it means to patch, thousands of them in a few hundred
 * functions (trapctl cover). One CHECK per window paid a round trip, kprobe_mutex, a kallsyms
 * lookup, a scratch allocation, and the read and decode of the function from its start up to
 * the window: quadratic in the function when every basic block is checked. Here the locks are
 * taken once, the windows are visited in address order (the caller's order is any), and the
 * windows that fall in one kallsyms symbol share one read of its original text and one decode
 * from its start (trapvec_fn_load(), check.c), walking forward.
 *
 * Each window gets the verdict CHECK gives it: the same checks in the same order
 * (trapvec_check_site_early(), then the symbol, CROSSES_SYMBOL, and the boundary verdict of
 * trapvec_fn_check_window(), which CHECK's own trapvec_check_boundary() uses too). Nothing
 * changes between two windows: trapvec_mutex and kprobe_mutex are held throughout, so the live
 * patches and the kprobes are those every window is checked against. The kprobe cross-check
 * (a disabled kprobe registered per window, milliseconds each) is not made: every entry must
 * say TRAPVEC_CHECK_NO_KPROBE, or the ioctl fails with -EINVAL, so that no caller believes it
 * was.
 *
 * APPLY (text.c) gets the boundary verdicts of its whole batch the same way, before its loop
 * over the patches (trapvec_check_boundaries()).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kallsyms.h>
#include <linux/sched.h>
#include <linux/sort.h>

#include "trapvec_internal.h"

/* One window of the batch, in the order it is visited. */
struct trapvec_check_at {
	u64 addr;
	u32 len;
	u32 index;		/* in the caller's array */
	u32 wanted;		/* to be checked (APPLY: not a revert) */
	u32 boundary;		/* passed the early checks: its symbol decides */
	struct trapvec_boundary v;	/* out: the verdict of a wanted window (zeroed before) */
};

static int trapvec_check_at_cmp(const void *a, const void *b)
{
	const struct trapvec_check_at *x = a, *y = b;

	if (x->addr != y->addr)
		return x->addr < y->addr ? -1 : 1;
	return x->index < y->index ? -1 : x->index > y->index;
}

/*
 * Windows at[0..n) lie in the symbol [start, start + size): load its text through the
 * furthest end of those that reach the boundary check, and give each its verdict. 0 or -ENOMEM.
 */
static int trapvec_check_symbol(struct trapvec_check_at *at, u32 n, unsigned long start,
				unsigned long size)
{
	u32 i, reason = TRAPVEC_REASON_NONE;
	unsigned long limit = 0;
	struct trapvec_fn f;
	int ret;

	for (i = 0; i < n; i++) {
		if (!at[i].boundary)
			continue;
		if (at[i].addr - start + at[i].len > size) {
			at[i].v.reason = TRAPVEC_REASON_CROSSES_SYMBOL;
			continue;
		}
		limit = max_t(unsigned long, limit, at[i].addr - start + at[i].len);
	}
	if (!limit)
		return 0;
	ret = trapvec_fn_load(&f, start, size, limit);
	if (ret == -EFAULT)
		reason = TRAPVEC_REASON_NOT_TEXT;
	else if (ret)
		goto out;
	for (i = 0; i < n; i++)
		if (at[i].boundary && !at[i].v.reason)
			at[i].v.reason = reason ?: trapvec_fn_check_window(&f, at[i].addr, at[i].len,
									   &at[i].v.insns);
	ret = 0;
out:
	if (f.text)
		trapvec_fn_free(&f);
	return ret;
}

/* The early checks of at[i] (trapvec_check_site_early()): its verdict, if any, is final. */
static void trapvec_check_at_early(struct trapvec_check_at *at)
{
	if (!at->wanted)
		return;
	at->v.reason = trapvec_check_site_early(at->addr, at->len, &at->v.culprit);
	at->boundary = !at->v.reason;
}

/*
 * Visit at[0..count) by address. Each window with wanted set first gets the early checks, as
 * CHECK and APPLY give them; only a window that passes them (boundary) goes to its symbol, so
 * nothing the early checks refuse (data, another module's text, a user address) is ever read
 * or decoded: a random address in a data symbol of megabytes once cost APPLY seconds. Then a
 * symbol's windows get their boundary verdicts together (v). Under trapvec_mutex and
 * kprobe_mutex. 0 or -ENOMEM.
 */
static int trapvec_check_sorted(struct trapvec_check_at *at, u32 count)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long size, offset, start;
	u32 i, j;
	int ret;

	lockdep_assert_held(&trapvec_mutex);
	lockdep_assert_held(k->kprobe_mutex);
	sort(at, count, sizeof(*at), trapvec_check_at_cmp, NULL);
	for (i = 0; i < count; i = j) {
		j = i + 1;
		trapvec_check_at_early(&at[i]);
		if (!at[i].boundary)
			continue;
		if (!k->kallsyms_lookup_size_offset(at[i].addr, &size, &offset)) {
			at[i].v.reason = TRAPVEC_REASON_NOT_BOUNDARY;
			continue;
		}
		/*
		 * The windows after it in the same symbol: kallsyms sizes run to the next
		 * symbol, so every address below start + size looks the same symbol up.
		 */
		start = at[i].addr - offset;
		for (; j < count && at[j].addr < start + size; j++) {
			trapvec_check_at_early(&at[j]);
			cond_resched();
		}
		ret = trapvec_check_symbol(at + i, j - i, start, size);
		if (ret)
			return ret;
		/* Up to TRAPVEC_BATCH_MAX windows: let others run between two (soft lockups). */
		cond_resched();
	}
	return 0;
}

/*
 * CHECK_MANY: answer checks[0..count) in place (reason, error 0, culprit), their flags already
 * checked. Under trapvec_mutex. 0, or -ENOMEM (the answers are then not to be read).
 */
int trapvec_check_many(struct trapvec_check *checks, u32 count)
{
	struct mutex *kprobe_mutex = trapvec_ksyms.kprobe_mutex;
	struct trapvec_check_at *at;
	int ret;
	u32 i;

	lockdep_assert_held(&trapvec_mutex);
	if (!count)
		return 0;
	at = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, sizeof(*at), GFP_KERNEL | __GFP_ZERO);
	if (!at)
		return -ENOMEM;
	for (i = 0; i < count; i++) {
		at[i].addr = checks[i].addr;
		at[i].len = checks[i].len;
		at[i].index = i;
		at[i].wanted = 1;
	}
	mutex_lock(kprobe_mutex);
	ret = trapvec_check_sorted(at, count);
	mutex_unlock(kprobe_mutex);
	for (i = 0; !ret && i < count; i++) {
		struct trapvec_check *c = &checks[at[i].index];

		c->error = 0;
		c->reason = at[i].v.reason;
		c->culprit = at[i].v.culprit;
	}
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, at, count * sizeof(*at));
	return ret;
}

/*
 * APPLY's site verdicts (text.c), before its loop over the batch: out[i] is what
 * trapvec_check_site_insns() says of patches[i] (reason, culprit, and the instructions its
 * window overlaps), for every patch that is not a revert (revert(): the loop skips the site
 * checks of those), each symbol read and decoded once. Nothing
 * the loop does changes them: it writes no text and makes no live record before its checks
 * are done, and kprobe_mutex is held across. The caller frees *out (n entries). 0 or -ENOMEM.
 */
int trapvec_check_boundaries(const struct trapvec_patch *patches, u32 n,
			     bool (*revert)(const struct trapvec_patch *p),
			     struct trapvec_boundary **out)
{
	struct trapvec_check_at *at;
	struct trapvec_boundary *v;
	u32 i, need = 0;
	int ret;

	*out = NULL;
	v = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, n, sizeof(*v), GFP_KERNEL | __GFP_ZERO);
	at = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, n, sizeof(*at), GFP_KERNEL | __GFP_ZERO);
	ret = -ENOMEM;
	if (!v || !at)
		goto out;
	for (i = 0; i < n; i++) {
		at[i].addr = patches[i].addr;
		at[i].len = patches[i].len;
		at[i].index = i;
		at[i].wanted = !revert(&patches[i]);
		need += at[i].wanted;
	}
	/* A batch of reverts only (a removal) has nothing to check. */
	ret = need ? trapvec_check_sorted(at, n) : 0;
	if (ret)
		goto out;
	for (i = 0; i < n; i++)
		v[at[i].index] = at[i].v;
	*out = v;
	v = NULL;
out:
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, at, n * sizeof(*at));
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, v, n * sizeof(*v));
	return ret;
}
