// SPDX-License-Identifier: GPL-2.0
/*
 * Writable aliases of the text pages a batch writes.
 *
 * The alias: kernel image text is read-only in both of its mappings (the high mapping
 * and the direct map), so the page is mapped once more with vmap(PAGE_KERNEL); module
 * text is vmalloc memory (vmalloc_to_page()). One alias per batch: every page its ops write,
 * each once, in address order in one vmap(), made after the batch's checks and dropped once
 * it is written (its deferred reverts included). A live patch holds no alias: its revert maps
 * its page again, and unload and a module's going retry that allocation until it succeeds.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bsearch.h>
#include <linux/delay.h>
#include <linux/mm.h>
#include <linux/sort.h>
#include <linux/vmalloc.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

bool trapvec_core_text(unsigned long addr, u32 len)
{
	return addr >= trapvec_ksyms.stext && addr + len <= trapvec_ksyms.etext;
}

static int trapvec_cmp_page(const void *a, const void *b)
{
	const unsigned long *x = a, *y = b;

	return *x < *y ? -1 : *x > *y;
}

/* Core kernel text's pages are in the direct map; a module's text is vmalloc memory. */
static struct page *trapvec_text_page(unsigned long page)
{
	if (page < trapvec_ksyms.etext && page + PAGE_SIZE > trapvec_ksyms.stext)
		return virt_to_page((void *)page);
	return vmalloc_to_page((void *)page);
}

/*
 * Map every page that ops[0..n) write, each once, writable in one vmap(), and point each op's
 * alias at its site in it. 0; -ENOMEM; or -EFAULT with *failed the first op whose page has no
 * struct page. len <= TRAPVEC_PATCH_MAX < PAGE_SIZE: a site spans its first page and at most
 * the next, and both are then neighbours in the sorted list, so its bytes are contiguous in
 * the alias too.
 */
int trapvec_alias_map(struct trapvec_text_op *ops, u32 n, struct trapvec_alias *alias,
		      u32 *failed)
{
	u32 i, j, room = 2 * n, npages = 0;
	struct page **pages = NULL;
	unsigned long *addrs, *at;
	int ret = -ENOMEM;

	alias->vm = NULL;
	alias->pages = 0;
	*failed = TRAPVEC_NO_INDEX;
	if (!n)
		return 0;
	addrs = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, room, sizeof(*addrs), GFP_KERNEL);
	if (!addrs)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		const struct trapvec_live_patch *r = ops[i].rec;

		addrs[npages++] = r->addr & PAGE_MASK;
		if (((r->addr + r->len - 1) & PAGE_MASK) != (r->addr & PAGE_MASK))
			addrs[npages++] = (r->addr + r->len - 1) & PAGE_MASK;
	}
	sort(addrs, npages, sizeof(*addrs), trapvec_cmp_page, NULL);
	for (i = 1, j = 1; i < npages; i++)
		if (addrs[i] != addrs[j - 1])
			addrs[j++] = addrs[i];
	npages = j;
	pages = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, npages, sizeof(*pages), GFP_KERNEL);
	if (!pages)
		goto out;
	for (i = 0; i < npages; i++) {
		pages[i] = trapvec_text_page(addrs[i]);
		if (pages[i])
			continue;
		/* The first op that writes this page: its index is the culprit. */
		for (j = 0; j < n; j++) {
			const struct trapvec_live_patch *r = ops[j].rec;

			if ((r->addr & PAGE_MASK) == addrs[i] ||
			    ((r->addr + r->len - 1) & PAGE_MASK) == addrs[i]) {
				*failed = j;
				break;
			}
		}
		ret = -EFAULT;
		goto out;
	}
	alias->vm = trapvec_vmap(TRAPVEC_MEM_ALIAS, pages, npages);
	if (!alias->vm)
		goto out;
	alias->pages = npages;
	for (i = 0; i < n; i++) {
		unsigned long page = ops[i].rec->addr & PAGE_MASK;

		at = bsearch(&page, addrs, npages, sizeof(*addrs), trapvec_cmp_page);
		if (WARN_ON_ONCE(!at)) {
			trapvec_alias_unmap(alias);
			ret = -EFAULT;
			goto out;
		}
		ops[i].alias = (u8 *)alias->vm + (at - addrs) * PAGE_SIZE +
			       offset_in_page(ops[i].rec->addr);
	}
	ret = 0;
out:
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, pages, npages * sizeof(*pages));
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, addrs, room * sizeof(*addrs));
	return ret;
}

void trapvec_alias_unmap(struct trapvec_alias *alias)
{
	trapvec_vunmap(TRAPVEC_MEM_ALIAS, alias->vm, alias->pages);
	alias->vm = NULL;
	alias->pages = 0;
}

/*
 * The reverts of unload and of a module's text going cannot fail: the alias is retried until
 * it is made. A page without a struct page cannot be a live patch's (its text is mapped while
 * it is live): should it happen, WARN, and write nothing (the patches are left as they are).
 */
bool trapvec_alias_map_retry(struct trapvec_text_op *ops, u32 n, struct trapvec_alias *alias)
{
	u32 failed;
	int ret;

	while ((ret = trapvec_alias_map(ops, n, alias, &failed)) == -ENOMEM) {
		pr_warn_ratelimited("waiting for memory to map the text of %u live patches\n", n);
		msleep(100);
	}
	return !WARN_ON_ONCE(ret);
}
