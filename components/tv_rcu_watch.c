// SPDX-License-Identifier: GPL-2.0
/*
 * tv_rcu_watch.c - a `call` handler that counts whether RCU was watching when it ran
 * (vmtest/scenarios/kernel_rcu_idle.sh, issue 24 item 2). A trap splice on a function the idle
 * loop runs with RCU off (cpuidle_poll_time() under poll_idle) calls it there: trapvec's
 * dispatcher must have made RCU watch first, so tv_rcu_unwatched stays 0.
 *
 *   trapctl load /components/tv_rcu_watch.o
 *   trapctl splice cpuidle_poll_time --call tv_rcu_watch
 *   trapctl get tv_rcu_watched; trapctl get tv_rcu_unwatched
 */
#include <linux/rcupdate.h>
#include <trapvec.h>

unsigned long tv_rcu_watched;
unsigned long tv_rcu_unwatched;

void tv_rcu_watch(struct trapvec_regs *regs, void *cookie);

void tv_rcu_watch(struct trapvec_regs *regs, void *cookie)
{
	/* Handlers may run on several CPUs at once. */
	if (rcu_is_watching())
		__atomic_fetch_add(&tv_rcu_watched, 1, __ATOMIC_RELAXED);
	else
		__atomic_fetch_add(&tv_rcu_unwatched, 1, __ATOMIC_RELAXED);
}
