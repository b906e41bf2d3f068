// SPDX-License-Identifier: GPL-2.0
/*
 * livepatch_swap - load or disable a livepatch and time it to the end of its transition, for
 * trapvec's livepatch comparison (vmtest/scenarios/peers.sh; built `cc -static -O2` by vmtest).
 *
 *   livepatch_swap enable MODULE.ko NAME [PARAMS]
 *       finit_module(MODULE.ko, PARAMS), then poll /sys/kernel/livepatch/NAME/transition every
 *       100 us until it reads 0 (every task switched to the new code). Prints on stdout
 *       `LP_LOAD_NS=N` (the finit_module call: load, relocate, klp_enable_patch) and
 *       `LP_TRANSITION_NS=N` (from before finit_module to the transition's end).
 *   livepatch_swap disable NAME
 *       write 0 to /sys/kernel/livepatch/NAME/enabled, poll until the patch's directory is gone
 *       (the reverse transition is over and the patch freed), then delete_module(NAME). Prints
 *       `LP_DISABLE_NS=N` (write to the end of the transition) and `LP_UNLOAD_NS=N` (write to
 *       the module's removal).
 *
 * A transition that takes longer than 60 s is reported as an error (a task that never leaves
 * the old function keeps it pending: /sys/kernel/livepatch/NAME/force would end it).
 * Exit status: 0 on success, 1 on any error (with the reason), 2 on bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define POLL_US 100
#define LIMIT_NS (60LL * 1000000000LL)

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int usage(void)
{
	fprintf(stderr, "usage: livepatch_swap enable MODULE.ko NAME [PARAMS] | disable NAME\n");
	return 2;
}

/* The first character of a sysfs attribute, or -1 when it cannot be read. */
static int read_flag(const char *path)
{
	char c;
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, &c, 1);
	close(fd);
	return n == 1 ? c : -1;
}

static int enable(const char *ko, const char *name, const char *params)
{
	char path[256];
	long long start, loaded, end;
	int fd, flag;

	fd = open(ko, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "livepatch_swap: %s: %s\n", ko, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "/sys/kernel/livepatch/%s/transition", name);
	start = now_ns();
	if (syscall(SYS_finit_module, fd, params, 0)) {
		fprintf(stderr, "livepatch_swap: loading %s: %s\n", ko, strerror(errno));
		close(fd);
		return 1;
	}
	loaded = now_ns();
	close(fd);
	for (;;) {
		flag = read_flag(path);
		end = now_ns();
		if (flag == '0')
			break;
		if (flag < 0) {
			fprintf(stderr, "livepatch_swap: %s loaded but %s cannot be read: is %s its patch?\n",
				ko, path, name);
			return 1;
		}
		if (end - start > LIMIT_NS) {
			fprintf(stderr, "livepatch_swap: %s still in transition after 60 s\n", name);
			return 1;
		}
		usleep(POLL_US);
	}
	printf("LP_LOAD_NS=%lld\nLP_TRANSITION_NS=%lld\n", loaded - start, end - start);
	return 0;
}

static int disable(const char *name)
{
	char path[320], dir[256];
	long long start, gone, end;
	struct stat st;
	int fd;

	snprintf(dir, sizeof(dir), "/sys/kernel/livepatch/%s", name);
	snprintf(path, sizeof(path), "/sys/kernel/livepatch/%s/enabled", name);
	fd = open(path, O_WRONLY);
	if (fd < 0) {
		fprintf(stderr, "livepatch_swap: %s: %s\n", path, strerror(errno));
		return 1;
	}
	start = now_ns();
	if (write(fd, "0", 1) != 1) {
		fprintf(stderr, "livepatch_swap: writing 0 to %s: %s\n", path, strerror(errno));
		close(fd);
		return 1;
	}
	close(fd);
	for (;;) {
		gone = now_ns();
		if (stat(dir, &st) && errno == ENOENT)
			break;
		if (gone - start > LIMIT_NS) {
			fprintf(stderr, "livepatch_swap: %s still there 60 s after disabling\n", dir);
			return 1;
		}
		usleep(POLL_US);
	}
	/* The module stays in use until the patch is freed; that is what the loop waited for. */
	while (syscall(SYS_delete_module, name, O_NONBLOCK)) {
		if (errno != EAGAIN && errno != EBUSY) {
			fprintf(stderr, "livepatch_swap: removing module %s: %s\n", name, strerror(errno));
			return 1;
		}
		if (now_ns() - start > LIMIT_NS) {
			fprintf(stderr, "livepatch_swap: module %s still busy after 60 s\n", name);
			return 1;
		}
		usleep(POLL_US);
	}
	end = now_ns();
	printf("LP_DISABLE_NS=%lld\nLP_UNLOAD_NS=%lld\n", gone - start, end - start);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && argc <= 5 && !strcmp(argv[1], "enable"))
		return enable(argv[2], argv[3], argc == 5 ? argv[4] : "");
	if (argc == 3 && !strcmp(argv[1], "disable"))
		return disable(argv[2]);
	return usage();
}
