// SPDX-License-Identifier: GPL-2.0
/*
 * Site validation: may [addr, addr + len) of kernel text be overwritten?
 *
 * User space decodes and plans (it knows instruction boundaries, basic blocks and branch
 * targets); the module checks again whatever the kernel knows better than user space, and
 * gives each refusal its own reason code (trapvec_abi.h):
 *
 *  - the range must be core kernel text or the core text of a live module, not this module,
 *    and overlap no live patch of ours; text that is no module's is told apart (kprobe
 *    instruction slots, BPF JIT images, ftrace trampolines), and so is module init text;
 *  - not entry text, noinstr text or .cpuidle.text (RCU may not be watching; the trap stub
 *    assumes it is), nor the retpoline/return thunks and SRSO thunks (the trap path itself
 *    runs through them), nor static call trampolines (__SCT__*, rewritten by the kernel);
 *  - not in the functions a CPU going offline runs after rcu_report_dead() (reserved.c: no
 *    grace period waits for that CPU, and it loops in the last of them outside stop_machine());
 *  - not on the kprobes blacklist (code the kernel's own trap handling depends on);
 *  - no overlap with text the kernel rewrites by itself: ftrace __fentry__ sites, jump
 *    labels, static calls, SMP lock prefixes (alternatives); and no BUG/WARN ud2 or
 *    exception-table instruction, whose fix-ups are keyed by address and would not follow
 *    the instruction into a trampoline;
 *  - no branch target that user space cannot decode past the range's first byte: a jump
 *    label's target (the kernel jumps there once it writes the jmp) or an exception fix-up
 *    (a fault elsewhere resumes there); culprit = the table entry (reserved.c);
 *  - no kprobe registered on any byte of the range (armed or not), nor a jump-optimizable
 *    kprobe before it whose jmp would cover it: kprobes copy the instruction they probe and
 *    would rewrite our bytes when they arm, disarm or optimize (reason KPROBE, culprit = the
 *    probe's address);
 *  - addr must be an instruction boundary of its symbol, decoded from the symbol's start
 *    over the *original* bytes (our live patches are undone in the decoder's buffer, and so
 *    are kprobes' int3 and optimized jmps, from the bytes they saved), and the instructions
 *    of the window must decode; none but the last may be a call (its return address would
 *    point into the new bytes). The number of instructions in the window tells text.c
 *    whether it needs the int3-first protocol.
 *
 * These are the checks register_kprobe() makes (check_kprobe_address_safe() and
 * arch_prepare_kprobe()), made directly, over the whole range instead of its first byte, and
 * each with its own answer. CHECK also registers a kprobe with KPROBE_FLAG_DISABLED at addr
 * (nothing is armed) and unregisters it, so that a check a later kernel adds there is heard
 * too; APPLY does not, because a registration copies the instruction into a kprobe slot
 * with text_poke() and costs milliseconds per site (seconds per thousand under emulation).
 * kprobes' own boundary decoder reads our live traps as instructions, so its -EILSEQ is
 * overruled by ours; -EOPNOTSUPP only says that kprobes cannot single-step the instruction,
 * which trapvec never does.
 *
 * Called under trapvec_mutex and kprobe_mutex (the kprobe table does not change meanwhile).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kallsyms.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/security.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <asm/insn.h>
#include <asm/text-patching.h>

#include "trapvec_internal.h"
#include "trapvec_idle.h"

/* The reasons' names, from the header's one list: dmesg says which reason refused a site. */
static const char *const trapvec_reason_names[] = {
#define TRAPVEC_REASON_NAME(n, name, meaning) [(n)] = #name,
	TRAPVEC_REASONS(TRAPVEC_REASON_NAME)
#undef TRAPVEC_REASON_NAME
};

const char *trapvec_reason_name(u32 reason)
{
	/* Numbered from 0 without a gap or a repeat (a repeat is a warning with W=1 too). */
	BUILD_BUG_ON(ARRAY_SIZE(trapvec_reason_names) != TRAPVEC_REASON_MAX + 1);
	return reason < ARRAY_SIZE(trapvec_reason_names) ? trapvec_reason_names[reason] : "?";
}

static bool trapvec_overlaps(unsigned long addr, unsigned long len, unsigned long start,
			     unsigned long end)
{
	return addr < end && start < addr + len;
}

/* The module's text and data, and its code arena wherever it was allocated. */
bool trapvec_in_own_module(unsigned long addr, unsigned long len)
{
	return within_module(addr, THIS_MODULE) ||
	       within_module(addr + len - 1, THIS_MODULE) ||
	       trapvec_arena_overlaps_code(addr, len);
}

/*
 * Executable memory that belongs to no module: kprobe slots, BPF images and ftrace
 * trampolines are module_alloc() memory the kernel writes and frees by itself.
 */
static u32 trapvec_check_foreign_text(unsigned long addr)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	u32 reason = TRAPVEC_REASON_NOT_TEXT;

	/* The kprobe slot caches and the BPF ksym tree are read under RCU (sched). */
	preempt_disable();
	if (k->is_insn_slot_addr(k->kprobe_insn_slots, addr) ||
	    k->is_insn_slot_addr(k->kprobe_optinsn_slots, addr))
		reason = TRAPVEC_REASON_KPROBE_SLOT;
	else if (k->is_bpf_text_address(addr))
		reason = TRAPVEC_REASON_BPF_TEXT;
	else if (k->is_ftrace_trampoline(addr))
		reason = TRAPVEC_REASON_FTRACE_TRAMPOLINE;
	preempt_enable();
	return reason;
}

/* Core kernel text, or core text of a live module (and not its noinstr text). */
static u32 trapvec_check_text(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long text_end, ni_start;
	struct module *mod;
	u32 reason = TRAPVEC_REASON_NONE;

	if (addr >= k->stext && addr + len <= k->etext)
		return TRAPVEC_REASON_NONE;

	preempt_disable();
	mod = k->module_text_address(addr);
	if (!mod) {
		preempt_enable();
		return trapvec_check_foreign_text(addr);
	}
	/* Freed once init returns, and patched by nobody: kprobes drop probes there too. */
	if (within_module_init(addr, mod)) {
		reason = TRAPVEC_REASON_MODULE_INIT;
		goto out;
	}
	/*
	 * A COMING module (its init not run yet) only while the module watch holds its load
	 * for the watcher, who is arming it (modwatch.c; text.c then takes no reference).
	 */
	if ((mod->state != MODULE_STATE_LIVE &&
	     !(mod->state == MODULE_STATE_COMING && trapvec_modwatch_arming(mod))) ||
	    !within_module_core(addr, mod)) {
		reason = TRAPVEC_REASON_NOT_TEXT;
		goto out;
	}
	text_end = trapvec_module_text_base(mod) + trapvec_module_text_size(mod);
	if (addr + len > text_end) {
		reason = TRAPVEC_REASON_NOT_TEXT;
		goto out;
	}
	ni_start = (unsigned long)mod->noinstr_text_start;
	if (mod->noinstr_text_size &&
	    trapvec_overlaps(addr, len, ni_start, ni_start + mod->noinstr_text_size))
		reason = TRAPVEC_REASON_NOINSTR_TEXT;
out:
	preempt_enable();
	return reason;
}

/*
 * Put back what kprobes changed in text[0, span) read at base: the first byte of an armed
 * probe (int3) from kp->opcode, and the four bytes after it of a jump-optimized one from
 * op->optinsn.copied_insn (as __recover_optprobed_insn() does). Under kprobe_mutex.
 */
static void trapvec_recover_kprobed(unsigned long base, u8 *text, unsigned long span)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	struct optimized_kprobe *op;
	unsigned long i, j;
	struct kprobe *p;

	lockdep_assert_held(k->kprobe_mutex);
	for (i = 0; i < span; i++) {
		if (text[i] != INT3_INSN_OPCODE && text[i] != JMP32_INSN_OPCODE)
			continue;
		p = k->get_kprobe((void *)(base + i));
		if (!p)
			continue;
		if (text[i] == JMP32_INSN_OPCODE && kprobe_optimized(p)) {
			op = container_of(p, struct optimized_kprobe, kp);
			for (j = 0; j < DISP32_SIZE && i + 1 + j < span; j++)
				text[i + 1 + j] = op->optinsn.copied_insn[j];
		}
		text[i] = p->opcode;
	}
}

/*
 * READ with TRAPVEC_READ_ORIGINAL: [addr, addr + len) as a decoder must see it, without
 * anyone's patches: ours undone and kprobes' bytes put back. User space plans from these bytes;
 * from live ones it would decode an armed probe's int3 as an instruction of the function, end
 * the basic block there and refuse a window with a wrong reason, never reaching the kprobe check
 * that names the probe. An optimized probe's jmp may begin up to four bytes before addr: those
 * are read too when they are mapped. Under trapvec_mutex (the record of live patches).
 */
int trapvec_read_unpatched(unsigned long addr, u8 *buf, size_t len)
{
	unsigned long before = min_t(unsigned long, addr, JMP32_INSN_SIZE - 1);
	struct mutex *kprobe_mutex = trapvec_ksyms.kprobe_mutex;
	size_t size = before + len;
	int ret = 0;
	u8 *text;

	lockdep_assert_held(&trapvec_mutex);
	text = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 1, size, GFP_KERNEL);
	if (!text)
		return -ENOMEM;
	/* Held across read and recovery: no probe arms, optimizes or goes meanwhile. */
	mutex_lock(kprobe_mutex);
	if (before && trapvec_text_read_original(addr - before, text, before + len))
		before = 0;	/* the start of a mapping: nothing before it to look at */
	if (!before && trapvec_text_read_original(addr, text, len)) {
		ret = -EFAULT;
		goto out;
	}
	trapvec_recover_kprobed(addr - before, text, before + len);
	memcpy(buf, text + before, len);
out:
	mutex_unlock(kprobe_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, text, size);
	return ret;
}

/* call rel32, or call r/m64 (FF /2) and lcall m16:64 (FF /3): they push a return address. */
static bool trapvec_insn_is_call(const struct insn *insn)
{
	u8 op = insn->opcode.bytes[0];

	if (insn->opcode.nbytes != 1)
		return false;
	if (op == 0xe8)
		return true;
	return op == 0xff && (X86_MODRM_REG(insn->modrm.value) == 2 ||
			      X86_MODRM_REG(insn->modrm.value) == 3);
}

/*
 * Read [f->start, f->start + span) of the symbol f names, as a decoder must see it (our live
 * patches undone, kprobes' bytes put back), and decode it from the symbol's start through
 * offset limit (kallsyms sizes run to the next symbol, so alignment padding after a function
 * belongs to it: int3 and nop decode one by one). span is enough for the last instruction that
 * starts before limit, not past the symbol. f->ilen[o] is then the length of the instruction
 * at offset o, with TRAPVEC_FN_CALL and TRAPVEC_FN_ENDBR, or 0 where none starts; decoding
 * stops at f->decoded, at limit or at the first byte that does not decode. -EFAULT where the
 * text cannot be read, -ENOMEM. Under kprobe_mutex (the probes' saved bytes).
 */
int trapvec_fn_load(struct trapvec_fn *f, unsigned long start, unsigned long size,
		    unsigned long limit)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long at;
	struct insn insn;

	lockdep_assert_held(k->kprobe_mutex);
	f->start = start;
	f->size = size;
	f->span = min_t(unsigned long, size, limit + MAX_INSN_SIZE);
	f->decoded = 0;
	f->text = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 2, f->span, GFP_KERNEL);
	if (!f->text)
		return -ENOMEM;
	f->ilen = f->text + f->span;
	memset(f->ilen, 0, f->span);
	if (trapvec_text_read_original(start, f->text, f->span))
		return -EFAULT;
	trapvec_recover_kprobed(start, f->text, f->span);
	for (at = 0; at < limit; at += insn.length) {
		if (k->insn_decode(&insn, f->text + at, f->span - at, INSN_MODE_KERN) < 0) {
			pr_debug("cannot decode %pS\n", (void *)(start + at));
			break;
		}
		f->ilen[at] = insn.length;
		/*
		 * With IBT (6.12's CONFIG_X86_KERNEL_IBT) an indirect call or jmp must land on an
		 * endbr64, or the CPU raises #CP: the function's own entry stays as it is. The
		 * sealed form (a nop where nothing branches indirectly) may go.
		 */
		if (insn.length == 4 && !memcmp(f->text + at, "\xf3\x0f\x1e\xfa", 4))
			f->ilen[at] |= TRAPVEC_FN_ENDBR;
		if (trapvec_insn_is_call(&insn))
			f->ilen[at] |= TRAPVEC_FN_CALL;
	}
	f->decoded = at;
	return 0;
}

void trapvec_fn_free(struct trapvec_fn *f)
{
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, f->text, 2 * f->span);
	f->text = NULL;
	f->ilen = NULL;
}

/*
 * The verdict on [addr, addr + len) of a loaded symbol (addr + len within it, decoded through
 * addr + len): addr must start an instruction. *insns is the number of instructions that
 * overlap the window, which is how text.c knows, by itself, that a task may be stopped between
 * two of them (preempt=full) and that the window needs the int3-first protocol. A call that
 * ends inside the window is refused: its return address would point into the new bytes, and a
 * task sleeping in the callee is quiescent for RCU-tasks, so no grace period can wait it out
 * (user space refuses it too: a relocated call must be the last displaced instruction).
 */
u32 trapvec_fn_check_window(const struct trapvec_fn *f, unsigned long addr, u32 len, u32 *insns)
{
	unsigned long offset = addr - f->start, at;
	u8 l;

	*insns = 0;
	if (offset >= f->decoded || !f->ilen[offset]) {
		pr_debug("%pS is not an instruction boundary\n", (void *)addr);
		return TRAPVEC_REASON_NOT_BOUNDARY;
	}
	for (at = offset; at < offset + len; at += l & TRAPVEC_FN_LEN) {
		if (at >= f->decoded)
			return TRAPVEC_REASON_NOT_BOUNDARY;	/* did not decode */
		l = f->ilen[at];
		(*insns)++;
		if (l & TRAPVEC_FN_ENDBR) {
			pr_debug("%pS: the window covers the endbr64 at %pS\n", (void *)addr,
				 (void *)(f->start + at));
			return TRAPVEC_REASON_ENDBR;
		}
		if (at + (l & TRAPVEC_FN_LEN) < offset + len && (l & TRAPVEC_FN_CALL)) {
			pr_debug("%pS: the call at %pS returns inside the window\n", (void *)addr,
				 (void *)(f->start + at));
			return TRAPVEC_REASON_RETURN_IN_WINDOW;
		}
	}
	return TRAPVEC_REASON_NONE;
}

/*
 * Is addr an instruction boundary, with a decodable instruction there, and may the window's
 * instructions be overwritten? Decoded from the start of its symbol, over the original bytes
 * (trapvec_fn_load()). CHECK_MANY (check_many.c) loads each symbol once for all its windows.
 */
static u32 trapvec_check_boundary(unsigned long addr, u32 len, u32 *insns)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long size, offset;
	struct trapvec_fn f;
	u32 reason;
	int ret;

	*insns = 0;
	if (!k->kallsyms_lookup_size_offset(addr, &size, &offset))
		return TRAPVEC_REASON_NOT_BOUNDARY;
	if (offset + len > size)
		return TRAPVEC_REASON_CROSSES_SYMBOL;
	ret = trapvec_fn_load(&f, addr - offset, size, offset + len);
	if (ret == -EFAULT)
		reason = TRAPVEC_REASON_NOT_TEXT;
	else if (ret)
		reason = TRAPVEC_REASON_NOT_BOUNDARY;	/* no memory: as before, refused */
	else
		reason = trapvec_fn_check_window(&f, addr, len, insns);
	if (f.text)
		trapvec_fn_free(&f);
	return reason;
}

/* Exception-table and alternatives sites; jump labels, static calls and bugs (reserved.c). */
static u32 trapvec_check_kernel_tables(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	u32 i, reason;
	int alt;

	if (k->within_kprobe_blacklist(addr))
		return TRAPVEC_REASON_KPROBE_BLACKLIST;
	if (k->ftrace_location_range(addr, addr + len - 1))
		return TRAPVEC_REASON_FTRACE;
	reason = trapvec_reserved_check(addr, len);
	if (reason)
		return reason;
	/* Such instructions start inside the range (it begins on a boundary). */
	for (i = 0; i < len; i++)
		if (k->search_exception_tables(addr + i))
			return TRAPVEC_REASON_EXTABLE;
	/* The list of SMP lock prefixes is guarded by text_mutex (see alternative.c). */
	mutex_lock(k->text_mutex);
	alt = k->alternatives_text_reserved((void *)addr, (void *)(addr + len - 1));
	mutex_unlock(k->text_mutex);
	return alt ? TRAPVEC_REASON_ALTERNATIVE : TRAPVEC_REASON_NONE;
}

/*
 * A kprobe on any byte of the range, or a jump-optimizable kprobe before it whose jmp (or
 * the instructions it copied) reaches into it. Those may be optimized later by the kprobe
 * optimizer, which writes a 5-byte jmp with text_poke_bp(). An ftrace-based probe is never
 * optimized, and any other probe has been prepared for optimization (an aggregate probe
 * with optinsn.size set) when it was registered, or never will be. Under kprobe_mutex.
 */
static u32 trapvec_check_kprobes(unsigned long addr, u32 len, u64 *culprit)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long at, from = addr - min_t(unsigned long, addr, MAX_OPTIMIZED_LENGTH - 1);
	struct optimized_kprobe *op;
	struct kprobe *p;

	lockdep_assert_held(k->kprobe_mutex);
	for (at = from; at < addr + len; at++) {
		p = k->get_kprobe((void *)at);
		if (!p)
			continue;
		if (at >= addr)
			goto found;
		if (kprobe_ftrace(p) || p->pre_handler != k->kprobe_aggr_pre_handler)
			continue;
		op = container_of(p, struct optimized_kprobe, kp);
		if (op->optinsn.size && at + max_t(size_t, op->optinsn.size, JMP32_INSN_SIZE) > addr)
			goto found;
	}
	return TRAPVEC_REASON_NONE;
found:
	*culprit = at;
	pr_debug("%pS: a kprobe is registered at %pS\n", (void *)addr, (void *)at);
	return TRAPVEC_REASON_KPROBE;
}

/*
 * Thunks outside __indirect_thunk_start..end (and every thunk on 6.12, which has no such
 * bounds): the SRSO alias thunks sit in sections of their own around entry text
 * (arch/x86/kernel/vmlinux.lds.S), and their names are what is stable across stable kernels.
 * With call padding (6.12), the 16 bytes before each function are a symbol of their own,
 * __pfx_<function> (and __cfi_<function> with CFI): padding that call-depth tracking turns into
 * an accounting thunk at boot, never a place for a site.
 */
static bool trapvec_is_thunk_name(unsigned long addr)
{
	static const char * const prefixes[] = {
		"srso_", "retbleed_", "__x86_return_thunk", "__x86_indirect_", "its_return_thunk",
		"entry_untrain_ret", "entry_ibpb", "zen_untrain_ret", "__pfx_", "__cfi_",
	};
	char name[KSYM_SYMBOL_LEN];
	unsigned int i;

	snprintf(name, sizeof(name), "%ps", (void *)addr);
	for (i = 0; i < ARRAY_SIZE(prefixes); i++)
		if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
			return true;
	return false;
}

/* Core kernel sections where a trap may not go, and the thunks. */
static u32 trapvec_check_sections(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;

	if (trapvec_overlaps(addr, len, k->entry_text_start, k->entry_text_end))
		return TRAPVEC_REASON_ENTRY_TEXT;
	if (trapvec_overlaps(addr, len, k->noinstr_text_start, k->noinstr_text_end))
		return TRAPVEC_REASON_NOINSTR_TEXT;
	/* Idle code runs with RCU not watching (ct_idle_enter()). */
	if (trapvec_overlaps(addr, len, k->cpuidle_text_start, k->cpuidle_text_end))
		return TRAPVEC_REASON_CPUIDLE_TEXT;
	if (trapvec_overlaps(addr, len, k->thunk_start, k->thunk_end))
		return TRAPVEC_REASON_THUNK;
	/* __SCT__* trampolines: static_call_update() rewrites them with text_poke_bp(). */
	if (trapvec_overlaps(addr, len, k->static_call_text_start, k->static_call_text_end))
		return TRAPVEC_REASON_STATIC_CALL_TRAMP;
	if (addr >= k->stext && addr < k->etext &&
	    (trapvec_is_thunk_name(addr) || trapvec_is_thunk_name(addr + len - 1)))
		return TRAPVEC_REASON_THUNK;
	return TRAPVEC_REASON_NONE;
}

/*
 * May kernel memory be written (text, arena, variables)? TRAPVEC_REASON_NONE, or why not:
 * lockdown (integrity) forbids what /dev/mem and kprobes' writes are forbidden, and
 * kernel.modules_disabled=1 promises that no new kernel code appears.
 */
u32 trapvec_may_write(void)
{
	if (security_locked_down(LOCKDOWN_DBG_WRITE_KERNEL))
		return TRAPVEC_REASON_LOCKDOWN;
	if (READ_ONCE(*trapvec_ksyms.modules_disabled))
		return TRAPVEC_REASON_MODULES_DISABLED;
	return TRAPVEC_REASON_NONE;
}

/* May kernel memory be read (READ)? Lockdown (confidentiality) forbids it. */
bool trapvec_may_read(void)
{
	return !security_locked_down(LOCKDOWN_DBG_READ_KERNEL);
}

/*
 * The checks of APPLY but the boundary (trapvec_check_boundary(), or a symbol's windows at once
 * in CHECK_MANY): the caller checks the boundary of a window accepted here.
 */
u32 trapvec_check_site_early(unsigned long addr, u32 len, u64 *culprit)
{
	u32 reason;

	lockdep_assert_held(&trapvec_mutex);
	lockdep_assert_held(trapvec_ksyms.kprobe_mutex);
	*culprit = 0;
	if (!len || len > TRAPVEC_PATCH_MAX)
		return TRAPVEC_REASON_BAD_LENGTH;
	if (addr + len < addr)
		return TRAPVEC_REASON_NOT_TEXT;
	if (trapvec_in_own_module(addr, len))
		return TRAPVEC_REASON_OWN_MODULE;
	if (trapvec_text_overlaps_live(addr, len))
		return TRAPVEC_REASON_LIVE_PATCH;
	reason = trapvec_check_sections(addr, len);
	if (reason)
		return reason;
	/* The CPU-offline path after rcu_report_dead() (reserved.c says why). */
	reason = trapvec_dead_cpu_check(addr, len, culprit);
	if (reason)
		return reason;
	reason = trapvec_check_text(addr, len);
	if (reason)
		return reason;
	reason = trapvec_check_kernel_tables(addr, len);
	if (reason)
		return reason;
	reason = trapvec_hidden_check(addr, len, culprit);
	if (reason)
		return reason;
	return trapvec_check_kprobes(addr, len, culprit);
}

/*
 * The checks of APPLY (and of CHECK, before its kprobe). *insns: how many instructions overlap
 * the window (set when the site is accepted).
 */
u32 trapvec_check_site_insns(unsigned long addr, u32 len, u64 *culprit, u32 *insns)
{
	u32 reason;

	*insns = 0;
	reason = trapvec_check_site_early(addr, len, culprit);
	if (reason)
		return reason;
	return trapvec_check_boundary(addr, len, insns);
}

/*
 * APPLY's checks of a window, already made with its batch (trapvec_check_boundaries(),
 * check_many.c): what trapvec_check_site_insns() would say of it.
 */
u32 trapvec_check_site_known(const struct trapvec_boundary *b, u64 *culprit, u32 *insns)
{
	*culprit = b->culprit;
	*insns = b->reason ? 0 : b->insns;
	return b->reason;
}

u32 trapvec_check_site(unsigned long addr, u32 len, u64 *culprit)
{
	u32 insns;

	return trapvec_check_site_insns(addr, len, culprit, &insns);
}

/*
 * CHECK: the checks of APPLY, then the kernel's own verdict through a disabled kprobe
 * (registered without kprobe_mutex, which register_kprobe() takes).
 */
u32 trapvec_check_site_kprobe(unsigned long addr, u32 len, s32 *error, u64 *culprit)
{
	struct kprobe kp = {
		.addr = (kprobe_opcode_t *)addr,
		.flags = KPROBE_FLAG_DISABLED,
	};
	u32 reason;
	int ret;

	*error = 0;
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	reason = trapvec_check_site(addr, len, culprit);
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	if (reason)
		return reason;
	ret = register_kprobe(&kp);
	if (!ret) {
		unregister_kprobe(&kp);
		return TRAPVEC_REASON_NONE;
	}
	if (ret == -EILSEQ || ret == -EOPNOTSUPP) {
		pr_debug("kprobe at %pS: %d, overruled (our decoder reads the original bytes)\n",
			 (void *)addr, ret);
		return TRAPVEC_REASON_NONE;
	}
	*error = ret;
	return TRAPVEC_REASON_KPROBE_REFUSED;
}
