/*
 * dnn_rules.c - the pure parts of the fast convolutions (see dnn_rules.h): the choice among measured
 * candidates, and the bookkeeping of the 16-bit weight copies. No CUDA, no cuDNN: tests/test_cuda_conv.c
 * --rules runs all of it without a GPU.
 */
#include "compute/cuda/dnn_rules.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the choice rule ------------------------------------------------------------------------------------ */

enum rt_dnn_verdict rt_dnn_judge(const struct rt_dnn_rule *r, const struct rt_dnn_cand *c, int timed)
{
    if (timed && !c->ran)
        return RT_DNN_NOT_RUN;
    if (timed && !(c->ms >= 0.0f && isfinite(c->ms)))
        return RT_DNN_NOT_MEASURED;
    if (c->workspace > r->ws_limit)
        return RT_DNN_WORKSPACE;
    /* PyTorch drops these engines whatever the settings; a narrowed input is not what any table promises. */
    if (c->down_convert)
        return RT_DNN_DOWN_CONVERT;
    if (c->reduced)
        return RT_DNN_REDUCED;
    if (r->f32 && !r->tf32 && c->tensor_cores)
        return RT_DNN_TF32;
    if (!r->nondeterministic && !c->deterministic)
        return RT_DNN_NONDETERMINISTIC;
    return RT_DNN_OK;
}

const char *rt_dnn_verdict_name(enum rt_dnn_verdict v)
{
    switch (v) {
    case RT_DNN_OK:
        return "ok";
    case RT_DNN_NOT_RUN:
        return "did not run";
    case RT_DNN_NOT_MEASURED:
        return "not measured";
    case RT_DNN_WORKSPACE:
        return "workspace over the limit";
    case RT_DNN_DOWN_CONVERT:
        return "narrows its inputs";
    case RT_DNN_REDUCED:
        return "accumulates below fp32";
    case RT_DNN_TF32:
        return "TF32, not allowed";
    case RT_DNN_NONDETERMINISTIC:
        return "not deterministic, not allowed";
    }
    return "?";
}

int rt_dnn_choose(const struct rt_dnn_rule *r, const struct rt_dnn_cand *c, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (rt_dnn_judge(r, &c[i], 1) != RT_DNN_OK)
            continue;
        if (best < 0 || c[i].ms < c[best].ms || (c[i].ms == c[best].ms && c[i].workspace < c[best].workspace))
            best = i;
    }
    return best;
}

/* ---- the cache of 16-bit weight copies ---------------------------------------------------------------- */

static int wkey_same(const struct rt_dnn_wkey *a, const struct rt_dnn_wkey *b)
{
    return a->src == b->src && a->dt == b->dt && a->layout == b->layout && a->k == b->k && a->c == b->c &&
           a->rs == b->rs && a->cpad == b->cpad;
}

int rt_dnn_wcache_find(const struct rt_dnn_wcache *w, const struct rt_dnn_wkey *k)
{
    for (int i = 0; i < w->n; i++)
        if (wkey_same(&w->e[i].key, k))
            return i;
    return -1;
}

int rt_dnn_wcache_add(struct rt_dnn_wcache *w, const struct rt_dnn_wkey *k)
{
    if (k->k <= 0 || k->c <= 0 || k->rs <= 0 || k->cpad < k->c || !k->src)
        return -EINVAL;
    if (w->n == w->cap) {
        const int cap = w->cap ? 2 * w->cap : 16;
        struct rt_dnn_wentry *p = realloc(w->e, (size_t)cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        w->e = p;
        w->cap = cap;
    }
    struct rt_dnn_wentry *e = &w->e[w->n];
    memset(e, 0, sizeof(*e));
    e->key = *k;
    e->src_bytes = (size_t)k->k * (size_t)k->c * (size_t)k->rs * sizeof(float);
    const uintptr_t lo = (uintptr_t)k->src, hi = lo + e->src_bytes;
    if (w->n == 0 || lo < w->lo)
        w->lo = lo;
    if (w->n == 0 || hi > w->hi)
        w->hi = hi;
    return w->n++;
}

int rt_dnn_wcache_invalidate(struct rt_dnn_wcache *w, const void *dst, size_t bytes)
{
    const uintptr_t lo = (uintptr_t)dst, hi = lo + bytes;
    /* Most writes are activations, gradients and optimizer state: outside every weight. */
    if (bytes == 0 || w->n == 0 || hi <= w->lo || lo >= w->hi)
        return 0;
    int n = 0;
    for (int i = 0; i < w->n; i++) {
        struct rt_dnn_wentry *e = &w->e[i];
        const uintptr_t s = (uintptr_t)e->key.src;
        if (lo < s + e->src_bytes && s < hi) {
            n += e->valid;
            e->valid = 0;
        }
    }
    return n;
}

void rt_dnn_wcache_invalidate_all(struct rt_dnn_wcache *w)
{
    for (int i = 0; i < w->n; i++)
        w->e[i].valid = 0;
}

void rt_dnn_wcache_fini(struct rt_dnn_wcache *w)
{
    free(w->e);
    memset(w, 0, sizeof(*w));
}

/* ---- the padded stem ------------------------------------------------------------------------------------- */

int rt_dnn_stem_channels(int c)
{
    return c <= 0 ? c : (c + 7) / 8 * 8;
}
