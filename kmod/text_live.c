// SPDX-License-Identifier: GPL-2.0
/*
 * The records of live patches (trapvec_live) and of reverted ones whose module reference waits
 * for quiescence (trapvec_parked), and what other files ask of them.
 *
 * A live patch of module text holds a reference on that module, and keeps it after its
 * revert until the next QUIESCE (or unload) has waited for quiescence: a task may still be
 * in a trampoline that jumps back into that text, or asleep in a replacement that returns
 * into it (the patched function's caller, or the original trampoline's jump back). The
 * records of reverted patches of module text wait on trapvec_parked until then.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/list.h>
#include <linux/module.h>
#include <linux/rculist.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

LIST_HEAD(trapvec_live);
u64 trapvec_live_count;
/* Reverted patches of module text whose module reference waits for quiescence. */
static LIST_HEAD(trapvec_parked);

/*
 * Off the blacklist: readers walk it under RCU (within_kprobe_blacklist()), so the entry is
 * freed after a grace period, as kprobe_remove_area_blacklist() does.
 */
void trapvec_live_unlist(struct trapvec_live_patch *r)
{
	lockdep_assert_held(trapvec_ksyms.kprobe_mutex);
	if (r->bl_listed)
		list_del_rcu(&r->bl->entry.list);
	r->bl_listed = false;
	trapvec_mem_put(TRAPVEC_MEM_PATCH, sizeof(*r->bl));
	kfree_rcu(r->bl, rcu);
	r->bl = NULL;
}

void trapvec_live_free(struct trapvec_live_patch *r)
{
	trapvec_vunmap(TRAPVEC_MEM_ALIAS, r->vm, r->vm_pages);
	if (r->mod)
		module_put(r->mod);
	/* Never listed (a batch that failed): nobody can have seen it. */
	trapvec_kvfree(TRAPVEC_MEM_PATCH, r->bl, sizeof(*r->bl));
	trapvec_kvfree(TRAPVEC_MEM_PATCH, r, sizeof(*r));
}

/*
 * A reverted patch, off the live list and the blacklist: free it, but keep its module
 * reference (if any) on trapvec_parked until trapvec_text_put_parked().
 */
void trapvec_live_retire(struct trapvec_live_patch *r)
{
	if (!r->mod) {
		trapvec_live_free(r);
		return;
	}
	trapvec_vunmap(TRAPVEC_MEM_ALIAS, r->vm, r->vm_pages);
	r->vm = NULL;
	r->alias = NULL;
	list_add_tail(&r->node, &trapvec_parked);
}

/*
 * QUIESCE and unload, once no task can be in code that a reverted patch sent it to (the
 * grace periods and the in-flight wait): drop the module references of reverted patches.
 */
void trapvec_text_put_parked(void)
{
	struct trapvec_live_patch *r, *tmp;
	unsigned int n = 0;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry_safe(r, tmp, &trapvec_parked, node) {
		list_del(&r->node);
		trapvec_live_free(r);
		n++;
	}
	if (n)
		pr_debug("dropped the module references of %u reverted patches\n", n);
}

/*
 * Take a reference on the module owning [addr, addr + len); 0 for kernel text. A deferred
 * patch (TRAPVEC_APPLY_DEFERRED) takes none: the module stays removable, and the module
 * watch (modwatch.c) reverts the patch when it goes. A module that is still COMING takes
 * deferred patches only.
 */
int trapvec_get_owner(struct trapvec_live_patch *r, bool deferred)
{
	struct module *mod;
	int ret = 0;

	if (trapvec_core_text(r->addr, r->len))
		return 0;
	preempt_disable();
	mod = trapvec_ksyms.module_text_address(r->addr);
	if (mod && deferred)
		ret = 0;
	else if (mod && mod->state != MODULE_STATE_COMING && try_module_get(mod))
		r->mod = mod;
	else
		ret = -ENOENT;
	preempt_enable();
	return ret;
}

struct trapvec_live_patch *trapvec_find_inverse(const struct trapvec_patch *p)
{
	struct trapvec_live_patch *r;

	list_for_each_entry(r, &trapvec_live, node)
		if (r->addr == p->addr && r->len == p->len &&
		    !memcmp(r->new_bytes, p->old_bytes, p->len) &&
		    !memcmp(r->old_bytes, p->new_bytes, p->len))
			return r;
	return NULL;
}

bool trapvec_text_overlaps_live(unsigned long addr, unsigned long len)
{
	struct trapvec_live_patch *r;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		if (trapvec_overlap(addr, len, r->addr, r->len))
			return true;
	return false;
}

/* The text as it was before any live patch of ours: current bytes, our patches undone. */
int trapvec_text_read_original(unsigned long addr, u8 *buf, size_t len)
{
	struct trapvec_live_patch *r;
	size_t i;

	lockdep_assert_held(&trapvec_mutex);
	if (copy_from_kernel_nofault(buf, (void *)addr, len))
		return -EFAULT;
	list_for_each_entry(r, &trapvec_live, node) {
		if (!trapvec_overlap(addr, len, r->addr, r->len))
			continue;
		for (i = 0; i < r->len; i++)
			if (r->addr + i >= addr && r->addr + i < addr + len)
				buf[r->addr + i - addr] = r->old_bytes[i];
	}
	return 0;
}

/* Is a live patch of ours writing the trap at site (its dispatch entry is in use)? */
bool trapvec_text_trap_live(unsigned long site)
{
	struct trapvec_live_patch *r;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		if (r->addr == site && r->len >= TRAPVEC_TRAP_LEN && r->new_bytes[0] == 0xcd)
			return true;
	return false;
}

u64 trapvec_text_live_count(void)
{
	return trapvec_live_count;
}

/*
 * FREE's check (arena.c): the site of a live jmp patch whose jmp lands in [start, end), or 0.
 * A springboard's jmp rel32 counts too: the jmp rel8 in front of it enters the arena through it.
 */
unsigned long trapvec_text_jmp_into(unsigned long start, unsigned long end)
{
	struct trapvec_live_patch *r;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		if (r->jmp && r->dest >= start && r->dest < end)
			return r->addr;
	return 0;
}
