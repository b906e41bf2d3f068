// SPDX-License-Identifier: GPL-2.0
/*
 * fentry_count - attach a minimal BPF fentry program to a kernel function, run a command, and
 * report how often the program ran: the BPF peer of trapvec's kernel benchmark
 * (vmtest/scenarios/peers.sh). Built static against libbpf (libbpf-dev, libelf-dev, zlib1g-dev):
 *
 *   cc -static -O2 -o fentry_count fentry_count.c -lbpf -lelf -lz
 *
 *   fentry_count [--empty | --comm] FUNCTION COMMAND [ARG...]
 *
 * The program is a handful of raw BPF instructions assembled here (no clang, no BPF object, no
 * skeleton): it adds 1 to the only u64 of a one-entry array map, the least a counting probe does
 * (the JIT inlines the array lookup). --empty loads `r0 = 0; exit` instead, the bare cost of the
 * BPF trampoline. --comm loads what bpftrace makes of `@[comm] = count()`: the task's comm
 * (bpf_get_current_comm) as the key of a hash map (16-byte keys, 8-byte values, 1024 entries),
 * whose value is looked up and incremented atomically, or inserted as 1 when the key is new: the
 * peer of `trapctl trace -e 'F { @[comm] = count() }'`, whose map is an open-addressed table
 * updated with atomics. The target is found by name in the kernel's BTF (/sys/kernel/btf/vmlinux);
 * the program is attached through a BPF link before COMMAND starts and detached after it ends.
 *
 * On stderr: `FENTRY_ATTACHED FUNCTION btf_id=N`, then `FENTRY_HITS=N` (counting programs: with
 * --comm the sum over the map, after one `FENTRY_COMM COMM=N` line per key).
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
	fprintf(stderr, "usage: fentry_count [--empty | --comm] FUNCTION COMMAND [ARG...]\n");
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

/* r = r10 + off, in two instructions. */
static size_t stack_pointer(struct bpf_insn *p, int reg, int off)
{
	p[0] = insn(BPF_ALU64 | BPF_MOV | BPF_X, reg, BPF_REG_10, 0, 0);
	p[1] = insn(BPF_ALU64 | BPF_ADD | BPF_K, reg, 0, 0, off);
	return 2;
}

/* r1 = the map: a 16-byte ld_imm64 with the map's fd, resolved by the verifier. */
static size_t map_pointer(struct bpf_insn *p, int map_fd)
{
	p[0] = insn(BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, map_fd);
	p[1] = insn(0, 0, 0, 0, 0);
	return 2;
}

/*
 * The comm-keyed counting program: key = comm (16 bytes at r10 - 16, zeroed first: the helper
 * copies the comm up to its NUL and leaves the stack's old bytes after it, so one comm would
 * make several keys, as a CI run saw: sysbench=22001 and sysbench=1); if the map has the key,
 * add 1 to its value atomically, else insert 1 (BPF_ANY, as bpftrace's count() does).
 * Returns the instruction count.
 */
static size_t comm_program(struct bpf_insn *p, int map_fd)
{
	size_t n = 0, skip_add, skip_insert;

	p[n++] = insn(BPF_ST | BPF_MEM | BPF_DW, BPF_REG_10, 0, -16, 0);
	p[n++] = insn(BPF_ST | BPF_MEM | BPF_DW, BPF_REG_10, 0, -8, 0);
	n += stack_pointer(p + n, BPF_REG_1, -16);
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_2, 0, 0, 16);
	p[n++] = insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_get_current_comm);
	n += stack_pointer(p + n, BPF_REG_2, -16);
	n += map_pointer(p + n, map_fd);
	p[n++] = insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
	/* if r0 == NULL goto insert (patched below) */
	skip_add = n;
	p[n++] = insn(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 0, 0);
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_1, 0, 0, 1);
	p[n++] = insn(BPF_STX | BPF_DW | BPF_ATOMIC, BPF_REG_0, BPF_REG_1, 0, BPF_ADD);
	/* goto out (patched below) */
	skip_insert = n;
	p[n++] = insn(BPF_JMP | BPF_JA, 0, 0, 0, 0);
	p[skip_add].off = n - skip_add - 1;
	/* insert: *(u64 *)(r10 - 24) = 1; bpf_map_update_elem(map, r10 - 16, r10 - 24, BPF_ANY) */
	p[n++] = insn(BPF_ST | BPF_MEM | BPF_DW, BPF_REG_10, 0, -24, 1);
	n += map_pointer(p + n, map_fd);
	n += stack_pointer(p + n, BPF_REG_2, -16);
	n += stack_pointer(p + n, BPF_REG_3, -24);
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_4, 0, 0, BPF_ANY);
	p[n++] = insn(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_update_elem);
	p[skip_insert].off = n - skip_insert - 1;
	/* out: return 0 */
	p[n++] = insn(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0);
	p[n++] = insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
	return n;
}

/* Print one FENTRY_COMM line per key of the comm map; their sum. */
static int report_comms(int map_fd, uint64_t *sum)
{
	char key[16], next[16];
	void *prev = NULL;
	uint64_t value;

	*sum = 0;
	while (!bpf_map_get_next_key(map_fd, prev, next)) {
		if (bpf_map_lookup_elem(map_fd, next, &value)) {
			fprintf(stderr, "fentry_count: reading the comm map: %s\n", strerror(errno));
			return -1;
		}
		fprintf(stderr, "FENTRY_COMM %.16s=%llu\n", next, (unsigned long long)value);
		*sum += value;
		memcpy(key, next, sizeof(key));
		prev = key;
	}
	return 0;
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
	struct bpf_insn prog[32];
	int empty = 0, comm = 0, map_fd = -1, prog_fd, link_fd, btf_id, status;
	const char *function;
	uint64_t hits = 0;
	uint32_t key = 0;
	size_t n;
	pid_t pid;

	if (argc > 1 && !strcmp(argv[1], "--empty")) {
		empty = 1;
		argv++;
		argc--;
	} else if (argc > 1 && !strcmp(argv[1], "--comm")) {
		comm = 1;
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
	} else if (comm) {
		map_fd = bpf_map_create(BPF_MAP_TYPE_HASH, "fentry_comm", 16, sizeof(hits), 1024, NULL);
		if (map_fd < 0) {
			fprintf(stderr, "fentry_count: creating the comm map: %s\n", strerror(errno));
			return 1;
		}
		n = comm_program(prog, map_fd);
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
	if (comm) {
		if (report_comms(map_fd, &hits))
			return 1;
		fprintf(stderr, "FENTRY_HITS=%llu\n", (unsigned long long)hits);
	} else if (!empty) {
		if (bpf_map_lookup_elem(map_fd, &key, &hits)) {
			fprintf(stderr, "fentry_count: reading the counter: %s\n", strerror(errno));
			return 1;
		}
		fprintf(stderr, "FENTRY_HITS=%llu\n", (unsigned long long)hits);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
