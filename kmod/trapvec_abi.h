/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The ioctl interface of /dev/trapvec.
 *
 * The one header shared by the module (kmod/) and user space: C programs include it as is
 * (it needs only <linux/types.h> and <linux/ioctl.h>), and trapvec/src/abi.rs mirrors every
 * struct and number below; a test in trapvec compiles this header and compares sizes and
 * offsets with the Rust layout. Every struct is made of fixed-width fields with explicit
 * padding, so that its layout is the same for every compiler.
 *
 * Every ioctl requires CAP_SYS_MODULE (-EPERM otherwise). Pointers to user memory are passed
 * as __u64. An index that names no element is TRAPVEC_NO_INDEX.
 */
#ifndef _TRAPVEC_ABI_H
#define _TRAPVEC_ABI_H

#include <linux/types.h>
#include <linux/ioctl.h>

#define TRAPVEC_ABI_VERSION	11
#define TRAPVEC_DEVICE_NAME	"trapvec"
#define TRAPVEC_IOC_MAGIC	'T'

/* Longest text patch (bytes); a trap is 2, a jmp rel32 is 5. */
#define TRAPVEC_PATCH_MAX	16
/* Most bytes one READ or WRITE moves. */
#define TRAPVEC_XFER_MAX	(1U << 20)
/*
 * Most elements of one APPLY, DISPATCH_ADD, DISPATCH_REMOVE or LIST (ABI 11: 2^18, was 2^16, so
 * that 200,000 count sites go in one batch).
 */
#define TRAPVEC_BATCH_MAX	262144U
/*
 * Largest state blob (STATE_PUT). trapctl's state takes about 950 bytes per splice: 256 MiB
 * (ABI 11, was 32 MiB) holds the state of 200,000 count sites, with room to spare.
 */
#define TRAPVEC_STATE_MAX	(256U << 20)
/* "No element": failed_index when nothing failed. */
#define TRAPVEC_NO_INDEX	0xffffffffU

/* Kinds of arena blocks (trapvec_alloc.kind). */
#define TRAPVEC_BLOCK_CODE	1	/* written, then sealed; executable; never written after */
#define TRAPVEC_BLOCK_DATA	2	/* writable at any time; never executable */

/*
 * Why a site was refused (trapvec_check.reason, trapvec_apply.reason). A site is the range
 * [addr, addr + len) that a text patch would overwrite.
 *
 * TRAPVEC_REASONS() is the one list of the reasons: X(number, NAME, "meaning") per reason,
 * numbered from 0 without a gap. It makes the TRAPVEC_REASON_* values below and the module's
 * names of them (trapvec_reason_name(), check.c); trapvec/tests/abi_layout.rs expands it too
 * and fails, naming the reason, where trapvec/src/abi.rs or SiteRefusal (trapvec/src/kernel)
 * differs from it. A new reason: one line here, its constant in abi.rs, its SiteRefusal
 * variant (kmod/README.md says why those stay written in Rust).
 *
 * More on three of them:
 *  - JUMP_TARGET: the kernel jumps there when the key flips, with no branch a decoder sees;
 *    culprit: the struct jump_entry (16 bytes: s32 code, s32 target, s64 key, each relative
 *    to its own field; the key's low 2 bits are flags), in the core kernel's __jump_table or
 *    a module's.
 *  - EXTABLE_FIXUP: a faulting instruction elsewhere resumes there; culprit: the struct
 *    exception_table_entry (12 bytes: s32 insn, s32 fixup, s32 data, insn and fixup relative
 *    to their own fields).
 *  - DEAD_CPU: RCU no longer waits for that CPU, and a dead CPU loops in the last of them
 *    outside stop_machine(); culprit: the function's start.
 */
#define TRAPVEC_REASONS(X) \
	X(0, NONE, "accepted")                                                                   \
	X(1, BAD_LENGTH, "len is 0 or above TRAPVEC_PATCH_MAX")                                  \
	X(2, NOT_TEXT, "not core kernel text nor a live module's core text")                     \
	X(3, OWN_MODULE, "inside trapvec.ko itself (its code or its arena)")                     \
	X(4, ENTRY_TEXT, "overlaps __entry_text_start..__entry_text_end")                        \
	X(5, NOINSTR_TEXT, "overlaps noinstr text (kernel or module)")                           \
	X(6, THUNK, "overlaps the retpoline/return thunks")                                      \
	X(7, KPROBE_BLACKLIST, "a function on the kprobes blacklist")                            \
	X(8, FTRACE, "overlaps an ftrace __fentry__ site")                                       \
	X(9, JUMP_LABEL, "overlaps a jump label (static key) site")                              \
	X(10, STATIC_CALL, "overlaps a static call site")                                        \
	X(11, BUG_ENTRY, "overlaps a BUG()/WARN() ud2")                                          \
	X(12, EXTABLE, "an instruction with an exception-table entry")                           \
	X(13, NOT_BOUNDARY, "addr is not an instruction boundary")                               \
	X(14, CROSSES_SYMBOL, "the range runs into the next symbol")                             \
	X(15, KPROBE_REFUSED, "register_kprobe() refused it; errno in .error")                   \
	X(16, LIVE_PATCH, "overlaps a live patch (or another in the batch)")                     \
	X(17, MISMATCH, "current bytes differ from old_bytes")                                   \
	X(18, ALTERNATIVE, "overlaps an SMP lock prefix the kernel rewrites")                    \
	X(19, KPROBE, "a kprobe is registered there; culprit: its address")                      \
	X(20, CPUIDLE_TEXT, "overlaps .cpuidle.text (RCU may not be watching)")                  \
	X(21, STATIC_CALL_TRAMP, "a static call trampoline (__SCT__*)")                          \
	X(22, KPROBE_SLOT, "a kprobe instruction slot")                                          \
	X(23, BPF_TEXT, "a BPF JIT image or dispatcher")                                         \
	X(24, FTRACE_TRAMPOLINE, "an ftrace trampoline")                                         \
	X(25, MODULE_INIT, "a module's init text")                                               \
	X(26, LOCKDOWN, "kernel lockdown forbids writing kernel memory")                         \
	X(27, MODULES_DISABLED, "kernel.modules_disabled=1 forbids it")                          \
	X(28, NO_DISPATCH, "a trap (CD vector) at a site with no dispatch entry")                \
	X(29, FOREIGN_TRAP, "an int of another vector than the module's")                        \
	X(30, RETURN_IN_WINDOW, "a call before the window's last instruction")                   \
	X(31, NOT_A_JUMP, "over several instructions, new bytes not a trap/jmp")                 \
	X(32, JUMP_TARGET, "a jump-label target inside the range past its first byte")           \
	X(33, EXTABLE_FIXUP, "an exception fix-up address inside the range past its first byte") \
	X(34, DEAD_CPU, "a function a CPU going offline runs after rcu_report_dead()")          \
	X(35, ENDBR, "an endbr64 inside the range: with IBT an indirect branch must land on it")

enum {
#define TRAPVEC_REASON_VALUE(n, name, meaning) TRAPVEC_REASON_##name = (n),
	TRAPVEC_REASONS(TRAPVEC_REASON_VALUE)
#undef TRAPVEC_REASON_VALUE
#define TRAPVEC_REASON_COUNT_ONE(n, name, meaning) + 1
	/* The highest reason (the list is numbered from 0 without a gap). */
	TRAPVEC_REASON_MAX = (0 TRAPVEC_REASONS(TRAPVEC_REASON_COUNT_ONE)) - 1,
#undef TRAPVEC_REASON_COUNT_ONE
};

/* INFO: what the module is and where its memory lies. */
struct trapvec_info {
	__u32 abi_version;	/* TRAPVEC_ABI_VERSION */
	__u32 vector;		/* the trap vector (module parameter) */
	__u64 entry;		/* the gate's entry stub */
	__u64 old_handler;	/* the gate's handler before the module was loaded */
	__u64 gate_handler;	/* the gate's handler now, read from the IDT */
	__u64 code_base;	/* executable arena (in the module's text) */
	__u64 code_size;
	__u64 data_base;	/* data arena (in the module's .bss) */
	__u64 data_size;
	__u64 code_used;	/* bytes held by code blocks (live or waiting to be freed) */
	__u64 data_used;
	__u64 module_base;	/* the module's core image [base, base + size) */
	__u64 module_size;
	__u64 live_patches;	/* text patches applied and not reverted */
	__u64 dispatch_entries;
	__u64 unknown_traps;	/* traps at no known site, chained to the old handler */
	__u64 retried_traps;	/* traps at a site restored under them, sent back to it */
	/*
	 * Tasks in flight through "replace" trampolines: the code block that starts at
	 * code_base + 16 * i counts them in the 8-byte word at inflight_base + 8 * i (lock inc
	 * before the replacement, decremented by replace_ret after it); a trampoline leaves
	 * through "jmp replace_ret" with %r11 = its counter's address.
	 */
	__u64 inflight_base;
	__u64 replace_ret;
	/*
	 * Task predicates in code (ABI 7): a trampoline reads the running task as
	 * %gs:current_task (the per-CPU offset of current_task) and its fields at these
	 * offsets in struct task_struct.
	 */
	__u64 current_task;
	__u32 task_pid;
	__u32 task_tgid;
	__u32 task_comm;
	__u32 task_pad;
};

/*
 * READ: copy len bytes of kernel memory at addr to the user buffer buf. With
 * TRAPVEC_READ_ORIGINAL the bytes are the text as it is without anyone's patches: the module's
 * live patches undone, and kprobes' int3 and optimized jmps replaced by the bytes they saved
 * (what a decoder must read to find the real instruction boundaries). Other flags: -EINVAL.
 */
#define TRAPVEC_READ_ORIGINAL	1U

struct trapvec_read {
	__u64 addr;
	__u64 buf;
	__u32 len;		/* at most TRAPVEC_XFER_MAX */
	__u32 flags;		/* TRAPVEC_READ_* */
};

/* ALLOC: a block of size bytes (rounded up to 16) of the code or the data arena. */
struct trapvec_alloc {
	__u32 kind;		/* TRAPVEC_BLOCK_CODE or TRAPVEC_BLOCK_DATA */
	__u32 pad;
	__u64 size;
	__u64 id;		/* out: handle for WRITE, SEAL and FREE */
	__u64 addr;		/* out: kernel address of the block */
};

/*
 * WRITE: copy len bytes from the user buffer buf to block id at offset, then read them back.
 * Code blocks only before SEAL. In data blocks every naturally aligned 8-byte word is written
 * with one store, so another CPU never sees half of a retargeted pointer.
 */
struct trapvec_write {
	__u64 id;
	__u64 offset;
	__u64 buf;
	__u32 len;		/* at most TRAPVEC_XFER_MAX */
	__u32 pad;
};

/* SEAL and FREE: one block. FREE defers reuse to the next QUIESCE (see there). */
struct trapvec_block {
	__u64 id;
};

/* One text change: old_bytes must be at addr, new_bytes replaces them. */
struct trapvec_patch {
	__u64 addr;
	__u32 len;		/* 1..TRAPVEC_PATCH_MAX */
	__u32 pad;
	__u8 old_bytes[TRAPVEC_PATCH_MAX];
	__u8 new_bytes[TRAPVEC_PATCH_MAX];
};

/*
 * CHECK: would a patch of [addr, addr + len) be accepted? Changes nothing. Besides the checks
 * APPLY makes, CHECK registers a disabled kprobe at addr (and unregisters it) to get the
 * kernel's own verdict as well (reason KPROBE_REFUSED with its errno), unless flags has
 * TRAPVEC_CHECK_NO_KPROBE: unregistering waits for an RCU grace period (milliseconds).
 */
#define TRAPVEC_CHECK_NO_KPROBE	1U

struct trapvec_check {
	__u64 addr;
	__u32 len;
	__u32 reason;		/* out: TRAPVEC_REASON_* */
	__s32 error;		/* out: negative errno of register_kprobe() for KPROBE_REFUSED */
	__u32 flags;		/* TRAPVEC_CHECK_* */
	/* out: what the reason is about (KPROBE: the probe; JUMP_TARGET, EXTABLE_FIXUP: the
	 * table entry), or 0 */
	__u64 culprit;
};

/*
 * CHECK_MANY: CHECK of count windows at once, each answered in place (reason, error, culprit),
 * as CHECK with TRAPVEC_CHECK_NO_KPROBE answers it. Every entry's flags must be exactly
 * TRAPVEC_CHECK_NO_KPROBE (the kprobe cross-check is not made in a batch): else -EINVAL, and
 * more than TRAPVEC_BATCH_MAX entries -E2BIG, with nothing answered. The entries may come in
 * any order; the module visits them by address and reads and decodes the original text of each
 * kallsyms symbol they fall in once, under one hold of its locks. Added without a new ABI
 * version: an older module answers -ENOTTY, and user space falls back to one CHECK per window.
 */
struct trapvec_check_many {
	__u64 checks;		/* user pointer to count struct trapvec_check, answered in place */
	__u32 count;		/* at most TRAPVEC_BATCH_MAX */
	__u32 flags;		/* must be 0 */
};

/*
 * APPLY: all patches or none. A patch that exactly undoes a live patch (same addr and len,
 * old and new swapped) reverts it and skips the site checks; any other patch is checked like
 * CHECK (but for the kprobe cross-check) and must not overlap a live patch. A new patch
 * that writes a trap (CD vector) must have its dispatch entry already (NO_DISPATCH), and one
 * that writes "int" of any other vector is refused (FOREIGN_TRAP). A batch with a new patch
 * is refused with -EPERM (reason LOCKDOWN or MODULES_DISABLED) while kernel lockdown forbids
 * writing kernel memory or kernel.modules_disabled is set; reverts are still allowed (they
 * put the kernel's own text back). While a patch is live its range is on the kprobes
 * blacklist, so register_kprobe() refuses it. On failure nothing is written, the ioctl fails
 * (-EINVAL refused site, -EBUSY overlap, -ESTALE mismatch, -EPERM forbidden) and
 * failed_index, reason, error, culprit and, for a mismatch, found (the current bytes) say why.
 */
struct trapvec_apply {
	__u64 patches;		/* user pointer to count struct trapvec_patch */
	__u32 count;		/* at most TRAPVEC_BATCH_MAX */
	__u32 flags;		/* must be 0 */
	__u32 failed_index;	/* out */
	__u32 reason;		/* out: TRAPVEC_REASON_* */
	__s32 error;		/* out: negative errno behind the reason, if any */
	__u32 pad;
	__u8 found[TRAPVEC_PATCH_MAX];	/* out: current bytes at the failing patch */
	__u64 culprit;		/* out: as trapvec_check.culprit */
};

/*
 * A task predicate of a dispatch entry (ABI 7). With match not 0, a trap whose task (current)
 * does not have every field match names is sent to skip (the replay of the displaced
 * instructions) without counting it or running the handler. pid and tgid are task->pid and
 * task->tgid; comm is task->comm as the kernel keeps it (NUL-padded to 16 bytes).
 */
#define TRAPVEC_MATCH_PID	(1U << 0)
#define TRAPVEC_MATCH_TGID	(1U << 1)
#define TRAPVEC_MATCH_COMM	(1U << 2)
#define TRAPVEC_MATCH_ALL	(TRAPVEC_MATCH_PID | TRAPVEC_MATCH_TGID | TRAPVEC_MATCH_COMM)

struct trapvec_task_match {
	__u32 match;		/* TRAPVEC_MATCH_* bits; 0: every task */
	__u32 pid;
	__u32 tgid;
	__u32 pad;		/* 0 */
	__u64 skip;		/* with match: a sealed code block's address */
	char comm[16];
};

/*
 * A dispatch entry. A trap at site sends the CPU to dest (regs->ip = dest). If handler is
 * not 0 the dispatcher first calls handler(struct trapvec_regs *, cookie) with interrupts
 * off, unless a handler is already running on this CPU: then the handler is skipped and the
 * hit also counts as missed. dest must lie in a sealed code block, handler too or be the
 * return-point entry routine (trapvec_return_add.entry) or the keyed-count routine
 * (trapvec_key_add.entry).
 */
struct trapvec_dispatch_entry {
	__u64 site;		/* address of the trap instruction */
	__u64 dest;
	__u64 handler;
	__u64 cookie;
	struct trapvec_task_match only;
};

/* DISPATCH_ADD: all entries or none (a site may have one entry). */
struct trapvec_dispatch_add {
	__u64 entries;		/* user pointer to count struct trapvec_dispatch_entry */
	__u32 count;
	__u32 failed_index;	/* out */
};

/*
 * DISPATCH_REMOVE: all sites or none (each must have an entry: -ENOENT; and its trap must not
 * be live: -EBUSY, revert the text first).
 */
struct trapvec_dispatch_remove {
	__u64 sites;		/* user pointer to count __u64 */
	__u32 count;
	__u32 failed_index;	/* out */
};

/*
 * DISPATCH_REPLACE (ABI 8): give sites that have an entry a new one, each in one step, the
 * trap staying in the text: a trap taken at a site meets the old entry or the new, never
 * none (a daemon hands a function from one trap splice to another without a moment
 * unspliced). All entries or none: every site must have an entry (-ENOENT) and the new
 * entries pass DISPATCH_ADD's checks. counts points at count struct trapvec_hits: in, what
 * each new entry's counters start from (site is ignored); out, the old entry's final
 * counters (after a grace period: no CPU is in the dispatcher with the old entry any more),
 * with its site. Putting the old entries back with their counts undoes a replacement.
 */
struct trapvec_dispatch_replace {
	__u64 entries;		/* user pointer to count struct trapvec_dispatch_entry */
	__u64 counts;		/* user pointer to count struct trapvec_hits, in and out */
	__u32 count;
	__u32 failed_index;	/* out */
};

/* HITS: counters of one site, summed over CPUs. */
struct trapvec_hits {
	__u64 site;
	__u64 hits;		/* out: every trap taken at site */
	__u64 missed;		/* out: of those, how many skipped the handler (reentry) */
};

/* One element of LIST. */
struct trapvec_list_entry {
	__u64 site;
	__u64 dest;
	__u64 handler;
	__u64 cookie;
	__u64 hits;
	__u64 missed;
	struct trapvec_task_match only;
};

/*
 * LIST: up to capacity entries (at most TRAPVEC_BATCH_MAX per call), ordered by site, from the
 * start-th on; count is the total number of entries. A table larger than one call is read
 * page by page (start = 0, capacity, 2 * capacity, ...).
 *
 * LIST_HIT: the same over the entries hit at least once only (count: how many are), for a
 * reader of thousands of counters that wants the few that moved (once-mode coverage). A module
 * older than it answers -ENOTTY (the ABI version is unchanged: LIST then does).
 */
struct trapvec_list {
	__u64 entries;		/* user pointer to capacity struct trapvec_list_entry */
	__u32 capacity;
	__u32 count;		/* out */
	__u64 start;		/* index of the first entry to copy */
};

/*
 * QUIESCE: synchronize_rcu() and synchronize_rcu_tasks(), then a wait (at most
 * TRAPVEC_QUIESCE_WAIT_MS) until no task is in flight through a freed code block (its
 * counter, trapvec_info.inflight_base, is zero): afterwards no CPU is in the dispatcher for
 * a removed entry and no task is in code it was sent to before the call; blocks freed
 * before the call are then reused, and the references of reverted patches on the modules
 * they patched are dropped. -EBUSY when a task stays in a freed block longer (a replacement
 * that sleeps): nothing was reclaimed, busy_addr names the block; try again later.
 */
#define TRAPVEC_QUIESCE_WAIT_MS	5000
struct trapvec_quiesce {
	__u64 reclaimed_blocks;	/* out */
	__u64 reclaimed_bytes;	/* out */
	__u64 busy_addr;	/* out, with -EBUSY: a freed code block a task is still in */
	__u64 busy_count;	/* out, with -EBUSY: how many tasks are in it */
};

/*
 * STATE_GET and STATE_PUT: an opaque blob that user space keeps in the module between two
 * runs of a one-shot tool (trapctl records its components and splices there). The module
 * never looks inside; it keeps the blob (at most TRAPVEC_STATE_MAX bytes) until the next
 * PUT or until it is unloaded, when it reverts every patch anyway, so a blob can never
 * describe another instance of the module. Every PUT increments a generation number, which
 * starts at 0 with an empty blob when the module loads.
 *
 * GET: copies the blob to buf if it fits in len bytes; size and generation are filled in
 * either way, and -ENOSPC says that the blob did not fit (nothing was copied).
 * PUT: replaces the blob with len bytes at buf (0: no blob) if generation still equals the
 * current generation (compare and swap), else fails with -ESTALE; on success generation is
 * set to the new generation. size is ignored.
 */
struct trapvec_state {
	__u64 buf;		/* user buffer */
	__u64 len;		/* GET: capacity of buf; PUT: bytes in buf */
	__u64 size;		/* GET out: size of the blob */
	__u64 generation;	/* GET out: current; PUT in: expected, out: new */
};

#define TRAPVEC_IOC_INFO	_IOWR(TRAPVEC_IOC_MAGIC, 0, struct trapvec_info)
#define TRAPVEC_IOC_READ	_IOWR(TRAPVEC_IOC_MAGIC, 1, struct trapvec_read)
#define TRAPVEC_IOC_ALLOC	_IOWR(TRAPVEC_IOC_MAGIC, 2, struct trapvec_alloc)
#define TRAPVEC_IOC_WRITE	_IOWR(TRAPVEC_IOC_MAGIC, 3, struct trapvec_write)
#define TRAPVEC_IOC_SEAL	_IOWR(TRAPVEC_IOC_MAGIC, 4, struct trapvec_block)
#define TRAPVEC_IOC_FREE	_IOWR(TRAPVEC_IOC_MAGIC, 5, struct trapvec_block)
#define TRAPVEC_IOC_CHECK	_IOWR(TRAPVEC_IOC_MAGIC, 6, struct trapvec_check)
#define TRAPVEC_IOC_APPLY	_IOWR(TRAPVEC_IOC_MAGIC, 7, struct trapvec_apply)
#define TRAPVEC_IOC_DISPATCH_ADD	_IOWR(TRAPVEC_IOC_MAGIC, 8, struct trapvec_dispatch_add)
#define TRAPVEC_IOC_DISPATCH_REMOVE	_IOWR(TRAPVEC_IOC_MAGIC, 9, struct trapvec_dispatch_remove)
#define TRAPVEC_IOC_HITS	_IOWR(TRAPVEC_IOC_MAGIC, 10, struct trapvec_hits)
#define TRAPVEC_IOC_DISPATCH_REPLACE	_IOWR(TRAPVEC_IOC_MAGIC, 15, struct trapvec_dispatch_replace)
#define TRAPVEC_IOC_CHECK_MANY	_IOWR(TRAPVEC_IOC_MAGIC, 16, struct trapvec_check_many)
#define TRAPVEC_IOC_LIST_HIT	_IOWR(TRAPVEC_IOC_MAGIC, 17, struct trapvec_list)
#define TRAPVEC_IOC_LIST	_IOWR(TRAPVEC_IOC_MAGIC, 11, struct trapvec_list)
#define TRAPVEC_IOC_QUIESCE	_IOWR(TRAPVEC_IOC_MAGIC, 12, struct trapvec_quiesce)
#define TRAPVEC_IOC_STATE_GET	_IOWR(TRAPVEC_IOC_MAGIC, 13, struct trapvec_state)
#define TRAPVEC_IOC_STATE_PUT	_IOWR(TRAPVEC_IOC_MAGIC, 14, struct trapvec_state)

/*
 * Return points (ABI 5). A return point runs a handler, and times the call, when a function
 * returns. Its entry half is an ordinary call splice at the function's entry (its first
 * instruction past the ftrace site) whose handler is the module's entry routine (entry, which
 * a dispatch entry may name as its handler, and a trampoline may call) with cookie
 * (generation << 32 | slot); it replaces the call's return address with a stub of the
 * module's, so that the return half runs when the function returns. At most
 * TRAPVEC_RETURN_SLOTS return points at once and TRAPVEC_RETURN_INSTANCES calls in progress
 * in all of them; a call that finds no free instance, its slot's maxactive instances in use,
 * or its CPU already in the return runtime or a return handler (reentry) runs without its
 * return half and is counted as missed.
 */
#define TRAPVEC_RETURN_SLOTS		256
#define TRAPVEC_RETURN_INSTANCES	4096
#define TRAPVEC_RETURN_BUCKETS		65	/* log2 buckets: 0, then [2^(k-1), 2^k) ns */

/* Clocks of a timer (trapvec_return_add.clock). */
#define TRAPVEC_CLOCK_NONE	0	/* no timer */
#define TRAPVEC_CLOCK_WALL	1	/* ktime_get_mono_fast_ns() */
#define TRAPVEC_CLOCK_CPU	2	/* the task's time on a CPU (scheduler clock) */

/*
 * RETURN_ADD: a slot for a new return point. handler is 0 (count or time only) or a
 * void handler(struct trapvec_regs *, struct trapvec_call *) in a sealed code block.
 * -ENOSPC when every slot is taken, -EINVAL for a bad maxactive or clock, -EFAULT for a
 * handler outside sealed code.
 */
struct trapvec_return_add {
	__u64 handler;
	__u64 cookie;		/* handed to the handler in trapvec_call.cookie */
	__u32 maxactive;	/* 1..TRAPVEC_RETURN_INSTANCES */
	__u32 clock;		/* TRAPVEC_CLOCK_* */
	__u32 slot;		/* out */
	__u32 generation;	/* out */
	__u64 entry;		/* out: the entry routine, handler of the entry half */
	__u64 entry_cookie;	/* out: cookie of the entry half */
};

/*
 * RETURN_REMOVE: give a slot back once its entry half can no longer run (its text reverted,
 * QUIESCE done). Calls still inside the function return through their stubs without the
 * handler. Waits (at most TRAPVEC_QUIESCE_WAIT_MS) until no CPU runs the slot's return
 * half, so that the handler's code may go: -EBUSY when one still does (the slot is left
 * draining; calling again waits again). -ENOENT for a slot that is not this generation's.
 * The module holds a reference on itself while any return point lives or any call still has
 * its return address pointing at a stub (rmmod says "in use").
 */
struct trapvec_return_remove {
	__u32 slot;
	__u32 generation;
	__u64 busy;		/* out, with -EBUSY: CPUs still in the return half */
};

/* RETURN_STATS: a live slot's counters, summed over CPUs. -ENOENT as for RETURN_REMOVE. */
struct trapvec_return_stats {
	__u32 slot;
	__u32 generation;
	__u64 returns;		/* out: returns that ran the return half */
	__u64 missed;		/* out: calls without their return half */
	__u64 active;		/* out: calls in progress */
	__u32 clock;		/* out: TRAPVEC_CLOCK_* */
	__u32 pad;
	__u64 sum;		/* out: ns, timers */
	__u64 max;		/* out: ns, timers */
	__u64 buckets[TRAPVEC_RETURN_BUCKETS];	/* out: timers */
};

#define TRAPVEC_IOC_RETURN_ADD		_IOWR(TRAPVEC_IOC_MAGIC, 32, struct trapvec_return_add)
#define TRAPVEC_IOC_RETURN_REMOVE	_IOWR(TRAPVEC_IOC_MAGIC, 33, struct trapvec_return_remove)
#define TRAPVEC_IOC_RETURN_STATS	_IOWR(TRAPVEC_IOC_MAGIC, 34, struct trapvec_return_stats)

/*
 * Keyed counts (ABI 6). A keyed count counts a splice's hits by who made them (bpftrace's
 * @[comm] = count()): an ordinary call splice whose handler is the module's counting routine
 * (entry, which a dispatch entry may name as its handler and a trampoline may call) with
 * cookie (generation << 32 | slot). The routine reads the key of current (its pid, tgid or
 * comm, or the CPU) and adds one to that key's entry in the slot's table on this CPU:
 * TRAPVEC_KEY_TABLE entries per CPU, filled without locks. A hit whose key finds the table of
 * its CPU full is counted as overflow, so the entries and the overflow add up to the hits
 * that ran the routine (a trap's hits minus its missed ones). At most TRAPVEC_KEY_SLOTS keyed
 * counts at once; the module holds a reference on itself while one lives.
 */
#define TRAPVEC_KEY_SLOTS	64
#define TRAPVEC_KEY_TABLE	256	/* keys per CPU per slot */
#define TRAPVEC_KEY_BYTES	16	/* TASK_COMM_LEN */

/* What a keyed count counts by (trapvec_key_add.by). */
#define TRAPVEC_KEY_PID		1	/* current->pid (a thread id) */
#define TRAPVEC_KEY_TGID	2	/* current->tgid (a process id) */
#define TRAPVEC_KEY_COMM	3	/* current->comm, 16 bytes, NUL-padded */
#define TRAPVEC_KEY_CPU		4	/* smp_processor_id() */

/* KEY_ADD: a slot for a new keyed count. -ENOSPC when every slot is taken, -EINVAL for by. */
struct trapvec_key_add {
	__u32 by;		/* TRAPVEC_KEY_* */
	__u32 slot;		/* out */
	__u32 generation;	/* out */
	__u32 pad;
	__u64 entry;		/* out: the counting routine, handler of the splice */
	__u64 entry_cookie;	/* out: cookie of the splice */
};

/*
 * KEY_REMOVE: give a slot back once its splice can no longer run the routine (its text
 * reverted, QUIESCE done); waits for an RCU grace period for CPUs still in the routine.
 * -ENOENT for a slot that is not this generation's.
 */
struct trapvec_key_remove {
	__u32 slot;
	__u32 generation;
};

/*
 * One key of KEY_STATS. pid, tgid and cpu: the number in key[0..8] (native order, the rest
 * zero); comm: the name, NUL-padded (a name changed while it was read may be torn).
 */
struct trapvec_key_entry {
	__u8 key[TRAPVEC_KEY_BYTES];
	__u64 count;
};

/*
 * KEY_STATS: a live slot's table, summed over CPUs, one entry per key (entries of one key on
 * several CPUs, or twice on one CPU, merged), ordered by key. Copies up to capacity entries
 * to entries; count is the number of keys (more than capacity: call again with room for
 * count). hits is the sum of every key's count and the overflow, read in the same pass.
 * -ENOENT as for KEY_REMOVE, -EINVAL for a capacity above TRAPVEC_KEY_TABLE * nr CPUs.
 */
struct trapvec_key_stats {
	__u32 slot;
	__u32 generation;
	__u64 entries;		/* user pointer to capacity struct trapvec_key_entry */
	__u32 capacity;
	__u32 count;		/* out */
	__u32 by;		/* out: TRAPVEC_KEY_* */
	__u32 pad;
	__u64 overflow;		/* out: hits whose key found the table full */
	__u64 hits;		/* out: every key's count and the overflow */
};

#define TRAPVEC_IOC_KEY_ADD		_IOWR(TRAPVEC_IOC_MAGIC, 35, struct trapvec_key_add)
#define TRAPVEC_IOC_KEY_REMOVE		_IOWR(TRAPVEC_IOC_MAGIC, 36, struct trapvec_key_remove)
#define TRAPVEC_IOC_KEY_STATS		_IOWR(TRAPVEC_IOC_MAGIC, 37, struct trapvec_key_stats)

/*
 * Module watch (ABI 10): points in modules that are not loaded yet. One open file of
 * /dev/trapvec at a time may be the watcher (WATCH; -EBUSY while another is). From then on
 * the module's module notifier queues an event for every module that is COMING (its symbols
 * are in /proc/kallsyms, its init has not run) or GOING (its exit has run, its text is not
 * freed yet) and waits until the watcher acknowledges it (MODACK), at most the module
 * parameter watch_timeout_ms; closing the watcher's file releases every waiter. While a
 * COMING event is delivered and not acknowledged, APPLY with TRAPVEC_APPLY_DEFERRED may patch
 * that module's core text; such patches take no reference on the module (it stays
 * removable). After the wait, whether acknowledged or not, the notifier itself reverts every
 * patch of ours still live in a GOING module's text (or in a COMING one it refuses) and
 * removes the dispatch entries there, so nothing points into freed text.
 */
#define TRAPVEC_APPLY_DEFERRED	1U	/* trapvec_apply.flags */

#define TRAPVEC_MODEVENT_COMING	1
#define TRAPVEC_MODEVENT_GOING	2
#define TRAPVEC_MODNAME_LEN	56	/* the kernel's MODULE_NAME_LEN on 64-bit */

/* WATCH: make this file the watcher. flags must be 0. */
struct trapvec_watch {
	__u32 flags;
	__u32 pad;
};

/*
 * MODEVENT: the next event not yet delivered, waiting up to timeout_ms for one (-EAGAIN if
 * none came, -EINTR on a signal, -EPERM if this file is not the watcher).
 */
struct trapvec_modevent {
	__u64 seq;		/* out: the event's number, for MODACK */
	__u32 state;		/* out: TRAPVEC_MODEVENT_* */
	__u32 timeout_ms;	/* in */
	__u64 text_base;	/* out: the module's core text */
	__u64 text_size;	/* out */
	char name[TRAPVEC_MODNAME_LEN];	/* out: NUL-terminated */
};

/*
 * MODACK: the watcher is done with event seq. error 0, or (COMING only) a negative errno
 * that the notifier returns, refusing the module. -ENOENT if seq is not waiting (its wait
 * timed out), -EINVAL for an error out of range.
 */
struct trapvec_modack {
	__u64 seq;
	__s32 error;
	__u32 pad;
};

#define TRAPVEC_IOC_WATCH		_IOWR(TRAPVEC_IOC_MAGIC, 48, struct trapvec_watch)
#define TRAPVEC_IOC_MODEVENT		_IOWR(TRAPVEC_IOC_MAGIC, 49, struct trapvec_modevent)
#define TRAPVEC_IOC_MODACK		_IOWR(TRAPVEC_IOC_MAGIC, 50, struct trapvec_modack)

#endif /* _TRAPVEC_ABI_H */
