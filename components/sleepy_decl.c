// SPDX-License-Identifier: GPL-2.0
/*
 * sleepy_decl.c - sleepy.c's sleeping getppid() (2 s, returns 4343), with the splice declared
 * in the component: `trapctl load` applies it and `trapctl unload` removes it, like a livepatch.
 * For the lifetimes test: the component is unloaded while a task sleeps inside it.
 *
 *   trapctl load /components/sleepy_decl.o      # getppid() now sleeps 2 s
 *   trapctl unload sleepy_decl
 */
#include <linux/delay.h>
#include <linux/ptrace.h>
#include <trapvec.h>

long sleepy_decl_getppid(const struct pt_regs *regs);

long sleepy_decl_getppid(const struct pt_regs *regs)
{
	msleep(2000);
	return 4343;
}

TRAPVEC_SPLICE_REPLACE(getppid, "__x64_sys_getppid", sleepy_decl_getppid, "trap");
