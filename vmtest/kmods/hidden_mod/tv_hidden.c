// SPDX-License-Identifier: GPL-2.0
/*
 * tv_hidden - branch targets no decoder sees, in a module's text: a jump-label target and an
 * exception fix-up, each in the middle of straight-line code (not after a jmp or ret, and not
 * the target of any decoded branch), so that a window placed 1 to 4 bytes before it is a
 * single basic block to user space's decoder and only trapvec.ko's tables tell otherwise
 * (reasons JUMP_TARGET and EXTABLE_FIXUP, from the module's __jump_table and __ex_table).
 *
 *   insmod tv_hidden.ko
 *   echo 0 > /sys/module/tv_hidden/parameters/key    # flip the static key (1: back)
 *   echo 1 > /sys/module/tv_hidden/parameters/run    # call both functions
 *   cat /sys/module/tv_hidden/parameters/result      # "key=K sum=S ok=O faulted=F"
 *   cat /sys/module/tv_hidden/parameters/targets     # where the two targets are
 *
 * tv_hidden_sum(x): with the key on, the code runs on past the jump-label site into
 * "y = (y << 3) + x" (one lea), then the join; the key's jmp (written when the key goes off)
 * lands on the join, right after the lea. tv_hidden_load(p): 1 if loading *p faulted (the fix-up, label 2,
 * follows the xor that the load falls through to), 0 otherwise.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/jump_label.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <asm/asm.h>
#include <asm/extable.h>

static DEFINE_STATIC_KEY_TRUE(tv_hidden_key);
static int tv_hidden_sink;

static noinline int tv_hidden_sum(int x)
{
	int y = x + 1;

	WRITE_ONCE(tv_hidden_sink, y);
	if (static_branch_likely(&tv_hidden_key))
		y = (y << 3) + x;
	return y ^ x;
}

/* 1 if *p faulted, else 0: the fix-up (2:) is the instruction after the xor, not a block start. */
static noinline int tv_hidden_load(const unsigned long *p)
{
	unsigned long val;
	int faulted = 1;

	asm volatile("1:	movq (%[p]), %[val]\n"
		     "	xorl %[f], %[f]\n"
		     "2:	addl $0, %[f]\n"
		     _ASM_EXTABLE(1b, 2b)
		     : [f] "+r" (faulted), [val] "=&r" (val)
		     : [p] "r" (p)
		     : "memory");
	return faulted;
}

static int tv_hidden_last_sum, tv_hidden_ok, tv_hidden_faulted;

static int tv_hidden_run_set(const char *val, const struct kernel_param *kp)
{
	/* Non-canonical: a #GP, which the exception table sends to the fix-up. */
	const unsigned long *bad = (const unsigned long *)0xdead000000000000UL;
	unsigned long good = 42;

	tv_hidden_last_sum = tv_hidden_sum(3);
	tv_hidden_ok += !tv_hidden_load(&good);
	tv_hidden_faulted += tv_hidden_load(bad);
	return 0;
}

static const struct kernel_param_ops tv_hidden_run_ops = {
	.set = tv_hidden_run_set,
};
module_param_cb(run, &tv_hidden_run_ops, NULL, 0200);

static int tv_hidden_key_set(const char *val, const struct kernel_param *kp)
{
	bool on;
	int ret = kstrtobool(val, &on);

	if (ret)
		return ret;
	if (on)
		static_branch_enable(&tv_hidden_key);
	else
		static_branch_disable(&tv_hidden_key);
	return 0;
}

static const struct kernel_param_ops tv_hidden_key_ops = {
	.set = tv_hidden_key_set,
};
module_param_cb(key, &tv_hidden_key_ops, NULL, 0200);

static int tv_hidden_result_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "key=%d sum=%d ok=%d faulted=%d\n",
			  static_key_enabled(&tv_hidden_key), tv_hidden_last_sum, tv_hidden_ok,
			  tv_hidden_faulted);
}

static const struct kernel_param_ops tv_hidden_result_ops = {
	.get = tv_hidden_result_get,
};
module_param_cb(result, &tv_hidden_result_ops, NULL, 0444);

/*
 * Where the hidden targets are, read from this module's own tables as trapvec.ko reads them:
 * "sum+0xN load+0xM", offsets of the jump-label target in tv_hidden_sum and of the fix-up in
 * tv_hidden_load (the scenario places its windows 1 to 4 bytes before each).
 */
static int tv_hidden_targets_get(char *buf, const struct kernel_param *kp)
{
	unsigned long sum = (unsigned long)tv_hidden_sum, load = (unsigned long)tv_hidden_load;
	unsigned long target = 0, fixup = 0;
	unsigned int i;

	for (i = 0; i < THIS_MODULE->num_jump_entries; i++) {
		struct jump_entry *je = &THIS_MODULE->jump_entries[i];

		if (jump_entry_key(je) == &tv_hidden_key.key)
			target = jump_entry_target(je);
	}
	for (i = 0; i < THIS_MODULE->num_exentries; i++) {
		const struct exception_table_entry *e = &THIS_MODULE->extable[i];

		fixup = (unsigned long)&e->fixup + e->fixup;
	}
	return sysfs_emit(buf, "tv_hidden_sum+%lu tv_hidden_load+%lu\n", target - sum, fixup - load);
}

static const struct kernel_param_ops tv_hidden_targets_ops = {
	.get = tv_hidden_targets_get,
};
module_param_cb(targets, &tv_hidden_targets_ops, NULL, 0444);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("trapvec test helper: a jump-label target and an exception fix-up inside straight-line module code");
