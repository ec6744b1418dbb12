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
 * codec; for variable-size records, each stored image whole), so they are
 * exact and the same for any thread count.
 *
 * Image folders hold any mix of sizes and formats (imgfile.h). Each image
 * is stored at its own size when all are alike, resized with --size
 * (resize.h, one of three fits), or -- --max-side, jpeg codec -- kept at its
 * own size as a JPEG (the original bytes when it already is a small enough
 * RGB or gray JPEG) for the loader to crop at load time. A file that is no
 * usable image stops the pack naming it, or with --skip-bad is left out of
 * its block and listed in the manifest; blocks simply hold fewer records,
 * so what is written still depends only on the input and the options. A
 * JPEG that libjpeg decodes through a warning (damage other than an early
 * end, which Pillow reads too) is kept, stored as Pillow reads it, and
 * listed in the manifest with the warning.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
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
#include "loader/imgfile.h"
#include "loader/manifest.h"
#include "loader/offline.h"
#include "loader/resize.h"
#include "loader/source.h"

#define DEFAULT_SHARD_BYTES ((uint64_t)64 << 20)
#define DEFAULT_BLOCK_PIXELS (128u << 10)
#define DEFAULT_QUALITY 90
/*
 * zstd level 1. On 224-pixel crops of photographs level 3 stores 4.7 % less (1.149 : 1 against 1.096 : 1) for
 * three times the CPU (141 against 450 MB/s on one thread: some 1.1 ms a record, near the 1.3 ms of decoding the
 * JPEG it came from) and decompresses slower at load time (1,085 against 1,420 MB/s); pack --size 224 of 300
 * photos (bench/make_photo_folder.py) ran at 595 images/s with it, 850 without.
 */
#define DEFAULT_LEVEL 1
/* Variable-size records: a block of 16 photos at --max-side 512 is about 1 MiB, one read. */
#define DEFAULT_VAR_BLOCK_RECORDS 16u

/* How an image folder's pictures become records. */
enum image_mode {
    MODE_OWN = 0,  /* stored at their own size, which must be the same for all */
    MODE_SIZE,     /* resized to --size */
    MODE_VARIABLE, /* each its own size, at most --max-side (jpeg) */
};

/* Where one output split's records come from. */
struct split_plan {
    enum rt_split from;     /* source split */
    uint64_t *index;        /* source indices in output order, or NULL = 0..count-1 */
    uint64_t count;
};

/* A file of a block left out (--skip-bad), or kept though its decoder warned (why = RT_IMG_OK). */
struct job_skip {
    uint32_t r;             /* record within the block's plan range */
    enum rt_img_bad why;
    char detail[512];       /* the error, or the warning */
};

struct block_job {
    enum rt_split split;
    uint64_t first;         /* position in the split plan */
    uint32_t count;         /* records planned */
    uint32_t kept;          /* records written: count less the skipped */
    uint8_t *stored;        /* malloc'd encoded bytes */
    uint32_t stored_len, raw_size;
    uint64_t xxh64;         /* of the stored bytes, computed by the worker */
    int32_t *labels;        /* kept */
    uint32_t *sizes;        /* variable-size records: height << 16 | width, kept */
    struct job_skip *skips; /* nskips, grown as needed */
    uint32_t nskips, skips_cap;
    struct job_skip *warns; /* files decoded through a libjpeg warning: nwarns, grown as needed */
    uint32_t nwarns, warns_cap;
    uint64_t bytes_in;      /* decoded pixel bytes */
    uint64_t passthrough;   /* JPEG files stored as they were */
    uint64_t scaled[4];     /* JPEGs decoded at 1/2, 1/4, 1/8 (index log2 of the scale's denominator) */
    /* Training split only: per-channel sums of v and v^2 over the decoded pixels, and their count. */
    uint64_t px_sum[RT_MAX_CHANNELS], px_sq[RT_MAX_CHANNELS], px_n;
    int rc;
    char err[1024];
};

struct worker {
    ZSTD_CCtx *zc;
    tjhandle tjc, tjd;
    struct rt_imgdec *img;
    struct rt_resizer *rs;
    uint8_t *raw;           /* block_records * record bytes */
    uint8_t *hwc;           /* one record, interleaved */
    uint8_t *dec;           /* one record decoded back from its JPEG (statistics) */
    uint8_t *data;          /* JPEG block: the records' bytes, before the table goes in front */
    size_t data_cap;
    uint32_t *offs;         /* JPEG block: block_records + 1 offsets into data */
    uint8_t *small;         /* --max-side: one image resized, HWC */
    size_t small_cap;
    pthread_t thread;
    int started;
    struct packer *p;
};

struct shard_writer {
    enum rt_split split;
    uint32_t shard_no;
    uint64_t data_len;      /* the blocks' stored bytes */
    struct rt_block_entry *blocks;
    uint8_t **data;         /* per block: its stored bytes (malloc'd, owned) */
    uint32_t nblocks, blocks_cap;
    int32_t *labels;
    uint64_t nrec, labels_cap;
    uint64_t first_record;
    struct rt_shard_ref *refs;
    uint32_t nrefs;
    uint64_t *class_counts;
};

/*
 * A full shard on its way to disk. Its file is written, fsync'd and hashed on
 * a thread of its own while the workers -- the calling thread among them --
 * go on encoding the next shard's blocks: a compute thread that waited out
 * the write and the fsync left its CPU idle (on ext4, 2 CPUs: some 30 ms a
 * 64-MiB shard, 6-7 % of pack --size 224's time). At most one is in flight;
 * the next flush, the end of the pack and its error path wait for it. So
 * up to two shards of blocks are held: one being written, one filling.
 */
struct shard_file {
    pthread_t thread;
    int running;            /* handed over, not yet waited for */
    int threaded;           /* written on `thread` (else already written, by the calling thread) */
    char path[4200];
    uint8_t hdr[RT_SHARD_HEADER_SIZE];
    uint8_t *meta;          /* labels, padding and index, as in the file */
    size_t meta_len;
    uint8_t **data;         /* the blocks' stored bytes, in order (owned) */
    struct rt_block_entry *blocks;
    uint32_t nblocks;
    struct shard_writer *sw; /* whose refs[ref] gets the file's hash */
    uint32_t ref;
    uint64_t xxh64;
    int rc;
    int failed;             /* set (atomically) as soon as rc < 0: the pack stops without waiting for the next */
    char err[1024];
};

struct packer {
    const struct rt_pack_opts *o;
    const char *input;
    const struct rt_source *src;
    const struct rt_source_info *info;
    uint32_t c, h, w;       /* stored shape; h = w = 0 for variable-size records */
    enum image_mode mode;
    int folder;             /* the input is an image folder */
    struct split_plan plan[RT_SPLIT_COUNT];
    char tmpdir[4096];
    enum rt_codec codec;
    int quality, level, passthrough;
    uint32_t block_records;
    uint64_t shard_bytes;
    uint64_t rec_bytes;
    double scale_gap;       /* --size: how much larger than the record a reduced-scale decode stays (jpeg_plan) */

    /*
     * Worker pool: a split's blocks stream through a ring of njobs jobs. Workers (the calling thread
     * among them) take the next block while the ring has room; the calling thread writes finished
     * blocks in block order as they complete. All of it under lock.
     */
    int nworkers;
    struct worker *workers;
    pthread_mutex_t lock;
    pthread_cond_t start, done;
    int quit;
    struct block_job *jobs;
    uint8_t *job_done;      /* per ring slot: the block in it is encoded */
    uint32_t njobs;         /* ring slots */
    enum rt_split cur_split;
    uint64_t nblocks;       /* the split's blocks */
    uint64_t issued;        /* blocks handed to a worker */
    uint64_t retired;       /* blocks written (or given up on) by the calling thread */
    int halt;               /* hand out no more blocks of this split (an error) */

    struct rt_pack_stats stats;
    /* Sums of the training split's pixel values and their squares, per channel, and their count. */
    uint64_t px_sum[RT_MAX_CHANNELS], px_sq[RT_MAX_CHANNELS], px_n;
    uint64_t total_records;
    /* Variable-size records: every record's height << 16 | width (the manifest's summary). */
    uint32_t *all_sizes;
    uint64_t nsizes, sizes_cap;
    /* Files left out (--skip-bad), in record order. */
    json_t *skipped;
    uint64_t skipped_by[RT_IMG_BAD_COUNT];
    /* Files decoded through a libjpeg warning, in record order. */
    json_t *warned;
    uint64_t t0;
    struct shard_file flush; /* the shard being written, if flush.running */
};

/* ---- encoding one block (worker threads) ------------------------------------- */

/* n bytes of whole chunks of L bytes: a[k] += v, b[k] += v^2 for byte k of each chunk (L a constant once inlined). */
static inline __attribute__((always_inline)) void px_acc(const uint8_t *restrict px, size_t n, size_t L,
                                                         uint32_t *restrict a, uint32_t *restrict b)
{
    for (size_t i = 0; i < n; i += L)
        for (size_t k = 0; k < L; k++) {
            const uint16_t v = px[i + k];
            a[k] += v;
            b[k] += (uint16_t)(v * v); /* <= 65025: a 16-bit product, which SSE2 multiplies 8 at a time */
        }
}

/*
 * Adds the per-channel sums of v and v^2 of `pixels` interleaved pixels of c
 * channels (1..4) to sum[] and sq[]. The bytes are taken in chunks of 16
 * pixels, whose byte k always belongs to channel k % c, into 32-bit sums per
 * byte position that the compiler vectorises -- 7x the plain strided loop
 * (0.06 against 0.44 ms for a 500x375 RGB image), which took 17 % of pack
 * --max-side's time -- emptied into the 64-bit totals every 4096 chunks,
 * before 4096 * 255^2 can overflow them.
 */
static void px_stats(const uint8_t *px, size_t pixels, uint32_t c, uint64_t *sum, uint64_t *sq)
{
    const size_t L = 16 * (size_t)c, nb = pixels * c;
    size_t i = 0;

    while (nb - i >= L) {
        uint32_t a[16 * RT_MAX_CHANNELS] = {0}, b[16 * RT_MAX_CHANNELS] = {0};
        const size_t n = RT_MIN((nb - i) / L, (size_t)4096) * L;
        switch (c) {
        case 1:
            px_acc(px + i, n, 16, a, b);
            break;
        case 2:
            px_acc(px + i, n, 32, a, b);
            break;
        case 3:
            px_acc(px + i, n, 48, a, b);
            break;
        default:
            px_acc(px + i, n, L, a, b);
            break;
        }
        for (size_t k = 0; k < L; k++) {
            sum[k % c] += a[k];
            sq[k % c] += b[k];
        }
        i += n;
    }
    for (; i < nb; i++) {
        const uint32_t v = px[i];
        sum[i % c] += v;
        sq[i % c] += v * v;
    }
}

/* Adds an HWC image's per-channel sums of v and v^2 to the job's (training split only). */
static void norm_add_hwc(const struct packer *p, struct block_job *j, const uint8_t *px, size_t pixels)
{
    if (j->split != RT_SPLIT_TRAIN)
        return;
    px_stats(px, pixels, p->c, j->px_sum, j->px_sq);
    j->px_n += pixels;
}

/* The same for one CHW record. */
static void norm_add(const struct packer *p, struct block_job *j, const uint8_t *chw)
{
    const size_t plane = (size_t)p->h * p->w;

    if (j->split != RT_SPLIT_TRAIN)
        return;
    for (uint32_t c = 0; c < p->c; c++)
        px_stats(chw + c * plane, plane, 1, &j->px_sum[c], &j->px_sq[c]);
    j->px_n += plane;
}

/* Appends {r, why, detail} to a job's list. Returns 0 or -ENOMEM. */
static int job_note(struct job_skip **v, uint32_t *n, uint32_t *cap, uint32_t r, enum rt_img_bad why,
                    const char *detail)
{
    if (*n == *cap) {
        uint32_t ncap = *cap ? 2 * *cap : 4;
        struct job_skip *nv = rt_realloc(*v, ncap * sizeof(*nv), "listed files");
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = ncap;
    }
    struct job_skip *k = &(*v)[(*n)++];
    k->r = r;
    k->why = why;
    snprintf(k->detail, sizeof(k->detail), "%s", detail);
    return 0;
}

/*
 * A file that is no usable image (why != RT_IMG_OK; rc < 0 with the message
 * set): without --skip-bad the pack's error, with the way out named; with
 * it, an entry in the job's list and 1 (left out). Other errors (no memory,
 * an unreadable disk) stop the pack either way.
 */
static int bad_file(const struct packer *p, struct block_job *j, uint32_t r, enum rt_img_bad why, int rc)
{
    if (why == RT_IMG_OK)
        return rc;
    if (!p->o->skip_bad) {
        char msg[900];
        snprintf(msg, sizeof(msg), "%s", rt_errmsg());
        return rt_errf(rc, "%s (pass --skip-bad to leave out files that are no usable image and list them in "
                       "the manifest)", msg);
    }
    rc = job_note(&j->skips, &j->nskips, &j->skips_cap, r, why, rt_errmsg());
    return rc < 0 ? rc : 1;
}

/* An image file read and decoded: the file's bytes (caller frees) and the decoder's HWC pixels. */
struct image {
    uint8_t *file;
    size_t len;
    struct rt_img_info info;
    const uint8_t *px;      /* p->c channels, rows w * p->c bytes: the pixels of window `win` of the image */
    uint32_t w, h;          /* as decoded (after any EXIF rotation); the window's size */
    uint32_t fw, fh;        /* the full-size image as displayed */
    uint32_t denom;         /* decoded at 1/denom: 1, 2, 4 or 8 */
    uint32_t sw, sh;        /* the image at that scale, as displayed (w, h unless only a window was decoded) */
    struct rt_img_window win;
};

/*
 * How much larger than the output the source box must stay when a JPEG is
 * decoded at a reduced scale (libjpeg's scaled IDCT, 1/2 .. 1/8) before
 * pack --size resizes it. Measured on bench/make_image_folder.py's folder
 * against torchvision's Resize + CenterCrop of the full-size decode (Pillow
 * 9.4): at >= 3x every record stayed within tests/pack_folder_check.py's
 * bound (45 dB; 46 records at 64 px: 46.3 dB the lowest, 51.8 the mean),
 * at 2x..3x the lowest was 42.7 dB and below 2x 31.5 dB -- the scaled IDCT is
 * another low-pass filter than the triangle of the resize, which shows once
 * the resize has little left to do. (Pillow's own draft() stops at 1x.)
 * RT_PACK_SCALE_GAP overrides it for tests/pack_scaled_check.py, which shows
 * that a looser gap breaks the bound.
 */
#define SCALE_GAP 3.0

/* SCALE_GAP, or RT_PACK_SCALE_GAP's; read once per pack. */
static double scale_gap(void)
{
    const char *e = getenv("RT_PACK_SCALE_GAP");
    double g = e ? strtod(e, NULL) : 0;
    return g >= 1 ? g : SCALE_GAP;
}

/* Pixels kept around what the resize reads where a window ends inside the image: libjpeg's upsampling of
 * subsampled colour may treat a cropped column as an edge. */
#define WINDOW_MARGIN 16

/*
 * How much of a JPEG stored with --size to decode, into im->denom (and, for
 * such a JPEG, its displayed size into im->fw, im->fh; 0 otherwise). The IDCT
 * scale: the largest 1/k (k = 8, 4, 2) that leaves the part of the image the
 * record shows (fit's box) at least gap times the record's rectangle on both
 * sides, else 1. With --fit crop, *want: that box at that scale, with the
 * resize filter's reach and WINDOW_MARGIN around it. Returns 1 when a window
 * is worth asking for, 0 for the whole image (other files, modes and fits,
 * images the EXIF orientation turns, and boxes that are most of the image).
 */
static int jpeg_plan(const struct packer *p, struct image *im, struct rt_img_window *want)
{
    const struct rt_img_info *info = &im->info;
    im->denom = 1;
    if (p->mode != MODE_SIZE || info->format != RT_IMG_JPEG)
        return 0;
    const int turned = p->o->exif_rotate && info->orientation != 1;
    im->fw = p->o->exif_rotate && info->orientation >= 5 ? info->height : info->width;
    im->fh = p->o->exif_rotate && info->orientation >= 5 ? info->width : info->height;
    uint32_t rect[4], k = 8;
    struct rt_box box;
    rt_fit_geometry((enum rt_fit)p->o->fit, im->fw, im->fh, p->w, p->h, &box, rect);
    while (k > 1 && !(box.w / k >= p->scale_gap * rect[2] && box.h / k >= p->scale_gap * rect[3]))
        k /= 2;
    im->denom = k;
    if (p->o->fit != RT_FIT_CROP || turned)
        return 0;
    /* The box at 1/k; the triangle reaches about 1/scale + 1 pixels past it when shrinking. */
    const double bx = box.x / k, by = box.y / k, bw = box.w / k, bh = box.h / k;
    const double mx = ceil(bw / rect[2]) + 2 + WINDOW_MARGIN, my = ceil(bh / rect[3]) + 2 + WINDOW_MARGIN;
    const uint32_t sw = (im->fw + k - 1) / k, sh = (im->fh + k - 1) / k;
    const double x0 = RT_MAX(0.0, floor(bx - mx)), y0 = RT_MAX(0.0, floor(by - my));
    const double x1 = RT_MIN((double)sw, ceil(bx + bw + mx)), y1 = RT_MIN((double)sh, ceil(by + bh + my));
    *want = (struct rt_img_window){(uint32_t)x0, (uint32_t)y0, (uint32_t)(x1 - x0), (uint32_t)(y1 - y0)};
    /* Skipping less than a tenth of the pixels is not worth the narrower decode. */
    return (uint64_t)want->w * want->h * 10 < (uint64_t)sw * sh * 9;
}

/*
 * Reads and decodes `path`; a JPEG decoded through a libjpeg warning (as
 * Pillow reads it) is kept and noted in the job. Returns 0, 1 (a bad file
 * left out) or -errno.
 */
static int image_read(struct packer *p, struct worker *w, struct block_job *j, uint32_t r, const char *path,
                      struct image *im)
{
    enum rt_img_bad why = RT_IMG_OK;
    int rc;

    memset(im, 0, sizeof(*im));
    if ((rc = rt_file_read(path, &im->file, &im->len)) < 0)
        return rc;
    rc = rt_img_probe(im->file, im->len, path, &im->info, &why);
    if (rc == 0) {
        struct rt_img_window want;
        const int windowed = jpeg_plan(p, im, &want);
        rc = rt_img_decode_part(w->img, im->file, im->len, path, p->c, p->o->exif_rotate, im->denom,
                                windowed ? &want : NULL, &im->win, &im->px, &im->w, &im->h, &why);
    }
    if (rc < 0) {
        free(im->file);
        im->file = NULL;
        return bad_file(p, j, r, why, rc);
    }
    const char *warning = rt_imgdec_warning(w->img);
    if (warning[0] && (rc = job_note(&j->warns, &j->nwarns, &j->warns_cap, r, RT_IMG_OK, warning)) < 0) {
        free(im->file);
        im->file = NULL;
        return rc;
    }
    /* The image's size at the scale decoded (of which px may hold a window only); decoded whole, its own. */
    if (!im->fw) {
        im->fw = im->w;
        im->fh = im->h;
    }
    im->sw = (im->fw + im->denom - 1) / im->denom;
    im->sh = (im->fh + im->denom - 1) / im->denom;
    if (im->denom > 1)
        j->scaled[__builtin_ctz(im->denom)]++;
    j->bytes_in += (uint64_t)im->fw * im->fh * p->c;
    return 0;
}

/* Interleaved to planar. */
static void hwc_to_chw(const uint8_t *hwc, uint32_t c, uint32_t h, uint32_t w, uint8_t *chw)
{
    const size_t plane = (size_t)h * w;
    for (uint32_t k = 0; k < c; k++)
        for (size_t i = 0; i < plane; i++)
            chw[k * plane + i] = hwc[i * c + k];
}

/* A decoded image as one fixed-size CHW record: as it is (MODE_OWN) or resized (MODE_SIZE). */
static int image_chw(struct packer *p, struct worker *w, const struct image *im, const char *path, uint8_t *dst)
{
    struct rt_box box;
    uint32_t rect[4];

    if (p->mode == MODE_OWN) {
        if (im->w != p->w || im->h != p->h)
            return rt_errf(-EINVAL, "%s: image is %" PRIu32 "x%" PRIu32 " (width x height), the first one %" PRIu32
                           "x%" PRIu32 ": pass --size S (or HxW) to resize every image when packing, or --codec "
                           "jpeg --max-side N to keep each at its own size and crop at load time",
                           path, im->w, im->h, p->w, p->h);
        hwc_to_chw(im->px, p->c, p->h, p->w, dst);
        return 0;
    }
    /* The box on the full-size image, then in the pixels of a reduced-scale decode (1/denom of it). */
    rt_fit_geometry((enum rt_fit)p->o->fit, im->fw, im->fh, p->w, p->h, &box, rect);
    box.x /= im->denom;
    box.y /= im->denom;
    box.w /= im->denom;
    box.h /= im->denom;
    if (p->o->fit == RT_FIT_PAD)
        memset(dst, 0, p->rec_bytes);
    const uint32_t win[4] = {im->win.x, im->win.y, im->win.w, im->win.h};
    return rt_resize_box_chw_window(w->rs, im->px, im->sw, im->sh, win, p->c, (size_t)im->w * p->c, &box, dst,
                                    p->w, p->h, rect, 0);
}

/*
 * Record `r` of the job as CHW pixels in `dst`: from memory, or an image
 * file read, decoded and brought to the stored size. Returns 0, 1 (left
 * out) or -errno. With `im` the decoded file is kept for the caller (who
 * frees im->file); else it is freed here.
 */
static int record_pixels(struct packer *p, struct worker *w, struct block_job *j, uint32_t r,
                         const struct rt_item *it, uint8_t *dst, struct image *keep)
{
    struct image im;
    int rc;

    if (it->kind == RT_ITEM_PIXELS) {
        memcpy(dst, it->pixels, p->rec_bytes);
        j->bytes_in += p->rec_bytes;
        return 0;
    }
    if ((rc = image_read(p, w, j, r, it->path, &im)) != 0)
        return rc;
    rc = image_chw(p, w, &im, it->path, dst);
    if (keep && rc == 0)
        *keep = im;
    else
        free(im.file);
    return rc;
}

/* The source record at position `r` of the job. */
static void job_item(const struct packer *p, const struct block_job *j, uint32_t r, struct rt_item *it)
{
    const struct split_plan *pl = &p->plan[j->split];
    uint64_t idx = pl->index ? pl->index[j->first + r] : j->first + r;
    rt_source_item(p->src, pl->from, idx, it);
}

static int encode_raw(struct packer *p, struct worker *w, struct block_job *j)
{
    int rc;

    for (uint32_t r = 0; r < j->count; r++) {
        struct rt_item it;
        uint8_t *dst = w->raw + p->rec_bytes * j->kept;
        job_item(p, j, r, &it);
        if ((rc = record_pixels(p, w, j, r, &it, dst, NULL)) < 0)
            return rc;
        if (rc > 0)
            continue;
        norm_add(p, j, dst);
        j->labels[j->kept++] = it.label;
    }
    if (j->kept == 0)
        return 0;
    size_t raw = (size_t)p->rec_bytes * j->kept;
    size_t bound = ZSTD_compressBound(raw);
    j->stored = rt_malloc(bound, "compressed block");
    if (!j->stored)
        return -ENOMEM;
    size_t n = ZSTD_compressCCtx(w->zc, j->stored, bound, w->raw, raw, p->level);
    if (ZSTD_isError(n))
        return rt_errf(-EIO, "zstd compression failed: %s", ZSTD_getErrorName(n));
    /* Kept until its shard is written: no larger than it needs to be. */
    uint8_t *fit = n < bound ? realloc(j->stored, n) : NULL;
    if (fit)
        j->stored = fit;
    j->stored_len = (uint32_t)n;
    j->raw_size = (uint32_t)raw;
    return 0;
}

/* Appends `n` bytes to the worker's JPEG data buffer. */
static int data_put(struct worker *w, size_t *len, const uint8_t *src, size_t n)
{
    if (*len + n > w->data_cap) {
        size_t ncap = RT_MAX(w->data_cap * 2, *len + n);
        uint8_t *nb = rt_realloc(w->data, ncap, "JPEG block");
        if (!nb)
            return -ENOMEM;
        w->data = nb;
        w->data_cap = ncap;
    }
    memcpy(w->data + *len, src, n);
    *len += n;
    return 0;
}

/* Encodes interleaved pixels (c = 1 or 3) as a JPEG appended to the data buffer; 4:2:0 for photos. */
static int put_jpeg_hwc(struct packer *p, struct worker *w, const uint8_t *px, uint32_t iw, uint32_t ih,
                        size_t *len)
{
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    int rc;

    if (tjCompress2(w->tjc, px, (int)iw, 0, (int)ih, p->c == 3 ? TJPF_RGB : TJPF_GRAY, &jpeg, &size,
                    p->c == 3 ? TJSAMP_420 : TJSAMP_GRAY, p->quality, 0) < 0) {
        rc = rt_errf(-EIO, "JPEG encode failed: %s", tjGetErrorStr2(w->tjc));
    } else {
        rc = data_put(w, len, jpeg, size);
    }
    if (jpeg)
        tjFree(jpeg);
    return rc;
}

/*
 * A variable-size record (--max-side): the file itself when it is an RGB or
 * gray JPEG no larger than max_side that needs no rotation, else the
 * decoded image, shrunk so its longer side is max_side when it is longer,
 * encoded as JPEG. Returns 0, 1 (left out) or -errno; *hw = h << 16 | w.
 */
static int variable_record(struct packer *p, struct worker *w, struct block_job *j, uint32_t r,
                           const struct rt_item *it, size_t *len, uint32_t *hw)
{
    struct image im;
    int rc = image_read(p, w, j, r, it->path, &im);
    if (rc != 0)
        return rc;
    const uint32_t side = RT_MAX(im.w, im.h), n = p->o->max_side;
    const int rotated = p->o->exif_rotate && im.info.orientation != 1;

    norm_add_hwc(p, j, im.px, (size_t)im.w * im.h);
    if (im.info.format == RT_IMG_JPEG && !im.info.cmyk && side <= n && !rotated) {
        rc = data_put(w, len, im.file, im.len);
        j->passthrough++;
        *hw = im.h << 16 | im.w;
    } else if (side <= n) {
        rc = put_jpeg_hwc(p, w, im.px, im.w, im.h, len);
        *hw = im.h << 16 | im.w;
    } else {
        /* Longer side to n, the shorter in proportion (at least 1). */
        uint32_t nw = im.w >= im.h ? n : (uint32_t)RT_MAX(1, lround((double)im.w * n / side));
        uint32_t nh = im.h > im.w ? n : (uint32_t)RT_MAX(1, lround((double)im.h * n / side));
        size_t need = (size_t)nw * nh * p->c;
        if (need > w->small_cap) {
            uint8_t *nb = rt_realloc(w->small, need, "resized image");
            rc = nb ? 0 : -ENOMEM;
            if (nb) {
                w->small = nb;
                w->small_cap = need;
            }
        }
        if (rc == 0)
            rc = rt_resize_hwc(w->rs, im.px, im.w, im.h, p->c, (size_t)im.w * p->c, w->small, nw, nh);
        if (rc == 0)
            rc = put_jpeg_hwc(p, w, w->small, nw, nh, len);
        *hw = nh << 16 | nw;
    }
    free(im.file);
    return rc;
}

/* One fixed-size record as JPEG bytes: the file itself (pass-through) or the CHW pixels encoded. */
static int fixed_jpeg_record(struct packer *p, struct worker *w, struct block_job *j, uint32_t r,
                             const struct rt_item *it, size_t *len)
{
    struct image im = {0};
    uint8_t *jpeg = NULL;
    size_t jlen = 0;
    int rc = record_pixels(p, w, j, r, it, w->raw, &im);

    if (rc != 0)
        return rc;
    if (im.file && p->passthrough && im.info.format == RT_IMG_JPEG && !im.info.cmyk &&
        !(p->o->exif_rotate && im.info.orientation != 1)) {
        /* The original bytes, proven above to decode to the right shape. */
        norm_add(p, j, w->raw);
        rc = data_put(w, len, im.file, im.len);
        j->passthrough++;
        free(im.file);
        return rc;
    }
    free(im.file);
    rc = rt_jpeg_encode_chw(w->tjc, w->raw, p->c, p->h, p->w, p->quality, w->hwc, &jpeg, &jlen);
    /* The statistics describe what training sees: the JPEG decoded, not the pixels before encoding. */
    if (rc == 0 && j->split == RT_SPLIT_TRAIN) {
        rc = rt_jpeg_decode_chw(w->tjd, jpeg, jlen, p->c, p->h, p->w, w->dec, w->hwc,
                                it->path ? it->path : "encoded record");
        if (rc == 0)
            norm_add(p, j, w->dec);
    }
    if (rc == 0)
        rc = data_put(w, len, jpeg, jlen);
    if (jpeg)
        tjFree(jpeg);
    return rc;
}

static int encode_jpeg(struct packer *p, struct worker *w, struct block_job *j)
{
    const int variable = p->mode == MODE_VARIABLE;
    size_t len = 0;
    int rc = 0;

    for (uint32_t r = 0; r < j->count; r++) {
        struct rt_item it;
        uint32_t hw = 0;
        job_item(p, j, r, &it);
        w->offs[j->kept] = (uint32_t)len;
        rc = variable ? variable_record(p, w, j, r, &it, &len, &hw) : fixed_jpeg_record(p, w, j, r, &it, &len);
        if (rc < 0)
            return rc;
        if (rc > 0)
            continue;
        if (len > UINT32_MAX)
            return rt_errf(-E2BIG, "JPEG block larger than 4 GiB; use smaller --block-records");
        if (variable)
            j->sizes[j->kept] = hw;
        j->labels[j->kept++] = it.label;
    }
    if (j->kept == 0)
        return 0;
    w->offs[j->kept] = (uint32_t)len;
    const size_t table = 4 * ((size_t)j->kept + 1) + (variable ? 4 * (size_t)j->kept : 0);
    if (table + len > RT_MAX_BLOCK_RAW)
        return rt_errf(-E2BIG, "a JPEG block of %zu bytes exceeds the %u-byte limit; use smaller --block-records",
                       table + len, RT_MAX_BLOCK_RAW);
    j->stored = rt_malloc(table + len, "JPEG block");
    if (!j->stored)
        return -ENOMEM;
    for (uint32_t r = 0; r <= j->kept; r++)
        rt_put32(j->stored + 4 * (size_t)r, w->offs[r]);
    for (uint32_t r = 0; variable && r < j->kept; r++)
        rt_put32(j->stored + 4 * ((size_t)j->kept + 1) + 4 * (size_t)r, j->sizes[r]);
    memcpy(j->stored + table, w->data, len);
    j->stored_len = j->raw_size = (uint32_t)(table + len);
    return 0;
}

/*
 * Takes the split's next block into its ring slot when the ring has room.
 * Called with p->lock held; returns the job, or NULL.
 */
static struct block_job *claim_block(struct packer *p)
{
    if (p->halt || p->issued >= p->nblocks || p->issued >= p->retired + p->njobs)
        return NULL;
    const uint64_t b = p->issued++;
    const uint64_t count = p->plan[p->cur_split].count;
    struct block_job *j = &p->jobs[b % p->njobs];
    *j = (struct block_job){.split = p->cur_split, .first = b * p->block_records,
                            .count = (uint32_t)RT_MIN((uint64_t)p->block_records, count - b * p->block_records),
                            .labels = j->labels, .sizes = j->sizes, .skips = j->skips, .skips_cap = j->skips_cap,
                            .warns = j->warns, .warns_cap = j->warns_cap};
    p->job_done[b % p->njobs] = 0;
    return j;
}

/* Encodes a claimed block (without the lock), then marks it done (with it: the caller holds p->lock again). */
static void encode_block(struct packer *p, struct worker *w, struct block_job *job)
{
    pthread_mutex_unlock(&p->lock);
    job->rc = p->codec == RT_CODEC_RAW ? encode_raw(p, w, job) : encode_jpeg(p, w, job);
    if (job->rc < 0)
        snprintf(job->err, sizeof(job->err), "%s", rt_errmsg());
    else if (job->kept)
        job->xxh64 = XXH64(job->stored, job->stored_len, 0);
    pthread_mutex_lock(&p->lock);
    p->job_done[job - p->jobs] = 1;
    pthread_cond_broadcast(&p->done);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct packer *p = w->p;

    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct block_job *job = NULL;
        while (!p->quit && !(job = claim_block(p)))
            pthread_cond_wait(&p->start, &p->lock);
        if (p->quit)
            break;
        encode_block(p, w, job);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
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
        /* Variable-size records have no fixed record size: these stay one byte. */
        w->raw = rt_malloc(RT_MAX(p->rec_bytes * p->block_records, 1), "block buffer");
        w->hwc = rt_malloc(RT_MAX(p->rec_bytes, 1), "pixel buffer");
        w->dec = rt_malloc(RT_MAX(p->rec_bytes, 1), "pixel buffer");
        w->offs = rt_malloc(((size_t)p->block_records + 1) * sizeof(uint32_t), "JPEG offsets");
        if (!w->zc || !w->tjc || !w->tjd || !w->raw || !w->hwc || !w->dec || !w->offs)
            return rt_errf(-ENOMEM, "out of memory starting pack workers");
        int rc;
        if (p->folder && ((rc = rt_imgdec_create(&w->img)) < 0 || (rc = rt_resizer_create(&w->rs)) < 0))
            return rc;
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
        free(w->data);
        free(w->offs);
        free(w->small);
        rt_imgdec_destroy(w->img);
        rt_resizer_destroy(w->rs);
    }
    free(p->workers);
    p->workers = NULL;
}

/* ---- writing shards (calling thread; each file on a thread of its own) ----------------------------- */

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

static void shard_file_free(struct shard_file *f)
{
    for (uint32_t b = 0; f->data && b < f->nblocks; b++)
        free(f->data[b]);
    free(f->data);
    free(f->blocks);
    free(f->meta);
    f->data = NULL;
    f->blocks = NULL;
    f->meta = NULL;
    f->nblocks = 0;
}

/* Writes, fsyncs and hashes a shard file (its own thread); the outcome in f->rc, f->err and f->xxh64. */
static void *shard_file_write(void *arg)
{
    struct shard_file *f = arg;
    XXH64_state_t *st = XXH64_createState();
    int fd = -1, rc = 0;

    if (!st) {
        rc = rt_errf(-ENOMEM, "out of memory");
        goto out;
    }
    XXH64_reset(st, 0);
    fd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = rt_errf(-errno, "%s: cannot create: %s", f->path, strerror(errno));
        goto out;
    }
    if ((rc = write_hashed(fd, st, f->hdr, sizeof(f->hdr), f->path)) < 0 ||
        (rc = write_hashed(fd, st, f->meta, f->meta_len, f->path)) < 0)
        goto out;
    for (uint32_t b = 0; b < f->nblocks; b++) {
        if ((rc = write_hashed(fd, st, f->data[b], f->blocks[b].stored_size, f->path)) < 0)
            goto out;
        free(f->data[b]); /* written: the memory goes back while the rest is written */
        f->data[b] = NULL;
    }
    if (fsync(fd) < 0) {
        rc = rt_errf(-errno, "%s: fsync failed: %s", f->path, strerror(errno));
        goto out;
    }
    rc = close(fd);
    fd = -1;
    if (rc < 0)
        rc = rt_errf(-errno, "%s: close failed: %s", f->path, strerror(errno));
    f->xxh64 = XXH64_digest(st);
out:
    if (fd >= 0)
        close(fd);
    XXH64_freeState(st);
    f->rc = rc;
    if (rc < 0) {
        snprintf(f->err, sizeof(f->err), "%s", rt_errmsg());
        __atomic_store_n(&f->failed, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

/*
 * Waits for the shard being written, if any, and gives its file's hash to
 * its entry in the shard list. Returns 0, or its error (set as the message
 * when `report`; else the message already set is kept).
 */
static int flush_wait(struct packer *p, int report)
{
    struct shard_file *f = &p->flush;

    if (!f->running)
        return 0;
    if (f->threaded)
        pthread_join(f->thread, NULL);
    f->running = 0;
    shard_file_free(f);
    if (f->rc < 0)
        return report ? rt_errf(f->rc, "%s", f->err) : f->rc;
    f->sw->refs[f->ref].xxh64 = f->xxh64;
    return 0;
}

/* Hands the accumulated blocks, as one shard file, to a thread that writes it (flush_wait waits for it). */
static int shard_flush(struct packer *p, struct shard_writer *sw)
{
    struct shard_file *f = &p->flush;
    struct rt_shard_header h = {0};
    char name[64];
    int rc;

    if (sw->nblocks == 0)
        return 0;
    if ((rc = flush_wait(p, 1)) < 0)
        return rc;
    snprintf(name, sizeof(name), "%s-%05" PRIu32 ".rts", rt_split_name(sw->split), sw->shard_no);
    struct rt_shard_ref *refs = rt_realloc(sw->refs, (sw->nrefs + 1) * sizeof(*refs), "shard list");
    if (!refs)
        return -ENOMEM;
    sw->refs = refs;

    h.codec = p->codec;
    h.compression = p->codec == RT_CODEC_RAW ? RT_COMPRESSION_ZSTD : RT_COMPRESSION_NONE;
    h.split = sw->split;
    h.channels = p->c;
    h.height = p->h;
    h.width = p->w;
    h.num_classes = p->info->num_classes;
    h.record_count = sw->nrec;
    h.first_record = sw->first_record;
    h.block_count = sw->nblocks;
    h.labels_offset = RT_SHARD_HEADER_SIZE;
    h.index_offset = (h.labels_offset + 4 * sw->nrec + 7) & ~(uint64_t)7;
    h.data_offset = h.index_offset + (uint64_t)RT_BLOCK_ENTRY_SIZE * sw->nblocks;
    h.file_size = h.data_offset + sw->data_len;

    /* Labels, padding and index as one buffer laid out as in the file. */
    *f = (struct shard_file){.meta_len = h.data_offset - h.labels_offset};
    f->meta = rt_calloc(1, f->meta_len, "shard index");
    if (!f->meta)
        return -ENOMEM;
    for (uint64_t i = 0; i < sw->nrec; i++)
        rt_put32(f->meta + 4 * i, (uint32_t)sw->labels[i]);
    uint8_t *index = f->meta + (h.index_offset - h.labels_offset);
    for (uint32_t b = 0; b < sw->nblocks; b++) {
        struct rt_block_entry e = sw->blocks[b];
        e.offset += h.data_offset;
        rt_block_entry_encode(&e, index + (size_t)RT_BLOCK_ENTRY_SIZE * b);
    }
    h.labels_xxh64 = XXH64(f->meta, 4 * sw->nrec, 0);
    h.index_xxh64 = XXH64(index, (size_t)RT_BLOCK_ENTRY_SIZE * sw->nblocks, 0);
    rt_shard_header_encode(&h, f->hdr);
    snprintf(f->path, sizeof(f->path), "%s/%s", p->tmpdir, name);
    /* The blocks go with the file; the writer starts the next shard with empty lists. */
    f->data = sw->data;
    f->blocks = sw->blocks;
    f->nblocks = sw->nblocks;
    sw->data = NULL;
    sw->blocks = NULL;
    sw->blocks_cap = 0;

    refs[sw->nrefs] = (struct rt_shard_ref){
        .file = strdup(name), .records = sw->nrec, .bytes = h.file_size, .first_record = sw->first_record};
    if (!refs[sw->nrefs].file) {
        shard_file_free(f);
        return rt_errf(-ENOMEM, "out of memory");
    }
    f->sw = sw;
    f->ref = sw->nrefs++;
    p->stats.bytes_out += h.file_size;
    p->stats.shards++;
    sw->shard_no++;
    sw->first_record += sw->nrec;
    sw->nrec = 0;
    sw->nblocks = 0;
    sw->data_len = 0;

    f->running = 1;
    f->threaded = pthread_create(&f->thread, NULL, shard_file_write, f) == 0;
    if (f->threaded)
        return 0;
    shard_file_write(f); /* no thread to be had: written here, and waited for at once */
    return flush_wait(p, 1);
}

/* Adds a finished block to the shard being gathered (taking its stored bytes), writing out a full shard first. */
static int shard_add_block(struct packer *p, struct shard_writer *sw, struct block_job *j)
{
    int rc;

    if (sw->nblocks > 0 && sw->data_len + j->stored_len > p->shard_bytes && (rc = shard_flush(p, sw)) < 0)
        return rc;
    /* blocks[] and data[] side by side: grown alike, so one capacity holds for both once both have grown. */
    uint64_t bcap = sw->blocks_cap, dcap = sw->blocks_cap;
    if ((rc = grow((void **)&sw->blocks, &bcap, sw->nblocks + 1, sizeof(*sw->blocks), "block index")) < 0 ||
        (rc = grow((void **)&sw->data, &dcap, sw->nblocks + 1, sizeof(*sw->data), "block list")) < 0 ||
        (rc = grow((void **)&sw->labels, &sw->labels_cap, sw->nrec + j->kept, sizeof(int32_t), "labels")) < 0)
        return rc;
    sw->blocks_cap = (uint32_t)RT_MIN(bcap, dcap);
    sw->blocks[sw->nblocks] = (struct rt_block_entry){
        .offset = sw->data_len, .stored_size = j->stored_len, .raw_size = j->raw_size,
        .first_record = (uint32_t)sw->nrec, .record_count = j->kept,
        .xxh64 = j->xxh64};
    sw->data[sw->nblocks++] = j->stored;
    j->stored = NULL;
    sw->data_len += j->stored_len;
    for (uint32_t r = 0; r < j->kept; r++)
        sw->class_counts[j->labels[r]]++;
    memcpy(sw->labels + sw->nrec, j->labels, j->kept * sizeof(int32_t));
    sw->nrec += j->kept;
    return 0;
}

static void writer_free(struct shard_writer *sw)
{
    for (uint32_t i = 0; i < sw->nrefs; i++)
        free((char *)sw->refs[i].file);
    free(sw->refs);
    for (uint32_t b = 0; sw->data && b < sw->nblocks; b++)
        free(sw->data[b]);
    free(sw->data);
    free(sw->blocks);
    free(sw->labels);
    free(sw->class_counts);
}

/* Path of an input file relative to the input directory, for the manifest. */
static const char *input_relative(const struct packer *p, const char *path)
{
    size_t n = strlen(p->input);
    while (n > 1 && p->input[n - 1] == '/')
        n--;
    return !strncmp(path, p->input, n) && path[n] == '/' ? path + n + 1 : path;
}

/* Adds a finished job's sums, sizes, skipped files and counts to the pack's (in record order). */
static int note_job(struct packer *p, const struct block_job *j)
{
    /* Integer sums: the order blocks finish in cannot change the result. */
    for (uint32_t c = 0; c < p->c; c++) {
        p->px_sum[c] += j->px_sum[c];
        p->px_sq[c] += j->px_sq[c];
    }
    p->px_n += j->px_n;
    if (p->mode == MODE_VARIABLE && j->kept) {
        int rc = grow((void **)&p->all_sizes, &p->sizes_cap, p->nsizes + j->kept, sizeof(uint32_t), "sizes");
        if (rc < 0)
            return rc;
        memcpy(p->all_sizes + p->nsizes, j->sizes, j->kept * sizeof(uint32_t));
        p->nsizes += j->kept;
    }
    for (uint32_t k = 0; k < j->nskips; k++) {
        struct rt_item it;
        json_t *o = json_object();
        job_item(p, j, j->skips[k].r, &it);
        json_object_set_new(o, "file", json_string(input_relative(p, it.path)));
        json_object_set_new(o, "reason", json_string(rt_img_bad_name(j->skips[k].why)));
        json_object_set_new(o, "detail", json_string(j->skips[k].detail));
        if (json_array_append_new(p->skipped, o) < 0)
            return rt_errf(-ENOMEM, "out of memory");
        p->skipped_by[j->skips[k].why]++;
    }
    for (uint32_t k = 0; k < j->nwarns; k++) {
        struct rt_item it;
        json_t *o = json_object();
        job_item(p, j, j->warns[k].r, &it);
        json_object_set_new(o, "file", json_string(input_relative(p, it.path)));
        json_object_set_new(o, "warning", json_string(j->warns[k].detail));
        if (json_array_append_new(p->warned, o) < 0)
            return rt_errf(-ENOMEM, "out of memory");
        if (!p->stats.warned++)
            snprintf(p->stats.first_warning, sizeof(p->stats.first_warning), "%s: %s", it.path,
                     j->warns[k].detail);
    }
    p->stats.records += j->kept;
    p->stats.skipped += j->nskips;
    p->stats.bytes_in += j->bytes_in;
    p->stats.passthrough += j->passthrough;
    for (int k = 1; k < 4; k++)
        p->stats.scaled[k] += j->scaled[k];
    return 0;
}

/* Encodes and writes one output split, its blocks streamed through the workers and written in order. */
static int pack_split(struct packer *p, struct shard_writer *sw)
{
    const uint64_t count = p->plan[sw->split].count;
    const uint32_t every = (uint32_t)p->nworkers * 4; /* blocks between progress reports */
    int rc = 0;

    pthread_mutex_lock(&p->lock);
    p->cur_split = sw->split;
    p->nblocks = (count + p->block_records - 1) / p->block_records;
    p->issued = p->retired = 0;
    p->halt = 0;
    pthread_cond_broadcast(&p->start);
    while (p->retired < p->nblocks) {
        /* Wait for the next block in order, encoding blocks meanwhile when there is room for one. */
        struct block_job *j = &p->jobs[p->retired % p->njobs];
        while (!(p->retired < p->issued && p->job_done[p->retired % p->njobs])) {
            struct block_job *mine = claim_block(p);
            if (mine)
                encode_block(p, &p->workers[0], mine);
            else
                pthread_cond_wait(&p->done, &p->lock);
        }
        pthread_mutex_unlock(&p->lock);
        if (rc == 0 && j->rc < 0)
            rc = rt_errf(j->rc, "%s", j->err);
        /* A shard that failed to write (disk full) stops the pack now, not a shard's worth of encoding later. */
        if (rc == 0 && p->flush.running && __atomic_load_n(&p->flush.failed, __ATOMIC_ACQUIRE))
            rc = flush_wait(p, 1);
        if (rc == 0 && j->kept)
            rc = shard_add_block(p, sw, j);
        if (rc == 0)
            rc = note_job(p, j);
        free(j->stored);
        j->stored = NULL;
        pthread_mutex_lock(&p->lock);
        p->retired++;
        if (rc < 0 && !p->halt) {
            /* Hand out no more; the blocks already out are waited for and dropped in order above. */
            p->halt = 1;
            p->nblocks = p->issued;
        }
        pthread_cond_broadcast(&p->start);
        if (rc == 0 && p->o->progress && (p->retired % every == 0 || p->retired == p->nblocks)) {
            struct rt_pack_progress pr = {p->stats.records + p->stats.skipped, p->total_records,
                                          p->stats.bytes_in, p->stats.bytes_out,
                                          (double)(rt_now_ns() - p->t0) * 1e-9};
            pthread_mutex_unlock(&p->lock);
            p->o->progress(p->o->progress_ctx, &pr);
            pthread_mutex_lock(&p->lock);
        }
    }
    p->nblocks = 0; /* nothing to hand out until the next split */
    pthread_mutex_unlock(&p->lock);
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

/*
 * Mean and population standard deviation in 0..1 units from the exact sums
 * over the n pixels summed, per channel. n * sum(v^2) - sum(v)^2 is
 * formed in 128 bits, exactly, so only the final divisions and the square
 * root round.
 */
static void norm_stats(const struct packer *p, double *mean, double *std)
{
    const uint64_t n = p->px_n;

    for (uint32_t c = 0; c < p->c; c++) {
        unsigned __int128 var_n2 = (unsigned __int128)n * p->px_sq[c] - (unsigned __int128)p->px_sum[c] * p->px_sum[c];
        mean[c] = (double)p->px_sum[c] / ((double)n * 255.0);
        std[c] = sqrt((double)var_n2) / ((double)n * 255.0);
    }
}

static json_t *json_hw(uint32_t hw)
{
    json_t *a = json_array();
    json_array_append_new(a, json_integer(hw >> 16));
    json_array_append_new(a, json_integer(hw & 0xffff));
    return a;
}

static int cmp_area(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint64_t ax = (uint64_t)(x >> 16) * (x & 0xffff), ay = (uint64_t)(y >> 16) * (y & 0xffff);
    return ax != ay ? (ax > ay) - (ax < ay) : (x > y) - (x < y);
}

/* Files of an image folder left out of the listing: hidden ones and names that are no image's. */
static uint64_t folder_ignored(const struct packer *p)
{
    return p->info->ignored_hidden + p->info->ignored_other;
}

/* Adds the manifest's "variable_size" and "files" to `extra` (image folders only). */
static void folder_summary(struct packer *p, json_t *extra)
{
    if (p->mode == MODE_VARIABLE && p->nsizes) {
        json_t *vs = json_object();
        /* Sorting by area (ties by height, width) makes min, median and max one order. */
        qsort(p->all_sizes, p->nsizes, sizeof(uint32_t), cmp_area);
        json_object_set_new(vs, "max_side", json_integer(p->o->max_side));
        json_object_set_new(vs, "min", json_hw(p->all_sizes[0]));
        json_object_set_new(vs, "median", json_hw(p->all_sizes[p->nsizes / 2]));
        json_object_set_new(vs, "max", json_hw(p->all_sizes[p->nsizes - 1]));
        json_object_set_new(extra, "variable_size", vs);
    }
    if (p->folder) {
        json_t *f = json_object();
        json_object_set_new(f, "listed", json_integer((json_int_t)p->total_records));
        json_object_set_new(f, "ignored", json_integer((json_int_t)folder_ignored(p)));
        json_object_set(f, "skipped", p->skipped);
        json_object_set(f, "warnings", p->warned);
        if (p->stats.scaled[1] + p->stats.scaled[2] + p->stats.scaled[3]) {
            json_t *sc = json_object();
            for (int k = 1; k < 4; k++) {
                char name[8];
                snprintf(name, sizeof name, "1/%d", 1 << k);
                if (p->stats.scaled[k])
                    json_object_set_new(sc, name, json_integer((json_int_t)p->stats.scaled[k]));
            }
            json_object_set_new(f, "scaled_decode", sc);
        }
        json_object_set_new(extra, "files", f);
    }
}

static json_t *pack_params(const struct packer *p)
{
    static const char *const mode_name[] = {"own size", "resized", "variable"};
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
    if (p->folder) {
        json_t *im = json_object();
        json_object_set_new(im, "mode", json_string(mode_name[p->mode]));
        if (p->mode == MODE_SIZE) {
            json_object_set_new(im, "size", json_hw(p->h << 16 | p->w));
            json_object_set_new(im, "fit", json_string(rt_fit_name((enum rt_fit)p->o->fit)));
        }
        if (p->mode == MODE_VARIABLE)
            json_object_set_new(im, "max_side", json_integer(p->o->max_side));
        json_object_set_new(im, "channels", json_integer(p->c));
        json_object_set_new(im, "exif_rotate", json_boolean(p->o->exif_rotate));
        json_object_set_new(im, "skip_bad", json_boolean(p->o->skip_bad));
        json_object_set_new(o, "image", im);
    }
    return o;
}

static int write_manifest(struct packer *p, struct shard_writer *sw)
{
    struct rt_dataset_info info = {0};
    double mean[RT_MAX_CHANNELS], std[RT_MAX_CHANNELS];
    const int have_norm = p->px_n > 0;
    json_t *extra = json_object();
    char path[4200];
    int rc;

    info.source = p->info->kind;
    info.codec = p->codec;
    info.channels = p->c;
    info.height = p->h;
    info.width = p->w;
    info.num_classes = p->info->num_classes;
    info.class_names = (const char *const *)p->info->class_names;
    /* After the last flush, a writer's first_record is the split's record count. */
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        info.split[sp] = (struct rt_split_info){sw[sp].first_record, sw[sp].nrefs, sw[sp].refs, sw[sp].class_counts};
    if (have_norm)
        norm_stats(p, mean, std);
    if (!extra)
        return rt_errf(-ENOMEM, "out of memory");
    folder_summary(p, extra);
    json_t *params = pack_params(p);
    char *text = rt_manifest_dump(&info, have_norm ? mean : NULL, have_norm ? std : NULL, extra, params);
    json_decref(params);
    json_decref(extra);
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

/*
 * The stored shape of an image folder: --size, --max-side (variable), or the
 * size of the first training image that can be read (all must match it).
 */
static int folder_geometry(struct packer *p)
{
    const struct rt_pack_opts *o = p->o;
    const struct split_plan *pl = &p->plan[RT_SPLIT_TRAIN];

    p->c = o->channels ? o->channels : 3;
    if (p->c != 1 && p->c != 3)
        return rt_errf(-EINVAL, "--channels must be 1 or 3, not %" PRIu32, p->c);
    if ((o->size_h || o->size_w) && o->max_side)
        return rt_errf(-EINVAL, "--size and --max-side: choose one (every image at one size, or each at its own)");
    if (o->max_side) {
        if (p->codec != RT_CODEC_JPEG)
            return rt_errf(-EINVAL, "--max-side keeps each image at its own size, which only the jpeg codec stores: "
                           "add --codec jpeg");
        if (o->max_side < 8 || o->max_side > RT_MAX_DIM)
            return rt_errf(-EINVAL, "--max-side %" PRIu32 " out of range [8, %u]", o->max_side, RT_MAX_DIM);
        p->mode = MODE_VARIABLE;
        p->h = p->w = 0;
        return 0;
    }
    if (o->size_h || o->size_w) {
        if (!o->size_h || !o->size_w || o->size_h > RT_MAX_DIM || o->size_w > RT_MAX_DIM)
            return rt_errf(-EINVAL, "--size %" PRIu32 "x%" PRIu32 " out of range", o->size_h, o->size_w);
        if (o->fit < RT_FIT_CROP || o->fit > RT_FIT_PAD)
            return rt_errf(-EINVAL, "unknown --fit");
        p->mode = MODE_SIZE;
        p->h = o->size_h;
        p->w = o->size_w;
        return 0;
    }
    p->mode = MODE_OWN;
    for (uint64_t k = 0; k < pl->count; k++) {
        struct rt_item it;
        struct rt_img_info info;
        enum rt_img_bad why = RT_IMG_OK;
        uint8_t *file;
        size_t len;
        int rc;

        rt_source_item(p->src, pl->from, pl->index ? pl->index[k] : k, &it);
        if ((rc = rt_file_read(it.path, &file, &len)) < 0)
            return rc;
        rc = rt_img_probe(file, len, it.path, &info, &why);
        free(file);
        if (rc < 0 && (!o->skip_bad || why == RT_IMG_OK)) {
            struct block_job none = {0};
            return bad_file(p, &none, 0, why, rc);
        }
        if (rc < 0)
            continue;
        /* Orientations 5..8 turn the picture a quarter. */
        int turned = o->exif_rotate && info.orientation >= 5;
        p->w = turned ? info.height : info.width;
        p->h = turned ? info.width : info.height;
        return 0;
    }
    return rt_errf(-EINVAL, "%s: no readable image in the training split", p->input);
}

/* Options that mean something for image folders only. */
static int folder_only_options(const struct rt_pack_opts *o)
{
    return o->size_h || o->size_w || o->fit || o->max_side || o->channels || o->skip_bad || o->exif_rotate;
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
    p.input = input;
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
    p.quality = opts->quality ? opts->quality : DEFAULT_QUALITY;
    p.folder = !strcmp(p.info->kind, "image-folder");
    p.c = p.info->channels;
    p.h = p.info->height;
    p.w = p.info->width;
    if (!p.folder && folder_only_options(opts)) {
        rc = rt_errf(-EINVAL, "%s is %s: --size, --fit, --max-side, --channels, --skip-bad and --exif-rotate "
                     "apply to image folders", input, p.info->kind);
        goto out;
    }
    if ((rc = make_plan(&p)) < 0)
        goto out;
    if (p.folder && (rc = folder_geometry(&p)) < 0)
        goto out;
    p.passthrough = p.codec == RT_CODEC_JPEG && opts->quality == 0 && p.folder && p.mode == MODE_OWN;
    p.rec_bytes = (uint64_t)p.c * p.h * p.w;
    p.block_records = opts->block_records ? opts->block_records
                      : p.mode == MODE_VARIABLE
                          ? DEFAULT_VAR_BLOCK_RECORDS
                          : (uint32_t)RT_MAX((uint64_t)1, DEFAULT_BLOCK_PIXELS / p.rec_bytes);
    if (p.codec == RT_CODEC_RAW && p.rec_bytes * p.block_records > RT_MAX_BLOCK_RAW) {
        rc = rt_errf(-EINVAL, "--block-records %" PRIu32 " makes %" PRIu64 "-byte blocks; the limit is %u",
                     p.block_records, p.rec_bytes * p.block_records, RT_MAX_BLOCK_RAW);
        goto out;
    }
    p.shard_bytes = opts->shard_bytes ? opts->shard_bytes : DEFAULT_SHARD_BYTES;
    p.scale_gap = scale_gap();
    p.nworkers = opts->threads > 0 ? opts->threads : rt_cpus_available();
    p.skipped = json_array();
    p.warned = json_array();
    if (!p.skipped || !p.warned) {
        rc = rt_errf(-ENOMEM, "out of memory");
        goto out;
    }
    snprintf(p.stats.source, sizeof(p.stats.source), "%s", p.info->kind);
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        p.total_records += p.plan[sp].count;

    struct stat st;
    if (stat(p.tmpdir, &st) == 0) {
        rt_info("removing %s left by an interrupted pack", p.tmpdir);
        rt_remove_tree(p.tmpdir);
    }
    if ((rc = rt_mkdirs(p.tmpdir, 0755)) < 0)
        goto out;
    /*
     * Room for the workers to run ahead of the writer: while it writes a full shard (64 MiB by default, some
     * 0.1 s) they go on encoding into the ring, and a large photo holds up only its own slot. 8 blocks a worker
     * at least, up to 64 a worker or about 32 MiB of blocks (a variable-size block of photos is about 1 MiB).
     * With 8 a worker, pack --size 224 of an ImageNet-like folder waited out each shard's write (2 CPUs: 10-15 %
     * idle, 730-790 images/s against 855-950 with 64).
     */
    const uint64_t block_bytes =
        p.mode == MODE_VARIABLE ? (uint64_t)1 << 20 : RT_MAX(p.rec_bytes, 1) * p.block_records;
    const uint64_t fit = ((uint64_t)32 << 20) / RT_MAX(block_bytes, 1);
    p.njobs = (uint32_t)RT_MAX((uint64_t)p.nworkers * 8, RT_MIN((uint64_t)p.nworkers * 64, fit));
    p.jobs = rt_calloc(p.njobs, sizeof(struct block_job), "block jobs");
    p.job_done = rt_calloc(p.njobs, 1, "block job states");
    if (!p.jobs || !p.job_done) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint32_t i = 0; i < p.njobs; i++)
        if (!(p.jobs[i].labels = rt_malloc(p.block_records * sizeof(int32_t), "block labels")) ||
            !(p.jobs[i].sizes = rt_malloc(p.block_records * sizeof(uint32_t), "block sizes"))) {
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
        p.stats.split_records[sp] = sw[sp].first_record;
    }
    if (rc == 0)
        rc = flush_wait(&p, 1);
    if (rc == 0 && p.stats.records == 0)
        rc = rt_errf(-EINVAL, "%s: every one of the %" PRIu64 " files was skipped; nothing to pack", input,
                     p.total_records);
    if (rc == 0)
        rc = write_manifest(&p, sw);
    if (rc == 0)
        rc = rt_fsync_dir(p.tmpdir);
    if (rc == 0)
        rc = install(p.tmpdir, out);
    p.stats.seconds = (double)(rt_now_ns() - p.t0) * 1e-9;
    if (p.folder) {
        p.stats.files = p.total_records;
        p.stats.ignored = folder_ignored(&p);
        for (int b = 1, n = 0; b < RT_IMG_BAD_COUNT; b++)
            if (p.skipped_by[b]) {
                size_t at = strlen(p.stats.skipped_summary);
                snprintf(p.stats.skipped_summary + at, sizeof(p.stats.skipped_summary) - at, "%s%" PRIu64 " %s",
                         n++ ? ", " : "", p.skipped_by[b], rt_img_bad_name((enum rt_img_bad)b));
            }
    }
    if (rc == 0 && stats)
        *stats = p.stats;
out:
    workers_stop(&p);
    flush_wait(&p, 0); /* after an error: the shard in flight is let finish, then removed with the rest */
    if (rc < 0 && p.tmpdir[0]) {
        /* Keep the message: cleanup may overwrite it. */
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s", rt_errmsg());
        rt_remove_tree(p.tmpdir);
        rt_errf(rc, "%s", msg);
    }
    if (p.jobs)
        for (uint32_t i = 0; i < p.njobs; i++) {
            free(p.jobs[i].labels);
            free(p.jobs[i].sizes);
            free(p.jobs[i].skips);
            free(p.jobs[i].warns);
        }
    free(p.jobs);
    free(p.job_done);
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        writer_free(&sw[sp]);
        free(p.plan[sp].index);
    }
    free(p.all_sizes);
    json_decref(p.skipped);
    json_decref(p.warned);
    rt_source_close(src);
    pthread_mutex_destroy(&p.lock);
    pthread_cond_destroy(&p.start);
    pthread_cond_destroy(&p.done);
    return rc;
}
