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
 *
 * From 6.3 on the kernel's own code on that path is noinstr (poll_idle(), cpuidle_poll_time()),
 * where trapvec refuses a trap, while a driver's ->enter() still runs with RCU not watching.
 * State 2, off until its disable file gets 0, is a poll loop of this module that calls the
 * ordinary function tv_idle_spin() on every round: the scenario's trap site on such kernels.
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

/*
 * Called on every round of state 2's poll loop, with RCU not watching (cpuidle_enter_state()
 * called ct_cpuidle_enter() before ->enter()). Deliberately ordinary, traceable text: the
 * function a trap may be put in. Counting keeps it from being an empty function whose first
 * instruction past the entry would be its ret.
 */
static unsigned long tv_idle_spins;

static noinline void tv_idle_spin(void)
{
	WRITE_ONCE(tv_idle_spins, READ_ONCE(tv_idle_spins) + 1);
}

/*
 * State 2: poll until a task is runnable. Interrupts are on, so the wake-up IPI (the task is
 * not marked polling) and the timer end the loop; the interrupt entry makes RCU watch for the
 * handler as it does for any interrupt of an idle CPU.
 */
static int tv_idle_modpoll(struct cpuidle_device *dev, struct cpuidle_driver *drv, int index)
{
	raw_local_irq_enable();
	while (!need_resched()) {
		tv_idle_spin();
		cpu_relax();
	}
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
		{
			.enter = tv_idle_modpoll,
			.exit_latency = 0,
			.target_residency = 0,
			.power_usage = -1,
			/* Off until the scenario enables it: 6.1's run keeps two states. */
			.flags = CPUIDLE_FLAG_OFF,
			.name = "modpoll",
			.desc = "tv_idle_poll modpoll",
		},
	},
	.safe_state_index = 0,
	.state_count = 3,
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
	pr_info("registered: poll, halt and modpoll (off) states\n");
	return 0;
}

module_init(tv_idle_poll_init);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("trapvec test helper: a poll+halt cpuidle driver for guests without one");
