// SPDX-License-Identifier: GPL-2.0
/*
 * trapvec_test - drives /dev/trapvec in a VM running the real kernel, as root.
 *
 *   trapvec_test [--leave-live STATE]   the suite; with --leave-live, finish with a splice of
 *                                       __x64_sys_getppid live and record in STATE what
 *                                       the text and the gate were
 *   trapvec_test --after-reload STATE   after rmmod + insmod: the text and the gate are back
 *
 * The splice: a trap (CD F5) at __x64_sys_getppid+5 (+9 on 6.12, behind endbr64), past the
 * ftrace NOP, over
 * "push rbx; call rel32" (53 e8 ..): the trap displaces both, so the replay trampoline in
 * the code arena is "push rbx; call <callee>; jmp getppid+11", assembled here with the call
 * retargeted. A handler (also assembled here) counts its calls in a data block and, when a
 * flag in that block is set, calls __x64_sys_getppid itself: that nested trap must skip the
 * handler and count as missed.
 *
 * Output is one line per check ("ok"/"not ok") and a last line TRAPVEC-KMOD-TEST: PASS|FAIL;
 * the exit status is 0 only on PASS.
 */
#include "tvtest.h"

static void save_state(const char *path, const struct splice *s, const struct trapvec_info *in)
{
	FILE *f = fopen(path, "w");
	int i;

	if (!f)
		fatal(path);
	fprintf(f, "%llx %llx ", (unsigned long long)(s->site - s->entry), in->old_handler);
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
	uint64_t getppid_fn, counters[2], site, text;
	int code_near, data_near;
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
	/*
	 * What trampolines need: both arenas within 2 GiB above kernel text (rel32 reach). The data
	 * arena is the module's .bss; the code arena is module text, or since 6.10 memory from
	 * execmem_alloc() beside the module.
	 */
	text = ksym("_text");
	code_near = in.code_base > text && in.code_base + in.code_size - text <= 1ULL << 31;
	data_near = in.data_base > text && in.data_base + in.data_size - text <= 1ULL << 31;
	check(code_near && data_near && in.code_size == 16 << 20 && in.data_size == 4 << 20,
	      "the arenas (16 MiB of code at %llx, 4 MiB of data at %llx) lie within 2 GiB above kernel text (%llx)",
	      in.code_base, in.data_base, (unsigned long long)text);

	test_user_int();

	getppid_fn = ksym("__x64_sys_getppid");
	s.entry = entry_len(getppid_fn);
	s.site = getppid_fn + s.entry;
	check(kread(getppid_fn, s.orig, 16) == 0, "READ 16 bytes of __x64_sys_getppid");
	check(s.orig[s.entry] == 0x53 && s.orig[s.entry + 1] == 0xe8,
	      "__x64_sys_getppid+%u holds push rbx; call rel32 (%02x %02x)", s.entry,
	      s.orig[s.entry], s.orig[s.entry + 1]);
	s.callee = s.site + 6 + (uint64_t)get32(s.orig + s.entry + 2);

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
	site = ksym("__x64_sys_getpid");
	site += entry_len(site);
	memset(patch, 0, sizeof(patch));
	patch[0].addr = s.site;
	patch[0].len = 2;
	memcpy(patch[0].old_bytes, s.orig + s.entry, 2);
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
	check(kread(s.site, now, 2) == 0 && !memcmp(now, s.orig + s.entry, 2),
	      "... and patch 0 was not written");
	check(kread(site, now, 2) == 0 && !memcmp(now, res.found, 2),
	      "... and it reports the bytes found (%02x %02x)", res.found[0], res.found[1]);

	check(apply(patch, 1, &res) == 0, "APPLY the trap at __x64_sys_getppid+%u", s.entry);
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
	/* LIST_HIT: a second entry (getpid+1, where no trap is written) is never hit. */
	{
		struct trapvec_dispatch_entry idle = entry;
		uint64_t idle_site = ksym("__x64_sys_getpid") + 1;

		idle.site = idle_site;
		check(dispatch_add(&idle, 1, &failed) == 0, "DISPATCH_ADD an entry no trap enters");
		list.capacity = 0;
		/* The calls come first: check()'s arguments are evaluated in no fixed order. */
		ret = tv(TRAPVEC_IOC_LIST, &list);
		check(!ret && list.count == 2, "LIST with capacity 0: how many entries (%u, want 2)",
		      list.count);
		ret = tv(TRAPVEC_IOC_LIST_HIT, &list);
		check(!ret && list.count == 1,
		      "LIST_HIT with capacity 0: how many were hit (%u, want 1)", list.count);
		list.capacity = 4;
		memset(le, 0, sizeof(le[0]) * 4);
		check(tv(TRAPVEC_IOC_LIST_HIT, &list) == 0 && list.count == 1 &&
		      le[0].site == s.site && le[0].hits == h.hits && le[0].missed == h.missed &&
		      le[0].cookie == 0x1234 && le[1].site == 0,
		      "LIST_HIT: the hit entry only, with its counters");
		check(tv(TRAPVEC_IOC_LIST, &list) == 0 && list.count == 2 &&
		      (le[0].site < le[1].site) && (le[0].site == idle_site || le[1].site == idle_site),
		      "LIST: both entries, in site order");
		list.start = 1;
		memset(le, 0, sizeof(le[0]) * 4);
		check(tv(TRAPVEC_IOC_LIST_HIT, &list) == 0 && list.count == 1 && le[0].site == 0,
		      "LIST_HIT from past its last entry copies nothing");
		list.start = 0;
		check(dispatch_remove(&idle_site, 1, &failed) == 0, "DISPATCH_REMOVE it");
	}
	info(&in);
	check(in.live_patches == 1 && in.dispatch_entries == 1, "INFO: 1 live patch, 1 entry");

	/* DISPATCH_REPLACE: the trap stays, the site's entry changes in one step. */
	{
		struct trapvec_dispatch_entry two[2] = { entry, entry };
		struct trapvec_hits counts[2], now_h;
		struct trapvec_dispatch_replace r;

		two[1].site = ksym("__x64_sys_getpid");
		two[1].site += entry_len(two[1].site);
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
		test_check_many(getppid_fn, &in);
		test_big_batch(BIG_BATCH);
		info(&in);
		save_state(leave, &s, &in);
	}
	return finish();
}
