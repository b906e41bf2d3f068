// SPDX-License-Identifier: GPL-2.0
/*
 * tv_lp_mss.c - livepatch peer of components/mss_clamp.c, for trapvec's benchmarks
 * (vmtest/scenarios/peers.sh), in the style of the kernel's samples/livepatch.
 *
 * Replaces tcp_sync_mss() with a copy that clamps the path MTU to `mtu` (default 1000, like
 * mss_clamp_mtu) before the kernel's own computation. A livepatch cannot call the function it
 * replaces (the ftrace handler would send the call back here), so the body is the one of
 * net/ipv4/tcp_output.c in Linux 6.1, with the clamp at its top: the same result as mss_clamp's
 * __trapvec_orig_tcp_sync_mss(sk, min(pmtu, mtu)).
 *
 *   insmod tv_lp_mss.ko [mtu=N]      patch; /sys/kernel/livepatch/tv_lp_mss/transition -> 0
 *   echo 0 > /sys/kernel/livepatch/tv_lp_mss/enabled; rmmod tv_lp_mss
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/livepatch.h>
#include <linux/minmax.h>
#include <linux/module.h>
#include <net/tcp.h>

static unsigned int mtu = 1000;
module_param(mtu, uint, 0644);
MODULE_PARM_DESC(mtu, "path MTU ceiling in bytes");

/*
 * tcp_mtu_to_mss() of net/ipv4/tcp_output.c (the same in 6.1 and 6.12), written out here:
 * 6.12 exports it for the IPv6 module only (EXPORT_IPV6_MOD), so a livepatch cannot link to it.
 * The MSS without options (the path MTU less the network and TCP headers, at most the peer's
 * clamp, less the extension headers, at least tcp_min_snd_mss), less the TCP options but SACK.
 */
static int tv_lp_mtu_to_mss(struct sock *sk, int pmtu)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	const struct inet_connection_sock *icsk = inet_csk(sk);
	int mss = pmtu - icsk->icsk_af_ops->net_header_len - sizeof(struct tcphdr);

	mss = min_t(int, mss, tp->rx_opt.mss_clamp);
	mss -= icsk->icsk_ext_hdr_len;
	mss = max_t(int, mss, READ_ONCE(sock_net(sk)->ipv4.sysctl_tcp_min_snd_mss));
	return mss - (tp->tcp_header_len - sizeof(struct tcphdr));
}

/* Called wherever tcp_sync_mss() is, in process or softirq context, with the socket locked. */
static unsigned int tv_lp_tcp_sync_mss(struct sock *sk, u32 pmtu)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct inet_connection_sock *icsk = inet_csk(sk);
	int mss_now;

	pmtu = min(pmtu, READ_ONCE(mtu));

	if (icsk->icsk_mtup.search_high > pmtu)
		icsk->icsk_mtup.search_high = pmtu;

	mss_now = tv_lp_mtu_to_mss(sk, pmtu);
	mss_now = tcp_bound_to_half_wnd(tp, mss_now);

	icsk->icsk_pmtu_cookie = pmtu;
	if (icsk->icsk_mtup.enabled)
		mss_now = min(mss_now, tv_lp_mtu_to_mss(sk, icsk->icsk_mtup.search_low));
	tp->mss_cache = mss_now;

	return mss_now;
}

static struct klp_func funcs[] = {
	{
		.old_name = "tcp_sync_mss",
		.new_func = tv_lp_tcp_sync_mss,
	}, { }
};

static struct klp_object objs[] = {
	{
		/* NULL name: vmlinux */
		.funcs = funcs,
	}, { }
};

static struct klp_patch patch = {
	.mod = THIS_MODULE,
	.objs = objs,
};

static int __init tv_lp_mss_init(void)
{
	return klp_enable_patch(&patch);
}

static void __exit tv_lp_mss_exit(void)
{
}

module_init(tv_lp_mss_init);
module_exit(tv_lp_mss_exit);
MODULE_LICENSE("GPL");
MODULE_INFO(livepatch, "Y");
MODULE_DESCRIPTION("trapvec benchmark peer: tcp_sync_mss with the path MTU clamped (livepatch)");
