// SPDX-License-Identifier: GPL-2.0
/*
 * tv_modcalls - a module whose init and exit call two functions a known number of times, for
 * points that wait for a module (trapd's pending points, vmtest/scenarios/kernel_deferred.sh).
 *
 *   insmod tv_modcalls.ko calls=N    init calls tv_modcalls_work() and tv_modcalls_timed() N
 *                                    times each; exit calls tv_modcalls_work() twice more
 *
 * A count at tv_modcalls_work armed when the module comes (before its init runs) and removed
 * when it goes (after its exit has run) counts N + 2 per load; a timer on tv_modcalls_timed, N.
 * Both functions are exported, so that the compiler keeps them whole under their names (no
 * .constprop or .isra clone), and noinline, so that every call is a real call.
 */
#include <linux/module.h>

static int calls = 5;
module_param(calls, int, 0444);
MODULE_PARM_DESC(calls, "how many times init calls each function (default 5)");

unsigned long tv_modcalls_sum;
EXPORT_SYMBOL_GPL(tv_modcalls_sum);

noinline unsigned long tv_modcalls_work(unsigned long i)
{
	WRITE_ONCE(tv_modcalls_sum, READ_ONCE(tv_modcalls_sum) + i);
	return READ_ONCE(tv_modcalls_sum);
}
EXPORT_SYMBOL_GPL(tv_modcalls_work);

noinline unsigned long tv_modcalls_timed(unsigned long i)
{
	WRITE_ONCE(tv_modcalls_sum, READ_ONCE(tv_modcalls_sum) ^ i);
	return READ_ONCE(tv_modcalls_sum);
}
EXPORT_SYMBOL_GPL(tv_modcalls_timed);

static int __init tv_modcalls_init(void)
{
	int i;

	for (i = 0; i < calls; i++) {
		tv_modcalls_work(i);
		tv_modcalls_timed(i);
	}
	return 0;
}

static void __exit tv_modcalls_exit(void)
{
	tv_modcalls_work(1);
	tv_modcalls_work(2);
}

module_init(tv_modcalls_init);
module_exit(tv_modcalls_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("trapvec test helper: init and exit call functions a known number of times");
