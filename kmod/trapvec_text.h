/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the files of the text writer share (text.c and text_*.c; the map is at the top of
 * text.c). Nothing outside them includes this: the rest of the module calls the
 * trapvec_text_*() functions declared in trapvec_internal.h.
 */
#ifndef TRAPVEC_TEXT_H
#define TRAPVEC_TEXT_H

#include <linux/atomic.h>
#include <linux/list.h>
#include <linux/rbtree.h>
#include <linux/types.h>

#include "trapvec_internal.h"

struct trapvec_live_jmp;

/*
 * The record of a live patch: 128 bytes (it was 184, with what only a jmp needs in it). A
 * trap patch, a count site's, needs no more; a jmp's target, its node in the tree by target and
 * the springboard it lands on are in a side record (struct trapvec_live_jmp) only jmps have.
 */
struct trapvec_live_patch {
	struct list_head node;	/* in trapvec_live, under trapvec_mutex */
	/*
	 * In trapvec_live_by_addr while live; while its batch is checked, in the batch's own
	 * tree (struct trapvec_batch_index). Live records never overlap, so ordered by addr
	 * they are ordered by their ends too.
	 */
	struct rb_node by_addr;
	/* The batch (trapvec_text_apply()'s serial) that reverts it: one revert per batch. */
	u64 undo_batch;
	unsigned long addr;
	u32 len;
	u32 leaving;		/* scratch of trapvec_link_springboards(): jumpers going now */
	u32 jumpers;		/* live patches whose jmp lands on this one's first byte */
	bool bl_listed;		/* bl is on the list (not with the test knob kprobe_blacklist=0) */
	/*
	 * A jmp has landed on it: its revert waits an RCU-tasks grace period, even when its
	 * jumpers went in an earlier batch (a task may still be stopped on its first byte).
	 */
	bool springboard;
	u8 old_bytes[TRAPVEC_PATCH_MAX];	/* the original text */
	u8 new_bytes[TRAPVEC_PATCH_MAX];	/* what the patch wrote */
	struct module *mod;	/* owner of the text (a reference is held); NULL: kernel */
	/* [addr, addr + len) on kprobe_blacklist while live (under kprobe_mutex) */
	struct trapvec_blacklist_entry *bl;
	/* new_bytes begin with jmp rel32 or jmp rel8: what a jmp needs; NULL for a trap */
	struct trapvec_live_jmp *j;
};

/* What only a jmp patch needs, beside its record (trapvec_live_patch.j). */
struct trapvec_live_jmp {
	struct trapvec_live_patch *rec;	/* the record it belongs to */
	/* In trapvec_live_by_dest while live: keyed by dest, duplicates kept. */
	struct rb_node by_dest;
	unsigned long dest;	/* the jmp's target */
	/*
	 * The live patch this one's jmp lands on (a springboard: jmp rel8 -> jmp rel32 in
	 * padding), or NULL; its jumpers counts this one. Under trapvec_mutex.
	 */
	struct trapvec_live_patch *lands_on;
};

/* Where r's jmp goes; 0 for a trap. */
static inline unsigned long trapvec_rec_dest(const struct trapvec_live_patch *r)
{
	return r->j ? r->j->dest : 0;
}

/* The patch r's jmp lands on, or NULL (none, or r is a trap). */
static inline struct trapvec_live_patch *trapvec_rec_lands_on(const struct trapvec_live_patch *r)
{
	return r->j ? r->j->lands_on : NULL;
}

/* text_live.c: the live records, under trapvec_mutex. */
extern struct list_head trapvec_live;
extern u64 trapvec_live_count;

/*
 * The new records of a batch being checked, by addr (they never overlap: an overlap is
 * refused), so that a patch is checked against the earlier ones of its batch in O(log n).
 */
struct trapvec_batch_index {
	struct rb_root by_addr;
	u64 serial;		/* live records this batch reverts have it as undo_batch */
};

/* One write of a batch: apply rec (undo false) or revert it (undo true). */
struct trapvec_text_op {
	struct trapvec_live_patch *rec;
	u8 *alias;		/* writable view of rec->addr in the batch's alias */
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
	TRAPVEC_STAGE_ROLLBACK,	/* a later stop of FINISH failed: put its earlier stops' ops back */
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
	/*
	 * This stop writes ops[from..to) (trapvec_stop_batch(): at most trapvec_stop_sites of
	 * them); compare_all: it compares every op first (the first stop of ARM and FINISH).
	 */
	u32 from, to;
	bool compare_all;
	atomic_t arrived;	/* CPUs inside trapvec_stop_cb() */
	int phase;		/* rounds of stores so far (release by the writer) */
	atomic_t acks;		/* other CPUs that have synced since phase last moved */
	int done;		/* set (release) by the writer when it is finished */
	int result;		/* 0, or -ESTALE: ops[failed] no longer holds the expected bytes */
	u32 failed;
	u32 skipped;		/* UNLOAD, DEFERRED: patches whose bytes someone else changed */
};

static inline bool trapvec_overlap(unsigned long a, u32 alen, unsigned long b, u32 blen)
{
	return a < b + blen && b < a + alen;
}

static inline void trapvec_fail(struct trapvec_apply *req, u32 index, u32 reason, s32 error)
{
	req->failed_index = index;
	req->reason = reason;
	req->error = error;
}

/* text_stop.c */
bool trapvec_text_equals(unsigned long addr, const u8 *want, u32 len);
int trapvec_stop_batch(struct trapvec_stop_ctx *ctx, enum trapvec_stage stage);

/* text_alias.c: one writable vmap() of every page a batch writes, for the batch only. */
struct trapvec_alias {
	void *vm;
	unsigned int pages;
};

bool trapvec_core_text(unsigned long addr, u32 len);
int trapvec_alias_map(struct trapvec_text_op *ops, u32 n, struct trapvec_alias *alias,
		      u32 *failed);
void trapvec_alias_unmap(struct trapvec_alias *alias);
bool trapvec_alias_map_retry(struct trapvec_text_op *ops, u32 n, struct trapvec_alias *alias);

/* text_live.c */
void trapvec_live_unlist(struct trapvec_live_patch *r);
void trapvec_live_free(struct trapvec_live_patch *r);
void trapvec_live_retire(struct trapvec_live_patch *r);
int trapvec_get_owner(struct trapvec_live_patch *r, bool deferred);
struct trapvec_live_patch *trapvec_find_inverse(const struct trapvec_patch *p);
void trapvec_live_add(struct trapvec_live_patch *r);
void trapvec_live_del(struct trapvec_live_patch *r);
struct trapvec_live_patch *trapvec_live_at(unsigned long addr);
struct trapvec_live_patch *trapvec_live_jmp_onto(unsigned long dest);
void trapvec_batch_add(struct trapvec_batch_index *b, struct trapvec_live_patch *r);
struct trapvec_live_patch *trapvec_batch_overlap(const struct trapvec_batch_index *b,
						 unsigned long addr, u32 len);

/* text_int3.c */
struct trapvec_pending;
struct trapvec_pending *trapvec_pending_publish(const struct trapvec_text_op *ops, u32 n,
					       gfp_t gfp);
void trapvec_pending_withdraw(struct trapvec_pending *pend);

/* text_springboard.c */
int trapvec_link_springboards(struct trapvec_text_op *ops, u32 n,
			      const struct trapvec_batch_index *batch, struct trapvec_apply *req);

/* text_kprobe.c */
extern bool trapvec_kprobe_blacklist;
void trapvec_kprobe_pin_update(bool report);

#endif /* TRAPVEC_TEXT_H */
