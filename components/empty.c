// SPDX-License-Identifier: GPL-2.0
/*
 * empty.c - a `call` handler that does nothing: what a splice costs by itself (the kernel
 * benchmark, tests).
 *
 *   trapctl load /components/empty.o
 *   trapctl splice __x64_sys_getppid+5 --call empty_handler
 */
#include <trapvec.h>

void empty_handler(struct trapvec_regs *regs, void *cookie);

void empty_handler(struct trapvec_regs *regs, void *cookie)
{
}
