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
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "staging/local_copy.h"
#include "tools/train/driver.h"

void train_faults_none(struct train_faults *f)
{
    *f = (struct train_faults){.stall_rank = -1, .stall_update = UINT64_MAX, .overflow_update = UINT64_MAX,
                               .slow_rank = -1, .data_end_micro = UINT64_MAX};
}

/* "A:B" into two numbers; 0, or -EINVAL naming the variable. */
static int parse_pair(const char *var, const char *s, int64_t *a, uint64_t *b)
{
    char tail;
    if (sscanf(s, "%" SCNd64 ":%" SCNu64 "%c", a, b, &tail) != 2)
        return rt_errf(-EINVAL, "%s=%s: expected two numbers, A:B", var, s);
    return 0;
}

/* A variable in milliseconds (at most a minute) into *out, unchanged when unset; 0 or -EINVAL naming it. */
static int parse_ms(const char *var, uint32_t *out)
{
    const char *s = getenv(var);
    if (!s || !*s)
        return 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || *s == '-')
        return rt_errf(-EINVAL, "%s=%s: expected milliseconds", var, s);
    *out = (uint32_t)RT_MIN(v, 60000);
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
    if (parse_ms("RINGTRAIN_TEST_SLOW_COPY", &f->copy_delay_ms) < 0 ||
        parse_ms("RINGTRAIN_TEST_SLOW_ALLREDUCE", &f->allreduce_delay_ms) < 0 ||
        parse_ms("RINGTRAIN_TEST_SLOW_LOADER", &f->loader_delay_ms) < 0)
        return -EINVAL;
    if ((s = getenv("RINGTRAIN_TEST_SLOW_RANK")) && *s) {
        if (parse_pair("RINGTRAIN_TEST_SLOW_RANK", s, &a, &b) < 0 || a < 0 || b > 60000)
            return rt_errf(-EINVAL, "RINGTRAIN_TEST_SLOW_RANK=%s: expected RANK:MS", s);
        f->slow_rank = (int)a;
        f->slow_ms = (uint32_t)b;
    }
    if ((s = getenv("RINGTRAIN_TEST_HOST_WAIT")) && *s) {
        if (strcmp(s, "1") != 0)
            return rt_errf(-EINVAL, "RINGTRAIN_TEST_HOST_WAIT=%s: expected 1", s);
        f->host_wait = 1;
    }
    if ((s = getenv("RINGTRAIN_TEST_SAMPLE_LOG")) && *s)
        f->sample_log = s;
    if ((s = getenv("RINGTRAIN_TEST_FULL_MESH")) && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end || v < 1 || v > 1 << 20)
            return rt_errf(-EINVAL, "RINGTRAIN_TEST_FULL_MESH=%s: expected a number of ranks", s);
        f->full_mesh = (int)v;
    }
    return 0;
}

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Named point: a loader worker, after it filled a batch (slow storage); ctx: the struct train_faults. */
void train_faults_loader_batch(void *ctx, const struct rt_batch *b)
{
    const struct train_faults *f = ctx;
    (void)b;
    sleep_ms(f->loader_delay_ms);
}

/* Named point: on the comm thread, before each bucket's all-reduce starts (a slow link). */
void faults_before_allreduce(const struct train *T)
{
    if (T->faults.allreduce_delay_ms)
        sleep_ms(T->faults.allreduce_delay_ms);
}

/* Named point: a rank that hangs in compute before update stall_update (a stalled peer); a host wait before
 * every micro-batch. */
void faults_before_compute(struct train *T)
{
    if (T->faults.host_wait)
        rt_backend_ops(T->be)->sync(rt_backend_stream(T->be));
    if (T->pos.update == T->faults.stall_update && T->rank == T->faults.stall_rank)
        for (;;)
            pause();
}

/* Named point: micro-batch i of the update in hand, before its step: its sample ids to the sample log. */
void faults_sample_log(const struct train *T, const struct train_batch *b, uint32_t i)
{
    if (!T->faults.sample_log || !b->slot)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s.%d", T->faults.sample_log, T->rank);
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    fprintf(f, "update %" PRIu64 " micro %" PRIu64 ":", T->pos.update,
            (uint64_t)i * (uint64_t)T->world + (uint64_t)T->rank);
    for (uint32_t k = 0; k < b->valid; k++)
        fprintf(f, "%s%" PRIu64, k ? "," : " ", b->slot->ids[k]);
    fputc('\n', f);
    fclose(f);
}

/* The straggler: the first gradients' hook of each update sleeps, inside backward (the profile counts it as
 * compute), then hands on to the bucketer's. One process runs one step at a time: one hook will do. */
static struct slow_hook {
    void (*ready)(void *arg, size_t ready);
    void *arg;
    uint32_t ms;
    int slept;
} slow_hook;

static void slow_ready(void *ctx, size_t ready)
{
    struct slow_hook *h = ctx;
    if (!h->slept) {
        h->slept = 1;
        sleep_ms(h->ms);
    }
    h->ready(h->arg, ready);
}

/* Named point: the options of an update's last micro-batch (the one that reduces), before rt_model_step. */
void faults_step_opts(const struct train *T, struct rt_step_opts *so)
{
    if (T->rank != T->faults.slow_rank || !T->faults.slow_ms || !so->grads_ready)
        return;
    slow_hook = (struct slow_hook){so->grads_ready, so->grads_ready_arg, T->faults.slow_ms, 0};
    so->grads_ready = slow_ready;
    so->grads_ready_arg = &slow_hook;
}

/* Named point: an overflow in the first gradient of the buffer, before loss scaling unscales. */
void faults_before_unscale(struct train *T)
{
    const struct train_faults *f = &T->faults;
    if (T->pos.update >= f->overflow_update && T->pos.update - f->overflow_update < f->overflow_count) {
        const float inf = INFINITY;
        rt_model_write(T->model, RT_MODEL_GRADS, 0, &inf, 1);
    }
}

/* Named point: before the input takes the next batch; 1 when the data is to end here instead. */
int faults_data_ended(const struct train *T)
{
    return T->pos.micro == T->faults.data_end_micro;
}

/* Named point: after each block a node-local copy writes. */
void train_faults_copy_progress(void *ctx, const struct rt_local_copy_progress *p)
{
    const struct train_faults *f = ctx;
    (void)p;
    sleep_ms(f->copy_delay_ms);
}
