// SPDX-License-Identifier: GPL-2.0
/*
 * The module's own count of the memory it holds, so that a test can prove that nothing
 * leaks (vmtest/scenarios/kernel_ioctl_fuzz.sh): every allocation the module makes goes
 * through the helpers below, which count objects and bytes per kind in atomic counters
 * (ioctls of several openers run concurrently outside trapvec_mutex, e.g. their copy-in
 * buffers). The free side names the same kind and size as the allocation did.
 *
 * Read while loaded: /sys/module/trapvec/parameters/allocations, one line per kind,
 * "<kind> <objects> <bytes>". What the module holds between ioctls once every patch,
 * dispatch entry and block is gone and QUIESCE has reclaimed the blocks is its baseline:
 * the IDT and code-arena aliases, the reserved-range table and user space's state blob.
 * At unload, after everything is freed, trapvec_mem_exit() logs one line: "unloaded, 0
 * allocations outstanding", or the kinds that are not back to zero, with a warning.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/bug.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/overflow.h>
#include <linux/percpu.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "trapvec_internal.h"

static const char *const trapvec_mem_names[TRAPVEC_MEM_KINDS] = {
	[TRAPVEC_MEM_ENTRY] = "entry",
	[TRAPVEC_MEM_BLOCK] = "block",
	[TRAPVEC_MEM_PATCH] = "patch",
	[TRAPVEC_MEM_ALIAS] = "alias",
	[TRAPVEC_MEM_PENDING] = "pending",
	[TRAPVEC_MEM_STATE] = "state",
	[TRAPVEC_MEM_RESERVED] = "reserved",
	[TRAPVEC_MEM_SCRATCH] = "scratch",
};

static atomic_long_t trapvec_mem_objects[TRAPVEC_MEM_KINDS];
static atomic_long_t trapvec_mem_bytes[TRAPVEC_MEM_KINDS];

void trapvec_mem_got(enum trapvec_mem_kind kind, size_t bytes)
{
	atomic_long_inc(&trapvec_mem_objects[kind]);
	atomic_long_add(bytes, &trapvec_mem_bytes[kind]);
}

void trapvec_mem_put(enum trapvec_mem_kind kind, size_t bytes)
{
	atomic_long_dec(&trapvec_mem_objects[kind]);
	atomic_long_sub(bytes, &trapvec_mem_bytes[kind]);
}

void *trapvec_kvmalloc(enum trapvec_mem_kind kind, size_t n, size_t size, gfp_t gfp)
{
	size_t bytes;
	void *p;

	if (check_mul_overflow(n, size, &bytes))
		return NULL;
	p = kvmalloc(bytes, gfp);
	if (p)
		trapvec_mem_got(kind, bytes);
	return p;
}

void trapvec_kvfree(enum trapvec_mem_kind kind, const void *p, size_t bytes)
{
	if (!p)
		return;
	trapvec_mem_put(kind, bytes);
	kvfree(p);
}

void *trapvec_vmap(enum trapvec_mem_kind kind, struct page **pages, unsigned int n)
{
	void *p = vmap(pages, n, VM_MAP, PAGE_KERNEL);

	if (p)
		trapvec_mem_got(kind, (size_t)n << PAGE_SHIFT);
	return p;
}

void trapvec_vunmap(enum trapvec_mem_kind kind, const void *p, unsigned int n)
{
	if (!p)
		return;
	trapvec_mem_put(kind, (size_t)n << PAGE_SHIFT);
	vunmap(p);
}

static int trapvec_mem_show(char *buf, const struct kernel_param *kp)
{
	int i, len = 0;

	for (i = 0; i < TRAPVEC_MEM_KINDS; i++)
		len += sysfs_emit_at(buf, len, "%s %ld %ld\n", trapvec_mem_names[i],
				     atomic_long_read(&trapvec_mem_objects[i]),
				     atomic_long_read(&trapvec_mem_bytes[i]));
	return len;
}

static const struct kernel_param_ops trapvec_mem_ops = {
	.get = trapvec_mem_show,
};

module_param_cb(allocations, &trapvec_mem_ops, NULL, 0444);
MODULE_PARM_DESC(allocations,
		 "read only: the module's live allocations, \"<kind> <objects> <bytes>\" per line");

/* Unload, after everything is freed: say whether anything is left. */
void trapvec_mem_exit(void)
{
	char left[256];
	long objects = 0;
	int i, len = 0;

	left[0] = '\0';
	for (i = 0; i < TRAPVEC_MEM_KINDS; i++) {
		long o = atomic_long_read(&trapvec_mem_objects[i]);
		long b = atomic_long_read(&trapvec_mem_bytes[i]);

		objects += o;
		if (o || b)
			len += scnprintf(left + len, sizeof(left) - len,
					 " %s %ld objects %ld bytes;", trapvec_mem_names[i], o, b);
	}
	if (!len) {
		pr_info("unloaded, 0 allocations outstanding\n");
		return;
	}
	WARN_ONCE(1, "trapvec: unloaded, %ld allocations outstanding:%s\n", objects, left);
}
