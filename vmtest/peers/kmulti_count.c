// SPDX-License-Identifier: GPL-2.0
/*
 * kmulti_count - attach one minimal BPF kprobe_multi program to many kernel functions at once
 * (an fprobe: one ftrace_ops over all of them, CONFIG_FPROBE, Linux 5.18 and later), run a
 * command, and report how long the attach and the detach took and how often the program ran:
 * the mass-attach peer of trapvec's batch (vmtest/scenarios/peers.sh). Built static against
 * libbpf like fentry_count.c:
 *
 *   cc -static -O2 -o kmulti_count kmulti_count.c -lbpf -lelf -lz
 *
 *   kmulti_count [--empty] FUNCTION COMMAND [ARG...]
 *   kmulti_count [--empty] --syms FILE COMMAND [ARG...]     (FILE: one function name a line)
 *
 * The program is assembled here from raw BPF instructions: it adds 1 to the only u64 of a
 * one-entry array map (the same counting program as fentry_count's), or with --empty it is
 * `r0 = 0; exit`. It is loaded as BPF_PROG_TYPE_KPROBE with the expected attach type
 * BPF_TRACE_KPROBE_MULTI and attached by name (kprobe_multi.syms of bpf_link_create(), which
 * the kernel resolves through kallsyms) before COMMAND starts; closing the link's only file
 * descriptor after COMMAND ends detaches it (unregister_fprobe(), synchronously).
 *
 * On stderr: `KMULTI_ATTACHED n=N attach_ns=NS`, then after COMMAND `KMULTI_DETACH_NS=NS` and,
 * for the counting program, `KMULTI_HITS=N` (read before the detach). Times are CLOCK_MONOTONIC
 * around the one system call. COMMAND's own output passes through. Exit status: COMMAND's, or 1
 * when the program cannot be loaded or attached (kernels without CONFIG_FPROBE say so with
 * EOPNOTSUPP), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>

static char verifier_log[64 * 1024];

static void usage(void)
{
	fprintf(stderr, "usage: kmulti_count [--empty] (FUNCTION | --syms FILE) COMMAND [ARG...]\n");
	exit(2);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm)
{
	struct bpf_insn i = { .code = code, .dst_reg = dst, .src_reg = src, .off = off, .imm = imm };

	return i;
}

/* counter[0] += 1 (atomic), return 0. Returns the instruction count. */
static size_t counting_program(struct bpf_insn *p, int map_fd)
{
	size_t n = 0;

	/* *(u32 *)(r10 - 4) = 0: the key, on the BPF stack; r2 = r10 - 4 */
	p[n++] = insn(BPF_ST | BPF_MEM | BPF_W, BPF_REG_10, 0, -4, 0);
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0);
	p[n++] = insn(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4);
	/* r1 = the map (ld_imm64 of its fd); r0 = bpf_map_lookup_elem(r1, r2) */
	p[n++] = insn(BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, map_fd);
	p[n++] = insn(0, 0, 0, 0, 0);
	p[n++] = insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
	/* the verifier wants the NULL check an array lookup of key 0 never needs */
	p[n++] = insn(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 2, 0);
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_1, 0, 0, 1);
	p[n++] = insn(BPF_STX | BPF_DW | BPF_ATOMIC, BPF_REG_0, BPF_REG_1, 0, BPF_ADD);
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0);
	p[n++] = insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
	return n;
}

static size_t empty_program(struct bpf_insn *p)
{
	p[0] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0);
	p[1] = insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
	return 2;
}

/* The names of `path`, one a line (blank lines skipped), in *out; returns how many, or exits. */
static size_t read_syms(const char *path, char ***out)
{
	size_t n = 0, cap = 1024, len = 0;
	char **syms = malloc(cap * sizeof(*syms));
	char *line = NULL;
	FILE *f = fopen(path, "r");
	ssize_t got;

	if (!f || !syms) {
		fprintf(stderr, "kmulti_count: reading %s: %s\n", path, strerror(errno));
		exit(1);
	}
	while ((got = getline(&line, &len, f)) > 0) {
		while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == ' '))
			line[--got] = '\0';
		if (!got)
			continue;
		if (n == cap) {
			cap *= 2;
			syms = realloc(syms, cap * sizeof(*syms));
			if (!syms) {
				fprintf(stderr, "kmulti_count: out of memory\n");
				exit(1);
			}
		}
		syms[n] = strdup(line);
		if (!syms[n++]) {
			fprintf(stderr, "kmulti_count: out of memory\n");
			exit(1);
		}
	}
	free(line);
	fclose(f);
	*out = syms;
	return n;
}

int main(int argc, char **argv)
{
	LIBBPF_OPTS(bpf_prog_load_opts, load);
	LIBBPF_OPTS(bpf_link_create_opts, attach);
	struct bpf_insn prog[16];
	int empty = 0, map_fd = -1, prog_fd, link_fd, status;
	uint64_t hits = 0, t0, attach_ns, detach_ns;
	char **syms;
	uint32_t key = 0;
	size_t n, nsyms;
	pid_t pid;

	if (argc > 1 && !strcmp(argv[1], "--empty")) {
		empty = 1;
		argv++;
		argc--;
	}
	if (argc > 2 && !strcmp(argv[1], "--syms")) {
		nsyms = read_syms(argv[2], &syms);
		argv++;
		argc--;
	} else if (argc > 1) {
		syms = &argv[1];
		nsyms = 1;
	} else {
		usage();
	}
	if (argc < 3 || !nsyms)
		usage();

	if (empty) {
		n = empty_program(prog);
	} else {
		map_fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "kmulti_hits", sizeof(key), sizeof(hits), 1,
					NULL);
		if (map_fd < 0) {
			fprintf(stderr, "kmulti_count: creating the counter map: %s\n", strerror(errno));
			return 1;
		}
		n = counting_program(prog, map_fd);
	}
	load.expected_attach_type = BPF_TRACE_KPROBE_MULTI;
	load.log_buf = verifier_log;
	load.log_size = sizeof(verifier_log);
	load.log_level = 1;
	prog_fd = bpf_prog_load(BPF_PROG_TYPE_KPROBE, "kmulti_count", "GPL", prog, n, &load);
	if (prog_fd < 0) {
		fprintf(stderr, "kmulti_count: loading the program: %s\n%s\n", strerror(errno),
			verifier_log);
		return 1;
	}
	attach.kprobe_multi.syms = (const char **)syms;
	attach.kprobe_multi.cnt = nsyms;
	t0 = now_ns();
	link_fd = bpf_link_create(prog_fd, 0, BPF_TRACE_KPROBE_MULTI, &attach);
	attach_ns = now_ns() - t0;
	if (link_fd < 0) {
		fprintf(stderr, "kmulti_count: attaching to %zu functions (%s, ...): %s\n", nsyms,
			syms[0], strerror(errno));
		return 1;
	}
	fprintf(stderr, "KMULTI_ATTACHED n=%zu attach_ns=%llu\n", nsyms,
		(unsigned long long)attach_ns);
	fflush(stderr);

	pid = fork();
	if (pid < 0) {
		perror("kmulti_count: fork");
		return 1;
	}
	if (pid == 0) {
		close(link_fd);
		close(prog_fd);
		if (map_fd >= 0)
			close(map_fd);
		execvp(argv[2], argv + 2);
		fprintf(stderr, "kmulti_count: running %s: %s\n", argv[2], strerror(errno));
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0) {
		perror("kmulti_count: waitpid");
		return 1;
	}
	if (map_fd >= 0 && bpf_map_lookup_elem(map_fd, &key, &hits)) {
		fprintf(stderr, "kmulti_count: reading the counter: %s\n", strerror(errno));
		return 1;
	}
	/* The link's last reference: its release unregisters the fprobe before close returns. */
	t0 = now_ns();
	close(link_fd);
	detach_ns = now_ns() - t0;
	fprintf(stderr, "KMULTI_DETACH_NS=%llu\n", (unsigned long long)detach_ns);
	if (map_fd >= 0)
		fprintf(stderr, "KMULTI_HITS=%llu\n", (unsigned long long)hits);
	close(prog_fd);
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}
