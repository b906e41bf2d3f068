/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the parts of trapvec.ko share.
 *
 *   main.c      module init/exit, /dev/trapvec and its ioctls, trapvec_mutex
 *   ksyms.c     kernel symbols that are not exported, found at load time
 *   gate.c      the IDT gate of the trap vector
 *   entry.S     the gate's entry stub
 *   dispatch.c  the dispatch table and the dispatcher (the trap path)
 *   arena.c     the code and data arenas (arena_text.S holds the code arena)
 *   check.c     site validation
 *   reserved.c  sorted snapshots of the kernel's jump-label, static-call and bug tables
 *   text.c      batched text patches and the record of live ones
 *   state.c     user space's state blob (STATE_GET, STATE_PUT)
 *   mem.c       the count of every allocation the module holds
 *   returns.c   return points and timers (return_stubs.S holds their stubs)
 *   keyed.c     keyed counts (hits by pid, tgid, comm or CPU)
 *   modwatch.c  the module notifier and its watcher (points in modules loaded later)
 */
#ifndef _TRAPVEC_INTERNAL_H
#define _TRAPVEC_INTERNAL_H

#include <linux/context_tracking.h>
#include <linux/mutex.h>
#include <linux/types.h>
#include <linux/version.h>
#include <asm/insn.h>
#include <asm/ptrace.h>

#include "trapvec_abi.h"
#include "trapvec_compat.h"

struct bug_entry;
struct jump_entry;
struct exception_table_entry;
struct kprobe;
struct kprobe_insn_cache;
struct module;

/*
 * trapvec_mutex serializes every change the module makes: ioctls that change or read the
 * dispatch table's writer side, the arenas, the live-patch record, and module unload. The
 * trap path never takes it (it runs with interrupts off and reads the dispatch table under
 * RCU).
 */
extern struct mutex trapvec_mutex;

/* Trap vector (module parameter), validated by trapvec_gate_install(). */
extern unsigned int trapvec_vector;

/* Length of the trap instruction: int imm8 is CD ib. */
#define TRAPVEC_TRAP_LEN	2

/* ksyms.c: kernel symbols that are not exported, resolved once at load. */
struct trapvec_ksyms {
	int (*kallsyms_lookup_size_offset)(unsigned long addr, unsigned long *size,
					   unsigned long *offset);
	const struct exception_table_entry *(*search_exception_tables)(unsigned long addr);
	unsigned long (*ftrace_location_range)(unsigned long start, unsigned long end);
	int (*jump_label_text_reserved)(void *start, void *end);
	int (*static_call_text_reserved)(void *start, void *end);
	struct bug_entry *(*find_bug)(unsigned long bugaddr);
	bool (*within_kprobe_blacklist)(unsigned long addr);
	struct module *(*module_text_address)(unsigned long addr);
	int (*insn_decode)(struct insn *insn, const void *kaddr, int buf_len, enum insn_mode mode);
	int (*arch_jump_entry_size)(struct jump_entry *entry);
	int (*alternatives_text_reserved)(void *start, void *end);
	/* Since 6.10 (trapvec_arena.h): the code arena's memory; NULL before. */
	void *(*execmem_alloc)(int type, size_t size);
	void (*execmem_free)(void *ptr);
	int (*set_memory_rox)(unsigned long addr, int numpages);
	struct kprobe *(*get_kprobe)(void *addr);
	int (*kprobe_aggr_pre_handler)(struct kprobe *p, struct pt_regs *regs);
	bool (*is_insn_slot_addr)(struct kprobe_insn_cache *c, unsigned long addr);
	bool (*is_bpf_text_address)(unsigned long addr);
	bool (*is_ftrace_trampoline)(unsigned long addr);
	struct kprobe_insn_cache *kprobe_insn_slots, *kprobe_optinsn_slots;
	/* RCU's NMI entry and exit (kernel/context_tracking.c), noinstr: dispatch.c */
	void (*ct_nmi_enter)(void);
	void (*ct_nmi_exit)(void);
	struct mutex *text_mutex;
	/* Guards kprobe_blacklist and the kprobe table's writers (kernel/kprobes.c). */
	struct mutex *kprobe_mutex;
	struct list_head *kprobe_blacklist;
	int *modules_disabled;
	unsigned long stext, etext;
	unsigned long entry_text_start, entry_text_end;
	unsigned long noinstr_text_start, noinstr_text_end;
	unsigned long thunk_start, thunk_end;
	unsigned long cpuidle_text_start, cpuidle_text_end;
	unsigned long static_call_text_start, static_call_text_end;
	unsigned long spurious_entries_start;
	unsigned long jump_table_start, jump_table_end;
	unsigned long static_call_sites_start, static_call_sites_end;
	unsigned long bug_table_start, bug_table_end;
	unsigned long ex_table_start, ex_table_end;
};

extern struct trapvec_ksyms trapvec_ksyms;
int trapvec_ksyms_init(void);

/* gate.c */
extern unsigned long trapvec_old_handler;	/* read by entry.S */
int trapvec_gate_install(void);
void trapvec_gate_restore(void);
unsigned long trapvec_gate_handler(void);

/* entry.S */
void trapvec_entry(void);

/* dispatch.c and dispatch_table.c */
int trapvec_dispatch_init(void);
void trapvec_dispatch_exit(void);
int trapvec_dispatch(struct pt_regs *regs);
bool trapvec_dispatch_site(struct pt_regs *regs, unsigned long site);
int trapvec_dispatch_add(const struct trapvec_dispatch_entry *entries, u32 count,
			 u32 *failed_index);
int trapvec_dispatch_remove(const u64 *sites, u32 count, u32 *failed_index);
int trapvec_dispatch_replace(const struct trapvec_dispatch_entry *entries,
			     struct trapvec_hits *counts, u32 count, u32 *failed_index);
int trapvec_dispatch_hits(struct trapvec_hits *hits);
int trapvec_dispatch_list(struct trapvec_list_entry *out, u64 start, u32 capacity, u64 min_hits,
			  u32 *count);
bool trapvec_dispatch_has(unsigned long site);
unsigned long trapvec_dispatch_targets(unsigned long start, unsigned long end);
unsigned long trapvec_dispatch_site_calling(unsigned long handler, u32 slot);
void trapvec_dispatch_clear(void);
u64 trapvec_dispatch_count(void);
void trapvec_dispatch_stats(u64 *unknown, u64 *retried);

/* arena.c (arena_text.S holds the code arena until 6.9) */
int trapvec_arena_init(void);
void trapvec_arena_exit(void);
int trapvec_arena_alloc(struct trapvec_alloc *req);
int trapvec_arena_write(const struct trapvec_write *req);
int trapvec_arena_seal(u64 id);
/* A block was sealed since every CPU last serialized (under trapvec_mutex; ioctl.c). */
extern bool trapvec_seal_pending;
int trapvec_arena_free(u64 id);
int trapvec_arena_wait_inflight(bool all, unsigned int timeout_ms, struct trapvec_quiesce *out);
void trapvec_arena_reclaim(struct trapvec_quiesce *out);
void trapvec_replace_ret(void);	/* replace.S: the way out of replace trampolines */
bool trapvec_arena_overlaps_code(unsigned long addr, unsigned long len);
bool trapvec_arena_in_sealed_code(unsigned long addr);
void trapvec_arena_info(struct trapvec_info *info);

/* check.c */
u32 trapvec_check_site(unsigned long addr, u32 len, u64 *culprit);
u32 trapvec_check_site_early(unsigned long addr, u32 len, u64 *culprit);
u32 trapvec_check_site_insns(unsigned long addr, u32 len, u64 *culprit, u32 *insns);
struct trapvec_boundary;
u32 trapvec_check_site_known(const struct trapvec_boundary *b, u64 *culprit, u32 *insns);

/*
 * One kallsyms symbol's original text, read and decoded once from its start (check.c): CHECK
 * loads it for one window, CHECK_MANY (check_many.c) for every window of a batch in it.
 */
struct trapvec_fn {
	unsigned long start, size;	/* the symbol */
	unsigned long span;		/* bytes read from start */
	unsigned long decoded;		/* instructions start below this offset only */
	u8 *text;			/* span original bytes */
	u8 *ilen;			/* per offset: TRAPVEC_FN_LEN of the insn there (0: none) */
};

#define TRAPVEC_FN_LEN		0x0f	/* length of the instruction starting here (<= 15) */
#define TRAPVEC_FN_CALL		0x10	/* it pushes a return address */
#define TRAPVEC_FN_ENDBR	0x20	/* endbr64 */

int trapvec_fn_load(struct trapvec_fn *f, unsigned long start, unsigned long size,
		    unsigned long limit);
void trapvec_fn_free(struct trapvec_fn *f);
u32 trapvec_fn_check_window(const struct trapvec_fn *f, unsigned long addr, u32 len, u32 *insns);

/* check_many.c */
struct trapvec_boundary {
	u32 reason;	/* the early checks' verdict on a window, else its symbol's */
	u32 insns;	/* instructions that overlap it, when accepted */
	u64 culprit;	/* as struct trapvec_check's, from the early checks */
};

int trapvec_check_many(struct trapvec_check *checks, u32 count);
int trapvec_check_boundaries(const struct trapvec_patch *patches, u32 n,
			     bool (*revert)(const struct trapvec_patch *p),
			     struct trapvec_boundary **out);
u32 trapvec_check_site_kprobe(unsigned long addr, u32 len, s32 *error, u64 *culprit);
bool trapvec_in_own_module(unsigned long addr, unsigned long len);
u32 trapvec_may_write(void);
const char *trapvec_reason_name(u32 reason);
int trapvec_read_unpatched(unsigned long addr, u8 *buf, size_t len);
bool trapvec_may_read(void);

/* reserved.c */
int trapvec_reserved_init(void);
void trapvec_reserved_exit(void);
u32 trapvec_reserved_check(unsigned long addr, u32 len);
u32 trapvec_hidden_check(unsigned long addr, u32 len, u64 *culprit);

/* ioctl.c: every ioctl of /dev/trapvec, one table. */
long trapvec_ioctl(struct file *file, unsigned int cmd, unsigned long arg);

/* text.c and text_*.c */
int trapvec_text_init(void);
void trapvec_text_exit(void);
void trapvec_text_cancel_work(void);
void trapvec_text_check_kprobes(void);
void trapvec_text_wait_kprobes(void);
int trapvec_text_apply(const struct trapvec_patch *patches, struct trapvec_apply *req);
void trapvec_text_revert_all(void);
u64 trapvec_text_live_count(void);
void trapvec_text_put_parked(void);
bool trapvec_text_overlaps_live(unsigned long addr, unsigned long len);
int trapvec_text_read_original(unsigned long addr, u8 *buf, size_t len);
bool trapvec_text_trap_live(unsigned long site);
unsigned long trapvec_text_jmp_into(unsigned long start, unsigned long end);
u32 trapvec_text_revert_within(unsigned long start, unsigned long end);

/* state.c: has its own mutex; never called with trapvec_mutex held. */
int trapvec_state_get(struct trapvec_state *req);
int trapvec_state_put(struct trapvec_state *req);
void trapvec_state_exit(void);

/*
 * mem.c: every allocation is counted by kind (objects and bytes), so that a test sees any
 * leak; the free names the kind and size the allocation did.
 */
enum trapvec_mem_kind {
	TRAPVEC_MEM_ENTRY,	/* dispatch entries and their per-CPU counters */
	TRAPVEC_MEM_BLOCK,	/* arena block records */
	TRAPVEC_MEM_PATCH,	/* live and parked patch records, their blacklist entries */
	TRAPVEC_MEM_ALIAS,	/* writable vmap() aliases: IDT page, code arena, patched pages */
	TRAPVEC_MEM_PENDING,	/* the int3-first sites of a batch in flight */
	TRAPVEC_MEM_STATE,	/* user space's state blob */
	TRAPVEC_MEM_RESERVED,	/* the reserved-range table (reserved.c) */
	TRAPVEC_MEM_SCRATCH,	/* buffers that live for one ioctl */
	TRAPVEC_MEM_KINDS
};

void trapvec_mem_got(enum trapvec_mem_kind kind, size_t bytes);
void trapvec_mem_put(enum trapvec_mem_kind kind, size_t bytes);
/* kvmalloc(n * size), NULL on overflow; add __GFP_ZERO for zeroed memory. */
void *trapvec_kvmalloc(enum trapvec_mem_kind kind, size_t n, size_t size, gfp_t gfp);
void trapvec_kvfree(enum trapvec_mem_kind kind, const void *p, size_t bytes);
struct page;
void *trapvec_vmap(enum trapvec_mem_kind kind, struct page **pages, unsigned int n);
void trapvec_vunmap(enum trapvec_mem_kind kind, const void *p, unsigned int n);
void trapvec_mem_exit(void);

/* returns.c */
struct trapvec_regs;
void trapvec_returns_init(void);
void trapvec_returns_cancel_work(void);
void trapvec_returns_exit(void);
void trapvec_rp_entry(struct trapvec_regs *regs, void *cookie);
bool trapvec_returns_is_entry(unsigned long addr);
int trapvec_returns_add(struct trapvec_return_add *req);
int trapvec_returns_remove(struct trapvec_return_remove *req);
int trapvec_returns_stats(struct trapvec_return_stats *req);
int trapvec_returns_handler_in(unsigned long start, unsigned long end);

/* keyed.c */
void trapvec_key_entry(struct trapvec_regs *regs, void *cookie);
bool trapvec_keys_is_entry(unsigned long addr);
int trapvec_keys_add(struct trapvec_key_add *req);
int trapvec_keys_remove(struct trapvec_key_remove *req);
int trapvec_keys_stats(struct trapvec_key_stats *req);
void trapvec_keys_exit(void);

/* modwatch.c */
struct file;
int trapvec_modwatch_init(void);
void trapvec_modwatch_exit(void);
int trapvec_modwatch_watch(struct file *file, const struct trapvec_watch *req);
int trapvec_modwatch_event(struct file *file, struct trapvec_modevent *req);
int trapvec_modwatch_ack(struct file *file, const struct trapvec_modack *req);
void trapvec_modwatch_release(struct file *file);
bool trapvec_modwatch_arming(const struct module *mod);

/* Per-CPU sync_core(), for on_each_cpu() and the stop_machine() callback. */
void trapvec_sync_core(void *unused);

/*
 * Is RCU watching this CPU? What rcu_is_watching() answers, inline: in 6.1 that function is
 * ordinary text a site may be placed in, and the trap path must call nothing such. Call with
 * preemption or interrupts off.
 */
static __always_inline bool trapvec_rcu_watching(void)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
	return rcu_is_watching_curr_cpu();
#else
	return !rcu_dynticks_curr_cpu_in_eqs();
#endif
}
/* arena.c: RCU-tasks and RCU-tasks-rude grace periods (idle tasks included). */
void trapvec_sync_tasks(void);

#endif /* _TRAPVEC_INTERNAL_H */
