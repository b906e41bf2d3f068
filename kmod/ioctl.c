// SPDX-License-Identifier: GPL-2.0
/*
 * The ioctls of /dev/trapvec, driven by one table: trapvec_iocs[], indexed by the command's
 * number.
 *
 * Every command's argument is one struct, whose size the command encodes
 * (_IOWR('T', n, struct ...), trapvec_abi.h). trapvec_ioctl() does, once for all of them:
 * the capability check; the copy-in of the struct (or zeroes, for a command that reads
 * nothing: INFO, QUIESCE); the command's checks before any lock (prepare: flags, counts, the
 * may-write rule, arrays copied in); the operation, under trapvec_mutex where the entry says
 * TRAPVEC_IOC_LOCK; what goes back after the unlock (finish: arrays copied out, never under
 * the mutex); the arrays freed; and the copy-out of the struct, when the command succeeded
 * (TRAPVEC_IOC_OUT) or also when it failed, where the struct carries the failure's details
 * (TRAPVEC_IOC_OUT_ALWAYS: APPLY's failing index, reason and bytes found; STATE's size and
 * generation; QUIESCE's busy block).
 *
 * A command without TRAPVEC_IOC_LOCK takes no lock (STATE_GET and STATE_PUT: state.c has its
 * own; the module watch: its spinlock), or takes trapvec_mutex itself for part of its work
 * only (READ, which does not take it for plain memory).
 *
 * A new command: its number and struct in trapvec_abi.h, an op (and a prepare if it checks
 * its argument before the lock or copies an array in), one line in trapvec_iocs[].
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/build_bug.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/nospec.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "../components/include/trapvec.h"
#include "trapvec_internal.h"

/* Arrays a command copies in before the lock; trapvec_ioctl() frees them after. */
struct trapvec_ioc_bufs {
	void *p[2];
	size_t bytes[2];
};

/* Every command's argument: trapvec_ioctl() holds it on its stack. */
union trapvec_ioc_arg {
	struct trapvec_info info;
	struct trapvec_read read;
	struct trapvec_alloc alloc;
	struct trapvec_write write;
	struct trapvec_block block;
	struct trapvec_check check;
	struct trapvec_check_many check_many;
	struct trapvec_apply apply;
	struct trapvec_dispatch_add dispatch_add;
	struct trapvec_dispatch_remove dispatch_remove;
	struct trapvec_dispatch_replace dispatch_replace;
	struct trapvec_hits hits;
	struct trapvec_list list;
	struct trapvec_quiesce quiesce;
	struct trapvec_state state;
	struct trapvec_return_add return_add;
	struct trapvec_return_remove return_remove;
	struct trapvec_return_stats return_stats;
	struct trapvec_key_add key_add;
	struct trapvec_key_remove key_remove;
	struct trapvec_key_stats key_stats;
	struct trapvec_watch watch;
	struct trapvec_modevent modevent;
	struct trapvec_modack modack;
};

#define TRAPVEC_IOC_IN		BIT(0)	/* copy the struct in; else it starts zeroed */
#define TRAPVEC_IOC_LOCK	BIT(1)	/* op runs under trapvec_mutex */
#define TRAPVEC_IOC_OUT		BIT(2)	/* copy the struct back when op succeeds */
#define TRAPVEC_IOC_OUT_ALWAYS	BIT(3)	/* and when it fails: it carries the failure's details */

struct trapvec_ioc {
	unsigned int cmd;	/* 0: no command has this number */
	unsigned int size;	/* of the argument: _IOC_SIZE(cmd), checked at build time */
	unsigned int flags;	/* TRAPVEC_IOC_* */
	/* Before any lock: 0 or the ioctl's errno (nothing is copied back then). */
	long (*prepare)(void *arg, struct trapvec_ioc_bufs *bufs);
	long (*op)(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs);
	/* After the unlock, with op's result: the ioctl's result. */
	long (*finish)(void *arg, struct trapvec_ioc_bufs *bufs, long ret);
};

/* Copy an array of count elements of size from user space into bufs->p[i] (count bounded). */
static long trapvec_copy_array(struct trapvec_ioc_bufs *bufs, unsigned int i, u64 uptr, u32 count,
			       size_t size)
{
	void *buf = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, size, GFP_KERNEL);

	if (!buf)
		return -ENOMEM;
	bufs->p[i] = buf;
	bufs->bytes[i] = count * size;
	if (copy_from_user(buf, u64_to_user_ptr(uptr), count * size))
		return -EFAULT;
	return 0;
}

static long trapvec_ioc_info(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_info *info = arg;

	info->abi_version = TRAPVEC_ABI_VERSION;
	info->vector = trapvec_vector;
	info->entry = (unsigned long)trapvec_entry;
	info->old_handler = trapvec_old_handler;
	info->gate_handler = trapvec_gate_handler();
	info->module_base = trapvec_module_text_base(THIS_MODULE);
	info->module_size = trapvec_module_core_size(THIS_MODULE);
	info->replace_ret = (unsigned long)trapvec_replace_ret;
	info->current_task = trapvec_current_task_offset();
	info->task_pid = offsetof(struct task_struct, pid);
	info->task_tgid = offsetof(struct task_struct, tgid);
	info->task_comm = offsetof(struct task_struct, comm);
	trapvec_dispatch_stats(&info->unknown_traps, &info->retried_traps);
	trapvec_arena_info(info);
	info->live_patches = trapvec_text_live_count();
	info->dispatch_entries = trapvec_dispatch_count();
	return 0;
}

static long trapvec_ioc_read(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_read *req = arg;
	u8 __user *dst;
	u32 done, chunk;
	void *bounce;
	long ret = 0;

	if (req->len > TRAPVEC_XFER_MAX || req->addr + req->len < req->addr ||
	    (req->flags & ~TRAPVEC_READ_ORIGINAL))
		return -EINVAL;
	/* Lockdown (confidentiality) forbids reading kernel memory, as it does /proc/kcore. */
	if (!trapvec_may_read())
		return -EPERM;
	dst = u64_to_user_ptr(req->buf);
	if ((req->flags & TRAPVEC_READ_ORIGINAL) && req->len) {
		/*
		 * In one pass: the record of live patches is walked once per request (planning
		 * reads whole runs of functions, with thousands of patches live).
		 */
		bounce = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 1, req->len, GFP_KERNEL);
		if (!bounce)
			return -ENOMEM;
		mutex_lock(&trapvec_mutex);
		ret = trapvec_read_unpatched((unsigned long)req->addr, bounce, req->len);
		mutex_unlock(&trapvec_mutex);
		if (!ret && copy_to_user(dst, bounce, req->len))
			ret = -EFAULT;
		trapvec_kvfree(TRAPVEC_MEM_SCRATCH, bounce, req->len);
		return ret;
	}
	bounce = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 1, PAGE_SIZE, GFP_KERNEL);
	if (!bounce)
		return -ENOMEM;
	for (done = 0; done < req->len; done += chunk) {
		chunk = min_t(u32, req->len - done, PAGE_SIZE);
		if (copy_from_kernel_nofault(bounce, (void *)(unsigned long)(req->addr + done),
					     chunk)) {
			ret = -EFAULT;
			break;
		}
		if (copy_to_user(dst + done, bounce, chunk)) {
			ret = -EFAULT;
			break;
		}
	}
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, bounce, PAGE_SIZE);
	return ret;
}

/*
 * ALLOC and WRITE fill the arenas with code and data that patches will run: refused with
 * -EPERM while kernel memory may not be written (lockdown, modules_disabled; check.c), so
 * that a splice fails before anything is made. SEAL, FREE and the dispatch table write no
 * kernel memory that could run; APPLY says why in its reason.
 */
static long trapvec_ioc_may_write(void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_may_write() ? -EPERM : 0;
}

static long trapvec_ioc_alloc(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_arena_alloc(arg);
}

static long trapvec_ioc_write(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_arena_write(arg);
}

static long trapvec_ioc_seal(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_arena_seal(((struct trapvec_block *)arg)->id);
}

static long trapvec_ioc_free(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_arena_free(((struct trapvec_block *)arg)->id);
}

static long trapvec_ioc_check_flags(void *arg, struct trapvec_ioc_bufs *bufs)
{
	return ((struct trapvec_check *)arg)->flags & ~TRAPVEC_CHECK_NO_KPROBE ? -EINVAL : 0;
}

static long trapvec_ioc_check(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_check *req = arg;

	if (req->flags & TRAPVEC_CHECK_NO_KPROBE) {
		mutex_lock(trapvec_ksyms.kprobe_mutex);
		req->reason = trapvec_check_site(req->addr, req->len, &req->culprit);
		mutex_unlock(trapvec_ksyms.kprobe_mutex);
		req->error = 0;
	} else {
		req->reason = trapvec_check_site_kprobe(req->addr, req->len, &req->error,
							&req->culprit);
	}
	return 0;
}

/* CHECK_MANY's entries, copied in: each must ask for CHECK without its kprobe, as CHECK does. */
static long trapvec_ioc_check_many_in(void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_check_many *req = arg;
	const struct trapvec_check *c;
	long ret;
	u32 i;

	if (req->flags)
		return -EINVAL;
	if (req->count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	ret = trapvec_copy_array(bufs, 0, req->checks, req->count, sizeof(*c));
	if (ret)
		return ret;
	for (i = 0, c = bufs->p[0]; i < req->count; i++, c++)
		if (c->flags != TRAPVEC_CHECK_NO_KPROBE)
			return -EINVAL;
	return 0;
}

static long trapvec_ioc_check_many(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_check_many *req = arg;

	return trapvec_check_many(bufs->p[0], req->count);
}

/* The answers, after the unlock. */
static long trapvec_ioc_check_many_out(void *arg, struct trapvec_ioc_bufs *bufs, long ret)
{
	struct trapvec_check_many *req = arg;

	if (!ret && req->count &&
	    copy_to_user(u64_to_user_ptr(req->checks), bufs->p[0], bufs->bytes[0]))
		ret = -EFAULT;
	return ret;
}

static long trapvec_ioc_apply_in(void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_apply *req = arg;

	if (req->count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	return trapvec_copy_array(bufs, 0, req->patches, req->count, sizeof(struct trapvec_patch));
}

static long trapvec_ioc_apply(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_text_apply(bufs->p[0], arg);
}

static long trapvec_ioc_dispatch_add_in(void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_dispatch_add *req = arg;

	if (req->count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	return trapvec_copy_array(bufs, 0, req->entries, req->count,
				  sizeof(struct trapvec_dispatch_entry));
}

static long trapvec_ioc_dispatch_add(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_dispatch_add *req = arg;

	return trapvec_dispatch_add(bufs->p[0], req->count, &req->failed_index);
}

static long trapvec_ioc_dispatch_remove_in(void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_dispatch_remove *req = arg;

	if (req->count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	return trapvec_copy_array(bufs, 0, req->sites, req->count, sizeof(u64));
}

static long trapvec_ioc_dispatch_remove(struct file *file, void *arg,
					struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_dispatch_remove *req = arg;

	return trapvec_dispatch_remove(bufs->p[0], req->count, &req->failed_index);
}

static long trapvec_ioc_dispatch_replace_in(void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_dispatch_replace *req = arg;

	if (req->count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	return trapvec_copy_array(bufs, 0, req->entries, req->count,
				  sizeof(struct trapvec_dispatch_entry)) ?:
	       trapvec_copy_array(bufs, 1, req->counts, req->count, sizeof(struct trapvec_hits));
}

static long trapvec_ioc_dispatch_replace(struct file *file, void *arg,
					 struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_dispatch_replace *req = arg;

	return trapvec_dispatch_replace(bufs->p[0], bufs->p[1], req->count, &req->failed_index);
}

/*
 * The counts buffer was just read, so this write fails only if the caller unmapped it
 * meanwhile; the replacement is made then all the same, and -EFAULT says its counts are lost.
 */
static long trapvec_ioc_dispatch_replace_out(void *arg, struct trapvec_ioc_bufs *bufs, long ret)
{
	struct trapvec_dispatch_replace *req = arg;

	if (!ret && copy_to_user(u64_to_user_ptr(req->counts), bufs->p[1], bufs->bytes[1]))
		ret = -EFAULT;
	return ret;
}

static long trapvec_ioc_hits(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	return trapvec_dispatch_hits(arg);
}

static long trapvec_ioc_list_in(void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_list *req = arg;

	if (req->capacity > TRAPVEC_BATCH_MAX)
		req->capacity = TRAPVEC_BATCH_MAX;
	if (!req->capacity)
		return 0;
	bufs->p[0] = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, req->capacity,
				      sizeof(struct trapvec_list_entry), GFP_KERNEL | __GFP_ZERO);
	if (!bufs->p[0])
		return -ENOMEM;
	bufs->bytes[0] = req->capacity * sizeof(struct trapvec_list_entry);
	return 0;
}

static long trapvec_ioc_list(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_list *req = arg;

	return trapvec_dispatch_list(bufs->p[0], req->start, req->capacity, 0, &req->count);
}

static long trapvec_ioc_list_hit(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	struct trapvec_list *req = arg;

	return trapvec_dispatch_list(bufs->p[0], req->start, req->capacity, 1, &req->count);
}

static long trapvec_ioc_list_out(void *arg, struct trapvec_ioc_bufs *bufs, long ret)
{
	struct trapvec_list *req = arg;
	u32 n;

	if (ret)
		return ret;
	n = req->start < req->count ? min_t(u64, req->count - req->start, req->capacity) : 0;
	if (n && copy_to_user(u64_to_user_ptr(req->entries), bufs->p[0],
			      n * sizeof(struct trapvec_list_entry)))
		return -EFAULT;
	return 0;
}

static long trapvec_ioc_quiesce(struct file *file, void *arg, struct trapvec_ioc_bufs *bufs)
{
	long ret;

	/* No CPU in the dispatcher for a removed entry (interrupts-off readers)... */
	synchronize_rcu();
	/* ...no task preempted (nor idle CPU) inside a trampoline or a component... */
	trapvec_sync_tasks();
	/*
	 * ...and no task asleep inside a replacement that a freed trampoline called (it passed
	 * the RCU-tasks quiescent state above in its sleep). Only then may the freed blocks be
	 * reused and the modules whose patches were reverted go: such a task returns into
	 * their text.
	 */
	ret = trapvec_arena_wait_inflight(false, TRAPVEC_QUIESCE_WAIT_MS, arg);
	if (!ret) {
		trapvec_arena_reclaim(arg);
		trapvec_text_put_parked();
	}
	/* A kprobe that armed on a live patch pins the module (text_kprobe.c). */
	trapvec_text_check_kprobes();
	return ret;
}

/* An op that is one call taking the argument struct: STATE, RETURN, KEY, the module watch. */
#define TRAPVEC_IOC_CALL(name, call)						\
static long trapvec_ioc_##name(struct file *file, void *arg,			\
			       struct trapvec_ioc_bufs *bufs)			\
{										\
	return call;								\
}
TRAPVEC_IOC_CALL(state_get, trapvec_state_get(arg))
TRAPVEC_IOC_CALL(state_put, trapvec_state_put(arg))
TRAPVEC_IOC_CALL(return_add, trapvec_returns_add(arg))
TRAPVEC_IOC_CALL(return_remove, trapvec_returns_remove(arg))
TRAPVEC_IOC_CALL(return_stats, trapvec_returns_stats(arg))
TRAPVEC_IOC_CALL(key_add, trapvec_keys_add(arg))
TRAPVEC_IOC_CALL(key_remove, trapvec_keys_remove(arg))
TRAPVEC_IOC_CALL(key_stats, trapvec_keys_stats(arg))
/* The module watch (modwatch.c) knows its watcher by the file. */
TRAPVEC_IOC_CALL(watch, trapvec_modwatch_watch(file, arg))
TRAPVEC_IOC_CALL(modevent, trapvec_modwatch_event(file, arg))
TRAPVEC_IOC_CALL(modack, trapvec_modwatch_ack(file, arg))

#define IN	TRAPVEC_IOC_IN
#define LOCK	TRAPVEC_IOC_LOCK
#define OUT	TRAPVEC_IOC_OUT
#define ALWAYS	(TRAPVEC_IOC_OUT | TRAPVEC_IOC_OUT_ALWAYS)

/* One line per command: its struct (whose size the number encodes), flags, prepare, op, finish. */
#define TRAPVEC_IOC(name, type, fl, pre, fn, fin)					\
	[_IOC_NR(TRAPVEC_IOC_##name)] = {						\
		.cmd = TRAPVEC_IOC_##name,						\
		.size = sizeof(type) +							\
			BUILD_BUG_ON_ZERO(sizeof(type) != _IOC_SIZE(TRAPVEC_IOC_##name) ||	\
					  sizeof(type) > sizeof(union trapvec_ioc_arg)),	\
		.flags = (fl), .prepare = (pre), .op = (fn), .finish = (fin),		\
	}

static const struct trapvec_ioc trapvec_iocs[] = {
	TRAPVEC_IOC(INFO, struct trapvec_info, LOCK | OUT, NULL, trapvec_ioc_info, NULL),
	TRAPVEC_IOC(READ, struct trapvec_read, IN, NULL, trapvec_ioc_read, NULL),
	TRAPVEC_IOC(ALLOC, struct trapvec_alloc, IN | LOCK | OUT, trapvec_ioc_may_write,
		    trapvec_ioc_alloc, NULL),
	TRAPVEC_IOC(WRITE, struct trapvec_write, IN | LOCK, trapvec_ioc_may_write,
		    trapvec_ioc_write, NULL),
	TRAPVEC_IOC(SEAL, struct trapvec_block, IN | LOCK, NULL, trapvec_ioc_seal, NULL),
	TRAPVEC_IOC(FREE, struct trapvec_block, IN | LOCK, NULL, trapvec_ioc_free, NULL),
	TRAPVEC_IOC(CHECK, struct trapvec_check, IN | LOCK | OUT, trapvec_ioc_check_flags,
		    trapvec_ioc_check, NULL),
	TRAPVEC_IOC(CHECK_MANY, struct trapvec_check_many, IN | LOCK, trapvec_ioc_check_many_in,
		    trapvec_ioc_check_many, trapvec_ioc_check_many_out),
	TRAPVEC_IOC(APPLY, struct trapvec_apply, IN | LOCK | ALWAYS, trapvec_ioc_apply_in,
		    trapvec_ioc_apply, NULL),
	TRAPVEC_IOC(DISPATCH_ADD, struct trapvec_dispatch_add, IN | LOCK | ALWAYS,
		    trapvec_ioc_dispatch_add_in, trapvec_ioc_dispatch_add, NULL),
	TRAPVEC_IOC(DISPATCH_REMOVE, struct trapvec_dispatch_remove, IN | LOCK | ALWAYS,
		    trapvec_ioc_dispatch_remove_in, trapvec_ioc_dispatch_remove, NULL),
	TRAPVEC_IOC(HITS, struct trapvec_hits, IN | LOCK | OUT, NULL, trapvec_ioc_hits, NULL),
	TRAPVEC_IOC(LIST, struct trapvec_list, IN | LOCK | OUT, trapvec_ioc_list_in,
		    trapvec_ioc_list, trapvec_ioc_list_out),
	TRAPVEC_IOC(LIST_HIT, struct trapvec_list, IN | LOCK | OUT, trapvec_ioc_list_in,
		    trapvec_ioc_list_hit, trapvec_ioc_list_out),
	TRAPVEC_IOC(QUIESCE, struct trapvec_quiesce, LOCK | ALWAYS, NULL, trapvec_ioc_quiesce,
		    NULL),
	/* state.c has its own mutex: never called with trapvec_mutex held. */
	TRAPVEC_IOC(STATE_GET, struct trapvec_state, IN | ALWAYS, NULL, trapvec_ioc_state_get,
		    NULL),
	TRAPVEC_IOC(STATE_PUT, struct trapvec_state, IN | ALWAYS, NULL, trapvec_ioc_state_put,
		    NULL),
	TRAPVEC_IOC(DISPATCH_REPLACE, struct trapvec_dispatch_replace, IN | LOCK | ALWAYS,
		    trapvec_ioc_dispatch_replace_in, trapvec_ioc_dispatch_replace,
		    trapvec_ioc_dispatch_replace_out),
	TRAPVEC_IOC(RETURN_ADD, struct trapvec_return_add, IN | LOCK | ALWAYS, NULL,
		    trapvec_ioc_return_add, NULL),
	TRAPVEC_IOC(RETURN_REMOVE, struct trapvec_return_remove, IN | LOCK | ALWAYS, NULL,
		    trapvec_ioc_return_remove, NULL),
	TRAPVEC_IOC(RETURN_STATS, struct trapvec_return_stats, IN | LOCK | ALWAYS, NULL,
		    trapvec_ioc_return_stats, NULL),
	TRAPVEC_IOC(KEY_ADD, struct trapvec_key_add, IN | LOCK | ALWAYS, NULL,
		    trapvec_ioc_key_add, NULL),
	TRAPVEC_IOC(KEY_REMOVE, struct trapvec_key_remove, IN | LOCK | ALWAYS, NULL,
		    trapvec_ioc_key_remove, NULL),
	TRAPVEC_IOC(KEY_STATS, struct trapvec_key_stats, IN | LOCK | ALWAYS, NULL,
		    trapvec_ioc_key_stats, NULL),
	/* The module watch: its spinlock; MODEVENT sleeps for an event. */
	TRAPVEC_IOC(WATCH, struct trapvec_watch, IN, NULL, trapvec_ioc_watch, NULL),
	TRAPVEC_IOC(MODEVENT, struct trapvec_modevent, IN | OUT, NULL, trapvec_ioc_modevent,
		    NULL),
	TRAPVEC_IOC(MODACK, struct trapvec_modack, IN, NULL, trapvec_ioc_modack, NULL),
};

#undef IN
#undef LOCK
#undef OUT
#undef ALWAYS

bool trapvec_seal_pending;

/*
 * Every CPU serializes once for the blocks sealed since the last time, before a command that
 * may send a CPU into one: any command under the lock but the three that build blocks (ALLOC,
 * WRITE, SEAL), so a batch of N blocks costs one IPI round, not N (an IPI to a CPU busy with
 * interrupts off is slow: 6 ms a block under TCG with TCP traffic). Nothing reaches a sealed
 * block before such a command: dispatch entries, patches and return handlers are all made by
 * one.
 */
static void trapvec_sync_sealed(unsigned int cmd)
{
	lockdep_assert_held(&trapvec_mutex);
	if (!trapvec_seal_pending || cmd == TRAPVEC_IOC_ALLOC || cmd == TRAPVEC_IOC_WRITE ||
	    cmd == TRAPVEC_IOC_SEAL)
		return;
	on_each_cpu(trapvec_sync_core, NULL, 1);
	trapvec_seal_pending = false;
}

long trapvec_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	struct trapvec_ioc_bufs bufs = {};
	const struct trapvec_ioc *ioc;
	union trapvec_ioc_arg req;
	unsigned int i;
	long ret;

	if (!capable(CAP_SYS_MODULE))
		return -EPERM;
	i = _IOC_NR(cmd);
	if (i >= ARRAY_SIZE(trapvec_iocs))
		return -ENOTTY;
	ioc = &trapvec_iocs[array_index_nospec(i, ARRAY_SIZE(trapvec_iocs))];
	/* The whole number: another size or direction with a known n is no command of ours. */
	if (!ioc->op || ioc->cmd != cmd)
		return -ENOTTY;

	if (!(ioc->flags & TRAPVEC_IOC_IN))
		memset(&req, 0, ioc->size);
	else if (copy_from_user(&req, uarg, ioc->size))
		return -EFAULT;
	ret = ioc->prepare ? ioc->prepare(&req, &bufs) : 0;
	if (ret)
		goto out_free;
	if (ioc->flags & TRAPVEC_IOC_LOCK) {
		mutex_lock(&trapvec_mutex);
		trapvec_sync_sealed(cmd);
	}
	ret = ioc->op(file, &req, &bufs);
	if (ioc->flags & TRAPVEC_IOC_LOCK)
		mutex_unlock(&trapvec_mutex);
	if (ioc->finish)
		ret = ioc->finish(&req, &bufs, ret);
	if ((ioc->flags & TRAPVEC_IOC_OUT) && (!ret || (ioc->flags & TRAPVEC_IOC_OUT_ALWAYS)) &&
	    copy_to_user(uarg, &req, ioc->size))
		ret = -EFAULT;
out_free:
	for (i = 0; i < ARRAY_SIZE(bufs.p); i++)
		trapvec_kvfree(TRAPVEC_MEM_SCRATCH, bufs.p[i], bufs.bytes[i]);
	return ret;
}
