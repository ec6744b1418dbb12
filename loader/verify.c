/*
 * verify.c - `ringtrain verify`: checks every shard a manifest lists against
 * the manifest (size, whole-file XXH64, shape, codec, split, record ranges,
 * per-class counts) and itself (header, labels, block index, every block's
 * checksum and decode). Each problem is reported as one line; checking goes
 * on past a bad block so one run lists everything wrong.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/common.h"
#include "loader/format.h"
#include "loader/loader.h"
#include "loader/offline.h"

struct verify_ctx {
    void (*report)(void *ctx, const char *line);
    void *rctx;
    int problems;
};

static void problem(struct verify_ctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void problem(struct verify_ctx *v, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    v->problems++;
    if (v->report)
        v->report(v->rctx, line);
}

/*
 * Feeds the first `limit` bytes of `path` (the whole file when it is shorter)
 * into `st`. Returns 0 or -errno.
 */
static int hash_prefix(const char *path, uint64_t limit, XXH64_state_t *st)
{
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = rt_malloc(CHUNK, "hash buffer");
    uint64_t done = 0;
    int fd = -1, rc = 0;

    if (!buf)
        return -ENOMEM;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = rt_errf(-errno, "%s: cannot open: %s", path, strerror(errno));
        goto out;
    }
    while (done < limit) {
        ssize_t n = read(fd, buf, (size_t)RT_MIN((uint64_t)CHUNK, limit - done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = rt_errf(-errno, "%s: read failed: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        XXH64_update(st, buf, (size_t)n);
        done += (uint64_t)n;
    }
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}

static void check_digest(struct verify_ctx *v, const char *path, XXH64_state_t *st, uint64_t want)
{
    uint64_t digest = XXH64_digest(st);
    if (digest != want)
        problem(v, "%s: file checksum %016" PRIx64 ", manifest says %016" PRIx64, path, digest, want);
}

/* Variable-size records: the block's payload and table, then every record decoded whole at its size. */
static void verify_variable_block(struct verify_ctx *v, struct rt_decoder *dec, const struct rt_shard_header *h,
                                  const struct rt_block_entry *e, uint32_t b, const uint8_t *stored, const char *path)
{
    uint8_t *payload = rt_malloc(e->raw_size, "block payload"), *px = NULL;
    size_t px_cap = 0;

    if (!payload || rt_block_payload(dec, h, e, b, stored, payload, path) < 0) {
        problem(v, "%s", rt_errmsg());
        free(payload);
        return;
    }
    for (uint32_t r = 0; r < e->record_count; r++) {
        struct rt_jpeg_record rec;
        char where[4300];
        rt_jpeg_block_record(h, e, payload, r, &rec);
        size_t need = (size_t)h->channels * rec.height * rec.width;
        if (need > px_cap) {
            free(px);
            px_cap = need;
            px = rt_malloc(px_cap, "pixel buffer");
            if (!px) {
                problem(v, "%s", rt_errmsg());
                break;
            }
        }
        snprintf(where, sizeof(where), "%s: block %" PRIu32 ": record %" PRIu64, path, b,
                 h->first_record + e->first_record + r);
        if (rt_jpeg_record_decode(dec, h, &rec, px, where) < 0)
            problem(v, "%s", rt_errmsg());
    }
    free(px);
    free(payload);
}

/*
 * Reads, checks and decodes every block, feeding the stored bytes to `st` in
 * file order (blocks are contiguous up to the end of the file). Returns 1 when
 * every block was read, so `st` covers the whole file.
 */
static int verify_blocks(struct verify_ctx *v, struct rt_decoder *dec, const struct rt_shard *sh,
                         const char *path, XXH64_state_t *st)
{
    int complete = 1;

    const struct rt_shard_header *h = rt_shard_header(sh);
    const struct rt_block_entry *blocks = rt_shard_blocks(sh);
    uint8_t *stored = NULL, *pixels = NULL;
    size_t stored_cap = 0, pixels_cap = 0;

    for (uint32_t b = 0; b < h->block_count; b++) {
        const struct rt_block_entry *e = &blocks[b];
        /* Variable-size records are decoded one at a time (verify_variable_block): no block of pixels. */
        size_t need_px = RT_MAX((size_t)rt_record_bytes(h) * e->record_count, 1);
        if (e->stored_size > stored_cap) {
            free(stored);
            stored_cap = e->stored_size;
            stored = rt_malloc(stored_cap, "block buffer");
        }
        if (need_px > pixels_cap) {
            free(pixels);
            pixels_cap = need_px;
            pixels = rt_malloc(pixels_cap, "pixel buffer");
        }
        if (!stored || !pixels) {
            problem(v, "%s: block %" PRIu32 ": %s", path, b, rt_errmsg());
            complete = 0;
            break;
        }
        if (rt_shard_read_block(sh, b, stored) < 0) {
            problem(v, "%s", rt_errmsg());
            complete = 0;
            continue;
        }
        XXH64_update(st, stored, e->stored_size);
        if (rt_shard_variable(h))
            verify_variable_block(v, dec, h, e, b, stored, path);
        else if (rt_block_decode(dec, h, e, b, stored, pixels, path) < 0)
            problem(v, "%s", rt_errmsg());
    }
    free(stored);
    free(pixels);
    return complete;
}

static void verify_shard(struct verify_ctx *v, struct rt_decoder *dec, const struct rt_dataset_info *info,
                         enum rt_split sp, const struct rt_shard_ref *ref, uint64_t *class_seen)
{
    char path[4096];
    struct stat st;
    struct rt_shard *sh = NULL;
    XXH64_state_t *hs;

    snprintf(path, sizeof(path), "%s/%s", info->dir, ref->file);
    if (stat(path, &st) < 0) {
        problem(v, "%s: missing: the manifest lists it with %" PRIu64 " records (%s)", path, ref->records,
                strerror(errno));
        return;
    }
    if ((uint64_t)st.st_size != ref->bytes)
        problem(v, "%s: size %lld bytes, manifest says %" PRIu64, path, (long long)st.st_size, ref->bytes);
    hs = XXH64_createState();
    if (!hs) {
        problem(v, "%s: out of memory", path);
        return;
    }
    XXH64_reset(hs, 0);
    if (rt_shard_open(path, &sh) < 0) {
        /* No usable index: the file checksum has to read the file on its own. */
        problem(v, "%s", rt_errmsg());
        if (hash_prefix(path, UINT64_MAX, hs) < 0)
            problem(v, "%s", rt_errmsg());
        else
            check_digest(v, path, hs, ref->xxh64);
        XXH64_freeState(hs);
        return;
    }
    const struct rt_shard_header *h = rt_shard_header(sh);
    if (h->codec != info->codec || h->channels != info->channels || h->height != info->height ||
        h->width != info->width || h->num_classes != info->num_classes)
        problem(v, "%s: header says %s %" PRIu32 "x%" PRIu32 "x%" PRIu32 " with %" PRIu32
                " classes, manifest says %s %" PRIu32 "x%" PRIu32 "x%" PRIu32 " with %" PRIu32,
                path, rt_codec_name(h->codec), h->channels, h->height, h->width, h->num_classes,
                rt_codec_name(info->codec), info->channels, info->height, info->width, info->num_classes);
    if (h->split != sp)
        problem(v, "%s: header says split %s, manifest lists it under %s", path, rt_split_name(h->split),
                rt_split_name(sp));
    if (h->record_count != ref->records || h->first_record != ref->first_record)
        problem(v, "%s: holds records [%" PRIu64 ", +%" PRIu64 "), manifest says [%" PRIu64 ", +%" PRIu64 ")",
                path, h->first_record, h->record_count, ref->first_record, ref->records);
    if (h->num_classes == info->num_classes) {
        const int32_t *labels = rt_shard_labels(sh);
        for (uint64_t i = 0; i < h->record_count; i++)
            class_seen[labels[i]]++;
    }
    /* One pass over the file: header, labels and index here, the blocks as they are checked. */
    if (hash_prefix(path, h->data_offset, hs) < 0)
        problem(v, "%s", rt_errmsg());
    else if (verify_blocks(v, dec, sh, path, hs))
        check_digest(v, path, hs, ref->xxh64);
    XXH64_freeState(hs);
    rt_shard_close(sh);
}

int rt_dataset_verify(const struct rt_dataset *ds, void (*report)(void *ctx, const char *line), void *ctx)
{
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    struct verify_ctx v = {report, ctx, 0};
    struct rt_decoder *dec;
    uint64_t *seen;
    int rc;

    rc = rt_decoder_create(&dec);
    if (rc < 0)
        return rc;
    seen = rt_calloc(info->num_classes, sizeof(uint64_t), "class counts");
    if (!seen) {
        rt_decoder_destroy(dec);
        return -ENOMEM;
    }
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        const struct rt_split_info *si = &info->split[sp];
        memset(seen, 0, sizeof(uint64_t) * info->num_classes);
        for (uint32_t i = 0; i < si->nshards; i++)
            verify_shard(&v, dec, info, (enum rt_split)sp, &si->shards[i], seen);
        for (uint32_t c = 0; si->nshards && c < info->num_classes; c++)
            if (seen[c] != si->class_counts[c])
                problem(&v, "%s/manifest.json: split %s class %" PRIu32 " (%s): shards hold %" PRIu64
                        " records, manifest says %" PRIu64,
                        info->dir, rt_split_name((enum rt_split)sp), c, info->class_names[c], seen[c],
                        si->class_counts[c]);
    }
    free(seen);
    rt_decoder_destroy(dec);
    return v.problems;
}
