/*
 * watch.c - the step's observation behind three hooks, so that the step
 * (step.c) reads as the training it does: the meters (meter.c), the step
 * profile and the trace window (profile.c, tracefile.c) and the progress bar
 * (report.c). Nothing here changes what is trained, and nothing here calls a
 * collective.
 */
#include "common/common.h"
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
    tracefile_window(T, T->pos.update, 1);
    profile_update_begin(T);
}

void watch_micro_end(struct train *T, const struct train_batch *b)
{
    if (!T->boot[BOOT_FIRST_BATCH])
        T->boot[BOOT_FIRST_BATCH] = b->t_ready;
    meter_micro(&T->meter, &T->step_loss, b);
    profile_micro(T, b);
    report_progress(T);
}

void watch_update_end(struct train *T)
{
    meter_update(&T->meter, T->step_comm_ns);
    profile_update_end(T);
    tracefile_window(T, T->pos.update, 0);
}
