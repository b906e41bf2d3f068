// SPDX-License-Identifier: GPL-2.0
/*
 * tv_idle_poll - a cpuidle driver with the kernel's poll state and a halt state, the shape of
 * cpuidle-haltpoll (which registers only in a KVM guest), for a QEMU TCG guest that has no
 * cpuidle driver at all.
 *
 *   insmod tv_idle_poll.ko
 *
 * It stays loaded: cpuidle holds a driver's owner while CPUs idle in it.
 *
 * With it, the idle loop goes through cpuidle_enter_state(), which in Linux 6.1 enters RCU-idle
 * (ct_idle_enter()) before the state's ->enter(): poll_idle() (state 0) then runs ordinary,
 * traceable kernel functions with RCU not watching (cpuidle_poll_time(), local_clock()), which
 * is what vmtest/scenarios/kernel_rcu_idle.sh places a trap in. Writing 1 to
 * /sys/devices/system/cpu/cpuN/cpuidle/state1/disable leaves the poll state alone in use.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpuidle.h>
#include <linux/irqflags.h>
#include <linux/module.h>

/* State 1: hlt with interrupts enabled in its shadow, as default_idle() (not exported) does. */
static int __cpuidle tv_idle_halt(struct cpuidle_device *dev, struct cpuidle_driver *drv,
				  int index)
{
	raw_safe_halt();
	raw_local_irq_disable();
	return index;
}

static struct cpuidle_driver tv_idle_driver = {
	.name = "tv_idle_poll",
	.states = {
		{ /* entry 0 is the poll state, filled in by cpuidle_poll_state_init() */ },
		{
			.enter = tv_idle_halt,
			.exit_latency = 1,
			/* Long enough that the menu governor polls for short idle periods. */
			.target_residency = 2000,
			.power_usage = -1,
			.name = "halt",
			.desc = "tv_idle_poll halt",
		},
	},
	.safe_state_index = 0,
	.state_count = 2,
};

static int __init tv_idle_poll_init(void)
{
	int ret;

	cpuidle_poll_state_init(&tv_idle_driver);
	ret = cpuidle_register(&tv_idle_driver, NULL);
	if (ret) {
		pr_err("cpuidle_register: %d (another cpuidle driver is registered?)\n", ret);
		return ret;
	}
	pr_info("registered: poll and halt states\n");
	return 0;
}

module_init(tv_idle_poll_init);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("trapvec test helper: a poll+halt cpuidle driver for guests without one");
