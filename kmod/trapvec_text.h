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
#include <linux/types.h>

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

/* text_live.c: the live records, under trapvec_mutex. */
extern struct list_head trapvec_live;
extern u64 trapvec_live_count;

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
int trapvec_stop_run(struct trapvec_stop_ctx *ctx, enum trapvec_stage stage);

/* text_alias.c */
bool trapvec_core_text(unsigned long addr, u32 len);
int trapvec_map_alias(struct trapvec_live_patch *r);

/* text_live.c */
void trapvec_live_unlist(struct trapvec_live_patch *r);
void trapvec_live_free(struct trapvec_live_patch *r);
void trapvec_live_retire(struct trapvec_live_patch *r);
int trapvec_get_owner(struct trapvec_live_patch *r, bool deferred);
struct trapvec_live_patch *trapvec_find_inverse(const struct trapvec_patch *p);

/* text_int3.c */
struct trapvec_pending;
struct trapvec_pending *trapvec_pending_publish(const struct trapvec_text_op *ops, u32 n,
					       gfp_t gfp);
void trapvec_pending_withdraw(struct trapvec_pending *pend);

/* text_springboard.c */
int trapvec_link_springboards(struct trapvec_text_op *ops, u32 n, struct trapvec_apply *req);

/* text_kprobe.c */
extern bool trapvec_kprobe_blacklist;
void trapvec_kprobe_pin_update(bool report);

#endif /* TRAPVEC_TEXT_H */
