// SPDX-License-Identifier: GPL-2.0
/*
 * hiddentargets - list the branch targets of the core kernel that no decoder sees: the target
 * of every jump label (__start___jump_table..__stop___jump_table) and the fix-up of every
 * exception-table entry (__start___ex_table..__stop___ex_table), read through trapvec's READ
 * (/dev/trapvec), for the scenario that checks trapvec refuses windows over them.
 *
 *   hiddentargets [-j | -x] [-k PREFIX]
 *
 * Prints one line per target inside core kernel text (_stext.._etext), sorted by address:
 *
 *   jump FUNCTION+0xOFF KEY+0xOFF      a jump label's target and its static key
 *   fixup FUNCTION+0xOFF INSN+0xOFF    an exception fix-up and the faulting instruction
 *
 * with places as the kernel's %pS prints them (nearest symbol at or before). -j: jump labels
 * only; -x: fix-ups only; -k: only jump labels whose key's symbol starts with PREFIX
 * (e.g. __tracepoint_, whose keys a tracefs event's enable file flips).
 *
 * Exit status: 0, 1 when a table cannot be read, 2 on bad usage or setup failure.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "../../kmod/trapvec_abi.h"

struct sym {
	uint64_t addr;
	char type;
	char *name;
};

static struct sym *syms;
static size_t nsyms;

static int sym_cmp(const void *a, const void *b)
{
	const struct sym *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* /proc/kallsyms of the core kernel (module symbols carry a [module] column: skipped). */
static int load_kallsyms(void)
{
	FILE *f = fopen("/proc/kallsyms", "r");
	char line[512];
	size_t cap = 0;

	if (!f) {
		perror("/proc/kallsyms");
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		unsigned long long addr;
		char type, name[256], extra[64];
		int n = sscanf(line, "%llx %c %255s %63s", &addr, &type, name, extra);

		if (n != 3 || !addr)
			continue;
		if (nsyms == cap) {
			cap = cap ? 2 * cap : 65536;
			syms = realloc(syms, cap * sizeof(*syms));
			if (!syms) {
				perror("realloc");
				return -1;
			}
		}
		syms[nsyms].addr = addr;
		syms[nsyms].type = type;
		syms[nsyms].name = strdup(name);
		if (!syms[nsyms].name) {
			perror("strdup");
			return -1;
		}
		nsyms++;
	}
	fclose(f);
	qsort(syms, nsyms, sizeof(*syms), sym_cmp);
	return 0;
}

static uint64_t sym_addr(const char *name)
{
	for (size_t i = 0; i < nsyms; i++)
		if (!strcmp(syms[i].name, name))
			return syms[i].addr;
	return 0;
}

/* The last symbol at or before addr; text only when text is set. */
static const struct sym *sym_before(uint64_t addr, int text)
{
	size_t lo = 0, hi = nsyms;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (syms[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	while (lo-- > 0)
		if (!text || syms[lo].type == 't' || syms[lo].type == 'T')
			return &syms[lo];
	return NULL;
}

static void place(char *out, size_t size, uint64_t addr, int text)
{
	const struct sym *s = sym_before(addr, text);

	if (!s)
		snprintf(out, size, "0x%llx", (unsigned long long)addr);
	else if (s->addr == addr)
		snprintf(out, size, "%s", s->name);
	else
		snprintf(out, size, "%s+0x%llx", s->name, (unsigned long long)(addr - s->addr));
}

/* The kernel table [start, end) through READ, or NULL. */
static unsigned char *read_table(int fd, uint64_t start, uint64_t end)
{
	unsigned char *buf = malloc(end - start);
	uint64_t done, chunk;

	if (!buf)
		return NULL;
	for (done = 0; done < end - start; done += chunk) {
		struct trapvec_read r;

		chunk = end - start - done;
		if (chunk > TRAPVEC_XFER_MAX)
			chunk = TRAPVEC_XFER_MAX;
		memset(&r, 0, sizeof(r));
		r.addr = start + done;
		r.buf = (uint64_t)(uintptr_t)(buf + done);
		r.len = (uint32_t)chunk;
		if (ioctl(fd, TRAPVEC_IOC_READ, &r)) {
			perror("READ");
			free(buf);
			return NULL;
		}
	}
	return buf;
}

static int32_t s32_at(const unsigned char *p)
{
	int32_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

struct hit {
	uint64_t addr;
	uint64_t other;	/* the key, or the faulting instruction */
	int jump;
};

static int hit_cmp(const void *a, const void *b)
{
	const struct hit *x = a, *y = b;

	return x->addr < y->addr ? -1 : x->addr > y->addr;
}

int main(int argc, char **argv)
{
	uint64_t stext, etext, jt0, jt1, ex0, ex1, i;
	int opt, jumps = 1, fixups = 1, fd;
	const char *prefix = NULL;
	unsigned char *jt, *ex;
	struct hit *hits;
	size_t nhits = 0;

	while ((opt = getopt(argc, argv, "jxk:")) != -1) {
		switch (opt) {
		case 'j':
			fixups = 0;
			break;
		case 'x':
			jumps = 0;
			break;
		case 'k':
			prefix = optarg;
			break;
		default:
			fprintf(stderr, "usage: hiddentargets [-j | -x] [-k PREFIX]\n");
			return 2;
		}
	}
	if (load_kallsyms())
		return 2;
	stext = sym_addr("_stext");
	etext = sym_addr("_etext");
	jt0 = sym_addr("__start___jump_table");
	jt1 = sym_addr("__stop___jump_table");
	ex0 = sym_addr("__start___ex_table");
	ex1 = sym_addr("__stop___ex_table");
	if (!stext || !etext || !jt0 || !jt1 || !ex0 || !ex1 || jt1 < jt0 || ex1 < ex0) {
		fprintf(stderr, "hiddentargets: kernel symbols missing (run as root)\n");
		return 2;
	}
	fd = open("/dev/trapvec", O_RDWR);
	if (fd < 0) {
		perror("/dev/trapvec");
		return 2;
	}
	jt = read_table(fd, jt0, jt1);
	ex = read_table(fd, ex0, ex1);
	if (!jt || !ex)
		return 1;
	hits = calloc((jt1 - jt0) / 16 + (ex1 - ex0) / 12 + 1, sizeof(*hits));
	if (!hits)
		return 2;
	/* struct jump_entry: s32 code, s32 target, s64 key (low 2 bits: flags), all relative. */
	for (i = 0; jumps && i + 16 <= jt1 - jt0; i += 16) {
		uint64_t entry = jt0 + i, target, key;
		int64_t rel_key;

		memcpy(&rel_key, jt + i + 8, sizeof(rel_key));
		if (rel_key & 2)
			continue;	/* init text: gone */
		target = entry + 4 + (int64_t)s32_at(jt + i + 4);
		key = (entry + 8 + rel_key) & ~3ULL;
		if (target < stext || target >= etext)
			continue;
		if (prefix) {
			const struct sym *s = sym_before(key, 0);

			if (!s || strncmp(s->name, prefix, strlen(prefix)))
				continue;
		}
		hits[nhits++] = (struct hit){ target, key, 1 };
	}
	/* struct exception_table_entry: s32 insn, s32 fixup, s32 data; insn, fixup relative. */
	for (i = 0; fixups && i + 12 <= ex1 - ex0; i += 12) {
		uint64_t entry = ex0 + i;
		uint64_t insn = entry + (int64_t)s32_at(ex + i);
		uint64_t fixup = entry + 4 + (int64_t)s32_at(ex + i + 4);

		if (fixup < stext || fixup >= etext)
			continue;
		hits[nhits++] = (struct hit){ fixup, insn, 0 };
	}
	qsort(hits, nhits, sizeof(*hits), hit_cmp);
	for (i = 0; i < nhits; i++) {
		char a[192], b[192];

		place(a, sizeof(a), hits[i].addr, 1);
		place(b, sizeof(b), hits[i].other, !hits[i].jump);
		printf("%s %s %s\n", hits[i].jump ? "jump" : "fixup", a, b);
	}
	return 0;
}
