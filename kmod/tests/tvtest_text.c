// SPDX-License-Identifier: GPL-2.0
/*
 * trapvec_test's text tests beyond the one splice: a module's text, many patches at once
 * (stress, a big batch), FREE of blocks that live patches still enter, and READ_ORIGINAL.
 */
#include "tvtest.h"

/* A function of module mod whose entry is the 5-byte ftrace NOP (behind endbr64 on 6.12); 0 if
 * none. */
static uint64_t module_function(const char *mod)
{
	char line[512], sym[256], owner[128], type;
	unsigned long long addr;
	uint8_t b[9];
	FILE *f = fopen("/proc/kallsyms", "r");

	if (!f)
		fatal("/proc/kallsyms");
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %255s [%127[^]]]", &addr, &type, sym, owner) != 4 ||
		    (type != 't' && type != 'T') || strcmp(owner, mod))
			continue;
		if (!kread(addr, b, 9) && entry_len_of(b, 1)) {
			fclose(f);
			return addr;
		}
	}
	fclose(f);
	return 0;
}

long module_refcnt(const char *mod)
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
void test_module_text(const char *mod)
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
	p.addr = func + entry_len(func);
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
void test_stress(struct splice *s, struct trapvec_patch *trap, pid_t ppid)
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

/*
 * A batch of n patches that write the bytes already there, 2 bytes past the ftrace NOP of
 * n traced kernel functions (each accepted by CHECK without its kprobe): the module records,
 * maps and, at unload, reverts them all without changing what the kernel runs.
 */
void test_big_batch(int n)
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
	uint32_t e;
	uint8_t b[16];
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
		/* Past the entry (endbr64 on 6.12), whose ftrace site must be the NOP. */
		if (kread(addr, b, sizeof(b)))
			continue;
		e = entry_len_of(b, 1);
		if (!e)
			continue;
		/*
		 * Only where the instruction past the NOP is 2 bytes or more (a REX prefix, or an
		 * opcode with a ModRM byte): a window over two instructions must be written as
		 * a trap or a jmp (NOT_A_JUMP), and these patches write the old bytes again.
		 */
		if (!strchr("\x48\x49\x4c\x4d\x41\x31\x85\x89\x8b", b[e]))
			continue;
		c.addr = addr + e;
		c.len = 2;
		c.flags = TRAPVEC_CHECK_NO_KPROBE;
		if (tv(TRAPVEC_IOC_CHECK, &c) || c.reason)
			continue;
		p[k].addr = addr + e;
		p[k].len = 2;
		memcpy(p[k].old_bytes, b + e, 2);
		memcpy(p[k].new_bytes, b + e, 2);
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

/*
 * FREE of a block a live patch still enters is refused (EBUSY) with a line naming the patch:
 * a jmp splice at __x64_sys_getppid+5 (E9 rel32 over push rbx and the call's first four
 * bytes, then int3 over its last byte, which the replay never returns to) whose trampoline is
 * the block, and a return point whose handler (a bare ret) is in another. Once the jmp is
 * reverted and the slot given back, both FREEs succeed and QUIESCE reclaims the two blocks.
 */
void test_free_referenced(const struct splice *s, pid_t ppid)
{
	struct trapvec_alloc code, ret_code;
	struct trapvec_return_add ra = {};
	struct trapvec_return_remove rr = {};
	struct trapvec_patch jmp = {}, undo;
	struct trapvec_apply res;
	struct trapvec_quiesce q = {};
	uint8_t t[16], ret_insn = 0xc3, now[8];
	char id[32], at[32];
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
	memcpy(jmp.old_bytes, s->orig + s->entry, 6);
	jmp.new_bytes[0] = 0xe9;
	put32(jmp.new_bytes + 1, (int64_t)(code.addr - (s->site + 5)));
	jmp.new_bytes[5] = 0xcc;
	check(apply(&jmp, 1, &res) == 0, "APPLY a jmp at __x64_sys_getppid+%u to the trampoline",
	      s->entry);
	check(kread(s->site, now, 1) == 0 && now[0] == 0xe9, "the site now holds e9");
	call_getppid(10, ppid, "through the jmp");
	snprintf(id, sizeof(id), "FREE of block %llu ", (unsigned long long)code.id);
	ret = block_op(TRAPVEC_IOC_FREE, code.id);
	check(ret == -EBUSY, "FREE of the block a live jmp lands in fails (EBUSY): %d", ret);
	/* %pS names the site by any symbol at its address (__do_sys_getppid is an alias). */
	snprintf(at, sizeof(at), "getppid+0x%x/", s->entry);
	check(dmesg_has(id, "the live jmp at ", at),
	      "... and the kernel log names the jmp's site (%s...the live jmp at ...%s)", id, at);
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
 * READ with TRAPVEC_READ_ORIGINAL (issue 24, item 8) while the trap at getppid+5 is live: the
 * original bytes come back, plain READ shows the trap, and an unknown flag is refused.
 */
void test_read_original(const struct splice *s, uint64_t getppid)
{
	struct trapvec_read r = { .addr = getppid, .len = 16, .flags = TRAPVEC_READ_ORIGINAL };
	uint8_t orig[16] = {}, now[16];
	int ret;

	r.buf = (uintptr_t)orig;
	/* The call comes first: check()'s arguments are evaluated in no fixed order. */
	ret = tv(TRAPVEC_IOC_READ, &r);
	check(ret == 0 && !memcmp(orig, s->orig, 16),
	      "READ_ORIGINAL over the live trap gives the original bytes (+%u: %02x %02x)",
	      s->entry, orig[s->entry], orig[s->entry + 1]);
	check(kread(getppid, now, 16) == 0 && now[s->entry] == 0xcd && now[s->entry + 1] == 0xf5,
	      "... while a plain READ gives the trap");
	r.flags = 2;
	check(tv(TRAPVEC_IOC_READ, &r) == -EINVAL, "READ with an unknown flag fails (EINVAL)");
}
