// SPDX-License-Identifier: GPL-2.0
/*
 * sysbench - time a cheap system call for trapvec's kernel benchmark (built `cc -static -O2` by
 * vmtest).
 *
 *   sysbench [-n CALLS] [getppid]   make CALLS getppid() system calls (default 100000) and print
 *                                   the mean time per call in nanoseconds, as a bare number
 *
 * getppid() enters the kernel at __x64_sys_getppid, whose body the benchmark splices; under
 * QEMU TCG the figures are emulated time, so only ratios measured in the same guest mean anything.
 *
 * Exit status: 0 on success, 1 if the result was wrong, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void usage(void)
{
	fprintf(stderr, "usage: sysbench [-n CALLS] [getppid]\n");
	exit(2);
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long calls = 100000, i;
	pid_t want = getppid();
	double start, end;
	char *endp;
	int c;

	while ((c = getopt(argc, argv, "n:")) != -1) {
		switch (c) {
		case 'n':
			errno = 0;
			calls = strtol(optarg, &endp, 10);
			if (errno || *endp || calls <= 0)
				usage();
			break;
		default:
			usage();
		}
	}
	if (optind < argc && (strcmp(argv[optind], "getppid") || optind + 1 != argc))
		usage();
	/* Warm up: caches, TCG translation blocks. */
	for (i = 0; i < calls / 10 + 1; i++)
		syscall(SYS_getppid);
	start = now_ns();
	for (i = 0; i < calls; i++) {
		if (syscall(SYS_getppid) != want) {
			fprintf(stderr, "sysbench: getppid() returned a wrong value at call %ld\n", i);
			return 1;
		}
	}
	end = now_ns();
	printf("%.0f\n", (end - start) / (double)calls);
	return 0;
}
