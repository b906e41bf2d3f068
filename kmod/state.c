// SPDX-License-Identifier: GPL-2.0
/*
 * The state blob: opaque bytes user space keeps here between two runs of a one-shot tool.
 *
 * trapctl runs once per command, but what it makes (components in the arena, dispatch
 * entries, live patches) outlives it. It records its own bookkeeping of those here, so that
 * the next trapctl knows what is loaded and spliced. The module never interprets the blob:
 * what it says is checked by user space against what the module reports (dispatch entries,
 * the bytes at every site). Keeping the blob in the module, not in a file, ties it to this
 * instance: rmmod reverts every patch and drops the blob with them, so a blob can never
 * describe a previous instance.
 *
 * Concurrent writers are detected, not serialized: every PUT names the generation it read
 * with GET and fails with -ESTALE if another PUT came in between (trapctl also holds
 * flock(LOCK_EX) on /dev/trapvec for a whole command, so two trapctls do not race at all).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "trapvec_internal.h"

/* Guards the three below. Taken alone, never with trapvec_mutex. */
static DEFINE_MUTEX(trapvec_state_mutex);
static void *trapvec_state_blob;	/* kvmalloc'd, NULL when empty */
static u64 trapvec_state_size;
static u64 trapvec_state_generation;

int trapvec_state_get(struct trapvec_state *req)
{
	int ret = 0;

	mutex_lock(&trapvec_state_mutex);
	req->size = trapvec_state_size;
	req->generation = trapvec_state_generation;
	if (trapvec_state_size > req->len)
		ret = -ENOSPC;
	else if (trapvec_state_size &&
		 copy_to_user(u64_to_user_ptr(req->buf), trapvec_state_blob, trapvec_state_size))
		ret = -EFAULT;
	mutex_unlock(&trapvec_state_mutex);
	return ret;
}

int trapvec_state_put(struct trapvec_state *req)
{
	void *blob = NULL, *old;
	u64 old_size;
	int ret = 0;

	if (req->len > TRAPVEC_STATE_MAX)
		return -E2BIG;
	/*
	 * Copy outside the lock: a large blob faults its pages in. A blob may be hundreds of MiB
	 * (200,000 splices): fail the PUT rather than wake the OOM killer for it.
	 */
	if (req->len) {
		blob = trapvec_kvmalloc(TRAPVEC_MEM_STATE, 1, req->len,
					GFP_KERNEL | __GFP_RETRY_MAYFAIL | __GFP_NOWARN);
		if (!blob)
			return -ENOMEM;
		if (copy_from_user(blob, u64_to_user_ptr(req->buf), req->len)) {
			trapvec_kvfree(TRAPVEC_MEM_STATE, blob, req->len);
			return -EFAULT;
		}
	}
	mutex_lock(&trapvec_state_mutex);
	if (req->generation != trapvec_state_generation) {
		req->generation = trapvec_state_generation;
		old = blob;
		old_size = req->len;
		ret = -ESTALE;
	} else {
		old = trapvec_state_blob;
		old_size = trapvec_state_size;
		trapvec_state_blob = blob;
		trapvec_state_size = req->len;
		req->generation = ++trapvec_state_generation;
	}
	mutex_unlock(&trapvec_state_mutex);
	trapvec_kvfree(TRAPVEC_MEM_STATE, old, old_size);
	return ret;
}

/* Module exit: nothing can call the ioctls any more. */
void trapvec_state_exit(void)
{
	trapvec_kvfree(TRAPVEC_MEM_STATE, trapvec_state_blob, trapvec_state_size);
	trapvec_state_blob = NULL;
	trapvec_state_size = 0;
}
