// SPDX-License-Identifier: GPL-2.0
/*
 * Return points and timers: the return runtime (kretprobe's shape, see trapvec_abi.h).
 *
 * Everything the trap path touches is static and lives as long as the module:
 * - TRAPVEC_RP_INSTANCES instances, each with a 16-byte stub in return_stubs.S. An instance is
 *   named exactly by its stub (the stub pushes its index), so returns never search: a task
 *   that returns through stub i is the call of instance i, whatever happened meanwhile
 *   (sleeps, migrations, recursion, tail calls). Free instances are a lock-free stack
 *   (Treiber, with a tag against ABA).
 * - TRAPVEC_RETURN_SLOTS slots (slots.c), one per return point: handler, cookie, maxactive,
 *   clock, and per-CPU counters and log2 histograms (allocated when a slot is first
 *   used and kept until unload, so that no stray reader can meet freed counters).
 *
 * Contexts. trapvec_rp_entry() is a call handler: the dispatcher runs it with interrupts off
 * (trap splices), a call trampoline with interrupts on (jmp splices). trapvec_rp_return() runs
 * in the task that returns, from return_stubs.S, with interrupts as the function left them. Both
 * disable preemption, take no lock, allocate nothing and call nothing a site may be placed in
 * but the clock reads and the handler; a per-CPU flag marks "this CPU is in the runtime or a
 * return handler": a return point met meanwhile (by the handler, an interrupt or an NMI) runs
 * without its return half and is counted as missed.
 *
 * Lifetimes. An instance holds a reference on its task. Returning through a stub needs the
 * stubs: the module takes a reference on itself with its first return point and drops it
 * (from a delayed work, see trapvec_rp_release_work()) once no return point lives and no
 * instance is in use, after an RCU-tasks grace period for the tasks between the instance's
 * release and the stub's final ret. A task that exits inside a function with a pending return
 * (it called do_exit() under it) never returns: its instances are found when the task is gone
 * (it switched out for the last time, or ours is the last reference on it; see
 * trapvec_rp_task_gone()) by every slot change, every RETURN_STATS and the release work,
 * counted as missed, and freed.
 *
 * CPU clock. The scheduler keeps a task's time on a CPU in se.sum_exec_runtime, brought up to
 * date at ticks and switches; the running part since then is the scheduler clock now minus
 * se.exec_start. Without CONFIG_IRQ_TIME_ACCOUNTING and steal time the scheduler's task clock
 * is that same clock, and sum_exec_runtime + (local_clock() - exec_start) is the task's CPU time
 * to the scheduler clock's precision; with them, interrupt and steal time while the task ran
 * count too. Time asleep or waiting on a run queue never counts.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/delay.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/percpu.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sched/clock.h>
#include <linux/sched/task.h>
#include <linux/timekeeping.h>
#include <linux/workqueue.h>

#include "../components/include/trapvec.h"
#include "trapvec_internal.h"
#include "trapvec_returns.h"
#include "trapvec_slots.h"

/* return_stubs.S */
extern u8 trapvec_rp_stubs[];

#define RP_FREE		0
#define RP_LIVE		1

struct trapvec_rp_inst {
	unsigned long ret;		/* the real return address */
	unsigned long sp;		/* where it was */
	struct task_struct *task;	/* holds a reference */
	u64 args[6];
	u64 t0;				/* the clock at the entry */
	u32 slot, gen;
	u32 state;			/* RP_FREE or RP_LIVE */
	u32 free_next;			/* next free instance + 1, on the free stack */
};

struct trapvec_rp_pcpu {
	u64 returns;
	u64 missed;
	u64 sum;
	u64 max;
	u64 buckets[TRAPVEC_RETURN_BUCKETS];
};

struct trapvec_rp_slot {
	struct trapvec_slot slot;	/* first: see TRAPVEC_SLOT_TABLE() */
	u32 maxactive;
	u32 clock;
	atomic_t active;		/* instances in use */
	atomic_t in_return;		/* CPUs in the return half */
	trapvec_return_handler_t *handler;
	u64 cookie;
	struct trapvec_rp_pcpu __percpu *pcpu;
};

static struct trapvec_rp_inst trapvec_rp_inst[TRAPVEC_RP_INSTANCES];
static struct trapvec_rp_slot trapvec_rp_slots[TRAPVEC_RETURN_SLOTS];
static const struct trapvec_slot_table trapvec_rp_table =
	TRAPVEC_SLOT_TABLE("returns", trapvec_rp_slots, slot);
/* Top of the free stack: (tag << 32) | (index + 1); 0: empty. */
static atomic64_t trapvec_rp_free_top;
static DEFINE_PER_CPU(bool, trapvec_rp_busy);

/* The module's reference on itself (under trapvec_mutex). */
static bool trapvec_rp_pinned;
static void trapvec_rp_release_work(struct work_struct *work);
static DECLARE_DELAYED_WORK(trapvec_rp_release, trapvec_rp_release_work);

static __always_inline unsigned long trapvec_rp_stub(u32 i)
{
	return (unsigned long)trapvec_rp_stubs + (unsigned long)i * TRAPVEC_RP_STUB_SIZE + 1;
}

static __always_inline int trapvec_rp_take(void)
{
	s64 top = atomic64_read(&trapvec_rp_free_top);

	for (;;) {
		u32 i = (u32)top;
		s64 next;

		if (!i)
			return -1;
		/* A stale free_next (the instance was taken meanwhile) fails the cmpxchg: new tag. */
		next = (s64)((((u64)top >> 32) + 1) << 32) | READ_ONCE(trapvec_rp_inst[i - 1].free_next);
		if (atomic64_try_cmpxchg(&trapvec_rp_free_top, &top, next))
			return i - 1;
	}
}

static __always_inline void trapvec_rp_give(u32 i)
{
	s64 top = atomic64_read(&trapvec_rp_free_top);
	s64 next;

	WRITE_ONCE(trapvec_rp_inst[i].state, RP_FREE);
	do {
		WRITE_ONCE(trapvec_rp_inst[i].free_next, (u32)top);
		next = (s64)((((u64)top >> 32) + 1) << 32) | (i + 1);
	} while (!atomic64_try_cmpxchg(&trapvec_rp_free_top, &top, next));
}

static __always_inline u64 trapvec_rp_now(u32 clock)
{
	if (clock == TRAPVEC_CLOCK_CPU) {
		const struct task_struct *t = current;
		u64 now = local_clock();
		u64 start = READ_ONCE(t->se.exec_start);

		return READ_ONCE(t->se.sum_exec_runtime) + (now > start ? now - start : 0);
	}
	return ktime_get_mono_fast_ns();
}

static __always_inline u32 trapvec_rp_bucket(u64 v)
{
	return v ? fls64(v) : 0;
}

/*
 * The entry half: a call handler at the function's entry, with cookie = generation << 32 |
 * slot. regs->rsp is the stack pointer at the entry, where the call left its return address.
 */
notrace void trapvec_rp_entry(struct trapvec_regs *regs, void *cookie)
{
	u64 c = (unsigned long)cookie;
	struct trapvec_rp_slot *s;
	struct trapvec_rp_inst *in;
	struct trapvec_slot *live;
	unsigned long *ra;
	int i;

	preempt_disable_notrace();
	/*
	 * A slot being removed: its splice is on the way out (RETURN_REMOVE waits for us).
	 * Acquire: the slot's fields (RETURN_ADD wrote them before it was published).
	 */
	live = trapvec_slot_live(&trapvec_rp_table, c);
	if (!live)
		goto out;
	s = container_of(live, struct trapvec_rp_slot, slot);
	if (__this_cpu_read(trapvec_rp_busy)) {
		this_cpu_inc(s->pcpu->missed);
		goto out;
	}
	__this_cpu_write(trapvec_rp_busy, true);
	if (atomic_inc_return(&s->active) > s->maxactive) {
		atomic_dec(&s->active);
		this_cpu_inc(s->pcpu->missed);
		goto unbusy;
	}
	i = trapvec_rp_take();
	if (i < 0) {
		atomic_dec(&s->active);
		this_cpu_inc(s->pcpu->missed);
		goto unbusy;
	}
	in = &trapvec_rp_inst[i];
	ra = (unsigned long *)(unsigned long)regs->rsp;
	in->ret = *ra;
	in->sp = regs->rsp;
	in->task = current;
	get_task_struct(current);
	in->args[0] = regs->rdi;
	in->args[1] = regs->rsi;
	in->args[2] = regs->rdx;
	in->args[3] = regs->rcx;
	in->args[4] = regs->r8;
	in->args[5] = regs->r9;
	in->t0 = s->clock ? trapvec_rp_now(s->clock) : 0;
	in->slot = (u32)c;
	in->gen = c >> 32;
	/* The release work and the exit scan read state; everything above first. */
	smp_store_release(&in->state, RP_LIVE);
	/* From here the function returns into stub i. */
	*ra = trapvec_rp_stub(i);
unbusy:
	__this_cpu_write(trapvec_rp_busy, false);
out:
	preempt_enable_notrace();
}
NOKPROBE_SYMBOL(trapvec_rp_entry);

/* Count, time and run the handler of a live slot (busy is set, preemption off). */
static __always_inline void trapvec_rp_run(struct trapvec_rp_slot *s, struct trapvec_rp_inst *in,
					   struct trapvec_regs *regs)
{
	struct trapvec_rp_pcpu *p = this_cpu_ptr(s->pcpu);
	trapvec_return_handler_t *h = READ_ONCE(s->handler);
	u64 elapsed = 0;

	if (s->clock) {
		u64 now = trapvec_rp_now(s->clock);

		elapsed = now > in->t0 ? now - in->t0 : 0;
		p->buckets[trapvec_rp_bucket(elapsed)]++;
		p->sum += elapsed;
		if (elapsed > p->max)
			p->max = elapsed;
	}
	if (h) {
		struct trapvec_call call = {
			.args = { in->args[0], in->args[1], in->args[2],
				  in->args[3], in->args[4], in->args[5] },
			.cookie = s->cookie,
			.sp = in->sp,
			.ret = in->ret,
			.elapsed_ns = elapsed,
		};

		h(regs, &call);
	}
	p->returns++;
}

/*
 * The return half, called by return_stubs.S with the registers at the return and the index its
 * stub pushed; returns the real return address. Interrupts as the function left them.
 */
unsigned long trapvec_rp_return(struct trapvec_regs *regs, unsigned long index);
__visible notrace unsigned long trapvec_rp_return(struct trapvec_regs *regs, unsigned long index)
{
	struct trapvec_rp_inst *in = &trapvec_rp_inst[index];
	unsigned long ret = in->ret;
	struct trapvec_rp_slot *s = &trapvec_rp_slots[in->slot];
	struct task_struct *task = in->task;
	unsigned long flags = 0;
	bool rcu_idle;

	regs->rip = ret;
	preempt_disable_notrace();
	/*
	 * A function of the idle path returning where RCU is not watching (see trapvec_dispatch()):
	 * RETURN_REMOVE's synchronize_rcu() and the handler's own RCU use must see this CPU. Enter
	 * RCU as an NMI does, with interrupts off as an interrupt entry has them.
	 */
	rcu_idle = !trapvec_rcu_watching();
	if (unlikely(rcu_idle)) {
		local_irq_save(flags);
		trapvec_ksyms.ct_nmi_enter();
	}
	/*
	 * Counted before the slot's state is read: RETURN_REMOVE changes the state, then waits
	 * for this count to drop, so the handler's code never goes under a CPU that runs it.
	 */
	atomic_inc(&s->in_return);
	smp_mb__after_atomic();
	if (trapvec_slot_is_live(&s->slot, in->gen)) {
		if (__this_cpu_read(trapvec_rp_busy)) {
			this_cpu_inc(s->pcpu->missed);
		} else {
			__this_cpu_write(trapvec_rp_busy, true);
			trapvec_rp_run(s, in, regs);
			__this_cpu_write(trapvec_rp_busy, false);
		}
		atomic_dec(&s->active);
	}
	smp_mb__before_atomic();
	atomic_dec(&s->in_return);
	/* Never the last reference: the task is running. */
	put_task_struct(task);
	trapvec_rp_give(index);
	if (unlikely(rcu_idle)) {
		trapvec_ksyms.ct_nmi_exit();
		local_irq_restore(flags);
	}
	preempt_enable_notrace();
	return ret;
}
NOKPROBE_SYMBOL(trapvec_rp_return);

/* The entry routine, for checks elsewhere (dispatch.c). */
bool trapvec_returns_is_entry(unsigned long addr)
{
	return addr == (unsigned long)trapvec_rp_entry;
}

/*
 * Whether @t can never run again, so never return into a stub: ours is the last reference on
 * it (it was reaped), or it switched out for the last time (do_task_dead() wrote TASK_DEAD while
 * on_cpu was 1, and finish_task() cleared on_cpu with a release after the final switch). The
 * reference count alone is not enough: a task that exits inside several functions with pending
 * returns (nested return points, or a recursive function under one) holds an instance, and so
 * a reference, for each, and its count never comes down to one.
 */
static bool trapvec_rp_task_gone(struct task_struct *t)
{
	if (refcount_read(&t->usage) == 1)
		return true;
	if (READ_ONCE(t->__state) != TASK_DEAD)
		return false;
#ifdef CONFIG_SMP
	/* on_cpu read after the state: a 0 then is the one finish_task() wrote after the switch. */
	smp_rmb();
	/* Acquire, paired with finish_task()'s release: the task's last writes are seen. */
	return !smp_load_acquire(&t->on_cpu);
#else
	/* One CPU, and it runs us: a dead task is off it for good. */
	return true;
#endif
}

/* The slot @slot of generation @gen if it is live (or draining, with @draining_too). */
static struct trapvec_rp_slot *trapvec_rp_slot_of(u32 slot, u32 gen, bool draining_too)
{
	struct trapvec_slot *s = trapvec_slot_find(&trapvec_rp_table, slot, gen, draining_too);

	return s ? container_of(s, struct trapvec_rp_slot, slot) : NULL;
}

/*
 * Instances of tasks that are gone (they exited inside the function): they can never return.
 * Counted as missed and freed.
 */
static void trapvec_rp_reclaim_dead(void)
{
	u32 i;

	lockdep_assert_held(&trapvec_mutex);
	for (i = 0; i < TRAPVEC_RP_INSTANCES; i++) {
		struct trapvec_rp_inst *in = &trapvec_rp_inst[i];
		struct task_struct *t;
		struct trapvec_rp_slot *s;
		bool gone;

		/*
		 * The instance's reference keeps t while the instance is live, but the task may
		 * return (dropping it, then giving the instance back) between these reads: an RCU
		 * read section begun before the state is read keeps t's memory until a task reaped
		 * after that read has passed delayed_put_task_struct(), and shuts the window a
		 * preemption here would open.
		 */
		rcu_read_lock();
		if (smp_load_acquire(&in->state) != RP_LIVE) {
			rcu_read_unlock();
			continue;
		}
		t = READ_ONCE(in->task);
		/*
		 * Still its call: had the task given the instance back before it was gone (and
		 * another taken it), that would show now, the task being unable to change it.
		 */
		gone = trapvec_rp_task_gone(t) && smp_load_acquire(&in->state) == RP_LIVE &&
		       READ_ONCE(in->task) == t;
		rcu_read_unlock();
		if (!gone)
			continue;
		s = trapvec_rp_slot_of(in->slot, in->gen, true);
		if (s) {
			this_cpu_inc(s->pcpu->missed);
			atomic_dec(&s->active);
		}
		pr_debug("returns: instance %u of a task that exited inside the function, freed\n", i);
		put_task_struct(in->task);
		trapvec_rp_give(i);
	}
}

static bool trapvec_rp_idle(void)
{
	u32 i;

	if (!trapvec_slots_idle(&trapvec_rp_table))
		return false;
	for (i = 0; i < TRAPVEC_RP_INSTANCES; i++)
		if (smp_load_acquire(&trapvec_rp_inst[i].state) != RP_FREE)
			return false;
	return true;
}

/*
 * Drop the module's reference on itself once nothing can return into a stub: no slot is in
 * use (so no entry half can take an instance) and no instance is. A task that gave its
 * instance back may still be between that and the final ret of the common code, which never
 * sleeps voluntarily: an RCU-tasks grace period waits for it. Otherwise look again later.
 * Runs while the module holds itself, and module exit cancels it synchronously, so its own
 * tail after module_put() is safe.
 */
static void trapvec_rp_release_work(struct work_struct *work)
{
	bool put = false;

	mutex_lock(&trapvec_mutex);
	if (trapvec_rp_pinned) {
		trapvec_rp_reclaim_dead();
		if (trapvec_rp_idle()) {
			/* The idle tasks too: a function of the idle path may have a return point. */
			trapvec_sync_tasks();
			trapvec_rp_pinned = false;
			put = true;
		} else {
			schedule_delayed_work(&trapvec_rp_release, HZ / 5);
		}
	}
	mutex_unlock(&trapvec_mutex);
	if (put) {
		pr_debug("returns: no return point and no pending return left: reference dropped\n");
		module_put(THIS_MODULE);
	}
}

int trapvec_returns_add(struct trapvec_return_add *req)
{
	struct trapvec_rp_slot *s;
	int i;

	lockdep_assert_held(&trapvec_mutex);
	if (!req->maxactive || req->maxactive > TRAPVEC_RETURN_INSTANCES)
		return -EINVAL;
	if (req->clock > TRAPVEC_CLOCK_CPU)
		return -EINVAL;
	if (req->handler && !trapvec_arena_in_sealed_code(req->handler))
		return -EFAULT;
	trapvec_rp_reclaim_dead();
	i = trapvec_slot_take(&trapvec_rp_table);
	if (i < 0)
		return i;
	s = &trapvec_rp_slots[i];
	if (!s->pcpu) {
		s->pcpu = alloc_percpu(struct trapvec_rp_pcpu);
		if (!s->pcpu)
			return -ENOMEM;
		trapvec_mem_got(TRAPVEC_MEM_ENTRY, sizeof(struct trapvec_rp_pcpu) * num_possible_cpus());
	} else {
		int cpu;

		/* Nothing writes a free slot's counters: stale instances check the generation. */
		for_each_possible_cpu(cpu)
			memset(per_cpu_ptr(s->pcpu, cpu), 0, sizeof(struct trapvec_rp_pcpu));
	}
	s->maxactive = req->maxactive;
	s->clock = req->clock;
	s->handler = (trapvec_return_handler_t *)(unsigned long)req->handler;
	s->cookie = req->cookie;
	atomic_set(&s->active, 0);
	trapvec_slot_publish(&s->slot);
	if (!trapvec_rp_pinned) {
		__module_get(THIS_MODULE);
		trapvec_rp_pinned = true;
	}
	req->slot = i;
	req->generation = s->slot.gen;
	req->entry = (unsigned long)trapvec_rp_entry;
	req->entry_cookie = trapvec_slot_cookie(&trapvec_rp_table, i);
	pr_debug("returns: slot %d generation %u: handler %llx, maxactive %u, clock %u\n",
		 i, s->slot.gen, req->handler, req->maxactive, req->clock);
	return 0;
}

int trapvec_returns_remove(struct trapvec_return_remove *req)
{
	struct trapvec_rp_slot *s;
	unsigned long deadline;

	lockdep_assert_held(&trapvec_mutex);
	s = trapvec_rp_slot_of(req->slot, req->generation, true);
	if (!s)
		return -ENOENT;
	trapvec_slot_drain(&s->slot);
	/* No CPU is still in the entry half with the slot live (it runs preemption off). */
	synchronize_rcu();
	deadline = jiffies + msecs_to_jiffies(TRAPVEC_QUIESCE_WAIT_MS);
	while (atomic_read(&s->in_return)) {
		if (time_after(jiffies, deadline)) {
			req->busy = atomic_read(&s->in_return);
			return -EBUSY;
		}
		msleep(1);
	}
	/* New generation: instances still out return without the handler. */
	s->handler = NULL;
	trapvec_slot_give_back(&s->slot);
	trapvec_rp_reclaim_dead();
	if (trapvec_rp_pinned)
		schedule_delayed_work(&trapvec_rp_release, 0);
	pr_debug("returns: slot %u removed\n", req->slot);
	return 0;
}

int trapvec_returns_stats(struct trapvec_return_stats *req)
{
	struct trapvec_rp_slot *s;
	int cpu, k;

	lockdep_assert_held(&trapvec_mutex);
	trapvec_rp_reclaim_dead();
	s = trapvec_rp_slot_of(req->slot, req->generation, false);
	if (!s)
		return -ENOENT;
	req->returns = req->missed = req->sum = req->max = 0;
	memset(req->buckets, 0, sizeof(req->buckets));
	for_each_possible_cpu(cpu) {
		const struct trapvec_rp_pcpu *p = per_cpu_ptr(s->pcpu, cpu);

		req->returns += READ_ONCE(p->returns);
		req->missed += READ_ONCE(p->missed);
		req->sum += READ_ONCE(p->sum);
		req->max = max_t(u64, req->max, READ_ONCE(p->max));
		for (k = 0; k < TRAPVEC_RETURN_BUCKETS; k++)
			req->buckets[k] += READ_ONCE(p->buckets[k]);
	}
	req->active = max(atomic_read(&s->active), 0);
	req->clock = s->clock;
	req->pad = 0;
	return 0;
}

void trapvec_returns_init(void)
{
	u32 i;

	BUILD_BUG_ON(TRAPVEC_RP_INSTANCES != TRAPVEC_RETURN_INSTANCES);
	for (i = 0; i < TRAPVEC_RP_INSTANCES; i++)
		trapvec_rp_inst[i].free_next = i + 1 < TRAPVEC_RP_INSTANCES ? i + 2 : 0;
	atomic64_set(&trapvec_rp_free_top, 1);
}

/*
 * Unload, without trapvec_mutex (the release work takes it): nothing is pinned, else the
 * module could not go; the work may still be finishing after its module_put().
 */
void trapvec_returns_cancel_work(void)
{
	cancel_delayed_work_sync(&trapvec_rp_release);
}

/* Unload, under trapvec_mutex: free the counters. */
void trapvec_returns_exit(void)
{
	u32 i;

	trapvec_slots_exit(&trapvec_rp_table);
	for (i = 0; i < TRAPVEC_RETURN_SLOTS; i++) {
		struct trapvec_rp_slot *s = &trapvec_rp_slots[i];

		if (s->pcpu) {
			free_percpu(s->pcpu);
			trapvec_mem_put(TRAPVEC_MEM_ENTRY,
					sizeof(struct trapvec_rp_pcpu) * num_possible_cpus());
			s->pcpu = NULL;
		}
	}
}

/*
 * FREE's check (arena.c): the first slot that is not given back (live, or draining: a return
 * half may still call its handler) whose handler lies in [start, end), or -1.
 */
int trapvec_returns_handler_in(unsigned long start, unsigned long end)
{
	u32 i;

	lockdep_assert_held(&trapvec_mutex);
	for (i = 0; i < TRAPVEC_RETURN_SLOTS; i++) {
		const struct trapvec_rp_slot *s = &trapvec_rp_slots[i];
		unsigned long h = (unsigned long)s->handler;

		if (s->slot.state != TRAPVEC_SLOT_FREE && h >= start && h < end)
			return i;
	}
	return -1;
}
