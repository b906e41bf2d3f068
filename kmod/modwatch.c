// SPDX-License-Identifier: GPL-2.0
/*
 * The module watch: points in modules loaded later (see trapvec_abi.h, "Module watch").
 *
 * A watcher (trapd) holds the points that wait for a module. The module notifier below tells
 * it when a module is COMING (load_module(), after the module's symbols are in kallsyms and
 * ftrace has converted its fentry sites, before its init runs) and when it is GOING (after its
 * exit has run, before its memory is freed), and waits for its answer, so that the watcher can
 * splice the new module before any of its code runs and take its splices out before its text
 * goes. The wait is bounded (watch_timeout_ms): a stuck watcher delays a module load by that
 * much, never forever, and a watcher that closes its file releases every waiter at once.
 *
 * The kernel does not depend on the watcher for its safety: after the wait, answered or not,
 * the notifier reverts every patch of ours still live in a GOING module's text (or in a COMING
 * one it refuses) and removes the dispatch entries there, with the grace periods QUIESCE uses,
 * before the module loader may free that text. Patches made for a COMING module (APPLY with
 * TRAPVEC_APPLY_DEFERRED) take no reference on the module for that reason: the module stays
 * removable, and its going takes them out.
 *
 * Context: the notifier runs in the task that loads or removes the module (process context,
 * may sleep), inside the module notifier chain (its rwsem held for reading) and with no module
 * lock held (load_module() calls the chain from prepare_coming_module(), delete_module() after
 * mod->exit()). It waits without trapvec_mutex, which the watcher's ioctls take.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/jiffies.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/notifier.h>
#include <linux/sched/signal.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/wait.h>

#include "trapvec_internal.h"

/* Longest wait for the watcher (ms); values above 60 s are taken as 60 s. */
static unsigned int trapvec_watch_timeout_ms = 5000;
module_param_named(watch_timeout_ms, trapvec_watch_timeout_ms, uint, 0644);
MODULE_PARM_DESC(watch_timeout_ms,
		 "how long a module load or removal waits for the watcher (trapd) to answer (ms, default 5000, at most 60000)");

#define TRAPVEC_WATCH_TIMEOUT_MAX_MS	60000U

/* One module event, on the stack of the notifier that waits for its answer. */
struct trapvec_modwatch_event {
	struct list_head node;	/* in trapvec_modwatch_queue while the notifier waits */
	u64 seq;
	u32 state;		/* TRAPVEC_MODEVENT_* */
	struct module *mod;	/* valid while the notifier waits */
	bool delivered;		/* handed to the watcher by MODEVENT */
	bool done;		/* answered (MODACK) or released (the watcher went) */
	int error;		/* the answer: 0 or a negative errno (COMING only) */
};

/*
 * trapvec_modwatch_lock guards the watcher, the queue, the sequence numbers and every
 * queued event's delivered, done and error. A spinlock: MODEVENT's wait condition and the
 * site checks (check.c, under preempt_disable()) take it.
 */
static DEFINE_SPINLOCK(trapvec_modwatch_lock);
static struct file *trapvec_watcher;
static LIST_HEAD(trapvec_modwatch_queue);
static u64 trapvec_modwatch_seq;
/* The watcher sleeps here for events, the notifiers for their answers. */
static DECLARE_WAIT_QUEUE_HEAD(trapvec_modwatch_events);
static DECLARE_WAIT_QUEUE_HEAD(trapvec_modwatch_answers);

/*
 * Is mod COMING with its event delivered to the watcher and not answered yet? Then the
 * watcher is arming it, and deferred patches may go into its text (check.c).
 */
bool trapvec_modwatch_arming(const struct module *mod)
{
	struct trapvec_modwatch_event *ev;
	bool arming = false;

	spin_lock(&trapvec_modwatch_lock);
	list_for_each_entry(ev, &trapvec_modwatch_queue, node) {
		if (ev->mod == mod && ev->state == TRAPVEC_MODEVENT_COMING && ev->delivered &&
		    !ev->done) {
			arming = true;
			break;
		}
	}
	spin_unlock(&trapvec_modwatch_lock);
	return arming;
}

/*
 * Take out whatever of ours is left in mod's core text: live patches first (the original
 * bytes back, int3 first), then the dispatch entries, then the grace periods QUIESCE waits
 * for (no CPU in the dispatcher for a removed entry, no task in a trampoline that jumps back
 * into this text) before the loader frees it. What the watcher removed itself costs nothing.
 */
static void trapvec_modwatch_clean(struct module *mod, const char *why)
{
	unsigned long start = trapvec_module_text_base(mod);
	unsigned long end = start + trapvec_module_text_size(mod);
	struct trapvec_list_entry *all = NULL;
	u32 reverted, count = 0, n = 0, i, failed;
	size_t bytes = 0;
	u64 *sites;

	mutex_lock(&trapvec_mutex);
	reverted = trapvec_text_revert_within(start, end);
	if (trapvec_dispatch_count()) {
		count = trapvec_dispatch_count();
		bytes = (size_t)count * sizeof(*all);
		all = trapvec_kvmalloc(TRAPVEC_MEM_SCRATCH, count, sizeof(*all), GFP_KERNEL);
		if (!all || trapvec_dispatch_list(all, 0, count, 0, &count)) {
			/* The entries stay: they send nothing anywhere once their traps are gone. */
			pr_err("module %s is %s: no memory to look for its dispatch entries\n",
			       mod->name, why);
			goto out;
		}
		/* Compacted in place: sites fit in the entries they come from. */
		sites = (u64 *)all;
		for (i = 0; i < count; i++)
			if (all[i].site >= start && all[i].site < end)
				sites[n++] = all[i].site;
		if (n && trapvec_dispatch_remove(sites, n, &failed))
			WARN_ON_ONCE(1);	/* every trap there was just reverted */
	}
	if (reverted || n) {
		synchronize_rcu();
		trapvec_sync_tasks();
		pr_warn("module %s is %s: removed %u live patches and %u dispatch entries left in its text\n",
			mod->name, why, reverted, n);
	}
out:
	if (all)
		trapvec_kvfree(TRAPVEC_MEM_SCRATCH, all, bytes);
	mutex_unlock(&trapvec_mutex);
}

static int trapvec_module_notify(struct notifier_block *nb, unsigned long action, void *data)
{
	struct trapvec_modwatch_event ev = { .mod = data };
	unsigned int timeout_ms;
	bool queued = false;

	if (action == MODULE_STATE_COMING)
		ev.state = TRAPVEC_MODEVENT_COMING;
	else if (action == MODULE_STATE_GOING)
		ev.state = TRAPVEC_MODEVENT_GOING;
	else
		return NOTIFY_DONE;

	spin_lock(&trapvec_modwatch_lock);
	if (trapvec_watcher) {
		ev.seq = ++trapvec_modwatch_seq;
		list_add_tail(&ev.node, &trapvec_modwatch_queue);
		queued = true;
	}
	spin_unlock(&trapvec_modwatch_lock);

	if (queued) {
		wake_up_interruptible(&trapvec_modwatch_events);
		timeout_ms = min(READ_ONCE(trapvec_watch_timeout_ms), TRAPVEC_WATCH_TIMEOUT_MAX_MS);
		wait_event_timeout(trapvec_modwatch_answers, READ_ONCE(ev.done),
				   msecs_to_jiffies(timeout_ms));
		spin_lock(&trapvec_modwatch_lock);
		list_del(&ev.node);
		spin_unlock(&trapvec_modwatch_lock);
		/* Off the queue: nobody else reads or writes ev now. */
		if (!ev.done)
			pr_warn("the watcher did not answer within %u ms that module %s is %s: going on without it\n",
				timeout_ms, ev.mod->name,
				ev.state == TRAPVEC_MODEVENT_COMING ? "coming" : "going");
	}

	if (ev.state == TRAPVEC_MODEVENT_GOING) {
		trapvec_modwatch_clean(ev.mod, "going");
		return NOTIFY_OK;
	}
	if (ev.error) {
		/* The chain does not call us with GOING for a load we refuse: clean up now. */
		trapvec_modwatch_clean(ev.mod, "refused");
		pr_warn("module %s refused: a point required in it could not be made (error %d)\n",
			ev.mod->name, ev.error);
		return notifier_from_errno(ev.error);
	}
	return NOTIFY_OK;
}

/*
 * After the notifiers of the kernel's own subsystems (jump labels, static calls, kprobes,
 * ftrace run at priorities above 0): at COMING the module's jump entries and static call
 * sites are known when the watcher plans, at GOING ours go last.
 */
static struct notifier_block trapvec_module_nb = {
	.notifier_call = trapvec_module_notify,
	.priority = INT_MIN,
};

int trapvec_modwatch_watch(struct file *file, const struct trapvec_watch *req)
{
	int ret = 0;

	if (req->flags || req->pad)
		return -EINVAL;
	spin_lock(&trapvec_modwatch_lock);
	if (trapvec_watcher && trapvec_watcher != file)
		ret = -EBUSY;
	else
		trapvec_watcher = file;
	spin_unlock(&trapvec_modwatch_lock);
	if (!ret)
		pr_info("module watch: %s (pid %d) watches module loads\n", current->comm,
			task_pid_nr(current));
	return ret;
}

/* The first event not yet delivered, marked delivered and copied to *out; false if none. */
static bool trapvec_modwatch_next(struct file *file, struct trapvec_modevent *out, int *err)
{
	struct trapvec_modwatch_event *ev;
	bool found = false;

	spin_lock(&trapvec_modwatch_lock);
	if (trapvec_watcher != file) {
		*err = -EPERM;
		found = true;
		goto out;
	}
	list_for_each_entry(ev, &trapvec_modwatch_queue, node) {
		if (ev->delivered || ev->done)
			continue;
		ev->delivered = true;
		out->seq = ev->seq;
		out->state = ev->state;
		out->text_base = trapvec_module_text_base(ev->mod);
		out->text_size = trapvec_module_text_size(ev->mod);
		strscpy(out->name, ev->mod->name, sizeof(out->name));
		*err = 0;
		found = true;
		break;
	}
out:
	spin_unlock(&trapvec_modwatch_lock);
	return found;
}

/* MODEVENT: req goes back to the watcher when this returns 0 (ioctl.c). */
int trapvec_modwatch_event(struct file *file, struct trapvec_modevent *req)
{
	int err = -EAGAIN;
	long left;

	memset(req->name, 0, sizeof(req->name));
	left = wait_event_interruptible_timeout(trapvec_modwatch_events,
						trapvec_modwatch_next(file, req, &err),
						msecs_to_jiffies(min(req->timeout_ms,
								     TRAPVEC_WATCH_TIMEOUT_MAX_MS)));
	if (left < 0)
		return left;	/* -ERESTARTSYS: a signal */
	return err;
}

int trapvec_modwatch_ack(struct file *file, const struct trapvec_modack *req)
{
	struct trapvec_modwatch_event *ev;
	int ret = -ENOENT;

	if (req->error > 0 || req->error < -MAX_ERRNO || req->pad)
		return -EINVAL;
	spin_lock(&trapvec_modwatch_lock);
	if (trapvec_watcher != file) {
		ret = -EPERM;
		goto out;
	}
	list_for_each_entry(ev, &trapvec_modwatch_queue, node) {
		if (ev->seq != req->seq || !ev->delivered || ev->done)
			continue;
		if (req->error && ev->state != TRAPVEC_MODEVENT_COMING) {
			ret = -EINVAL;	/* a module's removal cannot be refused */
			break;
		}
		ev->error = req->error;
		WRITE_ONCE(ev->done, true);
		ret = 0;
		break;
	}
out:
	spin_unlock(&trapvec_modwatch_lock);
	if (!ret)
		wake_up(&trapvec_modwatch_answers);
	return ret;
}

/* The file is closed: if it was the watcher, every waiter goes on without an answer. */
void trapvec_modwatch_release(struct file *file)
{
	struct trapvec_modwatch_event *ev;
	bool was = false;

	spin_lock(&trapvec_modwatch_lock);
	if (trapvec_watcher == file) {
		trapvec_watcher = NULL;
		was = true;
		list_for_each_entry(ev, &trapvec_modwatch_queue, node)
			WRITE_ONCE(ev->done, true);
	}
	spin_unlock(&trapvec_modwatch_lock);
	if (was) {
		wake_up_all(&trapvec_modwatch_answers);
		pr_info("module watch: the watcher is gone\n");
	}
}

int trapvec_modwatch_init(void)
{
	return register_module_notifier(&trapvec_module_nb);
}

/* Unload: no watcher is left (an open file holds the module); waits for running notifiers. */
void trapvec_modwatch_exit(void)
{
	unregister_module_notifier(&trapvec_module_nb);
}
