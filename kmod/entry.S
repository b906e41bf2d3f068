/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The entry stub of the trap vector's interrupt gate.
 *
 * The gate has DPL 0, so only kernel code reaches it with "int $vector" (a user-mode "int"
 * raises #GP first). A software interrupt from ring 0 pushes SS, RSP, RFLAGS, CS and RIP
 * (RIP = the trap site + 2) on the current stack, with no error code, and clears IF: the
 * whole stub and the dispatcher run with interrupts off. No privilege change happens, so
 * there is no swapgs and no CR3 switch; the sites are refused in entry and noinstr text,
 * and the dispatcher needs none of irqentry_enter()'s bookkeeping (it takes no locks and
 * calls no traceable function) but RCU's: ordinary text also runs where RCU is not watching
 * (the idle loop), and there the dispatcher enters RCU as an NMI does (trapvec_dispatch()).
 *
 * The stub completes the frame into a struct pt_regs (orig_ax = -1) and calls
 * trapvec_dispatch(regs). It returns 0 when it has set regs->ip (to the destination of the
 * site, or back to a site whose trap was removed), and then the stub restores every
 * register and returns with iretq. Otherwise the trap is not ours: the stub restores the
 * frame exactly as the CPU built it and jumps to the gate's previous handler.
 */
#include <linux/linkage.h>
#include <asm/asm.h>
#include <asm/ibt.h>
#include <asm/nospec-branch.h>
#include <asm/smap.h>
#include <asm/ptrace-abi.h>
#include <asm/unwind_hints.h>

	.text

SYM_CODE_START(trapvec_entry)
	UNWIND_HINT_IRET_REGS
	/* Reached through the IDT, an indirect branch as far as IBT goes (as idtentry). */
	ENDBR
	/*
	 * A trap site may run with EFLAGS.AC set (inside a user access window); C code must
	 * not, or SMAP would not stop its stray user accesses. iretq restores the interrupted
	 * AC, and the chain path hands the CPU's frame on unchanged.
	 */
	ASM_CLAC
	/*
	 * From user mode only a hardware interrupt could arrive here (nothing sends this
	 * vector): that frame is not ours to touch, hand it on unchanged.
	 */
	testb	$3, CS-RIP(%rsp)
	jnz	.Lchain

	pushq	$-1			/* pt_regs->orig_ax */
	pushq	%rdi
	pushq	%rsi
	pushq	%rdx
	pushq	%rcx
	pushq	%rax
	pushq	%r8
	pushq	%r9
	pushq	%r10
	pushq	%r11
	pushq	%rbx
	pushq	%rbp
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	UNWIND_HINT_REGS

	/*
	 * The trap may sit between a std and its cld; C code assumes DF = 0. iretq restores
	 * the interrupted RFLAGS, DF included.
	 */
	cld
	movq	%rsp, %rdi
	call	trapvec_dispatch
	/* The pops and lea below leave the flags of this test alone. */
	testl	%eax, %eax

	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbp
	popq	%rbx
	popq	%r11
	popq	%r10
	popq	%r9
	popq	%r8
	popq	%rax
	popq	%rcx
	popq	%rdx
	popq	%rsi
	popq	%rdi
	leaq	8(%rsp), %rsp		/* orig_ax */
	UNWIND_HINT_IRET_REGS
	jnz	.Lchain
	iretq
	int3

.Lchain:
	/*
	 * Not ours: the previous handler (the kernel's spurious entry) sees exactly the frame
	 * the CPU pushed. An indirect jump through memory: this path is taken only for a vector
	 * that nothing sends, never on a hot path, and it cannot use a retpoline because every
	 * register must keep its interrupted value.
	 */
	ANNOTATE_RETPOLINE_SAFE
	jmp	*trapvec_old_handler(%rip)
	int3
SYM_CODE_END(trapvec_entry)
_ASM_NOKPROBE(trapvec_entry)
