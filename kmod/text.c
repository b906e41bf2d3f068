// SPDX-License-Identifier: GPL-2.0
/*
 * Batched text patches, and the record of every live one.
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
 * The alias: kernel image text is read-only in both of its mappings (the high mapping
 * and the direct map), so the page is mapped once more with vmap(PAGE_KERNEL); module
 * text is vmalloc memory (vmalloc_to_page()). The alias of a live patch is kept with its
 * record, so that reverting it (even at unload) allocates nothing.
 *
 * A live patch of module text holds a reference on that module, and keeps it after its
 * revert until the next QUIESCE (or unload) has waited for quiescence: a task may still be
 * in a trampoline that jumps back into that text, or asleep in a replacement that returns
 * into it (the patched function's caller, or the original trampoline's jump back). The
 * records of reverted patches of module text wait on trapvec_parked until then.
 *
 * Kprobes: while a patch is live, its range is an entry of the kprobes blacklist, so that
 * register_kprobe() refuses any byte of it (-EINVAL) instead of copying our trap into a slot
 * and writing an int3 over it; the entry shows in /sys/kernel/debug/kprobes/blacklist and
 * goes with the revert. The whole APPLY runs under kprobe_mutex, which guards that list and
 * the kprobe table's writers: no kprobe is registered on a range between its check
 * (check.c) and its write. register_kprobe() reads the blacklist before it takes
 * kprobe_mutex, so a registration that read it just before our entry went in can still
 * follow a batch; it then copies the trap itself (the kernel accepts that, see DESIGN.md),
 * which the second comparison of a later batch or revert detects (the revert then fails and
 * the patch stays live), and which APPLY and QUIESCE look for: while a kprobe is armed on a
 * live patch the module holds itself (see trapvec_kprobe_pin_update()), so that unload does
 * not free the arena the probe's copied trap leads into. Lock order, as kprobes have it:
 * trapvec_mutex, kprobe_mutex, cpus_read_lock (stop_machine()), text_mutex.
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
 * Meanwhile a CPU that meets one of our CCs takes #BP: exc_int3 tries text_poke_bp()'s
 * handler, then kprobe_int3_handler() (which backs the CPU up if the int3 is gone by then),
 * then the die chain, where trapvec_int3_notify() finds the site pending and sends the CPU
 * where the finished patch would: a trap through the dispatcher's own code (handler run,
 * hit counted once), a jmp to its target. A revert's site sends it where the live patch
 * still does (no out-of-line copy of the original instruction exists to run instead): its
 * trampoline replays that instruction and jumps back behind the window, which is right
 * until the revert completes, and the trap's dispatch entry cannot be removed meanwhile
 * (trapvec_mutex is held). A call a jmp sends to a springboard that is still
 * pending meets that one's CC and is sent on the same way. A call in the window is refused
 * unless it is the window's last instruction (check.c): its return address would point into
 * the new bytes, and a task sleeping in the callee is quiescent for RCU-tasks.
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
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/kdebug.h>
#include <linux/kprobes.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/rculist.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/stop_machine.h>
#include <linux/string.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/workqueue.h>
#include <asm/sync_core.h>
#include <asm/text-patching.h>

#include "trapvec_internal.h"

struct trapvec_live_patch {
	struct list_head node;	/* in trapvec_live, under trapvec_mutex */
	unsigned long addr;
	u32 len;
	u8 old_bytes[TRAPVEC_PATCH_MAX];	/* the original text */
	u8 new_bytes[TRAPVEC_PATCH_MAX];	/* what the patch wrote */
	unsigned long dest;	/* a jmp's target (jmp is set); 0 for a trap */
	bool jmp;		/* new_bytes begin with jmp rel32 or jmp rel8 */
	void *vm;		/* vmap() of the page(s) of [addr, addr + len) */
	unsigned int vm_pages;	/* 1 or 2 */
	u8 *alias;		/* writable view of addr inside vm */
	struct module *mod;	/* owner of the text (a reference is held); NULL: kernel */
	/* [addr, addr + len) on kprobe_blacklist while live (under kprobe_mutex) */
	struct trapvec_blacklist_entry *bl;
	bool bl_listed;		/* bl is on the list (not with the test knob kprobe_blacklist=0) */
	/*
	 * The live patch this one's jmp lands on (a springboard: jmp rel8 -> jmp rel32 in
	 * padding), or NULL; its jumpers counts this one. Under trapvec_mutex.
	 */
	struct trapvec_live_patch *lands_on;
	u32 jumpers;		/* live patches whose jmp lands on this one's first byte */
	/*
	 * A jmp has landed on it: its revert waits an RCU-tasks grace period, even when its
	 * jumpers went in an earlier batch (a task may still be stopped on its first byte).
	 */
	bool springboard;
};

static LIST_HEAD(trapvec_live);
static u64 trapvec_live_count;
/* Reverted patches of module text whose module reference waits for quiescence. */
static LIST_HEAD(trapvec_parked);

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
 * Test knob (insmod trapvec.ko kprobe_blacklist=0): live patches are not put on the kprobes
 * blacklist, so that a test can register a kprobe on one, as the race of register_kprobe()
 * (see the top of this file) can, and see the module pinned. Never for use outside tests.
 */
static bool trapvec_kprobe_blacklist = true;
module_param_named(kprobe_blacklist, trapvec_kprobe_blacklist, bool, 0444);
MODULE_PARM_DESC(kprobe_blacklist,
		 "test knob: 0 leaves live patches off the kprobes blacklist (a kprobe can then arm on one)");

/*
 * A kprobe on a live patch (trapvec_text_check_kprobes()): the module holds a reference on
 * itself while one exists, and a delayed work looks again every second until none is left.
 * Under trapvec_mutex.
 */
static bool trapvec_kprobe_pinned;
static void trapvec_kprobe_work_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(trapvec_kprobe_work, trapvec_kprobe_work_fn);

/*
 * The sites whose first byte is, or may be, our int3 while a batch is in flight: what the
 * die notifier reads. Published (RCU) before the first CC is written, withdrawn after the
 * last is gone, freed after synchronize_rcu() (the notifier runs with interrupts off, an
 * RCU-sched reader). Sorted by addr. Writers hold trapvec_mutex.
 */
struct trapvec_pending_site {
	unsigned long addr;
	unsigned long dest;	/* the jmp's target; 0: a trap, sent through the dispatch table */
};

struct trapvec_pending {
	u32 count;
	struct trapvec_pending_site sites[];
};

static struct trapvec_pending __rcu *trapvec_pending;

/*
 * CPUs the die notifier sent on from one of our pending CCs: what a test reads to see that
 * a CPU (an NMI) really ran a site while it was being written
 * (/sys/module/trapvec/parameters/int3_redirects).
 */
static atomic_long_t trapvec_int3_redirects = ATOMIC_LONG_INIT(0);

static int trapvec_get_redirects(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%ld\n", atomic_long_read(&trapvec_int3_redirects));
}

static const struct kernel_param_ops trapvec_redirects_ops = {
	.get = trapvec_get_redirects,
};
module_param_cb(int3_redirects, &trapvec_redirects_ops, NULL, 0444);
MODULE_PARM_DESC(int3_redirects, "CPUs sent on from a pending int3 of ours (read only)");

/* One write of a batch: apply rec (undo false) or revert it (undo true). */
struct trapvec_text_op {
	struct trapvec_live_patch *rec;
	bool undo;
	bool int3_first;	/* a new window over several instructions: CC, wait, the rest */
	bool deferred;		/* a revert of a springboard: after the patches that land on it */
	bool write;		/* set by the writer: this stage stores this op */
};

/* What one stop_machine() does. */
enum trapvec_stage {
	TRAPVEC_STAGE_ARM,	/* compare every op; CC at each int3_first site */
	TRAPVEC_STAGE_FINISH,	/* compare again; write every op that is not deferred */
	TRAPVEC_STAGE_DISARM,	/* the batch failed: put back the first byte under each CC */
	TRAPVEC_STAGE_DEFERRED,	/* revert the deferred ops (springboards) */
	TRAPVEC_STAGE_UNLOAD,	/* revert every op (live patches of one pass of revert_all) */
};

/*
 * What one stop_machine() shares. The first CPU to arrive is the writer; it writes nothing
 * before every online CPU has arrived (a CPU still on its way runs kernel code: the stopper
 * loop, watchdog touches). Then it stores in rounds; after each, it advances phase and waits
 * until every other CPU has executed sync_core() and acknowledged it. The others spin with
 * interrupts off, so this is the "sync every CPU" of text_poke_bp_batch() without IPIs.
 */
struct trapvec_stop_ctx {
	enum trapvec_stage stage;
	struct trapvec_text_op *ops;
	u32 count;
	atomic_t arrived;	/* CPUs inside trapvec_stop_cb() */
	int phase;		/* rounds of stores so far (release by the writer) */
	atomic_t acks;		/* other CPUs that have synced since phase last moved */
	int done;		/* set (release) by the writer when it is finished */
	int result;		/* 0, or -ESTALE: ops[failed] no longer holds the expected bytes */
	u32 failed;
	u32 skipped;		/* UNLOAD, DEFERRED: patches whose bytes someone else changed */
};

static bool trapvec_overlap(unsigned long a, u32 alen, unsigned long b, u32 blen)
{
	return a < b + blen && b < a + alen;
}

/* Bytes at addr equal want? Plain loads: runs inside stop_machine(), calls nothing. */
static bool trapvec_text_equals(unsigned long addr, const u8 *want, u32 len)
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

static int trapvec_stop_run(struct trapvec_stop_ctx *ctx, enum trapvec_stage stage)
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

static bool trapvec_core_text(unsigned long addr, u32 len)
{
	return addr >= trapvec_ksyms.stext && addr + len <= trapvec_ksyms.etext;
}

/* Map the page(s) of [addr, addr + len) writable; len <= TRAPVEC_PATCH_MAX < PAGE_SIZE. */
static int trapvec_map_alias(struct trapvec_live_patch *r)
{
	unsigned long first = r->addr & PAGE_MASK;
	unsigned long last = (r->addr + r->len - 1) & PAGE_MASK;
	unsigned int i, n = first == last ? 1 : 2;
	struct page *pages[2];

	for (i = 0; i < n; i++) {
		unsigned long page = first + i * PAGE_SIZE;

		pages[i] = trapvec_core_text(r->addr, r->len) ? virt_to_page((void *)page) :
							       vmalloc_to_page((void *)page);
		if (!pages[i])
			return -EFAULT;
	}
	r->vm = trapvec_vmap(TRAPVEC_MEM_ALIAS, pages, n);
	if (!r->vm)
		return -ENOMEM;
	r->vm_pages = n;
	r->alias = (u8 *)r->vm + offset_in_page(r->addr);
	return 0;
}

/*
 * Off the blacklist: readers walk it under RCU (within_kprobe_blacklist()), so the entry is
 * freed after a grace period, as kprobe_remove_area_blacklist() does.
 */
static void trapvec_live_unlist(struct trapvec_live_patch *r)
{
	lockdep_assert_held(trapvec_ksyms.kprobe_mutex);
	if (r->bl_listed)
		list_del_rcu(&r->bl->entry.list);
	r->bl_listed = false;
	trapvec_mem_put(TRAPVEC_MEM_PATCH, sizeof(*r->bl));
	kfree_rcu(r->bl, rcu);
	r->bl = NULL;
}

static void trapvec_live_free(struct trapvec_live_patch *r)
{
	trapvec_vunmap(TRAPVEC_MEM_ALIAS, r->vm, r->vm_pages);
	if (r->mod)
		module_put(r->mod);
	/* Never listed (a batch that failed): nobody can have seen it. */
	trapvec_kvfree(TRAPVEC_MEM_PATCH, r->bl, sizeof(*r->bl));
	trapvec_kvfree(TRAPVEC_MEM_PATCH, r, sizeof(*r));
}

/*
 * A reverted patch, off the live list and the blacklist: free it, but keep its module
 * reference (if any) on trapvec_parked until trapvec_text_put_parked().
 */
static void trapvec_live_retire(struct trapvec_live_patch *r)
{
	if (!r->mod) {
		trapvec_live_free(r);
		return;
	}
	trapvec_vunmap(TRAPVEC_MEM_ALIAS, r->vm, r->vm_pages);
	r->vm = NULL;
	r->alias = NULL;
	list_add_tail(&r->node, &trapvec_parked);
}

/*
 * QUIESCE and unload, once no task can be in code that a reverted patch sent it to (the
 * grace periods and the in-flight wait): drop the module references of reverted patches.
 */
void trapvec_text_put_parked(void)
{
	struct trapvec_live_patch *r, *tmp;
	unsigned int n = 0;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry_safe(r, tmp, &trapvec_parked, node) {
		list_del(&r->node);
		trapvec_live_free(r);
		n++;
	}
	if (n)
		pr_debug("dropped the module references of %u reverted patches\n", n);
}

/*
 * Take a reference on the module owning [addr, addr + len); 0 for kernel text. A deferred
 * patch (TRAPVEC_APPLY_DEFERRED) takes none: the module stays removable, and the module
 * watch (modwatch.c) reverts the patch when it goes. A module that is still COMING takes
 * deferred patches only.
 */
static int trapvec_get_owner(struct trapvec_live_patch *r, bool deferred)
{
	struct module *mod;
	int ret = 0;

	if (trapvec_core_text(r->addr, r->len))
		return 0;
	preempt_disable();
	mod = trapvec_ksyms.module_text_address(r->addr);
	if (mod && deferred)
		ret = 0;
	else if (mod && mod->state != MODULE_STATE_COMING && try_module_get(mod))
		r->mod = mod;
	else
		ret = -ENOENT;
	preempt_enable();
	return ret;
}

static struct trapvec_live_patch *trapvec_find_inverse(const struct trapvec_patch *p)
{
	struct trapvec_live_patch *r;

	list_for_each_entry(r, &trapvec_live, node)
		if (r->addr == p->addr && r->len == p->len &&
		    !memcmp(r->new_bytes, p->old_bytes, p->len) &&
		    !memcmp(r->old_bytes, p->new_bytes, p->len))
			return r;
	return NULL;
}

bool trapvec_text_overlaps_live(unsigned long addr, unsigned long len)
{
	struct trapvec_live_patch *r;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		if (trapvec_overlap(addr, len, r->addr, r->len))
			return true;
	return false;
}

/* The text as it was before any live patch of ours: current bytes, our patches undone. */
int trapvec_text_read_original(unsigned long addr, u8 *buf, size_t len)
{
	struct trapvec_live_patch *r;
	size_t i;

	lockdep_assert_held(&trapvec_mutex);
	if (copy_from_kernel_nofault(buf, (void *)addr, len))
		return -EFAULT;
	list_for_each_entry(r, &trapvec_live, node) {
		if (!trapvec_overlap(addr, len, r->addr, r->len))
			continue;
		for (i = 0; i < r->len; i++)
			if (r->addr + i >= addr && r->addr + i < addr + len)
				buf[r->addr + i - addr] = r->old_bytes[i];
	}
	return 0;
}

static void trapvec_fail(struct trapvec_apply *req, u32 index, u32 reason, s32 error)
{
	req->failed_index = index;
	req->reason = reason;
	req->error = error;
}

/* Is a live patch of ours writing the trap at site (its dispatch entry is in use)? */
bool trapvec_text_trap_live(unsigned long site)
{
	struct trapvec_live_patch *r;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		if (r->addr == site && r->len >= TRAPVEC_TRAP_LEN && r->new_bytes[0] == 0xcd)
			return true;
	return false;
}

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
 * Check patch i of the batch (a new patch, not the inverse of a live one). Returns 0 or the
 * ioctl's errno (req filled in).
 */
static int trapvec_check_new(const struct trapvec_patch *patches, u32 i,
			     struct trapvec_apply *req, u32 *insns)
{
	const struct trapvec_patch *p = &patches[i];
	u32 reason, j;

	if (trapvec_text_overlaps_live(p->addr, p->len)) {
		trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
		return -EBUSY;
	}
	for (j = 0; j < i; j++) {
		if (trapvec_overlap(p->addr, p->len, patches[j].addr, patches[j].len)) {
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			return -EBUSY;
		}
	}
	reason = trapvec_check_site_insns(p->addr, p->len, &req->culprit, insns);
	if (!reason)
		reason = trapvec_check_trap(p);
	if (reason) {
		pr_debug("patch %u at %pS refused: reason %u\n", i, (void *)p->addr, reason);
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

static int trapvec_cmp_pending(const void *a, const void *b)
{
	const struct trapvec_pending_site *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/*
 * Publish every site of ops for the die notifier, before any CC of ours is written there:
 * apply and revert alike. Where a CPU that meets the CC is sent: for an apply, where the new
 * patch sends it; for a revert, where the live patch still sends it (its trampoline replays
 * the original instruction and jumps back behind the window; its dispatch entry cannot go
 * while trapvec_mutex is held), which is right until the original first byte is back.
 */
static struct trapvec_pending *trapvec_pending_publish(const struct trapvec_text_op *ops, u32 n,
						       gfp_t gfp)
{
	struct trapvec_pending *pend;
	u32 i;

	pend = trapvec_kvmalloc(TRAPVEC_MEM_PENDING, 1, struct_size(pend, sites, n), gfp);
	if (!pend)
		return NULL;
	pend->count = n;
	for (i = 0; i < n; i++) {
		pend->sites[i].addr = ops[i].rec->addr;
		pend->sites[i].dest = ops[i].rec->jmp ? ops[i].rec->dest : 0;
	}
	sort(pend->sites, pend->count, sizeof(pend->sites[0]), trapvec_cmp_pending, NULL);
	/* Orders the array's contents before the pointer; stop_machine() then orders it
	 * before the first CC.
	 */
	rcu_assign_pointer(trapvec_pending, pend);
	return pend;
}

/* Withdraw: no CC of ours is left; wait for notifiers still reading, then free. */
static void trapvec_pending_withdraw(struct trapvec_pending *pend)
{
	lockdep_assert_held(&trapvec_mutex);
	RCU_INIT_POINTER(trapvec_pending, NULL);
	synchronize_rcu();
	trapvec_kvfree(TRAPVEC_MEM_PENDING, pend, struct_size(pend, sites, pend->count));
}

/*
 * DIE_INT3, after kprobe_int3_handler() (do_int3(); poke_int3_handler() came before it):
 * a kernel CPU stopped at one of our pending CCs is sent where the finished patch sends it.
 * A CC that is already gone again never gets here: kprobe_int3_handler() finds no int3 at
 * the address and backs the CPU up to run what is there now.
 *
 * Context: exc_int3 from kernel mode, irqentry_nmi_enter(), interrupts off, possibly inside
 * an NMI. No lock, no allocation, no call of a function a site could be placed in (the
 * binary search is written out here): an RCU-sched reader of trapvec_pending.
 */
static int trapvec_int3_notify(struct notifier_block *nb, unsigned long val, void *data)
{
	const struct die_args *args = data;
	struct pt_regs *regs = args->regs;
	const struct trapvec_pending *pend;
	unsigned long site;
	int ret = NOTIFY_DONE;
	u32 lo, hi, mid;

	if (val != DIE_INT3 || !regs || user_mode(regs))
		return NOTIFY_DONE;
	site = regs->ip - INT3_INSN_SIZE;
	rcu_read_lock_sched_notrace();
	pend = rcu_dereference_sched(trapvec_pending);
	if (!pend)
		goto out;
	lo = 0;
	hi = pend->count;
	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (pend->sites[mid].addr < site)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == pend->count || pend->sites[lo].addr != site)
		goto out;
	if (pend->sites[lo].dest) {
		/* A jmp: its target (a trampoline, or a springboard, itself pending or written). */
		regs->ip = pend->sites[lo].dest;
		ret = NOTIFY_STOP;
	} else if (trapvec_dispatch_site(regs, site)) {
		/* A trap: what the trap would have done, counted once. */
		ret = NOTIFY_STOP;
	}
	if (ret == NOTIFY_STOP)
		atomic_long_inc(&trapvec_int3_redirects);
	/*
	 * Else a trap without its dispatch entry, which APPLY refuses and DISPATCH_REMOVE cannot
	 * do meanwhile (trapvec_mutex is held from the first CC to the last): die() says so.
	 */
out:
	rcu_read_unlock_sched_notrace();
	return ret;
}
NOKPROBE_SYMBOL(trapvec_int3_notify);

/*
 * First on the die chain (with kprobes' own, which is blacklisted): a die notifier that runs
 * before ours on an int3 could itself hold one of our pending CCs (uprobes' at INT_MAX - 1,
 * arch_uprobe_exception_notify(), is ordinary traceable text, so a site may be planned in it).
 * Then every int3 would run into that CC again before we could send the CPU on: an endless
 * recursion that froze a guest during a batch of 5,000 jmp splices. Running first, we clear a
 * pending CC before anything else on the chain runs.
 */
static struct notifier_block trapvec_int3_nb = {
	.notifier_call = trapvec_int3_notify,
	.priority = INT_MAX,
};

int trapvec_text_init(void)
{
	return register_die_notifier(&trapvec_int3_nb);
}

/*
 * Unload, first of all (without trapvec_mutex, which the work takes): the module was not
 * pinned, so the kprobe work is not rescheduled, but it may still be finishing after its
 * module_put().
 */
void trapvec_text_cancel_work(void)
{
	cancel_delayed_work_sync(&trapvec_kprobe_work);
}

/* After trapvec_text_revert_all(): no batch is in flight. */
void trapvec_text_exit(void)
{
	unregister_die_notifier(&trapvec_int3_nb);
}

/* The live record (or new one of ops[0..n)) whose first byte is addr; NULL if none. */
static struct trapvec_live_patch *trapvec_rec_at(unsigned long addr,
						 const struct trapvec_text_op *ops, u32 n)
{
	struct trapvec_live_patch *r;
	u32 i;

	list_for_each_entry(r, &trapvec_live, node)
		if (r->addr == addr)
			return r;
	for (i = 0; i < n; i++)
		if (ops[i].rec && ops[i].rec->addr == addr)
			return ops[i].rec;
	return NULL;
}

/* A live jmp (or new one of ops[0..n)) that lands on addr; NULL if none. */
static struct trapvec_live_patch *trapvec_jmp_onto(unsigned long addr,
						   const struct trapvec_text_op *ops, u32 n)
{
	struct trapvec_live_patch *r;
	u32 i;

	list_for_each_entry(r, &trapvec_live, node)
		if (r->jmp && r->dest == addr)
			return r;
	for (i = 0; i < n; i++)
		if (ops[i].rec && !ops[i].undo && ops[i].rec->jmp && ops[i].rec->dest == addr)
			return ops[i].rec;
	return NULL;
}

/*
 * Springboards: a jmp (rel8) that lands on another patch of ours (a jmp rel32 in padding).
 * A task may be preempted on the springboard's first byte, having taken the jmp to it: the
 * springboard may only be reverted after every patch that lands on it, and an RCU-tasks grace
 * period later (its original bytes are padding, not code to resume in). So the revert of a
 * patch that a jmp has ever landed on is deferred, and refused while some of its jumpers
 * stay; a new jmp may not land on a patch this batch reverts. 0 or the ioctl's errno.
 */
static int trapvec_link_springboards(struct trapvec_text_op *ops, u32 n,
				     struct trapvec_apply *req)
{
	struct trapvec_live_patch *r, *to;
	u32 i, j, leaving;

	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (ops[i].undo || !r->jmp)
			continue;
		to = trapvec_rec_at(r->dest, ops, n);
		for (j = 0; to && j < n; j++) {
			if (ops[j].rec == to && ops[j].undo) {
				trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
				req->culprit = to->addr;
				return -EBUSY;
			}
		}
		r->lands_on = to;
	}
	/*
	 * One hop at most: a new jmp may land on a patch only if that patch does not land on
	 * one itself, and not while a jmp lands on the new one's own site. A springboard jumps
	 * into the arena; a chain of patches could close into a cycle (A lands on B, B on A,
	 * also when A went in before B existed), which the die notifier would follow from CC to
	 * CC without end while both are pending, and the finished text for ever.
	 */
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (ops[i].undo || !r->jmp || !r->lands_on)
			continue;
		to = r->lands_on->jmp ? trapvec_rec_at(r->lands_on->dest, ops, n) : NULL;
		if (to) {
			pr_debug("jmp at %pS lands on the patch at %pS, which lands on %pS\n",
				 (void *)r->addr, (void *)r->lands_on->addr, (void *)to->addr);
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = r->lands_on->addr;
			return -EBUSY;
		}
		to = trapvec_jmp_onto(r->addr, ops, n);
		if (to) {
			pr_debug("jmp at %pS lands on the patch at %pS, and the jmp at %pS on it\n",
				 (void *)r->addr, (void *)r->lands_on->addr, (void *)to->addr);
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			req->culprit = to->addr;
			return -EBUSY;
		}
	}
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (!ops[i].undo || !r->springboard)
			continue;
		leaving = 0;
		for (j = 0; j < n; j++)
			leaving += ops[j].undo && ops[j].rec->lands_on == r;
		if (leaving != r->jumpers) {
			trapvec_fail(req, i, TRAPVEC_REASON_LIVE_PATCH, 0);
			list_for_each_entry(to, &trapvec_live, node)
				if (to->lands_on == r)
					req->culprit = to->addr;
			return -EBUSY;
		}
		ops[i].deferred = true;
	}
	return 0;
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
		ret = trapvec_stop_run(ctx, TRAPVEC_STAGE_ARM);
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
	ret = trapvec_stop_run(ctx, TRAPVEC_STAGE_FINISH);
	if (ret && int3_first) {
		u32 failed = ctx->failed;

		/* Nobody is inside an original window (see above): the old first bytes go back. */
		trapvec_stop_run(ctx, TRAPVEC_STAGE_DISARM);
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
	trapvec_stop_run(ctx, TRAPVEC_STAGE_DEFERRED);
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

/*
 * Kprobes on our bytes. register_kprobe() reads the blacklist before it takes kprobe_mutex,
 * so a registration racing an APPLY can arm on a live patch: it copies our trap into its slot
 * and writes its int3 over our first byte. Our revert then fails its comparison and the patch
 * stays live, its trampoline and component in the arena; unloading would free the arena (the
 * module's text) under the probe. So APPLY and QUIESCE look for a kprobe on any byte of every
 * live patch (get_kprobe(), under kprobe_mutex), and while one exists the module holds a
 * reference on itself: rmmod is refused as "in use", and dmesg names the site and the probe.
 * A delayed work looks again every second and drops the reference once none is left. A probe
 * that armed after the last look is met by unload itself, which waits for it to go
 * (trapvec_text_wait_kprobes()): unload cannot fail.
 */
static struct kprobe *trapvec_live_kprobe(struct trapvec_live_patch **on)
{
	struct trapvec_live_patch *r;
	struct kprobe *p;
	u32 i;

	lockdep_assert_held(&trapvec_mutex);
	lockdep_assert_held(trapvec_ksyms.kprobe_mutex);
	list_for_each_entry(r, &trapvec_live, node) {
		for (i = 0; i < r->len; i++) {
			p = trapvec_ksyms.get_kprobe((void *)(r->addr + i));
			if (p) {
				*on = r;
				return p;
			}
		}
	}
	return NULL;
}

/* Pin or unpin the module as kprobes on live patches come and go; report: name one always. */
static void trapvec_kprobe_pin_update(bool report)
{
	struct trapvec_live_patch *on = NULL;
	struct kprobe *p = trapvec_live_kprobe(&on);

	if (p && (report || !trapvec_kprobe_pinned))
		pr_warn("kprobe at %pS (handler %ps) is armed on the live patch at %pS: unload is refused while it exists\n",
			p->addr, p->pre_handler, (void *)on->addr);
	if (p && !trapvec_kprobe_pinned) {
		__module_get(THIS_MODULE);
		trapvec_kprobe_pinned = true;
		schedule_delayed_work(&trapvec_kprobe_work, HZ);
	} else if (!p && trapvec_kprobe_pinned) {
		trapvec_kprobe_pinned = false;
		pr_info("no kprobe is armed on a live patch any more: unload is allowed again\n");
		/* The work that may be running this is cancelled by unload (trapvec_text_exit()). */
		module_put(THIS_MODULE);
	}
}

static void trapvec_kprobe_work_fn(struct work_struct *work)
{
	mutex_lock(&trapvec_mutex);
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	trapvec_kprobe_pin_update(false);
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	if (trapvec_kprobe_pinned)
		schedule_delayed_work(&trapvec_kprobe_work, HZ);
	mutex_unlock(&trapvec_mutex);
}

/* QUIESCE: look for kprobes on live patches, naming one if there is. */
void trapvec_text_check_kprobes(void)
{
	lockdep_assert_held(&trapvec_mutex);
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	trapvec_kprobe_pin_update(true);
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
}

/*
 * Unload, before the revert: no kprobe may be armed on a live patch (the module was not
 * pinned, but one may have armed since the last look). Wait for it to go, however long,
 * naming it every 5 s: the arena it runs goes with the module.
 */
void trapvec_text_wait_kprobes(void)
{
	struct trapvec_live_patch *on = NULL;
	unsigned long next = jiffies;
	struct kprobe *p;

	lockdep_assert_held(&trapvec_mutex);
	for (;;) {
		mutex_lock(trapvec_ksyms.kprobe_mutex);
		p = trapvec_live_kprobe(&on);
		if (p && time_after_eq(jiffies, next)) {
			pr_warn("unload waits for the kprobe at %pS (handler %ps) armed on the live patch at %pS\n",
				p->addr, p->pre_handler, (void *)on->addr);
			next = jiffies + 5 * HZ;
		}
		mutex_unlock(trapvec_ksyms.kprobe_mutex);
		if (!p)
			return;
		msleep(100);
	}
}

int trapvec_text_apply(const struct trapvec_patch *patches, struct trapvec_apply *req)
{
	struct mutex *kprobe_mutex = trapvec_ksyms.kprobe_mutex;
	u32 i, j, n = req->count, may_write, insns, reason;
	struct trapvec_stop_ctx ctx = {};
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
	mutex_lock(kprobe_mutex);
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
		for (j = 0; inv && j < i; j++)
			if (ops[j].rec == inv)
				inv = NULL;	/* the same revert twice: an overlap */
		insns = 1;
		if (inv) {
			ops[i].rec = inv;
			ops[i].undo = true;
		} else if (may_write) {
			trapvec_fail(req, i, may_write, -EPERM);
			ret = -EPERM;
			goto out_unwind;
		} else {
			ret = trapvec_check_new(patches, i, req, &insns);
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
		memcpy(ops[i].rec->old_bytes, p->old_bytes, p->len);
		memcpy(ops[i].rec->new_bytes, p->new_bytes, p->len);
		reason = trapvec_patch_dest(p, &ops[i].rec->dest, &ops[i].rec->jmp);
		if (reason && (insns > 1 || memcmp(p->new_bytes, p->old_bytes, p->len))) {
			/*
			 * Nothing could stand in for the new bytes (or, at the revert, the old
			 * ones) while their CC is there; an identity patch is never written.
			 */
			trapvec_fail(req, i, reason, 0);
			ret = -EINVAL;
			goto out_unwind;
		}
		ops[i].int3_first = insns > 1 && trapvec_int3_first;
		ret = trapvec_get_owner(ops[i].rec, req->flags & TRAPVEC_APPLY_DEFERRED) ?:
		      trapvec_map_alias(ops[i].rec);
		if (ret) {
			trapvec_fail(req, i, TRAPVEC_REASON_NOT_TEXT, ret);
			ret = -EINVAL;
			goto out_unwind;
		}
	}
	ret = trapvec_link_springboards(ops, n, req);
	if (ret)
		goto out_unwind;
	ret = trapvec_write_batch(ops, n, &ctx);
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
		if (r->lands_on) {
			if (ops[i].undo) {
				r->lands_on->jumpers--;
			} else {
				r->lands_on->jumpers++;
				r->lands_on->springboard = true;
			}
		}
	}
	for (i = 0; i < n; i++) {
		struct trapvec_live_patch *r = ops[i].rec;

		if (ops[i].undo) {
			list_del(&r->node);
			trapvec_live_count--;
			trapvec_live_unlist(r);
			trapvec_live_retire(r);
		} else {
			list_add_tail(&r->node, &trapvec_live);
			trapvec_live_count++;
			if (trapvec_kprobe_blacklist) {
				list_add_tail_rcu(&r->bl->entry.list, trapvec_ksyms.kprobe_blacklist);
				r->bl_listed = true;
			}
		}
	}
	pr_debug("applied a batch of %u patches; %llu live\n", n, trapvec_live_count);
	goto out_free;

out_unwind:
	for (i = 0; i < n; i++)
		if (ops[i].rec && !ops[i].undo)
			trapvec_live_free(ops[i].rec);
out_free:
	trapvec_kprobe_pin_update(false);
	mutex_unlock(kprobe_mutex);
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
	trapvec_stop_run(&ctx, TRAPVEC_STAGE_UNLOAD);
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
		list_del(&r->node);
		trapvec_live_unlist(r);
		trapvec_live_retire(r);
	}
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	trapvec_live_count = 0;
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
	trapvec_stop_run(&ctx, TRAPVEC_STAGE_UNLOAD);
	trapvec_pending_withdraw(pend);
	if (ctx.skipped)
		pr_err("%u live patches in a module's text were changed by someone else; forgotten all the same (the text goes)\n",
		       ctx.skipped);
	mutex_lock(trapvec_ksyms.kprobe_mutex);
	for (i = 0; i < n; i++) {
		r = ops[i].rec;
		if (r->lands_on)
			r->lands_on->jumpers--;
	}
	list_for_each_entry_safe(r, tmp, &trapvec_live, node) {
		if (r->addr < start || r->addr >= end)
			continue;
		list_del(&r->node);
		trapvec_live_count--;
		trapvec_live_unlist(r);
		trapvec_live_retire(r);
	}
	mutex_unlock(trapvec_ksyms.kprobe_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, ops, n * sizeof(*ops));
	return n;
}

u64 trapvec_text_live_count(void)
{
	return trapvec_live_count;
}

/*
 * FREE's check (arena.c): the site of a live jmp patch whose jmp lands in [start, end), or 0.
 * A springboard's jmp rel32 counts too: the jmp rel8 in front of it enters the arena through it.
 */
unsigned long trapvec_text_jmp_into(unsigned long start, unsigned long end)
{
	struct trapvec_live_patch *r;

	lockdep_assert_held(&trapvec_mutex);
	list_for_each_entry(r, &trapvec_live, node)
		if (r->jmp && r->dest >= start && r->dest < end)
			return r->addr;
	return 0;
}
