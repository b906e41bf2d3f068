// SPDX-License-Identifier: GPL-2.0
/*
 * Site validation: may [addr, addr + len) of kernel text be overwritten?
 *
 * User space decodes and plans (it knows instruction boundaries, basic blocks and branch
 * targets); the module checks again whatever the kernel knows better than user space, and
 * gives each refusal its own reason code (trapvec_abi.h):
 *
 *  - the range must be core kernel text or the core text of a live module, not this module,
 *    and overlap no live patch of ours;
 *  - not entry text, noinstr text (RCU may not be watching; the trap stub assumes it is),
 *    nor the retpoline/return thunks (the trap path itself runs through them);
 *  - not on the kprobes blacklist (code the kernel's own trap handling depends on);
 *  - no overlap with text the kernel rewrites by itself: ftrace __fentry__ sites, jump
 *    labels, static calls, SMP lock prefixes (alternatives); and no BUG/WARN ud2 or
 *    exception-table instruction, whose fix-ups are keyed by address and would not follow
 *    the instruction into a trampoline;
 *  - addr must be an instruction boundary of its symbol, decoded from the symbol's start
 *    over the *original* bytes (our live patches are undone in the decoder's buffer), and the
 *    instruction there must decode.
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
 * Called under trapvec_mutex.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <asm/insn.h>

#include "trapvec_internal.h"

static bool trapvec_overlaps(unsigned long addr, unsigned long len, unsigned long start,
			     unsigned long end)
{
	return addr < end && start < addr + len;
}

bool trapvec_in_own_module(unsigned long addr, unsigned long len)
{
	return within_module(addr, THIS_MODULE) ||
	       within_module(addr + len - 1, THIS_MODULE);
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
	if (!mod || mod->state != MODULE_STATE_LIVE || !within_module_core(addr, mod)) {
		reason = TRAPVEC_REASON_NOT_TEXT;
		goto out;
	}
	text_end = (unsigned long)mod->core_layout.base + mod->core_layout.text_size;
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
 * Is addr an instruction boundary, with a decodable instruction there? Decode from the start
 * of its symbol through the instruction at addr, over the original bytes (read once, our live
 * patches undone). kallsyms sizes run to the next symbol, so alignment padding after a
 * function belongs to it (int3 and nop decode one by one).
 */
static u32 trapvec_check_boundary(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	unsigned long size, offset, span, at;
	u32 reason = TRAPVEC_REASON_NOT_BOUNDARY;
	struct insn insn;
	u8 *text;

	if (!k->kallsyms_lookup_size_offset(addr, &size, &offset))
		return TRAPVEC_REASON_NOT_BOUNDARY;
	if (offset + len > size)
		return TRAPVEC_REASON_CROSSES_SYMBOL;
	/* Enough for the instruction at addr, not past the symbol. */
	span = min_t(unsigned long, size, offset + MAX_INSN_SIZE);
	text = kvmalloc(span, GFP_KERNEL);
	if (!text)
		return TRAPVEC_REASON_NOT_BOUNDARY;
	if (trapvec_text_read_original(addr - offset, text, span)) {
		reason = TRAPVEC_REASON_NOT_TEXT;
		goto out;
	}
	for (at = 0; at <= offset; at += insn.length) {
		if (k->insn_decode(&insn, text + at, span - at, INSN_MODE_KERN) < 0) {
			pr_debug("cannot decode %pS while looking for %pS\n",
				 (void *)(addr - offset + at), (void *)addr);
			break;
		}
		if (at == offset) {
			reason = TRAPVEC_REASON_NONE;
			break;
		}
	}
out:
	kvfree(text);
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

/* The checks of APPLY (and of CHECK, before its kprobe). */
u32 trapvec_check_site(unsigned long addr, u32 len)
{
	const struct trapvec_ksyms *k = &trapvec_ksyms;
	u32 reason;

	lockdep_assert_held(&trapvec_mutex);
	if (!len || len > TRAPVEC_PATCH_MAX)
		return TRAPVEC_REASON_BAD_LENGTH;
	if (addr + len < addr)
		return TRAPVEC_REASON_NOT_TEXT;
	if (trapvec_in_own_module(addr, len))
		return TRAPVEC_REASON_OWN_MODULE;
	if (trapvec_text_overlaps_live(addr, len))
		return TRAPVEC_REASON_LIVE_PATCH;
	if (trapvec_overlaps(addr, len, k->entry_text_start, k->entry_text_end))
		return TRAPVEC_REASON_ENTRY_TEXT;
	if (trapvec_overlaps(addr, len, k->noinstr_text_start, k->noinstr_text_end))
		return TRAPVEC_REASON_NOINSTR_TEXT;
	if (trapvec_overlaps(addr, len, k->thunk_start, k->thunk_end))
		return TRAPVEC_REASON_THUNK;
	reason = trapvec_check_text(addr, len);
	if (reason)
		return reason;
	reason = trapvec_check_kernel_tables(addr, len);
	if (reason)
		return reason;
	return trapvec_check_boundary(addr, len);
}

/* CHECK: the checks of APPLY, then the kernel's own verdict through a disabled kprobe. */
u32 trapvec_check_site_kprobe(unsigned long addr, u32 len, s32 *error)
{
	struct kprobe kp = {
		.addr = (kprobe_opcode_t *)addr,
		.flags = KPROBE_FLAG_DISABLED,
	};
	u32 reason;
	int ret;

	*error = 0;
	reason = trapvec_check_site(addr, len);
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
