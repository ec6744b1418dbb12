/*
 * loop.c - the run and its loop: updates (train_step, step.c) until the last
 * epoch, the target accuracy, --steps or a stop signal; each epoch's end
 * (epoch.c) after its last update. Also the stop signals: SIGTERM and SIGUSR1
 * mean "finish the update, save, stop" for the whole run.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>

#include "common/common.h"
#include "common/trace.h"
#include "loader/loadbench.h"
#include "tools/train/driver.h"

volatile sig_atomic_t loop_stop_signal;

/* Why the run stops after the update just made, or STOP_NONE: the target accuracy (`hit`, at an epoch's end),
 * --steps, a stop signal on some rank (the update's control word), the last epoch's end, in that order. */
static enum train_stop stop_after_update(const struct train *T, int hit)
{
    if (hit)
        return STOP_TARGET;
    if (T->cfg.max_updates && T->pos.update >= T->cfg.max_updates)
        return STOP_STEPS;
    if (T->ctl & CTL_STOP)
        return STOP_SIGNAL;
    return T->pos.epoch >= T->cfg.epochs ? STOP_EPOCHS : STOP_NONE;
}

/* Before the first update: a stop signal that reached any rank during start-up (staging, resume), agreed over
 * the ranks (a collective) and kept in T->ctl for the report; else a resumed run that has no epoch left. */
static enum train_stop stop_before_start(struct train *T)
{
    const uint32_t bits = step_control_word(T);
    /* Each bit on its own (MAX of 0/1 is their OR): a signal's kind is named in the report. */
    int32_t v[3] = {!!(bits & CTL_STOP), !!(bits & CTL_SIGTERM), !!(bits & CTL_SIGUSR1)};
    rt_comm_allreduce(T->comm, v, 3, RT_COMM_I32, RT_RED_MAX, "the stop check before the first step");
    T->ctl = (v[0] ? CTL_STOP : 0u) | (v[1] ? CTL_SIGTERM : 0u) | (v[2] ? CTL_SIGUSR1 : 0u);
    if (v[0])
        return STOP_SIGNAL;
    return T->pos.epoch >= T->cfg.epochs ? STOP_EPOCHS : STOP_NONE;
}

int train_loop(struct train *T)
{
    int r;
    /* A signal during start-up (a long staging, say): stop where the run starts, as after an update. */
    if ((T->stop = stop_before_start(T)) == STOP_SIGNAL)
        return checkpoint_save(T);
    watch_run_begin(T);
    while (T->stop == STOP_NONE) {
        if ((r = train_step(T)) < 0)
            return r;
        startup_mark(T, BOOT_FIRST_STEP);
        if (replicas_due(T) && (r = train_replicas_check(T, NULL)) < 0)
            return r;
        int hit = 0;
        if (epoch_done(T) && (hit = epoch_next(T)) < 0)
            return hit;
        T->stop = stop_after_update(T, hit);
    }
    /* A stop inside an epoch: its figures so far, and where to resume from. */
    if (T->pos.batch > 0 && (r = epoch_close(T, 1)) < 0)
        return r;
    /* An epoch's end saved its checkpoint already (checkpoint_save writes a position once). */
    if (T->stop == STOP_STEPS || T->stop == STOP_SIGNAL)
        return checkpoint_save(T);
    return 0;
}

int train_finish(struct train *T)
{
    uint64_t digest;
    int rc = train_replicas_check(T, &digest);
    if (rc < 0)
        return rc;
    /* Each rank's line up to 8 ranks; above, rank 0's alone: the replica check just found them all equal. */
    if (T->world <= 8)
        rt_info("param digest: %016" PRIx64, digest);
    else if (T->root)
        rt_info("param digest: %016" PRIx64 " (the same on all %d ranks)", digest, T->world);
    if (T->in.digest) {
        rt_batch_digest_hex(T->in.digest, T->res.batch_digest);
        rt_info("batch digest: %s (the batches this rank's steps took, as loadbench --digest)", T->res.batch_digest);
    }
    report_stopped(T);
    /* The run's exposed-communication share, averaged over the ranks. */
    double ct[2] = {(double)T->meter.run.comm_ns, (double)T->meter.run.train_ns};
    rt_comm_allreduce(T->comm, ct, 2, RT_COMM_F64, RT_RED_SUM, "the run's communication share");
    const uint64_t t_end = rt_now_ns(); /* the ranks leave this collective together: the trace's clocks */
    T->res.run_comm_frac = ct[1] > 0 ? ct[0] / ct[1] : 0;
    /* The most any rank waited (a rank with no steady step says -1, below any real figure). */
    double waits = T->waits_steps ? (double)T->waits_sum / (double)T->waits_steps : -1;
    rt_comm_allreduce(T->comm, &waits, 1, RT_COMM_F64, RT_RED_MAX, "host waits per step");
    T->res.host_waits_per_step = waits >= 0 ? waits : NAN;
    profile_gather(T);
    startup_gather(T);
    report_profile(T);
    report_op_profile(T);
    report_startup(T);
    if ((rc = tracefile_finish(T, t_end)) < 0)
        return rc;
    report_summary(T, (double)(rt_now_ns() - T->t_created) * 1e-9);
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_DONE);
    return T->stop == STOP_EPOCHS || T->stop == STOP_TARGET ? checkpoint_mark_finished(T, 1) : 0;
}

static void on_stop_signal(int sig)
{
    loop_stop_signal = sig;
}

/* SIGTERM and SIGUSR1 mean "finish the update, save, stop" for the whole run: from before start-up
 * (staging may take minutes; the loop checks before its first step) to the end (a signal after the
 * last step changes nothing), so that preemption never kills the process outright. A signal belongs
 * to the run it reached: the next train_run in the same process starts without it. */
int train_run(const struct train_cfg *cfg)
{
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    struct sigaction old_term, old_usr1;
    sigemptyset(&sa.sa_mask);
    loop_stop_signal = 0;
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
    struct train *T;
    int rc = train_create(cfg, &T);
    if (rc == 0) {
        report_banner(T);
        rc = checkpoint_mark_finished(T, 0);
        startup_mark(T, BOOT_BANNER);
    }
    if (rc == 0)
        rc = train_loop(T);
    if (rc == 0)
        rc = train_finish(T);
    if (rc < 0)
        train_fail(T);
    else if ((rc = report_page(T)) < 0)
        fprintf(stderr, "error: %s\n", rt_errmsg()); /* rank 0's alone, after the last collective: no peer waits */
    train_destroy(T);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    return rc < 0 ? rc : 0;
}
