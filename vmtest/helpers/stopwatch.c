// SPDX-License-Identifier: GPL-2.0
/*
 * stopwatch - time a command, for trapvec's benchmark scenarios (built `cc -static -O2` by
 * vmtest; busybox's date has no sub-second format and /proc/uptime counts 10 ms).
 *
 *   stopwatch COMMAND [ARG...]   run COMMAND (its output passes through) and print
 *                                `STOPWATCH_NS=N` on stderr: CLOCK_MONOTONIC nanoseconds from
 *                                before fork() to after waitpid(), the whole command as a
 *                                user would wait for it
 *
 * Exit status: COMMAND's (128 + signal when killed), 127 when it cannot run, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	long long start, end;
	int status;
	pid_t pid;

	if (argc < 2) {
		fprintf(stderr, "usage: stopwatch COMMAND [ARG...]\n");
		return 2;
	}
	start = now_ns();
	pid = fork();
	if (pid < 0) {
		perror("stopwatch: fork");
		return 127;
	}
	if (pid == 0) {
		execvp(argv[1], argv + 1);
		fprintf(stderr, "stopwatch: running %s: %s\n", argv[1], strerror(errno));
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0) {
		perror("stopwatch: waitpid");
		return 127;
	}
	end = now_ns();
	fprintf(stderr, "STOPWATCH_NS=%lld\n", end - start);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
