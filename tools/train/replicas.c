/*
 * replicas.c - one model on every rank: rank 0's parameters and batchnorm
 * statistics copied to the others (at the start, and the statistics at each
 * epoch's end, as DDP's broadcast_buffers), and the check that every rank's
 * parameters are bit-identical (the "param digest").
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

int replicas_sync_from_root(struct train *T, enum rt_model_buf which, const char *what)
{
    const size_t count = buf_count(T->model, which);
    if (T->world == 1 || count == 0)
        return 0;
    float *host = rt_malloc(count * sizeof(float), what);
    if (!host)
        return -1;
    rt_model_read(T->model, which, 0, count, host);
    rt_comm_broadcast(T->comm, host, count * sizeof(float), 0, what);
    rt_model_write(T->model, which, 0, host, count);
    free(host);
    return 0;
}

uint64_t train_param_digest(struct train *T)
{
    const size_t n = rt_model_param_count(T->model);
    float *host = rt_malloc(n * sizeof(float), "parameter digest");
    if (!host)
        return 0;
    rt_model_read(T->model, RT_MODEL_PARAMS, 0, n, host);
    uint64_t h = XXH64(host, n * sizeof(float), 0);
    free(host);
    return h;
}

int train_check_replicas(struct train *T, uint64_t *digest)
{
    uint64_t mine = train_param_digest(T);
    if (digest)
        *digest = mine;
    if (T->world == 1)
        return 0;
    uint64_t *all = rt_calloc((size_t)T->world, sizeof(uint64_t), "digests");
    if (!all)
        return -1;
    rt_comm_allgather(T->comm, &mine, all, sizeof(mine), "the replica check");
    char bad[256] = "";
    size_t o = 0;
    int n = 0;
    for (int r = 1; r < T->world; r++)
        if (all[r] != all[0] && n++ < 8 && o < sizeof(bad))
            o += (size_t)snprintf(bad + o, sizeof(bad) - o, "%s%d (%016" PRIx64 ")", o ? ", " : "", r, all[r]);
    uint64_t first = all[0];
    free(all);
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
