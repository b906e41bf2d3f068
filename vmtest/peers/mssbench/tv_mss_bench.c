// SPDX-License-Identifier: GPL-2.0
/*
 * tv_mss_bench.c - the cost of one call of tcp_sync_mss(), measured in the kernel, for
 * trapvec's benchmarks (vmtest/scenarios/peers.sh): unpatched, livepatched (tv_lp_mss) and
 * replaced by a trapvec trap or jmp splice (components/mss_clamp.c).
 *
 * A loopback connection calls tcp_sync_mss() a handful of times, too few to see the cost of
 * one call beside the rest of the connection. This module makes one connected loopback TCP
 * socket at load (kernel sockets: listen on 127.0.0.1, connect, accept) and, on request,
 * calls tcp_sync_mss() on it in a loop, as the stack does: with the socket locked,
 * with the path MTU the connection started with (the socket's icsk_pmtu_cookie right after
 * connect; not its current value, which a clamped call leaves at the clamp).
 *
 *   insmod tv_mss_bench.ko
 *   echo 20000 > /sys/module/tv_mss_bench/parameters/run     N calls; returns when done
 *   cat /sys/module/tv_mss_bench/parameters/run                "calls=N ns=T mss=M"
 *
 * ns is ktime_get_ns() around the whole loop; mss is what the last call returned (948 while
 * the MTU clamp of 1000 is in place, the loopback MSS otherwise), so a run also says which
 * tcp_sync_mss() it measured.
 *
 * 6.1 exports tcp_sync_mss(); Debian's 6.12 exports it to the IPv6 module only
 * (EXPORT_IPV6_MOD). So the module finds it at load, on every kernel, through a kprobe
 * registered on it and removed at once (the exported way to resolve a name), and calls it
 * through that pointer: the same indirect call in every configuration measured.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/in.h>
#include <linux/kallsyms.h>
#include <linux/kernel.h>
#include <linux/kprobes.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/net.h>
#include <net/inet_connection_sock.h>
#include <net/net_namespace.h>
#include <net/sock.h>
#include <net/tcp.h>

/* Most calls of one run: keeps a run well below the soft-lockup threshold under emulation. */
#define TV_BENCH_MAX_CALLS	1000000U

static struct socket *tv_listener, *tv_client, *tv_server;

/* tcp_sync_mss(), found at load (tv_find_sync_mss()). */
static unsigned int (*tv_sync_mss)(struct sock *sk, u32 pmtu);

/* The connection's path MTU at connect: every call is asked for this one. */
static u32 tv_pmtu;

/* The last run; guarded by the module's parameter lock (sysfs holds it around get and set). */
static unsigned int tv_calls, tv_mss;
static u64 tv_ns;

static int tv_bench_run(const char *val, const struct kernel_param *kp)
{
	struct sock *sk = tv_client->sk;
	unsigned int calls, i, mss = 0;
	u64 start, end;
	int ret;

	ret = kstrtouint(val, 0, &calls);
	if (ret)
		return ret;
	if (!calls || calls > TV_BENCH_MAX_CALLS)
		return -EINVAL;

	/* As the stack calls it: the socket owned, the path MTU of the route. */
	lock_sock(sk);
	start = ktime_get_ns();
	for (i = 0; i < calls; i++)
		mss = tv_sync_mss(sk, tv_pmtu);
	end = ktime_get_ns();
	release_sock(sk);

	tv_calls = calls;
	tv_ns = end - start;
	tv_mss = mss;
	return 0;
}

static int tv_bench_show(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "calls=%u ns=%llu mss=%u\n", tv_calls, tv_ns, tv_mss);
}

static const struct kernel_param_ops tv_bench_ops = {
	.set = tv_bench_run,
	.get = tv_bench_show,
};

module_param_cb(run, &tv_bench_ops, NULL, 0644);
MODULE_PARM_DESC(run, "write N: call tcp_sync_mss() N times; read: calls, ns and the last MSS");

static void tv_bench_release(void)
{
	if (tv_server)
		sock_release(tv_server);
	if (tv_client)
		sock_release(tv_client);
	if (tv_listener)
		sock_release(tv_listener);
	tv_server = NULL;
	tv_client = NULL;
	tv_listener = NULL;
}

/*
 * The address of tcp_sync_mss(): a kprobe's address, taken back to the function's start (on
 * IBT kernels register_kprobe() moves a probe at an entry past its endbr64), which
 * sprint_symbol() names as tcp_sync_mss+OFFSET/SIZE.
 */
static int __init tv_find_sync_mss(void)
{
	struct kprobe kp = { .symbol_name = "tcp_sync_mss" };
	char name[KSYM_SYMBOL_LEN], *plus;
	unsigned long addr, off;
	int ret;

	ret = register_kprobe(&kp);
	if (ret) {
		pr_err("no kprobe on tcp_sync_mss to find it: %d\n", ret);
		return ret;
	}
	addr = (unsigned long)kp.addr;
	unregister_kprobe(&kp);
	sprint_symbol(name, addr);
	plus = strchr(name, '+');
	if (!plus || strncmp(name, "tcp_sync_mss+", plus + 1 - name) ||
	    sscanf(plus + 1, "%lx", &off) != 1 || off > 16) {
		pr_err("the kprobe on tcp_sync_mss is at %s\n", name);
		return -ENOENT;
	}
	tv_sync_mss = (void *)(addr - off);
	return 0;
}

static int __init tv_bench_init(void)
{
	struct sockaddr_in addr = {
		.sin_family = AF_INET,
		.sin_addr.s_addr = htonl(INADDR_LOOPBACK),
	};
	int ret;

	ret = tv_find_sync_mss();
	if (ret)
		return ret;
	ret = sock_create_kern(&init_net, AF_INET, SOCK_STREAM, IPPROTO_TCP, &tv_listener);
	if (ret)
		goto out;
	ret = kernel_bind(tv_listener, (struct sockaddr *)&addr, sizeof(addr));
	if (ret)
		goto out;
	ret = kernel_listen(tv_listener, 1);
	if (ret)
		goto out;
	/* The port the kernel picked. */
	ret = kernel_getsockname(tv_listener, (struct sockaddr *)&addr);
	if (ret < 0)
		goto out;
	ret = sock_create_kern(&init_net, AF_INET, SOCK_STREAM, IPPROTO_TCP, &tv_client);
	if (ret)
		goto out;
	/* Blocking: over loopback the handshake is done when connect returns. */
	ret = kernel_connect(tv_client, (struct sockaddr *)&addr, sizeof(addr), 0);
	if (ret)
		goto out;
	ret = kernel_accept(tv_listener, &tv_server, 0);
	if (ret)
		goto out;
	tv_pmtu = inet_csk(tv_client->sk)->icsk_pmtu_cookie;
	pr_info("connected on 127.0.0.1:%u, path MTU %u, MSS %u\n", ntohs(addr.sin_port),
		tv_pmtu, tcp_sk(tv_client->sk)->mss_cache);
	return 0;
out:
	pr_err("cannot make a loopback connection: %d\n", ret);
	tv_bench_release();
	return ret;
}

static void __exit tv_bench_exit(void)
{
	tv_bench_release();
}

module_init(tv_bench_init);
module_exit(tv_bench_exit);
MODULE_DESCRIPTION("tcp_sync_mss() per-call bench for trapvec's peers");
MODULE_LICENSE("GPL");
