/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Code that runs where RCU does not see the CPU: the idle loop in RCU-idle (jmp_rcu.c makes a
 * jmp splice's handler run with RCU watching there) and a CPU going offline after
 * rcu_report_dead() (reserved.c refuses sites in the functions it runs).
 */
#ifndef _TRAPVEC_IDLE_H
#define _TRAPVEC_IDLE_H

#include <linux/types.h>

/* ksyms.c: a kernel symbol's address by name (kallsyms_lookup_name()), 0 if absent. */
unsigned long trapvec_ksym(const char *name);

/* reserved.c: the functions of the CPU-offline path after rcu_report_dead(). */
void trapvec_dead_cpu_init(void);
u32 trapvec_dead_cpu_check(unsigned long addr, u32 len, u64 *culprit);

/* jmp_rcu.c: called by a jmp splice's call trampoline around its handler. */
unsigned long trapvec_jmp_rcu_enter(void);
void trapvec_jmp_rcu_exit(void);

#endif /* _TRAPVEC_IDLE_H */
