// SPDX-License-Identifier: GPL-2.0
/*
 * tv_lp_nsleep - a livepatch of common_nsleep(), the nsleep method of CLOCK_REALTIME and
 * CLOCK_MONOTONIC (kernel/time/posix-timers.c), which a task sleeping in clock_nanosleep()
 * has on its stack above hrtimer_nanosleep() and do_nanosleep(). For
 * vmtest/scenarios/kernel_livepatch_returns.sh: a livepatch transition may switch a sleeping
 * task to the new function only once a reliable stack walk shows it is not inside the old one.
 *
 *   insmod tv_lp_nsleep.ko; cat /sys/kernel/livepatch/tv_lp_nsleep/transition
 *
 * The new function does what the old one does: the relative or absolute sleep of the clock,
 * through hrtimer_nanosleep() (not exported: its address comes from a disabled kprobe, which
 * resolves a symbol name as kallsyms does). It counts its calls (parameter calls).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/hrtimer.h>
#include <linux/kernel.h>
#include <linux/kprobes.h>
#include <linux/livepatch.h>
#include <linux/module.h>
#include <linux/time64.h>

typedef long tv_hrtimer_nanosleep_t(ktime_t rqtp, const enum hrtimer_mode mode,
				    const clockid_t clockid);
static tv_hrtimer_nanosleep_t *tv_hrtimer_nanosleep;

static atomic_t calls = ATOMIC_INIT(0);
module_param_named(calls, calls.counter, int, 0444);
MODULE_PARM_DESC(calls, "calls of the new common_nsleep()");

static int tv_lp_common_nsleep(const clockid_t which_clock, int flags,
			       const struct timespec64 *rqtp)
{
	enum hrtimer_mode mode = flags & TIMER_ABSTIME ? HRTIMER_MODE_ABS : HRTIMER_MODE_REL;

	atomic_inc(&calls);
	return tv_hrtimer_nanosleep(timespec64_to_ktime(*rqtp), mode, which_clock);
}

static struct klp_func funcs[] = {
	{
		.old_name = "common_nsleep",
		.new_func = tv_lp_common_nsleep,
	}, { }
};

static struct klp_object objs[] = {
	{
		/* NULL name: vmlinux */
		.funcs = funcs,
	}, { }
};

static struct klp_patch patch = {
	.mod = THIS_MODULE,
	.objs = objs,
};

static int __init tv_lp_nsleep_init(void)
{
	struct kprobe kp = {
		.symbol_name = "hrtimer_nanosleep",
		.flags = KPROBE_FLAG_DISABLED,
	};
	int ret;

	ret = register_kprobe(&kp);
	if (ret < 0) {
		pr_err("cannot find hrtimer_nanosleep: %d\n", ret);
		return ret;
	}
	tv_hrtimer_nanosleep = (tv_hrtimer_nanosleep_t *)kp.addr;
	unregister_kprobe(&kp);
	return klp_enable_patch(&patch);
}

static void __exit tv_lp_nsleep_exit(void)
{
}

module_init(tv_lp_nsleep_init);
module_exit(tv_lp_nsleep_exit);
MODULE_LICENSE("GPL");
MODULE_INFO(livepatch, "Y");
MODULE_DESCRIPTION("trapvec test: common_nsleep() livepatched (sleeping tasks and return points)");
