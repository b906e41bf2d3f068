/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The code arena: room for trampolines and component code inside the
 * module's own text.
 *
 * Module text lies in the module mapping, within +-2 GiB of the kernel image, so rel32
 * reaches from kernel text into the arena and back, and it is executable without
 * set_memory_x() or module_alloc() (neither is exported). The section is SHT_NOBITS
 * ("ax", @nobits): it adds nothing to the .ko file, the module loader places it with the
 * rest of the text (it goes by the flags) and zero-fills it, and arena.c fills it with int3
 * through a writable alias before anything can jump there. It holds no code at build time,
 * so objtool is told to skip this file (Kbuild). Since 6.10 the arena is allocated at load
 * instead (trapvec_arena.h says why) and this file is empty.
 */
#include <linux/linkage.h>
#include <asm/page_types.h>

#include "trapvec_arena.h"

#if !TRAPVEC_RUNTIME_ARENA
	.section .trapvec_arena, "ax", @nobits
	.balign	PAGE_SIZE
	.globl	trapvec_code_arena
	.type	trapvec_code_arena, @object
trapvec_code_arena:
	.skip	TRAPVEC_CODE_ARENA_SIZE
	.size	trapvec_code_arena, TRAPVEC_CODE_ARENA_SIZE
#endif
