/* cmd_pack.c - `ringtrain pack`: options -> rt_pack(), progress and summary. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/offline.h"
#include "tools/cli.h"

/* What `pack` reads its options into: the library's options, and the ones this file checks. */
struct pack_args {
    struct rt_pack_opts o;
    const char *out;
    int fit; /* -1: no --fit (crop), else o.fit's value */
};

/* --size S or HxW. */
static int parse_size(const char *cmd, const char *arg, void *cfg)
{
    struct pack_args *a = cfg;
    unsigned long hh, ww;
    int n = 0;
    if (sscanf(arg, "%lux%lu%n", &hh, &ww, &n) == 2 && !arg[n]) {
        /* H x W */
    } else if (sscanf(arg, "%lu%n", &hh, &n) == 1 && !arg[n]) {
        ww = hh;
    } else {
        return cli_usage_error(cmd, "--size takes S or HxW (e.g. 64 or 96x128), not '%s'", arg);
    }
    if (hh < 1 || ww < 1 || hh > 65535 || ww > 65535)
        return cli_usage_error(cmd, "--size %s out of range (1..65535 on each side)", arg);
    a->o.size_h = (uint32_t)hh;
    a->o.size_w = (uint32_t)ww;
    return 0;
}

/* --shard-size 64M: a byte count with an optional K/M/G suffix, above 0. */
static int parse_shard_size(const char *cmd, const char *arg, void *cfg)
{
    struct pack_args *a = cfg;
    if (rt_parse_size(arg, &a->o.shard_bytes) < 0)
        return cli_usage_error(cmd, "--shard-size: %s", rt_errmsg());
    if (a->o.shard_bytes == 0)
        return cli_usage_error(cmd, "--shard-size: must be > 0");
    return 0;
}

static const struct cli_choice codecs[] = {{"raw", RT_CODEC_RAW, 0}, {"jpeg", RT_CODEC_JPEG, 0}, {NULL, 0, 0}};
static const struct cli_choice labels[] = {{"fine", RT_LABEL_FINE, 0}, {"coarse", RT_LABEL_COARSE, 0}, {NULL, 0, 0}};
static const struct cli_choice fits[] = {{"crop", 0, 0}, {"stretch", 1, 0}, {"pad", 2, 0}, {NULL, 0, 0}};
static const struct cli_choice channels[] = {{"1", 1, 0}, {"3", 3, 0}, {NULL, 0, 0}};

#define F(member) CLI_FIELD(struct pack_args, member)
static const struct cli_opt pack_opts[] = {
    {.name = "out", .letter = 'o', .arg = "DIR", .kind = CLI_STR, F(out),
     .help = "dataset directory to create (built as DIR.partial, renamed when complete)"},
    {.name = "codec", .letter = 'c', .arg = "C", .kind = CLI_CHOICE, F(o.codec), .choices = codecs,
     .help = "raw (zstd-compressed uint8 CHW, lossless; default) or jpeg"},
    {.name = "quality", .letter = 'q', .arg = "Q", .kind = CLI_UINT, F(o.quality), .lo = 1, .hi = 100,
     .help = "JPEG quality 1-100 (default 90; JPEG image folders are kept as they are\n"
             "unless --quality is given)"},
    {.name = "level", .letter = 'l', .arg = "L", .kind = CLI_UINT, F(o.level), .lo = 1, .hi = 22,
     .help = "zstd level for raw blocks, 1-22 (default 1)"},
    {.name = "shard-size", .letter = 'S', .arg = "BYTES", .kind = CLI_CUSTOM, .custom = parse_shard_size,
     .help = "target shard size, e.g. 64M (default 64M)"},
    {.name = "block-records", .letter = 'b', .arg = "N", .kind = CLI_UINT, F(o.block_records), .lo = 1,
     .hi = 1u << 20, .help = "records per independently decodable block (default: ~128 KiB of pixels)"},
    {.name = "val-split", .letter = 'v', .arg = "F", .kind = CLI_REAL, F(o.val_split), .dlo = 0, .dhi = 1,
     .flags = CLI_OPEN, .help = "move this fraction of train to a seeded validation split (default 0)"},
    {.name = "split-seed", .letter = 's', .arg = "S", .kind = CLI_UINT, F(o.split_seed),
     .help = "seed of that selection (default 0)"},
    {.name = "label", .letter = 'L', .arg = "fine|coarse", .kind = CLI_CHOICE, F(o.label), .choices = labels,
     .help = "CIFAR-100 label set (default fine)"},
    {.name = "threads", .letter = 'j', .arg = "T", .kind = CLI_UINT, F(o.threads), .hi = 1024, .flags = CLI_CLAMP,
     .help = "encoder threads (default: the CPUs this process may use)"},
    {.name = "force", .letter = 'f', .kind = CLI_FLAG, F(o.force), .help = "replace an existing dataset at DIR"},
    {.kind = CLI_TEXT, .help = "Image folders:"},
    {.name = "size", .arg = "S|HxW", .kind = CLI_CUSTOM, .custom = parse_size,
     .help = "store every image at S x S (or H x W) pixels, resized as Pillow's BILINEAR\n"
             "resize does (the same values); a JPEG at least 6x the record's size is\n"
             "decoded at 1/2, 1/4 or 1/8 scale first, keeping 3x the record's size"},
    {.name = "fit", .arg = "crop|stretch|pad", .kind = CLI_CHOICE, F(fit), .choices = fits,
     .help = "how --size gets there: crop = torchvision's Resize(S) + CenterCrop(S)\n"
             "(default), stretch = the whole image, aspect not kept, pad = the whole\n"
             "image inside, black around"},
    {.name = "max-side", .arg = "N", .kind = CLI_UINT, F(o.max_side), .lo = 8, .hi = 65535,
     .help = "with --codec jpeg: keep each image at its own size, shrunk to N pixels on\n"
             "its longer side when larger (JPEGs already small enough are stored as they\n"
             "are); training crops them at load time (train/loadbench --image-size)"},
    {.name = "channels", .arg = "1|3", .kind = CLI_CHOICE, F(o.channels), .choices = channels,
     .help = "RGB (default) or gray"},
    {.name = "skip-bad", .kind = CLI_FLAG, F(o.skip_bad),
     .help = "leave out files that are no usable image (truncated, not an image, an\n"
             "unsupported format, zero-sized), list them in the manifest and go on;\n"
             "without it the first such file stops the pack, named"},
    {.name = "exif-rotate", .kind = CLI_FLAG, F(o.exif_rotate),
     .help = "turn images as their EXIF orientation says (torchvision does not)"},
    {.kind = CLI_TEXT, .help = "  Without --size or --max-side every image must have the size of the first one."},
    CLI_HELP_ROW,
};
#undef F

static const struct cli_cmd pack_cli = {
    .name = "pack",
    .head = "Usage: ringtrain pack INPUT --out DIR [options]\n\n"
            "Packs a dataset into zstd (or JPEG) shards and a manifest: the format ringtrain reads.\n\n"
            "INPUT is any of:\n"
            "  CIFAR binary  a CIFAR-10/100 binary directory (cifar-10-batches-bin/, cifar-100-binary/) or its\n"
            "                .tar.gz\n"
            "  CIFAR python  the tarball torchvision downloads (cifar-10-python.tar.gz, cifar-100-python.tar.gz)\n"
            "                or its unpacked directory\n"
            "  MNIST         a directory holding the four MNIST IDX files (plain or .gz)\n"
            "  image folder  ROOT/<class>/<image> (class index = sorted folder order), optionally with\n"
            "                ROOT/train/, ROOT/val/ and ROOT/test/ above the class folders. Images: JPEG (baseline,\n"
            "                progressive, gray, CMYK), PNG (8/16-bit, palette; alpha dropped), WebP, PPM/PGM, BMP\n"
            "                (palette, RLE, 16/24/32-bit), TIFF (first page; LZW, deflate, PackBits, JPEG), of any\n"
            "                size, with the extensions torchvision's ImageFolder lists in any case; hidden files\n"
            "                and other names are ignored and counted\n"
            "A directory that holds one of these one level down (as `ringtrain synth` writes) works too.\n\n"
            "Options:\n",
    .tail = "\nExamples:\n"
            "  $ ringtrain pack data/src --out data/cifar10\n"
            "  $ ringtrain pack cifar-10-python.tar.gz --out data/c10 --val-split 0.1\n"
            "  $ ringtrain pack ~/photos --out data/photos64 --size 64 --skip-bad\n"
            "  $ ringtrain pack ~/photos --out data/photos --codec jpeg --max-side 320 --val-split 0.1\n",
    .opts = pack_opts,
    .nopts = RT_ARRAY_LEN(pack_opts),
    .col = 27,
    .letters = 1,
};

struct progress_state {
    int tty;
    double last; /* seconds at the last redraw */
};

static void on_progress(void *ctx, const struct rt_pack_progress *p)
{
    struct progress_state *st = ctx;
    if (!st->tty || p->records_total == 0)
        return;
    /* Redraw at most ten times a second, and always at the end. */
    if (p->seconds - st->last < 0.1 && p->records_done < p->records_total)
        return;
    st->last = p->seconds;
    double mbs = p->seconds > 0 ? (double)p->bytes_in / p->seconds / 1e6 : 0;
    fprintf(stderr, "\rpack: %llu/%llu records %3.0f%% | %.1f MB/s ", (unsigned long long)p->records_done,
            (unsigned long long)p->records_total, 100.0 * (double)p->records_done / (double)p->records_total, mbs);
}

/* 12804 -> "12,804". */
static const char *thousands(uint64_t v, char *buf, size_t len)
{
    char digits[32];
    int n = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)v), k = 0;
    for (int i = 0; i < n && (size_t)k + 2 < len; i++) {
        if (i && (n - i) % 3 == 0)
            buf[k++] = ',';
        buf[k++] = digits[i];
    }
    buf[k] = '\0';
    return buf;
}

/* Image folders: images/s, pass-through JPEGs, what was ignored and skipped, and the JPEGs kept though libjpeg
 * warned (both listed in the manifest). */
static void print_folder_summary(const struct rt_pack_stats *st, const char *out)
{
    char a[32], b[32];
    printf("pack: %s images/s", thousands(st->seconds > 0 ? (uint64_t)((double)st->records / st->seconds) : 0, a,
                                          sizeof(a)));
    if (st->passthrough)
        printf(", %llu JPEGs stored as they were", (unsigned long long)st->passthrough);
    if (st->ignored)
        printf(", ignored %llu files that are hidden or not images", (unsigned long long)st->ignored);
    printf("\n");
    if (st->skipped)
        printf("pack: skipped %s of %s: %s (listed with their reasons under \"files\" in %s/manifest.json)\n",
               thousands(st->skipped, a, sizeof(a)), thousands(st->files, b, sizeof(b)), st->skipped_summary, out);
    const uint64_t scaled = st->scaled[1] + st->scaled[2] + st->scaled[3];
    if (scaled) {
        printf("pack: %s JPEGs decoded at a reduced scale, as large as --size needs (",
               thousands(scaled, a, sizeof(a)));
        for (int k = 1, n = 0; k < 4; k++)
            if (st->scaled[k])
                printf("%s1/%d: %llu", n++ ? ", " : "", 1 << k, (unsigned long long)st->scaled[k]);
        printf(")\n");
    }
    if (st->warned)
        printf("pack: %s %s decoded through a libjpeg warning (listed under \"files\" in %s/manifest.json): "
               "first: %s\n",
               thousands(st->warned, a, sizeof(a)), st->warned == 1 ? "file" : "files", out, st->first_warning);
}

/* The rules between pack's options and its operand, once all are read: 0, or RT_EXIT_USAGE after the message. */
static int pack_check(int argc, struct pack_args *a)
{
    if (optind != argc - 1)
        return cli_usage_error("pack", optind == argc ? "INPUT is required" : "exactly one INPUT, please");
    if (!a->out)
        return cli_usage_error("pack", "--out DIR is required");
    if (a->fit >= 0 && !a->o.size_h)
        return cli_usage_error("pack", "--fit goes with --size");
    if (a->o.max_side && a->o.codec != RT_CODEC_JPEG)
        return cli_usage_error("pack", "--max-side keeps each image at its own size, which only the jpeg codec "
                                       "stores: add --codec jpeg");
    a->o.fit = a->fit < 0 ? 0 : a->fit;
    return 0;
}

int cmd_pack(int argc, char **argv)
{
    struct pack_args a = {.fit = -1};
    struct rt_pack_stats st;
    struct progress_state ps = {isatty(STDERR_FILENO), 0};
    int rc = cli_opts_parse(&pack_cli, argc, argv, &a);
    if (rc != CLI_PARSED)
        return rc;
    if (pack_check(argc, &a))
        return RT_EXIT_USAGE;
    a.o.progress = on_progress;
    a.o.progress_ctx = &ps;
    rc = rt_pack(argv[optind], a.out, &a.o, &st);
    if (ps.tty)
        fprintf(stderr, "\r\033[K");
    if (rc < 0)
        return cli_fail();

    char in_s[32], out_s[32];
    rt_format_bytes((double)st.bytes_in, in_s, sizeof(in_s));
    rt_format_bytes((double)st.bytes_out, out_s, sizeof(out_s));
    printf("pack: %llu records (train %llu, val %llu, test %llu) from %s -> %s: %u shards, %s of pixels in, "
           "%s out, ratio %.2f, %.2f s, %.1f MB/s\n",
           (unsigned long long)st.records, (unsigned long long)st.split_records[RT_SPLIT_TRAIN],
           (unsigned long long)st.split_records[RT_SPLIT_VAL], (unsigned long long)st.split_records[RT_SPLIT_TEST],
           st.source, a.out, st.shards, in_s, out_s, st.bytes_out ? (double)st.bytes_in / (double)st.bytes_out : 0.0,
           st.seconds, st.seconds > 0 ? (double)st.bytes_in / st.seconds / 1e6 : 0.0);
    if (st.files)
        print_folder_summary(&st, a.out);
    return RT_EXIT_OK;
}
