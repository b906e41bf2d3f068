// SPDX-License-Identifier: GPL-2.0
/*
 * trapvec - modify a running kernel through a trap vector.
 *
 * The module is the kernel half of trapvec (see ../shared/DESIGN.md): user space decodes,
 * validates and plans splices, builds trampolines and relocates components; the module
 * checks and applies. It owns an interrupt gate (gate.c, entry.S) whose dispatcher sends a
 * CPU that executed "int $vector" at a known site to that site's destination
 * (dispatch.c), an executable arena within reach of kernel text (arena.c), and batched,
 * all-or-nothing text patching with site validation (text.c, check.c), and keeps user
 * space's record of what it made (state.c). Unloading reverts every live patch, restores the
 * gate and drops that record.
 *
 * /dev/trapvec is mode 0600 and every ioctl also requires CAP_SYS_MODULE: changing kernel
 * code is as strong as loading a module.
 *
 * Trampolines and call handlers must not sleep (handlers run in the dispatcher with
 * interrupts off). A replacement function (a "replace" splice) may: its trampoline counts
 * the tasks inside it, and QUIESCE and unload wait for the count of a freed trampoline to
 * reach zero after the RCU-tasks grace period (arena.c, "Tasks in flight").
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "../components/include/trapvec.h"
#include "trapvec_internal.h"

/* Serializes every change; see trapvec_internal.h. */
DEFINE_MUTEX(trapvec_mutex);

unsigned int trapvec_vector = 0xf5;
module_param_named(vector, trapvec_vector, uint, 0444);
MODULE_PARM_DESC(vector, "trap vector: an unused system vector (default 0xf5)");

static void trapvec_abi_checks(void)
{
	/* The sizes trapvec/src/abi.rs asserts too. */
	BUILD_BUG_ON(sizeof(struct trapvec_info) != 168);
	BUILD_BUG_ON(sizeof(struct trapvec_read) != 24);
	BUILD_BUG_ON(sizeof(struct trapvec_alloc) != 32);
	BUILD_BUG_ON(sizeof(struct trapvec_write) != 32);
	BUILD_BUG_ON(sizeof(struct trapvec_block) != 8);
	BUILD_BUG_ON(sizeof(struct trapvec_patch) != 48);
	BUILD_BUG_ON(sizeof(struct trapvec_check) != 32);
	BUILD_BUG_ON(sizeof(struct trapvec_apply) != 56);
	BUILD_BUG_ON(sizeof(struct trapvec_dispatch_entry) != 72);
	BUILD_BUG_ON(sizeof(struct trapvec_task_match) != 40);
	BUILD_BUG_ON(sizeof(struct trapvec_dispatch_add) != 16);
	BUILD_BUG_ON(sizeof(struct trapvec_dispatch_remove) != 16);
	BUILD_BUG_ON(sizeof(struct trapvec_dispatch_replace) != 24);
	BUILD_BUG_ON(sizeof(struct trapvec_hits) != 24);
	BUILD_BUG_ON(sizeof(struct trapvec_list_entry) != 88);
	BUILD_BUG_ON(sizeof(struct trapvec_list) != 24);
	BUILD_BUG_ON(sizeof(struct trapvec_quiesce) != 32);
	BUILD_BUG_ON(sizeof(struct trapvec_state) != 32);
	BUILD_BUG_ON(sizeof(struct trapvec_regs) != 18 * 8);
	BUILD_BUG_ON(TRAPVEC_PATCH_MAX >= PAGE_SIZE);
	/* Return points (ABI 5). */
	BUILD_BUG_ON(sizeof(struct trapvec_return_add) != 48);
	BUILD_BUG_ON(sizeof(struct trapvec_return_remove) != 16);
	BUILD_BUG_ON(sizeof(struct trapvec_return_stats) != 576);
	/* Keyed counts (ABI 6). */
	BUILD_BUG_ON(sizeof(struct trapvec_key_add) != 32);
	BUILD_BUG_ON(sizeof(struct trapvec_key_remove) != 8);
	BUILD_BUG_ON(sizeof(struct trapvec_key_entry) != 24);
	BUILD_BUG_ON(sizeof(struct trapvec_key_stats) != 48);
	BUILD_BUG_ON(sizeof(struct trapvec_call) != 10 * 8);
	/* Module watch (ABI 10). */
	BUILD_BUG_ON(sizeof(struct trapvec_watch) != 8);
	BUILD_BUG_ON(sizeof(struct trapvec_modevent) != 88);
	BUILD_BUG_ON(sizeof(struct trapvec_modack) != 16);
	BUILD_BUG_ON(TRAPVEC_MODNAME_LEN != MODULE_NAME_LEN);
}

static long trapvec_ioc_info(void __user *uarg)
{
	struct trapvec_info info = {};

	info.abi_version = TRAPVEC_ABI_VERSION;
	info.vector = trapvec_vector;
	info.entry = (unsigned long)trapvec_entry;
	info.old_handler = trapvec_old_handler;
	info.gate_handler = trapvec_gate_handler();
	info.module_base = trapvec_module_text_base(THIS_MODULE);
	info.module_size = trapvec_module_core_size(THIS_MODULE);
	info.replace_ret = (unsigned long)trapvec_replace_ret;
	info.current_task = trapvec_current_task_offset();
	info.task_pid = offsetof(struct task_struct, pid);
	info.task_tgid = offsetof(struct task_struct, tgid);
	info.task_comm = offsetof(struct task_struct, comm);
	trapvec_dispatch_stats(&info.unknown_traps, &info.retried_traps);

	mutex_lock(&trapvec_mutex);
	trapvec_arena_info(&info);
	info.live_patches = trapvec_text_live_count();
	info.dispatch_entries = trapvec_dispatch_count();
	mutex_unlock(&trapvec_mutex);

	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long trapvec_ioc_read(void __user *uarg)
{
	struct trapvec_read req;
	u8 __user *dst;
	u32 done, chunk;
	void *bounce;
	long ret = 0;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.len > TRAPVEC_XFER_MAX || req.addr + req.len < req.addr ||
	    (req.flags & ~TRAPVEC_READ_ORIGINAL))
		return -EINVAL;
	/* Lockdown (confidentiality) forbids reading kernel memory, as it does /proc/kcore. */
	if (!trapvec_may_read())
		return -EPERM;
	dst = u64_to_user_ptr(req.buf);
	if ((req.flags & TRAPVEC_READ_ORIGINAL) && req.len) {
		/*
		 * In one pass: the record of live patches is walked once per request (planning
		 * reads whole runs of functions, with thousands of patches live).
		 */
		bounce = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 1, req.len, GFP_KERNEL);
		if (!bounce)
			return -ENOMEM;
		mutex_lock(&trapvec_mutex);
		ret = trapvec_read_unpatched((unsigned long)req.addr, bounce, req.len);
		mutex_unlock(&trapvec_mutex);
		if (!ret && copy_to_user(dst, bounce, req.len))
			ret = -EFAULT;
		trapvec_kvfree(TRAPVEC_MEM_SCRATCH, bounce, req.len);
		return ret;
	}
	bounce = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, 1, PAGE_SIZE, GFP_KERNEL);
	if (!bounce)
		return -ENOMEM;
	for (done = 0; done < req.len; done += chunk) {
		chunk = min_t(u32, req.len - done, PAGE_SIZE);
		if (copy_from_kernel_nofault(bounce, (void *)(unsigned long)(req.addr + done),
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
static long trapvec_ioc_alloc(void __user *uarg)
{
	struct trapvec_alloc req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (trapvec_may_write())
		return -EPERM;
	mutex_lock(&trapvec_mutex);
	ret = trapvec_arena_alloc(&req);
	mutex_unlock(&trapvec_mutex);
	if (ret)
		return ret;
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long trapvec_ioc_write(void __user *uarg)
{
	struct trapvec_write req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (trapvec_may_write())
		return -EPERM;
	mutex_lock(&trapvec_mutex);
	ret = trapvec_arena_write(&req);
	mutex_unlock(&trapvec_mutex);
	return ret;
}

static long trapvec_ioc_block(void __user *uarg, int (*op)(u64 id))
{
	struct trapvec_block req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	mutex_lock(&trapvec_mutex);
	ret = op(req.id);
	mutex_unlock(&trapvec_mutex);
	return ret;
}

static long trapvec_ioc_check(void __user *uarg)
{
	struct trapvec_check req;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.flags & ~TRAPVEC_CHECK_NO_KPROBE)
		return -EINVAL;
	mutex_lock(&trapvec_mutex);
	if (req.flags & TRAPVEC_CHECK_NO_KPROBE) {
		mutex_lock(trapvec_ksyms.kprobe_mutex);
		req.reason = trapvec_check_site(req.addr, req.len, &req.culprit);
		mutex_unlock(trapvec_ksyms.kprobe_mutex);
		req.error = 0;
	} else {
		req.reason = trapvec_check_site_kprobe(req.addr, req.len, &req.error,
						       &req.culprit);
	}
	mutex_unlock(&trapvec_mutex);
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

/* Copy an array of count elements of size from user space (count already bounded). */
static void *trapvec_copy_array(u64 uptr, u32 count, size_t size)
{
	void *buf = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, size, GFP_KERNEL);

	if (!buf)
		return ERR_PTR(-ENOMEM);
	if (copy_from_user(buf, u64_to_user_ptr(uptr), count * size)) {
		trapvec_kvfree(TRAPVEC_MEM_SCRATCH, buf, count * size);
		return ERR_PTR(-EFAULT);
	}
	return buf;
}

static long trapvec_ioc_apply(void __user *uarg)
{
	struct trapvec_patch *patches;
	struct trapvec_apply req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	patches = trapvec_copy_array(req.patches, req.count, sizeof(*patches));
	if (IS_ERR(patches))
		return PTR_ERR(patches);
	mutex_lock(&trapvec_mutex);
	ret = trapvec_text_apply(patches, &req);
	mutex_unlock(&trapvec_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, patches, req.count * sizeof(*patches));
	/* The failure details go back with the error. */
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT;
	return ret;
}

static long trapvec_ioc_dispatch_add(void __user *uarg)
{
	struct trapvec_dispatch_entry *entries;
	struct trapvec_dispatch_add req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	entries = trapvec_copy_array(req.entries, req.count, sizeof(*entries));
	if (IS_ERR(entries))
		return PTR_ERR(entries);
	mutex_lock(&trapvec_mutex);
	ret = trapvec_dispatch_add(entries, req.count, &req.failed_index);
	mutex_unlock(&trapvec_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, entries, req.count * sizeof(*entries));
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT;
	return ret;
}

static long trapvec_ioc_dispatch_remove(void __user *uarg)
{
	struct trapvec_dispatch_remove req;
	u64 *sites;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	sites = trapvec_copy_array(req.sites, req.count, sizeof(*sites));
	if (IS_ERR(sites))
		return PTR_ERR(sites);
	mutex_lock(&trapvec_mutex);
	ret = trapvec_dispatch_remove(sites, req.count, &req.failed_index);
	mutex_unlock(&trapvec_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, sites, req.count * sizeof(*sites));
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT;
	return ret;
}

static long trapvec_ioc_dispatch_replace(void __user *uarg)
{
	struct trapvec_dispatch_entry *entries;
	struct trapvec_dispatch_replace req;
	struct trapvec_hits *counts;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.count > TRAPVEC_BATCH_MAX)
		return -E2BIG;
	entries = trapvec_copy_array(req.entries, req.count, sizeof(*entries));
	if (IS_ERR(entries))
		return PTR_ERR(entries);
	counts = trapvec_copy_array(req.counts, req.count, sizeof(*counts));
	if (IS_ERR(counts)) {
		trapvec_kvfree(TRAPVEC_MEM_SCRATCH, entries, req.count * sizeof(*entries));
		return PTR_ERR(counts);
	}
	mutex_lock(&trapvec_mutex);
	ret = trapvec_dispatch_replace(entries, counts, req.count, &req.failed_index);
	mutex_unlock(&trapvec_mutex);
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, entries, req.count * sizeof(*entries));
	/*
	 * The buffer was just read, so this write fails only if the caller unmapped it meanwhile;
	 * the replacement is made then all the same, and -EFAULT says its counts are lost.
	 */
	if (!ret && copy_to_user(u64_to_user_ptr(req.counts), counts, req.count * sizeof(*counts)))
		ret = -EFAULT;
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, counts, req.count * sizeof(*counts));
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT;
	return ret;
}

static long trapvec_ioc_hits(void __user *uarg)
{
	struct trapvec_hits req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	mutex_lock(&trapvec_mutex);
	ret = trapvec_dispatch_hits(&req);
	mutex_unlock(&trapvec_mutex);
	if (ret)
		return ret;
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long trapvec_ioc_list(void __user *uarg)
{
	struct trapvec_list_entry *out = NULL;
	struct trapvec_list req;
	u32 n;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.capacity > TRAPVEC_BATCH_MAX)
		req.capacity = TRAPVEC_BATCH_MAX;
	if (req.capacity) {
		out = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, req.capacity, sizeof(*out),
				       GFP_KERNEL | __GFP_ZERO);
		if (!out)
			return -ENOMEM;
	}
	mutex_lock(&trapvec_mutex);
	ret = trapvec_dispatch_list(out, req.start, req.capacity, &req.count);
	mutex_unlock(&trapvec_mutex);
	if (!ret) {
		n = req.start < req.count ? min_t(u64, req.count - req.start, req.capacity) : 0;
		if (n && copy_to_user(u64_to_user_ptr(req.entries), out, n * sizeof(*out)))
			ret = -EFAULT;
		else if (copy_to_user(uarg, &req, sizeof(req)))
			ret = -EFAULT;
	}
	trapvec_kvfree(TRAPVEC_MEM_SCRATCH, out, req.capacity * sizeof(*out));
	return ret;
}

static long trapvec_ioc_quiesce(void __user *uarg)
{
	struct trapvec_quiesce req = {};
	long ret;

	mutex_lock(&trapvec_mutex);
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
	ret = trapvec_arena_wait_inflight(false, TRAPVEC_QUIESCE_WAIT_MS, &req);
	if (!ret) {
		trapvec_arena_reclaim(&req);
		trapvec_text_put_parked();
	}
	/* A kprobe that armed on a live patch pins the module (text.c). */
	trapvec_text_check_kprobes();
	mutex_unlock(&trapvec_mutex);
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT;
	return ret;
}

/* STATE_GET and STATE_PUT: the answer goes back with an error too (size, generation). */
static long trapvec_ioc_state(void __user *uarg, int (*op)(struct trapvec_state *req))
{
	struct trapvec_state req;
	long ret;

	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	ret = op(&req);
	if (copy_to_user(uarg, &req, sizeof(req)))
		return -EFAULT;
	return ret;
}

/* RETURN_ADD, RETURN_REMOVE, RETURN_STATS: the answer goes back with an error too. */
#define TRAPVEC_RETURN_IOC(name, type)						\
static long trapvec_ioc_##name(void __user *uarg)				\
{										\
	struct type req;							\
	long ret;								\
										\
	if (copy_from_user(&req, uarg, sizeof(req)))				\
		return -EFAULT;							\
	mutex_lock(&trapvec_mutex);						\
	ret = trapvec_##name(&req);						\
	mutex_unlock(&trapvec_mutex);						\
	if (copy_to_user(uarg, &req, sizeof(req)))				\
		return -EFAULT;							\
	return ret;								\
}
TRAPVEC_RETURN_IOC(returns_add, trapvec_return_add)
TRAPVEC_RETURN_IOC(returns_remove, trapvec_return_remove)
TRAPVEC_RETURN_IOC(returns_stats, trapvec_return_stats)
/* KEY_ADD, KEY_REMOVE, KEY_STATS: the same way. */
TRAPVEC_RETURN_IOC(keys_add, trapvec_key_add)
TRAPVEC_RETURN_IOC(keys_remove, trapvec_key_remove)
TRAPVEC_RETURN_IOC(keys_stats, trapvec_key_stats)

static long trapvec_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	if (!capable(CAP_SYS_MODULE))
		return -EPERM;

	switch (cmd) {
	case TRAPVEC_IOC_INFO:
		return trapvec_ioc_info(uarg);
	case TRAPVEC_IOC_READ:
		return trapvec_ioc_read(uarg);
	case TRAPVEC_IOC_ALLOC:
		return trapvec_ioc_alloc(uarg);
	case TRAPVEC_IOC_WRITE:
		return trapvec_ioc_write(uarg);
	case TRAPVEC_IOC_SEAL:
		return trapvec_ioc_block(uarg, trapvec_arena_seal);
	case TRAPVEC_IOC_FREE:
		return trapvec_ioc_block(uarg, trapvec_arena_free);
	case TRAPVEC_IOC_CHECK:
		return trapvec_ioc_check(uarg);
	case TRAPVEC_IOC_APPLY:
		return trapvec_ioc_apply(uarg);
	case TRAPVEC_IOC_DISPATCH_ADD:
		return trapvec_ioc_dispatch_add(uarg);
	case TRAPVEC_IOC_DISPATCH_REMOVE:
		return trapvec_ioc_dispatch_remove(uarg);
	case TRAPVEC_IOC_DISPATCH_REPLACE:
		return trapvec_ioc_dispatch_replace(uarg);
	case TRAPVEC_IOC_HITS:
		return trapvec_ioc_hits(uarg);
	case TRAPVEC_IOC_LIST:
		return trapvec_ioc_list(uarg);
	case TRAPVEC_IOC_QUIESCE:
		return trapvec_ioc_quiesce(uarg);
	case TRAPVEC_IOC_STATE_GET:
		return trapvec_ioc_state(uarg, trapvec_state_get);
	case TRAPVEC_IOC_STATE_PUT:
		return trapvec_ioc_state(uarg, trapvec_state_put);
	case TRAPVEC_IOC_RETURN_ADD:
		return trapvec_ioc_returns_add(uarg);
	case TRAPVEC_IOC_RETURN_REMOVE:
		return trapvec_ioc_returns_remove(uarg);
	case TRAPVEC_IOC_RETURN_STATS:
		return trapvec_ioc_returns_stats(uarg);
	case TRAPVEC_IOC_KEY_ADD:
		return trapvec_ioc_keys_add(uarg);
	case TRAPVEC_IOC_KEY_REMOVE:
		return trapvec_ioc_keys_remove(uarg);
	case TRAPVEC_IOC_KEY_STATS:
		return trapvec_ioc_keys_stats(uarg);
	/* The module watch (modwatch.c): it knows its watcher by the file. */
	case TRAPVEC_IOC_WATCH:
		return trapvec_modwatch_watch(file, uarg);
	case TRAPVEC_IOC_MODEVENT:
		return trapvec_modwatch_event(file, uarg);
	case TRAPVEC_IOC_MODACK:
		return trapvec_modwatch_ack(file, uarg);
	default:
		return -ENOTTY;
	}
}

static int trapvec_release(struct inode *inode, struct file *file)
{
	trapvec_modwatch_release(file);
	return 0;
}

static const struct file_operations trapvec_fops = {
	.owner = THIS_MODULE,
	.release = trapvec_release,
	.unlocked_ioctl = trapvec_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice trapvec_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = TRAPVEC_DEVICE_NAME,
	.fops = &trapvec_fops,
	.mode = 0600,
};

static int __init trapvec_init(void)
{
	int ret;

	trapvec_abi_checks();
	trapvec_returns_init();
	ret = trapvec_ksyms_init();
	if (ret)
		return ret;
	ret = trapvec_reserved_init();
	if (ret)
		return ret;
	ret = trapvec_arena_init();
	if (ret)
		goto out_arena;
	ret = trapvec_gate_install();
	if (ret)
		goto out_arena;
	ret = trapvec_text_init();
	if (ret)
		goto out_gate;
	ret = trapvec_modwatch_init();
	if (ret)
		goto out_text;
	ret = misc_register(&trapvec_misc);
	if (ret)
		goto out_modwatch;
	pr_info("ready: /dev/%s, vector %#x\n", TRAPVEC_DEVICE_NAME, trapvec_vector);
	return 0;

out_modwatch:
	trapvec_modwatch_exit();
out_text:
	trapvec_text_exit();
out_gate:
	trapvec_gate_restore();
out_arena:
	trapvec_arena_exit();
	trapvec_reserved_exit();
	return ret;
}

static void __exit trapvec_exit(void)
{
	struct trapvec_quiesce ignored = {};

	/* No new ioctl can start; none is running (an open file holds the module). */
	misc_deregister(&trapvec_misc);
	/* No watcher is left (its file held the module); notifiers still running finish. */
	trapvec_modwatch_exit();
	/*
	 * No return point lives and no call has a pending return (the module holds itself
	 * while one does); the release work may be finishing after its module_put().
	 */
	trapvec_returns_cancel_work();
	/* Likewise the kprobe work (text.c): no kprobe was armed on a live patch at its look. */
	trapvec_text_cancel_work();

	mutex_lock(&trapvec_mutex);
	/* One that armed since would run our trap from its slot: it must go first. */
	trapvec_text_wait_kprobes();
	trapvec_text_revert_all();
	/* No batch is in flight: none of our int3s is left for the die notifier. */
	trapvec_text_exit();
	/*
	 * No trap can be taken at a site of ours any more. Wait for CPUs still in the
	 * dispatcher (an NMI is not held by stop_machine()), then for tasks preempted inside a
	 * trampoline or a component, before the gate goes and the arena is freed with the
	 * module.
	 */
	synchronize_rcu();
	trapvec_sync_tasks();
	/*
	 * A task asleep inside a replacement passed the grace period above but will return
	 * through its trampoline (in the arena, which is this module's text) and into the text
	 * it was called from. Unload cannot fail: wait for every in-flight counter, however
	 * long, saying so every 5 s; then one more grace period for the tasks between the
	 * decrement and the ret of trapvec_replace_ret().
	 */
	trapvec_arena_wait_inflight(true, 0, &ignored);
	/*
	 * An idle CPU (a replacement in the idle path) interrupted between the decrement and
	 * the ret is not waited for by RCU-tasks: the rude half waits for it too.
	 */
	trapvec_sync_tasks();
	trapvec_text_put_parked();
	trapvec_gate_restore();
	trapvec_dispatch_clear();
	trapvec_returns_exit();
	trapvec_keys_exit();
	trapvec_arena_exit();
	trapvec_reserved_exit();
	mutex_unlock(&trapvec_mutex);
	/* The blob described what was just reverted. */
	trapvec_state_exit();
	/* Everything is freed: the one line a leak test reads (mem.c). */
	trapvec_mem_exit();
}

module_init(trapvec_init);
module_exit(trapvec_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("trapvec: modify a running kernel through a trap vector");
