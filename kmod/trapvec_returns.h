/* SPDX-License-Identifier: GPL-2.0 */
/* Sizes of the return runtime, shared by returns.S and returns.c. */
#ifndef _TRAPVEC_RETURNS_H
#define _TRAPVEC_RETURNS_H

/* Calls with a pending return, in all tasks and return points together. */
#define TRAPVEC_RP_INSTANCES	4096
/* Bytes per stub: nop; push $i; jmp trapvec_rp_common; int3; padding. */
#define TRAPVEC_RP_STUB_SIZE	16

#endif /* _TRAPVEC_RETURNS_H */
