/*
 * watch.c - the step's observation behind three hooks, so that the step
 * (step.c) reads as the training it does: the meters (meter.c), the step
 * profile and the trace window (profile.c, tracefile.c) and the progress bar
 * (report.c). Nothing here changes what is trained, and nothing here calls a
 * collective.
 */
#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

void watch_run_begin(struct train *T)
{
    T->meter.epoch_t0 = rt_now_ns();
}

void watch_epoch_begin(struct train *T)
{
    meter_epoch_reset(&T->meter);
    profile_epoch_reset(T);
}

void watch_update_begin(struct train *T)
{
    T->waits_at_begin = rt_backend_host_waits(T->be);
    tracefile_window(T, T->pos.update, 1);
    profile_update_begin(T);
}

void watch_micro_end(struct train *T, const struct train_batch *b)
{
    if (!T->boot[BOOT_FIRST_BATCH])
        T->boot[BOOT_FIRST_BATCH] = b->t_ready;
    meter_micro(&T->meter, b);
    profile_micro(T, b);
    report_progress(T);
}

void watch_update_end(struct train *T)
{
    meter_update(&T->meter, T->step_comm_ns);
    profile_update_end(T);
    /* The update's own waits: a log line, the epoch's end or a checkpoint come after this point. */
    if (steady_update(T, T->pos.update - 1)) {
        T->waits_sum += rt_backend_host_waits(T->be) - T->waits_at_begin;
        T->waits_steps++;
    }
    /* The trace window's last step: its spans go in before the recording stops (the one host wait of a
     * traced run's steps, at the window's end). */
    if (rt_trace_live() && !T->cfg.trace_all && T->pos.update >= T->cfg.trace_last)
        profile_flush(T);
    tracefile_window(T, T->pos.update, 0);
}
