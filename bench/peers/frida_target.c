// SPDX-License-Identifier: GPL-2.0
/*
 * frida_target - the process Frida instruments in `bench peers` (bench/src/frida.rs), built by
 * `cc -O2` at run time and driven by frida_peer.py over its stdin and stdout.
 *
 *   frida_target FIXTURE.so MANY.so N ITERS ROUNDS
 *
 * FIXTURE.so is bench's fixture (the `bench_target` of `bench cost`'s jmp row) and MANY.so its
 * `f0 .. f{N-1}` (`bench batch`'s functions): the same bytes trapvec splices. Frida cannot
 * intercept bench_target (4 bytes, `lea eax,[rdi+1]; ret`), so the hit cost is f0's (9 bytes). At start it prints
 * `bench_target 0xADDR`, then `f 0xADDR` for each fi, then `ready`. Then, one command a line:
 *
 *   measure   ROUNDS rounds of ITERS calls of f0 (after a warm-up of min(ITERS, 100)
 *             calls), timed with rdtsc fenced by lfence on a pinned thread, as bench's timing.rs;
 *             prints `round CYCLES_PER_CALL` per round, then `done`
 *   callall   calls f0 .. f{N-1} once each (each returns x + 1; checked), prints `done`
 *   quit      exits 0
 *
 * Exit status: 0 after `quit` or at end of input, 1 on any error (with the reason on stderr).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

typedef int (*fn_t)(int);

static uint64_t now(void)
{
	uint64_t t;

	_mm_lfence();
	t = __rdtsc();
	_mm_lfence();
	return t;
}

static void *must_dlopen(const char *path)
{
	void *h = dlopen(path, RTLD_NOW);

	if (!h) {
		fprintf(stderr, "frida_target: dlopen %s: %s\n", path, dlerror());
		exit(1);
	}
	return h;
}

static fn_t must_sym(void *h, const char *name)
{
	void *p = dlsym(h, name);

	if (!p) {
		fprintf(stderr, "frida_target: no symbol %s\n", name);
		exit(1);
	}
	return (fn_t)p;
}

static void pin(void)
{
	cpu_set_t set;
	int cpu = sched_getcpu();

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
}

int main(int argc, char **argv)
{
	fn_t volatile target, first;
	fn_t *many;
	long n, iters, rounds, i, r;
	char line[64], name[32];
	void *fixture, *lib;

	if (argc != 6) {
		fprintf(stderr, "usage: frida_target FIXTURE.so MANY.so N ITERS ROUNDS\n");
		return 1;
	}
	n = atol(argv[3]);
	iters = atol(argv[4]);
	rounds = atol(argv[5]);
	if (n < 1 || iters <= 0 || rounds <= 0) {
		fprintf(stderr, "frida_target: bad N, ITERS or ROUNDS\n");
		return 1;
	}
	fixture = must_dlopen(argv[1]);
	lib = must_dlopen(argv[2]);
	target = must_sym(fixture, "bench_target");
	many = calloc(n, sizeof(*many));
	if (!many)
		return 1;
	printf("bench_target %p\n", (void *)target);
	for (i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "f%ld", i);
		many[i] = must_sym(lib, name);
		printf("f %p\n", (void *)many[i]);
	}
	first = many[0];
	printf("ready\n");
	fflush(stdout);
	pin();

	while (fgets(line, sizeof(line), stdin)) {
		if (!strcmp(line, "measure\n")) {
			for (i = 0; i < (iters < 100 ? iters : 100); i++)
				first(1);
			for (r = 0; r < rounds; r++) {
				uint64_t t0 = now();

				for (i = 0; i < iters; i++)
					first(1);
				printf("round %.2f\n", (double)(now() - t0) / (double)iters);
			}
		} else if (!strcmp(line, "callall\n")) {
			for (i = 0; i < n; i++) {
				if (many[i](41) != 42) {
					fprintf(stderr, "frida_target: f%ld(41) returned %d\n", i, many[i](41));
					return 1;
				}
			}
		} else if (!strcmp(line, "quit\n")) {
			return 0;
		} else {
			fprintf(stderr, "frida_target: unknown command %s", line);
			return 1;
		}
		printf("done\n");
		fflush(stdout);
	}
	return 0;
}
