// SPDX-License-Identifier: GPL-2.0
/*
 * Writable aliases of the text pages a live patch writes.
 *
 * The alias: kernel image text is read-only in both of its mappings (the high mapping
 * and the direct map), so the page is mapped once more with vmap(PAGE_KERNEL); module
 * text is vmalloc memory (vmalloc_to_page()). The alias of a live patch is kept with its
 * record, so that reverting it (even at unload) allocates nothing.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/vmalloc.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

bool trapvec_core_text(unsigned long addr, u32 len)
{
	return addr >= trapvec_ksyms.stext && addr + len <= trapvec_ksyms.etext;
}

/* Map the page(s) of [addr, addr + len) writable; len <= TRAPVEC_PATCH_MAX < PAGE_SIZE. */
int trapvec_map_alias(struct trapvec_live_patch *r)
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
	r->vm = trapvec_vmap(TRAPVEC_MEM_ALIAS, pages, n);
	if (!r->vm)
		return -ENOMEM;
	r->vm_pages = n;
	r->alias = (u8 *)r->vm + offset_in_page(r->addr);
	return 0;
}
