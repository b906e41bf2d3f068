// SPDX-License-Identifier: GPL-2.0
/*
 * rprec.c - a return handler for a recursive function, for the recursion test
 * (vmtest/scenarios/kernel_returns.sh, with vmtest/helpers/epnest.c).
 *
 *   trapctl load /components/rprec.o
 *   trapctl set rprec_top <DEPTH - 1>
 *   trapctl set rprec_self 0x<ep_loop_check_proc>; trapctl set rprec_self_end 0x<its end>
 *   trapctl splice ep_loop_check_proc --return --call rprec_ret
 *
 * ep_loop_check_proc(ep, depth) calls itself once per level of a chain of nested epoll
 * instances and returns the depth of the chain below it: with a chain of DEPTH levels, the call
 * made at depth d (its second argument, kept from the entry in call->args[1]) returns
 * DEPTH - 1 - d, and returns into the function itself when d > 0, into its caller when d == 0.
 * A return handed the registers or the entry of another call of the recursion (a return
 * address or an instance mixed up between the levels) breaks one of those, so each return is
 * checked for both: rprec_match counts those that hold. rprec_calls counts the returns,
 * rprec_inner those into the function itself, rprec_depth_sum adds up the depths.
 * Runs with preemption off, on any CPU at once: the counters are atomic.
 */
#include <linux/compiler.h>
#include <linux/types.h>
#include <trapvec.h>

unsigned long rprec_top;
unsigned long rprec_self;
unsigned long rprec_self_end;
unsigned long rprec_calls;
unsigned long rprec_match;
unsigned long rprec_inner;
unsigned long rprec_depth_sum;

void rprec_ret(struct trapvec_regs *regs, struct trapvec_call *call);

void rprec_ret(struct trapvec_regs *regs, struct trapvec_call *call)
{
	/* int depth, int result: the low halves of rsi at the entry and of rax now. */
	long depth = (int)call->args[1];
	long result = (int)regs->rax;
	bool inner = call->ret >= READ_ONCE(rprec_self) && call->ret < READ_ONCE(rprec_self_end);

	__atomic_fetch_add(&rprec_calls, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&rprec_depth_sum, depth, __ATOMIC_RELAXED);
	if (inner)
		__atomic_fetch_add(&rprec_inner, 1, __ATOMIC_RELAXED);
	if (result == (long)READ_ONCE(rprec_top) - depth && inner == (depth > 0))
		__atomic_fetch_add(&rprec_match, 1, __ATOMIC_RELAXED);
}
