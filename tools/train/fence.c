/*
 * fence.c - the gradient buckets' events: the comm thread's all-reduce of a
 * bucket follows the backward ops that wrote it.
 *
 * On the ordinary CPU backend an op has finished when it returns, so the
 * bucket is final when backward reports it and these events always pass.
 * On the CPU backend's asynchronous streams backward's ops are still queued
 * when the bucketer hands the bucket to the comm thread: the event recorded
 * then on the compute stream is what the comm thread waits for before MPI
 * reads the buffer. (In NCCL mode the bucketer orders its own stream with
 * CUDA events; these are not used.)
 */
#include <stdlib.h>

#include <errno.h>

#include "common/common.h"
#include "tools/train/driver.h"

int fence_create(struct train *T, int n)
{
    T->bucket_done = rt_calloc((size_t)n, sizeof(*T->bucket_done), "bucket events");
    if (!T->bucket_done)
        return -ENOMEM;
    T->nbucket_done = n;
    for (int i = 0; i < n; i++) {
        const int rc = rt_event_create(T->be, &T->bucket_done[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void fence_destroy(struct train *T)
{
    for (int i = 0; i < T->nbucket_done; i++)
        rt_event_destroy(T->bucket_done[i]);
    free(T->bucket_done);
    T->bucket_done = NULL;
    T->nbucket_done = 0;
}

/* The training thread, as bucket k goes to the comm thread: after everything backward has queued. */
void fence_mark(void *ctx, int k)
{
    struct train *T = ctx;
    rt_event_record(T->bucket_done[k], rt_backend_stream(T->be));
}

/* The training thread, at an update's end: the compute stream waits for its all-reduces (late mode). */
void fence_stream_call(void *ctx, void (*fn)(void *arg), void *arg)
{
    struct train *T = ctx;
    rt_stream_call(rt_backend_stream(T->be), fn, arg);
}

/* The comm thread, before bucket k's all-reduce. */
void fence_wait(void *ctx, int k)
{
    struct train *T = ctx;
    rt_event_synchronize(T->bucket_done[k]);
    faults_before_allreduce(T);
}
