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
 * space's record of what it made (state.c). Its ioctls are in ioctl.c, one table. Unloading reverts every live patch, restores the
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
	BUILD_BUG_ON(sizeof(struct trapvec_check_many) != 16);
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
	ret = trapvec_dispatch_init();
	if (ret)
		return ret;
	ret = trapvec_ksyms_init();
	if (ret)
		goto out_dispatch;
	ret = trapvec_reserved_init();
	if (ret)
		goto out_dispatch;
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
out_dispatch:
	trapvec_dispatch_exit();
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
	trapvec_dispatch_exit();
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
