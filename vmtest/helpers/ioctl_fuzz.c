// SPDX-License-Identifier: GPL-2.0
/*
 * ioctl_fuzz - random and mutated requests against /dev/trapvec (built `cc -static -O2` by
 * vmtest), for the VM scenario kernel_ioctl_fuzz.sh.
 *
 *   ioctl_fuzz SECONDS SEED TEXT_ADDR
 *
 * For SECONDS, sends requests chosen at random: unknown command numbers and known ones with the
 * wrong size or direction; every known command with random sizes, offsets, counts, addresses,
 * ids and user pointers (valid, NULL, unmapped, kernel addresses). TEXT_ADDR is a kernel
 * function (hex) near which CHECK, READ and APPLY aim. An APPLY never asks for a change that
 * could succeed: its old bytes are the current bytes with one changed (read first through
 * READ), or its address is not text, so the kernel's code is never written by the fuzzer.
 *
 * Every failed request must fail with an errno the module documents; anything else is printed
 * as FUZZ_ODD=<command> <errno>. At the end everything the fuzzer made (blocks, dispatch
 * entries, keyed-count slots, the state blob) is undone, QUIESCE is called, and INFO's
 * counters must be back where they were: FUZZ_LEAK_* lines say by how much they are not.
 *
 * Before the random requests, FREE of a block that a live dispatch entry or return slot of the
 * fuzzer's own still enters must fail with EBUSY (free_probe()); during them, no FREE that
 * succeeds may free a block holding the handler of a return slot the fuzzer holds. Either is odd.
 *
 * Prints KEY=value lines: FUZZ_REQUESTS, FUZZ_OK, FUZZ_ERRNO_<name>, FUZZ_LEAK_CODE,
 * FUZZ_LEAK_DATA, FUZZ_LEAK_ENTRIES, FUZZ_LEAK_PATCHES, FUZZ_KEYS_TAKEN (keyed-count slots it
 * took), FUZZ_FREE_DISPATCH_DEST and FUZZ_FREE_RETURN_HANDLER (errnos of the probe's FREEs),
 * FUZZ_FREED_REFERENCED, FUZZ_RETURN_SLOTS_USED (return slots it ever took: each keeps its
 * counters, ENTRY allocations, until unload), FUZZ_ODD (if any).
 * Exit status: 0 when the run finished (the verdict is in the lines), 2 on bad usage or when
 * /dev/trapvec cannot be opened.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../kmod/trapvec_abi.h"

#define MAX_IDS 256
/* The user buffer: room for the largest READ and LIST, then a guard page that faults. */
#define BUF_SIZE (4U << 20)
/* Block ids the fuzzer may use without owning them: far above any id the module hands out. */
#define FOREIGN_ID (1ULL << 62)

static uint64_t rng_state;

/* xorshift64*: reproducible from the seed. */
static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

static int fd;
static uint64_t text_addr;
static struct trapvec_info info0;
static uint64_t ids[MAX_IDS];
/* Where each of ids[] is, and its size as asked (ids[i] covers [addrs[i], addrs[i] + sizes[i])). */
static uint64_t addrs[MAX_IDS], sizes[MAX_IDS];
static unsigned int nids;
static uint64_t sites[MAX_IDS];
static unsigned int nsites;
static unsigned long requests, oks;
static unsigned long errnos[256];
static unsigned long odd;
static unsigned char *page;	/* a valid user buffer (BUF_SIZE), filled with noise */
static unsigned char *unmapped;	/* an address that faults */

/* A user pointer: mostly valid, sometimes NULL, unmapped, misaligned or a kernel address. */
static uint64_t user_ptr(void)
{
	switch (below(10)) {
	case 0:
		return 0;
	case 1:
		return (uint64_t)(uintptr_t)unmapped;
	case 2:
		return text_addr;
	case 3:
		return (uint64_t)(uintptr_t)(page + BUF_SIZE - below(64)); /* runs into the guard */
	default:
		return (uint64_t)(uintptr_t)(page + below(256));
	}
}

/* A size or count: small, at a limit, just past it, or huge. */
static uint64_t amount(uint64_t limit)
{
	switch (below(8)) {
	case 0:
		return 0;
	case 1:
		return limit;
	case 2:
		return limit + 1;
	case 3:
		return rnd();
	case 4:
		return (uint64_t)-1;
	default:
		return below(limit + 2);
	}
}

/* A kernel address: near the function, in an arena, in the module, or anywhere. */
static uint64_t kaddr(void)
{
	switch (below(7)) {
	case 0:
		return rnd();
	case 1:
		return info0.code_base + below(info0.code_size + 64);
	case 2:
		return info0.data_base + below(info0.data_size + 64);
	case 3:
		return info0.module_base + below(info0.module_size);
	case 4:
		return 0;
	default:
		return text_addr + below(0x200);
	}
}

/*
 * A block id: one the fuzzer allocated, or one no block has. Never another owner's block:
 * writing or freeing trapctl's live trampolines is something root may do to the kernel (as
 * through /dev/mem), not a bug to find.
 */
static uint64_t block_id(void)
{
	if (nids && below(4))
		return ids[below(nids)];
	return FOREIGN_ID | rnd();
}

/* Sites of live splices (read by LIST at the start): never removed or reused by the fuzzer. */
static uint64_t live[4096];
static uint32_t nlive;

static int is_live(uint64_t site)
{
	for (uint32_t i = 0; i < nlive; i++)
		if (live[i] == site)
			return 1;
	return 0;
}

/* A site for a dispatch entry: a kernel address (odd, as many sites are) that is not live. */
static uint64_t free_site(void)
{
	uint64_t s;

	do
		s = below(2) ? kaddr() | 1 : rnd();
	while (is_live(s));
	return s;
}

/* The errnos the module's interface documents. */
static int expected_errno(int e)
{
	switch (e) {
	case EINVAL: case EFAULT: case ENOTTY: case EPERM: case ENOMEM: case ENOSPC:
	case EBUSY: case ESTALE: case ENOENT: case EEXIST: case E2BIG: case ERANGE:
	case EOVERFLOW: case ENXIO: case EACCES: case EOPNOTSUPP: case ENOEXEC:
		return 1;
	}
	return 0;
}

static double now(void);

/* The slowest request of the run, printed as FUZZ_SLOWEST: one that holds the module for
 * seconds is a fault of its own, and it starves the run of requests. */
static double slowest;
static const char *slowest_what = "none";
static unsigned long slowest_cmd;

static long call(unsigned long cmd, void *arg, const char *what)
{
	double start = now();
	long ret = ioctl(fd, cmd, arg);
	double took = now() - start;

	if (took > slowest) {
		slowest = took;
		slowest_what = what;
		slowest_cmd = cmd;
	}
	requests++;
	if (ret == 0) {
		oks++;
		return 0;
	}
	errnos[errno & 0xff]++;
	if (!expected_errno(errno)) {
		odd++;
		printf("FUZZ_ODD=%s %d (%s)\n", what, errno, strerror(errno));
	}
	return -1;
}

static void fill_noise(void *buf, size_t len)
{
	unsigned char *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)rnd();
}

static void fuzz_read(void)
{
	struct trapvec_read r = {
		.addr = kaddr(),
		.buf = user_ptr(),
		.len = (uint32_t)amount(TRAPVEC_XFER_MAX),
	};
	call(TRAPVEC_IOC_READ, &r, "READ");
}

static void fuzz_alloc(void)
{
	struct trapvec_alloc a = {
		.kind = (uint32_t)below(4),
		.size = below(2) ? below(4096) : amount(info0.code_size),
	};
	if (call(TRAPVEC_IOC_ALLOC, &a, "ALLOC") == 0 && nids < MAX_IDS) {
		addrs[nids] = a.addr;
		sizes[nids] = a.size;
		ids[nids++] = a.id;
	}
}

/* Return-point slots the fuzzer took (RETURN_ADD), given back at the end. */
static struct trapvec_return_add rets[TRAPVEC_RETURN_SLOTS];
static unsigned int nrets;
static unsigned long freed_referenced;
/* Every slot number RETURN_ADD ever gave the fuzzer (each keeps its counters until unload). */
static unsigned char slot_used[TRAPVEC_RETURN_SLOTS];

static void took_slot(uint32_t slot)
{
	if (slot < TRAPVEC_RETURN_SLOTS)
		slot_used[slot] = 1;
}

/* Forget block i of ids[] (FREE succeeded). */
static void forget_block(unsigned int i)
{
	--nids;
	ids[i] = ids[nids];
	addrs[i] = addrs[nids];
	sizes[i] = sizes[nids];
}

/*
 * A FREE of block i succeeded: none of the fuzzer's return slots may still have its handler in
 * it (the module must refuse that FREE with EBUSY).
 */
static void check_freed(unsigned int i)
{
	for (unsigned int r = 0; r < nrets; r++)
		if (rets[r].handler >= addrs[i] && rets[r].handler < addrs[i] + sizes[i]) {
			freed_referenced++;
			odd++;
			printf("FUZZ_ODD=FREE of block %llu succeeded under return slot %u's handler %#llx\n",
			       (unsigned long long)ids[i], rets[r].slot, (unsigned long long)rets[r].handler);
		}
}

/*
 * RETURN_ADD with a handler in one of the fuzzer's blocks (sealed or not, freed or not) or
 * anywhere, RETURN_REMOVE of its own slots or of a generation no slot has. No splice enters
 * the fuzzer's slots: the handler is never called.
 */
static void fuzz_returns(void)
{
	struct trapvec_return_remove rm;
	struct trapvec_return_add a;
	unsigned int i;

	if (below(2)) {
		a = (struct trapvec_return_add){
			.handler = nids && below(4) ? addrs[below(nids)] + below(16) : kaddr(),
			.cookie = rnd(),
			.maxactive = below(4) ? 1 + (uint32_t)below(8) : (uint32_t)rnd(),
			.clock = (uint32_t)below(4),
		};
		if (nrets < TRAPVEC_RETURN_SLOTS && !call(TRAPVEC_IOC_RETURN_ADD, &a, "RETURN_ADD")) {
			took_slot(a.slot);
			rets[nrets++] = a;
		}
	} else if (nrets && below(2)) {
		i = (unsigned int)below(nrets);
		rm = (struct trapvec_return_remove){ .slot = rets[i].slot, .generation = rets[i].generation };
		if (!call(TRAPVEC_IOC_RETURN_REMOVE, &rm, "RETURN_REMOVE"))
			rets[i] = rets[--nrets];
	} else {
		rm = (struct trapvec_return_remove){ .slot = (uint32_t)rnd(), .generation = (uint32_t)rnd() | 1U << 31 };
		call(TRAPVEC_IOC_RETURN_REMOVE, &rm, "RETURN_REMOVE");
	}
}

static void fuzz_write(void)
{
	struct trapvec_write w = {
		.id = block_id(),
		.offset = below(2) ? below(64) : rnd(),
		.buf = user_ptr(),
		.len = (uint32_t)amount(256),
	};
	call(TRAPVEC_IOC_WRITE, &w, "WRITE");
}

static void fuzz_seal_free(int seal)
{
	struct trapvec_block b = { .id = block_id() };

	if (call(seal ? TRAPVEC_IOC_SEAL : TRAPVEC_IOC_FREE, &b, seal ? "SEAL" : "FREE") == 0 && !seal) {
		for (unsigned int i = 0; i < nids; i++)
			if (ids[i] == b.id) {
				check_freed(i);
				forget_block(i);
				break;
			}
	}
}

static void fuzz_check(void)
{
	struct trapvec_check c = {
		.addr = kaddr(),
		.len = (uint32_t)amount(TRAPVEC_PATCH_MAX),
		/* The kprobe cross-check costs an RCU grace period: mostly skip it. */
		.flags = below(8) ? TRAPVEC_CHECK_NO_KPROBE : (uint32_t)rnd(),
	};
	call(TRAPVEC_IOC_CHECK, &c, "CHECK");
}

/* A patch that cannot apply: wrong old bytes over text, or an address that is not text. */
static void doomed_patch(struct trapvec_patch *p)
{
	struct trapvec_read r;

	memset(p, 0, sizeof(*p));
	p->addr = below(4) ? text_addr + below(0x100) : kaddr();
	p->len = (uint32_t)(below(8) ? 1 + below(TRAPVEC_PATCH_MAX) : amount(TRAPVEC_PATCH_MAX));
	fill_noise(p->new_bytes, sizeof(p->new_bytes));
	r.addr = p->addr;
	r.buf = (uint64_t)(uintptr_t)p->old_bytes;
	r.len = TRAPVEC_PATCH_MAX;
	r.flags = 0;
	if (ioctl(fd, TRAPVEC_IOC_READ, &r) == 0) {
		/* The current bytes with one of the first len changed: a certain mismatch. */
		uint32_t n = p->len && p->len <= TRAPVEC_PATCH_MAX ? p->len : 1;

		p->old_bytes[below(n)] ^= (unsigned char)(1 + below(255));
	} else {
		fill_noise(p->old_bytes, sizeof(p->old_bytes));
		if (!below(4))
			p->addr = (uint64_t)(uintptr_t)unmapped; /* a user address */
	}
}

static void fuzz_apply(void)
{
	static struct trapvec_patch patches[8];
	struct trapvec_apply a;
	uint32_t n = (uint32_t)below(9);

	for (uint32_t i = 0; i < n; i++)
		doomed_patch(&patches[i]);
	memset(&a, 0, sizeof(a));
	a.patches = below(6) ? (uint64_t)(uintptr_t)patches : user_ptr();
	/* count beyond the array only with a pointer that cannot be read that far */
	a.count = below(6) ? n : (uint32_t)amount(TRAPVEC_BATCH_MAX);
	if (a.count > n && a.patches == (uint64_t)(uintptr_t)patches)
		a.count = n;
	a.flags = below(6) ? 0 : (uint32_t)rnd();
	call(TRAPVEC_IOC_APPLY, &a, "APPLY");
}

static void fuzz_dispatch_add(void)
{
	static struct trapvec_dispatch_entry e[4];
	struct trapvec_dispatch_add a;
	uint32_t n = (uint32_t)below(5);

	for (uint32_t i = 0; i < n; i++) {
		/* Sites no trap is ever written at: random kernel addresses. */
		e[i].site = free_site();
		e[i].dest = below(2) ? info0.code_base + below(info0.code_size) : kaddr();
		e[i].handler = below(2) ? 0 : kaddr();
		e[i].cookie = rnd();
		/* A task predicate: valid bits or noise, a skip in the arena or anywhere. */
		memset(&e[i].only, 0, sizeof(e[i].only));
		if (below(2)) {
			e[i].only.match = below(2) ? (uint32_t)below(8) : (uint32_t)rnd();
			e[i].only.pid = (uint32_t)rnd();
			e[i].only.tgid = (uint32_t)rnd();
			e[i].only.pad = below(4) ? 0 : (uint32_t)rnd();
			e[i].only.skip = below(2) ? info0.code_base + below(info0.code_size) : kaddr();
			fill_noise(e[i].only.comm, sizeof(e[i].only.comm));
		}
	}
	a.entries = below(6) ? (uint64_t)(uintptr_t)e : user_ptr();
	a.count = below(6) ? n : (uint32_t)amount(1 << 20);
	if (a.count > n && a.entries == (uint64_t)(uintptr_t)e)
		a.count = n;
	a.failed_index = 0;
	if (call(TRAPVEC_IOC_DISPATCH_ADD, &a, "DISPATCH_ADD") == 0 &&
	    a.entries == (uint64_t)(uintptr_t)e)
		for (uint32_t i = 0; i < a.count && nsites < MAX_IDS; i++)
			sites[nsites++] = e[i].site;
}

static void fuzz_dispatch_remove(void)
{
	static uint64_t s[4];
	struct trapvec_dispatch_remove r;
	uint32_t n = (uint32_t)below(5);

	for (uint32_t i = 0; i < n; i++)
		s[i] = nsites && below(2) ? sites[below(nsites)] : free_site();
	r.sites = below(6) ? (uint64_t)(uintptr_t)s : user_ptr();
	r.count = below(6) ? n : (uint32_t)amount(1 << 20);
	if (r.count > n && r.sites == (uint64_t)(uintptr_t)s)
		r.count = n;
	r.failed_index = 0;
	if (call(TRAPVEC_IOC_DISPATCH_REMOVE, &r, "DISPATCH_REMOVE") == 0 &&
	    r.sites == (uint64_t)(uintptr_t)s)
		for (uint32_t i = 0; i < r.count; i++)
			for (unsigned int j = 0; j < nsites; j++)
				if (sites[j] == s[i]) {
					sites[j] = sites[--nsites];
					break;
				}
}

/*
 * DISPATCH_REPLACE on sites the fuzzer gave entries (no trap is ever written there) or on
 * sites without one; never on the live sites, which keep counting.
 */
static void fuzz_dispatch_replace(void)
{
	static struct trapvec_dispatch_entry e[4];
	static struct trapvec_hits c[4];
	struct trapvec_dispatch_replace r;
	uint32_t n = (uint32_t)below(5);

	for (uint32_t i = 0; i < n; i++) {
		e[i].site = nsites && below(4) ? sites[below(nsites)] : free_site();
		e[i].dest = below(2) ? info0.code_base + below(info0.code_size) : kaddr();
		e[i].handler = below(2) ? 0 : kaddr();
		e[i].cookie = rnd();
		memset(&e[i].only, 0, sizeof(e[i].only));
		if (!below(4)) {
			e[i].only.match = (uint32_t)rnd();
			e[i].only.skip = kaddr();
		}
		c[i].site = rnd();
		c[i].hits = rnd();
		c[i].missed = rnd();
	}
	r.entries = below(6) ? (uint64_t)(uintptr_t)e : user_ptr();
	r.counts = below(6) ? (uint64_t)(uintptr_t)c : user_ptr();
	r.count = below(6) ? n : (uint32_t)amount(1 << 20);
	if (r.count > n && r.entries == (uint64_t)(uintptr_t)e && r.counts == (uint64_t)(uintptr_t)c)
		r.count = n;
	r.failed_index = 0;
	call(TRAPVEC_IOC_DISPATCH_REPLACE, &r, "DISPATCH_REPLACE");
}

static void fuzz_query(void)
{
	struct trapvec_hits h = { .site = below(2) ? text_addr + below(16) : kaddr() };
	struct trapvec_list l = { .entries = user_ptr(), .capacity = (uint32_t)amount(64) };
	struct trapvec_info i;

	switch (below(3)) {
	case 0:
		call(TRAPVEC_IOC_HITS, &h, "HITS");
		break;
	case 1:
		/* capacity entries must fit in the buffer when the pointer is the buffer */
		if (l.entries >= (uint64_t)(uintptr_t)page &&
		    l.entries < (uint64_t)(uintptr_t)page + BUF_SIZE && l.capacity > 4096)
			l.capacity = 4096;
		call(TRAPVEC_IOC_LIST, &l, "LIST");
		break;
	default:
		call(TRAPVEC_IOC_INFO, &i, "INFO");
	}
}

/* Keyed-count slots the fuzzer took (KEY_ADD), removed at the end. */
static struct trapvec_key_add keys[TRAPVEC_KEY_SLOTS];
static unsigned int nkeys;
static unsigned long keys_taken;

/*
 * KEY_ADD (known and unknown keys), KEY_STATS (own or random slots and generations, any user
 * pointer and capacity: no splice counts into the fuzzer's slots, so nothing is copied out of
 * a live one, but stale ones are refused first), KEY_REMOVE of its own slots or of slots under
 * a generation no slot has (never another owner's: trapctl's keyed counts).
 */
static void fuzz_keys(void)
{
	struct trapvec_key_stats st = {
		.slot = nkeys && below(2) ? keys[below(nkeys)].slot : (uint32_t)below(TRAPVEC_KEY_SLOTS + 4),
		.generation = nkeys && below(2) ? keys[below(nkeys)].generation : (uint32_t)rnd(),
		.entries = user_ptr(),
		.capacity = (uint32_t)amount(TRAPVEC_KEY_TABLE),
	};
	struct trapvec_key_remove rm;
	struct trapvec_key_add a;
	unsigned int i;

	switch (below(3)) {
	case 0:
		a = (struct trapvec_key_add){ .by = below(3) ? 1 + (uint32_t)below(4) : (uint32_t)rnd() };
		if (nkeys < TRAPVEC_KEY_SLOTS && !call(TRAPVEC_IOC_KEY_ADD, &a, "KEY_ADD")) {
			keys[nkeys++] = a;
			keys_taken++;
		}
		break;
	case 1:
		call(TRAPVEC_IOC_KEY_STATS, &st, "KEY_STATS");
		break;
	default:
		if (nkeys && below(2)) {
			i = (unsigned int)below(nkeys);
			rm = (struct trapvec_key_remove){ .slot = keys[i].slot, .generation = keys[i].generation };
			if (!call(TRAPVEC_IOC_KEY_REMOVE, &rm, "KEY_REMOVE"))
				keys[i] = keys[--nkeys];
		} else {
			/* Generations count up from 1 per slot: bit 31 is never one of them. */
			rm = (struct trapvec_key_remove){ .slot = (uint32_t)rnd(), .generation = (uint32_t)rnd() | 1U << 31 };
			call(TRAPVEC_IOC_KEY_REMOVE, &rm, "KEY_REMOVE");
		}
	}
}

static void fuzz_state(void)
{
	struct trapvec_state s = {
		.buf = user_ptr(),
		.len = amount(TRAPVEC_STATE_MAX),
		.generation = rnd(),
	};

	/* A GET may write len bytes at buf: keep it inside the buffer when buf is the buffer. */
	if (s.buf >= (uint64_t)(uintptr_t)page && s.buf < (uint64_t)(uintptr_t)page + BUF_SIZE &&
	    s.len > BUF_SIZE / 2)
		s.len = below(BUF_SIZE / 2);
	/* PUT with a random generation: almost always -ESTALE; the blob is put back at the end. */
	call(below(3) ? TRAPVEC_IOC_STATE_GET : TRAPVEC_IOC_STATE_PUT, &s, "STATE");
}

/* A command number that is not the module's, or is but with another size or direction. */
static void fuzz_raw(void)
{
	unsigned long cmd;

	switch (below(3)) {
	case 0:
		cmd = _IOC(below(4), TRAPVEC_IOC_MAGIC, below(32), below(512));
		break;
	case 1:
		cmd = _IOC(below(4), below(256), below(256), below(1 << 14));
		break;
	default:
		cmd = (unsigned long)rnd();
	}
	/* Known commands with their right size are fuzzed above: skip them here. */
	switch (cmd) {
	case TRAPVEC_IOC_INFO: case TRAPVEC_IOC_READ: case TRAPVEC_IOC_ALLOC: case TRAPVEC_IOC_WRITE:
	case TRAPVEC_IOC_SEAL: case TRAPVEC_IOC_FREE: case TRAPVEC_IOC_CHECK: case TRAPVEC_IOC_APPLY:
	case TRAPVEC_IOC_DISPATCH_ADD: case TRAPVEC_IOC_DISPATCH_REMOVE: case TRAPVEC_IOC_HITS:
	case TRAPVEC_IOC_DISPATCH_REPLACE:
	case TRAPVEC_IOC_LIST: case TRAPVEC_IOC_QUIESCE: case TRAPVEC_IOC_STATE_GET:
	case TRAPVEC_IOC_STATE_PUT: case TRAPVEC_IOC_RETURN_ADD: case TRAPVEC_IOC_RETURN_REMOVE:
	case TRAPVEC_IOC_RETURN_STATS: case TRAPVEC_IOC_KEY_ADD: case TRAPVEC_IOC_KEY_REMOVE:
	case TRAPVEC_IOC_KEY_STATS:
		return;
	}
	fill_noise(page, 4096);
	/* An ioctl the module does not know may still be one the VFS knows (FIONREAD, ...): its
	 * argument is the buffer, with room for whatever it writes. */
	call(cmd, below(4) ? page : (void *)(uintptr_t)user_ptr(), "RAW");
}

/* A step of free_probe() that went wrong: counted as odd, so the run fails. */
static void probe_odd(const char *what, int err)
{
	odd++;
	printf("FUZZ_ODD=%s: %d (%s)\n", what, err, strerror(err));
}

/*
 * Before the random requests: FREE of a block a live patch of the fuzzer's own still enters
 * must fail with EBUSY, for a dispatch entry's destination (at a site no trap is written at)
 * and for a return slot's handler, and succeed once the entry and the slot are gone. Anything
 * else is odd (FUZZ_ODD_COUNT); FUZZ_FREE_DISPATCH_DEST and FUZZ_FREE_RETURN_HANDLER print the
 * errnos of the two refused FREEs.
 */
static void free_probe(void)
{
	static const uint8_t ret_insn = 0xc3;
	struct trapvec_alloc blk[2] = { { .kind = TRAPVEC_BLOCK_CODE, .size = 16 },
					{ .kind = TRAPVEC_BLOCK_CODE, .size = 16 } };
	struct trapvec_dispatch_entry e = {};
	struct trapvec_dispatch_add add = { .entries = (uint64_t)(uintptr_t)&e, .count = 1 };
	struct trapvec_dispatch_remove drm = { .sites = (uint64_t)(uintptr_t)&e.site, .count = 1 };
	struct trapvec_return_add ra = { .maxactive = 1 };
	struct trapvec_return_remove rrm;
	struct trapvec_block b;
	int err;

	for (int i = 0; i < 2; i++) {
		struct trapvec_write w = { .buf = (uint64_t)(uintptr_t)&ret_insn, .len = 1 };

		if (ioctl(fd, TRAPVEC_IOC_ALLOC, &blk[i])) {
			probe_odd("probe ALLOC", errno);
			return;
		}
		w.id = blk[i].id;
		b.id = blk[i].id;
		if (ioctl(fd, TRAPVEC_IOC_WRITE, &w) || ioctl(fd, TRAPVEC_IOC_SEAL, &b)) {
			probe_odd("probe WRITE/SEAL", errno);
			return;
		}
	}
	/* Kernel text (DISPATCH_ADD checks that) where no trap is ever written: mid-instruction. */
	e.site = text_addr + 1;
	e.dest = blk[0].addr;
	ra.handler = blk[1].addr;
	if (ioctl(fd, TRAPVEC_IOC_DISPATCH_ADD, &add) || ioctl(fd, TRAPVEC_IOC_RETURN_ADD, &ra)) {
		probe_odd("probe DISPATCH_ADD/RETURN_ADD", errno);
		return;
	}
	took_slot(ra.slot);
	b.id = blk[0].id;
	err = ioctl(fd, TRAPVEC_IOC_FREE, &b) ? errno : 0;
	printf("FUZZ_FREE_DISPATCH_DEST=%d\n", err);
	if (err != EBUSY)
		probe_odd("FREE of a dispatch entry's destination block", err);
	b.id = blk[1].id;
	err = ioctl(fd, TRAPVEC_IOC_FREE, &b) ? errno : 0;
	printf("FUZZ_FREE_RETURN_HANDLER=%d\n", err);
	if (err != EBUSY)
		probe_odd("FREE of a live return slot's handler block", err);
	rrm = (struct trapvec_return_remove){ .slot = ra.slot, .generation = ra.generation };
	if (ioctl(fd, TRAPVEC_IOC_DISPATCH_REMOVE, &drm) || ioctl(fd, TRAPVEC_IOC_RETURN_REMOVE, &rrm)) {
		probe_odd("probe DISPATCH_REMOVE/RETURN_REMOVE", errno);
		return;
	}
	for (int i = 0; i < 2; i++) {
		b.id = blk[i].id;
		/* A block FREE refused above is still allocated; one FREE let through is gone. */
		if (ioctl(fd, TRAPVEC_IOC_FREE, &b) && errno != ENOENT)
			probe_odd("FREE once nothing enters the block", errno);
	}
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	static unsigned char blob[TRAPVEC_STATE_MAX];
	struct trapvec_state saved = { .buf = (uint64_t)(uintptr_t)blob, .len = sizeof(blob) };
	struct trapvec_quiesce q;
	struct trapvec_info end;
	double deadline;

	if (argc != 4) {
		fprintf(stderr, "usage: ioctl_fuzz SECONDS SEED TEXT_ADDR\n");
		return 2;
	}
	deadline = now() + atof(argv[1]);
	rng_state = strtoull(argv[2], NULL, 0) | 1;
	text_addr = strtoull(argv[3], NULL, 16);
	fd = open("/dev/trapvec", O_RDWR);
	if (fd < 0) {
		perror("/dev/trapvec");
		return 2;
	}
	page = mmap(NULL, BUF_SIZE + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED || mprotect(page + BUF_SIZE, 4096, PROT_NONE)) {
		perror("ioctl_fuzz: buffer");
		return 2;
	}
	unmapped = page + BUF_SIZE;
	{
		static struct trapvec_list_entry entries[4096];
		struct trapvec_list l = { .entries = (uint64_t)(uintptr_t)entries, .capacity = 4096 };

		if (ioctl(fd, TRAPVEC_IOC_INFO, &info0) || ioctl(fd, TRAPVEC_IOC_STATE_GET, &saved) ||
		    ioctl(fd, TRAPVEC_IOC_LIST, &l)) {
			perror("ioctl_fuzz: set-up");
			return 2;
		}
		for (nlive = 0; nlive < l.count && nlive < 4096; nlive++)
			live[nlive] = entries[nlive].site;
		printf("FUZZ_LIVE_SITES=%u\n", nlive);
	}
	free_probe();
	fill_noise(page, 4096);

	while (now() < deadline) {
		for (int burst = 0; burst < 64; burst++) {
			switch (below(16)) {
			case 0: fuzz_read(); break;
			case 1: fuzz_alloc(); break;
			case 2: fuzz_write(); break;
			case 3: fuzz_seal_free(1); break;
			case 4: fuzz_seal_free(0); break;
			case 5: fuzz_check(); break;
			case 6: case 7: fuzz_apply(); break;
			case 8: fuzz_dispatch_add(); break;
			case 9:
				if (below(2))
					fuzz_dispatch_remove();
				else
					fuzz_dispatch_replace();
				break;
			case 10: fuzz_query(); break;
			case 11: fuzz_state(); break;
			case 12: fuzz_keys(); break;
			case 13: fuzz_returns(); break;
			default: fuzz_raw(); break;
			}
		}
		/* Reuse freed blocks now and then, as trapctl does after removals. */
		if (!below(8))
			call(TRAPVEC_IOC_QUIESCE, &q, "QUIESCE");
	}

	/* Undo what was made: entries first (nothing traps there), then blocks, then the blob. */
	while (nsites) {
		struct trapvec_dispatch_remove r = { .sites = (uint64_t)(uintptr_t)&sites[nsites - 1], .count = 1 };

		if (ioctl(fd, TRAPVEC_IOC_DISPATCH_REMOVE, &r))
			printf("FUZZ_CLEANUP=DISPATCH_REMOVE %#llx: %s\n", (unsigned long long)sites[nsites - 1], strerror(errno));
		nsites--;
	}
	while (nkeys) {
		struct trapvec_key_remove r = { .slot = keys[nkeys - 1].slot, .generation = keys[nkeys - 1].generation };

		if (ioctl(fd, TRAPVEC_IOC_KEY_REMOVE, &r))
			printf("FUZZ_CLEANUP=KEY_REMOVE %u: %s\n", r.slot, strerror(errno));
		nkeys--;
	}
	while (nrets) {
		struct trapvec_return_remove r = { .slot = rets[nrets - 1].slot, .generation = rets[nrets - 1].generation };

		if (ioctl(fd, TRAPVEC_IOC_RETURN_REMOVE, &r))
			printf("FUZZ_CLEANUP=RETURN_REMOVE %u: %s\n", r.slot, strerror(errno));
		nrets--;
	}
	while (nids) {
		struct trapvec_block b = { .id = ids[--nids] };

		if (ioctl(fd, TRAPVEC_IOC_FREE, &b))
			printf("FUZZ_CLEANUP=FREE %llu: %s\n", (unsigned long long)b.id, strerror(errno));
	}
	if (ioctl(fd, TRAPVEC_IOC_QUIESCE, &q) || ioctl(fd, TRAPVEC_IOC_INFO, &end)) {
		perror("ioctl_fuzz: clean-up");
		return 2;
	}
	{
		struct trapvec_state now_state = { .buf = 0, .len = 0 };
		struct trapvec_state put = { .buf = (uint64_t)(uintptr_t)blob, .len = saved.size };

		ioctl(fd, TRAPVEC_IOC_STATE_GET, &now_state); /* -ENOSPC with len 0: fills generation */
		put.generation = now_state.generation;
		if (ioctl(fd, TRAPVEC_IOC_STATE_PUT, &put))
			printf("FUZZ_CLEANUP=STATE_PUT: %s\n", strerror(errno));
	}

	printf("FUZZ_REQUESTS=%lu\nFUZZ_OK=%lu\n", requests, oks);
	printf("FUZZ_SLOWEST=%s cmd %#lx, %.3f s\n", slowest_what, slowest_cmd, slowest);
	for (int e = 1; e < 256; e++)
		if (errnos[e])
			printf("FUZZ_ERRNO_%d=%lu\n", e, errnos[e]);
	printf("FUZZ_ODD_COUNT=%lu\n", odd);
	printf("FUZZ_KEYS_TAKEN=%lu\n", keys_taken);
	printf("FUZZ_FREED_REFERENCED=%lu\n", freed_referenced);
	{
		unsigned int used = 0;

		for (unsigned int i = 0; i < TRAPVEC_RETURN_SLOTS; i++)
			used += slot_used[i];
		printf("FUZZ_RETURN_SLOTS_USED=%u\n", used);
	}
	printf("FUZZ_LEAK_CODE=%lld\n", (long long)(end.code_used - info0.code_used));
	printf("FUZZ_LEAK_DATA=%lld\n", (long long)(end.data_used - info0.data_used));
	printf("FUZZ_LEAK_ENTRIES=%lld\n", (long long)(end.dispatch_entries - info0.dispatch_entries));
	printf("FUZZ_LEAK_PATCHES=%lld\n", (long long)(end.live_patches - info0.live_patches));
	return 0;
}
