// SPDX-License-Identifier: GPL-2.0
/*
 * epnest - drive the kernel's recursive ep_loop_check_proc() an exact number of times at a known
 * depth, for the recursion test (vmtest/scenarios/kernel_returns.sh).
 *
 *   epnest DEPTH COUNT
 *
 * Builds a chain of DEPTH epoll instances, e[i] watching e[i - 1], then (on SIGUSR1: "built" on
 * stdout says when it may come) adds e[DEPTH - 1] to one more epoll instance and deletes it
 * again, COUNT times. Adding an epoll file to an epoll instance runs the loop check
 * (fs/eventpoll.c, do_epoll_ctl -> ep_loop_check): ep_loop_check_proc(e[DEPTH - 1], 0) calls
 * itself for e[DEPTH - 2] at depth 1, and so on down to e[0] at depth DEPTH - 1, which watches
 * no epoll file. Each call returns the depth of the chain below it: the call at depth d
 * returns DEPTH - 1 - d. So each add makes exactly DEPTH calls, DEPTH - 1 of them from the
 * function itself, and nothing else in the program calls it (deleting runs no loop check).
 * The kernel allows at most EP_MAX_NESTS (4) levels of nesting: DEPTH is 1 to 4.
 *
 *   prints "built depth=DEPTH" once the chain is there, then "adds=COUNT failed=F ms=M"
 *   (F: adds or deletes that failed; M: milliseconds the COUNT adds and deletes took)
 *
 * Exit status: 0 when every add and delete succeeded, 1 otherwise, 2 on bad usage or setup
 * failure.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#define MAX_DEPTH 4

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int e[MAX_DEPTH], top, depth, sig;
	long count, i, failed = 0;
	long long start;
	sigset_t usr1;

	if (argc != 3) {
		fprintf(stderr, "usage: epnest DEPTH COUNT\n");
		return 2;
	}
	depth = atoi(argv[1]);
	count = atol(argv[2]);
	if (depth < 1 || depth > MAX_DEPTH || count < 0) {
		fprintf(stderr, "epnest: DEPTH is 1 to %d, COUNT at least 0\n", MAX_DEPTH);
		return 2;
	}
	/* Blocked before "built" is printed, so a SIGUSR1 sent after it waits for sigwait(). */
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL);
	for (i = 0; i < depth; i++) {
		e[i] = epoll_create1(0);
		if (e[i] < 0) {
			perror("epnest: epoll_create1");
			return 2;
		}
		if (i && epoll_ctl(e[i], EPOLL_CTL_ADD, e[i - 1], &ev)) {
			fprintf(stderr, "epnest: adding level %ld to level %ld: %s\n", i - 1, i,
				strerror(errno));
			return 2;
		}
	}
	top = epoll_create1(0);
	if (top < 0) {
		perror("epnest: epoll_create1");
		return 2;
	}
	printf("built depth=%d\n", depth);
	fflush(stdout);
	if (sigwait(&usr1, &sig)) {
		fprintf(stderr, "epnest: sigwait failed\n");
		return 2;
	}
	start = now_ms();
	for (i = 0; i < count; i++) {
		if (epoll_ctl(top, EPOLL_CTL_ADD, e[depth - 1], &ev))
			failed++;
		else if (epoll_ctl(top, EPOLL_CTL_DEL, e[depth - 1], NULL))
			failed++;
	}
	printf("adds=%ld failed=%ld ms=%lld\n", count, failed, now_ms() - start);
	return failed ? 1 : 0;
}
