// SPDX-License-Identifier: GPL-2.0
/*
 * Kernel symbols trapvec needs but the kernel does not export.
 *
 * Site validation needs the kernel's own answers (is this an exception-table instruction, an
 * ftrace site, a jump label, ...), and the functions that give them are not exported to
 * modules; nor are the section bounds of entry and noinstr text, nor the kernel's tables
 * (jump labels, static calls, bugs), nor what kprobes keep (their table, get_kprobe(), their
 * blacklist and the mutex that guards both), which trapvec reads and extends to keep kprobes
 * and its own patches apart. kallsyms_lookup_name()
 * finds all of them, but it has not been exported either since 5.7. kprobes resolve a probe
 * given by name with kallsyms_lookup_name() itself, so registering a kprobe on the symbol
 * "kallsyms_lookup_name" (disabled: nothing is armed) and reading back kp.addr yields its
 * address. Everything is resolved once at load time; a missing symbol fails the load.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/printk.h>

#include "trapvec_arena.h"
#include "trapvec_internal.h"
#include "trapvec_idle.h"

struct trapvec_ksyms trapvec_ksyms;

typedef unsigned long (*trapvec_lookup_name_t)(const char *name);

static trapvec_lookup_name_t trapvec_find_lookup_name(void)
{
	struct kprobe kp = {
		.symbol_name = "kallsyms_lookup_name",
		.flags = KPROBE_FLAG_DISABLED,
	};
	trapvec_lookup_name_t fn;
	int ret;

	ret = register_kprobe(&kp);
	if (ret < 0) {
		pr_err("cannot find kallsyms_lookup_name through a kprobe: %d\n", ret);
		return NULL;
	}
	fn = (trapvec_lookup_name_t)kp.addr;
	unregister_kprobe(&kp);
	return fn;
}

/* Kept for lookups after load (trapvec_ksym()). */
static trapvec_lookup_name_t trapvec_lookup_name;

/* A kernel symbol's address by name, 0 if absent (reserved.c's lists of functions). */
unsigned long trapvec_ksym(const char *name)
{
	return trapvec_lookup_name ? trapvec_lookup_name(name) : 0;
}

struct trapvec_ksym_ref {
	const char *name;
	unsigned long *slot;
	bool optional;		/* absent on some kernels: the slot stays 0 */
};

int trapvec_ksyms_init(void)
{
	struct trapvec_ksyms *k = &trapvec_ksyms;
	/*
	 * Function pointers are stored through unsigned long slots: the table below fills
	 * each with the symbol's address, and the typed members read it back.
	 */
	const struct trapvec_ksym_ref refs[] = {
		{ "kallsyms_lookup_size_offset",
		  (unsigned long *)&k->kallsyms_lookup_size_offset },
		{ "search_exception_tables", (unsigned long *)&k->search_exception_tables },
		{ "ftrace_location_range", (unsigned long *)&k->ftrace_location_range },
		{ "jump_label_text_reserved", (unsigned long *)&k->jump_label_text_reserved },
		{ "static_call_text_reserved", (unsigned long *)&k->static_call_text_reserved },
		{ "find_bug", (unsigned long *)&k->find_bug },
		{ "within_kprobe_blacklist", (unsigned long *)&k->within_kprobe_blacklist },
		{ "__module_text_address", (unsigned long *)&k->module_text_address },
		{ "insn_decode", (unsigned long *)&k->insn_decode },
		{ "arch_jump_entry_size", (unsigned long *)&k->arch_jump_entry_size },
		{ "alternatives_text_reserved",
		  (unsigned long *)&k->alternatives_text_reserved },
		{ "text_mutex", (unsigned long *)&k->text_mutex },
		{ "get_kprobe", (unsigned long *)&k->get_kprobe },
		{ "aggr_pre_handler", (unsigned long *)&k->kprobe_aggr_pre_handler },
		{ "__is_insn_slot_addr", (unsigned long *)&k->is_insn_slot_addr },
		{ "is_bpf_text_address", (unsigned long *)&k->is_bpf_text_address },
		{ "is_ftrace_trampoline", (unsigned long *)&k->is_ftrace_trampoline },
		{ "kprobe_insn_slots", (unsigned long *)&k->kprobe_insn_slots },
		{ "kprobe_optinsn_slots", (unsigned long *)&k->kprobe_optinsn_slots },
		{ "kprobe_mutex", (unsigned long *)&k->kprobe_mutex },
		{ "kprobe_blacklist", (unsigned long *)&k->kprobe_blacklist },
		{ "modules_disabled", (unsigned long *)&k->modules_disabled },
		/* The dispatcher makes RCU watch a trap taken in idle (dispatch.c). */
		{ "ct_nmi_enter", (unsigned long *)&k->ct_nmi_enter },
		{ "ct_nmi_exit", (unsigned long *)&k->ct_nmi_exit },
		{ "_stext", &k->stext },
		{ "_etext", &k->etext },
		{ "__entry_text_start", &k->entry_text_start },
		{ "__entry_text_end", &k->entry_text_end },
		{ "__noinstr_text_start", &k->noinstr_text_start },
		{ "__noinstr_text_end", &k->noinstr_text_end },
		/*
		 * 6.1 only: 6.12 has no bounds around its thunk sections; its thunks are refused
		 * by name (check.c) on both.
		 */
		{ "__indirect_thunk_start", &k->thunk_start, true },
		{ "__indirect_thunk_end", &k->thunk_end, true },
		{ "__cpuidle_text_start", &k->cpuidle_text_start },
		{ "__cpuidle_text_end", &k->cpuidle_text_end },
		{ "__static_call_text_start", &k->static_call_text_start },
		{ "__static_call_text_end", &k->static_call_text_end },
		{ "spurious_entries_start", &k->spurious_entries_start },
		{ "__start___jump_table", &k->jump_table_start },
		{ "__stop___jump_table", &k->jump_table_end },
		{ "__start_static_call_sites", &k->static_call_sites_start },
		{ "__stop_static_call_sites", &k->static_call_sites_end },
		{ "__start___bug_table", &k->bug_table_start },
		{ "__stop___bug_table", &k->bug_table_end },
		{ "__start___ex_table", &k->ex_table_start },
		{ "__stop___ex_table", &k->ex_table_end },
#if TRAPVEC_RUNTIME_ARENA
		{ "execmem_alloc", (unsigned long *)&k->execmem_alloc },
		{ "execmem_free", (unsigned long *)&k->execmem_free },
		{ "set_memory_rox", (unsigned long *)&k->set_memory_rox },
#endif
	};
	trapvec_lookup_name_t lookup;
	unsigned int i;

	BUILD_BUG_ON(sizeof(k->find_bug) != sizeof(unsigned long));

	lookup = trapvec_find_lookup_name();
	if (!lookup)
		return -ENOENT;
	trapvec_lookup_name = lookup;

	for (i = 0; i < ARRAY_SIZE(refs); i++) {
		unsigned long addr = lookup(refs[i].name);

		if (!addr && refs[i].optional) {
			pr_debug("optional kernel symbol %s not found\n", refs[i].name);
			continue;
		}
		if (!addr) {
			pr_err("kernel symbol %s not found\n", refs[i].name);
			return -ENOENT;
		}
		*refs[i].slot = addr;
		pr_debug("resolved %s\n", refs[i].name);
	}
	return 0;
}
