/*
 * checkpoint.c - model weights and optimizer state to and from safetensors
 * files through the shared tensor table, so the names are PyTorch's
 * state_dict names and `load_state_dict(strict=True)` accepts the file.
 * Buffers are copied between device and host here; the file format is
 * safetensors.c's business.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"

/* "1000<sep>512": the dimensions joined by `sep` (as much as fits). */
static void dims_text(char *buf, size_t len, int ndim, const int64_t *shape, const char *sep)
{
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? sep : "", shape[i]);
}

static void set_shape(struct rt_st_tensor *t, const struct rt_tensor_info *e, const char *suffix)
{
    snprintf(t->name, sizeof(t->name), "%s%s", e->name, suffix);
    t->ndim = e->ndim;
    for (int d = 0; d < e->ndim; d++)
        t->shape[d] = e->shape[d];
}

/* Copies `count` floats of device memory to a new host array. */
static float *download(struct rt_backend *be, const float *dev, size_t count)
{
    float *h = rt_malloc(RT_MAX(count, 1) * sizeof(float), "checkpoint copy");
    if (h && count)
        rt_backend_ops(be)->download(rt_backend_stream(be), h, dev, count * sizeof(float));
    return h;
}

int rt_model_save(struct rt_model *m, const char *path, const char *const *meta_kv, int n_meta)
{
    struct rt_backend *be = rt_model_backend(m);
    int count;
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    struct rt_st_tensor *t = rt_calloc((size_t)count, sizeof(*t), "checkpoint table");
    float *params = download(be, rt_model_params(m), rt_model_param_count(m));
    float *bufs = download(be, rt_model_buffers(m), rt_model_buffer_count(m));
    int64_t *tracked = rt_calloc((size_t)count + 1, sizeof(*tracked), "checkpoint counts");
    int rc = -ENOMEM;
    if (t && params && bufs && tracked) {
        for (int i = 0; i < count; i++) {
            const struct rt_tensor_info *e = &tab[i];
            set_shape(&t[i], e, "");
            if (e->kind == RT_BUFFER_I64) {
                tracked[i] = rt_model_tracked(m, i);
                t[i].dtype = RT_ST_I64;
                t[i].data = &tracked[i];
                t[i].bytes = sizeof(tracked[i]);
            } else {
                t[i].dtype = RT_ST_F32;
                t[i].data = (e->kind == RT_PARAM ? params : bufs) + e->offset;
                t[i].bytes = e->count * sizeof(float);
            }
        }
        rc = rt_st_write(path, t, count, meta_kv, n_meta);
    }
    free(t);
    free(params);
    free(bufs);
    free(tracked);
    return rc;
}

/* Checks that tensor `name` of file f has dtype d and the table row's shape. */
static const struct rt_st_tensor *expect(const struct rt_st_file *f, const char *path, const char *name,
                                         const struct rt_tensor_info *e, enum rt_st_dtype d)
{
    const struct rt_st_tensor *t = rt_st_find(f, name);
    if (!t) {
        rt_errf(-EINVAL, "%s: tensor '%s' is missing (a checkpoint of another model?)", path, name);
        return NULL;
    }
    int same = t->dtype == d && t->ndim == e->ndim;
    for (int i = 0; same && i < e->ndim; i++)
        same = t->shape[i] == e->shape[i];
    if (!same) {
        char want[64], got[64];
        dims_text(want, sizeof(want), e->ndim, e->shape, ",");
        dims_text(got, sizeof(got), t->ndim, t->shape, ",");
        rt_errf(-EINVAL, "%s: tensor '%s' is %s [%s], this model needs %s [%s]", path, name,
                rt_st_dtype_name(t->dtype), got, rt_st_dtype_name(d), want);
        return NULL;
    }
    return t;
}

int rt_model_load(struct rt_model *m, const struct rt_st_file *f, const char *path)
{
    struct rt_backend *be = rt_model_backend(m);
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    int count;
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    if (rt_st_count(f) != count) {
        /* Name the first stranger so the user sees what kind of file this is. */
        for (int i = 0; i < rt_st_count(f); i++) {
            const char *nm = rt_st_get(f, i)->name;
            int known = 0;
            for (int j = 0; j < count && !known; j++)
                known = !strcmp(tab[j].name, nm);
            if (!known)
                return rt_errf(-EINVAL, "%s: unexpected tensor '%s' for %s (a checkpoint of another model?)", path,
                               nm, rt_model_name(m));
        }
    }
    for (int i = 0; i < count; i++) {
        const struct rt_tensor_info *e = &tab[i];
        enum rt_st_dtype d = e->kind == RT_BUFFER_I64 ? RT_ST_I64 : RT_ST_F32;
        const struct rt_st_tensor *t = expect(f, path, e->name, e, d);
        if (!t)
            return -EINVAL;
        if (e->kind == RT_BUFFER_I64) {
            int64_t v;
            memcpy(&v, t->data, sizeof(v));
            rt_model_set_tracked(m, i, v);
            continue;
        }
        float *dst = (e->kind == RT_PARAM ? rt_model_params(m) : rt_model_buffers(m)) + e->offset;
        /* Tensor data in a file need not be aligned; upload copies bytes. */
        ops->upload(s, dst, t->data, e->count * sizeof(float));
    }
    return 0;
}

int rt_optim_save(struct rt_optim *opt, const char *path, const char *const *meta_kv, int n_meta)
{
    const struct rt_model *m = rt_optim_model(opt);
    struct rt_backend *be = rt_model_backend(m);
    int count, ns = rt_optim_state_count(opt);
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    size_t np = rt_model_trainable_count(m);
    struct rt_st_tensor *t = rt_calloc((size_t)count * 2 + 1, sizeof(*t), "optimizer table");
    float *host[2] = {NULL, NULL};
    int rc = t ? 0 : -ENOMEM;
    for (int k = 0; k < ns && !rc; k++)
        if (!(host[k] = download(be, rt_optim_state(opt, k, NULL), np)))
            rc = -ENOMEM;
    int n = 0;
    for (int k = 0; k < ns && !rc; k++) {
        const char *sname;
        rt_optim_state(opt, k, &sname);
        char suffix[40];
        snprintf(suffix, sizeof(suffix), ".%s", sname);
        for (int i = 0; i < count; i++) {
            if (tab[i].kind != RT_PARAM || tab[i].frozen)
                continue; /* a frozen layer has no optimizer state */
            set_shape(&t[n], &tab[i], suffix);
            t[n].dtype = RT_ST_F32;
            t[n].data = host[k] + tab[i].offset;
            t[n].bytes = tab[i].count * sizeof(float);
            n++;
        }
    }
    if (!rc) {
        char step[32];
        snprintf(step, sizeof(step), "%" PRId64, rt_optim_steps(opt));
        const char **kv = rt_calloc((size_t)n_meta * 2 + 2, sizeof(char *), "optimizer metadata");
        if (!kv) {
            rc = -ENOMEM;
        } else {
            for (int i = 0; i < 2 * n_meta; i++)
                kv[i] = meta_kv[i];
            kv[2 * n_meta] = "step";
            kv[2 * n_meta + 1] = step;
            rc = rt_st_write(path, t, n, kv, n_meta + 1);
            free(kv);
        }
    }
    free(t);
    free(host[0]);
    free(host[1]);
    return rc;
}

int rt_optim_load(struct rt_optim *opt, const struct rt_st_file *f, const char *path)
{
    const struct rt_model *m = rt_optim_model(opt);
    struct rt_backend *be = rt_model_backend(m);
    const struct rt_ops *ops = rt_backend_ops(be);
    struct rt_stream *s = rt_backend_stream(be);
    int count, ns = rt_optim_state_count(opt), params = 0;
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    const char *step = rt_st_meta(f, "step");
    char *end = NULL;
    long long v = step ? strtoll(step, &end, 10) : -1;
    if (!step || *end || v < 0)
        return rt_errf(-EINVAL, "%s: no valid \"step\" in the metadata", path);
    for (int i = 0; i < count; i++)
        params += tab[i].kind == RT_PARAM && !tab[i].frozen;
    if (rt_st_count(f) != params * ns)
        return rt_errf(-EINVAL, "%s: %d tensors, expected %d for %s with this optimizer (another optimizer, or "
                                "another --freeze?)",
                       path, rt_st_count(f), params * ns, rt_model_name(m));
    for (int k = 0; k < ns; k++) {
        const char *sname;
        float *dst = rt_optim_state(opt, k, &sname);
        for (int i = 0; i < count; i++) {
            if (tab[i].kind != RT_PARAM || tab[i].frozen)
                continue;
            char name[160];
            snprintf(name, sizeof(name), "%s.%s", tab[i].name, sname);
            const struct rt_st_tensor *t = expect(f, path, name, &tab[i], RT_ST_F32);
            if (!t)
                return -EINVAL;
            ops->upload(s, dst + tab[i].offset, t->data, tab[i].count * sizeof(float));
        }
    }
    rt_optim_set_steps(opt, v);
    return 0;
}

/* ---- starting weights (train --init) ------------------------------------------ */

/* "F32 [1000, 512]" */
static void describe_tensor(char *buf, size_t len, const char *dtype, int ndim, const int64_t *shape)
{
    char dims[40];
    dims_text(dims, sizeof(dims), ndim, shape, ", ");
    snprintf(buf, len, "%s [%s]", dtype, dims);
}

static int is_float_dtype(enum rt_st_dtype d)
{
    return d == RT_ST_F32 || d == RT_ST_F16 || d == RT_ST_BF16 || d == RT_ST_F64;
}

static int is_int_dtype(enum rt_st_dtype d)
{
    return d == RT_ST_I64 || d == RT_ST_I32 || d == RT_ST_U8;
}

/* IEEE half to float, exactly (every half is a float). */
static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) {
        bits = sign | 0x7f800000u | (m << 13); /* Inf, NaN */
    } else if (e) {
        bits = sign | ((e + 112) << 23) | (m << 13);
    } else {
        float v = (float)m * 0x1p-24f; /* subnormal or zero */
        return sign ? -v : v;
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* Tensor t's elements as floats (t's dtype is a floating one; the data may be unaligned). */
static void to_floats(const struct rt_st_tensor *t, size_t count, float *out)
{
    const unsigned char *p = t->data;
    for (size_t i = 0; i < count; i++) {
        switch (t->dtype) {
        case RT_ST_F32:
            memcpy(&out[i], p + 4 * i, 4);
            break;
        case RT_ST_F64: {
            double v;
            memcpy(&v, p + 8 * i, 8);
            out[i] = (float)v;
            break;
        }
        case RT_ST_F16: {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = half_to_float(h);
            break;
        }
        default: { /* BF16: the high half of a float */
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            const uint32_t bits = (uint32_t)h << 16;
            memcpy(&out[i], &bits, 4);
            break;
        }
        }
    }
}

static int64_t to_int(const struct rt_st_tensor *t)
{
    if (t->dtype == RT_ST_I64) {
        int64_t v;
        memcpy(&v, t->data, 8);
        return v;
    }
    if (t->dtype == RT_ST_I32) {
        int32_t v;
        memcpy(&v, t->data, 4);
        return v;
    }
    return *(const uint8_t *)t->data;
}

static void add_diff(struct rt_init_result *r, enum rt_init_diff_kind k, const char *name,
                     const struct rt_st_tensor *ft, const struct rt_tensor_info *e)
{
    struct rt_init_diff *d = &r->diff[r->ndiff++];
    memset(d, 0, sizeof(*d));
    d->kind = k;
    snprintf(d->name, sizeof(d->name), "%s", name);
    if (ft)
        describe_tensor(d->file, sizeof(d->file), rt_st_dtype_name(ft->dtype), ft->ndim, ft->shape);
    if (e) {
        describe_tensor(d->model, sizeof(d->model), e->kind == RT_BUFFER_I64 ? "I64" : "F32", e->ndim, e->shape);
        d->head = e->head;
    }
}

int rt_model_load_init(struct rt_model *m, const struct rt_st_file *f, int reset_head, struct rt_init_result *r)
{
    int count;
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    memset(r, 0, sizeof(*r));
    r->diff = rt_calloc((size_t)(count + rt_st_count(f)) + 1, sizeof(*r->diff), "the differences");
    if (!r->diff)
        return -ENOMEM;
    size_t maxc = 1;
    for (int i = 0; i < count; i++) {
        const struct rt_tensor_info *e = &tab[i];
        if (reset_head && e->head)
            continue;
        const struct rt_st_tensor *t = rt_st_find(f, e->name);
        if (!t) {
            add_diff(r, RT_INIT_MISSING, e->name, NULL, e);
            continue;
        }
        if (e->kind == RT_BUFFER_I64 ? !is_int_dtype(t->dtype) : !is_float_dtype(t->dtype)) {
            add_diff(r, RT_INIT_DTYPE, e->name, t, e);
            continue;
        }
        int same = t->ndim == e->ndim;
        for (int d = 0; same && d < e->ndim; d++)
            same = t->shape[d] == e->shape[d];
        if (!same)
            add_diff(r, RT_INIT_SHAPE, e->name, t, e);
        maxc = RT_MAX(maxc, e->count);
    }
    for (int j = 0; j < rt_st_count(f); j++) {
        const struct rt_st_tensor *t = rt_st_get(f, j);
        int known = 0;
        for (int i = 0; i < count && !known; i++)
            known = !strcmp(tab[i].name, t->name);
        if (!known)
            add_diff(r, RT_INIT_UNEXPECTED, t->name, t, NULL);
    }
    if (r->ndiff)
        return rt_errf(-EINVAL, "%d difference%s between the file and %s", r->ndiff, r->ndiff == 1 ? "" : "s",
                       rt_model_name(m));
    float *host = rt_malloc(maxc * sizeof(float), "starting weights");
    if (!host)
        return -ENOMEM;
    for (int i = 0; i < count; i++) {
        const struct rt_tensor_info *e = &tab[i];
        if (reset_head && e->head) {
            r->head_reset++;
            continue;
        }
        const struct rt_st_tensor *t = rt_st_find(f, e->name);
        if (e->kind == RT_BUFFER_I64) {
            rt_model_set_tracked(m, i, to_int(t));
        } else {
            to_floats(t, e->count, host);
            rt_model_write(m, e->kind == RT_PARAM ? RT_MODEL_PARAMS : RT_MODEL_BUFFERS, e->offset, host, e->count);
        }
        r->loaded++;
    }
    free(host);
    return 0;
}

void rt_init_print(const struct rt_init_result *r, FILE *f)
{
    static const char *const kind[] = {"missing", "unexpected", "shape", "dtype"};
    for (int i = 0; i < r->ndiff; i++) {
        const struct rt_init_diff *d = &r->diff[i];
        if (d->kind == RT_INIT_MISSING)
            fprintf(f, "  %-10s  %-40s  model %s\n", kind[d->kind], d->name, d->model);
        else if (d->kind == RT_INIT_UNEXPECTED)
            fprintf(f, "  %-10s  %-40s  file %s\n", kind[d->kind], d->name, d->file);
        else
            fprintf(f, "  %-10s  %-40s  file %s, model %s\n", kind[d->kind], d->name, d->file, d->model);
    }
}

void rt_init_result_free(struct rt_init_result *r)
{
    if (!r)
        return;
    free(r->diff);
    memset(r, 0, sizeof(*r));
}
