/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Runtime slots: the one allocator of the module's per-splice runtime state (return points in
 * returns.c, keyed counts in keyed.c; the maps of compiled snippets next). A kind keeps a static
 * array of its own slot structs, each beginning with a struct trapvec_slot, and describes it
 * with a struct trapvec_slot_table; this file takes, publishes, finds and gives back slots the
 * same way for every kind.
 *
 * A slot's state and generation are written under trapvec_mutex. Its routine (a call handler:
 * the trap path, no lock) finds it by a cookie, generation << 32 | index, and accepts it only if
 * it is live and of that generation: the generation changes when the slot is taken and when it
 * is given back, so a routine that still holds an old cookie touches nothing.
 */
#ifndef TRAPVEC_SLOTS_H
#define TRAPVEC_SLOTS_H

#include <linux/build_bug.h>
#include <linux/compiler.h>
#include <linux/kernel.h>
#include <linux/stddef.h>
#include <linux/types.h>
#include <asm/barrier.h>

#define TRAPVEC_SLOT_FREE	0
#define TRAPVEC_SLOT_LIVE	1
/* Given back, but its routine may still be running (returns.c waits for it). */
#define TRAPVEC_SLOT_DRAINING	2

struct trapvec_slot {
	u32 state;			/* TRAPVEC_SLOT_*, written under trapvec_mutex */
	u32 gen;			/* written under trapvec_mutex */
};

struct trapvec_slot_table {
	const char *kind;		/* "returns", "keys": for messages */
	void *slots;			/* the kind's array; each element begins with a trapvec_slot */
	size_t stride;			/* sizeof one element */
	u32 count;
};

/*
 * The table of @array, an array of structs whose first member @member is a struct
 * trapvec_slot (first, so that the table can reach it without knowing the struct).
 */
#define TRAPVEC_SLOT_TABLE(kind_name, array, member)					\
	{										\
		.kind = (kind_name),							\
		.slots = (array),							\
		.stride = sizeof((array)[0]) +						\
			  BUILD_BUG_ON_ZERO(offsetof(typeof((array)[0]), member) != 0),	\
		.count = ARRAY_SIZE(array),						\
	}

static __always_inline struct trapvec_slot *trapvec_slot_at(const struct trapvec_slot_table *t,
							    u32 i)
{
	return (struct trapvec_slot *)((char *)t->slots + (size_t)i * t->stride);
}

/* The cookie a slot's routine is called with. */
static inline u64 trapvec_slot_cookie(const struct trapvec_slot_table *t, u32 i)
{
	return ((u64)trapvec_slot_at(t, i)->gen << 32) | i;
}

/*
 * The trap path (callers disable preemption first: giving a slot back waits for a grace
 * period), whether @s is live and of generation @gen; and the slot a routine's cookie names, if it is live and of that generation, else
 * NULL. Acquire: the kind's fields (written before trapvec_slot_publish()) after the state.
 */
static __always_inline bool trapvec_slot_is_live(const struct trapvec_slot *s, u32 gen)
{
	return smp_load_acquire(&s->state) == TRAPVEC_SLOT_LIVE && READ_ONCE(s->gen) == gen;
}

static __always_inline struct trapvec_slot *trapvec_slot_live(const struct trapvec_slot_table *t,
							      u64 cookie)
{
	u32 i = (u32)cookie, gen = cookie >> 32;
	struct trapvec_slot *s;

	if (i >= t->count)
		return NULL;
	s = trapvec_slot_at(t, i);
	return trapvec_slot_is_live(s, gen) ? s : NULL;
}

int trapvec_slot_take(const struct trapvec_slot_table *t);
void trapvec_slot_publish(struct trapvec_slot *s);
struct trapvec_slot *trapvec_slot_find(const struct trapvec_slot_table *t, u32 i, u32 gen,
				       bool draining_too);
void trapvec_slot_drain(struct trapvec_slot *s);
void trapvec_slot_give_back(struct trapvec_slot *s);
bool trapvec_slots_idle(const struct trapvec_slot_table *t);
void trapvec_slots_exit(const struct trapvec_slot_table *t);

#endif /* TRAPVEC_SLOTS_H */
