// SPDX-License-Identifier: GPL-2.0
/*
 * rpret.c - a return handler: what getppid() returned, for the return-point test
 * (vmtest/scenarios/kernel_returns.sh).
 *
 *   trapctl load /components/rpret.o
 *   trapctl set rpret_want <pid>
 *   trapctl splice __x64_sys_getppid --return --call rpret_getppid
 *
 * Each return of the function: rpret_last takes the return value (regs->rax), rpret_calls
 * counts the returns and rpret_match those that returned rpret_want. Runs with preemption off,
 * on any CPU at once: the counters are atomic.
 */
#include <linux/compiler.h>
#include <linux/types.h>
#include <trapvec.h>

unsigned long rpret_want;
unsigned long rpret_last;
unsigned long rpret_calls;
unsigned long rpret_match;

void rpret_getppid(struct trapvec_regs *regs, struct trapvec_call *call);

void rpret_getppid(struct trapvec_regs *regs, struct trapvec_call *call)
{
	WRITE_ONCE(rpret_last, regs->rax);
	__atomic_fetch_add(&rpret_calls, 1, __ATOMIC_RELAXED);
	if (regs->rax == READ_ONCE(rpret_want))
		__atomic_fetch_add(&rpret_match, 1, __ATOMIC_RELAXED);
}
