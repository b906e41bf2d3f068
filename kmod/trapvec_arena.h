/* SPDX-License-Identifier: GPL-2.0 */
/* Arena sizes, shared by arena.c and arena_text.S. */
#ifndef _TRAPVEC_ARENA_H
#define _TRAPVEC_ARENA_H

#define TRAPVEC_CODE_ARENA_SIZE	(1 << 20)
#define TRAPVEC_DATA_ARENA_SIZE	(1 << 20)
/* Allocation granularity (and alignment) of arena blocks. */
#define TRAPVEC_ARENA_GRAIN	16

#endif /* _TRAPVEC_ARENA_H */
