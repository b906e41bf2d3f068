/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What differs between the kernels trapvec.ko is built for: Debian 12's 6.1 and Debian 13's 6.12
 * (bookworm-backports). Each difference is one helper here, named for what the module needs,
 * so that the rest of the module reads the same on both.
 */
#ifndef TRAPVEC_COMPAT_H
#define TRAPVEC_COMPAT_H

#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/version.h>

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
#include <linux/unaligned.h>	/* moved from asm/ in 6.12 */
#else
#include <asm/unaligned.h>
#endif

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
#include <asm/current.h>	/* current_task lives in pcpu_hot since 6.2 */
#endif

/*
 * The executable text of a module's core (not its init): core_layout until 6.3, one region of
 * mod->mem[] since 6.4, where text, rodata and data are no longer one contiguous layout.
 */
static inline unsigned long trapvec_module_text_base(const struct module *mod)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	return (unsigned long)mod->mem[MOD_TEXT].base;
#else
	return (unsigned long)mod->core_layout.base;
#endif
}

static inline unsigned long trapvec_module_text_size(const struct module *mod)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	return mod->mem[MOD_TEXT].size;
#else
	return mod->core_layout.text_size;
#endif
}

/* The module's whole core: the layout until 6.3, its text region since (what INFO reports). */
static inline unsigned long trapvec_module_core_size(const struct module *mod)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
	return mod->mem[MOD_TEXT].size;
#else
	return mod->core_layout.size;
#endif
}

/*
 * The per-CPU offset of the running task's pointer (x86-64 per-CPU symbols are offsets from
 * the CPU's %gs base): current_task until 6.1, pcpu_hot.current_task since 6.2.
 */
static inline unsigned long trapvec_current_task_offset(void)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 2, 0)
	return (unsigned long)&pcpu_hot.current_task;
#else
	return (unsigned long)&current_task;
#endif
}

/*
 * A range of ours on the kprobes blacklist. 6.1's kprobe_blacklist_entry carries an rcu_head,
 * 6.12's does not; ours always does, so a removed entry is freed after a grace period on both
 * (kfree_rcu()), whatever the kernel's readers of the list hold.
 */
struct trapvec_blacklist_entry {
	struct kprobe_blacklist_entry entry;
	struct rcu_head rcu;
};

#endif /* TRAPVEC_COMPAT_H */
