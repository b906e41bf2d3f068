// SPDX-License-Identifier: GPL-2.0
/*
 * capbound - run a command with only some capabilities in its bounding set, as systemd's
 * CapabilityBoundingSet= does (built `cc -static -O2` by vmtest; the guest's busybox has no
 * capsh or setpriv).
 *
 *   capbound CAP[,CAP...] COMMAND [ARG...]
 *
 * CAP is a number or one of the names below (without `cap_`). Every other capability is dropped
 * from the bounding set (PR_CAPBSET_DROP), then COMMAND is executed: a root process's permitted
 * and effective sets after execve are its bounding set, so COMMAND runs as root with exactly
 * the CAPs. trapd_mss.sh runs trapd this way with trapd.service's set, and with one capability
 * of it missing.
 *
 * Exit status: COMMAND's; 2 on bad usage or when a capability cannot be dropped.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static const struct {
	const char *name;
	int cap;
} names[] = {
	{ "chown", 0 },	      { "dac_override", 1 }, { "dac_read_search", 2 },
	{ "fowner", 3 },      { "kill", 5 },	     { "setgid", 6 },
	{ "setuid", 7 },      { "net_admin", 12 },   { "ipc_lock", 14 },
	{ "sys_module", 16 }, { "sys_rawio", 17 },   { "sys_ptrace", 19 },
	{ "sys_admin", 21 },  { "syslog", 34 },	     { "bpf", 39 },
	{ "perfmon", 38 },
};

static int cap_of(const char *word)
{
	char *end;
	long n = strtol(word, &end, 10);

	if (*word && !*end && n >= 0 && n < 64)
		return (int)n;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(word, names[i].name) == 0)
			return names[i].cap;
	return -1;
}

static int last_cap(void)
{
	FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "r");
	int last = -1;

	if (f) {
		if (fscanf(f, "%d", &last) != 1)
			last = -1;
		fclose(f);
	}
	return last;
}

int main(int argc, char **argv)
{
	unsigned long long keep = 0;
	char *list, *word, *save;
	int last;

	if (argc < 3) {
		fprintf(stderr, "usage: capbound CAP[,CAP...] COMMAND [ARG...]\n");
		return 2;
	}
	list = strdup(argv[1]);
	for (word = strtok_r(list, ",", &save); word; word = strtok_r(NULL, ",", &save)) {
		int cap = cap_of(word);

		if (cap < 0) {
			fprintf(stderr, "capbound: unknown capability `%s`\n", word);
			return 2;
		}
		keep |= 1ULL << cap;
	}
	last = last_cap();
	if (last < 0) {
		fprintf(stderr, "capbound: cannot read /proc/sys/kernel/cap_last_cap\n");
		return 2;
	}
	for (int cap = 0; cap <= last; cap++) {
		if (keep & (1ULL << cap))
			continue;
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
			fprintf(stderr, "capbound: dropping capability %d: %s\n", cap, strerror(errno));
			return 2;
		}
	}
	execvp(argv[2], argv + 2);
	fprintf(stderr, "capbound: %s: %s\n", argv[2], strerror(errno));
	return 2;
}
