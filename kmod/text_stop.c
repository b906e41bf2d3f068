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
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
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

/* The bytes op leaves at its site. */
static const u8 *trapvec_op_target(const struct trapvec_text_op *op)
{
	return op->undo ? op->rec->old_bytes : op->rec->new_bytes;
}

static bool trapvec_op_ready(const struct trapvec_text_op *op)
{
	const struct trapvec_live_patch *r = op->rec;

	return trapvec_text_equals(r->addr, op->undo ? r->new_bytes : r->old_bytes, r->len);
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

	for (i = 0; i < ctx->count; i++) {
		op = &ctx->ops[i];
		/* Deferred ops too: the batch fails whole before anything is written. */
		if ((ctx->stage == TRAPVEC_STAGE_FINISH && op->int3_first) ?
		    !trapvec_op_armed(op) : !trapvec_op_ready(op)) {
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

	for (i = 0; i < ctx->count; i++) {
		op = &ctx->ops[i];
		if (!op->write)
			continue;
		any = true;
		tails |= op->rec->len > 1;
		if (ctx->stage == TRAPVEC_STAGE_FINISH && op->int3_first)
			continue;
		WRITE_ONCE(op->rec->alias[0], INT3_INSN_OPCODE);
		int3 = true;
	}
	if (!any)
		return;
	if (int3)
		trapvec_stop_sync(ctx);
	if (tails) {
		for (i = 0; i < ctx->count; i++) {
			op = &ctx->ops[i];
			if (op->write)
				trapvec_text_store(op->rec->alias + 1, trapvec_op_target(op) + 1,
						   op->rec->len - 1);
		}
		trapvec_stop_sync(ctx);
	}
	for (i = 0; i < ctx->count; i++) {
		op = &ctx->ops[i];
		if (op->write)
			WRITE_ONCE(op->rec->alias[0], trapvec_op_target(op)[0]);
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
		/* Best effort, patch by patch: a byte someone else changed is left to them. */
		for (i = 0; i < ctx->count; i++) {
			op = &ctx->ops[i];
			op->write = (ctx->stage == TRAPVEC_STAGE_UNLOAD || op->deferred) &&
				    trapvec_op_changes(op);
			if (op->write && !trapvec_op_ready(op)) {
				op->write = false;
				ctx->skipped++;
			}
		}
		trapvec_stop_rounds(ctx);
		return;
	case TRAPVEC_STAGE_ARM:
		if (!trapvec_stop_compare(ctx))
			return;
		for (i = 0; i < ctx->count; i++) {
			if (ctx->ops[i].int3_first) {
				WRITE_ONCE(ctx->ops[i].rec->alias[0], INT3_INSN_OPCODE);
				any = true;
			}
		}
		if (any)
			trapvec_stop_sync(ctx);
		return;
	case TRAPVEC_STAGE_FINISH:
		if (!trapvec_stop_compare(ctx))
			return;
		for (i = 0; i < ctx->count; i++)
			ctx->ops[i].write = !ctx->ops[i].deferred && trapvec_op_changes(&ctx->ops[i]);
		trapvec_stop_rounds(ctx);
		return;
	case TRAPVEC_STAGE_DISARM:
		/* Only our own CC goes: a byte someone else wrote since is theirs. */
		for (i = 0; i < ctx->count; i++) {
			op = &ctx->ops[i];
			if (op->int3_first &&
			    READ_ONCE(*(const u8 *)op->rec->addr) == INT3_INSN_OPCODE) {
				WRITE_ONCE(op->rec->alias[0], op->rec->old_bytes[0]);
				any = true;
			}
		}
		if (any)
			trapvec_stop_sync(ctx);
		return;
	}
}

static int trapvec_stop_cb(void *data)
{
	struct trapvec_stop_ctx *ctx = data;
	int seen = 0, phase;

	/* cpus_read_lock() is held by stop_machine(): the online count cannot change. */
	if (atomic_inc_return(&ctx->arrived) == 1) {
		while (atomic_read(&ctx->arrived) < num_online_cpus())
			cpu_relax();
		trapvec_stop_write(ctx);
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

int trapvec_stop_run(struct trapvec_stop_ctx *ctx, enum trapvec_stage stage)
{
	int ret;

	ctx->stage = stage;
	atomic_set(&ctx->arrived, 0);
	atomic_set(&ctx->acks, 0);
	ctx->phase = 0;
	ctx->done = 0;
	ctx->result = 0;
	ctx->failed = TRAPVEC_NO_INDEX;
	ctx->skipped = 0;
	ret = stop_machine(trapvec_stop_cb, ctx, cpu_online_mask);
	return ret ?: ctx->result;
}
