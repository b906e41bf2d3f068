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
#include <linux/rbtree.h>
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
	if (r->mod)
		module_put(r->mod);
	/* Never listed (a batch that failed): nobody can have seen it. */
	trapvec_kvfree(TRAPVEC_MEM_PATCH, r->bl, sizeof(*r->bl));
	if (r->j)
		trapvec_kvfree(TRAPVEC_MEM_PATCH, r->j, sizeof(*r->j));
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

/*
 * The live records by addr and, for jmps, by dest: what APPLY and check.c ask of them per
 * patch costs O(log n), not a walk of trapvec_live. Under trapvec_mutex, as the list.
 */
static struct rb_root trapvec_live_by_addr = RB_ROOT;
static struct rb_root trapvec_live_by_dest = RB_ROOT;

static struct trapvec_live_patch *trapvec_rb_addr(const struct rb_node *n)
{
	return rb_entry(n, struct trapvec_live_patch, by_addr);
}

static struct trapvec_live_patch *trapvec_rb_dest(const struct rb_node *n)
{
	return rb_entry(n, struct trapvec_live_jmp, by_dest)->rec;
}

static void trapvec_addr_insert(struct rb_root *root, struct trapvec_live_patch *r)
{
	struct rb_node **link = &root->rb_node, *parent = NULL;

	while (*link) {
		parent = *link;
		link = r->addr < trapvec_rb_addr(parent)->addr ? &parent->rb_left :
								  &parent->rb_right;
	}
	rb_link_node(&r->by_addr, parent, link);
	rb_insert_color(&r->by_addr, root);
}

/*
 * The first record of root (by addr) that ends after addr, or NULL. The records of a tree never
 * overlap, so their ends rise with their addrs: the first that ends after addr is the only one
 * that can cover it, and the records that overlap a range follow it in order.
 */
static struct trapvec_live_patch *trapvec_first_ending_after(const struct rb_root *root,
							     unsigned long addr)
{
	struct trapvec_live_patch *r, *found = NULL;
	struct rb_node *n = root->rb_node;

	while (n) {
		r = trapvec_rb_addr(n);
		if (r->addr + r->len > addr) {
			found = r;
			n = n->rb_left;
		} else {
			n = n->rb_right;
		}
	}
	return found;
}

static struct trapvec_live_patch *trapvec_tree_overlap(const struct rb_root *root,
						       unsigned long addr, unsigned long len)
{
	struct trapvec_live_patch *r = trapvec_first_ending_after(root, addr);

	return r && r->addr < addr + len ? r : NULL;
}

/* List it live, in both trees; its by_addr node may come from a batch's index (now dropped). */
void trapvec_live_add(struct trapvec_live_patch *r)
{
	struct rb_node **link = &trapvec_live_by_dest.rb_node, *parent = NULL;

	lockdep_assert_held(&trapvec_mutex);
	list_add_tail(&r->node, &trapvec_live);
	trapvec_live_count++;
	trapvec_addr_insert(&trapvec_live_by_addr, r);
	if (!r->j)
		return;
	while (*link) {
		parent = *link;
		link = r->j->dest < trapvec_rb_dest(parent)->j->dest ? &parent->rb_left :
								       &parent->rb_right;
	}
	rb_link_node(&r->j->by_dest, parent, link);
	rb_insert_color(&r->j->by_dest, &trapvec_live_by_dest);
}

void trapvec_live_del(struct trapvec_live_patch *r)
{
	lockdep_assert_held(&trapvec_mutex);
	list_del(&r->node);
	trapvec_live_count--;
	rb_erase(&r->by_addr, &trapvec_live_by_addr);
	if (r->j)
		rb_erase(&r->j->by_dest, &trapvec_live_by_dest);
}

/* The live record whose first byte is addr, or NULL. */
struct trapvec_live_patch *trapvec_live_at(unsigned long addr)
{
	struct trapvec_live_patch *r = trapvec_first_ending_after(&trapvec_live_by_addr, addr);

	return r && r->addr == addr ? r : NULL;
}

/* The first live jmp (by dest) whose dest is at least start, or NULL. */
static struct trapvec_live_patch *trapvec_first_dest_from(unsigned long start)
{
	struct rb_node *n = trapvec_live_by_dest.rb_node;
	struct trapvec_live_patch *r, *found = NULL;

	while (n) {
		r = trapvec_rb_dest(n);
		if (r->j->dest >= start) {
			found = r;
			n = n->rb_left;
		} else {
			n = n->rb_right;
		}
	}
	return found;
}

/* A live jmp that lands on dest, or NULL. */
struct trapvec_live_patch *trapvec_live_jmp_onto(unsigned long dest)
{
	struct trapvec_live_patch *r = trapvec_first_dest_from(dest);

	return r && r->j->dest == dest ? r : NULL;
}

void trapvec_batch_add(struct trapvec_batch_index *b, struct trapvec_live_patch *r)
{
	trapvec_addr_insert(&b->by_addr, r);
}

/* A new record of the batch that overlaps [addr, addr + len), or NULL. */
struct trapvec_live_patch *trapvec_batch_overlap(const struct trapvec_batch_index *b,
						 unsigned long addr, u32 len)
{
	return trapvec_tree_overlap(&b->by_addr, addr, len);
}

struct trapvec_live_patch *trapvec_find_inverse(const struct trapvec_patch *p)
{
	struct trapvec_live_patch *r = trapvec_live_at(p->addr);

	if (r && r->len == p->len && !memcmp(r->new_bytes, p->old_bytes, p->len) &&
	    !memcmp(r->old_bytes, p->new_bytes, p->len))
		return r;
	return NULL;
}

bool trapvec_text_overlaps_live(unsigned long addr, unsigned long len)
{
	lockdep_assert_held(&trapvec_mutex);
	return trapvec_tree_overlap(&trapvec_live_by_addr, addr, len);
}

/* The text as it was before any live patch of ours: current bytes, our patches undone. */
int trapvec_text_read_original(unsigned long addr, u8 *buf, size_t len)
{
	struct trapvec_live_patch *r;
	size_t i;

	lockdep_assert_held(&trapvec_mutex);
	if (copy_from_kernel_nofault(buf, (void *)addr, len))
		return -EFAULT;
	for (r = trapvec_first_ending_after(&trapvec_live_by_addr, addr);
	     r && r->addr < addr + len;
	     r = rb_next(&r->by_addr) ? trapvec_rb_addr(rb_next(&r->by_addr)) : NULL) {
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
	r = trapvec_live_at(site);
	return r && r->len >= TRAPVEC_TRAP_LEN && r->new_bytes[0] == 0xcd;
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
	r = trapvec_first_dest_from(start);
	return r && r->j->dest < end ? r->addr : 0;
}
