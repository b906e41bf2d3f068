// SPDX-License-Identifier: GPL-2.0
/*
 * devlock - hold flock(LOCK_EX) on /dev/trapvec for SECONDS, as a trapctl command holds it
 * while it changes the kernel (vmtest/scenarios/kernel_bad_input.sh: a trapctl started
 * meanwhile waits for it).
 *
 *   devlock SECONDS     prints "held" once it has the lock, "released" just before it exits
 *                       (which lets the lock go)
 *
 * Exit status: 0, or 1 when /dev/trapvec cannot be opened or locked, 2 on bad usage.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int fd;

	if (argc != 2 || atoi(argv[1]) <= 0) {
		fprintf(stderr, "usage: devlock SECONDS\n");
		return 2;
	}
	fd = open("/dev/trapvec", O_RDWR | O_CLOEXEC);
	if (fd < 0 || flock(fd, LOCK_EX)) {
		perror("devlock: /dev/trapvec");
		return 1;
	}
	printf("held\n");
	fflush(stdout);
	sleep(atoi(argv[1]));
	printf("released\n");
	fflush(stdout);
	return 0;
}
