/* SPDX-License-Identifier: GPL-2.0 */
/* Arena sizes and where the code arena comes from, shared by arena.c and arena_text.S. */
#ifndef _TRAPVEC_ARENA_H
#define _TRAPVEC_ARENA_H

#include <linux/version.h>

/*
 * Until 6.9 the code arena is a NOBITS "ax" section of the module's own text (arena_text.S).
 * Since 6.10 module_alloc() is gone, and on kernels with IBT (6.12's) objtool validates the
 * linked module as a whole, where a per-file exemption no longer applies, and it cannot read
 * an executable section without contents (it crashes). There the arena is allocated at load
 * from the module area (execmem_alloc(EXECMEM_MODULE_TEXT): within rel32 reach of the kernel,
 * as module text is), filled with int3 and made read-only and executable with
 * set_memory_rox(), both found at run time; execmem_free() gives it back at unload.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
#define TRAPVEC_RUNTIME_ARENA 1
#else
#define TRAPVEC_RUNTIME_ARENA 0
#endif

/*
 * 16 MiB of code and 4 MiB of data: 200,000 count sites at once (user space sizes a count
 * site's code block to its replay, 16 or 32 bytes, and gives it a 16-byte data block), with
 * room for components and 512-byte trampolines beside them. The code is module text (or the
 * module area), so it is resident while the module is loaded, with 8 MiB of in-flight counters
 * (8 bytes per 16-byte grain, arena.c) and the data arena in .bss.
 */
#define TRAPVEC_CODE_ARENA_SIZE	(16 << 20)
#define TRAPVEC_DATA_ARENA_SIZE	(4 << 20)
/* Allocation granularity (and alignment) of arena blocks. */
#define TRAPVEC_ARENA_GRAIN	16

#ifdef __KERNEL__
#ifndef __ASSEMBLY__
/* arena.c: a dispatch entry starts (1) or stops (-1) sending CPUs to addr. */
void trapvec_arena_pin(unsigned long addr, int delta);
#endif
#endif

#endif /* _TRAPVEC_ARENA_H */
