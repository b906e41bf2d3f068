// SPDX-License-Identifier: GPL-2.0
/*
 * tv_nmi_mark.c - the `call` handler of the NMI text-write test
 * (vmtest/scenarios/kernel_textwrite.sh): tells vmtest/kmods/nmi_victim that a splice on
 * tv_victim() ran, so that the module can count the calls a splice saw, exactly.
 * Loads only beside tv_nmi_victim.ko, which defines tv_splice_mark().
 *
 *   trapctl load /components/tv_nmi_mark.o
 *   trapctl cycle tv_victim --call tv_nmi_mark --mechanism both --times 100
 */
#include <trapvec.h>

void tv_splice_mark(void);
void tv_nmi_mark(struct trapvec_regs *regs, void *cookie);

void tv_nmi_mark(struct trapvec_regs *regs, void *cookie)
{
	tv_splice_mark();
}
