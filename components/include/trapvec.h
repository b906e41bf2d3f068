/* SPDX-License-Identifier: GPL-2.0 */
/*
 * trapvec.h - what a trapvec patch component sees.
 *
 * A component is an ELF relocatable object (cc -c for processes, Kbuild for the kernel; see
 * components/README.md). Its global functions and variables are exported to other components
 * and to splice specs by name.
 */
#ifndef TRAPVEC_H
#define TRAPVEC_H

#ifdef __KERNEL__
#include <linux/types.h>
typedef u64 trapvec_u64;
#else
#include <stdint.h>
typedef uint64_t trapvec_u64;
#endif

/*
 * Registers at the point, handed to a "call" handler. The handler may change any general
 * register (the patched code continues with the new values); rsp and rip are informational
 * (stack pointer at the point, the point's address): writes to them are ignored.
 * The field order is ABI (trapvec::abi::TrapvecRegs).
 */
struct trapvec_regs {
	trapvec_u64 r15, r14, r13, r12, r11, r10, r9, r8;
	trapvec_u64 rdi, rsi, rbp, rbx, rdx, rcx, rax;
	trapvec_u64 rsp;
	trapvec_u64 rip;
	trapvec_u64 rflags;
};

/* The signature of a "call" handler. */
typedef void trapvec_handler_t(struct trapvec_regs *regs, void *cookie);

/*
 * What the handler of a return point (when = "return") gets beside the registers, where rax and
 * rdx hold the return value (and may be changed): the entry's argument registers, kept from the
 * entry to this return. The field order is ABI (trapvec::abi::TrapvecCall).
 */
struct trapvec_call {
	trapvec_u64 args[6];	/* rdi, rsi, rdx, rcx, r8, r9 at the entry */
	trapvec_u64 cookie;	/* the splice's cookie */
	trapvec_u64 sp;		/* stack pointer at the entry */
	trapvec_u64 ret;	/* where the function returns to */
	trapvec_u64 elapsed_ns;	/* entry to return, by the timer's clock (timers only, else 0) */
};

/* The signature of a return point's handler. */
typedef void trapvec_return_handler_t(struct trapvec_regs *regs, struct trapvec_call *call);

/*
 * The original of a function replaced by a "replace" splice stays callable through its original
 * trampoline: declare it with TRAPVEC_ORIG(ret, fn, args...) and call __trapvec_orig_fn(...).
 *   TRAPVEC_ORIG(int, compute, int x);   ...   return __trapvec_orig_compute(x) + 1;
 * While no replace splice of fn is live, __trapvec_orig_fn calls fn itself.
 */
#define TRAPVEC_ORIG(ret, fn, ...) extern ret __trapvec_orig_##fn(__VA_ARGS__)

/*
 * Splices a component declares for itself, applied in one batch when it is loaded and removed
 * when it is unloaded (like a livepatch). Each is a string in section .trapvec.splices:
 *   TRAPVEC_SPLICE_CALL(compute, "compute+0", count_compute, "trap");
 *   TRAPVEC_SPLICE_REPLACE(tcp, "tcp_sync_mss", my_tcp_sync_mss, "jmp");
 * The first argument only names the record.
 */
#define TRAPVEC__SPLICE(id, at, action, handler, mech)                         \
	static const char __trapvec_splice_##id[]                                  \
	__attribute__((section(".trapvec.splices"), used, aligned(1))) =           \
		"at=" at ";action=" action ";handler=" #handler ";mechanism=" mech
#define TRAPVEC_SPLICE_CALL(id, at, handler, mech) TRAPVEC__SPLICE(id, at, "call", handler, mech)
#define TRAPVEC_SPLICE_REPLACE(id, at, handler, mech) TRAPVEC__SPLICE(id, at, "replace", handler, mech)
/* A return point: handler (a trapvec_return_handler_t) runs each time the function at "at" returns. */
#define TRAPVEC_SPLICE_RETURN(id, at, handler, mech)                           \
	static const char __trapvec_splice_##id[]                                  \
	__attribute__((section(".trapvec.splices"), used, aligned(1))) =           \
		"at=" at ";action=call;handler=" #handler ";mechanism=" mech ";when=return"

#endif /* TRAPVEC_H */
