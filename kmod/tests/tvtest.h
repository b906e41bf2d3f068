/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tvtest.h - what the parts of trapvec_test share: the check() reporter, ioctl wrappers, the
 * getppid splice they all patch, and each part's tests. The parts, by job:
 *   trapvec_test.c    main: INFO, arena blocks, the getppid splice's whole life, reload
 *   tvtest_lib.c      check()/finish(), the ioctl wrappers, kallsyms, the splice's code
 *   tvtest_refuse.c   what APPLY and CHECK refuse, and who may not use the device
 *   tvtest_text.c     module text, stress, a big batch, FREE of referenced blocks, READ_ORIGINAL
 *   tvtest_many.c     CHECK_MANY answers as CHECK does, window by window
 */
#ifndef TVTEST_H
#define TVTEST_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trapvec_abi.h"

#define NOBODY 65534
#define CALLS 1000
#define NESTED_CALLS 100
#define STRESS_CYCLES 200
#define BIG_BATCH 1000

/* Checks made and failed so far, and the open /dev/trapvec. */
extern int failures;
extern int checks;
extern int dev;

/* Everything the splice needs, found or built by setup_splice(). */
struct splice {
	uint64_t site;			/* __x64_sys_getppid + entry */
	uint32_t entry;			/* entry_len(__x64_sys_getppid): 5, or 9 with IBT */
	uint8_t orig[16];		/* __x64_sys_getppid + 0..15 before anything */
	uint64_t callee;
	struct trapvec_alloc code;	/* trampoline at +0, handler at +32 */
	struct trapvec_alloc data;	/* counter at +0, flag at +8 */
	uint64_t tramp, handler;
};

/* tvtest_lib.c */
void check(int ok, const char *fmt, ...);
int finish(void);
void fatal(const char *what);
int tv(unsigned long cmd, void *arg);
uint64_t ksym(const char *name);
int kread(uint64_t addr, void *buf, uint32_t len);
uint32_t entry_len_of(const uint8_t *b, int nop_only);
uint32_t entry_len(uint64_t fn);
uint32_t check_reason(uint64_t addr, uint32_t len);
int alloc_block(uint32_t kind, uint64_t size, struct trapvec_alloc *out);
int write_block(uint64_t id, uint64_t off, const void *bytes, uint32_t len);
int block_op(unsigned long cmd, uint64_t id);
int apply(struct trapvec_patch *p, uint32_t n, struct trapvec_apply *out);
int dispatch_add(struct trapvec_dispatch_entry *e, uint32_t n, uint32_t *failed);
int dispatch_remove(uint64_t *sites, uint32_t n, uint32_t *failed);
int hits(uint64_t site, struct trapvec_hits *h);
void put32(uint8_t *p, int64_t v);
int64_t get32(const uint8_t *p);
void info(struct trapvec_info *i);
void setup_splice(struct splice *s, uint64_t getppid);
double seconds(void);
void call_getppid(int n, pid_t want, const char *what);
int dmesg_has(const char *a, const char *b, const char *c);

/* tvtest_refuse.c */
void test_not_a_jump(uint64_t getppid);
void test_refusals(uint64_t getppid, const struct trapvec_info *in);
void test_user_int(void);
void test_nonroot(void);
void hidden_table(const char *first, const char *last, uint32_t size, uint32_t field,
		  uint32_t len, uint32_t reason, const char *what);

/* tvtest_many.c */
void test_check_many(uint64_t getppid, const struct trapvec_info *in);

/* tvtest_text.c */
long module_refcnt(const char *mod);
void test_module_text(const char *mod);
void test_stress(struct splice *s, struct trapvec_patch *trap, pid_t ppid);
void test_big_batch(int n);
void test_free_referenced(const struct splice *s, pid_t ppid);
void test_read_original(const struct splice *s, uint64_t getppid);

#endif /* TVTEST_H */
