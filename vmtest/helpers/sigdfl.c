// SPDX-License-Identifier: GPL-2.0
/*
 * sigdfl - run a command with SIGINT and SIGQUIT at their default actions (built `cc -static
 * -O2` by vmtest).
 *
 *   sigdfl COMMAND [ARGS...]
 *
 * A background job of a non-interactive shell (busybox sh in the guest) starts with SIGINT and
 * SIGQUIT ignored, and a program keeps an ignored signal ignored (trapctl does, as a shell's
 * background job expects); a scenario that ends a background command with SIGINT, as Ctrl-C
 * would, starts it through this. Exit status: the command's (exec), or 127 when it cannot run.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: sigdfl COMMAND [ARGS...]\n");
		return 2;
	}
	signal(SIGINT, SIG_DFL);
	signal(SIGQUIT, SIG_DFL);
	execvp(argv[1], argv + 1);
	fprintf(stderr, "sigdfl: %s: %s\n", argv[1], strerror(errno));
	return 127;
}
