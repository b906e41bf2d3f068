// SPDX-License-Identifier: GPL-2.0
/*
 * trapvec_test's CHECK_MANY: the batched answer is the single CHECK's (without its kprobe), for
 * every window of a few real functions and a few odd ones, given in a shuffled order.
 */
#include "tvtest.h"

#define KPROBE_EVENTS "/sys/kernel/tracing/kprobe_events"

/* Bytes from name to the next symbol's address in /proc/kallsyms (kallsyms' size). */
static uint64_t ksym_size(const char *name)
{
	uint64_t at = ksym(name), next = UINT64_MAX;
	char line[512], sym[256], type;
	unsigned long long addr;
	FILE *f = fopen("/proc/kallsyms", "r");

	if (!f)
		fatal("/proc/kallsyms");
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%llx %c %255s", &addr, &type, sym) == 3 && addr > at &&
		    addr < next)
			next = addr;
	fclose(f);
	return next - at;
}

static int kprobe_event(const char *line)
{
	int fd = open(KPROBE_EVENTS, O_WRONLY | O_APPEND), ret = 0;

	if (fd < 0 || write(fd, line, strlen(line)) != (ssize_t)strlen(line))
		ret = -errno;
	if (fd >= 0)
		close(fd);
	if (ret)
		printf("# %s: %s: %s\n", KPROBE_EVENTS, line, strerror(-ret));
	return ret;
}

/*
 * Windows that run from the end of a text symbol into the next one, where the next does not
 * begin with a fentry NOP, a call or endbr64 (whose own refusal would come first): the first
 * check to refuse them is CROSSES_SYMBOL, or THUNK where the next is __pfx_ padding (6.12).
 */
static uint32_t add_crossings(struct trapvec_check *c, uint32_t n, int want)
{
	static const uint8_t nop5[5] = { 0x0f, 0x1f, 0x44, 0x00, 0x00 };
	static const uint8_t endbr[4] = { 0xf3, 0x0f, 0x1e, 0xfa };
	uint64_t stext = ksym("_stext"), etext = ksym("_etext"), prev = 0;
	char line[512], sym[256], type;
	unsigned long long addr;
	int found = 0, lines = 0;
	FILE *f = fopen("/proc/kallsyms", "r");
	uint8_t b[5];

	if (!f)
		fatal("/proc/kallsyms");
	while (found < want && lines++ < 40000 && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%llx %c %255s", &addr, &type, sym) != 3 ||
		    (type != 't' && type != 'T') || strchr(line, '[') || addr < stext ||
		    addr >= etext)
			continue;
		if (prev && addr > prev + 2 && addr - prev < 4096 && !kread(addr, b, 5) &&
		    memcmp(b, nop5, 5) && memcmp(b, endbr, 4) && b[0] != 0xe8) {
			c[n++] = (struct trapvec_check){ .addr = addr - 1, .len = 2 };
			c[n++] = (struct trapvec_check){ .addr = addr - 2, .len = 5 };
			found++;
		}
		prev = addr;
	}
	fclose(f);
	return n;
}

/* Every byte offset of fn, and a few past its end, with windows of 1, 2, 5 and 16 bytes. */
static uint32_t add_windows(struct trapvec_check *c, uint32_t n, const char *fn)
{
	static const uint32_t lens[] = { 1, 2, 5, TRAPVEC_PATCH_MAX };
	uint64_t at = ksym(fn), size = ksym_size(fn), off;
	uint32_t l;

	for (off = 0; off < size + 8 && off < 4096; off++)
		for (l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
			c[n++] = (struct trapvec_check){ .addr = at + off, .len = lens[l] };
	return n;
}

static int check_many(struct trapvec_check *c, uint32_t n, uint32_t flags)
{
	struct trapvec_check_many m = { .checks = (uintptr_t)c, .count = n, .flags = flags };

	return tv(TRAPVEC_IOC_CHECK_MANY, &m);
}

void test_check_many(uint64_t getppid, const struct trapvec_info *in)
{
	uint32_t max = 4 * 2 * (4096 + 8) + 2 * 8 + 16, n = 0, i, j, wrong = 0, seen[TRAPVEC_REASON_MAX + 1];
	struct trapvec_check *want = calloc(max, sizeof(*want)), *got = calloc(max, sizeof(*got));
	uint64_t mss = ksym("tcp_sync_mss");
	uint32_t *order = calloc(max, sizeof(*order)), seed = 12345;
	char probe[128];
	int ret, kprobe;

	if (!want || !got || !order)
		fatal("calloc");
	/* A kprobe (registered, not enabled) on tcp_sync_mss's first instruction past its entry. */
	snprintf(probe, sizeof(probe), "p:tvtest/many tcp_sync_mss+%u", entry_len(mss));
	kprobe = kprobe_event(probe);
	check(kprobe == 0, "kprobe_events: %s", probe);

	n = add_windows(want, n, "tcp_sync_mss");
	n = add_windows(want, n, "__x64_sys_getppid");
	n = add_crossings(want, n, 8);
	want[n++] = (struct trapvec_check){ .addr = 0x400000, .len = 2 };
	want[n++] = (struct trapvec_check){ .addr = getppid, .len = 0 };
	want[n++] = (struct trapvec_check){ .addr = getppid, .len = TRAPVEC_PATCH_MAX + 1 };
	want[n++] = (struct trapvec_check){ .addr = in->code_base, .len = 2 };
	want[n++] = (struct trapvec_check){ .addr = ksym("entry_SYSCALL_64"), .len = 2 };
	want[n++] = want[7];	/* the same window twice */

	/* The reference: one CHECK each (no kprobe cross-check), in order. */
	memset(seen, 0, sizeof(seen));
	for (i = 0; i < n; i++) {
		want[i].flags = TRAPVEC_CHECK_NO_KPROBE;
		want[i].culprit = 0;
		if (tv(TRAPVEC_IOC_CHECK, &want[i]))
			fatal("CHECK");
		if (want[i].reason <= TRAPVEC_REASON_MAX)
			seen[want[i].reason]++;
	}
	/* Shuffled (Fisher-Yates, a fixed seed), the answers cleared. */
	for (i = 0; i < n; i++)
		order[i] = i;
	for (i = n - 1; i > 0; i--) {
		uint32_t t = order[i];

		seed = seed * 1103515245 + 12345;
		j = (seed >> 8) % (i + 1);
		order[i] = order[j];
		order[j] = t;
	}
	for (i = 0; i < n; i++) {
		got[i] = want[order[i]];
		got[i].reason = 0xdead;
		got[i].error = -1;
		got[i].culprit = 1;
	}
	ret = check_many(got, n, 0);
	check(ret == 0, "CHECK_MANY of %u windows, shuffled (%d)", n, ret);
	for (i = 0; !ret && i < n; i++) {
		const struct trapvec_check *w = &want[order[i]], *g = &got[i];

		if (g->reason == w->reason && g->error == w->error && g->culprit == w->culprit &&
		    g->addr == w->addr && g->len == w->len)
			continue;
		if (wrong++ < 8)
			printf("# %#llx+%u: CHECK_MANY reason %u culprit %#llx, CHECK reason %u culprit %#llx\n",
			       (unsigned long long)w->addr, w->len, g->reason,
			       (unsigned long long)g->culprit, w->reason,
			       (unsigned long long)w->culprit);
	}
	check(!ret && !wrong, "CHECK_MANY answers every window as CHECK does (%u differ)", wrong);
	printf("# reasons: NONE %u, NOT_BOUNDARY %u, FTRACE %u, LIVE_PATCH %u, KPROBE %u, CROSSES_SYMBOL %u, THUNK %u, RETURN_IN_WINDOW %u, ENDBR %u\n",
	       seen[TRAPVEC_REASON_NONE], seen[TRAPVEC_REASON_NOT_BOUNDARY],
	       seen[TRAPVEC_REASON_FTRACE], seen[TRAPVEC_REASON_LIVE_PATCH],
	       seen[TRAPVEC_REASON_KPROBE], seen[TRAPVEC_REASON_CROSSES_SYMBOL],
	       seen[TRAPVEC_REASON_THUNK], seen[TRAPVEC_REASON_RETURN_IN_WINDOW],
	       seen[TRAPVEC_REASON_ENDBR]);
	check(seen[TRAPVEC_REASON_NONE] && seen[TRAPVEC_REASON_NOT_BOUNDARY] &&
	      seen[TRAPVEC_REASON_FTRACE] && seen[TRAPVEC_REASON_LIVE_PATCH] &&
	      seen[TRAPVEC_REASON_RETURN_IN_WINDOW] &&
	      (seen[TRAPVEC_REASON_KPROBE] || kprobe) &&
	      (seen[TRAPVEC_REASON_CROSSES_SYMBOL] || seen[TRAPVEC_REASON_THUNK]),
	      "the windows include accepted ones and every refusal asked for");

	/* What the ioctl itself refuses, answering nothing. */
	got[0] = want[0];
	got[0].flags = 0;
	check(check_many(got, 1, 0) == -EINVAL,
	      "CHECK_MANY of an entry asking for the kprobe cross-check fails (EINVAL)");
	got[0].flags = TRAPVEC_CHECK_NO_KPROBE;
	check(check_many(got, 1, 1) == -EINVAL, "CHECK_MANY with a flag fails (EINVAL)");
	check(check_many(got, TRAPVEC_BATCH_MAX + 1, 0) == -E2BIG,
	      "CHECK_MANY of more than TRAPVEC_BATCH_MAX entries fails (E2BIG)");
	check(check_many(NULL, 0, 0) == 0, "CHECK_MANY of nothing succeeds");

	if (!kprobe)
		check(kprobe_event("-:tvtest/many") == 0, "kprobe_events: the probe removed");
	free(want);
	free(got);
	free(order);
}
