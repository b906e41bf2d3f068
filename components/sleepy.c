// SPDX-License-Identifier: GPL-2.0
/*
 * sleepy.c - a replacement that sleeps: getppid() that takes sleepy_ms (default 2000) and
 * returns 4242. The lifetimes test (vmtest/scenarios/kernel_lifetimes.sh) unsplices it,
 * unloads it and unloads trapvec.ko while a task sleeps inside it; none of that may free
 * code the task will return through.
 *
 *   trapctl load /components/sleepy.o
 *   trapctl splice __x64_sys_getppid --replace sleepy_getppid
 *
 * Declares no splice of its own (sleepy_decl.c does, for `trapctl unload` during the sleep).
 */
#include <linux/compiler.h>
#include <linux/delay.h>
#include <linux/ptrace.h>
#include <trapvec.h>

/* The result a replaced getppid() returns: no process of the test has that parent. */
#define SLEEPY_RESULT 4242

unsigned long sleepy_ms = 2000;
unsigned long sleepy_entered;
unsigned long sleepy_left;

long sleepy_getppid(const struct pt_regs *regs);

long sleepy_getppid(const struct pt_regs *regs)
{
	WRITE_ONCE(sleepy_entered, READ_ONCE(sleepy_entered) + 1);
	/* Sleeps in TASK_UNINTERRUPTIBLE: a voluntary context switch inside the component. */
	msleep(READ_ONCE(sleepy_ms));
	WRITE_ONCE(sleepy_left, READ_ONCE(sleepy_left) + 1);
	return SLEEPY_RESULT;
}
