// SPDX-License-Identifier: GPL-2.0
/*
 * fentry_count - attach a minimal BPF fentry program to a kernel function, run a command, and
 * report how often the program ran: the BPF peer of trapvec's kernel benchmark
 * (vmtest/scenarios/peers.sh). Built static against libbpf (libbpf-dev, libelf-dev, zlib1g-dev):
 *
 *   cc -static -O2 -o fentry_count fentry_count.c -lbpf -lelf -lz
 *
 *   fentry_count [--empty] FUNCTION COMMAND [ARG...]
 *
 * The program is a handful of raw BPF instructions assembled here (no clang, no BPF object, no
 * skeleton): it adds 1 to the only u64 of a one-entry array map, the least a counting probe does
 * (the JIT inlines the array lookup). --empty loads `r0 = 0; exit` instead, the bare cost of the
 * BPF trampoline. The target is found by name in the kernel's BTF (/sys/kernel/btf/vmlinux);
 * the program is attached through a BPF link before COMMAND starts and detached after it ends.
 *
 * On stderr: `FENTRY_ATTACHED FUNCTION btf_id=N`, then `FENTRY_HITS=N` (counting program only).
 * COMMAND's own output passes through. Exit status: COMMAND's, or 1 when the program cannot be
 * loaded or attached (with the verifier's log), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/bpf.h>

static char verifier_log[64 * 1024];

static void usage(void)
{
	fprintf(stderr, "usage: fentry_count [--empty] FUNCTION COMMAND [ARG...]\n");
	exit(2);
}

static struct bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm)
{
	struct bpf_insn i = { .code = code, .dst_reg = dst, .src_reg = src, .off = off, .imm = imm };

	return i;
}

/* The counting program: counter[0] += 1 (atomic), return 0. Returns the instruction count. */
static size_t counting_program(struct bpf_insn *p, int map_fd)
{
	size_t n = 0;

	/* *(u32 *)(r10 - 4) = 0: the key, on the BPF stack */
	p[n++] = insn(BPF_ST | BPF_MEM | BPF_W, BPF_REG_10, 0, -4, 0);
	/* r2 = r10 - 4 */
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0);
	p[n++] = insn(BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4);
	/* r1 = the map (a 16-byte ld_imm64 with the map's fd, resolved by the verifier) */
	p[n++] = insn(BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, map_fd);
	p[n++] = insn(0, 0, 0, 0, 0);
	/* r0 = bpf_map_lookup_elem(r1, r2) */
	p[n++] = insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
	/* if r0 == NULL skip the add (the verifier insists; an array lookup of key 0 never fails) */
	p[n++] = insn(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 2, 0);
	/* r1 = 1; lock *(u64 *)(r0 + 0) += r1 */
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_1, 0, 0, 1);
	p[n++] = insn(BPF_STX | BPF_DW | BPF_ATOMIC, BPF_REG_0, BPF_REG_1, 0, BPF_ADD);
	/* return 0 */
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

int main(int argc, char **argv)
{
	LIBBPF_OPTS(bpf_prog_load_opts, load);
	struct bpf_insn prog[16];
	int empty = 0, map_fd = -1, prog_fd, link_fd, btf_id, status;
	const char *function;
	uint64_t hits = 0;
	uint32_t key = 0;
	size_t n;
	pid_t pid;

	if (argc > 1 && !strcmp(argv[1], "--empty")) {
		empty = 1;
		argv++;
		argc--;
	}
	if (argc < 3)
		usage();
	function = argv[1];

	btf_id = libbpf_find_vmlinux_btf_id(function, BPF_TRACE_FENTRY);
	if (btf_id < 0) {
		fprintf(stderr, "fentry_count: %s is not a function of the kernel's BTF: %s\n", function,
			strerror(-btf_id));
		return 1;
	}
	if (empty) {
		n = empty_program(prog);
	} else {
		map_fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "fentry_hits", sizeof(key), sizeof(hits), 1,
					NULL);
		if (map_fd < 0) {
			fprintf(stderr, "fentry_count: creating the counter map: %s\n", strerror(errno));
			return 1;
		}
		n = counting_program(prog, map_fd);
	}
	load.expected_attach_type = BPF_TRACE_FENTRY;
	load.attach_btf_id = btf_id;
	load.log_buf = verifier_log;
	load.log_size = sizeof(verifier_log);
	load.log_level = 1;
	prog_fd = bpf_prog_load(BPF_PROG_TYPE_TRACING, "fentry_count", "GPL", prog, n, &load);
	if (prog_fd < 0) {
		fprintf(stderr, "fentry_count: loading the program for %s: %s\n%s\n", function,
			strerror(errno), verifier_log);
		return 1;
	}
	link_fd = bpf_link_create(prog_fd, 0, BPF_TRACE_FENTRY, NULL);
	if (link_fd < 0) {
		fprintf(stderr, "fentry_count: attaching to %s: %s\n", function, strerror(errno));
		return 1;
	}
	fprintf(stderr, "FENTRY_ATTACHED %s btf_id=%d\n", function, btf_id);
	fflush(stderr);

	pid = fork();
	if (pid < 0) {
		perror("fentry_count: fork");
		return 1;
	}
	if (pid == 0) {
		close(link_fd);
		close(prog_fd);
		if (map_fd >= 0)
			close(map_fd);
		execvp(argv[2], argv + 2);
		fprintf(stderr, "fentry_count: running %s: %s\n", argv[2], strerror(errno));
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0) {
		perror("fentry_count: waitpid");
		return 1;
	}
	/* Detach first: the count read afterwards is final. */
	close(link_fd);
	if (!empty) {
		if (bpf_map_lookup_elem(map_fd, &key, &hits)) {
			fprintf(stderr, "fentry_count: reading the counter: %s\n", strerror(errno));
			return 1;
		}
		fprintf(stderr, "FENTRY_HITS=%llu\n", (unsigned long long)hits);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
