// SPDX-License-Identifier: GPL-2.0
/*
 * Runtime slots (see trapvec_slots.h): taking a free slot, making it live, finding it by index
 * and generation, giving it back. Everything here runs under trapvec_mutex (the ioctls, the
 * release work, unload); the trap path only reads, through trapvec_slot_live().
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bug.h>
#include <linux/lockdep.h>
#include <linux/printk.h>

#include "trapvec_internal.h"
#include "trapvec_slots.h"

/*
 * The index of a free slot of @t, with a new generation (routines holding a cookie of its past
 * ignore it), still free: the caller fills in its kind's fields, then trapvec_slot_publish().
 * -ENOSPC when every slot is taken.
 */
int trapvec_slot_take(const struct trapvec_slot_table *t)
{
	u32 i;

	lockdep_assert_held(&trapvec_mutex);
	for (i = 0; i < t->count; i++) {
		struct trapvec_slot *s = trapvec_slot_at(t, i);

		if (s->state == TRAPVEC_SLOT_FREE) {
			/* Read by routines without the mutex: a new generation in one store. */
			WRITE_ONCE(s->gen, s->gen + 1);
			return i;
		}
	}
	pr_debug("%s: all %u slots in use\n", t->kind, t->count);
	return -ENOSPC;
}

/* Make a taken slot live: its fields, written before, are seen by a CPU that sees it live. */
void trapvec_slot_publish(struct trapvec_slot *s)
{
	lockdep_assert_held(&trapvec_mutex);
	WARN_ON_ONCE(s->state != TRAPVEC_SLOT_FREE);
	smp_store_release(&s->state, TRAPVEC_SLOT_LIVE);
}

/*
 * The slot @i of generation @gen, if it is live (or draining, with @draining_too), else NULL
 * (a slot given back, an index out of range, or a cookie of its past).
 */
struct trapvec_slot *trapvec_slot_find(const struct trapvec_slot_table *t, u32 i, u32 gen,
				       bool draining_too)
{
	struct trapvec_slot *s;

	lockdep_assert_held(&trapvec_mutex);
	if (i >= t->count)
		return NULL;
	s = trapvec_slot_at(t, i);
	if (s->gen != gen)
		return NULL;
	if (s->state == TRAPVEC_SLOT_LIVE ||
	    (draining_too && s->state == TRAPVEC_SLOT_DRAINING))
		return s;
	return NULL;
}

/*
 * Stop new calls of a slot's routine from taking it (they see it is not live) while its
 * routine's running calls finish: the kind waits for those, then trapvec_slot_give_back().
 */
void trapvec_slot_drain(struct trapvec_slot *s)
{
	lockdep_assert_held(&trapvec_mutex);
	WRITE_ONCE(s->state, TRAPVEC_SLOT_DRAINING);
}

/*
 * Free a slot: a new generation first (a routine that still holds the old cookie touches
 * nothing), then the state, with a release for a CPU that reads the state before the
 * generation. The kind frees what it allocated for the slot only once no CPU can be in its
 * routine (after a grace period: routines run with preemption off).
 */
void trapvec_slot_give_back(struct trapvec_slot *s)
{
	lockdep_assert_held(&trapvec_mutex);
	WRITE_ONCE(s->gen, s->gen + 1);
	smp_store_release(&s->state, TRAPVEC_SLOT_FREE);
}

/* Whether no slot of @t is live or draining. */
bool trapvec_slots_idle(const struct trapvec_slot_table *t)
{
	u32 i;

	for (i = 0; i < t->count; i++)
		if (READ_ONCE(trapvec_slot_at(t, i)->state) != TRAPVEC_SLOT_FREE)
			return false;
	return true;
}

/* Unload: every slot was given back (the module holds itself while one is not). */
void trapvec_slots_exit(const struct trapvec_slot_table *t)
{
	u32 i;

	for (i = 0; i < t->count; i++)
		WARN_ON_ONCE(trapvec_slot_at(t, i)->state != TRAPVEC_SLOT_FREE);
}
