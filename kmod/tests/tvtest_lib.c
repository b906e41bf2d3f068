// SPDX-License-Identifier: GPL-2.0
/*
 * The shared part of trapvec_test (tvtest.h): the check() reporter, ioctl wrappers, kallsyms
 * lookups, and the code of the getppid splice (trampoline and handler, assembled here).
 */
#include "tvtest.h"

int failures;
int checks;
int dev = -1;

void check(int ok, const char *fmt, ...)
{
	va_list ap;

	checks++;
	if (!ok)
		failures++;
	printf("%s %d - ", ok ? "ok" : "not ok", checks);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

int finish(void)
{
	printf("TRAPVEC-KMOD-TEST: %s (%d checks, %d failed)\n", failures ? "FAIL" : "PASS",
	       checks, failures);
	return failures ? 1 : 0;
}

void fatal(const char *what)
{
	printf("not ok - aborting: %s: %s\n", what, strerror(errno));
	failures++;
	exit(finish());
}

/* ioctl returning 0 or -errno. */
int tv(unsigned long cmd, void *arg)
{
	return ioctl(dev, cmd, arg) ? -errno : 0;
}

uint64_t ksym(const char *name)
{
	char line[512], sym[256], type;
	unsigned long long addr;
	FILE *f = fopen("/proc/kallsyms", "r");

	if (!f)
		fatal("/proc/kallsyms");
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %255s", &addr, &type, sym) == 3 && !strcmp(sym, name)) {
			fclose(f);
			return addr;
		}
	}
	fclose(f);
	printf("not ok - symbol %s not in /proc/kallsyms\n", name);
	failures++;
	exit(finish());
}

int kread(uint64_t addr, void *buf, uint32_t len)
{
	struct trapvec_read r = { .addr = addr, .buf = (uintptr_t)buf, .len = len };

	return tv(TRAPVEC_IOC_READ, &r);
}

/*
 * The bytes a function's entry takes before its first instruction of its own: an endbr64 where
 * the kernel is built for IBT (6.12), then the ftrace site (a 5-byte NOP, or the call it becomes
 * while traced). 5 on Debian's 6.1, 9 on its 6.12. b is the entry's first 9 bytes; with
 * nop_only, 0 unless the ftrace site is the NOP (a function ftrace does not trace now).
 */
uint32_t entry_len_of(const uint8_t *b, int nop_only)
{
	uint32_t n = memcmp(b, "\xf3\x0f\x1e\xfa", 4) ? 0 : 4;

	if (!memcmp(b + n, "\x0f\x1f\x44\x00\x00", 5) || (!nop_only && b[n] == 0xe8))
		return n + 5;
	return nop_only ? 0 : n;
}

/* entry_len_of() of the function at fn, read from its live text. */
uint32_t entry_len(uint64_t fn)
{
	uint8_t b[9];

	if (kread(fn, b, sizeof(b)))
		fatal("READ of a function's entry");
	return entry_len_of(b, 0);
}

uint32_t check_reason(uint64_t addr, uint32_t len)
{
	struct trapvec_check c = { .addr = addr, .len = len };
	int ret = tv(TRAPVEC_IOC_CHECK, &c);

	return ret ? 1000 + (uint32_t)-ret : c.reason;
}

int alloc_block(uint32_t kind, uint64_t size, struct trapvec_alloc *out)
{
	memset(out, 0, sizeof(*out));
	out->kind = kind;
	out->size = size;
	return tv(TRAPVEC_IOC_ALLOC, out);
}

int write_block(uint64_t id, uint64_t off, const void *bytes, uint32_t len)
{
	struct trapvec_write w = { .id = id, .offset = off, .buf = (uintptr_t)bytes, .len = len };

	return tv(TRAPVEC_IOC_WRITE, &w);
}

int block_op(unsigned long cmd, uint64_t id)
{
	struct trapvec_block b = { .id = id };

	return tv(cmd, &b);
}

int apply(struct trapvec_patch *p, uint32_t n, struct trapvec_apply *out)
{
	memset(out, 0, sizeof(*out));
	out->patches = (uintptr_t)p;
	out->count = n;
	return tv(TRAPVEC_IOC_APPLY, out);
}

int dispatch_add(struct trapvec_dispatch_entry *e, uint32_t n, uint32_t *failed)
{
	struct trapvec_dispatch_add a = { .entries = (uintptr_t)e, .count = n };
	int ret = tv(TRAPVEC_IOC_DISPATCH_ADD, &a);

	*failed = a.failed_index;
	return ret;
}

int dispatch_remove(uint64_t *sites, uint32_t n, uint32_t *failed)
{
	struct trapvec_dispatch_remove r = { .sites = (uintptr_t)sites, .count = n };
	int ret = tv(TRAPVEC_IOC_DISPATCH_REMOVE, &r);

	*failed = r.failed_index;
	return ret;
}

int hits(uint64_t site, struct trapvec_hits *h)
{
	memset(h, 0, sizeof(*h));
	h->site = site;
	return tv(TRAPVEC_IOC_HITS, h);
}

void put32(uint8_t *p, int64_t v)
{
	int32_t x = (int32_t)v;

	memcpy(p, &x, 4);
}

int64_t get32(const uint8_t *p)
{
	int32_t x;

	memcpy(&x, p, 4);
	return x;
}

void info(struct trapvec_info *i)
{
	memset(i, 0, sizeof(*i));
	if (tv(TRAPVEC_IOC_INFO, i))
		fatal("INFO");
}

void setup_splice(struct splice *s, uint64_t getppid)
{
	uint8_t code[64];
	uint8_t *t = code, *h = code + 32;
	uint64_t counter, flag;

	memset(code, 0xcc, sizeof(code));
	s->tramp = s->code.addr;
	s->handler = s->code.addr + 32;
	counter = s->data.addr;
	flag = s->data.addr + 8;

	/* Replay: push rbx; call callee; jmp site + 6. */
	t[0] = 0x53;
	t[1] = 0xe8;
	put32(t + 2, (int64_t)(s->callee - (s->tramp + 6)));
	t[6] = 0xe9;
	put32(t + 7, (int64_t)(s->site + 6 - (s->tramp + 11)));

	/* Handler: lock incq counter(%rip); cmpq $0, flag(%rip); je 1f; */
	h[0] = 0xf0; h[1] = 0x48; h[2] = 0xff; h[3] = 0x05;
	put32(h + 4, (int64_t)(counter - (s->handler + 8)));
	h[8] = 0x48; h[9] = 0x83; h[10] = 0x3d;
	put32(h + 11, (int64_t)(flag - (s->handler + 16)));
	h[15] = 0x00;
	h[16] = 0x74; h[17] = 0x07;
	/* xor %edi, %edi; call __x64_sys_getppid; 1: ret */
	h[18] = 0x31; h[19] = 0xff;
	h[20] = 0xe8;
	put32(h + 21, (int64_t)(getppid - (s->handler + 25)));
	h[25] = 0xc3;

	check(write_block(s->code.id, 0, code, sizeof(code)) == 0, "WRITE trampoline and handler");
}

double seconds(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void call_getppid(int n, pid_t want, const char *what)
{
	int i, wrong = 0;

	for (i = 0; i < n; i++)
		wrong += syscall(SYS_getppid) != want;
	check(!wrong, "%d getppid() calls %s return %d (%d wrong)", n, what, want, wrong);
}

/* Does the kernel log hold a line containing every one of the (up to 3) strings given? */
int dmesg_has(const char *a, const char *b, const char *c)
{
	static char log[1 << 20];
	char *line, *save;
	int n = klogctl(3, log, sizeof(log) - 1);	/* SYSLOG_ACTION_READ_ALL */

	if (n < 0)
		return 0;
	log[n] = 0;
	for (line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		if (strstr(line, a) && (!b || strstr(line, b)) && (!c || strstr(line, c)))
			return 1;
	return 0;
}
