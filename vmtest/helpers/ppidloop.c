// SPDX-License-Identifier: GPL-2.0
/*
 * ppidloop - call getppid() in a loop on every CPU, for trapvec's preemption stress test
 * (built `cc -static -O2` by vmtest).
 *
 *   ppidloop [-t THREADS] [-n CALLS] [-f STOPFILE] [-g GOFILE] [-m] [-l] [-s]
 *
 * Starts THREADS threads (default 1), thread i pinned to CPU i modulo the CPUs there are; each
 * calls getppid() and checks the answer. With -n each thread makes exactly CALLS calls; with
 * -f each runs until STOPFILE exists (looked at every 1024 calls). -l: at nice 19, so that
 * everything else preempts the threads wherever they are (busybox has no nice). -s: call
 * getsid(0) instead (the springboard test splices __x64_sys_getsid). -g: wait until GOFILE
 * exists before the first call (a scenario learns the pid, then splices for it). -m: make the
 * calls in the main thread (one worker, whose thread id is the process id). Then prints
 *
 *   CALLS=<every call made> WRONG=<answers that were not the parent's pid (the session's id)>
 *
 * where CALLS counts the first call too, made once before the threads start to learn the
 * answer, so that a scenario can compare its own count of calls with the kernel's (a kprobe's hit
 * count, a splice's hits).
 *
 * Exit status: 0 when every answer was right, 1 otherwise, 2 on bad usage or setup failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_THREADS 64

struct worker {
	pthread_t thread;
	int cpu;
	long calls;
	long wrong;
};

static long want_calls = -1;	/* -n; -1: until the stop file exists */
static const char *stop_file;
static pid_t parent;		/* the right answer: getppid(), or getsid(0) with -s */
static long sysno = SYS_getppid;
static const char *go_file;	/* -g */
static int in_main;		/* -m */

static void usage(void)
{
	fprintf(stderr, "usage: ppidloop [-t THREADS] [-n CALLS] [-f STOPFILE] [-g GOFILE] [-m] [-l] [-s]\n");
	exit(2);
}

static long number(const char *s)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v <= 0)
		usage();
	return v;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(w->cpu, &set);
	/* Best effort: without it the scheduler still spreads the threads. */
	sched_setaffinity(0, sizeof(set), &set);
	for (;;) {
		if (want_calls >= 0 ? w->calls == want_calls :
		    !(w->calls % 1024) && !access(stop_file, F_OK))
			break;
		/* The raw system call: no libc cache can answer it. */
		if (syscall(sysno, 0) != parent)
			w->wrong++;
		w->calls++;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	static struct worker workers[MAX_THREADS];
	long threads = 1, calls = 1, wrong = 0, cpus, i;
	int c;

	while ((c = getopt(argc, argv, "t:n:f:g:mls")) != -1) {
		switch (c) {
		case 's':
			sysno = SYS_getsid;
			break;
		case 'l':
			/* Threads inherit it. */
			errno = 0;
			if (nice(19) == -1 && errno) {
				perror("ppidloop: nice");
				return 2;
			}
			break;
		case 't':
			threads = number(optarg);
			break;
		case 'n':
			want_calls = number(optarg);
			break;
		case 'f':
			stop_file = optarg;
			break;
		case 'g':
			go_file = optarg;
			break;
		case 'm':
			in_main = 1;
			break;
		default:
			usage();
		}
	}
	if (optind != argc || threads > MAX_THREADS || (want_calls < 0) == !stop_file ||
	    (in_main && threads != 1))
		usage();
	while (go_file && access(go_file, F_OK))
		usleep(1000);
	parent = syscall(sysno, 0);
	if (in_main) {
		workers[0].cpu = 0;
		work(&workers[0]);
		calls += workers[0].calls;
		wrong += workers[0].wrong;
		printf("CALLS=%ld WRONG=%ld\n", calls, wrong);
		return wrong ? 1 : 0;
	}
	cpus = sysconf(_SC_NPROCESSORS_ONLN);
	if (cpus < 1)
		cpus = 1;
	for (i = 0; i < threads; i++) {
		workers[i].cpu = i % cpus;
		if (pthread_create(&workers[i].thread, NULL, work, &workers[i])) {
			perror("ppidloop: pthread_create");
			return 2;
		}
	}
	for (i = 0; i < threads; i++) {
		pthread_join(workers[i].thread, NULL);
		calls += workers[i].calls;
		wrong += workers[i].wrong;
	}
	printf("CALLS=%ld WRONG=%ld\n", calls, wrong);
	return wrong ? 1 : 0;
}
