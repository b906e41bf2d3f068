// SPDX-License-Identifier: GPL-2.0
/*
 * slowcall - one getppid() system call, timed: for vmtest/scenarios/kernel_lifetimes.sh, where
 * a replacement of __x64_sys_getppid sleeps while the splice, its component or the module goes.
 *
 *   slowcall            prints "result=N ms=M" (M: milliseconds the call took)
 */
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int main(void)
{
	long long start = now_ms();
	long result = syscall(SYS_getppid);

	printf("result=%ld ms=%lld\n", result, now_ms() - start);
	return 0;
}
