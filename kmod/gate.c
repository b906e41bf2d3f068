// SPDX-License-Identifier: GPL-2.0
/*
 * The IDT gate of the trap vector.
 *
 * x86-64 Linux has one IDT (idt_table) shared by every CPU. After boot it is mapped read-only
 * and the CPUs load the address of its alias in the CPU entry area (store_idt() returns that
 * alias). Its physical page is found with slow_virt_to_phys(), and vmap() of that page with
 * PAGE_KERNEL gives a writable alias through which the module writes one gate, and writes the
 * recorded one back on unload. The CPUs read gates at delivery time; nothing is cached.
 *
 * The vector must be a system vector (>= FIRST_SYSTEM_VECTOR: the interrupt matrix never
 * hands those to devices) whose gate is the kernel's spurious entry for it, which
 * idt_setup_apic_and_irq_gates() installs for every system vector nobody uses. Nothing
 * sends such a vector, so rewriting its gate races with no delivery.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <asm/desc.h>
#include <asm/idtentry.h>
#include <asm/irq_vectors.h>
#include <asm/set_memory.h>

#include "trapvec_internal.h"

/* The gate's handler before the module installed its own; entry.S chains to it. */
unsigned long trapvec_old_handler;

static gate_desc trapvec_old_gate;
/* Writable vmap alias of the IDT page holding the gate; NULL when no gate is installed. */
static void *trapvec_idt_alias;
static gate_desc *trapvec_gate;

static unsigned long trapvec_spurious_entry(unsigned int vector)
{
	return trapvec_ksyms.spurious_entries_start +
	       IDT_ALIGN * (vector - FIRST_SYSTEM_VECTOR);
}

static gate_desc *trapvec_idt_gate_ro(unsigned int vector)
{
	struct desc_ptr idt;

	store_idt(&idt);
	return (gate_desc *)idt.address + vector;
}

int trapvec_gate_install(void)
{
	unsigned int vector = trapvec_vector;
	unsigned long expected, old;
	gate_desc *ro, new_gate;
	struct page *page;
	phys_addr_t phys;

	if (vector < FIRST_SYSTEM_VECTOR || vector >= NR_VECTORS) {
		pr_err("vector %#x is not a system vector (%#x..%#x)\n", vector,
		       FIRST_SYSTEM_VECTOR, NR_VECTORS - 1);
		return -EINVAL;
	}

	ro = trapvec_idt_gate_ro(vector);
	trapvec_old_gate = *ro;
	old = gate_offset(&trapvec_old_gate);
	expected = trapvec_spurious_entry(vector);
	if (old != expected || trapvec_old_gate.bits.type != GATE_INTERRUPT ||
	    !trapvec_old_gate.bits.p) {
		pr_err("vector %#x is in use: its gate goes to %pS, not to the spurious entry %pS\n",
		       vector, (void *)old, (void *)expected);
		return -EBUSY;
	}

	phys = slow_virt_to_phys(ro);
	page = pfn_to_page(PHYS_PFN(phys));
	trapvec_idt_alias = trapvec_vmap(TRAPVEC_MEM_ALIAS, &page, 1);
	if (!trapvec_idt_alias)
		return -ENOMEM;
	trapvec_gate = trapvec_idt_alias + offset_in_page(phys);

	/* entry.S reads this when it chains; set it before the gate can send anyone there. */
	WRITE_ONCE(trapvec_old_handler, old);

	/* DPL 0: a user-mode "int" of this vector still raises #GP. IST 0: current stack. */
	pack_gate(&new_gate, GATE_INTERRUPT, (unsigned long)trapvec_entry, 0, 0, __KERNEL_CS);
	*trapvec_gate = new_gate;

	pr_info("vector %#x: gate -> %pS (was %pS)\n", vector, trapvec_entry, (void *)old);
	return 0;
}

void trapvec_gate_restore(void)
{
	if (!trapvec_idt_alias)
		return;
	*trapvec_gate = trapvec_old_gate;
	trapvec_vunmap(TRAPVEC_MEM_ALIAS, trapvec_idt_alias, 1);
	trapvec_idt_alias = NULL;
	trapvec_gate = NULL;
	pr_info("vector %#x: gate restored to %pS\n", trapvec_vector,
		(void *)trapvec_old_handler);
}

unsigned long trapvec_gate_handler(void)
{
	gate_desc g = *trapvec_idt_gate_ro(trapvec_vector);

	return gate_offset(&g);
}
