// SPDX-License-Identifier: GPL-2.0
/*
 * Text the kernel rewrites by itself (jump labels, static calls) or keys by address (BUG/WARN
 * ud2 sites), as sorted snapshots of the core kernel's tables.
 *
 * jump_label_text_reserved(), static_call_text_reserved() and find_bug() scan their tables
 * linearly (thousands of entries each); at three scans per site that was most of the cost of a
 * thousand-site batch. The core kernel's tables do not change after boot (init entries are
 * skipped: their text is gone), so the module sorts their ranges once at load and answers by
 * binary search. Module text is rare and its tables come and go with the module: for it the
 * kernel's own functions are asked.
 *
 * The same goes for branch targets no decoder sees: the target of every jump label (the kernel
 * writes a jmp there when the key flips) and the fix-up of every exception-table entry (a fault
 * elsewhere resumes there). A window may start at one but not cover one past its first byte:
 * the CPU would land in the middle of the new bytes. The core kernel's are sorted at load;
 * a module's are searched in its own tables (a few dozen entries) at each check.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bug.h>
#include <linux/extable.h>
#include <linux/jump_label.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/static_call_types.h>
#include <asm/text-patching.h>

#include "trapvec_internal.h"
#include "trapvec_idle.h"

/* One reserved range [start, start + len) and why it is reserved. */
struct trapvec_reserved {
	unsigned long start;
	u32 len;
	u32 reason;
};

static struct trapvec_reserved *trapvec_rsv;
static size_t trapvec_rsv_count;
static size_t trapvec_rsv_cap;	/* entries allocated */
/* The longest reserved range: how far before addr an overlapping range may start. */
static u32 trapvec_rsv_maxlen;

static int trapvec_rsv_cmp(const void *a, const void *b)
{
	const struct trapvec_reserved *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

static void trapvec_rsv_add(unsigned long start, u32 len, u32 reason)
{
	struct trapvec_reserved *r = &trapvec_rsv[trapvec_rsv_count++];

	r->start = start;
	r->len = len;
	r->reason = reason;
	trapvec_rsv_maxlen = max(trapvec_rsv_maxlen, len);
}

/* A branch target the decoder cannot see, and the table entry that makes it one. */
struct trapvec_hidden {
	unsigned long addr;
	unsigned long entry;	/* struct jump_entry or struct exception_table_entry */
	u32 reason;		/* TRAPVEC_REASON_JUMP_TARGET or TRAPVEC_REASON_EXTABLE_FIXUP */
};

static struct trapvec_hidden *trapvec_hid;
static size_t trapvec_hid_count;
static size_t trapvec_hid_cap;	/* entries allocated */

static int trapvec_hid_cmp(const void *a, const void *b)
{
	const struct trapvec_hidden *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* Where a fault at e->insn resumes: ex_fixup_addr() of arch/x86/mm/extable.c. */
static unsigned long trapvec_ex_fixup(const struct exception_table_entry *e)
{
	return (unsigned long)&e->fixup + e->fixup;
}

static void trapvec_hid_add(unsigned long addr, const void *entry, u32 reason)
{
	struct trapvec_hidden *h = &trapvec_hid[trapvec_hid_count++];

	h->addr = addr;
	h->entry = (unsigned long)entry;
	h->reason = reason;
}

static int trapvec_hidden_init(void)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	struct jump_entry *je, *je_end = (struct jump_entry *)k->jump_table_end;
	struct exception_table_entry *ex, *ex_end = (struct exception_table_entry *)k->ex_table_end;
	size_t cap;

	cap = (je_end - (struct jump_entry *)k->jump_table_start) +
	      (ex_end - (struct exception_table_entry *)k->ex_table_start);
	trapvec_hid = trapvec_kvmalloc(TRAPVEC_MEM_RESERVED, cap, sizeof(*trapvec_hid), GFP_KERNEL);
	trapvec_hid_cap = cap;
	if (!trapvec_hid)
		return -ENOMEM;
	for (je = (struct jump_entry *)k->jump_table_start; je < je_end; je++)
		if (!jump_entry_is_init(je))
			trapvec_hid_add(jump_entry_target(je), je, TRAPVEC_REASON_JUMP_TARGET);
	/* Entries of init text stay in the table; their fix-ups are no window's business. */
	for (ex = (struct exception_table_entry *)k->ex_table_start; ex < ex_end; ex++)
		trapvec_hid_add(trapvec_ex_fixup(ex), ex, TRAPVEC_REASON_EXTABLE_FIXUP);
	sort(trapvec_hid, trapvec_hid_count, sizeof(*trapvec_hid), trapvec_hid_cmp, NULL);
	pr_debug("%zu hidden branch targets in core kernel text\n", trapvec_hid_count);
	return 0;
}

static void trapvec_hidden_exit(void)
{
	trapvec_kvfree(TRAPVEC_MEM_RESERVED, trapvec_hid, trapvec_hid_cap * sizeof(*trapvec_hid));
	trapvec_hid = NULL;
	trapvec_hid_count = 0;
}

int trapvec_reserved_init(void)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	struct jump_entry *je, *je_end = (struct jump_entry *)k->jump_table_end;
	struct static_call_site *sc, *sc_end = (struct static_call_site *)k->static_call_sites_end;
	struct bug_entry *bug, *bug_end = (struct bug_entry *)k->bug_table_end;
	size_t cap;

	cap = je_end - (struct jump_entry *)k->jump_table_start +
	      (sc_end - (struct static_call_site *)k->static_call_sites_start) +
	      (bug_end - (struct bug_entry *)k->bug_table_start);
	trapvec_rsv = trapvec_kvmalloc(TRAPVEC_MEM_RESERVED, cap, sizeof(*trapvec_rsv), GFP_KERNEL);
	trapvec_rsv_cap = cap;
	if (!trapvec_rsv)
		return -ENOMEM;

	for (je = (struct jump_entry *)k->jump_table_start; je < je_end; je++) {
		if (jump_entry_is_init(je))
			continue;
		/* 2 (jmp8/nop2) or 5 bytes; the kernel decodes the site to tell. */
		trapvec_rsv_add(jump_entry_code(je), k->arch_jump_entry_size(je),
				TRAPVEC_REASON_JUMP_LABEL);
	}
	for (sc = (struct static_call_site *)k->static_call_sites_start; sc < sc_end; sc++) {
		if (sc->key & STATIC_CALL_SITE_INIT)
			continue;
		/* A call or a tail jmp with rel32. */
		trapvec_rsv_add((unsigned long)&sc->addr + sc->addr, CALL_INSN_SIZE,
				TRAPVEC_REASON_STATIC_CALL);
	}
	for (bug = (struct bug_entry *)k->bug_table_start; bug < bug_end; bug++)
		/* find_bug() matches the ud2's address; the ud2 is 2 bytes. */
		trapvec_rsv_add((unsigned long)&bug->bug_addr_disp + bug->bug_addr_disp, 2,
				TRAPVEC_REASON_BUG_ENTRY);

	sort(trapvec_rsv, trapvec_rsv_count, sizeof(*trapvec_rsv), trapvec_rsv_cmp, NULL);
	pr_debug("%zu reserved ranges in core kernel text\n", trapvec_rsv_count);
	if (trapvec_hidden_init()) {
		trapvec_reserved_exit();
		return -ENOMEM;
	}
	trapvec_dead_cpu_init();
	return 0;
}

void trapvec_reserved_exit(void)
{
	trapvec_hidden_exit();
	trapvec_kvfree(TRAPVEC_MEM_RESERVED, trapvec_rsv, trapvec_rsv_cap * sizeof(*trapvec_rsv));
	trapvec_rsv = NULL;
	trapvec_rsv_count = 0;
}

/* Core kernel text: the first reserved range overlapping [addr, addr + len). */
static u32 trapvec_reserved_core(unsigned long addr, u32 len)
{
	unsigned long from = addr - min_t(unsigned long, addr, trapvec_rsv_maxlen);
	size_t lo = 0, hi = trapvec_rsv_count;

	/* The first range starting at or after from: earlier ones end before addr. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (trapvec_rsv[mid].start < from)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < trapvec_rsv_count && trapvec_rsv[lo].start < addr + len; lo++)
		if (trapvec_rsv[lo].start + trapvec_rsv[lo].len > addr)
			return trapvec_rsv[lo].reason;
	return TRAPVEC_REASON_NONE;
}

/* Module text: the kernel's own (linear) lookups. */
static u32 trapvec_reserved_module(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	void *start = (void *)addr, *last = (void *)(addr + len - 1);
	u32 i;

	if (k->jump_label_text_reserved(start, last))
		return TRAPVEC_REASON_JUMP_LABEL;
	if (k->static_call_text_reserved(start, last))
		return TRAPVEC_REASON_STATIC_CALL;
	for (i = 0; i < len; i++)
		if (k->find_bug(addr + i))
			return TRAPVEC_REASON_BUG_ENTRY;
	return TRAPVEC_REASON_NONE;
}

u32 trapvec_reserved_check(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;

	if (addr >= k->stext && addr + len <= k->etext)
		return trapvec_reserved_core(addr, len);
	return trapvec_reserved_module(addr, len);
}

/* Core kernel text: the first hidden target in (addr, addr + len), by binary search. */
static u32 trapvec_hidden_core(unsigned long addr, u32 len, u64 *culprit, unsigned long *at)
{
	size_t lo = 0, hi = trapvec_hid_count;

	/* The first target past addr: one at addr is where the window starts, which is fine. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (trapvec_hid[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == trapvec_hid_count || trapvec_hid[lo].addr >= addr + len)
		return TRAPVEC_REASON_NONE;
	*culprit = trapvec_hid[lo].entry;
	*at = trapvec_hid[lo].addr;
	return trapvec_hid[lo].reason;
}

/*
 * Module text: its own jump entries and exception table, searched in place. The module cannot
 * go meanwhile: its memory is freed after an RCU grace period, and preemption is off here.
 */
static u32 trapvec_hidden_module(unsigned long addr, u32 len, u64 *culprit, unsigned long *at)
{
	u32 reason = TRAPVEC_REASON_NONE;
	struct module *mod;
	unsigned int i;

	preempt_disable();
	mod = trapvec_ksyms.module_text_address(addr);
	if (!mod)
		goto out;
#ifdef CONFIG_JUMP_LABEL
	for (i = 0; i < mod->num_jump_entries; i++) {
		struct jump_entry *je = &mod->jump_entries[i];

		*at = jump_entry_target(je);
		if (*at > addr && *at < addr + len) {
			*culprit = (unsigned long)je;
			reason = TRAPVEC_REASON_JUMP_TARGET;
			goto out;
		}
	}
#endif
	for (i = 0; i < mod->num_exentries; i++) {
		*at = trapvec_ex_fixup(&mod->extable[i]);
		if (*at > addr && *at < addr + len) {
			*culprit = (unsigned long)&mod->extable[i];
			reason = TRAPVEC_REASON_EXTABLE_FIXUP;
			goto out;
		}
	}
out:
	preempt_enable();
	return reason;
}

u32 trapvec_hidden_check(unsigned long addr, u32 len, u64 *culprit)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long at = 0;
	u32 reason;

	if (addr >= k->stext && addr + len <= k->etext)
		reason = trapvec_hidden_core(addr, len, culprit, &at);
	else
		reason = trapvec_hidden_module(addr, len, culprit, &at);
	if (reason)
		pr_debug("%pS: %s at %pS inside the window\n", (void *)addr,
			 reason == TRAPVEC_REASON_JUMP_TARGET ? "jump-label target" : "exception fix-up",
			 (void *)at);
	return reason;
}

/*
 * The CPU-offline path after rcu_report_dead(). The dying CPU's idle task calls
 * cpuhp_report_idle_dead() (do_idle(), kernel/sched/idle.c), which removes the CPU from RCU's
 * masks (rcu_report_dead() in 6.1, rcutree_report_cpu_dead() in 6.12), then
 * arch_cpu_idle_dead() -> native_play_dead() -> play_dead_common() (idle_task_exit(), the
 * "dead" report: cpu_report_death() in 6.1, cpuhp_ap_report_dead() in 6.12), tboot_shutdown(),
 * mwait_play_dead(), cpuidle_play_dead() (a driver's ->enter_dead: acpi_idle_play_dead()) or
 * hlt_play_dead(), and loops there until it is brought up again (arch/x86/kernel/smpboot.c).
 * From rcu_report_dead() on, no RCU grace period (nor an RCU-tasks or rude one: they wait for
 * online CPUs) waits for that CPU; once it has reported itself dead, the hotplug lock that
 * keeps stop_machine() (text.c: cpus_read_lock()) out of the offline is released while the CPU
 * still runs the rest, then loops in hlt/mwait forever, outside every stop_machine() and its
 * sync_core(). So a site there could be freed under the dead CPU or rewritten while it
 * executes it. These functions run nowhere else (tboot_shutdown() also at reboot), so they are
 * refused whole; what they call that other code shares (smp_call_function_single(),
 * switch_mm_irqs_off() in idle_task_exit()) runs before the dead report, under the hotplug
 * lock, and is left alone. Names not in this kernel (inlined, or of the other version) are
 * skipped.
 */
static const char * const trapvec_dead_cpu_names[] = {
	"rcu_report_dead", "rcutree_report_cpu_dead", "cpuhp_report_idle_dead",
	"arch_cpu_idle_dead", "native_play_dead", "play_dead_common", "idle_task_exit",
	"cpu_report_death", "cpuhp_ap_report_dead", "cpuhp_ap_update_sync_state",
	"tboot_shutdown", "mwait_play_dead", "cpuidle_play_dead", "acpi_idle_play_dead",
	"hlt_play_dead", "cond_wakeup_cpu0",
};

static struct {
	unsigned long start, end;
} trapvec_dead_cpu[ARRAY_SIZE(trapvec_dead_cpu_names)];
static unsigned int trapvec_dead_cpu_count;

void trapvec_dead_cpu_init(void)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long addr, size, offset;
	unsigned int i;

	trapvec_dead_cpu_count = 0;
	for (i = 0; i < ARRAY_SIZE(trapvec_dead_cpu_names); i++) {
		addr = trapvec_ksym(trapvec_dead_cpu_names[i]);
		if (!addr || !k->kallsyms_lookup_size_offset(addr, &size, &offset) || offset)
			continue;
		trapvec_dead_cpu[trapvec_dead_cpu_count].start = addr;
		trapvec_dead_cpu[trapvec_dead_cpu_count].end = addr + size;
		trapvec_dead_cpu_count++;
	}
	pr_debug("%u functions of the CPU-offline path after rcu_report_dead()\n",
		 trapvec_dead_cpu_count);
}

/* A window in one of them: TRAPVEC_REASON_DEAD_CPU, culprit the function's start. */
u32 trapvec_dead_cpu_check(unsigned long addr, u32 len, u64 *culprit)
{
	unsigned int i;

	for (i = 0; i < trapvec_dead_cpu_count; i++) {
		if (addr < trapvec_dead_cpu[i].end && trapvec_dead_cpu[i].start < addr + len) {
			*culprit = trapvec_dead_cpu[i].start;
			pr_debug("%pS: in %ps, which a CPU going offline runs after rcu_report_dead()\n",
				 (void *)addr, (void *)trapvec_dead_cpu[i].start);
			return TRAPVEC_REASON_DEAD_CPU;
		}
	}
	return TRAPVEC_REASON_NONE;
}
