/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The way out of every "replace" trampoline (see arena.c, "Tasks in flight").
 *
 * A replace trampoline in the code arena counts the tasks inside its replacement: it
 * increments the counter of its code block, calls the replacement, and then jumps here
 * with %r11 = the address of that counter and %rsp pointing at its caller's return address,
 * exactly as at the replaced function's own ret. This stub decrements the counter and
 * returns to the caller.
 *
 * Why the decrement is not in the trampoline itself: after "lock decq" a task would still
 * have to execute the trampoline's ret, inside a block that QUIESCE may reclaim as soon as it
 * reads the counter as zero; a task preempted (preempt=full) or interrupted between the two
 * would resume in freed code. Here, the instructions after the decrement are module text,
 * which lives until unload, and unload waits for an RCU-tasks grace period after the
 * counters reached zero. %r11 is free at a function's return: caller-saved and no return
 * value. The arithmetic flags are dead there too.
 */
#include <linux/linkage.h>
#include <asm/asm.h>
#include <asm/nospec-branch.h>

	.text

SYM_FUNC_START(trapvec_replace_ret)
	lock decq	(%r11)
	RET
SYM_FUNC_END(trapvec_replace_ret)
_ASM_NOKPROBE(trapvec_replace_ret)
