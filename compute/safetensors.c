/*
 * safetensors.c - reading and writing safetensors files, the weight format
 * of Hugging Face's `safetensors` library and ringtrain's checkpoints
 * (compute.h, "safetensors").
 *
 * Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON (the header,
 * possibly padded with trailing spaces), then the data section. The header
 * maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * with offsets relative to the data section, plus an optional
 * "__metadata__" object of string values. The tensors must cover the data
 * section exactly: no gaps, no overlaps, nothing after the last one.
 *
 * Reading treats the file as hostile: every field is checked before it is
 * used, sizes are computed with overflow checks, and a failure names the
 * file, the tensor and what is wrong. A read file is kept whole in memory;
 * rt_st_tensor.data points into it and is NOT necessarily aligned (other
 * writers do not pad the header), so callers copy with memcpy rather than
 * casting. rt_st_get() lists tensors in data-section order.
 *
 * Writing builds the file in one buffer and hands it to
 * rt_file_write_atomic() (temp file, fsync, rename, directory fsync): a
 * failed write leaves any earlier file at the path untouched. The header is
 * padded with spaces so the data section starts 8-byte aligned.
 *
 * Byte order: the data is little-endian, as on every host ringtrain runs on.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");

/* The reference implementation's cap: a larger header is refused before it is parsed. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
#define ST_MAX_DIMS ((int)RT_ARRAY_LEN(((struct rt_st_tensor *)0)->shape))
#define ST_NAME_MAX (sizeof(((struct rt_st_tensor *)0)->name) - 1)
#define ST_META_KEY "__metadata__"

struct rt_st_file {
    uint8_t *buf;            /* the whole file; tensors point into it */
    size_t len;
    json_t *root;            /* the parsed header; owns the metadata strings */
    json_t *meta;            /* root's "__metadata__" object, or NULL */
    int n;
    struct rt_st_tensor *t;  /* n tensors in data-section order */
    int *by_name;            /* indices into t sorted by name, for rt_st_find() */
};

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [RT_ST_F32] = {"F32", 4}, [RT_ST_F16] = {"F16", 2}, [RT_ST_BF16] = {"BF16", 2},
    [RT_ST_I64] = {"I64", 8}, [RT_ST_I32] = {"I32", 4}, [RT_ST_U8] = {"U8", 1}, [RT_ST_F64] = {"F64", 8},
};

size_t rt_st_dtype_size(enum rt_st_dtype d)
{
    return (unsigned)d < RT_ARRAY_LEN(dtypes) ? dtypes[d].size : 0;
}

const char *rt_st_dtype_name(enum rt_st_dtype d)
{
    return (unsigned)d < RT_ARRAY_LEN(dtypes) ? dtypes[d].name : NULL;
}

static int dtype_parse(const char *s, enum rt_st_dtype *d)
{
    for (size_t i = 0; i < RT_ARRAY_LEN(dtypes); i++)
        if (strcmp(s, dtypes[i].name) == 0) {
            *d = (enum rt_st_dtype)i;
            return 0;
        }
    return -1;
}

/* Bytes a tensor of this dtype and shape takes; -1 when the count overflows 64 bits. */
static int tensor_bytes(enum rt_st_dtype d, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t n = rt_st_dtype_size(d);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[i], &n))
            return -1;
    *out = n;
    return 0;
}

/* "[2, 3, 4]" for messages; truncated quietly if it does not fit. */
static void shape_str(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

/* ---- reading -------------------------------------------------------------------- */

void rt_st_close(struct rt_st_file *f)
{
    if (!f)
        return;
    json_decref(f->root);
    free(f->buf);
    free(f->t);
    free(f->by_name);
    free(f);
}

int rt_st_count(const struct rt_st_file *f) { return f ? f->n : 0; }

const struct rt_st_tensor *rt_st_get(const struct rt_st_file *f, int i)
{
    return f && i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const struct rt_st_tensor *rt_st_find(const struct rt_st_file *f, const char *name)
{
    int lo = 0, hi = f ? f->n : 0;
    if (!name)
        return NULL;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0)
            return &f->t[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *rt_st_meta(const struct rt_st_file *f, const char *key)
{
    if (!f || !f->meta || !key)
        return NULL;
    return json_string_value(json_object_get(f->meta, key));
}

/* A non-negative JSON integer, or -1. */
static int64_t json_nonneg(const json_t *v)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    return (int64_t)json_integer_value(v);
}

/* Where a tensor's bytes lie, kept beside it while the layout is checked. */
struct span {
    uint64_t begin, end;
    int header_pos;          /* position in the header, to break ties between empty tensors */
    struct rt_st_tensor t;
};

/* Data-section order; empty tensors at the same offset keep their header order. */
static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->header_pos > y->header_pos) - (x->header_pos < y->header_pos);
}

/* Orders indices into the tensor array `arg` by name. */
static int name_cmp(const void *a, const void *b, void *arg)
{
    const struct rt_st_tensor *t = arg;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Checks one header entry `name` -> `v` and fills `s`. */
static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_len, struct span *s)
{
    const char *key, *dt;
    json_t *x, *shape, *offs;
    uint64_t need;
    char sh[160];

    if (strlen(name) > ST_NAME_MAX)
        return rt_errf(-EBADMSG, "%s: tensor '%.40s...': name longer than %zu bytes", path, name, ST_NAME_MAX);
    if (!json_is_object(v))
        return rt_errf(-EBADMSG, "%s: tensor '%s': entry is not a JSON object", path, name);
    json_object_foreach(v, key, x) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return rt_errf(-EBADMSG, "%s: tensor '%s': unknown key '%s' (expected dtype, shape, data_offsets)",
                           path, name, key);
    }
    snprintf(s->t.name, sizeof(s->t.name), "%s", name);

    dt = json_string_value(json_object_get(v, "dtype"));
    if (!dt)
        return rt_errf(-EBADMSG, "%s: tensor '%s': \"dtype\" missing or not a string", path, name);
    if (dtype_parse(dt, &s->t.dtype) < 0)
        return rt_errf(-EBADMSG, "%s: tensor '%s': dtype '%.16s' is not supported (F32, F16, BF16, I64, I32, U8)",
                       path, name, dt);

    shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return rt_errf(-EBADMSG, "%s: tensor '%s': \"shape\" missing or not an array", path, name);
    if (json_array_size(shape) > (size_t)ST_MAX_DIMS)
        return rt_errf(-EBADMSG, "%s: tensor '%s': shape has %zu dimensions, at most %d are supported", path,
                       name, json_array_size(shape), ST_MAX_DIMS);
    s->t.ndim = (int)json_array_size(shape);
    for (int i = 0; i < s->t.ndim; i++) {
        s->t.shape[i] = json_nonneg(json_array_get(shape, (size_t)i));
        if (s->t.shape[i] < 0)
            return rt_errf(-EBADMSG, "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, i);
    }

    offs = json_object_get(v, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2)
        return rt_errf(-EBADMSG, "%s: tensor '%s': \"data_offsets\" must be an array [begin, end]", path, name);
    int64_t b = json_nonneg(json_array_get(offs, 0)), e = json_nonneg(json_array_get(offs, 1));
    if (b < 0 || e < 0)
        return rt_errf(-EBADMSG, "%s: tensor '%s': data_offsets must be non-negative integers", path, name);
    if (b > e)
        return rt_errf(-EBADMSG, "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] end before they begin",
                       path, name, b, e);
    if ((uint64_t)e > data_len)
        return rt_errf(-EBADMSG,
                       "%s: tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] run past the %" PRIu64
                       "-byte data section",
                       path, name, b, e, data_len);
    shape_str(s->t.shape, s->t.ndim, sh, sizeof(sh));
    if (tensor_bytes(s->t.dtype, s->t.ndim, s->t.shape, &need) < 0)
        return rt_errf(-EBADMSG, "%s: tensor '%s': shape %s of %s overflows 64 bits", path, name, sh, dt);
    if (need != (uint64_t)(e - b))
        return rt_errf(-EBADMSG,
                       "%s: tensor '%s': shape %s of %s needs %" PRIu64 " bytes, data_offsets [%" PRId64
                       ", %" PRId64 "] hold %" PRId64,
                       path, name, sh, dt, need, b, e, e - b);
    s->begin = (uint64_t)b;
    s->end = (uint64_t)e;
    s->t.bytes = (size_t)need;
    return 0;
}

static int parse_meta(const char *path, json_t *meta)
{
    const char *key;
    json_t *v;

    if (!json_is_object(meta))
        return rt_errf(-EBADMSG, "%s: \"" ST_META_KEY "\" is not a JSON object", path);
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return rt_errf(-EBADMSG, "%s: " ST_META_KEY "['%s'] is not a string", path, key);
    }
    return 0;
}

/* Parses and checks the header of f->buf; fills f->t, f->by_name, f->meta. */
static int parse(const char *path, struct rt_st_file *f)
{
    uint64_t hlen, data_len;
    json_error_t jerr;
    const char *name;
    json_t *v;
    struct span *spans = NULL;
    int rc = 0, i = 0;

    if (f->len < 8)
        return rt_errf(-EBADMSG, "%s: %zu bytes: too short for the 8-byte header length", path, f->len);
    /* What torch.save writes: a zip archive (PyTorch 1.6 and later) or, before, a pickle (protocol 2 and up). */
    if (!memcmp(f->buf, "PK\x03\x04", 4) || (f->buf[0] == 0x80 && f->buf[1] >= 2 && f->buf[1] <= 5))
        return rt_errf(-EBADMSG, "%s is a PyTorch file of torch.save (a pickle), not safetensors: convert it with "
                                 "`python3 -m ringtrain.convert %s OUT.safetensors` (ringtrain's Python package, or "
                                 "python/ringtrain/convert.py by path) and use OUT.safetensors",
                       path, path);
    hlen = 0;
    for (int b = 7; b >= 0; b--)
        hlen = hlen << 8 | f->buf[b];
    if (hlen > ST_MAX_HEADER)
        return rt_errf(-EBADMSG, "%s: header length %" PRIu64 " exceeds the %" PRIu64 "-byte limit", path, hlen,
                       ST_MAX_HEADER);
    if (hlen > f->len - 8)
        return rt_errf(-EBADMSG, "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)", path,
                       hlen, f->len);
    if (hlen < 2 || f->buf[8] != '{')
        return rt_errf(-EBADMSG, "%s: the header does not begin with '{': not a safetensors file", path);
    data_len = f->len - 8 - hlen;

    /* JSON_REJECT_DUPLICATES: a repeated tensor name would make the file ambiguous. */
    f->root = json_loadb((const char *)f->buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root)
        return rt_errf(-EBADMSG, "%s: header is not valid JSON (line %d, column %d): %s", path, jerr.line,
                       jerr.column, jerr.text);
    if (!json_is_object(f->root))
        return rt_errf(-EBADMSG, "%s: header is not a JSON object", path);

    f->meta = json_object_get(f->root, ST_META_KEY);
    if (f->meta && (rc = parse_meta(path, f->meta)) < 0)
        return rc;
    f->n = (int)json_object_size(f->root) - (f->meta != NULL);
    spans = rt_calloc((size_t)f->n + 1, sizeof(*spans), path);
    f->t = rt_calloc((size_t)f->n + 1, sizeof(*f->t), path);
    f->by_name = rt_calloc((size_t)f->n + 1, sizeof(int), path);
    if (!spans || !f->t || !f->by_name) {
        free(spans);
        return -ENOMEM;
    }
    json_object_foreach(f->root, name, v) {
        if (strcmp(name, ST_META_KEY) == 0)
            continue;
        spans[i].header_pos = i;
        if ((rc = parse_entry(path, name, v, data_len, &spans[i])) < 0)
            goto out;
        i++;
    }

    /* The tensors must tile the data section: each starts where the previous one ended. */
    qsort(spans, (size_t)f->n, sizeof(*spans), span_cmp);
    uint64_t at = 0;
    for (i = 0; i < f->n; i++) {
        if (spans[i].begin != at) {
            if (spans[i].begin < at)
                rc = rt_errf(-EBADMSG, "%s: tensor '%s' at [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s'", path,
                             spans[i].t.name, spans[i].begin, spans[i].end, spans[i - 1].t.name);
            else
                rc = rt_errf(-EBADMSG,
                             "%s: tensor '%s' starts at data offset %" PRIu64 ": bytes [%" PRIu64 ", %" PRIu64
                             ") belong to no tensor",
                             path, spans[i].t.name, spans[i].begin, at, spans[i].begin);
            goto out;
        }
        at = spans[i].end;
        spans[i].t.data = f->buf + 8 + hlen + spans[i].begin;
        f->t[i] = spans[i].t;
        f->by_name[i] = i;
    }
    if (at != data_len) {
        rc = rt_errf(-EBADMSG, "%s: the data section holds %" PRIu64 " bytes but the tensors end at %" PRIu64, path,
                     data_len, at);
        goto out;
    }
    qsort_r(f->by_name, (size_t)f->n, sizeof(int), name_cmp, f->t);
out:
    free(spans);
    return rc;
}

int rt_st_read(const char *path, struct rt_st_file **out)
{
    struct rt_st_file *f = rt_calloc(1, sizeof(*f), path);
    int rc;

    *out = NULL;
    if (!f)
        return -ENOMEM;
    if ((rc = rt_file_read(path, &f->buf, &f->len)) < 0 || (rc = parse(path, f)) < 0) {
        rt_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* ---- writing -------------------------------------------------------------------- */

/* Checks the caller's tensors and metadata so that what is written reads back. */
static int check_args(const char *path, const struct rt_st_tensor *t, int n, const char *const *meta_kv,
                      int n_meta)
{
    if (n < 0 || n_meta < 0 || (n > 0 && !t) || (n_meta > 0 && !meta_kv))
        return rt_errf(-EINVAL, "%s: bad tensor or metadata list (%d tensors, %d metadata pairs)", path, n, n_meta);
    for (int i = 0; i < n; i++) {
        const struct rt_st_tensor *x = &t[i];
        size_t nlen = strnlen(x->name, sizeof(x->name));
        uint64_t need;
        char sh[160];

        if (nlen == 0 || nlen > ST_NAME_MAX)
            return rt_errf(-EINVAL, "%s: tensor %d: name empty or not NUL-terminated", path, i);
        if (strcmp(x->name, ST_META_KEY) == 0)
            return rt_errf(-EINVAL, "%s: tensor %d: '" ST_META_KEY "' is reserved", path, i);
        if (!rt_st_dtype_name(x->dtype))
            return rt_errf(-EINVAL, "%s: tensor '%s': unknown dtype %d", path, x->name, (int)x->dtype);
        if (x->ndim < 0 || x->ndim > ST_MAX_DIMS)
            return rt_errf(-EINVAL, "%s: tensor '%s': %d dimensions (0..%d)", path, x->name, x->ndim, ST_MAX_DIMS);
        shape_str(x->shape, x->ndim, sh, sizeof(sh));
        if (tensor_bytes(x->dtype, x->ndim, x->shape, &need) < 0)
            return rt_errf(-EINVAL, "%s: tensor '%s': shape %s is negative or overflows", path, x->name, sh);
        if (need != x->bytes)
            return rt_errf(-EINVAL, "%s: tensor '%s': shape %s of %s is %" PRIu64 " bytes, but bytes = %zu", path,
                           x->name, sh, rt_st_dtype_name(x->dtype), need, x->bytes);
        if (x->bytes && !x->data)
            return rt_errf(-EINVAL, "%s: tensor '%s': no data", path, x->name);
    }
    for (int i = 0; i < n_meta; i++)
        if (!meta_kv[2 * i] || !meta_kv[2 * i + 1])
            return rt_errf(-EINVAL, "%s: metadata pair %d has a NULL key or value", path, i);
    return 0;
}

/* 1 if `s` is valid UTF-8 (jansson refuses anything else as a key or string). */
static int valid_utf8(const char *s)
{
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

/* Builds the JSON header text (unpadded, malloc'd) in *out. Returns 0 or -errno. */
static int build_header(const char *path, const struct rt_st_tensor *t, int n, const char *const *meta_kv,
                        int n_meta, char **out)
{
    json_t *root = json_object(), *meta = NULL;
    uint64_t off = 0;
    int rc = 0;

    *out = NULL;
    if (!root)
        return rt_errf(-ENOMEM, "%s: out of memory building the header", path);
    /* Metadata first, as the reference writer puts it. */
    if (n_meta > 0) {
        meta = json_object();
        if (json_object_set_new(root, ST_META_KEY, meta) < 0)
            rc = rt_errf(-ENOMEM, "%s: out of memory building the header", path);
    }
    for (int i = 0; i < n_meta && rc == 0; i++) {
        const char *k = meta_kv[2 * i], *val = meta_kv[2 * i + 1];
        if (!valid_utf8(k) || !valid_utf8(val))
            rc = rt_errf(-EINVAL, "%s: metadata pair %d is not valid UTF-8", path, i);
        else if (json_object_get(meta, k))
            rc = rt_errf(-EINVAL, "%s: metadata key '%s' given twice", path, k);
        else if (json_object_set_new(meta, k, json_string(val)) < 0)
            rc = rt_errf(-ENOMEM, "%s: out of memory building the header", path);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim && shape; d++)
            if (json_array_append_new(shape, json_integer((json_int_t)t[i].shape[d])) < 0) {
                json_decref(shape);
                shape = NULL;
            }
        /* "o" hands shape's reference to the entry (and frees it if packing fails). */
        json_t *e = shape ? json_pack("{s:s, s:o, s:[I, I]}", "dtype", rt_st_dtype_name(t[i].dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + t[i].bytes))
                          : NULL;
        if (!e)
            rc = rt_errf(-ENOMEM, "%s: out of memory building the header", path);
        else if (!valid_utf8(t[i].name))
            rc = rt_errf(-EINVAL, "%s: tensor %d: name is not valid UTF-8", path, i);
        else if (json_object_get(root, t[i].name))
            rc = rt_errf(-EINVAL, "%s: tensor '%s' given twice", path, t[i].name);
        if (rc < 0) {
            json_decref(e);
            break;
        }
        /* set_new takes e's reference whether or not it succeeds. */
        if (json_object_set_new(root, t[i].name, e) < 0)
            rc = rt_errf(-ENOMEM, "%s: out of memory building the header", path);
        off += t[i].bytes;
    }
    if (rc == 0 && !(*out = json_dumps(root, JSON_COMPACT)))
        rc = rt_errf(-ENOMEM, "%s: out of memory building the header", path);
    json_decref(root);
    return rc;
}

int rt_st_write(const char *path, const struct rt_st_tensor *t, int n, const char *const *meta_kv, int n_meta)
{
    size_t hlen, total;
    uint8_t *buf, *p;
    char *header;
    int rc;

    if ((rc = check_args(path, t, n, meta_kv, n_meta)) < 0)
        return rc;
    if ((rc = build_header(path, t, n, meta_kv, n_meta, &header)) < 0)
        return rc;
    /* Pad with spaces so that the data section starts 8-byte aligned. */
    hlen = (strlen(header) + 7) & ~(size_t)7;
    total = 8 + hlen;
    for (int i = 0; i < n; i++)
        if (__builtin_add_overflow(total, t[i].bytes, &total)) {
            free(header);
            return rt_errf(-EOVERFLOW, "%s: the tensors add up to more than the address space", path);
        }
    buf = rt_malloc(total, path);
    if (!buf) {
        free(header);
        return -ENOMEM;
    }
    for (int b = 0; b < 8; b++)
        buf[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
    memset(buf + 8, ' ', hlen);
    memcpy(buf + 8, header, strlen(header));
    free(header);
    p = buf + 8 + hlen;
    for (int i = 0; i < n; i++) {
        if (t[i].bytes)
            memcpy(p, t[i].data, t[i].bytes);
        p += t[i].bytes;
    }
    rc = rt_file_write_atomic(path, buf, total);
    free(buf);
    return rc;
}
