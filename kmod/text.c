// SPDX-License-Identifier: GPL-2.0
/*
 * Batched text patches, and the record of every live one.
 *
 * A batch is all or nothing. Under trapvec_mutex every patch is checked (check.c) and its
 * current bytes compared with what the caller expects; only then does stop_machine() run
 * the writer on every online CPU at once: the first CPU to arrive compares all the bytes
 * again (nothing can change them while every CPU is held, and a kprobe or a text_poke_bp()
 * sequence that got in since the first check makes the batch fail instead of being
 * overwritten), writes every patch through a writable alias of its page, and releases the
 * others; then every CPU executes sync_core() before it leaves, so no CPU can run stale
 * instructions of the patched ranges.
 *
 * Why not text_poke()? It is not exported, and it writes one range at a time with three
 * rounds of IPIs. Why not take text_mutex? stop_machine() takes cpus_read_lock(), which
 * ranks above text_mutex (kprobes take cpus_read_lock() then text_mutex), and
 * stop_machine_cpuslocked() is not exported. The other writers of kernel text (ftrace,
 * jump labels, static calls, alternatives, kprobes) write ranges that check.c keeps apart
 * from ours, and the second comparison inside stop_machine() catches the rest.
 *
 * The alias: kernel image text is read-only in both of its mappings (the high mapping
 * and the direct map), so the page is mapped once more with vmap(PAGE_KERNEL); module
 * text is vmalloc memory (vmalloc_to_page()). The alias of a live patch is kept with its
 * record, so that reverting it (even at unload) allocates nothing.
 *
 * A live patch of module text holds a reference on that module, and keeps it after its
 * revert until the next QUIESCE (or unload) has waited for quiescence: a task may still be
 * in a trampoline that jumps back into that text, or asleep in a replacement that returns
 * into it (the patched function's caller, or the original trampoline's jump back). The
 * records of reverted patches of module text wait on trapvec_parked until then.
 *
 * Kprobes: while a patch is live, its range is an entry of the kprobes blacklist, so that
 * register_kprobe() refuses any byte of it (-EINVAL) instead of copying our trap into a slot
 * and writing an int3 over it; the entry shows in /sys/kernel/debug/kprobes/blacklist and
 * goes with the revert. The whole APPLY runs under kprobe_mutex, which guards that list and
 * the kprobe table's writers: no kprobe is registered on a range between its check
 * (check.c) and its write. register_kprobe() reads the blacklist before it takes
 * kprobe_mutex, so a registration that read it just before our entry went in can still
 * follow a batch; it then copies the trap itself (the kernel accepts that, see DESIGN.md),
 * which the second comparison of a later batch or revert detects. Lock order, as kprobes
 * have it: trapvec_mutex, kprobe_mutex, cpus_read_lock (stop_machine()), text_mutex.
 *
 * A new patch that writes a trap (CD vector) needs its dispatch entry first: a trap without
 * one would be chained to the spurious-interrupt handler and skip the displaced
 * instructions. Nothing is written while kernel lockdown or kernel.modules_disabled forbids
 * it (check.c, trapvec_may_write()); reverts still are, as unload does them anyway.
 *
 * Windows over several instructions: stop_machine() guarantees that no CPU executes the range
 * while it changes, not that no task is stopped inside it. With voluntary or no preemption
 * (Debian's default) a task is never stopped in kernel code but at a call, and the only
 * boundary inside a 2-byte trap follows a 1-byte instruction, which is not a call. Under
 * preempt=full a task preempted right after the first displaced instruction would resume in
 * the middle of the new bytes; that case is not handled (README.md).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/rculist.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/stop_machine.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <asm/sync_core.h>

#include "trapvec_internal.h"

struct trapvec_live_patch {
	struct list_head node;	/* in trapvec_live, under trapvec_mutex */
	unsigned long addr;
	u32 len;
	u8 old_bytes[TRAPVEC_PATCH_MAX];	/* the original text */
	u8 new_bytes[TRAPVEC_PATCH_MAX];	/* what the patch wrote */
	void *vm;		/* vmap() of the page(s) of [addr, addr + len) */
	u8 *alias;		/* writable view of addr inside vm */
	struct module *mod;	/* owner of the text (a reference is held); NULL: kernel */
	/* [addr, addr + len) on kprobe_blacklist while live (under kprobe_mutex) */
	struct kprobe_blacklist_entry *bl;
};

static LIST_HEAD(trapvec_live);
static u64 trapvec_live_count;
/* Reverted patches of module text whose module reference waits for quiescence. */
static LIST_HEAD(trapvec_parked);

/* One write of a stop_machine() batch: apply rec (undo false) or revert it (undo true). */
struct trapvec_text_op {
	struct trapvec_live_patch *rec;
	bool undo;
};

struct trapvec_stop_ctx {
	struct trapvec_text_op *ops;	/* NULL: revert every live patch (unload) */
	u32 count;
	atomic_t arrived;	/* the first CPU to arrive writes */
	int done;		/* set (release) by the writer when it is finished */
	int result;		/* 0, or -ESTALE: ops[failed] no longer holds the expected bytes */
	u32 failed;
	u32 skipped;		/* unload only: patches whose bytes were changed by someone else */
};

static bool trapvec_overlap(unsigned long a, u32 alen, unsigned long b, u32 blen)
{
	return a < b + blen && b < a + alen;
}

/* Bytes at addr equal want? Plain loads: runs inside stop_machine(), calls nothing. */
static bool trapvec_text_equals(unsigned long addr, const u8 *want, u32 len)
{
	u32 i;

	for (i = 0; i < len; i++)
		if (READ_ONCE(((const u8 *)addr)[i]) != want[i])
			return false;
	return true;
}

static void trapvec_text_store(u8 *alias, const u8 *bytes, u32 len)
{
	u32 i;

	for (i = 0; i < len; i++)
		WRITE_ONCE(alias[i], bytes[i]);
}

static bool trapvec_op_ready(const struct trapvec_text_op *op)
{
	const struct trapvec_live_patch *r = op->rec;

	return trapvec_text_equals(r->addr, op->undo ? r->new_bytes : r->old_bytes, r->len);
}

static void trapvec_op_write(const struct trapvec_text_op *op)
{
	const struct trapvec_live_patch *r = op->rec;

	trapvec_text_store(r->alias, op->undo ? r->old_bytes : r->new_bytes, r->len);
}

/* The writer: every other CPU spins in trapvec_stop_cb() with interrupts off. */
static void trapvec_stop_write(struct trapvec_stop_ctx *ctx)
{
	struct trapvec_live_patch *r;
	u32 i;

	if (!ctx->ops) {
		list_for_each_entry(r, &trapvec_live, node) {
			struct trapvec_text_op op = { .rec = r, .undo = true };

			if (trapvec_op_ready(&op))
				trapvec_op_write(&op);
			else
				ctx->skipped++;
		}
		return;
	}
	for (i = 0; i < ctx->count; i++) {
		if (!trapvec_op_ready(&ctx->ops[i])) {
			ctx->result = -ESTALE;
			ctx->failed = i;
			return;
		}
	}
	for (i = 0; i < ctx->count; i++)
		trapvec_op_write(&ctx->ops[i]);
}

static int trapvec_stop_cb(void *data)
{
	struct trapvec_stop_ctx *ctx = data;

	if (atomic_inc_return(&ctx->arrived) == 1) {
		trapvec_stop_write(ctx);
		/* Pairs with the acquire below: the others see every byte written. */
		smp_store_release(&ctx->done, 1);
	} else {
		/* Pairs with the release above. */
		while (!smp_load_acquire(&ctx->done))
			cpu_relax();
	}
	/* Cross-modifying code: serialize before running anything that may be new. */
	sync_core();
	return 0;
}

static int trapvec_stop_run(struct trapvec_stop_ctx *ctx)
{
	int ret;

	atomic_set(&ctx->arrived, 0);
	ctx->done = 0;
	ctx->result = 0;
	ctx->failed = TRAPVEC_NO_INDEX;
	ctx->skipped = 0;
	ret = stop_machine(trapvec_stop_cb, ctx, cpu_online_mask);
	return ret ?: ctx->result;
}

static bool trapvec_core_text(unsigned long addr, u32 len)
{
	return addr >= trapvec_ksyms.stext && addr + len <= trapvec_ksyms.etext;
}

/* Map the page(s) of [addr, addr + len) writable; len <= TRAPVEC_PATCH_MAX < PAGE_SIZE. */
static int trapvec_map_alias(struct trapvec_live_patch *r)
{
	unsigned long first = r->addr & PAGE_MASK;
	unsigned long last = (r->addr + r->len - 1) & PAGE_MASK;
	unsigned int i, n = first == last ? 1 : 2;
	struct page *pages[2];

	for (i = 0; i < n; i++) {
		unsigned long page = first + i * PAGE_SIZE;

		pages[i] = trapvec_core_text(r->addr, r->len) ? virt_to_page((void *)page) :
							       vmalloc_to_page((void *)page);
		if (!pages[i])
			return -EFAULT;
	}
	r->vm = vmap(pages, n, VM_MAP, PAGE_KERNEL);
	if (!r->vm)
		return -ENOMEM;
	r->alias = (u8 *)r->vm + offset_in_page(r->addr);
	return 0;
}

/*
 * Off the blacklist: readers walk it under RCU (within_kprobe_blacklist()), so the entry is
 * freed after a grace period, as kprobe_remove_area_blacklist() does.
 */
static void trapvec_live_unlist(struct trapvec_live_patch *r)
{
	lockdep_assert_held(trapvec_ksyms.kprobe_mutex);
	list_del_rcu(&r->bl->list);
	kfree_rcu(r->bl, rcu);
	r->bl = NULL;
}

static void trapvec_live_free(struct trapvec_live_patch *r)
{
	if (r->vm)
		vunmap(r->vm);
	if (r->mod)
		module_put(r->mod);
	/* Never listed (a batch that failed): nobody can have seen it. */
	kfree(r->bl);
	kfree(r);
}

/*
 * A reverted patch, off the live list and the blacklist: free it, but keep its module
 * reference (if any) on trapvec_parked until trapvec_text_put_parked().
 */
static void trapvec_live_retire(struct trapvec_live_patch *r)
{
	if (!r->mod) {
		trapvec_live_free(r);
		return;
	}
	if (r->vm)
		vunmap(r->vm);
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

/* Take a reference on the module owning [addr, addr + len); 0 for kernel text. */
static int trapvec_get_owner(struct trapvec_live_patch *r)
{
	struct module *mod;
	int ret = 0;

	if (trapvec_core_text(r->addr, r->len))
		return 0;
	preempt_disable();
	mod = trapvec_ksyms.module_text_address(r->addr);
	if (mod && try_module_get(mod))
		r->mod = mod;
	else
		ret = -ENOENT;
	preempt_enable();
	return ret;
}

static struct trapvec_live_patch *trapvec_find_inverse(const struct trapvec_patch *p)
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

static void trapvec_fail(struct trapvec_apply *req, u32 index, u32 reason, s32 error)
{
	req->failed_index = index;
	req->reason = reason;
	req->error = error;
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

/*
 * A new patch starting with "int imm8" (CD ib) is a trap: of our vector with a dispatch entry
 * at its site, else refused. Other patches (jmp rel32/rel8, springboards) start with E9/EB.
 */
static u32 trapvec_check_trap(const struct trapvec_patch *p)
{
	if (p->len < TRAPVEC_TRAP_LEN || p->new_bytes[0] != 0xcd)
		return TRAPVEC_REASON_NONE;
	if (p->new_bytes[1] != trapvec_vector)
		return TRAPVEC_REASON_FOREIGN_TRAP;
	if (!trapvec_dispatch_has(p->addr))
		return TRAPVEC_REASON_NO_DISPATCH;
	return TRAPVEC_REASON_NONE;
}

/*
 * Check patch i of the batch (a new patch, not the inverse of a live one). Returns 0 or the
 * ioctl's errno (req filled in).
 */
static int trapvec_check_new(const struct trapvec_patch *patches, u32 i,
			     struct trapvec_apply *req)
{
	const struct trapvec_patch *p = &patches[i];
	u32 reason, j;

	if (trapvec_text_overlaps_live(p->addr, p->len)) {
		trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
		return -EBUSY;
	}
	for (j = 0; j < i; j++) {
		if (trapvec_overlap(p->addr, p->len, patches[j].addr, patches[j].len)) {
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			return -EBUSY;
		}
	}
	reason = trapvec_check_site(p->addr, p->len, &req->culprit);
	if (!reason)
		reason = trapvec_check_trap(p);
	if (reason) {
		pr_debug("patch %u at %pS refused: reason %u\n", i, (void *)p->addr, reason);
		trapvec_fail(req, i, reason, 0);
		return -EINVAL;
	}
	return 0;
}

int trapvec_text_apply(const struct trapvec_patch *patches, struct trapvec_apply *req)
{
	struct mutex *kprobe_mutex = trapvec_ksyms.kprobe_mutex;
	u32 i, j, n = req->count, may_write;
	struct trapvec_stop_ctx ctx = {};
	struct trapvec_text_op *ops;
	int ret = 0;

	lockdep_assert_held(&trapvec_mutex);
	trapvec_fail(req, TRAPVEC_NO_INDEX, TRAPVEC_REASON_NONE, 0);
	memset(req->found, 0, sizeof(req->found));
	req->culprit = 0;
	if (req->flags)
		return -EINVAL;
	if (!n)
		return 0;

	ops = kvcalloc(n, sizeof(*ops), GFP_KERNEL);
	if (!ops)
		return -ENOMEM;

	may_write = trapvec_may_write();
	mutex_lock(kprobe_mutex);
	for (i = 0; i < n; i++) {
		const struct trapvec_patch *p = &patches[i];
		struct trapvec_live_patch *inv;
		u8 cur[TRAPVEC_PATCH_MAX];

		if (!p->len || p->len > TRAPVEC_PATCH_MAX) {
			trapvec_fail(req, i, TRAPVEC_REASON_BAD_LENGTH, 0);
			ret = -EINVAL;
			goto out_unwind;
		}
		inv = trapvec_find_inverse(p);
		for (j = 0; inv && j < i; j++)
			if (ops[j].rec == inv)
				inv = NULL;	/* the same revert twice: an overlap */
		if (inv) {
			ops[i].rec = inv;
			ops[i].undo = true;
		} else if (may_write) {
			trapvec_fail(req, i, may_write, -EPERM);
			ret = -EPERM;
			goto out_unwind;
		} else {
			ret = trapvec_check_new(patches, i, req);
			if (ret)
				goto out_unwind;
		}
		/* Batches of up to TRAPVEC_BATCH_MAX: let others run between their checks. */
		cond_resched();

		if (copy_from_kernel_nofault(cur, (void *)p->addr, p->len)) {
			trapvec_fail(req, i, TRAPVEC_REASON_NOT_TEXT, -EFAULT);
			ret = -EINVAL;
			goto out_unwind;
		}
		if (memcmp(cur, p->old_bytes, p->len)) {
			trapvec_fail(req, i, TRAPVEC_REASON_MISMATCH, 0);
			memcpy(req->found, cur, p->len);
			ret = -ESTALE;
			goto out_unwind;
		}
		if (inv)
			continue;

		ops[i].rec = kzalloc(sizeof(*ops[i].rec), GFP_KERNEL);
		if (!ops[i].rec) {
			ret = -ENOMEM;
			goto out_unwind;
		}
		ops[i].rec->bl = kzalloc(sizeof(*ops[i].rec->bl), GFP_KERNEL);
		if (!ops[i].rec->bl) {
			ret = -ENOMEM;
			goto out_unwind;
		}
		ops[i].rec->bl->start_addr = p->addr;
		ops[i].rec->bl->end_addr = p->addr + p->len;
		ops[i].rec->addr = p->addr;
		ops[i].rec->len = p->len;
		memcpy(ops[i].rec->old_bytes, p->old_bytes, p->len);
		memcpy(ops[i].rec->new_bytes, p->new_bytes, p->len);
		ret = trapvec_get_owner(ops[i].rec) ?: trapvec_map_alias(ops[i].rec);
		if (ret) {
			trapvec_fail(req, i, TRAPVEC_REASON_NOT_TEXT, ret);
			ret = -EINVAL;
			goto out_unwind;
		}
	}
	ctx.ops = ops;
	ctx.count = n;
	ret = trapvec_stop_run(&ctx);
	if (ret) {
		const struct trapvec_live_patch *r = ops[ctx.failed].rec;

		trapvec_fail(req, ctx.failed, TRAPVEC_REASON_MISMATCH, 0);
		if (copy_from_kernel_nofault(req->found, (void *)r->addr, r->len))
			memset(req->found, 0, sizeof(req->found));
		pr_debug("batch of %u: patch %u at %pS changed under us\n", n, ctx.failed,
			 (void *)r->addr);
		goto out_unwind;
	}

	/* Written: update the record. */
	for (i = 0; i < n; i++) {
		struct trapvec_live_patch *r = ops[i].rec;

		WARN_ON_ONCE(!trapvec_text_equals(r->addr, ops[i].undo ? r->old_bytes :
						  r->new_bytes, r->len));
		if (ops[i].undo) {
			list_del(&r->node);
			trapvec_live_count--;
			trapvec_live_unlist(r);
			trapvec_live_retire(r);
		} else {
			list_add_tail(&r->node, &trapvec_live);
			trapvec_live_count++;
			list_add_tail_rcu(&r->bl->list, trapvec_ksyms.kprobe_blacklist);
		}
	}
	pr_debug("applied a batch of %u patches; %llu live\n", n, trapvec_live_count);
	goto out_free;

out_unwind:
	for (i = 0; i < n; i++)
		if (ops[i].rec && !ops[i].undo)
			trapvec_live_free(ops[i].rec);
out_free:
	mutex_unlock(kprobe_mutex);
	kvfree(ops);
	return ret;
}

/* Unload: write the original bytes back everywhere, in one stop_machine(). */
void trapvec_text_revert_all(void)
{
	struct trapvec_live_patch *r, *tmp;
	struct trapvec_stop_ctx ctx = {};

	lockdep_assert_held(&trapvec_mutex);
	if (!trapvec_live_count)
		return;
	trapvec_stop_run(&ctx);
	if (ctx.skipped)
		pr_err("%u live patches were changed by someone else and are left alone\n",
		       ctx.skipped);
	pr_info("reverted %llu live patches\n", trapvec_live_count - ctx.skipped);
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	list_for_each_entry_safe(r, tmp, &trapvec_live, node) {
		list_del(&r->node);
		trapvec_live_unlist(r);
		trapvec_live_retire(r);
	}
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	trapvec_live_count = 0;
}

u64 trapvec_text_live_count(void)
{
	return trapvec_live_count;
}
