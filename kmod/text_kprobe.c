// SPDX-License-Identifier: GPL-2.0
/*
 * Kprobes and live patches: the blacklist entries, and the module pinned while a kprobe is armed on one.
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
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/kprobes.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/workqueue.h>

#include "trapvec_internal.h"
#include "trapvec_text.h"

/*
 * Test knob (insmod trapvec.ko kprobe_blacklist=0): live patches are not put on the kprobes
 * blacklist, so that a test can register a kprobe on one, as the race of register_kprobe()
 * (see the top of this file) can, and see the module pinned. Never for use outside tests.
 */
bool trapvec_kprobe_blacklist = true;
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
 * Unload, first of all (without trapvec_mutex, which the work takes): the module was not
 * pinned, so the kprobe work is not rescheduled, but it may still be finishing after its
 * module_put().
 */
void trapvec_text_cancel_work(void)
{
	cancel_delayed_work_sync(&trapvec_kprobe_work);
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
void trapvec_kprobe_pin_update(bool report)
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
