// SPDX-License-Identifier: GPL-2.0
/*
 * tcpmss - loopback TCP probe for trapvec's VM scenarios (built `cc -static -O2` by vmtest).
 *
 *   tcpmss                    open one connection, print its MSS
 *   tcpmss -n N               open N connections one after another, print each MSS on a line
 *   tcpmss --traffic SECONDS  stream data over one connection for SECONDS, verify every byte,
 *                             print the number of bytes received
 *
 * A connection is: listen on 127.0.0.1 (ephemeral port), connect, accept. The MSS printed is
 * TCP_MAXSEG of the connecting socket after connect(), as a bare decimal number. On loopback a
 * fresh connection reports 32741; with the route MTU at 1000 it is 948 (MTU - 52).
 *
 * Exit status: 0 on success, 1 on any socket error or corrupted stream, 2 on bad usage.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "tcpmss: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void usage(void)
{
	fprintf(stderr, "usage: tcpmss [-n CONNECTIONS] [--traffic SECONDS]\n");
	exit(2);
}

static long parse_positive(const char *arg, const char *name)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(arg, &end, 10);
	if (errno || *end || v <= 0) {
		fprintf(stderr, "tcpmss: %s must be a positive number, not '%s'\n", name, arg);
		exit(2);
	}
	return v;
}

/* A listening socket on 127.0.0.1 with a port chosen by the kernel; its address in *addr. */
static int listen_loopback(struct sockaddr_in *addr)
{
	socklen_t len = sizeof(*addr);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		die("socket");
	memset(addr, 0, sizeof(*addr));
	addr->sin_family = AF_INET;
	addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	addr->sin_port = 0;
	if (bind(fd, (struct sockaddr *)addr, sizeof(*addr)) < 0)
		die("bind 127.0.0.1:0");
	if (listen(fd, 16) < 0)
		die("listen");
	if (getsockname(fd, (struct sockaddr *)addr, &len) < 0)
		die("getsockname");
	return fd;
}

/* Connect to the listener and accept: *client is the connecting end, *server the accepted one. */
static void open_pair(int listener, const struct sockaddr_in *addr, int *client, int *server)
{
	*client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*client < 0)
		die("socket");
	if (connect(*client, (const struct sockaddr *)addr, sizeof(*addr)) < 0)
		die("connect");
	*server = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
	if (*server < 0)
		die("accept");
}

static int maxseg(int fd)
{
	int mss = 0;
	socklen_t len = sizeof(mss);

	if (getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) < 0)
		die("getsockopt TCP_MAXSEG");
	return mss;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The byte at stream offset i: 251 is prime, so the pattern never lines up with buffer sizes. */
static unsigned char pattern(uint64_t i)
{
	return (unsigned char)(i % 251);
}

/* Child side of --traffic: write the pattern for `seconds`, then close the stream. */
static void send_for(int fd, long seconds)
{
	unsigned char buf[65536];
	uint64_t off = 0;
	double end = now() + (double)seconds;

	while (now() < end) {
		size_t i;
		ssize_t n;
		size_t done = 0;

		for (i = 0; i < sizeof(buf); i++)
			buf[i] = pattern(off + i);
		while (done < sizeof(buf)) {
			n = write(fd, buf + done, sizeof(buf) - done);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				die("write");
			}
			done += (size_t)n;
		}
		off += sizeof(buf);
	}
	if (shutdown(fd, SHUT_WR) < 0)
		die("shutdown");
}

/* Parent side of --traffic: read to EOF, checking every byte; returns the byte count. */
static uint64_t receive_all(int fd)
{
	unsigned char buf[65536];
	uint64_t off = 0;

	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		ssize_t i;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("read");
		}
		if (n == 0)
			return off;
		for (i = 0; i < n; i++) {
			if (buf[i] != pattern(off + (uint64_t)i)) {
				fprintf(stderr,
					"tcpmss: stream corrupted at byte %llu: got %u, expected %u\n",
					(unsigned long long)(off + (uint64_t)i), buf[i],
					pattern(off + (uint64_t)i));
				exit(1);
			}
		}
		off += (uint64_t)n;
	}
}

static int traffic(long seconds)
{
	struct sockaddr_in addr;
	int listener = listen_loopback(&addr);
	int client, server, status;
	uint64_t received;
	pid_t child;

	open_pair(listener, &addr, &client, &server);
	close(listener);
	child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(server);
		send_for(client, seconds);
		close(client);
		_exit(0);
	}
	close(client);
	received = receive_all(server);
	close(server);
	if (waitpid(child, &status, 0) < 0)
		die("waitpid");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "tcpmss: sender failed (wait status %#x)\n", status);
		return 1;
	}
	if (received == 0) {
		fprintf(stderr, "tcpmss: no data went through in %ld s\n", seconds);
		return 1;
	}
	printf("%llu\n", (unsigned long long)received);
	return 0;
}

static int connections(long count)
{
	struct sockaddr_in addr;
	int listener = listen_loopback(&addr);
	long i;

	for (i = 0; i < count; i++) {
		int client, server;

		open_pair(listener, &addr, &client, &server);
		printf("%d\n", maxseg(client));
		fflush(stdout);
		close(client);
		close(server);
	}
	close(listener);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "traffic", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	long count = 1, seconds = 0;
	int c;

	/* A reader that goes away must not kill the sender silently. */
	signal(SIGPIPE, SIG_IGN);
	while ((c = getopt_long(argc, argv, "n:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			count = parse_positive(optarg, "-n");
			break;
		case 't':
			seconds = parse_positive(optarg, "--traffic");
			break;
		default:
			usage();
		}
	}
	if (optind != argc)
		usage();
	if (seconds)
		return traffic(seconds);
	return connections(count);
}
