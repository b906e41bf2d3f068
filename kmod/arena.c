// SPDX-License-Identifier: GPL-2.0
/*
 * The repository memory: a code arena (in the module's text, arena_text.S; from execmem_alloc()
 * since 6.10, outside the module) and a data arena (in its .bss), both within +-2 GiB of
 * kernel text.
 *
 * Blocks are handed out first-fit with TRAPVEC_ARENA_GRAIN granularity. Code blocks are
 * written through a writable vmap alias of the arena's pages (the text mapping itself is
 * read-only), only while allocated and not sealed; SEAL makes that final. Data blocks stay
 * writable. FREE does not make a block reusable at once: a CPU or a task may still run in
 * it (a preempted task inside a trampoline), so its room is reclaimed only after
 * synchronize_rcu() and trapvec_sync_tasks() (QUIESCE, or ALLOC when the arena is full).
 *
 * Tasks in flight. A "replace" splice sends a function's callers to a replacement in a
 * component, and a replacement may sleep (take a mutex, allocate with GFP_KERNEL). A task
 * blocked there has passed an RCU-tasks quiescent state (a voluntary context switch), so
 * synchronize_rcu_tasks() alone would let its trampoline and component be freed under it.
 * Every code block therefore owns a counter, trapvec_inflight[block offset / GRAIN], in the
 * module's .bss (rip-relative reach from the arena, address reported by INFO): a replace
 * trampoline does "lock incq counter; call replacement; lea r11, counter; jmp
 * trapvec_replace_ret" (replace.S, which decrements it after the block is left behind).
 * Reclaiming freed blocks waits, after the grace periods, until the counters of the freed
 * code blocks are zero; unload waits for every counter.
 *
 * Why counters and not livepatch's stack check (stack_trace_save_tsk_reliable() on every
 * task)? The check needs a reliable unwind through component code and trampolines, which
 * have no ORC data, and it cannot look at a running task; livepatch retries such tasks
 * forever. A counter is exact for sleeping and running tasks alike and costs two locked
 * increments per call of a replaced function. Why one counter per block and not one global
 * or per-CPU counter? A global count includes the tasks inside replacements that stay
 * live: on a busy machine it may never read zero, and QUIESCE would wait on splices nobody
 * removes. Per-CPU counters (inc on one CPU, dec on another after a migration) would need
 * an SRCU-style two-phase read; per-block counters are read only when no task can enter
 * the block any more (its text is reverted and a grace period has passed), so one read of
 * zero is final. The cost is one cache line shared by the CPUs calling one replaced
 * function, as a kprobe's nmissed or the trampoline's hit counter.
 *
 * Size and cost. The code arena holds TRAPVEC_CODE_ARENA_SIZE bytes (trapvec_arena.h): user
 * space takes 16 or 32 bytes of code and 16 of data per count splice (512 of code for the
 * others), so 200,000 count sites fit with room for components. Blocks are kept in one
 * rbtree by offset, walked in order (first fit, reclaim, the in-flight scan) and searched
 * (the block that holds an address, or that an id names: WRITE, SEAL, FREE). First fit
 * starts behind the gap-free run of blocks from offset 0 ("packed"), so a batch that fills
 * the arena from the bottom allocates in constant time; with gaps left by reclaimed blocks it
 * walks from the first gap. Each is O(1) or O(log n) per ioctl at 10,000 blocks.
 *
 * Everything here runs under trapvec_mutex.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/jiffies.h>
#include <linux/rbtree.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <asm/text-patching.h>

#include "trapvec_arena.h"
#include "trapvec_internal.h"

#if TRAPVEC_RUNTIME_ARENA
#include <linux/execmem.h>
#endif

struct trapvec_arena {
	const char *name;
	u32 kind;
	unsigned long base;	/* kernel address (executable for code) */
	u8 *alias;		/* writable view of [base, base + size) */
	size_t size;
	size_t used;		/* bytes in blocks, freed ones included until reclaimed */
	/*
	 * Its blocks by offset: first fit, reclaim and the in-flight scan walk them in order
	 * (rb_next()), and which block holds an address is one descent.
	 */
	struct rb_root by_off;
	/*
	 * The last block of the run that covers [0, its end) without a gap, or NULL (the first
	 * block does not start at 0, or there is none): first fit need not look before its end.
	 */
	struct trapvec_arena_block *packed;
};

/*
 * 48 bytes, from a slab cache of its own: the arena is named by kind, and the block's id is
 * its arena, offset and serial (trapvec_block_id()), found in the offset tree.
 */
struct trapvec_arena_block {
	struct rb_node off_node;	/* in arena->by_off */
	u32 serial;		/* the id's high half: which allocation at this offset */
	u32 off;		/* the arenas are far smaller than 4 GiB */
	u32 size;
	/*
	 * Dispatch entries whose destination, handler or skip target lies in the block
	 * (trapvec_arena_pin()): FREE refuses it while any does, without walking the table.
	 */
	u32 pins;
	u8 kind;		/* TRAPVEC_BLOCK_CODE or _DATA: its arena */
	bool sealed;		/* code only: never written again */
	bool freed;		/* waiting for a grace period before its room is reused */
};

static u8 trapvec_data_arena[TRAPVEC_DATA_ARENA_SIZE] __aligned(PAGE_SIZE);

/*
 * Tasks in flight through the replace trampoline of the code block starting at granule i;
 * changed by the trampolines (lock inc/dec), read here. Zero for every block that is not a
 * replace trampoline, and for every granule no block starts at.
 */
static unsigned long trapvec_inflight[TRAPVEC_CODE_ARENA_SIZE / TRAPVEC_ARENA_GRAIN];

/* Block records (struct trapvec_arena_block), 48 bytes each. */
static struct kmem_cache *trapvec_block_cache;

/*
 * A block's id: the serial of its allocation in the high 32 bits, its arena in bit 31 (set for
 * data) and its offset in grains below. Never 0 (serials start at 1); an id names the block
 * allocated then, never one allocated later at the same offset.
 */
#define TRAPVEC_ID_DATA		(1ULL << 31)
#define TRAPVEC_ID_GRAINS	(TRAPVEC_ID_DATA - 1)

static struct trapvec_arena trapvec_code = {
	.name = "code",
	.kind = TRAPVEC_BLOCK_CODE,
	.size = TRAPVEC_CODE_ARENA_SIZE,
	.by_off = RB_ROOT,
};

static struct trapvec_arena trapvec_data = {
	.name = "data",
	.kind = TRAPVEC_BLOCK_DATA,
	.size = TRAPVEC_DATA_ARENA_SIZE,
	.by_off = RB_ROOT,
};

/* The serial of the next allocation (0 is skipped when it wraps: an id is never 0). */
static u32 trapvec_next_serial = 1;

static u64 trapvec_block_id(const struct trapvec_arena_block *b)
{
	return (u64)b->serial << 32 | (b->kind == TRAPVEC_BLOCK_DATA ? TRAPVEC_ID_DATA : 0) |
	       b->off / TRAPVEC_ARENA_GRAIN;
}

static struct trapvec_arena *trapvec_arena_of(const struct trapvec_arena_block *b)
{
	return b->kind == TRAPVEC_BLOCK_CODE ? &trapvec_code : &trapvec_data;
}

static struct trapvec_arena_block *trapvec_block_of(struct rb_node *n)
{
	return n ? rb_entry(n, struct trapvec_arena_block, off_node) : NULL;
}

/* The block after b in offset order (the first one if b is NULL), or NULL. */
static struct trapvec_arena_block *trapvec_block_next(struct trapvec_arena *a,
						      struct trapvec_arena_block *b)
{
	return trapvec_block_of(b ? rb_next(&b->off_node) : rb_first(&a->by_off));
}

#if TRAPVEC_RUNTIME_ARENA
static u8 *trapvec_code_arena;

/* The code arena from the module area, int3 everywhere, then read-only and executable. */
static int trapvec_code_arena_get(void)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	int ret;

	trapvec_code_arena = k->execmem_alloc(EXECMEM_MODULE_TEXT, TRAPVEC_CODE_ARENA_SIZE);
	if (!trapvec_code_arena)
		return -ENOMEM;
	memset(trapvec_code_arena, INT3_INSN_OPCODE, TRAPVEC_CODE_ARENA_SIZE);
	ret = k->set_memory_rox((unsigned long)trapvec_code_arena,
				TRAPVEC_CODE_ARENA_SIZE >> PAGE_SHIFT);
	if (ret) {
		pr_err("cannot make the code arena read-only and executable: %d\n", ret);
		k->execmem_free(trapvec_code_arena);
		trapvec_code_arena = NULL;
	}
	return ret;
}

/* execmem_free() resets the permissions (VM_FLUSH_RESET_PERMS) before it frees. */
static void trapvec_code_arena_put(void)
{
	if (trapvec_code_arena)
		trapvec_ksyms.execmem_free(trapvec_code_arena);
	trapvec_code_arena = NULL;
}
#else
extern u8 trapvec_code_arena[];	/* arena_text.S: part of the module's text */

static int trapvec_code_arena_get(void)
{
	return 0;
}

static void trapvec_code_arena_put(void)
{
}
#endif

int trapvec_arena_init(void)
{
	unsigned int i, npages = TRAPVEC_CODE_ARENA_SIZE >> PAGE_SHIFT;
	struct page **pages;
	int ret;

	BUILD_BUG_ON(TRAPVEC_CODE_ARENA_SIZE % PAGE_SIZE);
	/* One or two per count site: what kmod/README.md counts. */
	BUILD_BUG_ON(sizeof(struct trapvec_arena_block) > 48);
	/* Every grain's index fits below the id's arena bit. */
	BUILD_BUG_ON(TRAPVEC_CODE_ARENA_SIZE / TRAPVEC_ARENA_GRAIN > TRAPVEC_ID_GRAINS ||
		     TRAPVEC_DATA_ARENA_SIZE / TRAPVEC_ARENA_GRAIN > TRAPVEC_ID_GRAINS);

	trapvec_block_cache = KMEM_CACHE(trapvec_arena_block, 0);
	if (!trapvec_block_cache)
		return -ENOMEM;
	ret = trapvec_code_arena_get();
	if (ret)
		goto out_cache;

	pages = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, npages, sizeof(*pages), GFP_KERNEL);
	if (!pages) {
		ret = -ENOMEM;
		goto out_arena;
	}
	for (i = 0; i < npages; i++) {
		pages[i] = vmalloc_to_page(trapvec_code_arena + i * PAGE_SIZE);
		if (!pages[i]) {
			trapvec_kvfree(TRAPVEC_MEM_SCRATCH, pages, npages * sizeof(*pages));
			ret = -EFAULT;
			goto out_arena;
		}
	}
	trapvec_code.alias = trapvec_vmap(TRAPVEC_MEM_ALIAS, pages, npages);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, pages, npages * sizeof(*pages));
	if (!trapvec_code.alias) {
		ret = -ENOMEM;
		goto out_arena;
	}
	trapvec_code.base = (unsigned long)trapvec_code_arena;
	/* int3 everywhere: a stray jump into unallocated arena stops at once. */
	memset(trapvec_code.alias, INT3_INSN_OPCODE, TRAPVEC_CODE_ARENA_SIZE);

	trapvec_data.base = (unsigned long)trapvec_data_arena;
	trapvec_data.alias = trapvec_data_arena;
	return 0;

out_arena:
	trapvec_code_arena_put();
out_cache:
	kmem_cache_destroy(trapvec_block_cache);
	trapvec_block_cache = NULL;
	return ret;
}

static void trapvec_block_free(struct trapvec_arena_block *b)
{
	trapvec_mem_put(TRAPVEC_MEM_BLOCK, sizeof(*b));
	kmem_cache_free(trapvec_block_cache, b);
}

static void trapvec_arena_release(struct trapvec_arena *a)
{
	struct trapvec_arena_block *b, *tmp;

	rbtree_postorder_for_each_entry_safe(b, tmp, &a->by_off, off_node)
		trapvec_block_free(b);
	a->by_off = RB_ROOT;
	a->packed = NULL;
	a->used = 0;
}

/* Unload: every CPU and task is out of the arena (see trapvec_exit()). */
void trapvec_arena_exit(void)
{
	trapvec_arena_release(&trapvec_code);
	trapvec_arena_release(&trapvec_data);
	if (trapvec_code.alias)
		trapvec_vunmap(TRAPVEC_MEM_ALIAS, trapvec_code.alias,
			       TRAPVEC_CODE_ARENA_SIZE >> PAGE_SHIFT);
	trapvec_code.alias = NULL;
	trapvec_code_arena_put();
	kmem_cache_destroy(trapvec_block_cache);
	trapvec_block_cache = NULL;
}

static struct trapvec_arena_block *trapvec_block_at(struct trapvec_arena *a, size_t off);

/* The live block id names (its arena, offset and serial all agree), or NULL. */
static struct trapvec_arena_block *trapvec_block_find(u64 id)
{
	struct trapvec_arena *a = id & TRAPVEC_ID_DATA ? &trapvec_data : &trapvec_code;
	size_t off = (id & TRAPVEC_ID_GRAINS) * TRAPVEC_ARENA_GRAIN;
	struct trapvec_arena_block *b;

	lockdep_assert_held(&trapvec_mutex);
	if (off >= a->size)
		return NULL;
	b = trapvec_block_at(a, off);
	if (b && b->off == off && trapvec_block_id(b) == id && !b->freed)
		return b;
	return NULL;
}

static bool trapvec_block_less(struct rb_node *a, const struct rb_node *b)
{
	return rb_entry(a, struct trapvec_arena_block, off_node)->off <
	       rb_entry(b, struct trapvec_arena_block, off_node)->off;
}

/* key: the offset looked for (a size_t *); 0 when the block covers it. */
static int trapvec_block_cmp(const void *key, const struct rb_node *node)
{
	const struct trapvec_arena_block *b = rb_entry(node, struct trapvec_arena_block, off_node);
	size_t off = *(const size_t *)key;

	if (off < b->off)
		return -1;
	if (off >= b->off + b->size)
		return 1;
	return 0;
}

/* The block (live or freed) that covers offset off of arena a, or NULL. */
static struct trapvec_arena_block *trapvec_block_at(struct trapvec_arena *a, size_t off)
{
	struct rb_node *n = rb_find(&off, &a->by_off, trapvec_block_cmp);

	return n ? rb_entry(n, struct trapvec_arena_block, off_node) : NULL;
}

/* Extend the gap-free run from offset 0 over the blocks that now continue it. */
static void trapvec_extend_packed(struct trapvec_arena *a)
{
	struct trapvec_arena_block *b;
	size_t end = a->packed ? a->packed->off + a->packed->size : 0;

	for (b = trapvec_block_next(a, a->packed); b; b = trapvec_block_next(a, b)) {
		if (b->off != end)
			break;
		a->packed = b;
		end = b->off + b->size;
	}
}

/* Take block b out of arena a's records (the caller frees it). */
static void trapvec_block_unlink(struct trapvec_arena *a, struct trapvec_arena_block *b)
{
	/* A block of the gap-free run leaves a gap where it was: the run ends before it. */
	if (a->packed && b->off <= a->packed->off)
		a->packed = trapvec_block_of(rb_prev(&b->off_node));
	rb_erase(&b->off_node, &a->by_off);
}

/*
 * First fit: the lowest gap of at least size bytes. No gap lies before the end of the
 * packed run, so the search starts there.
 */
static struct trapvec_arena_block *trapvec_fit(struct trapvec_arena *a, size_t size)
{
	size_t start = a->packed ? a->packed->off + a->packed->size : 0;
	struct trapvec_arena_block *b, *nb;

	for (b = trapvec_block_next(a, a->packed); b; b = trapvec_block_next(a, b)) {
		if (b->off - start >= size)
			break;
		start = b->off + b->size;
	}
	if (start + size > a->size)
		return NULL;
	BUILD_BUG_ON(TRAPVEC_CODE_ARENA_SIZE > U32_MAX || TRAPVEC_DATA_ARENA_SIZE > U32_MAX);
	nb = kmem_cache_zalloc(trapvec_block_cache, GFP_KERNEL);
	if (!nb)
		return ERR_PTR(-ENOMEM);
	trapvec_mem_got(TRAPVEC_MEM_BLOCK, sizeof(*nb));
	nb->kind = a->kind;
	nb->off = start;
	nb->size = size;
	nb->serial = trapvec_next_serial++ ?: trapvec_next_serial++;
	rb_add(&nb->off_node, &a->by_off, trapvec_block_less);
	trapvec_extend_packed(a);
	a->used += size;
	return nb;
}

static void trapvec_reclaim_arena(struct trapvec_arena *a, struct trapvec_quiesce *out)
{
	struct trapvec_arena_block *b, *tmp;

	for (b = trapvec_block_next(a, NULL); b; b = tmp) {
		tmp = trapvec_block_next(a, b);
		if (!b->freed)
			continue;
		if (a->kind == TRAPVEC_BLOCK_CODE)
			memset(a->alias + b->off, INT3_INSN_OPCODE, b->size);
		a->used -= b->size;
		out->reclaimed_blocks++;
		out->reclaimed_bytes += b->size;
		trapvec_block_unlink(a, b);
		trapvec_block_free(b);
	}
}

static unsigned long trapvec_block_inflight(const struct trapvec_arena_block *b)
{
	return READ_ONCE(trapvec_inflight[b->off / TRAPVEC_ARENA_GRAIN]);
}

/* The first freed (all: any) code block a task is in flight through, or NULL. */
static struct trapvec_arena_block *trapvec_busy_block(bool all)
{
	struct trapvec_arena_block *b;

	for (b = trapvec_block_next(&trapvec_code, NULL); b; b = trapvec_block_next(&trapvec_code, b))
		if ((all || b->freed) && trapvec_block_inflight(b))
			return b;
	return NULL;
}

/*
 * Wait up to timeout_ms (forever if 0, logging every 5 s) until no task is in flight
 * through a freed code block (any code block if all). Called after synchronize_rcu_tasks():
 * no task can enter such a block any more (its text patches are reverted, and a task that
 * had jumped in has since passed its increment), so the counters only go down and one read
 * of zero is final. Sleeps, under trapvec_mutex (the tasks we wait for never take it).
 * Returns 0, or -EBUSY with out->busy_addr and out->busy_count set.
 */
int trapvec_arena_wait_inflight(bool all, unsigned int timeout_ms, struct trapvec_quiesce *out)
{
	unsigned long start = jiffies, logged = jiffies;
	struct trapvec_arena_block *b;

	lockdep_assert_held(&trapvec_mutex);
	while ((b = trapvec_busy_block(all))) {
		unsigned long addr = trapvec_code.base + b->off;

		if (timeout_ms && time_after(jiffies, start + msecs_to_jiffies(timeout_ms))) {
			out->busy_addr = addr;
			out->busy_count = trapvec_block_inflight(b);
			pr_info("QUIESCE: %lu task(s) still inside the replacement called by the trampoline at %lx after %u ms\n",
				trapvec_block_inflight(b), addr, timeout_ms);
			return -EBUSY;
		}
		if (!timeout_ms && time_after(jiffies, logged + 5 * HZ)) {
			pr_warn("unload: waiting for %lu task(s) inside the replacement called by the trampoline at %lx (%u s so far)\n",
				trapvec_block_inflight(b), addr, jiffies_to_msecs(jiffies - start) / 1000);
			logged = jiffies;
		}
		msleep(20);
	}
	return 0;
}

/*
 * The caller has waited for synchronize_rcu() and synchronize_rcu_tasks() since the last
 * FREE, and trapvec_arena_wait_inflight() found no task in flight through a freed block: no
 * CPU or task can be in a freed block any more.
 */
void trapvec_arena_reclaim(struct trapvec_quiesce *out)
{
	lockdep_assert_held(&trapvec_mutex);
	trapvec_reclaim_arena(&trapvec_code, out);
	trapvec_reclaim_arena(&trapvec_data, out);
}

static bool trapvec_has_freed(struct trapvec_arena *a)
{
	struct trapvec_arena_block *b;

	for (b = trapvec_block_next(a, NULL); b; b = trapvec_block_next(a, b))
		if (b->freed)
			return true;
	return false;
}

int trapvec_arena_alloc(struct trapvec_alloc *req)
{
	struct trapvec_arena *a;
	struct trapvec_arena_block *b;
	struct trapvec_quiesce ignored = {};
	size_t size;

	lockdep_assert_held(&trapvec_mutex);
	if (req->kind == TRAPVEC_BLOCK_CODE)
		a = &trapvec_code;
	else if (req->kind == TRAPVEC_BLOCK_DATA)
		a = &trapvec_data;
	else
		return -EINVAL;
	if (!req->size || req->size > a->size)
		return -EINVAL;
	size = ALIGN(req->size, TRAPVEC_ARENA_GRAIN);

	b = trapvec_fit(a, size);
	if (!b && trapvec_has_freed(a)) {
		pr_debug("%s arena full for %zu bytes: waiting to reclaim freed blocks\n",
			 a->name, size);
		synchronize_rcu();
		trapvec_sync_tasks();
		if (!trapvec_arena_wait_inflight(false, TRAPVEC_QUIESCE_WAIT_MS, &ignored))
			trapvec_arena_reclaim(&ignored);
		b = trapvec_fit(a, size);
	}
	if (!b)
		return -ENOSPC;
	if (IS_ERR(b))
		return PTR_ERR(b);
	if (a->kind == TRAPVEC_BLOCK_DATA)
		memset(a->alias + b->off, 0, size);
	req->id = trapvec_block_id(b);
	req->addr = a->base + b->off;
	pr_debug("alloc %s block %llu: %zu bytes at %llx\n", a->name, trapvec_block_id(b), size, req->addr);
	return 0;
}

/* Data: each naturally aligned 8-byte word with one store (user space retargets slots). */
static void trapvec_write_data(u8 *dst, const u8 *src, size_t len)
{
	while (len) {
		if (IS_ALIGNED((unsigned long)dst, 8) && len >= 8) {
			WRITE_ONCE(*(u64 *)dst, get_unaligned((const u64 *)src));
			dst += 8;
			src += 8;
			len -= 8;
		} else {
			WRITE_ONCE(*dst, *src);
			dst++;
			src++;
			len--;
		}
	}
}

int trapvec_arena_write(const struct trapvec_write *req)
{
	struct trapvec_arena_block *b;
	struct trapvec_arena *a;
	u8 *bounce;
	int ret = 0;

	lockdep_assert_held(&trapvec_mutex);
	b = trapvec_block_find(req->id);
	if (!b)
		return -ENOENT;
	a = trapvec_arena_of(b);
	if (b->sealed)
		return -EPERM;
	if (req->len > TRAPVEC_XFER_MAX || req->offset > b->size ||
	    req->len > b->size - req->offset)
		return -EINVAL;
	if (!req->len)
		return 0;

	bounce = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 1, req->len, GFP_KERNEL);
	if (!bounce)
		return -ENOMEM;
	if (copy_from_user(bounce, u64_to_user_ptr(req->buf), req->len)) {
		ret = -EFAULT;
		goto out_free;
	}
	if (a->kind == TRAPVEC_BLOCK_DATA)
		trapvec_write_data(a->alias + b->off + req->offset, bounce, req->len);
	else
		memcpy(a->alias + b->off + req->offset, bounce, req->len);

	/* Read back through the address the CPUs use, not through the alias. */
	if (memcmp((void *)(a->base + b->off + req->offset), bounce, req->len)) {
		pr_err("%s block %llu: read-back after writing %u bytes at +%llu differs\n",
		       a->name, trapvec_block_id(b), req->len, req->offset);
		ret = -EIO;
	}
out_free:
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, bounce, req->len);
	return ret;
}

int trapvec_arena_seal(u64 id)
{
	struct trapvec_arena_block *b;

	lockdep_assert_held(&trapvec_mutex);
	b = trapvec_block_find(id);
	if (!b)
		return -ENOENT;
	if (b->kind != TRAPVEC_BLOCK_CODE)
		return -EINVAL;
	if (b->sealed)
		return 0;
	b->sealed = true;
	/*
	 * Cross-modifying code: every CPU serializes before it may run the new bytes, once for a
	 * batch of seals, before a command that could send a CPU there (trapvec_sync_sealed()).
	 */
	trapvec_seal_pending = true;
	pr_debug("sealed code block %llu at %lx\n", id, trapvec_code.base + b->off);
	return 0;
}

/*
 * FREE: refused (-EBUSY) while a live patch still enters the block: a dispatch entry's
 * destination, handler or skip target, a live jmp patch (or springboard) landing in it, or the
 * handler of a return point that is not given back. Freeing it would let ALLOC hand the room
 * to new code (or QUIESCE fill it with int3) under CPUs the patch still sends there: a client
 * that crashed half way through its undo, or a buggy one, must not be able to do that. Code
 * a component calls from a trampoline is not seen here (only the direct references are):
 * user space frees a component only after the splices that call it are gone.
 */
int trapvec_arena_free(u64 id)
{
	struct trapvec_arena_block *b;
	unsigned long start, end, site;
	int slot;

	lockdep_assert_held(&trapvec_mutex);
	b = trapvec_block_find(id);
	if (!b)
		return -ENOENT;
	start = trapvec_arena_of(b)->base + b->off;
	end = start + b->size;
	if (b->pins) {
		/* Refused: only now is the table walked, to name the entry. */
		site = trapvec_dispatch_targets(start, end);
		WARN_ON_ONCE(!site);
		pr_warn_ratelimited("FREE of block %llu at %lx refused: the dispatch entry of the trap at %pS still enters it (%u references)\n",
				    id, start, (void *)site, b->pins);
		return -EBUSY;
	}
	site = trapvec_text_jmp_into(start, end);
	if (site) {
		pr_warn_ratelimited("FREE of block %llu at %lx refused: the live jmp at %pS still enters it\n",
				    id, start, (void *)site);
		return -EBUSY;
	}
	slot = trapvec_returns_handler_in(start, end);
	if (slot >= 0) {
		site = trapvec_dispatch_site_calling((unsigned long)trapvec_rp_entry, slot);
		pr_warn_ratelimited("FREE of block %llu at %lx refused: it holds the handler of return point slot %d (entry at %pS)\n",
				    id, start, slot, (void *)site);
		return -EBUSY;
	}
	b->freed = true;
	return 0;
}

/*
 * A dispatch entry that sends CPUs to addr (delta 1) or no longer does (delta -1): counted in
 * the code block holding addr, if any (a handler may also be a return point's or a keyed
 * count's entry routine, in this module's text). An entry pins its blocks from the moment its
 * fields are set until it is freed (dispatch_table.c), so a block is pinned while a CPU may
 * still be sent into it.
 */
void trapvec_arena_pin(unsigned long addr, int delta)
{
	struct trapvec_arena_block *b;

	lockdep_assert_held(&trapvec_mutex);
	if (addr < trapvec_code.base || addr - trapvec_code.base >= trapvec_code.size)
		return;
	b = trapvec_block_at(&trapvec_code, addr - trapvec_code.base);
	if (WARN_ON_ONCE(!b) || WARN_ON_ONCE(delta < 0 && !b->pins))
		return;
	b->pins += delta;
}

/* Whether [addr, addr + len) meets the code arena (not module text since 6.10). */
bool trapvec_arena_overlaps_code(unsigned long addr, unsigned long len)
{
	return addr < trapvec_code.base + trapvec_code.size && trapvec_code.base < addr + len;
}

bool trapvec_arena_in_sealed_code(unsigned long addr)
{
	struct trapvec_arena_block *b;

	lockdep_assert_held(&trapvec_mutex);
	if (addr < trapvec_code.base || addr - trapvec_code.base >= trapvec_code.size)
		return false;
	b = trapvec_block_at(&trapvec_code, addr - trapvec_code.base);
	return b && b->sealed && !b->freed;
}

void trapvec_arena_info(struct trapvec_info *info)
{
	lockdep_assert_held(&trapvec_mutex);
	info->code_base = trapvec_code.base;
	info->code_size = trapvec_code.size;
	info->data_base = trapvec_data.base;
	info->data_size = trapvec_data.size;
	info->code_used = trapvec_code.used;
	info->data_used = trapvec_data.used;
	info->inflight_base = (unsigned long)trapvec_inflight;
}
