// SPDX-License-Identifier: GPL-2.0
/*
 * Batched text patches: APPLY, and the reverts of unload and of a module's text going.
 *
 * The jobs around it, one file each: text_stop.c (the stop_machine() writer, its rounds and
 * phases), text_alias.c (the writable aliases), text_live.c (the live and parked records),
 * text_int3.c (the pending set and its die notifier), text_springboard.c (jmps that land on
 * another patch), text_kprobe.c (kprobes on live patches). trapvec_text.h holds what they share.
 *
 * A batch is all or nothing. Under trapvec_mutex every patch is checked (check.c) and its
 * current bytes compared with what the caller expects; only then does stop_machine() run
 * the writer on every online CPU at once. The first CPU to arrive is the writer; it waits
 * until every online CPU has arrived in the callback (one still on its way runs ordinary
 * kernel code: the stopper loop, watchdog touches), compares all the bytes again (nothing
 * can change them while every CPU is held, and a kprobe or a text_poke_bp() sequence that
 * got in since the first check makes the batch fail instead of being overwritten), and
 * writes every patch through a writable alias of its page, int3 first.
 *
 * A new patch that writes a trap (CD vector) needs its dispatch entry first: a trap without
 * one would be chained to the spurious-interrupt handler and skip the displaced
 * instructions. Nothing is written while kernel lockdown or kernel.modules_disabled forbids
 * it (check.c, trapvec_may_write()); reverts still are, as unload does them anyway.
 *
 * Windows over several instructions (full preemption). stop_machine() guarantees that no CPU
 * executes a range while it changes, not that no task is stopped inside it: under
 * preempt=full (Debian's kernel has PREEMPT_DYNAMIC: preempt=full at boot, or a write to
 * /sys/kernel/debug/sched/preempt at run time) a task preempted right after `push rbx` would
 * resume at site + 1, in the middle of the new bytes. check.c decodes the original bytes of
 * every new window (the module decides, user space cannot get it wrong); when more than one
 * instruction overlaps it, the CC of such windows also waits out the tasks inside them, as
 * kprobes' jump optimizer does:
 *
 *  1. ARM, one stop_machine(): compare every op of the batch with what it expects (all or
 *     nothing), then write CC on the first byte of each such window; sync every CPU.
 *     Before that, the sites of the batch and where they lead are published for the die
 *     notifier (trapvec_pending, RCU).
 *  2. trapvec_sync_tasks(): no task enters an original window any more (its first byte
 *     is CC, and no branch lands inside a window); one preempted inside it has not made a
 *     voluntary switch since, so it holds the grace period until it has run out of it. The
 *     rude half covers the idle tasks, which RCU-tasks skips (every wait of this file
 *     does: the springboards' deferred reverts and unload's too).
 *  3. FINISH, one stop_machine(): compare again (CC and the original tail at each such
 *     window, the expected bytes everywhere else), then write every op in the rounds above
 *     (those windows have their CC already); single-instruction windows and reverts are
 *     written here. If the comparison fails, DISARM puts the original first byte back
 *     under each of our CCs (nobody is inside a window, see 2) and the batch fails with
 *     nothing written.
 *  4. The pending set is withdrawn and freed after synchronize_rcu() (after DEFERRED).
 *
 * Removal needs no RCU-tasks wait (its int3 is only for CPUs running the site while it is
 * written). Once a patch is written no task can be inside its window: a trap or
 * a jmp is one instruction, the trap returns to its trampoline and the jmp leaves, so a task
 * is stopped either at the site itself (it then runs whatever the site holds when it
 * resumes: the original instruction after a revert, which is right) or elsewhere. One
 * stop_machine() restores the original bytes of any number of patches, reverts of a batch
 * that also applies new windows included (they go in FINISH). Springboards are the
 * exception: a task that took the jmp rel8 may be preempted on the springboard's first byte,
 * and the springboard's original bytes are padding, not code to resume in. So a springboard
 * is reverted after every patch that lands on it, an RCU-tasks grace period later (DEFERRED,
 * also when its jumpers went in an earlier batch); a revert that would leave one of its
 * jumpers live is refused, and so is a new jmp onto a patch the same batch reverts. Unload
 * (trapvec_text_revert_all()) does the same in two passes. A task preempted at the entry of
 * a trampoline or inside a component is a matter of freeing them, not of writing text
 * (QUIESCE).
 *
 * int3_first=0 (a module parameter for tests only) skips ARM and its grace period, so that a
 * test can show what they prevent under full preemption.
 *
 * "One stop_machine()" above is one stage: a stage of more than stop_sites sites is written in
 * several stops (trapvec_stop_batch(), text_stop.c), its first stop comparing every op before
 * any is written, a change found by a later stop undoing the earlier ones.
 *
 * Cost (issue 26): the checks of a batch are O(log n) per patch against the live records (trees
 * by site and by jmp target, text_live.c) and against the batch's earlier patches (the batch's
 * own tree); the pages a batch writes are mapped once, for that batch (text_alias.c).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/rcupdate.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/sysfs.h>
#include <linux/timekeeping.h>
#include <linux/uaccess.h>
#include <asm/sync_core.h>
#include <asm/text-patching.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

void trapvec_sync_core(void *unused)
{
	sync_core();
}

/*
 * Wait until no task can still be inside code that no CPU can newly enter (a trampoline,
 * a component, a return stub): synchronize_rcu_tasks() for every task that may have been
 * preempted there, and synchronize_rcu_tasks_rude() for the idle tasks, which RCU-tasks
 * ignores. Sites are allowed in ordinary text the idle loop runs (poll_idle's local_clock()
 * and cpuidle_poll_time(), ACPI idle helpers), so an idle CPU may be inside a trampoline
 * with RCU not watching: neither synchronize_rcu() nor RCU-tasks waits for it. The rude
 * grace period runs a work item on every CPU, which an idle CPU runs only after it went
 * back to schedule_idle(), out of any trampoline (the idle task is never preempted). It
 * costs one round of work items over the CPUs, once per QUIESCE, reclaim or unload.
 */
void trapvec_sync_tasks(void)
{
	synchronize_rcu_tasks();
	synchronize_rcu_tasks_rude();
}

/*
 * Test knob (insmod trapvec.ko int3_first=0): write every window in one stop_machine(),
 * without ARM and its RCU-tasks grace period, so that a test can show what they prevent. Never
 * for use outside tests: under preempt=full it lets a task resume inside the new bytes.
 */
static bool trapvec_int3_first = true;
module_param_named(int3_first, trapvec_int3_first, bool, 0444);
MODULE_PARM_DESC(int3_first,
		 "test knob: 0 writes windows over several instructions without waiting out the tasks inside (unsafe under preempt=full)");

/*
 * A new patch starting with "int imm8" (CD ib) is a trap: of our vector with a dispatch entry
 * at its site, else refused. Other patches (jmp rel32/rel8, springboards) start with E9/EB.
 */
static u32 trapvec_check_trap(const struct trapvec_patch *p)
{
	if (p->len < TRAPVEC_TRAP_LEN || p->new_bytes[0] != 0xcd)
		return TRAPVEC_REASON_NONE;
	if (p->new_bytes[1] != trapvec_vector)
		return TRAPVEC_REASON_FOREIGN_TRAP;
	if (!trapvec_dispatch_has(p->addr))
		return TRAPVEC_REASON_NO_DISPATCH;
	return TRAPVEC_REASON_NONE;
}

/*
 * Check patch i of the batch (a new patch, not the inverse of a live one) against the live
 * records and the new ones of patches[0..i) (batch; an earlier revert's record is live).
 * Returns 0 or the ioctl's errno (req filled in).
 */
static int trapvec_check_new(const struct trapvec_patch *patches, u32 i,
			     const struct trapvec_batch_index *batch, struct trapvec_apply *req,
			     const struct trapvec_boundary *bounds, u32 *insns)
{
	const struct trapvec_patch *p = &patches[i];
	u32 reason;

	if (trapvec_text_overlaps_live(p->addr, p->len) ||
	    trapvec_batch_overlap(batch, p->addr, p->len)) {
		trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
		return -EBUSY;
	}
	reason = trapvec_check_site_known(&bounds[i], &req->culprit, insns);
	if (!reason)
		reason = trapvec_check_trap(p);
	if (reason) {
		pr_debug("patch %u at %pS refused: reason %u (%s)\n", i, (void *)p->addr, reason,
			 trapvec_reason_name(reason));
		trapvec_fail(req, i, reason, 0);
		return -EINVAL;
	}
	return 0;
}

/*
 * Where new_bytes send a CPU: a jmp rel32 or rel8 to its target (*jmp set), a trap through
 * the dispatch table. NOT_A_JUMP for anything else, which the caller refuses unless the patch
 * is an identity over one instruction: every write goes int3 first, and the die notifier must
 * then stand in for the new instruction (and at the revert, for the old one).
 */
static u32 trapvec_patch_dest(const struct trapvec_patch *p, unsigned long *dest, bool *jmp)
{
	const u8 *b = p->new_bytes;
	s32 rel32;

	*dest = 0;
	*jmp = false;
	if (b[0] == 0xcd && p->len >= TRAPVEC_TRAP_LEN && b[1] == trapvec_vector)
		return TRAPVEC_REASON_NONE;
	if (b[0] == JMP32_INSN_OPCODE && p->len >= JMP32_INSN_SIZE) {
		memcpy(&rel32, b + 1, sizeof(rel32));
		*dest = p->addr + JMP32_INSN_SIZE + rel32;
	} else if (b[0] == JMP8_INSN_OPCODE && p->len >= JMP8_INSN_SIZE) {
		*dest = p->addr + JMP8_INSN_SIZE + (s8)b[1];
	} else {
		return TRAPVEC_REASON_NOT_A_JUMP;
	}
	/*
	 * A jmp into its own window (jmp $, EB FE) never leaves it: the die notifier would send
	 * a CPU that meets its CC back to that CC, with interrupts off for ever where they were
	 * off. A claimed int3 must move the CPU on, so the new bytes are no jump out.
	 */
	if (*dest >= p->addr && *dest < p->addr + p->len) {
		pr_debug("jmp at %pS lands at %pS, inside its own window\n", (void *)p->addr,
			 (void *)*dest);
		*dest = 0;
		return TRAPVEC_REASON_NOT_A_JUMP;
	}
	*jmp = true;
	return TRAPVEC_REASON_NONE;
}

/*
 * Write a checked batch, every stage int3 first (trapvec_stop_rounds()), its sites pending
 * for the die notifier from before the first CC to after the last: ARM, an RCU-tasks grace
 * period and FINISH when some window spans several instructions, else FINISH alone; then the
 * deferred reverts. 0, or -ESTALE with ctx->failed set and the text as it was before
 * (nothing half applied).
 */
static int trapvec_write_batch(struct trapvec_text_op *ops, u32 n, struct trapvec_stop_ctx *ctx)
{
	struct trapvec_pending *pend;
	bool int3_first = false, deferred = false;
	int ret;
	u32 i;

	for (i = 0; i < n; i++) {
		int3_first |= ops[i].int3_first;
		deferred |= ops[i].deferred;
	}
	ctx->ops = ops;
	ctx->count = n;
	pend = trapvec_pending_publish(ops, n, GFP_KERNEL);
	if (!pend)
		return -ENOMEM;
	if (int3_first) {
		ret = trapvec_stop_batch(ctx, TRAPVEC_STAGE_ARM);
		if (ret)
			goto out_withdraw;
		/*
		 * Every CPU has executed sync_core() after the CCs: no task enters an original
		 * window any more. One preempted inside one (after its first instruction) has not
		 * passed a voluntary switch; this waits until each such task has left it, and
		 * (the rude half of trapvec_sync_tasks()) until every idle task, which RCU-tasks
		 * ignores, has been back to schedule_idle(), out of any window.
		 */
		trapvec_sync_tasks();
	}
	ret = trapvec_stop_batch(ctx, TRAPVEC_STAGE_FINISH);
	if (ret && int3_first) {
		u32 failed = ctx->failed;

		/* Nobody is inside an original window (see above): the old first bytes go back. */
		trapvec_stop_batch(ctx, TRAPVEC_STAGE_DISARM);
		ctx->failed = failed;
		ctx->result = ret;
	}
	if (ret || !deferred)
		goto out_withdraw;
	/*
	 * No task can still be on a springboard: nothing lands on it any more. Idle tasks
	 * included (trapvec_sync_tasks()): RCU-tasks alone skips them.
	 */
	trapvec_sync_tasks();
	trapvec_stop_batch(ctx, TRAPVEC_STAGE_DEFERRED);
	if (ctx->skipped)
		pr_err("%u springboards were changed by someone else and are left alone\n",
		       ctx->skipped);
	/* What a test (dynamic debug) can see of the deferred revert. */
	for (i = 0; i < n; i++)
		if (ops[i].deferred)
			pr_debug("springboard at %pS reverted an RCU-tasks grace period after its jumpers\n",
				 (void *)ops[i].rec->addr);
out_withdraw:
	trapvec_pending_withdraw(pend);
	return ret;
}

/* Serial of APPLY's batches, under trapvec_mutex: marks the live records a batch reverts. */
static u64 trapvec_batch_serial;

/*
 * How long APPLY takes in the module (apply_stats, a read-only module parameter): the batch's
 * patches, its checks (up to the first stop), its write (the stops, grace periods between them
 * included) and the whole call, of the last APPLY that wrote its batch, in ns. What a test of
 * the commit's growth with the batch size reads; the stops alone are in stop_stats. Under
 * trapvec_mutex; read with READ_ONCE (statistics, not state).
 */
static struct {
	u64 applies;
	u64 last_patches, last_check_ns, last_write_ns, last_ns;
} trapvec_apply_stats;

static int trapvec_apply_stats_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "applies=%llu last_patches=%llu last_check_ns=%llu last_write_ns=%llu last_ns=%llu\n",
			  READ_ONCE(trapvec_apply_stats.applies),
			  READ_ONCE(trapvec_apply_stats.last_patches),
			  READ_ONCE(trapvec_apply_stats.last_check_ns),
			  READ_ONCE(trapvec_apply_stats.last_write_ns),
			  READ_ONCE(trapvec_apply_stats.last_ns));
}

static const struct kernel_param_ops trapvec_apply_stats_ops = {
	.get = trapvec_apply_stats_get,
};
module_param_cb(apply_stats, &trapvec_apply_stats_ops, NULL, 0444);
MODULE_PARM_DESC(apply_stats,
		 "the last APPLY that wrote its batch: patches, and ns spent checking, writing and in all (read only)");

static void trapvec_apply_account(u32 n, u64 start, u64 checked, u64 end)
{
	lockdep_assert_held(&trapvec_mutex);
	WRITE_ONCE(trapvec_apply_stats.applies, trapvec_apply_stats.applies + 1);
	WRITE_ONCE(trapvec_apply_stats.last_patches, n);
	WRITE_ONCE(trapvec_apply_stats.last_check_ns, checked - start);
	WRITE_ONCE(trapvec_apply_stats.last_write_ns, end - checked);
	WRITE_ONCE(trapvec_apply_stats.last_ns, end - start);
}

/* A revert of a live patch: APPLY skips its site checks (the same revert twice is refused). */
static bool trapvec_is_inverse(const struct trapvec_patch *p)
{
	return trapvec_find_inverse(p);
}

int trapvec_text_apply(const struct trapvec_patch *patches, struct trapvec_apply *req)
{
	struct mutex *kprobe_mutex = trapvec_ksyms.kprobe_mutex;
	struct trapvec_batch_index batch = { .by_addr = RB_ROOT };
	struct trapvec_alias alias;
	u32 i, n = req->count, may_write, insns, reason;
	u64 start = ktime_get_ns(), checked;
	struct trapvec_stop_ctx ctx = {};
	unsigned long dest;
	bool jmp;
	struct trapvec_boundary *bounds = NULL;
	struct trapvec_text_op *ops;
	int ret = 0;

	lockdep_assert_held(&trapvec_mutex);
	trapvec_fail(req, TRAPVEC_NO_INDEX, TRAPVEC_REASON_NONE, 0);
	memset(req->found, 0, sizeof(req->found));
	req->culprit = 0;
	if (req->flags & ~TRAPVEC_APPLY_DEFERRED)
		return -EINVAL;
	if (!n)
		return 0;

	ops = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, n, sizeof(*ops), GFP_KERNEL | __GFP_ZERO);
	if (!ops)
		return -ENOMEM;

	may_write = trapvec_may_write();
	batch.serial = ++trapvec_batch_serial;
	mutex_lock(kprobe_mutex);
	/* The new patches' boundaries, each function decoded once for the batch (check_many.c). */
	if (!may_write) {
		ret = trapvec_check_boundaries(patches, n, trapvec_is_inverse, &bounds);
		if (ret)
			goto out_free;
	}
	for (i = 0; i < n; i++) {
		const struct trapvec_patch *p = &patches[i];
		struct trapvec_live_patch *inv;
		u8 cur[TRAPVEC_PATCH_MAX];

		if (!p->len || p->len > TRAPVEC_PATCH_MAX) {
			trapvec_fail(req, i, TRAPVEC_REASON_BAD_LENGTH, 0);
			ret = -EINVAL;
			goto out_unwind;
		}
		inv = trapvec_find_inverse(p);
		if (inv && inv->undo_batch == batch.serial)
			inv = NULL;	/* the same revert twice: an overlap */
		insns = 1;
		if (inv) {
			ops[i].rec = inv;
			ops[i].undo = true;
			inv->undo_batch = batch.serial;
		} else if (may_write) {
			trapvec_fail(req, i, may_write, -EPERM);
			ret = -EPERM;
			goto out_unwind;
		} else {
			ret = trapvec_check_new(patches, i, &batch, req, bounds, &insns);
			if (ret)
				goto out_unwind;
		}
		/* Batches of up to TRAPVEC_BATCH_MAX: let others run between their checks. */
		cond_resched();

		if (copy_from_kernel_nofault(cur, (void *)p->addr, p->len)) {
			trapvec_fail(req, i, TRAPVEC_REASON_NOT_TEXT, -EFAULT);
			ret = -EINVAL;
			goto out_unwind;
		}
		if (memcmp(cur, p->old_bytes, p->len)) {
			trapvec_fail(req, i, TRAPVEC_REASON_MISMATCH, 0);
			memcpy(req->found, cur, p->len);
			ret = -ESTALE;
			goto out_unwind;
		}
		if (inv)
			continue;

		ops[i].rec = trapvec_kvmalloc(TRAPVEC_MEM_PATCH, 1, sizeof(*ops[i].rec),
					    GFP_KERNEL | __GFP_ZERO);
		if (!ops[i].rec) {
			ret = -ENOMEM;
			goto out_unwind;
		}
		/* kmalloc memory, not kvmalloc: freed with kfree_rcu() once listed. */
		ops[i].rec->bl = kzalloc(sizeof(*ops[i].rec->bl), GFP_KERNEL);
		if (!ops[i].rec->bl) {
			ret = -ENOMEM;
			goto out_unwind;
		}
		trapvec_mem_got(TRAPVEC_MEM_PATCH, sizeof(*ops[i].rec->bl));
		ops[i].rec->bl->entry.start_addr = p->addr;
		ops[i].rec->bl->entry.end_addr = p->addr + p->len;
		ops[i].rec->addr = p->addr;
		ops[i].rec->len = p->len;
		trapvec_batch_add(&batch, ops[i].rec);
		memcpy(ops[i].rec->old_bytes, p->old_bytes, p->len);
		memcpy(ops[i].rec->new_bytes, p->new_bytes, p->len);
		reason = trapvec_patch_dest(p, &dest, &jmp);
		if (reason && (insns > 1 || memcmp(p->new_bytes, p->old_bytes, p->len))) {
			/*
			 * Nothing could stand in for the new bytes (or, at the revert, the old
			 * ones) while their CC is there; an identity patch is never written.
			 */
			trapvec_fail(req, i, reason, 0);
			ret = -EINVAL;
			goto out_unwind;
		}
		if (jmp) {
			ops[i].rec->j = trapvec_kvmalloc(TRAPVEC_MEM_PATCH, 1, sizeof(*ops[i].rec->j),
							 GFP_KERNEL | __GFP_ZERO);
			if (!ops[i].rec->j) {
				ret = -ENOMEM;
				goto out_unwind;
			}
			ops[i].rec->j->rec = ops[i].rec;
			ops[i].rec->j->dest = dest;
		}
		ops[i].int3_first = insns > 1 && trapvec_int3_first;
		ret = trapvec_get_owner(ops[i].rec, req->flags & TRAPVEC_APPLY_DEFERRED);
		if (ret) {
			trapvec_fail(req, i, TRAPVEC_REASON_NOT_TEXT, ret);
			ret = -EINVAL;
			goto out_unwind;
		}
	}
	ret = trapvec_link_springboards(ops, n, &batch, req);
	if (ret)
		goto out_unwind;
	/* Every page the batch writes, mapped writable for this batch only. */
	ret = trapvec_alias_map(ops, n, &alias, &i);
	if (ret == -EFAULT) {
		trapvec_fail(req, i, TRAPVEC_REASON_NOT_TEXT, ret);
		ret = -EINVAL;
	}
	if (ret)
		goto out_unwind;
	checked = ktime_get_ns();
	ret = trapvec_write_batch(ops, n, &ctx);
	trapvec_alias_unmap(&alias);
	if (ret == -ESTALE) {
		const struct trapvec_live_patch *r = ops[ctx.failed].rec;

		trapvec_fail(req, ctx.failed, TRAPVEC_REASON_MISMATCH, 0);
		if (copy_from_kernel_nofault(req->found, (void *)r->addr, r->len))
			memset(req->found, 0, sizeof(req->found));
		pr_debug("batch of %u: patch %u at %pS changed under us\n", n, ctx.failed,
			 (void *)r->addr);
	}
	if (ret)
		goto out_unwind;

	/* Written: update the record (every jumper's count before any record is freed). */
	for (i = 0; i < n; i++) {
		struct trapvec_live_patch *r = ops[i].rec;

		WARN_ON_ONCE(!(ops[i].deferred && ctx.skipped) &&
			     !trapvec_text_equals(r->addr, ops[i].undo ? r->old_bytes :
						  r->new_bytes, r->len));
		struct trapvec_live_patch *to = trapvec_rec_lands_on(r);

		if (to) {
			if (ops[i].undo) {
				to->jumpers--;
			} else {
				to->jumpers++;
				to->springboard = true;
			}
		}
	}
	for (i = 0; i < n; i++) {
		struct trapvec_live_patch *r = ops[i].rec;

		if (ops[i].undo) {
			trapvec_live_del(r);
			trapvec_live_unlist(r);
			trapvec_live_retire(r);
		} else {
			/* Its by_addr node leaves the batch's index, dropped now. */
			trapvec_live_add(r);
			if (trapvec_kprobe_blacklist) {
				list_add_tail_rcu(&r->bl->entry.list, trapvec_ksyms.kprobe_blacklist);
				r->bl_listed = true;
			}
		}
	}
	pr_debug("applied a batch of %u patches; %llu live\n", n, trapvec_live_count);
	trapvec_apply_account(n, start, checked, ktime_get_ns());
	goto out_free;

out_unwind:
	for (i = 0; i < n; i++)
		if (ops[i].rec && !ops[i].undo)
			trapvec_live_free(ops[i].rec);
out_free:
	trapvec_kprobe_pin_update(false);
	mutex_unlock(kprobe_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, bounds, n * sizeof(*bounds));
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, ops, n * sizeof(*ops));
	return ret;
}

/*
 * Unload cannot fail: an allocation it needs is retried until it succeeds, saying so.
 * kvmalloc() of a few hundred KiB at most (16 bytes per live patch).
 */
static void *trapvec_unload_alloc(enum trapvec_mem_kind kind, size_t bytes)
{
	void *p;

	while (!(p = trapvec_kvmalloc(kind, 1, bytes, GFP_KERNEL))) {
		pr_warn_ratelimited("unload: waiting for %zu bytes of memory to revert the live patches\n",
				    bytes);
		msleep(100);
	}
	return p;
}

/* One pass of revert_all: every live patch that is (or is not) a springboard. */
static u32 trapvec_revert_pass(bool springboards)
{
	struct trapvec_stop_ctx ctx = {};
	struct trapvec_pending *pend;
	struct trapvec_live_patch *r;
	struct trapvec_text_op *ops;
	struct trapvec_alias alias;
	u32 n = 0;

	list_for_each_entry(r, &trapvec_live, node)
		n += r->springboard == springboards;
	if (!n)
		return 0;
	ops = trapvec_unload_alloc(TRAPVEC_MEM_SCRATCH, n * sizeof(*ops));
	memset(ops, 0, n * sizeof(*ops));
	n = 0;
	list_for_each_entry(r, &trapvec_live, node) {
		if (r->springboard != springboards)
			continue;
		ops[n].rec = r;
		ops[n].undo = true;
		n++;
	}
	while (!(pend = trapvec_pending_publish(ops, n, GFP_KERNEL))) {
		pr_warn_ratelimited("unload: waiting for memory to publish %u pending sites\n", n);
		msleep(100);
	}
	ctx.ops = ops;
	ctx.count = n;
	if (trapvec_alias_map_retry(ops, n, &alias)) {
		trapvec_stop_batch(&ctx, TRAPVEC_STAGE_UNLOAD);
		trapvec_alias_unmap(&alias);
	} else {
		ctx.skipped = n;
	}
	trapvec_pending_withdraw(pend);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, ops, n * sizeof(*ops));
	return ctx.skipped;
}

/*
 * Unload: write the original bytes back everywhere, int3 first (trapvec_stop_rounds()) with
 * the sites pending. Pass 1 reverts every patch no jmp lands on, in one stop_machine(); pass
 * 2, an RCU-tasks grace period later, the springboards (see trapvec_link_springboards()).
 */
void trapvec_text_revert_all(void)
{
	struct trapvec_live_patch *r, *tmp;
	u32 skipped;

	lockdep_assert_held(&trapvec_mutex);
	if (!trapvec_live_count)
		return;
	skipped = trapvec_revert_pass(false);
	list_for_each_entry(r, &trapvec_live, node) {
		if (r->springboard) {
			/* Idle tasks too, as in trapvec_write_batch(). */
			trapvec_sync_tasks();
			skipped += trapvec_revert_pass(true);
			break;
		}
	}
	if (skipped)
		pr_err("%u live patches were changed by someone else and are left alone\n",
		       skipped);
	pr_info("reverted %llu live patches\n", trapvec_live_count - skipped);
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	list_for_each_entry_safe(r, tmp, &trapvec_live, node) {
		trapvec_live_del(r);
		trapvec_live_unlist(r);
		trapvec_live_retire(r);
	}
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	WARN_ON_ONCE(trapvec_live_count);
}

/*
 * The module watch (modwatch.c), for a module whose text is about to be freed (its exit has
 * run, or its load is refused before its init): revert every live patch in [start, end) in
 * one stop_machine(), int3 first with the sites pending, and forget them. Springboards need
 * no second pass: whatever jumps onto one lies in the same text, reverted in the same write.
 * Returns how many were reverted.
 */
u32 trapvec_text_revert_within(unsigned long start, unsigned long end)
{
	struct trapvec_stop_ctx ctx = {};
	struct trapvec_live_patch *r, *tmp;
	struct trapvec_pending *pend;
	struct trapvec_text_op *ops;
	struct trapvec_alias alias;
	u32 n = 0, i;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		n += r->addr >= start && r->addr < end;
	if (!n)
		return 0;
	ops = trapvec_unload_alloc(TRAPVEC_MEM_SCRATCH, n * sizeof(*ops));
	memset(ops, 0, n * sizeof(*ops));
	i = 0;
	list_for_each_entry(r, &trapvec_live, node) {
		if (r->addr < start || r->addr >= end)
			continue;
		ops[i].rec = r;
		ops[i].undo = true;
		i++;
	}
	while (!(pend = trapvec_pending_publish(ops, n, GFP_KERNEL))) {
		pr_warn_ratelimited("waiting for memory to publish %u pending sites\n", n);
		msleep(100);
	}
	ctx.ops = ops;
	ctx.count = n;
	if (trapvec_alias_map_retry(ops, n, &alias)) {
		trapvec_stop_batch(&ctx, TRAPVEC_STAGE_UNLOAD);
		trapvec_alias_unmap(&alias);
	} else {
		ctx.skipped = n;
	}
	trapvec_pending_withdraw(pend);
	if (ctx.skipped)
		pr_err("%u live patches in a module's text were changed by someone else; forgotten all the same (the text goes)\n",
		       ctx.skipped);
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (trapvec_rec_lands_on(r))
			trapvec_rec_lands_on(r)->jumpers--;
	}
	list_for_each_entry_safe(r, tmp, &trapvec_live, node) {
		if (r->addr < start || r->addr >= end)
			continue;
		trapvec_live_del(r);
		trapvec_live_unlist(r);
		trapvec_live_retire(r);
	}
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, ops, n * sizeof(*ops));
	return n;
}
