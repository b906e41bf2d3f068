// SPDX-License-Identifier: GPL-2.0
/*
 * trapvec_test - drives /dev/trapvec in a VM running the real kernel, as root.
 *
 *   trapvec_test [--leave-live STATE]   the suite; with --leave-live, finish with a splice of
 *                                       __x64_sys_getppid live and record in STATE what
 *                                       the text and the gate were
 *   trapvec_test --after-reload STATE   after rmmod + insmod: the text and the gate are back
 *
 * The splice: a trap (CD F5) at __x64_sys_getppid+5, past the ftrace NOP, over
 * "push rbx; call rel32" (53 e8 ..): the trap displaces both, so the replay trampoline in
 * the code arena is "push rbx; call <callee>; jmp getppid+11", assembled here with the call
 * retargeted. A handler (also assembled here) counts its calls in a data block and, when a
 * flag in that block is set, calls __x64_sys_getppid itself: that nested trap must skip the
 * handler and count as missed.
 *
 * Output is one line per check ("ok"/"not ok") and a last line TRAPVEC-KMOD-TEST: PASS|FAIL;
 * the exit status is 0 only on PASS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trapvec_abi.h"

#define NOBODY 65534
#define CALLS 1000
#define NESTED_CALLS 100
#define STRESS_CYCLES 200
#define BIG_BATCH 1000

static int failures;
static int checks;
static int dev = -1;

static void check(int ok, const char *fmt, ...)
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

static int finish(void)
{
	printf("TRAPVEC-KMOD-TEST: %s (%d checks, %d failed)\n", failures ? "FAIL" : "PASS",
	       checks, failures);
	return failures ? 1 : 0;
}

static void fatal(const char *what)
{
	printf("not ok - aborting: %s: %s\n", what, strerror(errno));
	failures++;
	exit(finish());
}

/* ioctl returning 0 or -errno. */
static int tv(unsigned long cmd, void *arg)
{
	return ioctl(dev, cmd, arg) ? -errno : 0;
}

static uint64_t ksym(const char *name)
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

static int kread(uint64_t addr, void *buf, uint32_t len)
{
	struct trapvec_read r = { .addr = addr, .buf = (uintptr_t)buf, .len = len };

	return tv(TRAPVEC_IOC_READ, &r);
}

static uint32_t check_reason(uint64_t addr, uint32_t len)
{
	struct trapvec_check c = { .addr = addr, .len = len };
	int ret = tv(TRAPVEC_IOC_CHECK, &c);

	return ret ? 1000 + (uint32_t)-ret : c.reason;
}

static int alloc_block(uint32_t kind, uint64_t size, struct trapvec_alloc *out)
{
	memset(out, 0, sizeof(*out));
	out->kind = kind;
	out->size = size;
	return tv(TRAPVEC_IOC_ALLOC, out);
}

static int write_block(uint64_t id, uint64_t off, const void *bytes, uint32_t len)
{
	struct trapvec_write w = { .id = id, .offset = off, .buf = (uintptr_t)bytes, .len = len };

	return tv(TRAPVEC_IOC_WRITE, &w);
}

static int block_op(unsigned long cmd, uint64_t id)
{
	struct trapvec_block b = { .id = id };

	return tv(cmd, &b);
}

static int apply(struct trapvec_patch *p, uint32_t n, struct trapvec_apply *out)
{
	memset(out, 0, sizeof(*out));
	out->patches = (uintptr_t)p;
	out->count = n;
	return tv(TRAPVEC_IOC_APPLY, out);
}

static int dispatch_add(struct trapvec_dispatch_entry *e, uint32_t n, uint32_t *failed)
{
	struct trapvec_dispatch_add a = { .entries = (uintptr_t)e, .count = n };
	int ret = tv(TRAPVEC_IOC_DISPATCH_ADD, &a);

	*failed = a.failed_index;
	return ret;
}

static int dispatch_remove(uint64_t *sites, uint32_t n, uint32_t *failed)
{
	struct trapvec_dispatch_remove r = { .sites = (uintptr_t)sites, .count = n };
	int ret = tv(TRAPVEC_IOC_DISPATCH_REMOVE, &r);

	*failed = r.failed_index;
	return ret;
}

static int hits(uint64_t site, struct trapvec_hits *h)
{
	memset(h, 0, sizeof(*h));
	h->site = site;
	return tv(TRAPVEC_IOC_HITS, h);
}

static void put32(uint8_t *p, int64_t v)
{
	int32_t x = (int32_t)v;

	memcpy(p, &x, 4);
}

static int64_t get32(const uint8_t *p)
{
	int32_t x;

	memcpy(&x, p, 4);
	return x;
}

static void info(struct trapvec_info *i)
{
	memset(i, 0, sizeof(*i));
	if (tv(TRAPVEC_IOC_INFO, i))
		fatal("INFO");
}

/* Everything the splice needs, found or built by setup_splice(). */
struct splice {
	uint64_t site;			/* __x64_sys_getppid + 5 */
	uint8_t orig[16];		/* __x64_sys_getppid + 0..15 before anything */
	uint64_t callee;
	struct trapvec_alloc code;	/* trampoline at +0, handler at +32 */
	struct trapvec_alloc data;	/* counter at +0, flag at +8 */
	uint64_t tramp, handler;
};

static void setup_splice(struct splice *s, uint64_t getppid)
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

/*
 * CHECK a patch of len bytes at the address of each of the first 400 entries of a kernel
 * table (its first field is an address relative to itself): none may be accepted, and some
 * must be refused for the table's reason (others fall in entry or noinstr text first).
 */
static void refuse_table(const char *first, const char *last, uint32_t size, uint32_t len,
			 uint32_t reason, const char *what)
{
	uint64_t a, start = ksym(first), stop = ksym(last);
	int i, found = 0, accepted = 0;
	int32_t disp;

	for (i = 0, a = start; a + size <= stop && i < 400; a += size, i++) {
		uint32_t r;

		if (kread(a, &disp, 4))
			fatal(first);
		r = check_reason(a + (uint64_t)(int64_t)disp, len);
		found += r == reason;
		accepted += r == TRAPVEC_REASON_NONE;
	}
	check(found > 0 && !accepted, "CHECK of %d %s: %d refused for the table's reason, %d accepted",
	      i, what, found, accepted);
}

/*
 * Every write goes int3 first, and a CPU that meets our CC is sent where the patch leads: a
 * patch that changes bytes without being a trap or a jmp has nowhere to send it, even over
 * one instruction (here `push rbx`, one byte, made a nop).
 */
static void test_not_a_jump(uint64_t getppid)
{
	struct trapvec_patch p = { .addr = getppid + 5, .len = 1 };
	struct trapvec_apply res;
	uint8_t now = 0;
	int ret;

	if (kread(p.addr, p.old_bytes, 1)) {
		check(0, "READ __x64_sys_getppid+5");
		return;
	}
	p.new_bytes[0] = 0x90;
	ret = apply(&p, 1, &res);
	check(ret == -EINVAL && res.reason == TRAPVEC_REASON_NOT_A_JUMP,
	      "APPLY of a one-instruction rewrite that is neither a trap nor a jmp is refused: NOT_A_JUMP (%d, reason %u)",
	      ret, res.reason);
	if (!ret) {
		/* Put it back before anything calls getppid() with its push gone. */
		memcpy(p.new_bytes, p.old_bytes, 1);
		p.old_bytes[0] = 0x90;
		apply(&p, 1, &res);
	}
	ret = kread(getppid + 5, &now, 1);
	check(ret == 0 && now == 0x53, "__x64_sys_getppid+5 still holds push rbx (%02x)", now);
}

static void test_refusals(uint64_t getppid, const struct trapvec_info *in)
{
	struct trapvec_check c = {};

	check(check_reason(getppid, 2) == TRAPVEC_REASON_FTRACE,
	      "CHECK __x64_sys_getppid+0 (the fentry NOP) is refused: FTRACE");
	check(check_reason(getppid + 5, 2) == TRAPVEC_REASON_NONE,
	      "CHECK __x64_sys_getppid+5 is accepted");
	c.addr = getppid + 5;
	c.len = 2;
	c.flags = TRAPVEC_CHECK_NO_KPROBE;
	check(tv(TRAPVEC_IOC_CHECK, &c) == 0 && c.reason == TRAPVEC_REASON_NONE,
	      "CHECK without the kprobe cross-check accepts it too");
	c.flags = 2;
	check(tv(TRAPVEC_IOC_CHECK, &c) == -EINVAL, "CHECK with an unknown flag fails (EINVAL)");
	check(check_reason(getppid + 7, 2) == TRAPVEC_REASON_NOT_BOUNDARY,
	      "CHECK __x64_sys_getppid+7 (inside the call) is refused: NOT_BOUNDARY");
	check(check_reason(getppid + 5, 0) == TRAPVEC_REASON_BAD_LENGTH,
	      "CHECK with length 0 is refused: BAD_LENGTH");
	check(check_reason(ksym("entry_SYSCALL_64"), 2) == TRAPVEC_REASON_ENTRY_TEXT,
	      "CHECK entry_SYSCALL_64 is refused: ENTRY_TEXT");
	check(check_reason(ksym("__noinstr_text_start"), 2) == TRAPVEC_REASON_NOINSTR_TEXT,
	      "CHECK noinstr text is refused: NOINSTR_TEXT");
	check(check_reason(ksym("__x86_return_thunk"), 1) == TRAPVEC_REASON_THUNK,
	      "CHECK __x86_return_thunk is refused: THUNK");
	check(check_reason(ksym("kprobe_int3_handler"), 2) == TRAPVEC_REASON_KPROBE_BLACKLIST,
	      "CHECK kprobe_int3_handler is refused: KPROBE_BLACKLIST");
	check(check_reason(in->code_base, 2) == TRAPVEC_REASON_OWN_MODULE,
	      "CHECK the module's own code arena is refused: OWN_MODULE");
	check(check_reason(0x400000, 2) == TRAPVEC_REASON_NOT_TEXT,
	      "CHECK a user address is refused: NOT_TEXT");

	refuse_table("__start___ex_table", "__stop___ex_table", 12, 1, TRAPVEC_REASON_EXTABLE,
		     "exception-table instructions");
	refuse_table("__start___jump_table", "__stop___jump_table", 16, 2,
		     TRAPVEC_REASON_JUMP_LABEL, "jump-label sites");
	refuse_table("__start_static_call_sites", "__stop_static_call_sites", 8, 2,
		     TRAPVEC_REASON_STATIC_CALL, "static-call sites");
	refuse_table("__start___bug_table", "__stop___bug_table", 12, 2,
		     TRAPVEC_REASON_BUG_ENTRY, "BUG/WARN sites");
}

static void test_user_int(void)
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		fatal("fork");
	if (!pid) {
		asm volatile("int $0xf5");
		_exit(0);
	}
	waitpid(pid, &status, 0);
	check(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
	      "a user-mode int $0xf5 still raises #GP (SIGSEGV)");
}

static void test_nonroot(void)
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		fatal("fork");
	if (!pid) {
		struct trapvec_info i;
		int bad = 0;

		if (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) ||
		    setresuid(NOBODY, NOBODY, NOBODY))
			_exit(10);
		/* An fd opened by root, used without CAP_SYS_MODULE. */
		if (ioctl(dev, TRAPVEC_IOC_INFO, &i) != -1 || errno != EPERM)
			bad |= 1;
		if (open("/dev/trapvec", O_RDWR) != -1 || errno != EACCES)
			bad |= 2;
		_exit(bad);
	}
	waitpid(pid, &status, 0);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "uid %d: ioctl on an inherited fd fails with EPERM, open fails with EACCES (status %d)",
	      NOBODY, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* A function of module mod whose entry is the 5-byte ftrace NOP; 0 if none. */
static uint64_t module_function(const char *mod)
{
	char line[512], sym[256], owner[128], type;
	unsigned long long addr;
	uint8_t b[5];
	FILE *f = fopen("/proc/kallsyms", "r");

	if (!f)
		fatal("/proc/kallsyms");
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %255s [%127[^]]]", &addr, &type, sym, owner) != 4 ||
		    (type != 't' && type != 'T') || strcmp(owner, mod))
			continue;
		if (!kread(addr, b, 5) && !memcmp(b, "\x0f\x1f\x44\x00\x00", 5)) {
			fclose(f);
			return addr;
		}
	}
	fclose(f);
	return 0;
}

static long module_refcnt(const char *mod)
{
	char path[128];
	long n = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/module/%s/refcnt", mod);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%ld", &n) != 1)
			n = -1;
		fclose(f);
	}
	return n;
}

/*
 * Module text goes through vmalloc_to_page() for its alias, and a live patch holds a
 * reference on the module, which its revert keeps until the next QUIESCE (a task may still
 * return into that text). The patch writes the bytes that are there (no behaviour changes).
 */
static void test_module_text(const char *mod)
{
	struct trapvec_patch p = {};
	struct trapvec_quiesce q = {};
	struct trapvec_apply res;
	uint64_t func = module_function(mod);
	long before = module_refcnt(mod), during, after;
	int ret;

	if (!func || before < 0) {
		check(0, "module %s is loaded and has a traced function", mod);
		return;
	}
	p.addr = func + 5;
	p.len = 2;
	check(kread(p.addr, p.old_bytes, 2) == 0 && check_reason(p.addr, 2) == TRAPVEC_REASON_NONE,
	      "CHECK %s text at %llx is accepted", mod, (unsigned long long)p.addr);
	memcpy(p.new_bytes, p.old_bytes, 2);
	ret = apply(&p, 1, &res);
	during = module_refcnt(mod);
	check(!ret && during == before + 1, "APPLY in %s text takes a reference on it (%ld -> %ld)",
	      mod, before, during);
	/* Its own inverse: the same bytes. */
	ret = apply(&p, 1, &res);
	after = module_refcnt(mod);
	check(!ret && after == before + 1,
	      "reverting it keeps the reference until quiescence (%ld)", after);
	ret = tv(TRAPVEC_IOC_QUIESCE, &q);
	after = module_refcnt(mod);
	check(!ret && after == before, "QUIESCE drops the reference (%ld)", after);
}

/*
 * Splice and unsplice while another process calls getppid() on every CPU it can get: every
 * call must return the right value, through the trap or around it.
 */
static void test_stress(struct splice *s, struct trapvec_patch *trap, pid_t ppid)
{
	struct trapvec_dispatch_entry e = { .site = s->site, .dest = s->tramp };
	struct trapvec_patch undo = *trap;
	struct trapvec_apply res;
	uint64_t site = s->site;
	int i, status, failed = 0, pipefd[2];
	uint32_t idx;
	pid_t pid;

	memcpy(undo.old_bytes, trap->new_bytes, 2);
	memcpy(undo.new_bytes, trap->old_bytes, 2);
	if (pipe(pipefd))
		fatal("pipe");
	pid = fork();
	if (pid < 0)
		fatal("fork");
	if (!pid) {
		long calls = 0;
		char c;

		close(pipefd[1]);
		fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
		/* Until the parent closes the pipe. */
		while (read(pipefd[0], &c, 1) < 0 && errno == EAGAIN) {
			if (syscall(SYS_getppid) != getppid())
				_exit(2);
			calls++;
		}
		_exit(calls > 0 ? 0 : 3);
	}
	close(pipefd[0]);
	for (i = 0; i < STRESS_CYCLES && !failed; i++) {
		failed |= dispatch_add(&e, 1, &idx) != 0;
		failed |= apply(trap, 1, &res) != 0;
		failed |= syscall(SYS_getppid) != ppid;
		failed |= apply(&undo, 1, &res) != 0;
		failed |= dispatch_remove(&site, 1, &idx) != 0;
	}
	close(pipefd[1]);
	waitpid(pid, &status, 0);
	check(!failed, "%d cycles of dispatch add, trap, revert, remove", i);
	check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "a process calling getppid() meanwhile always got %d (status %d)", ppid,
	      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static double seconds(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/*
 * A batch of n patches that write the bytes already there, 2 bytes past the ftrace NOP of
 * n traced kernel functions (each accepted by CHECK without its kprobe): the module records,
 * maps and, at unload, reverts them all without changing what the kernel runs.
 */
static void test_big_batch(int n)
{
	struct trapvec_patch *p = calloc(n, sizeof(*p));
	char line[512], sym[256], type;
	unsigned long long addr, last = 0;
	struct trapvec_check c = {};
	struct trapvec_apply res;
	struct trapvec_info in;
	uint64_t live;
	double t0, t;
	int k = 0, ret;
	uint8_t b[8];
	FILE *f = fopen("/proc/kallsyms", "r");

	if (!f || !p)
		fatal("big batch");
	info(&in);
	live = in.live_patches;
	while (k < n && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %255s", &addr, &type, sym) != 3 || type != 'T' ||
		    strchr(line, '[') || addr == last)
			continue;
		last = addr;
		if (kread(addr, b, 8) || memcmp(b, "\x0f\x1f\x44\x00\x00", 5))
			continue;
		/*
		 * Only where the instruction at +5 is 2 bytes or more (a REX prefix, or an
		 * opcode with a ModRM byte): a window over two instructions must be written as
		 * a trap or a jmp (NOT_A_JUMP), and these patches write the old bytes again.
		 */
		if (!strchr("\x48\x49\x4c\x4d\x41\x31\x85\x89\x8b", b[5]))
			continue;
		c.addr = addr + 5;
		c.len = 2;
		c.flags = TRAPVEC_CHECK_NO_KPROBE;
		if (tv(TRAPVEC_IOC_CHECK, &c) || c.reason)
			continue;
		p[k].addr = addr + 5;
		p[k].len = 2;
		memcpy(p[k].old_bytes, b + 5, 2);
		memcpy(p[k].new_bytes, b + 5, 2);
		k++;
	}
	fclose(f);
	t0 = seconds();
	ret = apply(p, k, &res);
	t = seconds() - t0;
	info(&in);
	check(k == n && !ret && in.live_patches == live + n,
	      "APPLY of a batch of %d patches at %d functions in %.3f s (%llu live; ret %d, patch %u, reason %u)",
	      k, k, t, in.live_patches, ret, res.failed_index, res.reason);
	free(p);
}

static void call_getppid(int n, pid_t want, const char *what)
{
	int i, wrong = 0;

	for (i = 0; i < n; i++)
		wrong += syscall(SYS_getppid) != want;
	check(!wrong, "%d getppid() calls %s return %d (%d wrong)", n, what, want, wrong);
}

static void save_state(const char *path, const struct splice *s, const struct trapvec_info *in)
{
	FILE *f = fopen(path, "w");
	int i;

	if (!f)
		fatal(path);
	fprintf(f, "%llx %llx ", (unsigned long long)(s->site - 5), in->old_handler);
	for (i = 0; i < 16; i++)
		fprintf(f, "%02x", s->orig[i]);
	fprintf(f, "\n");
	fclose(f);
}

static int after_reload(const char *path)
{
	unsigned long long func, old_handler;
	uint8_t want[16], now[16];
	struct trapvec_info in;
	char hex[40];
	FILE *f = fopen(path, "r");
	int i;

	if (!f || fscanf(f, "%llx %llx %32s", &func, &old_handler, hex) != 3)
		fatal(path);
	fclose(f);
	for (i = 0; i < 16; i++)
		if (sscanf(hex + 2 * i, "%2hhx", &want[i]) != 1)
			fatal(path);

	info(&in);
	check(in.live_patches == 0 && in.dispatch_entries == 0,
	      "after reload: no live patches, no dispatch entries");
	check(in.old_handler == old_handler,
	      "after reload: the module found the same old gate %llx (it was restored)", old_handler);
	check(in.gate_handler == in.entry, "after reload: the gate is installed again");
	check(kread(func, now, 16) == 0 && !memcmp(now, want, 16),
	      "after rmmod with a live splice: __x64_sys_getppid's 16 bytes are the originals");
	call_getppid(10, getppid(), "after reload");
	return finish();
}

/* Does the kernel log hold a line containing every one of the (up to 3) strings given? */
static int dmesg_has(const char *a, const char *b, const char *c)
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

/*
 * FREE of a block a live patch still enters is refused (EBUSY) with a line naming the patch:
 * a jmp splice at __x64_sys_getppid+5 (E9 rel32 over push rbx and the call's first four
 * bytes, then int3 over its last byte, which the replay never returns to) whose trampoline is
 * the block, and a return point whose handler (a bare ret) is in another. Once the jmp is
 * reverted and the slot given back, both FREEs succeed and QUIESCE reclaims the two blocks.
 */
static void test_free_referenced(const struct splice *s, pid_t ppid)
{
	struct trapvec_alloc code, ret_code;
	struct trapvec_return_add ra = {};
	struct trapvec_return_remove rr = {};
	struct trapvec_patch jmp = {}, undo;
	struct trapvec_apply res;
	struct trapvec_quiesce q = {};
	uint8_t t[16], ret_insn = 0xc3, now[8];
	char id[32];
	int ret;

	if (alloc_block(TRAPVEC_BLOCK_CODE, 16, &code) ||
	    alloc_block(TRAPVEC_BLOCK_CODE, 16, &ret_code))
		fatal("ALLOC for the FREE checks");
	/* Replay: push rbx; call callee; jmp site + 6. */
	memset(t, 0xcc, sizeof(t));
	t[0] = 0x53;
	t[1] = 0xe8;
	put32(t + 2, (int64_t)(s->callee - (code.addr + 6)));
	t[6] = 0xe9;
	put32(t + 7, (int64_t)(s->site + 6 - (code.addr + 11)));
	check(write_block(code.id, 0, t, sizeof(t)) == 0 && block_op(TRAPVEC_IOC_SEAL, code.id) == 0 &&
	      write_block(ret_code.id, 0, &ret_insn, 1) == 0 &&
	      block_op(TRAPVEC_IOC_SEAL, ret_code.id) == 0,
	      "WRITE and SEAL a jmp trampoline and a return handler");

	jmp.addr = s->site;
	jmp.len = 6;
	memcpy(jmp.old_bytes, s->orig + 5, 6);
	jmp.new_bytes[0] = 0xe9;
	put32(jmp.new_bytes + 1, (int64_t)(code.addr - (s->site + 5)));
	jmp.new_bytes[5] = 0xcc;
	check(apply(&jmp, 1, &res) == 0, "APPLY a jmp at __x64_sys_getppid+5 to the trampoline");
	check(kread(s->site, now, 1) == 0 && now[0] == 0xe9, "the site now holds e9");
	call_getppid(10, ppid, "through the jmp");
	snprintf(id, sizeof(id), "FREE of block %llu ", (unsigned long long)code.id);
	ret = block_op(TRAPVEC_IOC_FREE, code.id);
	check(ret == -EBUSY, "FREE of the block a live jmp lands in fails (EBUSY): %d", ret);
	/* %pS names the site by any symbol at its address (__do_sys_getppid is an alias). */
	check(dmesg_has(id, "the live jmp at ", "getppid+0x5/"),
	      "... and the kernel log names the jmp's site (%s...the live jmp at ...getppid+0x5/)",
	      id);
	call_getppid(10, ppid, "through the jmp after the refused FREE");

	undo = jmp;
	memcpy(undo.old_bytes, jmp.new_bytes, 6);
	memcpy(undo.new_bytes, jmp.old_bytes, 6);
	check(apply(&undo, 1, &res) == 0, "APPLY the jmp's inverse");
	check(block_op(TRAPVEC_IOC_FREE, code.id) == 0, "FREE of the trampoline after the revert");

	ra.handler = ret_code.addr;
	ra.maxactive = 1;
	check(tv(TRAPVEC_IOC_RETURN_ADD, &ra) == 0, "RETURN_ADD with a handler in a code block");
	snprintf(id, sizeof(id), "FREE of block %llu ", (unsigned long long)ret_code.id);
	ret = block_op(TRAPVEC_IOC_FREE, ret_code.id);
	check(ret == -EBUSY, "FREE of the block holding a live return point's handler fails (EBUSY): %d",
	      ret);
	check(dmesg_has(id, "return point slot", NULL),
	      "... and the kernel log names the return point (%s...return point slot)", id);
	rr.slot = ra.slot;
	rr.generation = ra.generation;
	check(tv(TRAPVEC_IOC_RETURN_REMOVE, &rr) == 0, "RETURN_REMOVE the slot");
	check(block_op(TRAPVEC_IOC_FREE, ret_code.id) == 0, "FREE of the handler's block after it");
	ret = tv(TRAPVEC_IOC_QUIESCE, &q);
	check(!ret && q.reclaimed_blocks == 2, "QUIESCE reclaims both (%llu blocks)",
	      q.reclaimed_blocks);
}

/*
 * A window over a hidden branch target (issue 24, item 3): for the first 2,000 entries of the
 * jump table and of the exception table, CHECK a window of len bytes starting one byte before
 * the target. Some must be refused for the target with the culprit the entry itself (others
 * fall on an earlier reason, or on an entry with the same target); a window of one byte
 * starting at the target is never refused for it.
 */
static void hidden_table(const char *first, const char *last, uint32_t size, uint32_t field,
			 uint32_t len, uint32_t reason, const char *what)
{
	uint64_t a, target, start = ksym(first), stop = ksym(last);
	int i, named = 0, at_start = 0;
	uint8_t e[16];

	for (i = 0, a = start; a + size <= stop && i < 2000; a += size, i++) {
		struct trapvec_check c = { .len = len, .flags = TRAPVEC_CHECK_NO_KPROBE };
		uint8_t other[16];

		if (kread(a, e, size))
			fatal(first);
		target = a + field + (uint64_t)get32(e + field);
		c.addr = target - 1;
		if (!tv(TRAPVEC_IOC_CHECK, &c) && c.reason == reason) {
			/* The culprit entry: this one, or another with the same target. */
			if (kread(c.culprit, other, size))
				fatal("READ of a culprit entry");
			named += c.culprit + field + (uint64_t)get32(other + field) == target;
		}
		c = (struct trapvec_check){ .addr = target, .len = 1,
					    .flags = TRAPVEC_CHECK_NO_KPROBE };
		at_start += !tv(TRAPVEC_IOC_CHECK, &c) && c.reason == reason;
	}
	check(named > 0 && !at_start,
	      "CHECK over %d %s: %d refused naming the entry, %d refused at the target itself",
	      i, what, named, at_start);
}

/*
 * READ with TRAPVEC_READ_ORIGINAL (issue 24, item 8) while the trap at getppid+5 is live: the
 * original bytes come back, plain READ shows the trap, and an unknown flag is refused.
 */
static void test_read_original(const struct splice *s, uint64_t getppid)
{
	struct trapvec_read r = { .addr = getppid, .len = 16, .flags = TRAPVEC_READ_ORIGINAL };
	uint8_t orig[16] = {}, now[16];
	int ret;

	r.buf = (uintptr_t)orig;
	/* The call comes first: check()'s arguments are evaluated in no fixed order. */
	ret = tv(TRAPVEC_IOC_READ, &r);
	check(ret == 0 && !memcmp(orig, s->orig, 16),
	      "READ_ORIGINAL over the live trap gives the original bytes (+5: %02x %02x)", orig[5],
	      orig[6]);
	check(kread(getppid, now, 16) == 0 && now[5] == 0xcd && now[6] == 0xf5,
	      "... while a plain READ gives the trap");
	r.flags = 2;
	check(tv(TRAPVEC_IOC_READ, &r) == -EINVAL, "READ with an unknown flag fails (EINVAL)");
}

int main(int argc, char **argv)
{
	struct trapvec_dispatch_entry entry;
	struct trapvec_patch patch[2];
	struct trapvec_alloc spare;
	struct trapvec_apply res;
	struct trapvec_hits h;
	struct trapvec_info in;
	struct trapvec_list_entry le[4];
	struct trapvec_list list;
	struct trapvec_quiesce q;
	struct splice s = {};
	uint64_t getppid_fn, counters[2], site;
	uint8_t now[16], one = 1;
	uint32_t failed;
	int ret;
	const char *leave = NULL;
	pid_t ppid = getppid();
	struct stat st;

	if (argc == 3 && !strcmp(argv[1], "--leave-live"))
		leave = argv[2];
	dev = open("/dev/trapvec", O_RDWR);
	if (dev < 0)
		fatal("open /dev/trapvec");
	if (argc == 3 && !strcmp(argv[1], "--after-reload"))
		return after_reload(argv[2]);

	check(stat("/dev/trapvec", &st) == 0 && S_ISCHR(st.st_mode) &&
	      (st.st_mode & 0777) == 0600, "/dev/trapvec is a character device, mode 0600");

	info(&in);
	check(in.abi_version == TRAPVEC_ABI_VERSION && in.vector == 0xf5,
	      "INFO: ABI %u, vector %#x", in.abi_version, in.vector);
	check(in.gate_handler == in.entry && in.old_handler != in.entry,
	      "the IDT gate goes to the module's stub %llx (was %llx)", in.entry, in.old_handler);
	check(in.code_base >= in.module_base &&
	      in.code_base + in.code_size <= in.module_base + in.module_size &&
	      in.code_size == 16 << 20 && in.data_size == 4 << 20,
	      "the arenas (16 MiB of code, 4 MiB of data) lie inside the module");

	test_user_int();

	getppid_fn = ksym("__x64_sys_getppid");
	s.site = getppid_fn + 5;
	check(kread(getppid_fn, s.orig, 16) == 0, "READ 16 bytes of __x64_sys_getppid");
	check(s.orig[5] == 0x53 && s.orig[6] == 0xe8,
	      "__x64_sys_getppid+5 holds push rbx; call rel32 (%02x %02x)", s.orig[5], s.orig[6]);
	s.callee = s.site + 6 + (uint64_t)get32(s.orig + 7);

	test_refusals(getppid_fn, &in);
	test_not_a_jump(getppid_fn);
	hidden_table("__start___jump_table", "__stop___jump_table", 16, 4, 5,
		     TRAPVEC_REASON_JUMP_TARGET, "jump-label targets");
	hidden_table("__start___ex_table", "__stop___ex_table", 12, 4, 2,
		     TRAPVEC_REASON_EXTABLE_FIXUP, "exception fix-ups");

	/* Arena blocks. */
	ret = alloc_block(TRAPVEC_BLOCK_CODE, 64, &s.code);
	check(!ret && s.code.addr >= in.code_base && s.code.addr < in.code_base + in.code_size,
	      "ALLOC a code block in the code arena (%llx)", s.code.addr);
	ret = alloc_block(TRAPVEC_BLOCK_DATA, 16, &s.data);
	check(!ret && s.data.addr >= in.data_base && s.data.addr < in.data_base + in.data_size,
	      "ALLOC a data block in the data arena (%llx)", s.data.addr);
	ret = alloc_block(TRAPVEC_BLOCK_CODE, 16, &spare);
	check(!ret && spare.addr == s.code.addr + 64,
	      "ALLOC a second code block, first fit right after the first (%llx)", spare.addr);
	setup_splice(&s, getppid_fn);

	memset(&entry, 0, sizeof(entry));
	entry.site = s.site;
	entry.dest = spare.addr;
	check(dispatch_add(&entry, 1, &failed) == -EFAULT && failed == 0,
	      "DISPATCH_ADD to an unsealed block is refused (EFAULT)");
	check(block_op(TRAPVEC_IOC_SEAL, s.code.id) == 0, "SEAL the code block");
	check(write_block(s.code.id, 0, &one, 1) == -EPERM, "WRITE to a sealed block fails (EPERM)");
	check(block_op(TRAPVEC_IOC_FREE, spare.id) == 0, "FREE the spare block");
	check(write_block(spare.id, 0, &one, 1) == -ENOENT, "WRITE to a freed block fails (ENOENT)");

	entry.dest = s.tramp;
	entry.handler = s.handler;
	entry.cookie = 0x1234;
	check(dispatch_add(&entry, 1, &failed) == 0, "DISPATCH_ADD site -> trampoline, handler");
	check(dispatch_add(&entry, 1, &failed) == -EEXIST && failed == 0,
	      "DISPATCH_ADD of the same site again fails (EEXIST), index 0");
	check(block_op(TRAPVEC_IOC_FREE, s.code.id) == -EBUSY,
	      "FREE of a block a dispatch entry points into fails (EBUSY)");
	check(hits(s.site, &h) == 0 && h.hits == 0 && h.missed == 0, "HITS of the site: 0, 0");

	/*
	 * All or nothing: the second patch expects the wrong bytes. It is a jmp rel8 (never
	 * written): a trap there would be refused first, for having no dispatch entry.
	 */
	site = ksym("__x64_sys_getpid") + 5;
	memset(patch, 0, sizeof(patch));
	patch[0].addr = s.site;
	patch[0].len = 2;
	memcpy(patch[0].old_bytes, s.orig + 5, 2);
	patch[0].new_bytes[0] = 0xcd;
	patch[0].new_bytes[1] = 0xf5;
	patch[1].addr = site;
	patch[1].len = 2;
	patch[1].new_bytes[0] = 0xeb;
	patch[1].new_bytes[1] = 0x00;
	ret = apply(patch, 2, &res);
	check(ret == -ESTALE && res.failed_index == 1 &&
	      res.reason == TRAPVEC_REASON_MISMATCH,
	      "APPLY with a wrong expectation in patch 1 fails: ESTALE, index 1, MISMATCH");
	check(kread(s.site, now, 2) == 0 && !memcmp(now, s.orig + 5, 2),
	      "... and patch 0 was not written");
	check(kread(site, now, 2) == 0 && !memcmp(now, res.found, 2),
	      "... and it reports the bytes found (%02x %02x)", res.found[0], res.found[1]);

	check(apply(patch, 1, &res) == 0, "APPLY the trap at __x64_sys_getppid+5");
	check(kread(s.site, now, 2) == 0 && now[0] == 0xcd && now[1] == 0xf5,
	      "the site now holds cd f5");
	test_read_original(&s, getppid_fn);
	check(apply(patch, 1, &res) == -EBUSY && res.reason == TRAPVEC_REASON_LIVE_PATCH,
	      "APPLY over a live patch fails: EBUSY, LIVE_PATCH");
	check(check_reason(s.site + 1, 1) == TRAPVEC_REASON_LIVE_PATCH,
	      "CHECK of a byte under a live patch is refused: LIVE_PATCH");

	call_getppid(CALLS, ppid, "through the trap");
	ret = hits(s.site, &h);
	check(!ret && h.hits == CALLS && h.missed == 0,
	      "HITS: %llu hits, %llu missed (want %d, 0)", h.hits, h.missed, CALLS);
	ret = kread(s.data.addr, counters, 8);
	check(!ret && counters[0] == CALLS, "the handler ran %llu times (want %d)",
	      (unsigned long long)counters[0], CALLS);

	/* Reentry: the handler calls __x64_sys_getppid, whose trap must skip the handler. */
	check(write_block(s.data.id, 8, &(uint64_t){ 1 }, 8) == 0, "WRITE the flag (data block)");
	call_getppid(NESTED_CALLS, ppid, "with the handler calling getppid");
	ret = hits(s.site, &h);
	check(!ret && h.hits == CALLS + 2 * NESTED_CALLS && h.missed == NESTED_CALLS,
	      "HITS: %llu hits, %llu missed (want %d, %d)", h.hits, h.missed,
	      CALLS + 2 * NESTED_CALLS, NESTED_CALLS);
	ret = kread(s.data.addr, counters, 16);
	check(!ret && counters[0] == CALLS + NESTED_CALLS,
	      "the handler ran %llu times, nested traps skipped it (want %d)",
	      (unsigned long long)counters[0], CALLS + NESTED_CALLS);
	write_block(s.data.id, 8, &(uint64_t){ 0 }, 8);

	memset(&list, 0, sizeof(list));
	list.entries = (uintptr_t)le;
	list.capacity = 4;
	check(tv(TRAPVEC_IOC_LIST, &list) == 0 && list.count == 1 && le[0].site == s.site &&
	      le[0].dest == s.tramp && le[0].handler == s.handler && le[0].cookie == 0x1234 &&
	      le[0].hits == h.hits && le[0].missed == h.missed,
	      "LIST: one entry with its destination, handler, cookie and counters");
	info(&in);
	check(in.live_patches == 1 && in.dispatch_entries == 1, "INFO: 1 live patch, 1 entry");

	/* DISPATCH_REPLACE: the trap stays, the site's entry changes in one step. */
	{
		struct trapvec_dispatch_entry two[2] = { entry, entry };
		struct trapvec_hits counts[2], now_h;
		struct trapvec_dispatch_replace r;

		two[1].site = ksym("__x64_sys_getpid") + 5;
		memset(counts, 0, sizeof(counts));
		r = (struct trapvec_dispatch_replace){ .entries = (uintptr_t)two,
						       .counts = (uintptr_t)counts, .count = 2 };
		check(tv(TRAPVEC_IOC_DISPATCH_REPLACE, &r) == -ENOENT && r.failed_index == 1,
		      "DISPATCH_REPLACE with a site without an entry fails (ENOENT), index 1");
		check(hits(s.site, &now_h) == 0 && now_h.hits == h.hits && now_h.missed == h.missed,
		      "... and changed nothing");
		two[0].cookie = 0x5678;
		counts[0].hits = 7;
		counts[0].missed = 3;
		r.count = 1;
		/* The call comes first: check()'s arguments are evaluated in no fixed order. */
		ret = tv(TRAPVEC_IOC_DISPATCH_REPLACE, &r);
		check(!ret && counts[0].site == s.site && counts[0].hits == h.hits &&
		      counts[0].missed == h.missed,
		      "DISPATCH_REPLACE the live site's entry: its final counts come back (%llu, %llu)",
		      counts[0].hits, counts[0].missed);
		call_getppid(10, ppid, "through the replaced entry");
		ret = hits(s.site, &now_h);
		check(!ret && now_h.hits == 17 && now_h.missed == 3,
		      "the new entry counted on from the counts given (%llu, %llu; want 17, 3)",
		      now_h.hits, now_h.missed);
		check(tv(TRAPVEC_IOC_LIST, &list) == 0 && list.count == 1 && le[0].cookie == 0x5678,
		      "LIST: the new entry's cookie");
		two[0].cookie = 0x1234;
		counts[0] = h;
		check(tv(TRAPVEC_IOC_DISPATCH_REPLACE, &r) == 0 && counts[0].hits == 17,
		      "DISPATCH_REPLACE back, with the old counts");
		check(hits(s.site, &now_h) == 0 && now_h.hits == h.hits && now_h.missed == h.missed,
		      "the old entry's counts are back");
		check(kread(s.site, now, 2) == 0 && now[0] == 0xcd && now[1] == 0xf5,
		      "the trap never left the site");
	}

	/* Revert. */
	patch[1] = patch[0];
	memcpy(patch[1].old_bytes, patch[0].new_bytes, 2);
	memcpy(patch[1].new_bytes, patch[0].old_bytes, 2);
	check(apply(&patch[1], 1, &res) == 0, "APPLY the inverse patch");
	check(kread(getppid_fn, now, 16) == 0 && !memcmp(now, s.orig, 16),
	      "__x64_sys_getppid's 16 bytes are the originals again");
	call_getppid(10, ppid, "after the revert");
	check(hits(s.site, &h) == 0 && h.hits == CALLS + 2 * NESTED_CALLS,
	      "no traps after the revert");
	site = s.site;
	check(dispatch_remove(&site, 1, &failed) == 0, "DISPATCH_REMOVE the site");
	check(dispatch_remove(&site, 1, &failed) == -ENOENT && failed == 0,
	      "DISPATCH_REMOVE again fails (ENOENT), index 0");
	check(hits(s.site, &h) == -ENOENT, "HITS of a removed site fails (ENOENT)");
	test_stress(&s, &patch[0], ppid);
	check(kread(getppid_fn, now, 16) == 0 && !memcmp(now, s.orig, 16),
	      "after the stress: __x64_sys_getppid's 16 bytes are the originals");
	check(block_op(TRAPVEC_IOC_FREE, s.code.id) == 0, "FREE the trampoline block");
	memset(&q, 0, sizeof(q));
	ret = tv(TRAPVEC_IOC_QUIESCE, &q);
	check(!ret && q.reclaimed_blocks == 2 && q.reclaimed_bytes == 64 + 16,
	      "QUIESCE reclaims the 2 freed code blocks (%llu blocks, %llu bytes)",
	      q.reclaimed_blocks, q.reclaimed_bytes);

	test_free_referenced(&s, ppid);
	test_nonroot();
	if (module_refcnt("sch_netem") >= 0)
		test_module_text("sch_netem");

	if (leave) {
		struct trapvec_alloc again;

		/* The code arena was reclaimed: build the splice anew and leave it live. */
		check(alloc_block(TRAPVEC_BLOCK_CODE, 64, &again) == 0 &&
		      again.addr == s.code.addr, "ALLOC reuses the reclaimed room first");
		s.code = again;
		setup_splice(&s, getppid_fn);
		block_op(TRAPVEC_IOC_SEAL, s.code.id);
		entry.dest = s.tramp;
		entry.handler = s.handler;
		check(dispatch_add(&entry, 1, &failed) == 0 && apply(patch, 1, &res) == 0,
		      "splice applied again, to be left live for rmmod");
		call_getppid(10, ppid, "through the trap again");
		test_big_batch(BIG_BATCH);
		info(&in);
		save_state(leave, &s, &in);
	}
	return finish();
}
