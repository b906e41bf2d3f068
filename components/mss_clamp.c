// SPDX-License-Identifier: GPL-2.0
/*
 * mss_clamp.c - a replacement MSS policy for the running kernel.
 *
 * Replace tcp_sync_mss() with mss_clamp_tcp_sync_mss(): the kernel's own computation runs with
 * the path MTU clamped to mss_clamp_mtu, so every new TCP connection (and every PMTU update of
 * an old one) gets an MSS that fits that MTU. The policy is tuned live by writing the variable:
 *
 *   trapctl load /components/mss_clamp.o
 *   trapctl splice tcp_sync_mss --replace mss_clamp_tcp_sync_mss
 *   trapctl set mss_clamp_mtu 1400 --size 4
 *
 * This is the TCP MSS adaptation of the trap-based-modification paper (seed 004).
 */
#include <linux/compiler.h>
#include <linux/minmax.h>
#include <linux/types.h>
#include <net/tcp.h>

#include <trapvec.h>

/* Path MTU ceiling in bytes; written at run time by `trapctl set`, hence READ_ONCE below. */
unsigned int mss_clamp_mtu = 1000;

/* The original tcp_sync_mss, reached through its original trampoline while the splice is live. */
TRAPVEC_ORIG(unsigned int, tcp_sync_mss, struct sock *sk, u32 pmtu);

unsigned int mss_clamp_tcp_sync_mss(struct sock *sk, u32 pmtu);

/* The replacement must be call-compatible with the function it stands in for. */
static_assert(__same_type(&mss_clamp_tcp_sync_mss, &tcp_sync_mss));
static_assert(__same_type(&__trapvec_orig_tcp_sync_mss, &tcp_sync_mss));

unsigned int mss_clamp_tcp_sync_mss(struct sock *sk, u32 pmtu)
{
	u32 ceiling = READ_ONCE(mss_clamp_mtu);

	return __trapvec_orig_tcp_sync_mss(sk, min(pmtu, ceiling));
}
