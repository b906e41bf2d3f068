// SPDX-License-Identifier: GPL-2.0
/*
 * trapvec_test's refusals: what CHECK and APPLY refuse (the reason tables, hidden tables,
 * text that is not a jump target), a user-mode int, and a caller without the capability.
 */
#include "tvtest.h"

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
void test_not_a_jump(uint64_t getppid)
{
	uint32_t e = entry_len(getppid);
	struct trapvec_patch p = { .addr = getppid + e, .len = 1 };
	struct trapvec_apply res;
	uint8_t now = 0;
	int ret;

	if (kread(p.addr, p.old_bytes, 1)) {
		check(0, "READ __x64_sys_getppid+%u", e);
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
	ret = kread(getppid + e, &now, 1);
	check(ret == 0 && now == 0x53, "__x64_sys_getppid+%u still holds push rbx (%02x)", e, now);
}

void test_refusals(uint64_t getppid, const struct trapvec_info *in)
{
	struct trapvec_check c = {};
	/* The first instruction past the entry (endbr64 on 6.12, then the fentry NOP). */
	uint32_t e = entry_len(getppid);

	check(check_reason(getppid + e - 5, 2) == TRAPVEC_REASON_FTRACE,
	      "CHECK __x64_sys_getppid+%u (the fentry NOP) is refused: FTRACE", e - 5);
	check(check_reason(getppid + e, 2) == TRAPVEC_REASON_NONE,
	      "CHECK __x64_sys_getppid+%u is accepted", e);
	c.addr = getppid + e;
	c.len = 2;
	c.flags = TRAPVEC_CHECK_NO_KPROBE;
	check(tv(TRAPVEC_IOC_CHECK, &c) == 0 && c.reason == TRAPVEC_REASON_NONE,
	      "CHECK without the kprobe cross-check accepts it too");
	c.flags = 2;
	check(tv(TRAPVEC_IOC_CHECK, &c) == -EINVAL, "CHECK with an unknown flag fails (EINVAL)");
	check(check_reason(getppid + e + 2, 2) == TRAPVEC_REASON_NOT_BOUNDARY,
	      "CHECK __x64_sys_getppid+%u (inside the call) is refused: NOT_BOUNDARY", e + 2);
	check(check_reason(getppid + e, 0) == TRAPVEC_REASON_BAD_LENGTH,
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

void test_user_int(void)
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

void test_nonroot(void)
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

/*
 * A window over a hidden branch target (issue 24, item 3): for the first 2,000 entries of the
 * jump table and of the exception table, CHECK a window of len bytes starting one byte before
 * the target. Some must be refused for the target with the culprit the entry itself (others
 * fall on an earlier reason, or on an entry with the same target); a window of one byte
 * starting at the target is never refused for it.
 */
void hidden_table(const char *first, const char *last, uint32_t size, uint32_t field,
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
