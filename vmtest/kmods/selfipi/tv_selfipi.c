// SPDX-License-Identifier: GPL-2.0
/*
 * tv_selfipi - deliver a vector to this CPU as a hardware interrupt, in kernel mode.
 *
 *   insmod tv_selfipi.ko [vector=0xf5] [count=1]
 *
 * At load, sends count self-IPIs of vector through the local APIC (apic->send_IPI_self()),
 * each with interrupts off, then turns interrupts on: the CPU takes the interrupt right there,
 * in this module's text, through whatever gate the IDT holds for the vector. Unlike "int
 * $vector", nothing puts a trap instruction before the interrupted ip, and the local APIC
 * marks the vector in service until someone acknowledges it (the kernel's spurious-interrupt
 * entry does, and counts it: "SPU" in /proc/interrupts). Logs "tv_selfipi: sent N" and stays
 * loaded (rmmod it).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/irqflags.h>
#include <linux/module.h>
#include <linux/smp.h>
#include <asm/apic.h>
#include <asm/irq_vectors.h>

static uint vector = 0xf5;
module_param(vector, uint, 0444);
MODULE_PARM_DESC(vector, "the vector to send (a system vector, 0xec..0xff)");

static uint count = 1;
module_param(count, uint, 0444);
MODULE_PARM_DESC(count, "how many self-IPIs to send, one at a time");

static int __init tv_selfipi_init(void)
{
	unsigned long flags;
	uint i;
	int cpu;

	/* Only a system vector: the kernel's spurious entry is its gate unless someone's is. */
	if (vector < FIRST_SYSTEM_VECTOR || vector >= NR_VECTORS || !count)
		return -EINVAL;
	for (i = 0; i < count; i++) {
		local_irq_save(flags);
		cpu = smp_processor_id();
		apic->send_IPI_self(vector);
		/* Taken here, when interrupts come back on. */
		local_irq_restore(flags);
	}
	pr_info("sent %u self-IPI(s) of vector %#x (last on CPU %d)\n", count, vector, cpu);
	return 0;
}

static void __exit tv_selfipi_exit(void)
{
}

module_init(tv_selfipi_init);
module_exit(tv_selfipi_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("trapvec test helper: a self-IPI of a system vector");
