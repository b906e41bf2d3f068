/* SPDX-License-Identifier: GPL-2.0 */
/* Arena sizes, shared by arena.c and arena_text.S. */
#ifndef _TRAPVEC_ARENA_H
#define _TRAPVEC_ARENA_H

/*
 * 8 MiB of code: user space takes 512 bytes per splice, so 16,384 splices live at once
 * (a batch of 10,000 count splices and the components beside it). It is module text, so it
 * is resident while the module is loaded, with 4 MiB of in-flight counters (8 bytes per
 * 16-byte grain, arena.c) in .bss.
 */
#define TRAPVEC_CODE_ARENA_SIZE	(8 << 20)
#define TRAPVEC_DATA_ARENA_SIZE	(1 << 20)
/* Allocation granularity (and alignment) of arena blocks. */
#define TRAPVEC_ARENA_GRAIN	16

#endif /* _TRAPVEC_ARENA_H */
