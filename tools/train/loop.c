/*
 * loop.c - the run and its loop. train_loop below is the training step as a
 * reader looks for it: one line per phase, each a call into input.c, step.c,
 * epoch.c, replicas.c or report.c.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

int train_loop(struct train *T)
{
    struct train_batch b;
    int r;
    /* A signal during start-up (a long staging, say): stop where the run starts, as after a step. */
    if ((T->stop = step_stop_before_start(T)) != STOP_DONE)
        return ckpt_save(T) < 0 ? -1 : 0;
    T->meter.epoch_t0 = rt_now_ns();
    while (T->pos.epoch < T->cfg.epochs) {
        meter_begin(&T->meter);
        profile_step_begin(T);
        if ((r = train_next_batch(T, &b)) <= 0)
            return r;
        meter_data_ready(&T->meter);
        profile_data_ready(T, T->meter.t_start, T->meter.t_data);
        const int update = train_at_update(T);
        r = train_forward_backward(T, &b);
        train_release_batch(T, &b);
        if (r < 0 || (update && (train_reduce(T) < 0 || train_update(T) < 0)))
            return -1;
        train_advance(T, &b);
        report_progress(T);
        if (update)
            profile_step_end(T);
        if (update && replicas_due(T) && train_check_replicas(T, NULL) < 0)
            return -1;
        if (train_epoch_done(T) && (r = epoch_next(T)) != 0)
            return r < 0 ? -1 : 0; /* the target accuracy reached, or an error */
        if (update && (T->stop = step_stop_requested(T)) != STOP_DONE)
            break;
    }
    /* A stop inside an epoch: its figures so far, and where to resume from. */
    if (T->pos.batch > 0 && epoch_close(T, 1) < 0)
        return -1;
    if ((T->stop == STOP_STEPS || T->stop == STOP_SIGNAL) && ckpt_save(T) < 0)
        return -1;
    return 0;
}

static void on_stop_signal(int sig)
{
    train_stop_signal = sig;
}


int train_finish(struct train *T)
{
    uint64_t digest;
    if (train_check_replicas(T, &digest) < 0)
        return -1;
    rt_info("param digest: %016" PRIx64, digest);
    report_stopped(T);
    /* The run's exposed-communication share, averaged over the ranks. */
    double ct[2] = {(double)T->meter.run.comm_ns, (double)T->meter.run.train_ns};
    rt_comm_allreduce(T->comm, ct, 2, RT_COMM_F64, RT_RED_SUM, "the run's communication share");
    const uint64_t t_end = rt_now_ns(); /* the ranks leave this collective together: the trace's clocks */
    T->res.run_comm_frac = ct[1] > 0 ? ct[0] / ct[1] : 0;
    profile_report(T);
    if (trace_finish(T, t_end) < 0)
        return -1;
    report_summary(T, (double)(rt_now_ns() - T->t_created) * 1e-9);
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_DONE);
    return T->stop == STOP_DONE || T->stop == STOP_TARGET ? ckpt_mark_finished(T, 1) : 0;
}

/* SIGTERM and SIGUSR1 mean "finish the update, save, stop" for the whole run: from before start-up
 * (staging may take minutes; the loop checks before its first step) to the end (a signal after the
 * last step changes nothing), so that preemption never kills the process outright. */
int train_run(const struct train_cfg *cfg)
{
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    struct sigaction old_term, old_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
    struct train *T;
    int rc = train_create(cfg, &T);
    if (rc == 0) {
        report_banner(T);
        rc = ckpt_mark_finished(T, 0);
    }
    if (rc == 0)
        rc = train_loop(T);
    if (rc == 0)
        rc = train_finish(T);
    if (rc < 0)
        train_fail(T);
    train_destroy(T);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    return rc < 0 ? -1 : 0;
}
