/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The stubs and the common return code of return points (the runtime is returns.c).
 *
 * The entry half of a return point replaces the return address of a call with
 * trapvec_rp_stubs + 16 * i + 1, i being the instance that holds the real return address.
 * When the function returns (through any ret, or through a function it tail-called) the CPU
 * lands on the "push $i" of stub i, which jumps to the common code with i on the stack, the
 * stack pointer where the caller expects it after the return, and the return value in
 * rax/rdx. The common code completes a struct trapvec_regs over the pushed index, calls
 * trapvec_rp_return(regs, i), which runs the return half and hands back the real return
 * address, writes that address where i was, restores every register and returns there.
 *
 * Each stub starts with a nop so that the hijacked return address (stub + 1) minus one, the
 * address the ORC unwinder looks up for a return address, still lies in the stub.
 *
 * Unwinding: the real return address lives in the instance, not on the stack, and ORC cannot
 * say so. Every stub and the common code are therefore marked with an undefined stack pointer
 * that is NOT the end of the stack (TRAPVEC_STUB_HINT): a stack trace of a task inside a
 * function with a pending return point (taken by the task itself, by /proc/PID/stack, by
 * perf) stops at the stub instead of reaching the caller, and the ORC unwinder reports it as
 * an error, so arch_stack_walk_reliable() fails for that task. Livepatch's klp_check_stack()
 * must see it so: the callers above the stub are hidden, and one of them may be a function the
 * patch replaces; it leaves the task unpatched and tries again later, as for any unreliable
 * stack, until the function has returned through the stub. An end-of-stack hint (what
 * UNWIND_HINT_EMPTY is) would make the walk look complete and reliable, and the transition
 * would switch a task that still runs in an old caller. Never a crash, never a wrong frame.
 *
 * No vector state: kernel code uses none outside kernel_fpu_begin(), so the return value is
 * in rax and rdx only. Kernel C code needs an 8-byte aligned stack (preferred-stack-boundary
 * 3), which the frame keeps.
 */
#include <linux/linkage.h>
#include <asm/asm.h>
#include <asm/nospec-branch.h>
#include <asm/smap.h>
#include <asm/unwind_hints.h>

#include "trapvec_returns.h"
#include <linux/version.h>
/*
 * Undefined stack pointer, not end of stack: unwind_orc.c's error path, in 6.1 (sp_reg
 * ORC_REG_UNDEFINED without the end flag) and since 6.4 (ORC_TYPE_UNDEFINED). objtool writes
 * no ORC entry for such code (it equals the terminator it puts after the previous object's
 * text), so a lookup here lands on that terminator, or on no entry at all: both are the same
 * error for the unwinder.
 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
#define TRAPVEC_STUB_HINT UNWIND_HINT_UNDEFINED
#else
#define TRAPVEC_STUB_HINT UNWIND_HINT type=UNWIND_HINT_TYPE_CALL sp_reg=ORC_REG_UNDEFINED end=0
#endif

	.text

	.balign 16
SYM_CODE_START_NOALIGN(trapvec_rp_stubs)
	.set trapvec_rp_i, 0
	.rept TRAPVEC_RP_INSTANCES
	TRAPVEC_STUB_HINT
	nop
	/* The return address is the byte after the nop; reached by ret, which IBT never checks. */
	ANNOTATE_NOENDBR
	pushq	$trapvec_rp_i
	jmp	trapvec_rp_common
	int3
	.balign 16, 0xcc
	.set trapvec_rp_i, trapvec_rp_i + 1
	.endr
SYM_CODE_END(trapvec_rp_stubs)
_ASM_NOKPROBE(trapvec_rp_stubs)

/*
 * Frame (offsets from %rsp after the pushes): 0..119 r15..rax, 120 rsp, 128 rip, 136 rflags,
 * 144 the instance index (then the real return address for the final ret). The caller's
 * stack pointer is %rsp + 152.
 */
SYM_CODE_START(trapvec_rp_common)
	TRAPVEC_STUB_HINT
	pushfq
	/* C code runs with AC clear (SMAP) and DF clear; popfq gives both back. */
	ASM_CLAC
	cld
	leaq	-16(%rsp), %rsp		/* rip and rsp slots */
	pushq	%rax
	pushq	%rcx
	pushq	%rdx
	pushq	%rbx
	pushq	%rbp
	pushq	%rsi
	pushq	%rdi
	pushq	%r8
	pushq	%r9
	pushq	%r10
	pushq	%r11
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	leaq	152(%rsp), %rax
	movq	%rax, 120(%rsp)		/* rsp: the caller's, after the return */
	movq	$0, 128(%rsp)		/* rip: filled in by trapvec_rp_return() */
	movq	%rsp, %rdi
	movq	144(%rsp), %rsi
	call	trapvec_rp_return
	movq	%rax, 144(%rsp)
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%r11
	popq	%r10
	popq	%r9
	popq	%r8
	popq	%rdi
	popq	%rsi
	popq	%rbp
	popq	%rbx
	popq	%rdx
	popq	%rcx
	popq	%rax
	leaq	16(%rsp), %rsp
	popfq
	RET
SYM_CODE_END(trapvec_rp_common)
_ASM_NOKPROBE(trapvec_rp_common)
