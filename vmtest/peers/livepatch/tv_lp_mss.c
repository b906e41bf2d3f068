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

/* Called wherever tcp_sync_mss() is, in process or softirq context, with the socket locked. */
static unsigned int tv_lp_tcp_sync_mss(struct sock *sk, u32 pmtu)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct inet_connection_sock *icsk = inet_csk(sk);
	int mss_now;

	pmtu = min(pmtu, READ_ONCE(mtu));

	if (icsk->icsk_mtup.search_high > pmtu)
		icsk->icsk_mtup.search_high = pmtu;

	mss_now = tcp_mtu_to_mss(sk, pmtu);
	mss_now = tcp_bound_to_half_wnd(tp, mss_now);

	icsk->icsk_pmtu_cookie = pmtu;
	if (icsk->icsk_mtup.enabled)
		mss_now = min(mss_now, tcp_mtu_to_mss(sk, icsk->icsk_mtup.search_low));
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
