// SPDX-License-Identifier: GPL-2.0
/*
 * The stop_machine() writer of text.c's batches: stages, rounds of stores, phases of sync.
 *
 * Int3 first, every write (apply, revert, unload, deferred springboard reverts), as
 * text_poke_bp_batch() does: CC on the first byte of every site, sync; every tail, sync;
 * every first byte, sync (trapvec_stop_rounds()). Held CPUs still take NMIs, and so does the
 * writer between two of its stores: an NMI handler that runs a site while it is written must
 * meet the whole old instruction, our CC, or the whole new instruction, never `CD <old
 * byte>` or a jmp with a stale displacement. "Sync" inside stop_machine(): the other CPUs
 * spin with interrupts off, so instead of IPIs the writer advances a phase counter and waits
 * until each has executed sync_core() and acknowledged it. From before the first CC until
 * after the last first byte, every site of the batch is pending for the die notifier
 * (trapvec_int3_notify(), below), which sends a CPU that meets our CC where the site leads.
 *
 * Why not text_poke()? It is not exported, and it writes one range at a time with three
 * rounds of IPIs. Why not take text_mutex? stop_machine() takes cpus_read_lock(), which
 * ranks above text_mutex (kprobes take cpus_read_lock() then text_mutex), and
 * stop_machine_cpuslocked() is not exported. The other writers of kernel text (ftrace,
 * jump labels, static calls, alternatives, kprobes) write ranges that check.c keeps apart
 * from ours, and the second comparison inside stop_machine() catches the rest.
 *
 * How long every CPU is held is measured per stop (stop_stats, a read-only module parameter):
 * "held" from the moment the last CPU has arrived in trapvec_stop_cb() to the moment the
 * writer releases them, and "call" the whole stop_machine() as trapvec_stop_run() sees it
 * (waking the stoppers, their arrival, the release and the return included). A batch is the
 * stops made on one trapvec_stop_ctx (ARM, FINISH, DISARM, DEFERRED, or one UNLOAD).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/moduleparam.h>
#include <linux/sysfs.h>
#include <linux/timekeeping.h>
#include <linux/stop_machine.h>
#include <linux/string.h>
#include <asm/sync_core.h>
#include <asm/text-patching.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

/* Bytes at addr equal want? Plain loads: runs inside stop_machine(), calls nothing. */
bool trapvec_text_equals(unsigned long addr, const u8 *want, u32 len)
{
	u32 i;

	for (i = 0; i < len; i++)
		if (READ_ONCE(((const u8 *)addr)[i]) != want[i])
			return false;
	return true;
}

static void trapvec_text_store(u8 *alias, const u8 *bytes, u32 len)
{
	u32 i;

	for (i = 0; i < len; i++)
		WRITE_ONCE(alias[i], bytes[i]);
}

/*
 * Does op change its site? An identity patch (new bytes equal to the old, which tests use to
 * hold a range live) is never written: no CC of ours appears there, so none needs sending on.
 */
static bool trapvec_op_changes(const struct trapvec_text_op *op)
{
	return memcmp(op->rec->old_bytes, op->rec->new_bytes, op->rec->len) != 0;
}

/* The bytes op leaves at its site (ROLLBACK: the bytes FINISH found there). */
static const u8 *trapvec_op_target(const struct trapvec_stop_ctx *ctx,
				   const struct trapvec_text_op *op)
{
	bool old = op->undo != (ctx->stage == TRAPVEC_STAGE_ROLLBACK);

	return old ? op->rec->old_bytes : op->rec->new_bytes;
}

/* The bytes op expects at its site before this stage writes it. */
static bool trapvec_op_ready(const struct trapvec_stop_ctx *ctx,
			     const struct trapvec_text_op *op)
{
	const struct trapvec_live_patch *r = op->rec;
	bool old = !op->undo != (ctx->stage == TRAPVEC_STAGE_ROLLBACK);

	return trapvec_text_equals(r->addr, old ? r->old_bytes : r->new_bytes, r->len);
}

/* FINISH of an int3_first op: our CC on the first byte, the original tail behind it. */
static bool trapvec_op_armed(const struct trapvec_text_op *op)
{
	const struct trapvec_live_patch *r = op->rec;

	return READ_ONCE(*(const u8 *)r->addr) == INT3_INSN_OPCODE &&
	       trapvec_text_equals(r->addr + 1, r->old_bytes + 1, r->len - 1);
}

static bool trapvec_stop_compare(struct trapvec_stop_ctx *ctx)
{
	const struct trapvec_text_op *op;
	u32 i;

	/*
	 * The first stop compares every op, deferred ones too: the batch fails whole before
	 * anything is written. A later stop compares what it writes again (it let the CPUs go
	 * since): should that fail, trapvec_stop_batch() puts the earlier stops' writes back.
	 */
	for (i = ctx->compare_all ? 0 : ctx->from; i < (ctx->compare_all ? ctx->count : ctx->to);
	     i++) {
		op = &ctx->ops[i];
		if ((ctx->stage == TRAPVEC_STAGE_FINISH && op->int3_first) ?
		    !trapvec_op_armed(op) : !trapvec_op_ready(ctx, op)) {
			ctx->result = -ESTALE;
			ctx->failed = i;
			return false;
		}
	}
	return true;
}

/*
 * The writer, after a round of stores: serialize itself, then let every other CPU execute
 * sync_core() and wait until each has. Until the next round no CPU can run bytes older than
 * this round's (a CPU that has not synced yet is spinning in trapvec_stop_cb(), and an NMI
 * taken there is serialized by its own delivery).
 */
static void trapvec_stop_sync(struct trapvec_stop_ctx *ctx)
{
	unsigned int others = num_online_cpus() - 1;

	sync_core();
	/* Every other CPU acknowledged the last phase before the writer got here. */
	atomic_set(&ctx->acks, 0);
	smp_store_release(&ctx->phase, ctx->phase + 1);
	while (atomic_read(&ctx->acks) < others)
		cpu_relax();
}

/*
 * Store the ops marked write, int3 first, as text_poke_bp_batch() does: CC on every first
 * byte that is not ours already (ARM wrote it for int3_first ops in FINISH), sync; every
 * tail, sync; every first byte, sync. A CPU (an NMI, the writer's own included) that runs a
 * site meanwhile meets either the whole old instruction, or our CC, which the die notifier
 * resolves (the site is pending, trapvec_int3_notify()), or the whole new instruction: never
 * CC-less old and new bytes mixed, never a jmp with a stale displacement.
 */
static void trapvec_stop_rounds(struct trapvec_stop_ctx *ctx)
{
	bool any = false, int3 = false, tails = false;
	const struct trapvec_text_op *op;
	u32 i;

	for (i = ctx->from; i < ctx->to; i++) {
		op = &ctx->ops[i];
		if (!op->write)
			continue;
		any = true;
		tails |= op->rec->len > 1;
		if (ctx->stage == TRAPVEC_STAGE_FINISH && op->int3_first)
			continue;
		WRITE_ONCE(op->alias[0], INT3_INSN_OPCODE);
		int3 = true;
	}
	if (!any)
		return;
	if (int3)
		trapvec_stop_sync(ctx);
	if (tails) {
		for (i = ctx->from; i < ctx->to; i++) {
			op = &ctx->ops[i];
			if (op->write)
				trapvec_text_store(op->alias + 1, trapvec_op_target(ctx, op) + 1,
						   op->rec->len - 1);
		}
		trapvec_stop_sync(ctx);
	}
	for (i = ctx->from; i < ctx->to; i++) {
		op = &ctx->ops[i];
		if (op->write)
			WRITE_ONCE(op->alias[0], trapvec_op_target(ctx, op)[0]);
	}
	trapvec_stop_sync(ctx);
}

/* The writer: every other CPU spins in trapvec_stop_cb() with interrupts off. */
static void trapvec_stop_write(struct trapvec_stop_ctx *ctx)
{
	struct trapvec_text_op *op;
	bool any = false;
	u32 i;

	switch (ctx->stage) {
	case TRAPVEC_STAGE_UNLOAD:
	case TRAPVEC_STAGE_DEFERRED:
	case TRAPVEC_STAGE_ROLLBACK:
		/* Best effort, patch by patch: a byte someone else changed is left to them. */
		for (i = ctx->from; i < ctx->to; i++) {
			op = &ctx->ops[i];
			if (ctx->stage == TRAPVEC_STAGE_UNLOAD)
				op->write = true;
			else if (ctx->stage == TRAPVEC_STAGE_DEFERRED)
				op->write = op->deferred;
			else
				op->write = !op->deferred;
			op->write &= trapvec_op_changes(op);
			if (op->write && !trapvec_op_ready(ctx, op)) {
				op->write = false;
				ctx->skipped++;
			}
		}
		trapvec_stop_rounds(ctx);
		return;
	case TRAPVEC_STAGE_ARM:
		if (!trapvec_stop_compare(ctx))
			return;
		for (i = ctx->from; i < ctx->to; i++) {
			if (ctx->ops[i].int3_first) {
				WRITE_ONCE(ctx->ops[i].alias[0], INT3_INSN_OPCODE);
				any = true;
			}
		}
		if (any)
			trapvec_stop_sync(ctx);
		return;
	case TRAPVEC_STAGE_FINISH:
		if (!trapvec_stop_compare(ctx))
			return;
		for (i = ctx->from; i < ctx->to; i++)
			ctx->ops[i].write = !ctx->ops[i].deferred && trapvec_op_changes(&ctx->ops[i]);
		trapvec_stop_rounds(ctx);
		return;
	case TRAPVEC_STAGE_DISARM:
		/* Only our own CC goes: a byte someone else wrote since is theirs. */
		for (i = ctx->from; i < ctx->to; i++) {
			op = &ctx->ops[i];
			if (op->int3_first &&
			    READ_ONCE(*(const u8 *)op->rec->addr) == INT3_INSN_OPCODE) {
				WRITE_ONCE(op->alias[0], op->rec->old_bytes[0]);
				any = true;
			}
		}
		if (any)
			trapvec_stop_sync(ctx);
		return;
	}
}

/*
 * The writer's two stamps of the stop in progress. One writer at a time: stop_machine() calls
 * are serialized, and every caller holds trapvec_mutex.
 */
static u64 trapvec_stop_arrived_ns, trapvec_stop_released_ns;

/*
 * The clock read inside the stop: ktime_get_mono_fast_ns() is notrace and NMI-safe (its
 * latch never makes a reader wait for the timekeeper, which cannot run while every CPU is
 * held). ktime_get_ns() is neither: it is traceable text that a site may be placed in, and
 * it spins on the timekeeper's seqcount. The writer reads it only before its first store and
 * after its last sync, when no site holds a mix of old and new bytes.
 */
static u64 trapvec_stop_clock(void)
{
	return ktime_get_mono_fast_ns();
}

/* Under trapvec_mutex (the only writer); read by trapvec_stop_stats_get() with READ_ONCE. */
static struct {
	u64 stops;
	u64 held_max, held_total;
	u64 call_max, call_total;
	u64 last_held, last_call;
	u64 batch_stops, batch_held, batch_call;
} trapvec_stop_stats;

static void trapvec_stop_account(bool new_batch, u64 held, u64 call)
{
	typeof(trapvec_stop_stats) *st = &trapvec_stop_stats;

	lockdep_assert_held(&trapvec_mutex);
	WRITE_ONCE(st->stops, st->stops + 1);
	WRITE_ONCE(st->held_max, max(st->held_max, held));
	WRITE_ONCE(st->held_total, st->held_total + held);
	WRITE_ONCE(st->call_max, max(st->call_max, call));
	WRITE_ONCE(st->call_total, st->call_total + call);
	WRITE_ONCE(st->last_held, held);
	WRITE_ONCE(st->last_call, call);
	WRITE_ONCE(st->batch_stops, new_batch ? 1 : st->batch_stops + 1);
	WRITE_ONCE(st->batch_held, new_batch ? held : st->batch_held + held);
	WRITE_ONCE(st->batch_call, new_batch ? call : st->batch_call + call);
}

/* Figures of a batch in progress may be read half updated: they are statistics, not state. */
static int trapvec_stop_stats_get(char *buf, const struct kernel_param *kp)
{
	typeof(trapvec_stop_stats) *st = &trapvec_stop_stats;

	return sysfs_emit(buf,
			  "stops=%llu held_max_ns=%llu held_total_ns=%llu call_max_ns=%llu call_total_ns=%llu last_held_ns=%llu last_call_ns=%llu last_batch_stops=%llu last_batch_held_ns=%llu last_batch_call_ns=%llu\n",
			  READ_ONCE(st->stops), READ_ONCE(st->held_max),
			  READ_ONCE(st->held_total), READ_ONCE(st->call_max),
			  READ_ONCE(st->call_total), READ_ONCE(st->last_held),
			  READ_ONCE(st->last_call), READ_ONCE(st->batch_stops),
			  READ_ONCE(st->batch_held), READ_ONCE(st->batch_call));
}

static const struct kernel_param_ops trapvec_stop_stats_ops = {
	.get = trapvec_stop_stats_get,
};
module_param_cb(stop_stats, &trapvec_stop_stats_ops, NULL, 0444);
MODULE_PARM_DESC(stop_stats,
		 "stop_machine() calls of the text writer: how long every CPU was held and each call took, in ns (read only)");

static int trapvec_stop_cb(void *data)
{
	struct trapvec_stop_ctx *ctx = data;
	int seen = 0, phase;

	/* cpus_read_lock() is held by stop_machine(): the online count cannot change. */
	if (atomic_inc_return(&ctx->arrived) == 1) {
		while (atomic_read(&ctx->arrived) < num_online_cpus())
			cpu_relax();
		trapvec_stop_arrived_ns = trapvec_stop_clock();
		trapvec_stop_write(ctx);
		trapvec_stop_released_ns = trapvec_stop_clock();
		/* Pairs with the acquire below: the others see every byte written. */
		smp_store_release(&ctx->done, 1);
	} else {
		/* Pairs with the releases of the writer. */
		while (!smp_load_acquire(&ctx->done)) {
			phase = smp_load_acquire(&ctx->phase);
			if (phase != seen) {
				/* Cross-modifying code: serialize before anything new can run. */
				sync_core();
				seen = phase;
				atomic_inc(&ctx->acks);
			}
			cpu_relax();
		}
	}
	/* Cross-modifying code: serialize before running anything that may be new. */
	sync_core();
	return 0;
}

static int trapvec_stop_run(struct trapvec_stop_ctx *ctx, enum trapvec_stage stage, u32 from,
			    u32 to, bool compare_all)
{
	/* A zeroed ctx has had no stop yet: its first stop starts a batch. */
	bool new_batch = atomic_read(&ctx->arrived) == 0;
	u64 start, call;
	int ret;

	ctx->stage = stage;
	ctx->from = from;
	ctx->to = to;
	ctx->compare_all = compare_all;
	atomic_set(&ctx->arrived, 0);
	atomic_set(&ctx->acks, 0);
	ctx->phase = 0;
	ctx->done = 0;
	ctx->result = 0;
	ctx->failed = TRAPVEC_NO_INDEX;
	ctx->skipped = 0;
	trapvec_stop_arrived_ns = 0;
	trapvec_stop_released_ns = 0;
	start = trapvec_stop_clock();
	ret = stop_machine(trapvec_stop_cb, ctx, cpu_online_mask);
	call = trapvec_stop_clock() - start;
	/* Both stamps stay 0 when the callback did not run (held 0). */
	trapvec_stop_account(new_batch, trapvec_stop_released_ns - trapvec_stop_arrived_ns, call);
	return ret ?: ctx->result;
}

/*
 * Sites written per stop at most (stop_sites, a module parameter): a batch of more is written in
 * several stops, so that no stop holds every CPU for the whole of a large batch (up to 65,536
 * sites). Measured under TCG (kernel_commit_scale, kernel_stop_time; not linear there, the
 * first write to a page costs the emulator its translated code): a stop of about 1,000 sites
 * held every CPU 18-104 ms, the stops of 1,024 sites of a 19,542-site batch 9 ms on average,
 * and the whole 19,542 in one stop 148 ms; on hardware a site costs well under a
 * microsecond. 1,024 keeps a batch of 1,000 in one stop.
 */
static unsigned int trapvec_stop_sites = 1024;

static int trapvec_stop_sites_set(const char *val, const struct kernel_param *kp)
{
	unsigned int v;
	int ret = kstrtouint(val, 0, &v);

	if (ret)
		return ret;
	if (!v)
		return -EINVAL;
	WRITE_ONCE(trapvec_stop_sites, v);
	return 0;
}

static const struct kernel_param_ops trapvec_stop_sites_ops = {
	.set = trapvec_stop_sites_set,
	.get = param_get_uint,
};
module_param_cb(stop_sites, &trapvec_stop_sites_ops, &trapvec_stop_sites, 0644);
MODULE_PARM_DESC(stop_sites,
		 "sites written per stop_machine() at most: a larger batch is written in several stops (default 1024)");

/*
 * Run stage over ctx->ops[0..count) in stops of at most stop_sites ops each. ARM and FINISH
 * compare every op in their first stop (nothing is written if one differs) and the ops of each
 * later stop again before writing them. Should a later stop find its bytes changed (someone
 * wrote them between two stops), the batch still fails whole: ARM's earlier CCs are taken back
 * (DISARM), FINISH's earlier writes are put back as they were (ROLLBACK, best effort as
 * UNLOAD: a byte changed by someone else since is left to them) and the caller DISARMs the
 * rest. Between two stops every site is wholly old or wholly new (or, ARMed, our CC, which
 * the die notifier resolves as the new patch would): never bytes of both. UNLOAD, DEFERRED and
 * DISARM are best effort anyway; their skipped counts are summed.
 */
int trapvec_stop_batch(struct trapvec_stop_ctx *ctx, enum trapvec_stage stage)
{
	u32 from, to, step = max(READ_ONCE(trapvec_stop_sites), 1U), skipped = 0, failed;
	bool checked = stage == TRAPVEC_STAGE_ARM || stage == TRAPVEC_STAGE_FINISH;
	int ret = 0, result;

	for (from = 0; from < ctx->count; from = to) {
		to = min(ctx->count, from + step);
		ret = trapvec_stop_run(ctx, stage, from, to, checked && !from);
		skipped += ctx->skipped;
		if (ret)
			break;
	}
	ctx->skipped = skipped;
	if (!ret || !checked || !from)
		return ret;
	/* A later stop failed: undo the earlier ones, keep what failed and why. */
	failed = ctx->failed;
	result = ctx->result;
	pr_warn("a batch of %u changed under us between two stops (at %pS): undoing its first %u ops\n",
		ctx->count, (void *)ctx->ops[failed].rec->addr, from);
	for (to = 0; to < from; ) {
		u32 start = to;

		to = min(from, start + step);
		trapvec_stop_run(ctx, stage == TRAPVEC_STAGE_ARM ? TRAPVEC_STAGE_DISARM :
				 TRAPVEC_STAGE_ROLLBACK, start, to, false);
		if (ctx->skipped)
			pr_err("%u sites were changed by someone else between two stops and are left alone\n",
			       ctx->skipped);
	}
	ctx->failed = failed;
	ctx->result = result;
	return ret;
}
