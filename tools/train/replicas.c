/*
 * replicas.c - one model on every rank: rank 0's parameters and batchnorm
 * statistics copied to the others (at the start, and the statistics at each
 * epoch's end, as DDP's broadcast_buffers) where the ranks' copies differ, and
 * the check that every rank's parameters are bit-identical (the "param
 * digest").
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <xxhash.h>

#include "common/common.h"
#include "tools/train/driver.h"

static size_t buf_count(const struct rt_model *m, enum rt_model_buf which)
{
    return which == RT_MODEL_BUFFERS ? rt_model_buffer_count(m) : rt_model_param_count(m);
}

/* The host copy every call below reads the model into, made once with the model: a collective that could fail
 * to allocate would leave its rank out of the others' broadcast or allgather. */
int replicas_create(struct train *T)
{
    /* The parameters, the buffers, or the ranks' digests (train_replicas_check), whichever is the largest. */
    const size_t n = RT_MAX(RT_MAX(rt_model_param_count(T->model), rt_model_buffer_count(T->model)),
                            2 * (size_t)T->world);
    T->host = rt_malloc(n * sizeof(float), "the host copy of the parameters");
    return T->host ? 0 : -ENOMEM;
}

void replicas_destroy(struct train *T)
{
    free(T->host);
    T->host = NULL;
}

/* Whether every rank's digest equals `mine`: one small all-reduce (O(log n)) of the largest digest and the
 * largest complement, i.e. the smallest. Collective. */
static int digests_agree(struct train *T, uint64_t mine, const char *what)
{
    uint64_t span[2] = {mine, ~mine};
    rt_comm_allreduce(T->comm, span, 2, RT_COMM_U64, RT_RED_MAX, what);
    return span[0] == ~span[1];
}

void replicas_sync_from_root(struct train *T, enum rt_model_buf which, const char *what)
{
    const size_t count = buf_count(T->model, which);
    if (T->world == 1 || count == 0)
        return;
    rt_model_read(T->model, which, 0, count, T->host);
    /* Every rank made the same model from the same seed (or read the same checkpoint): when the digests
     * agree, as one small all-reduce (O(log n)) shows, there is nothing to send. Only where they differ
     * (the batchnorm statistics at an epoch's end, which each rank gathered on its own data) does rank
     * 0's copy travel: a broadcast of the whole buffer, which at a hundred ranks took seconds of start-up. */
    if (digests_agree(T, XXH64(T->host, count * sizeof(float), 0), what))
        return;
    rt_comm_broadcast(T->comm, T->host, count * sizeof(float), 0, what);
    rt_model_write(T->model, which, 0, T->host, count);
}

uint64_t train_replicas_digest(struct train *T)
{
    const size_t n = rt_model_param_count(T->model);
    rt_model_read(T->model, RT_MODEL_PARAMS, 0, n, T->host);
    return XXH64(T->host, n * sizeof(float), 0);
}

int train_replicas_check(struct train *T, uint64_t *digest)
{
    const uint64_t mine = train_replicas_digest(T);
    if (digest)
        *digest = mine;
    if (T->world == 1)
        return 0;
    /* Only when they differ does every rank's digest travel, to name the ranks that differ. */
    if (digests_agree(T, mine, "the replica check"))
        return 0;
    uint64_t *all = (uint64_t *)T->host; /* the digest is taken: the host copy is free again */
    rt_comm_allgather(T->comm, &mine, all, sizeof(mine), "the replica check");
    char bad[256] = "";
    size_t o = 0;
    int n = 0;
    for (int r = 1; r < T->world; r++)
        if (all[r] != all[0] && n++ < 8 && o < sizeof(bad))
            o += (size_t)snprintf(bad + o, sizeof(bad) - o, "%s%d (%016" PRIx64 ")", o ? ", " : "", r, all[r]);
    uint64_t first = all[0];
    if (n)
        return rt_errf(-EPROTO, "replica check at optimizer step %" PRIu64 ": the parameters of rank(s) %s%s differ "
                                "from rank 0's (%016" PRIx64 ")",
                       T->pos.update, bad, n > 8 ? " and more" : "", first);
    return 0;
}

int replicas_due(const struct train *T)
{
    const uint64_t every = T->cfg.check_replicas;
    return every && T->pos.update % every == 0;
}
