/*
 * decode.c - turns a block's stored bytes back into CHW uint8 records:
 * checksum first, then zstd (raw codec) or TurboJPEG (jpeg codec). Also the
 * JPEG helpers that pack uses to encode. One rt_decoder per thread; nothing
 * here is shared between threads.
 *
 * While a trace records, each decoded block leaves its stages as spans on
 * the calling thread's track ("checksum", "decompress", "decode"), timed by
 * the same clock readings that feed rt_decode_times.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zstd.h>

#include <jpeglib.h>
#include <jerror.h>

#include "common/common.h"
#include "common/trace.h"
#include "loader/codec.h"
#include "loader/format.h"
#include "loader/loader.h"

struct rt_decoder {
    ZSTD_DCtx *zstd;
    tjhandle tj;
    uint8_t *scratch; /* decompressed JPEG payloads and HWC pixels */
    size_t scratch_len;
    struct rt_decode_times t;
};

void rt_decoder_times(const struct rt_decoder *d, struct rt_decode_times *t) { *t = d->t; }

int rt_decoder_create(struct rt_decoder **out)
{
    struct rt_decoder *d = rt_calloc(1, sizeof(*d), "decoder");
    if (!d)
        return -ENOMEM;
    d->zstd = ZSTD_createDCtx();
    d->tj = tjInitDecompress();
    if (!d->zstd || !d->tj) {
        rt_decoder_destroy(d);
        return rt_errf(-ENOMEM, "cannot create zstd/TurboJPEG decoder contexts");
    }
    *out = d;
    return 0;
}

void rt_decoder_destroy(struct rt_decoder *d)
{
    if (!d)
        return;
    ZSTD_freeDCtx(d->zstd);
    if (d->tj)
        tjDestroy(d->tj);
    free(d->scratch);
    free(d);
}

static int scratch_reserve(struct rt_decoder *d, size_t n)
{
    if (d->scratch_len >= n)
        return 0;
    uint8_t *p = rt_realloc(d->scratch, n, "decoder scratch");
    if (!p)
        return -ENOMEM;
    d->scratch = p;
    d->scratch_len = n;
    return 0;
}

/*
 * 1 when the TurboJPEG call that just returned -1 only warned, about damage
 * other than the data ending early: libjpeg decoded through it, as Pillow
 * does, and pack stored such a file and listed it in the manifest. The end
 * of the data is told by libjpeg's own wording of JWRN_JPEG_EOF, the only
 * way TurboJPEG names its warnings.
 */
static int tj_warned_only(tjhandle tj)
{
    struct jpeg_error_mgr e;

    if (tjGetErrorCode(tj) != TJERR_WARNING)
        return 0;
    jpeg_std_error(&e);
    return strcmp(tjGetErrorStr2(tj), e.jpeg_message_table[JWRN_JPEG_EOF]) != 0;
}

int rt_jpeg_probe(tjhandle tj, const uint8_t *jpeg, size_t len, const char *name, uint32_t *width,
                  uint32_t *height, int *gray)
{
    int w = 0, h = 0, subsamp, colorspace = 0;

    if (len > (size_t)0x7fffffff ||
        (tjDecompressHeader3(tj, jpeg, (unsigned long)len, &w, &h, &subsamp, &colorspace) < 0 &&
         !tj_warned_only(tj)))
        return rt_errf(-EBADMSG, "%s: not a readable JPEG: %s", name, tjGetErrorStr2(tj));
    if (w <= 0 || h <= 0 || w > (int)RT_MAX_DIM || h > (int)RT_MAX_DIM)
        return rt_errf(-EBADMSG, "%s: JPEG size %dx%d out of range", name, w, h);
    *width = (uint32_t)w;
    *height = (uint32_t)h;
    *gray = colorspace == TJCS_GRAY;
    return 0;
}

int rt_jpeg_decode_chw(tjhandle tj, const uint8_t *jpeg, size_t len, uint32_t c, uint32_t h,
                       uint32_t w, uint8_t *out, uint8_t *hwc, const char *name)
{
    uint32_t jw = 0, jh = 0;
    int gray, rc;
    const size_t plane = (size_t)h * w;

    rc = rt_jpeg_probe(tj, jpeg, len, name, &jw, &jh, &gray);
    if (rc < 0)
        return rc;
    if (jw != w || jh != h)
        return rt_errf(-EBADMSG, "%s: JPEG is %" PRIu32 "x%" PRIu32 ", expected %" PRIu32 "x%" PRIu32,
                       name, jw, jh, w, h);
    if (c == 1) {
        /* Gray output from any JPEG: TurboJPEG converts colour to luma. */
        if (tjDecompress2(tj, jpeg, (unsigned long)len, out, (int)w, 0, (int)h, TJPF_GRAY, 0) < 0 &&
            !tj_warned_only(tj))
            return rt_errf(-EBADMSG, "%s: JPEG decode failed: %s", name, tjGetErrorStr2(tj));
        return 0;
    }
    if (tjDecompress2(tj, jpeg, (unsigned long)len, hwc, (int)w, 0, (int)h, TJPF_RGB, 0) < 0 &&
        !tj_warned_only(tj))
        return rt_errf(-EBADMSG, "%s: JPEG decode failed: %s", name, tjGetErrorStr2(tj));
    for (size_t i = 0; i < plane; i++) {
        out[i] = hwc[3 * i];
        out[plane + i] = hwc[3 * i + 1];
        out[2 * plane + i] = hwc[3 * i + 2];
    }
    return 0;
}

int rt_jpeg_encode_chw(tjhandle tj, const uint8_t *chw, uint32_t c, uint32_t h, uint32_t w,
                       int quality, uint8_t *hwc, uint8_t **jpeg, size_t *len)
{
    const size_t plane = (size_t)h * w;
    unsigned long size = 0;
    const uint8_t *src = chw;
    int pf = TJPF_GRAY, samp = TJSAMP_GRAY;

    *jpeg = NULL;
    if (c == 3) {
        for (size_t i = 0; i < plane; i++) {
            hwc[3 * i] = chw[i];
            hwc[3 * i + 1] = chw[plane + i];
            hwc[3 * i + 2] = chw[2 * plane + i];
        }
        src = hwc;
        pf = TJPF_RGB;
        samp = TJSAMP_444;
    } else if (c != 1) {
        return rt_errf(-EINVAL, "JPEG encoding needs 1 or 3 channels, not %" PRIu32, c);
    }
    if (tjCompress2(tj, src, (int)w, 0, (int)h, pf, jpeg, &size, samp, quality, 0) < 0) {
        int rc = rt_errf(-EIO, "JPEG encode failed: %s", tjGetErrorStr2(tj));
        if (*jpeg)
            tjFree(*jpeg);
        *jpeg = NULL;
        return rc;
    }
    *len = size;
    return 0;
}

/* Splits a JPEG block payload into records and decodes each into `out`. */
static int decode_jpeg_payload(struct rt_decoder *d, const struct rt_shard_header *h,
                               const struct rt_block_entry *e, uint32_t block, const uint8_t *payload,
                               uint8_t *out, uint8_t *hwc, const char *name)
{
    const uint64_t rec_bytes = rt_record_bytes(h);
    char where[512];
    int rc = rt_jpeg_block_check(h, e, block, payload, name);

    for (uint32_t r = 0; rc == 0 && r < e->record_count; r++) {
        struct rt_jpeg_record rec;
        rt_jpeg_block_record(h, e, payload, r, &rec);
        snprintf(where, sizeof(where), "%s: block %" PRIu32 ": record %" PRIu64, name, block,
                 h->first_record + e->first_record + r);
        rc = rt_jpeg_decode_chw(d->tj, rec.data, rec.len, h->channels, h->height, h->width, out + rec_bytes * r,
                                hwc, where);
    }
    return rc;
}

/* The stored bytes against the index's checksum. */
static int block_checksum(const struct rt_shard_header *h, const struct rt_block_entry *e, uint32_t block,
                          const void *stored, const char *name)
{
    if (XXH64(stored, e->stored_size, 0) != e->xxh64)
        return rt_errf(-EBADMSG, "%s: block %" PRIu32 " (offset %" PRIu64 ", %" PRIu32
                       " bytes, records %" PRIu64 "..%" PRIu64 "): checksum mismatch, the block is corrupt",
                       name, block, e->offset, e->stored_size, h->first_record + e->first_record,
                       h->first_record + e->first_record + e->record_count - 1);
    return 0;
}

/* A JPEG block's payload: `stored`, or inflated into d->scratch + skip when zstd-compressed. */
static int jpeg_payload(struct rt_decoder *d, const struct rt_shard_header *h, const struct rt_block_entry *e,
                        uint32_t block, const void *stored, size_t skip, const uint8_t **payload, const char *name)
{
    *payload = stored;
    if (h->compression != RT_COMPRESSION_ZSTD)
        return 0;
    int rc = scratch_reserve(d, skip + e->raw_size);
    if (rc < 0)
        return rc;
    size_t n = ZSTD_decompressDCtx(d->zstd, d->scratch + skip, e->raw_size, stored, e->stored_size);
    if (ZSTD_isError(n) || n != e->raw_size)
        return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": zstd: %s", name, block,
                       ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong decompressed size");
    *payload = d->scratch + skip;
    return 0;
}

int rt_block_payload(struct rt_decoder *d, const struct rt_shard_header *h, const struct rt_block_entry *e,
                     uint32_t block, const void *stored, uint8_t *out, const char *name)
{
    const uint8_t *payload;
    const uint64_t t0 = rt_now_ns();
    int rc;

    if (h->codec != RT_CODEC_JPEG)
        return rt_errf(-EINVAL, "%s: block %" PRIu32 ": only JPEG blocks are kept undecoded", name, block);
    rc = block_checksum(h, e, block, stored, name);
    const uint64_t t1 = rt_now_ns();
    d->t.checksum_ns += t1 - t0;
    if (rc == 0)
        rc = jpeg_payload(d, h, e, block, stored, 0, &payload, name);
    if (rc == 0)
        rc = rt_jpeg_block_check(h, e, block, payload, name);
    if (rc == 0) {
        memcpy(out, payload, e->raw_size);
        /* Kept as JPEG: the records are decoded (and counted) per sample, cropped. */
        d->t.decompress_ns += rt_now_ns() - t1;
        if (rt_trace_live())
            rt_trace_span(RT_TRACE_LOADER, "checksum", NULL, t0, t1);
    }
    return rc;
}

int rt_jpeg_record_decode(struct rt_decoder *d, const struct rt_shard_header *h, const struct rt_jpeg_record *rec,
                          uint8_t *out, const char *where)
{
    int rc = scratch_reserve(d, (size_t)h->channels * rec->height * rec->width);
    if (rc < 0)
        return rc;
    return rt_jpeg_decode_chw(d->tj, rec->data, rec->len, h->channels, rec->height, rec->width, out, d->scratch,
                              where);
}

int rt_block_decode(struct rt_decoder *d, const struct rt_shard_header *h,
                    const struct rt_block_entry *e, uint32_t block, const void *stored, uint8_t *out,
                    const char *name)
{
    const uint64_t rec_bytes = rt_record_bytes(h);
    const uint8_t *payload;
    uint8_t *hwc;
    uint64_t t0 = rt_now_ns(), t1, t2;
    int rc;

    if (rt_shard_variable(h))
        return rt_errf(-EINVAL, "%s: block %" PRIu32 ": variable-size records are cropped at load time, not "
                       "decoded whole (rt_block_payload)", name, block);
    if ((rc = block_checksum(h, e, block, stored, name)) < 0)
        return rc;
    t1 = rt_now_ns();
    d->t.checksum_ns += t1 - t0;
    if (h->codec == RT_CODEC_RAW) {
        unsigned long long content = ZSTD_getFrameContentSize(stored, e->stored_size);
        if (content != e->raw_size)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": zstd frame declares %llu bytes, index says %"
                           PRIu32, name, block, content, e->raw_size);
        size_t n = ZSTD_decompressDCtx(d->zstd, out, e->raw_size, stored, e->stored_size);
        if (ZSTD_isError(n))
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": zstd: %s", name, block, ZSTD_getErrorName(n));
        if (n != e->raw_size)
            return rt_errf(-EBADMSG, "%s: block %" PRIu32 ": decompressed to %zu bytes, expected %" PRIu32,
                           name, block, n, e->raw_size);
        t2 = rt_now_ns();
        d->t.decompress_ns += t2 - t1;
        d->t.raw_bytes += e->raw_size;
        d->t.records += e->record_count;
        if (rt_trace_live()) {
            rt_trace_span(RT_TRACE_LOADER, "checksum", NULL, t0, t1);
            rt_trace_span(RT_TRACE_LOADER, "decompress", NULL, t1, t2);
        }
        return 0;
    }

    /* JPEG: scratch holds the decompressed payload (if zstd) then HWC pixels. */
    if ((rc = scratch_reserve(d, (size_t)rec_bytes)) < 0 ||
        (rc = jpeg_payload(d, h, e, block, stored, (size_t)rec_bytes, &payload, name)) < 0)
        return rc;
    hwc = d->scratch;
    t2 = rt_now_ns();
    d->t.decompress_ns += t2 - t1;
    rc = decode_jpeg_payload(d, h, e, block, payload, out, hwc, name);
    const uint64_t t3 = rt_now_ns();
    d->t.decode_ns += t3 - t2;
    if (rc == 0) {
        if (h->compression == RT_COMPRESSION_ZSTD)
            d->t.raw_bytes += e->raw_size;
        d->t.records += e->record_count;
    }
    if (rc == 0 && rt_trace_live()) {
        rt_trace_span(RT_TRACE_LOADER, "checksum", NULL, t0, t1);
        if (h->compression == RT_COMPRESSION_ZSTD)
            rt_trace_span(RT_TRACE_LOADER, "decompress", NULL, t1, t2);
        rt_trace_span(RT_TRACE_LOADER, "decode", NULL, t2, t3);
    }
    return rc;
}
