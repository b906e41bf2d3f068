// SPDX-License-Identifier: GPL-2.0
/*
 * Keyed counts: a splice's hits counted by pid, tgid, comm or CPU (bpftrace's
 * @[comm] = count(), see trapvec_abi.h).
 *
 * TRAPVEC_KEY_SLOTS slots (slots.c), one per keyed count: what it counts by and a table of
 * TRAPVEC_KEY_TABLE entries per CPU (allocated, zeroed, by KEY_ADD; freed by KEY_REMOVE once
 * no CPU can be counting into it).
 *
 * Context. trapvec_key_entry() is a call handler: the dispatcher runs it with interrupts off
 * (trap splices), a call trampoline in the hit's own context with interrupts and preemption as
 * they were (jmp splices: task context, preemptible). It disables preemption so that it works
 * on one CPU's table from start to end; it takes no lock, allocates nothing and calls nothing a
 * site may be placed in (the helpers below are inline). Only this CPU writes this CPU's table,
 * but an interrupt or an NMI may hit the same splice in the middle of an update:
 * - counts and the overflow are local64_t, whose increment is one instruction, never torn by an
 *   interrupt on the same CPU;
 * - an entry is claimed with a CPU-local cmpxchg of its state (FREE -> CLAIMING), then its key
 *   is written, then it is published (READY). A context that meets a CLAIMING entry (it
 *   interrupted the claim) cannot know its key and probes on: it may claim a second entry for
 *   the same key, which KEY_STATS merges.
 * Entries are never given back while their slot lives, so a probe sequence only ever grows and
 * a READY entry's key never changes.
 *
 * Lifetime. The splicer removes a keyed count's splice, waits for quiescence (QUIESCE: no CPU
 * or task is in the trampoline or the routine), then gives the slot back (KEY_REMOVE), which
 * also waits for an RCU grace period (the routine runs with preemption off) so that a CPU
 * still counting for a removed slot is done before its table is freed; a routine that starts
 * later sees the slot free and touches nothing. The module holds a reference on itself while
 * any slot lives (rmmod says "in use").
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/hash.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/percpu.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sort.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <asm/local64.h>

#include "trapvec_internal.h"
#include "trapvec_slots.h"

#define KEY_FREE	0
#define KEY_CLAIMING	1
#define KEY_READY	2

#define KEY_HASH_BITS	8
static_assert(TRAPVEC_KEY_TABLE == 1 << KEY_HASH_BITS);
static_assert(TRAPVEC_KEY_BYTES == TASK_COMM_LEN);

struct trapvec_key_ent {
	u32 state;			/* KEY_* */
	u32 pad;
	u64 key[2];			/* TRAPVEC_KEY_BYTES, as trapvec_key_entry.key */
	local64_t count;
};

struct trapvec_key_pcpu {
	local64_t overflow;
	struct trapvec_key_ent e[TRAPVEC_KEY_TABLE];
};

struct trapvec_key_slot {
	struct trapvec_slot slot;	/* first: see TRAPVEC_SLOT_TABLE() */
	u32 by;				/* TRAPVEC_KEY_* */
	struct trapvec_key_pcpu __percpu *pcpu;
};

static struct trapvec_key_slot trapvec_key_slots[TRAPVEC_KEY_SLOTS];
static const struct trapvec_slot_table trapvec_key_table =
	TRAPVEC_SLOT_TABLE("keys", trapvec_key_slots, slot);
/* Live slots; the module holds a reference on itself while there is one (under trapvec_mutex). */
static u32 trapvec_key_live;

/* The key of the hit (preemption off: current and the CPU stay what they are). */
static __always_inline void trapvec_key_read(u32 by, u64 key[2])
{
	const struct task_struct *t = current;

	key[1] = 0;
	switch (by) {
	case TRAPVEC_KEY_PID:
		key[0] = (u32)t->pid;
		break;
	case TRAPVEC_KEY_TGID:
		key[0] = (u32)t->tgid;
		break;
	case TRAPVEC_KEY_COMM:
		/*
		 * Without task_lock() (a lock on the trap path): a name changed meanwhile
		 * (prctl(PR_SET_NAME), exec) may be read torn; __set_task_comm() pads with NULs.
		 */
		key[0] = get_unaligned((const u64 *)&t->comm[0]);
		key[1] = get_unaligned((const u64 *)&t->comm[8]);
		break;
	default:
		key[0] = raw_smp_processor_id();
		break;
	}
}

static __always_inline bool trapvec_key_count_at(struct trapvec_key_ent *e, const u64 key[2])
{
	if (e->key[0] != key[0] || e->key[1] != key[1])
		return false;
	local64_inc(&e->count);
	return true;
}

/*
 * The counting routine, a call handler, with cookie = generation << 32 | slot.
 * Interrupts off (trap splice) or as the hit had them (jmp splice): see the top of this file.
 */
notrace void trapvec_key_entry(struct trapvec_regs *regs, void *cookie)
{
	struct trapvec_key_slot *s;
	struct trapvec_slot *live;
	struct trapvec_key_pcpu *p;
	u64 key[2];
	u32 h, k;

	preempt_disable_notrace();
	/* Acquire: the slot's fields (KEY_ADD wrote them before it was published). */
	live = trapvec_slot_live(&trapvec_key_table, (unsigned long)cookie);
	if (!live)
		goto out;
	s = container_of(live, struct trapvec_key_slot, slot);
	trapvec_key_read(READ_ONCE(s->by), key);
	p = this_cpu_ptr(s->pcpu);
	h = hash_64(key[0] ^ hash_64(key[1], 64), KEY_HASH_BITS);
	for (k = 0; k < TRAPVEC_KEY_TABLE; k++) {
		struct trapvec_key_ent *e = &p->e[(h + k) & (TRAPVEC_KEY_TABLE - 1)];
		u32 st = READ_ONCE(e->state);

		if (st == KEY_FREE) {
			/* CPU-local: only an interrupt or NMI on this CPU can race for it. */
			st = cmpxchg_local(&e->state, KEY_FREE, KEY_CLAIMING);
			if (st == KEY_FREE) {
				e->key[0] = key[0];
				e->key[1] = key[1];
				local64_inc(&e->count);
				/* KEY_STATS on another CPU reads the key and count after READY. */
				smp_store_release(&e->state, KEY_READY);
				goto out;
			}
			/* An interrupt claimed it under us, and finished (it nests): look again. */
			st = READ_ONCE(e->state);
		}
		if (st == KEY_READY && trapvec_key_count_at(e, key))
			goto out;
		/* Another key, or a claim we interrupted (its key unknown): probe on. */
	}
	local64_inc(&p->overflow);
out:
	preempt_enable_notrace();
}
NOKPROBE_SYMBOL(trapvec_key_entry);

/* The counting routine, for checks elsewhere (dispatch.c). */
bool trapvec_keys_is_entry(unsigned long addr)
{
	return addr == (unsigned long)trapvec_key_entry;
}

int trapvec_keys_add(struct trapvec_key_add *req)
{
	struct trapvec_key_slot *s;
	int i;

	lockdep_assert_held(&trapvec_mutex);
	if (req->by < TRAPVEC_KEY_PID || req->by > TRAPVEC_KEY_CPU)
		return -EINVAL;
	i = trapvec_slot_take(&trapvec_key_table);
	if (i < 0)
		return i;
	s = &trapvec_key_slots[i];
	/* Zeroed: every entry FREE, every count 0. */
	s->pcpu = alloc_percpu(struct trapvec_key_pcpu);
	if (!s->pcpu)
		return -ENOMEM;
	trapvec_mem_got(TRAPVEC_MEM_ENTRY, sizeof(struct trapvec_key_pcpu) * num_possible_cpus());
	s->by = req->by;
	trapvec_slot_publish(&s->slot);
	if (!trapvec_key_live++)
		__module_get(THIS_MODULE);
	req->slot = i;
	req->generation = s->slot.gen;
	req->pad = 0;
	req->entry = (unsigned long)trapvec_key_entry;
	req->entry_cookie = trapvec_slot_cookie(&trapvec_key_table, i);
	pr_debug("keys: slot %d generation %u by %u\n", i, s->slot.gen, req->by);
	return 0;
}

static void trapvec_key_free_table(struct trapvec_key_slot *s)
{
	if (!s->pcpu)
		return;
	free_percpu(s->pcpu);
	trapvec_mem_put(TRAPVEC_MEM_ENTRY, sizeof(struct trapvec_key_pcpu) * num_possible_cpus());
	s->pcpu = NULL;
}

static struct trapvec_key_slot *trapvec_key_slot_of(u32 slot, u32 gen)
{
	struct trapvec_slot *s = trapvec_slot_find(&trapvec_key_table, slot, gen, false);

	return s ? container_of(s, struct trapvec_key_slot, slot) : NULL;
}

int trapvec_keys_remove(struct trapvec_key_remove *req)
{
	struct trapvec_key_slot *s;

	lockdep_assert_held(&trapvec_mutex);
	s = trapvec_key_slot_of(req->slot, req->generation);
	if (!s)
		return -ENOENT;
	/* A routine that still holds the old cookie counts nothing. */
	trapvec_slot_give_back(&s->slot);
	/* No CPU is still in the routine for this slot (it runs with preemption off). */
	synchronize_rcu();
	trapvec_key_free_table(s);
	if (!WARN_ON_ONCE(!trapvec_key_live) && !--trapvec_key_live)
		module_put(THIS_MODULE);
	pr_debug("keys: slot %u removed\n", req->slot);
	return 0;
}

static int trapvec_key_cmp(const void *a, const void *b)
{
	return memcmp(((const struct trapvec_key_entry *)a)->key,
		      ((const struct trapvec_key_entry *)b)->key, TRAPVEC_KEY_BYTES);
}

int trapvec_keys_stats(struct trapvec_key_stats *req)
{
	size_t max = (size_t)TRAPVEC_KEY_TABLE * num_possible_cpus();
	struct trapvec_key_entry *all;
	struct trapvec_key_slot *s;
	u64 overflow = 0, hits = 0;
	u32 n = 0, keys = 0, i;
	int cpu, ret = 0;

	lockdep_assert_held(&trapvec_mutex);
	s = trapvec_key_slot_of(req->slot, req->generation);
	if (!s)
		return -ENOENT;
	all = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, max, sizeof(*all), GFP_KERNEL);
	if (!all)
		return -ENOMEM;
	for_each_possible_cpu(cpu) {
		struct trapvec_key_pcpu *p = per_cpu_ptr(s->pcpu, cpu);

		overflow += local64_read(&p->overflow);
		for (i = 0; i < TRAPVEC_KEY_TABLE; i++) {
			struct trapvec_key_ent *e = &p->e[i];

			/* Acquire: the key and the first count were written before READY. */
			if (smp_load_acquire(&e->state) != KEY_READY)
				continue;
			memcpy(all[n].key, e->key, TRAPVEC_KEY_BYTES);
			all[n].count = local64_read(&e->count);
			n++;
		}
		cond_resched();
	}
	/* One entry per key: duplicates (other CPUs, interrupted claims) are merged. */
	sort(all, n, sizeof(*all), trapvec_key_cmp, NULL);
	for (i = 0; i < n; i++) {
		hits += all[i].count;
		if (keys && !trapvec_key_cmp(&all[keys - 1], &all[i]))
			all[keys - 1].count += all[i].count;
		else
			all[keys++] = all[i];
	}
	hits += overflow;
	if (req->entries && req->capacity &&
	    copy_to_user(u64_to_user_ptr(req->entries), all,
			 (size_t)min(keys, req->capacity) * sizeof(*all)))
		ret = -EFAULT;
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, all, max * sizeof(*all));
	req->count = keys;
	req->by = s->by;
	req->pad = 0;
	req->overflow = overflow;
	req->hits = hits;
	return ret;
}

/* Unload, under trapvec_mutex: no slot lives (the module held itself while one did). */
void trapvec_keys_exit(void)
{
	u32 i;

	trapvec_slots_exit(&trapvec_key_table);
	for (i = 0; i < TRAPVEC_KEY_SLOTS; i++) {
		struct trapvec_key_slot *s = &trapvec_key_slots[i];

		WARN_ON_ONCE(s->pcpu);
		trapvec_key_free_table(s);
	}
}
