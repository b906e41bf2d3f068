// SPDX-License-Identifier: GPL-2.0
/*
 * naps - sleep COUNT times for MS milliseconds each with nanosleep(), for the timer test
 * (vmtest/scenarios/kernel_returns.sh times hrtimer_nanosleep).
 *
 *   naps MS COUNT       prints "naps=COUNT ms=M" (M: milliseconds all of them took)
 *
 * Exit status: 0, or 1 when a nanosleep failed, 2 on bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	struct timespec nap;
	long long start;
	long ms, count, i;

	if (argc != 3) {
		fprintf(stderr, "usage: naps MS COUNT\n");
		return 2;
	}
	ms = atol(argv[1]);
	count = atol(argv[2]);
	nap.tv_sec = ms / 1000;
	nap.tv_nsec = (ms % 1000) * 1000000L;
	start = now_ms();
	for (i = 0; i < count; i++)
		if (nanosleep(&nap, NULL))
			return 1;
	printf("naps=%ld ms=%lld\n", count, now_ms() - start);
	return 0;
}
