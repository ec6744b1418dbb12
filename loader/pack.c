/*
 * pack.c - `ringtrain pack`: reads a source (source.h), groups its records
 * into blocks of `block_records`, encodes the blocks on a pool of worker
 * threads (zstd for raw, TurboJPEG for jpeg), and writes them in order into
 * shards of about `shard_bytes`, then the manifest.
 *
 * Output is a pure function of the input and the options: block and shard
 * boundaries depend only on record counts and encoded sizes, and blocks are
 * written in record order whatever thread encoded them. Everything is written
 * under "<outdir>.partial" and renamed to <outdir> only when complete.
 *
 * The manifest's per-channel mean and std of the training split come from
 * integer sums of v and v^2 that each worker takes over the pixels of its
 * block as the loader will decode them (the decoded JPEG for the jpeg
 * codec), so they are exact and the same for any thread count.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "common/common.h"
#include "loader/codec.h"
#include "loader/format.h"
#include "loader/manifest.h"
#include "loader/offline.h"
#include "loader/source.h"

#define DEFAULT_SHARD_BYTES ((uint64_t)64 << 20)
#define DEFAULT_BLOCK_PIXELS (128u << 10)
#define DEFAULT_QUALITY 90
#define DEFAULT_LEVEL 3

/* Where one output split's records come from. */
struct split_plan {
    enum rt_split from;     /* source split */
    uint64_t *index;        /* source indices in output order, or NULL = 0..count-1 */
    uint64_t count;
};

struct block_job {
    enum rt_split split;
    uint64_t first;         /* position in the split plan */
    uint32_t count;
    uint8_t *stored;        /* malloc'd encoded bytes */
    uint32_t stored_len, raw_size;
    uint64_t xxh64;         /* of the stored bytes, computed by the worker */
    int32_t *labels;        /* count */
    /* Training split only: per-channel sums of v and v^2 over the decoded pixels. */
    uint64_t px_sum[RT_MAX_CHANNELS], px_sq[RT_MAX_CHANNELS];
    int rc;
    char err[1024];
};

struct worker {
    ZSTD_CCtx *zc;
    tjhandle tjc, tjd;
    uint8_t *raw;           /* block_records * record bytes */
    uint8_t *hwc;           /* one record, interleaved */
    uint8_t *dec;           /* one record decoded back from its JPEG (statistics) */
    pthread_t thread;
    int started;
    uint64_t seen_gen;
    struct packer *p;
};

struct shard_writer {
    enum rt_split split;
    uint32_t shard_no;
    uint8_t *data;
    size_t data_len, data_cap;
    struct rt_block_entry *blocks;
    uint32_t nblocks, blocks_cap;
    int32_t *labels;
    uint64_t nrec, labels_cap;
    uint64_t first_record;
    struct rt_shard_ref *refs;
    uint32_t nrefs;
    uint64_t *class_counts;
};

struct packer {
    const struct rt_pack_opts *o;
    const struct rt_source *src;
    const struct rt_source_info *info;
    struct split_plan plan[RT_SPLIT_COUNT];
    char tmpdir[4096];
    enum rt_codec codec;
    int quality, level, passthrough;
    uint32_t block_records;
    uint64_t shard_bytes;
    uint64_t rec_bytes;

    /* worker pool */
    int nworkers;
    struct worker *workers;
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    uint64_t gen;
    int active, quit;
    struct block_job *jobs;
    uint32_t njobs;
    atomic_uint next_job;

    struct rt_pack_stats stats;
    /* Sums of the training split's pixel values and their squares, per channel. */
    uint64_t px_sum[RT_MAX_CHANNELS], px_sq[RT_MAX_CHANNELS];
    uint64_t total_records;
    uint64_t t0;
};

/* ---- encoding one block (worker threads) ------------------------------------- */

/* Gets record `r` of the job as CHW pixels in `dst`. */
static int record_pixels(struct packer *p, struct worker *w, const struct rt_item *it, uint8_t *dst)
{
    uint8_t *file;
    size_t len;
    int rc;

    if (it->kind == RT_ITEM_PIXELS) {
        memcpy(dst, it->pixels, p->rec_bytes);
        return 0;
    }
    rc = rt_file_read(it->path, &file, &len);
    if (rc < 0)
        return rc;
    rc = rt_jpeg_decode_chw(w->tjd, file, len, p->info->channels, p->info->height, p->info->width, dst, w->hwc,
                            it->path);
    free(file);
    return rc;
}

/* Adds one CHW record's per-channel sums of v and v^2 to the job's (training split only). */
static void norm_add(const struct packer *p, struct block_job *j, const uint8_t *chw)
{
    const size_t plane = (size_t)p->info->height * p->info->width;

    if (j->split != RT_SPLIT_TRAIN)
        return;
    for (uint32_t c = 0; c < p->info->channels; c++) {
        const uint8_t *px = chw + c * plane;
        uint64_t sum = 0, sq = 0;
        for (size_t i = 0; i < plane; i++) {
            sum += px[i];
            sq += (uint32_t)px[i] * px[i];
        }
        j->px_sum[c] += sum;
        j->px_sq[c] += sq;
    }
}

static int encode_raw(struct packer *p, struct worker *w, struct block_job *j, const struct split_plan *pl)
{
    size_t raw = (size_t)p->rec_bytes * j->count;
    size_t bound = ZSTD_compressBound(raw);
    int rc;

    for (uint32_t r = 0; r < j->count; r++) {
        struct rt_item it;
        uint64_t idx = pl->index ? pl->index[j->first + r] : j->first + r;
        rt_source_item(p->src, pl->from, idx, &it);
        j->labels[r] = it.label;
        if ((rc = record_pixels(p, w, &it, w->raw + p->rec_bytes * r)) < 0)
            return rc;
        norm_add(p, j, w->raw + p->rec_bytes * r);
    }
    j->stored = rt_malloc(bound, "compressed block");
    if (!j->stored)
        return -ENOMEM;
    size_t n = ZSTD_compressCCtx(w->zc, j->stored, bound, w->raw, raw, p->level);
    if (ZSTD_isError(n))
        return rt_errf(-EIO, "zstd compression failed: %s", ZSTD_getErrorName(n));
    j->stored_len = (uint32_t)n;
    j->raw_size = (uint32_t)raw;
    return 0;
}

/* Appends `len` bytes to the growing payload. */
static int payload_put(uint8_t **buf, size_t *len, size_t *cap, const uint8_t *src, size_t n)
{
    if (*len + n > *cap) {
        size_t ncap = RT_MAX(*cap * 2, *len + n);
        uint8_t *nb = rt_realloc(*buf, ncap, "JPEG block");
        if (!nb)
            return -ENOMEM;
        *buf = nb;
        *cap = ncap;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    return 0;
}

static int encode_jpeg(struct packer *p, struct worker *w, struct block_job *j, const struct split_plan *pl)
{
    size_t table = 4 * ((size_t)j->count + 1), len = table, cap = table + (size_t)j->count * 2048;
    int rc = 0;

    j->stored = rt_malloc(cap, "JPEG block");
    if (!j->stored)
        return -ENOMEM;
    rt_put32(j->stored, 0);
    for (uint32_t r = 0; r < j->count && rc == 0; r++) {
        struct rt_item it;
        uint64_t idx = pl->index ? pl->index[j->first + r] : j->first + r;
        uint8_t *jpeg = NULL, *file = NULL;
        size_t jlen = 0, flen;

        rt_source_item(p->src, pl->from, idx, &it);
        j->labels[r] = it.label;
        if (it.kind == RT_ITEM_JPEG_FILE && p->passthrough) {
            /* Keep the original bytes, but only after proving they decode to the right shape. */
            rc = rt_file_read(it.path, &file, &flen);
            if (rc == 0)
                rc = rt_jpeg_decode_chw(w->tjd, file, flen, p->info->channels, p->info->height, p->info->width,
                                        w->raw, w->hwc, it.path);
            if (rc == 0) {
                norm_add(p, j, w->raw);
                rc = payload_put(&j->stored, &len, &cap, file, flen);
            }
            free(file);
        } else {
            rc = record_pixels(p, w, &it, w->raw);
            if (rc == 0)
                rc = rt_jpeg_encode_chw(w->tjc, w->raw, p->info->channels, p->info->height, p->info->width,
                                        p->quality, w->hwc, &jpeg, &jlen);
            /* The statistics describe what training sees: the JPEG decoded, not the pixels before encoding. */
            if (rc == 0 && j->split == RT_SPLIT_TRAIN) {
                rc = rt_jpeg_decode_chw(w->tjd, jpeg, jlen, p->info->channels, p->info->height, p->info->width,
                                        w->dec, w->hwc, it.path ? it.path : "encoded record");
                if (rc == 0)
                    norm_add(p, j, w->dec);
            }
            if (rc == 0)
                rc = payload_put(&j->stored, &len, &cap, jpeg, jlen);
            if (jpeg)
                tjFree(jpeg);
        }
        if (rc == 0 && len - table > UINT32_MAX)
            rc = rt_errf(-E2BIG, "JPEG block larger than 4 GiB; use smaller --block-records");
        if (rc == 0)
            rt_put32(j->stored + 4 * ((size_t)r + 1), (uint32_t)(len - table));
    }
    if (rc == 0 && len > RT_MAX_BLOCK_RAW)
        rc = rt_errf(-E2BIG, "a JPEG block of %zu bytes exceeds the %u-byte limit; use smaller --block-records", len,
                     RT_MAX_BLOCK_RAW);
    j->stored_len = j->raw_size = (uint32_t)len;
    return rc;
}

static void run_jobs(struct packer *p, struct worker *w)
{
    unsigned j;
    while ((j = atomic_fetch_add(&p->next_job, 1)) < p->njobs) {
        struct block_job *job = &p->jobs[j];
        const struct split_plan *pl = &p->plan[job->split];
        job->rc = p->codec == RT_CODEC_RAW ? encode_raw(p, w, job, pl) : encode_jpeg(p, w, job, pl);
        if (job->rc < 0)
            snprintf(job->err, sizeof(job->err), "%s", rt_errmsg());
        else
            job->xxh64 = XXH64(job->stored, job->stored_len, 0);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct packer *p = w->p;

    for (;;) {
        pthread_mutex_lock(&p->lock);
        while (p->gen == w->seen_gen && !p->quit)
            pthread_cond_wait(&p->start, &p->lock);
        if (p->quit) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        w->seen_gen = p->gen;
        pthread_mutex_unlock(&p->lock);
        run_jobs(p, w);
        pthread_mutex_lock(&p->lock);
        if (--p->active == 0)
            pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->lock);
    }
}

/* Encodes p->jobs[0..njobs) on all workers, the calling thread included. */
static void run_group(struct packer *p)
{
    atomic_store(&p->next_job, 0);
    pthread_mutex_lock(&p->lock);
    p->active = p->nworkers - 1;
    p->gen++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    run_jobs(p, &p->workers[0]);
    pthread_mutex_lock(&p->lock);
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

static int workers_start(struct packer *p)
{
    p->workers = rt_calloc((size_t)p->nworkers, sizeof(struct worker), "workers");
    if (!p->workers)
        return -ENOMEM;
    for (int i = 0; i < p->nworkers; i++) {
        struct worker *w = &p->workers[i];
        w->p = p;
        w->zc = ZSTD_createCCtx();
        w->tjc = tjInitCompress();
        w->tjd = tjInitDecompress();
        w->raw = rt_malloc(p->rec_bytes * p->block_records, "block buffer");
        w->hwc = rt_malloc(p->rec_bytes, "pixel buffer");
        w->dec = rt_malloc(p->rec_bytes, "pixel buffer");
        if (!w->zc || !w->tjc || !w->tjd || !w->raw || !w->hwc || !w->dec)
            return rt_errf(-ENOMEM, "out of memory starting pack workers");
        if (i > 0) {
            int e = pthread_create(&w->thread, NULL, worker_main, w);
            if (e)
                return rt_errf(-e, "cannot start a pack worker thread: %s", strerror(e));
            w->started = 1;
        }
    }
    return 0;
}

static void workers_stop(struct packer *p)
{
    if (!p->workers)
        return;
    pthread_mutex_lock(&p->lock);
    p->quit = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nworkers; i++) {
        struct worker *w = &p->workers[i];
        if (w->started)
            pthread_join(w->thread, NULL);
        ZSTD_freeCCtx(w->zc);
        if (w->tjc)
            tjDestroy(w->tjc);
        if (w->tjd)
            tjDestroy(w->tjd);
        free(w->raw);
        free(w->hwc);
        free(w->dec);
    }
    free(p->workers);
    p->workers = NULL;
}

/* ---- writing shards (calling thread) --------------------------------------------- */

static int grow(void **buf, uint64_t *cap, uint64_t need, size_t elem, const char *what)
{
    if (need <= *cap)
        return 0;
    uint64_t ncap = RT_MAX(need, *cap * 2);
    void *nb = rt_realloc(*buf, ncap * elem, what);
    if (!nb)
        return -ENOMEM;
    *buf = nb;
    *cap = ncap;
    return 0;
}

static int write_hashed(int fd, XXH64_state_t *st, const void *buf, size_t len, const char *path)
{
    XXH64_update(st, buf, len);
    return rt_write_full(fd, buf, len, path);
}

/* Writes the accumulated blocks as one shard file. */
static int shard_flush(struct packer *p, struct shard_writer *sw)
{
    struct rt_shard_header h = {0};
    uint8_t hdr[RT_SHARD_HEADER_SIZE];
    uint8_t *meta = NULL;
    char name[64], path[4200];
    XXH64_state_t *st = NULL;
    int fd = -1, rc;

    if (sw->nblocks == 0)
        return 0;
    snprintf(name, sizeof(name), "%s-%05" PRIu32 ".rts", rt_split_name(sw->split), sw->shard_no);
    snprintf(path, sizeof(path), "%s/%s", p->tmpdir, name);

    h.codec = p->codec;
    h.compression = p->codec == RT_CODEC_RAW ? RT_COMPRESSION_ZSTD : RT_COMPRESSION_NONE;
    h.split = sw->split;
    h.channels = p->info->channels;
    h.height = p->info->height;
    h.width = p->info->width;
    h.num_classes = p->info->num_classes;
    h.record_count = sw->nrec;
    h.first_record = sw->first_record;
    h.block_count = sw->nblocks;
    h.labels_offset = RT_SHARD_HEADER_SIZE;
    h.index_offset = (h.labels_offset + 4 * sw->nrec + 7) & ~(uint64_t)7;
    h.data_offset = h.index_offset + (uint64_t)RT_BLOCK_ENTRY_SIZE * sw->nblocks;
    h.file_size = h.data_offset + sw->data_len;

    /* Labels, padding and index as one buffer laid out as in the file. */
    size_t meta_len = h.data_offset - h.labels_offset;
    meta = rt_calloc(1, meta_len, "shard index");
    if (!meta)
        return -ENOMEM;
    for (uint64_t i = 0; i < sw->nrec; i++)
        rt_put32(meta + 4 * i, (uint32_t)sw->labels[i]);
    uint8_t *index = meta + (h.index_offset - h.labels_offset);
    for (uint32_t b = 0; b < sw->nblocks; b++) {
        struct rt_block_entry e = sw->blocks[b];
        e.offset += h.data_offset;
        rt_block_entry_encode(&e, index + (size_t)RT_BLOCK_ENTRY_SIZE * b);
    }
    h.labels_xxh64 = XXH64(meta, 4 * sw->nrec, 0);
    h.index_xxh64 = XXH64(index, (size_t)RT_BLOCK_ENTRY_SIZE * sw->nblocks, 0);
    rt_shard_header_encode(&h, hdr);

    st = XXH64_createState();
    if (!st) {
        rc = rt_errf(-ENOMEM, "out of memory");
        goto out;
    }
    XXH64_reset(st, 0);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = rt_errf(-errno, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    if ((rc = write_hashed(fd, st, hdr, sizeof(hdr), path)) < 0 ||
        (rc = write_hashed(fd, st, meta, meta_len, path)) < 0 ||
        (rc = write_hashed(fd, st, sw->data, sw->data_len, path)) < 0)
        goto out;
    if (fsync(fd) < 0) {
        rc = rt_errf(-errno, "%s: fsync failed: %s", path, strerror(errno));
        goto out;
    }
    rc = close(fd);
    fd = -1;
    if (rc < 0) {
        rc = rt_errf(-errno, "%s: close failed: %s", path, strerror(errno));
        goto out;
    }

    struct rt_shard_ref *refs = rt_realloc(sw->refs, (sw->nrefs + 1) * sizeof(*refs), "shard list");
    if (!refs) {
        rc = -ENOMEM;
        goto out;
    }
    sw->refs = refs;
    refs[sw->nrefs] = (struct rt_shard_ref){
        .file = strdup(name), .records = sw->nrec, .bytes = h.file_size,
        .xxh64 = XXH64_digest(st), .first_record = sw->first_record};
    if (!refs[sw->nrefs].file) {
        rc = rt_errf(-ENOMEM, "out of memory");
        goto out;
    }
    sw->nrefs++;
    p->stats.bytes_out += h.file_size;
    p->stats.shards++;
    sw->shard_no++;
    sw->first_record += sw->nrec;
    sw->nrec = 0;
    sw->nblocks = 0;
    sw->data_len = 0;
out:
    if (fd >= 0)
        close(fd);
    XXH64_freeState(st);
    free(meta);
    return rc;
}

static int shard_add_block(struct packer *p, struct shard_writer *sw, struct block_job *j)
{
    int rc;

    if (sw->nblocks > 0 && sw->data_len + j->stored_len > p->shard_bytes && (rc = shard_flush(p, sw)) < 0)
        return rc;
    uint64_t bcap = sw->blocks_cap, dcap = sw->data_cap;
    if ((rc = grow((void **)&sw->blocks, &bcap, sw->nblocks + 1, sizeof(*sw->blocks), "block index")) < 0 ||
        (rc = grow((void **)&sw->labels, &sw->labels_cap, sw->nrec + j->count, sizeof(int32_t), "labels")) < 0 ||
        (rc = grow((void **)&sw->data, &dcap, sw->data_len + j->stored_len, 1, "shard data")) < 0)
        return rc;
    sw->blocks_cap = (uint32_t)bcap;
    sw->data_cap = dcap;
    sw->blocks[sw->nblocks++] = (struct rt_block_entry){
        .offset = sw->data_len, .stored_size = j->stored_len, .raw_size = j->raw_size,
        .first_record = (uint32_t)sw->nrec, .record_count = j->count,
        .xxh64 = j->xxh64};
    memcpy(sw->data + sw->data_len, j->stored, j->stored_len);
    sw->data_len += j->stored_len;
    for (uint32_t r = 0; r < j->count; r++)
        sw->class_counts[j->labels[r]]++;
    memcpy(sw->labels + sw->nrec, j->labels, j->count * sizeof(int32_t));
    sw->nrec += j->count;
    return 0;
}

static void writer_free(struct shard_writer *sw)
{
    for (uint32_t i = 0; i < sw->nrefs; i++)
        free((char *)sw->refs[i].file);
    free(sw->refs);
    free(sw->data);
    free(sw->blocks);
    free(sw->labels);
    free(sw->class_counts);
}

/* Encodes and writes one output split, group of blocks by group of blocks. */
static int pack_split(struct packer *p, struct shard_writer *sw)
{
    const struct split_plan *pl = &p->plan[sw->split];
    const uint32_t group = (uint32_t)p->nworkers * 4;
    int rc = 0;

    for (uint64_t pos = 0; pos < pl->count && rc == 0;) {
        p->njobs = 0;
        for (uint32_t g = 0; g < group && pos < pl->count; g++) {
            struct block_job *j = &p->jobs[p->njobs++];
            uint32_t n = (uint32_t)RT_MIN((uint64_t)p->block_records, pl->count - pos);
            *j = (struct block_job){.split = sw->split, .first = pos, .count = n, .labels = j->labels};
            pos += n;
        }
        run_group(p);
        for (uint32_t i = 0; i < p->njobs; i++) {
            struct block_job *j = &p->jobs[i];
            if (rc == 0 && j->rc < 0)
                rc = rt_errf(j->rc, "%s", j->err);
            if (rc == 0)
                rc = shard_add_block(p, sw, j);
            /* Integer sums: the order blocks finish in cannot change the result. */
            for (uint32_t c = 0; rc == 0 && c < p->info->channels; c++) {
                p->px_sum[c] += j->px_sum[c];
                p->px_sq[c] += j->px_sq[c];
            }
            free(j->stored);
            j->stored = NULL;
            p->stats.records += rc == 0 ? j->count : 0;
        }
        if (rc == 0 && p->o->progress) {
            struct rt_pack_progress pr = {p->stats.records, p->total_records,
                                          p->stats.records * p->rec_bytes, p->stats.bytes_out,
                                          (double)(rt_now_ns() - p->t0) * 1e-9};
            p->o->progress(p->o->progress_ctx, &pr);
        }
    }
    if (rc == 0)
        rc = shard_flush(p, sw);
    return rc;
}

/* ---- planning and installing ------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Decides which source records go to which output split. */
static int make_plan(struct packer *p)
{
    const struct rt_source_info *in = p->info;
    double f = p->o->val_split;
    uint64_t ntrain = in->count[RT_SPLIT_TRAIN];

    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        p->plan[sp] = (struct split_plan){(enum rt_split)sp, NULL, in->count[sp]};
    if (f <= 0)
        return 0;
    if (in->count[RT_SPLIT_VAL])
        return rt_errf(-EINVAL, "the input already has a validation split (%" PRIu64 " records); --val-split "
                       "would carve a second one", in->count[RT_SPLIT_VAL]);
    uint64_t nval = (uint64_t)llround(f * (double)ntrain);
    nval = RT_MAX(nval, 1);
    if (nval >= ntrain)
        return rt_errf(-EINVAL, "--val-split %g leaves no training records (%" PRIu64 " in all)", f, ntrain);

    /* Seeded partial Fisher-Yates: the first nval positions are the val set. */
    uint64_t *perm = rt_malloc(ntrain * sizeof(uint64_t), "split permutation");
    uint64_t *val = rt_malloc(nval * sizeof(uint64_t), "val indices");
    uint64_t *train = rt_malloc((ntrain - nval) * sizeof(uint64_t), "train indices");
    uint8_t *is_val = rt_calloc(ntrain, 1, "split map");
    if (!perm || !val || !train || !is_val) {
        free(perm), free(val), free(train), free(is_val);
        return -ENOMEM;
    }
    struct rt_rng rng;
    rt_rng_init(&rng, p->o->split_seed, 0x76616c73706c6974ull /* "valsplit" */);
    for (uint64_t i = 0; i < ntrain; i++)
        perm[i] = i;
    for (uint64_t i = 0; i < nval; i++) {
        uint64_t j = i + rt_rng_u64(&rng) % (ntrain - i);
        uint64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        is_val[perm[i]] = 1;
    }
    memcpy(val, perm, nval * sizeof(uint64_t));
    qsort(val, nval, sizeof(uint64_t), cmp_u64);
    for (uint64_t i = 0, k = 0; i < ntrain; i++)
        if (!is_val[i])
            train[k++] = i;
    free(perm);
    free(is_val);
    p->plan[RT_SPLIT_TRAIN] = (struct split_plan){RT_SPLIT_TRAIN, train, ntrain - nval};
    p->plan[RT_SPLIT_VAL] = (struct split_plan){RT_SPLIT_TRAIN, val, nval};
    return 0;
}

static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *e;
    int empty = 1;

    if (!d)
        return 0;
    while (empty && (e = readdir(d)) != NULL)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* Refuses to clobber anything that is not an earlier dataset (and that only with force). */
static int check_outdir(const char *outdir, int force)
{
    struct stat st;
    char manifest[4200];

    if (stat(outdir, &st) < 0)
        return errno == ENOENT ? 0 : rt_errf(-errno, "%s: %s", outdir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return rt_errf(-EEXIST, "%s: exists and is not a directory", outdir);
    snprintf(manifest, sizeof(manifest), "%s/%s", outdir, RT_MANIFEST_NAME);
    if (stat(manifest, &st) == 0)
        return force ? 0 : rt_errf(-EEXIST, "%s: already holds a packed dataset; pass --force to replace it", outdir);
    if (!dir_is_empty(outdir))
        return rt_errf(-EEXIST, "%s: exists and is not empty (and is not a packed dataset); choose another --out",
                       outdir);
    return 0;
}

static int install(const char *tmpdir, const char *outdir)
{
    char old[4200];
    struct stat st;
    int rc;

    /* An empty directory the user made for us is simply replaced. */
    if (stat(outdir, &st) == 0 && dir_is_empty(outdir) && rmdir(outdir) < 0)
        return rt_errf(-errno, "%s: cannot replace the empty directory: %s", outdir, strerror(errno));
    if (stat(outdir, &st) == 0) {
        snprintf(old, sizeof(old), "%s.replaced", outdir);
        rt_remove_tree(old);
        if (rename(outdir, old) < 0)
            return rt_errf(-errno, "%s: cannot move the old dataset aside: %s", outdir, strerror(errno));
        if (rename(tmpdir, outdir) < 0) {
            rc = rt_errf(-errno, "%s: cannot rename to %s: %s", tmpdir, outdir, strerror(errno));
            rename(old, outdir);
            return rc;
        }
        rt_remove_tree(old);
    } else if (rename(tmpdir, outdir) < 0) {
        return rt_errf(-errno, "%s: cannot rename to %s: %s", tmpdir, outdir, strerror(errno));
    }
    char parent[4200];
    snprintf(parent, sizeof(parent), "%s/..", outdir);
    return rt_fsync_dir(parent);
}

static json_t *pack_params(const struct packer *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "codec", json_string(rt_codec_name(p->codec)));
    if (p->codec == RT_CODEC_RAW)
        json_object_set_new(o, "level", json_integer(p->level));
    else if (p->passthrough)
        json_object_set_new(o, "quality", json_string("passthrough"));
    else
        json_object_set_new(o, "quality", json_integer(p->quality));
    json_object_set_new(o, "block_records", json_integer(p->block_records));
    json_object_set_new(o, "shard_bytes", json_integer((json_int_t)p->shard_bytes));
    json_object_set_new(o, "val_split", json_real(p->o->val_split));
    json_object_set_new(o, "split_seed", json_integer((json_int_t)p->o->split_seed));
    json_object_set_new(o, "label", json_string(p->o->label == RT_LABEL_COARSE ? "coarse" : "fine"));
    return o;
}

/*
 * Mean and population standard deviation in 0..1 units from the exact sums
 * over n = records * H * W values per channel. n * sum(v^2) - sum(v)^2 is
 * formed in 128 bits, exactly, so only the final divisions and the square
 * root round.
 */
static void norm_stats(const struct packer *p, double *mean, double *std)
{
    const uint64_t n = p->plan[RT_SPLIT_TRAIN].count * (uint64_t)p->info->height * p->info->width;

    for (uint32_t c = 0; c < p->info->channels; c++) {
        unsigned __int128 var_n2 = (unsigned __int128)n * p->px_sq[c] - (unsigned __int128)p->px_sum[c] * p->px_sum[c];
        mean[c] = (double)p->px_sum[c] / ((double)n * 255.0);
        std[c] = sqrt((double)var_n2) / ((double)n * 255.0);
    }
}

static int write_manifest(struct packer *p, struct shard_writer *sw)
{
    struct rt_dataset_info info = {0};
    double mean[RT_MAX_CHANNELS], std[RT_MAX_CHANNELS];
    const int have_norm = p->plan[RT_SPLIT_TRAIN].count > 0;
    char path[4200];
    int rc;

    info.source = p->info->kind;
    info.codec = p->codec;
    info.channels = p->info->channels;
    info.height = p->info->height;
    info.width = p->info->width;
    info.num_classes = p->info->num_classes;
    info.class_names = (const char *const *)p->info->class_names;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        info.split[sp] = (struct rt_split_info){p->plan[sp].count, sw[sp].nrefs, sw[sp].refs, sw[sp].class_counts};
    if (have_norm)
        norm_stats(p, mean, std);
    json_t *params = pack_params(p);
    char *text = rt_manifest_dump(&info, have_norm ? mean : NULL, have_norm ? std : NULL, params);
    json_decref(params);
    if (!text)
        return -ENOMEM;
    size_t len = strlen(text);
    char *nl = rt_realloc(text, len + 2, "manifest");
    if (!nl) {
        free(text);
        return -ENOMEM;
    }
    nl[len] = '\n';
    nl[len + 1] = '\0';
    snprintf(path, sizeof(path), "%s/%s", p->tmpdir, RT_MANIFEST_NAME);
    rc = rt_file_write_atomic(path, nl, len + 1);
    free(nl);
    return rc;
}

int rt_pack(const char *input, const char *outdir, const struct rt_pack_opts *opts, struct rt_pack_stats *stats)
{
    struct packer p = {0};
    struct rt_source *src = NULL;
    struct shard_writer sw[RT_SPLIT_COUNT] = {{0}};
    int rc;
    size_t olen = strlen(outdir);

    while (olen > 1 && outdir[olen - 1] == '/')
        olen--;
    p.o = opts;
    p.t0 = rt_now_ns();
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.start, NULL);
    pthread_cond_init(&p.done, NULL);
    if (opts->codec != RT_CODEC_RAW && opts->codec != RT_CODEC_JPEG)
        return rt_errf(-EINVAL, "unknown codec");
    if (opts->quality < 0 || opts->quality > 100)
        return rt_errf(-EINVAL, "--quality %d out of range [1, 100]", opts->quality);
    if (opts->level < 0 || opts->level > ZSTD_maxCLevel())
        return rt_errf(-EINVAL, "--level %d out of range [1, %d]", opts->level, ZSTD_maxCLevel());
    if (!(opts->val_split >= 0 && opts->val_split < 1))
        return rt_errf(-EINVAL, "--val-split %g out of range [0, 1)", opts->val_split);
    if (olen >= 4000)
        return rt_errf(-ENAMETOOLONG, "%s: path too long", outdir);
    char out[4000];
    snprintf(out, sizeof(out), "%.*s", (int)olen, outdir);
    snprintf(p.tmpdir, sizeof(p.tmpdir), "%s.partial", out);

    if ((rc = check_outdir(out, opts->force)) < 0)
        return rc;
    if ((rc = rt_source_open(input, opts->label, &src)) < 0)
        return rc;
    p.src = src;
    p.info = rt_source_info(src);
    p.codec = opts->codec;
    p.level = opts->level ? opts->level : DEFAULT_LEVEL;
    p.passthrough = p.codec == RT_CODEC_JPEG && opts->quality == 0 && !strcmp(p.info->kind, "image-folder");
    p.quality = opts->quality ? opts->quality : DEFAULT_QUALITY;
    p.rec_bytes = (uint64_t)p.info->channels * p.info->height * p.info->width;
    p.block_records = opts->block_records
                          ? opts->block_records
                          : (uint32_t)RT_MAX((uint64_t)1, DEFAULT_BLOCK_PIXELS / p.rec_bytes);
    if (p.codec == RT_CODEC_RAW && p.rec_bytes * p.block_records > RT_MAX_BLOCK_RAW) {
        rc = rt_errf(-EINVAL, "--block-records %" PRIu32 " makes %" PRIu64 "-byte blocks; the limit is %u",
                     p.block_records, p.rec_bytes * p.block_records, RT_MAX_BLOCK_RAW);
        goto out;
    }
    p.shard_bytes = opts->shard_bytes ? opts->shard_bytes : DEFAULT_SHARD_BYTES;
    p.nworkers = opts->threads > 0 ? opts->threads : rt_cpus_available();
    snprintf(p.stats.source, sizeof(p.stats.source), "%s", p.info->kind);
    if ((rc = make_plan(&p)) < 0)
        goto out;
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        p.total_records += p.plan[sp].count;
        p.stats.split_records[sp] = p.plan[sp].count;
    }

    struct stat st;
    if (stat(p.tmpdir, &st) == 0) {
        rt_info("removing %s left by an interrupted pack", p.tmpdir);
        rt_remove_tree(p.tmpdir);
    }
    if ((rc = rt_mkdirs(p.tmpdir, 0755)) < 0)
        goto out;
    p.jobs = rt_calloc((size_t)p.nworkers * 4, sizeof(struct block_job), "block jobs");
    if (!p.jobs) {
        rc = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < p.nworkers * 4; i++)
        if (!(p.jobs[i].labels = rt_malloc(p.block_records * sizeof(int32_t), "block labels"))) {
            rc = -ENOMEM;
            goto out;
        }
    if ((rc = workers_start(&p)) < 0)
        goto out;
    for (int sp = 0; sp < RT_SPLIT_COUNT && rc == 0; sp++) {
        sw[sp].split = (enum rt_split)sp;
        sw[sp].class_counts = rt_calloc(p.info->num_classes, sizeof(uint64_t), "class counts");
        if (!sw[sp].class_counts)
            rc = -ENOMEM;
        else
            rc = pack_split(&p, &sw[sp]);
    }
    if (rc == 0)
        rc = write_manifest(&p, sw);
    if (rc == 0)
        rc = rt_fsync_dir(p.tmpdir);
    if (rc == 0)
        rc = install(p.tmpdir, out);
    p.stats.bytes_in = p.stats.records * p.rec_bytes;
    p.stats.seconds = (double)(rt_now_ns() - p.t0) * 1e-9;
    if (rc == 0 && stats)
        *stats = p.stats;
out:
    workers_stop(&p);
    if (rc < 0 && p.tmpdir[0]) {
        /* Keep the message: cleanup may overwrite it. */
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", rt_errmsg());
        rt_remove_tree(p.tmpdir);
        rt_errf(rc, "%s", msg);
    }
    if (p.jobs)
        for (int i = 0; i < p.nworkers * 4; i++)
            free(p.jobs[i].labels);
    free(p.jobs);
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        writer_free(&sw[sp]);
        free(p.plan[sp].index);
    }
    rt_source_close(src);
    pthread_mutex_destroy(&p.lock);
    pthread_cond_destroy(&p.start);
    pthread_cond_destroy(&p.done);
    return rc;
}
