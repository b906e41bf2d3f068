/*
 * A process component for the demo: counts compute() calls (a "call" splice) and clamps the
 * MTU that sync_mss() sees (a "replace" splice that calls the original).
 */
#include <trapvec.h>

unsigned long compute_calls;
unsigned int clamp_mtu = 1000;

void count_compute(struct trapvec_regs *regs, void *cookie)
{
	(void)regs;
	(void)cookie;
	__atomic_fetch_add(&compute_calls, 1, __ATOMIC_RELAXED);
}

TRAPVEC_ORIG(unsigned int, sync_mss, unsigned int pmtu);

unsigned int clamped_sync_mss(unsigned int pmtu)
{
	return __trapvec_orig_sync_mss(pmtu < clamp_mtu ? pmtu : clamp_mtu);
}
