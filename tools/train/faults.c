/*
 * faults.c - the failure tests' injection points. struct train_faults
 * (train.h) is filled once at start-up; the driver consults it at the named
 * points below and nowhere else, so the step itself holds no test branches.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "staging/local_copy.h"
#include "tools/train/driver.h"

void train_faults_none(struct train_faults *f)
{
    *f = (struct train_faults){.stall_rank = -1, .stall_update = UINT64_MAX, .overflow_update = UINT64_MAX};
}

/* "A:B" into two numbers; 0, or -EINVAL naming the variable. */
static int parse_pair(const char *var, const char *s, int64_t *a, uint64_t *b)
{
    char tail;
    if (sscanf(s, "%" SCNd64 ":%" SCNu64 "%c", a, b, &tail) != 2)
        return rt_errf(-EINVAL, "%s=%s: expected two numbers, A:B", var, s);
    return 0;
}

int train_faults_from_env(struct train_faults *f)
{
    const char *s;
    int64_t a;
    uint64_t b;
    train_faults_none(f);
    if ((s = getenv("RINGTRAIN_TEST_STALL")) && *s) {
        if (parse_pair("RINGTRAIN_TEST_STALL", s, &a, &b) < 0)
            return -EINVAL;
        f->stall_rank = (int)a;
        f->stall_update = b;
    }
    if ((s = getenv("RINGTRAIN_TEST_OVERFLOW")) && *s) {
        if (parse_pair("RINGTRAIN_TEST_OVERFLOW", s, &a, &b) < 0 || a < 0)
            return rt_errf(-EINVAL, "RINGTRAIN_TEST_OVERFLOW=%s: expected UPDATE:COUNT", s);
        f->overflow_update = (uint64_t)a;
        f->overflow_count = b;
    }
    if ((s = getenv("RT_STAGE_TEST_DELAY_MS")) && *s) {
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (*end || *s == '-')
            return rt_errf(-EINVAL, "RT_STAGE_TEST_DELAY_MS=%s: expected milliseconds", s);
        f->copy_delay_ms = (uint32_t)RT_MIN(v, 60000);
    }
    return 0;
}

/* Named point: a rank that hangs in compute before update stall_update (a stalled peer). */
void fault_before_compute(const struct train *T)
{
    if (T->pos.update == T->faults.stall_update && T->rank == T->faults.stall_rank)
        for (;;)
            pause();
}

/* Named point: an overflow in the first gradient of the buffer, before loss scaling unscales. */
void fault_before_unscale(struct train *T)
{
    const struct train_faults *f = &T->faults;
    if (T->pos.update >= f->overflow_update && T->pos.update - f->overflow_update < f->overflow_count) {
        const float inf = INFINITY;
        rt_model_write(T->model, RT_MODEL_GRADS, 0, &inf, 1);
    }
}

/* Named point: after each block a node-local copy writes. */
void train_fault_copy_progress(void *ctx, const struct rt_local_copy_progress *p)
{
    const struct train_faults *f = ctx;
    struct timespec ts = {f->copy_delay_ms / 1000, (long)(f->copy_delay_ms % 1000) * 1000000L};
    (void)p;
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}
