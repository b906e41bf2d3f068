// SPDX-License-Identifier: GPL-2.0
/*
 * lseeks - COUNT lseek(fd, OFFSET, SEEK_SET) calls on a file of /tmp, each result checked, for
 * the tail-call test (vmtest/scenarios/kernel_returns.sh splices a return point on
 * __x64_sys_lseek, which ends with `jmp ksys_lseek`).
 *
 *   lseeks OFFSET COUNT     prints "calls=COUNT wrong=W" (W: results that were not OFFSET)
 *
 * Exit status: 0 when every result was right, 1 otherwise, 2 on bad usage or setup failure.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	long offset, count, i, wrong = 0;
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: lseeks OFFSET COUNT\n");
		return 2;
	}
	offset = atol(argv[1]);
	count = atol(argv[2]);
	fd = open("/tmp/lseeks.dat", O_RDWR | O_CREAT, 0600);
	if (fd < 0) {
		perror("lseeks: /tmp/lseeks.dat");
		return 2;
	}
	for (i = 0; i < count; i++)
		if (lseek(fd, offset, SEEK_SET) != offset)
			wrong++;
	close(fd);
	printf("calls=%ld wrong=%ld\n", count, wrong);
	return wrong ? 1 : 0;
}
