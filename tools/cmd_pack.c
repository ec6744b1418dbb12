/* cmd_pack.c - `ringtrain pack`: options -> rt_pack(), progress and summary. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/offline.h"
#include "tools/cli.h"

static void pack_help(void)
{
    printf("Usage: ringtrain pack INPUT --out DIR [options]\n\n"
           "Packs a dataset into zstd (or JPEG) shards and a manifest: the format ringtrain reads.\n\n"
           "INPUT is any of:\n"
           "  CIFAR binary  a CIFAR-10/100 binary directory (cifar-10-batches-bin/, cifar-100-binary/) or its\n"
           "                .tar.gz\n"
           "  CIFAR python  the tarball torchvision downloads (cifar-10-python.tar.gz, cifar-100-python.tar.gz)\n"
           "                or its unpacked directory\n"
           "  MNIST         a directory holding the four MNIST IDX files (plain or .gz)\n"
           "  image folder  ROOT/<class>/<image> (class index = sorted folder order), optionally with\n"
           "                ROOT/train/, ROOT/val/ and ROOT/test/ above the class folders. Images: JPEG (baseline,\n"
           "                progressive, gray, CMYK), PNG (8/16-bit, palette; alpha dropped), WebP, PPM/PGM, of any\n"
           "                size, with the extensions torchvision's ImageFolder lists in any case; hidden files\n"
           "                and other names are ignored and counted\n"
           "A directory that holds one of these one level down (as `ringtrain synth` writes) works too.\n\n"
           "Options:\n"
           "  -o, --out DIR            dataset directory to create (built as DIR.partial, renamed when complete)\n"
           "  -c, --codec C            raw (zstd-compressed uint8 CHW, lossless; default) or jpeg\n"
           "  -q, --quality Q          JPEG quality 1-100 (default 90; JPEG image folders are kept as they are\n"
           "                           unless --quality is given)\n"
           "  -l, --level L            zstd level for raw blocks, 1-22 (default 3)\n"
           "  -S, --shard-size BYTES   target shard size, e.g. 64M (default 64M)\n"
           "  -b, --block-records N    records per independently decodable block (default: ~128 KiB of pixels)\n"
           "  -v, --val-split F        move this fraction of train to a seeded validation split (default 0)\n"
           "  -s, --split-seed S       seed of that selection (default 0)\n"
           "  -L, --label fine|coarse  CIFAR-100 label set (default fine)\n"
           "  -j, --threads T          encoder threads (default: the CPUs this process may use)\n"
           "  -f, --force              replace an existing dataset at DIR\n"
           "Image folders:\n"
           "      --size S|HxW         store every image at S x S (or H x W) pixels, resized (antialiased)\n"
           "      --fit crop|stretch|pad  how --size gets there: crop = torchvision's Resize(S) + CenterCrop(S)\n"
           "                           (default), stretch = the whole image, aspect not kept, pad = the whole\n"
           "                           image inside, black around\n"
           "      --max-side N         with --codec jpeg: keep each image at its own size, shrunk to N pixels on\n"
           "                           its longer side when larger (JPEGs already small enough are stored as they\n"
           "                           are); training crops them at load time (train/loadbench --image-size)\n"
           "      --channels 1|3       RGB (default) or gray\n"
           "      --skip-bad           leave out files that are no usable image (truncated, not an image, an\n"
           "                           unsupported format, zero-sized), list them in the manifest and go on;\n"
           "                           without it the first such file stops the pack, named\n"
           "      --exif-rotate        turn images as their EXIF orientation says (torchvision does not)\n"
           "  Without --size or --max-side every image must have the size of the first one.\n"
           "  -h, --help               print this help\n\n"
           "Examples:\n"
           "  $ ringtrain pack data/src --out data/cifar10\n"
           "  $ ringtrain pack cifar-10-python.tar.gz --out data/c10 --val-split 0.1\n"
           "  $ ringtrain pack ~/photos --out data/photos64 --size 64 --skip-bad\n"
           "  $ ringtrain pack ~/photos --out data/photos --codec jpeg --max-side 320 --val-split 0.1\n");
}

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

/* Image folders: images/s, pass-through JPEGs, and what was ignored and skipped (listed in the manifest). */
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
}

int cmd_pack(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"out", required_argument, NULL, 'o'},           {"codec", required_argument, NULL, 'c'},
        {"quality", required_argument, NULL, 'q'},       {"level", required_argument, NULL, 'l'},
        {"shard-size", required_argument, NULL, 'S'},    {"block-records", required_argument, NULL, 'b'},
        {"val-split", required_argument, NULL, 'v'},     {"split-seed", required_argument, NULL, 's'},
        {"label", required_argument, NULL, 'L'},         {"threads", required_argument, NULL, 'j'},
        {"force", no_argument, NULL, 'f'},               {"help", no_argument, NULL, 'h'},
        {"size", required_argument, NULL, 1},            {"fit", required_argument, NULL, 2},
        {"max-side", required_argument, NULL, 3},        {"channels", required_argument, NULL, 4},
        {"skip-bad", no_argument, NULL, 5},              {"exif-rotate", no_argument, NULL, 6},
        {NULL, 0, NULL, 0},
    };
    struct rt_pack_opts o = {0};
    struct rt_pack_stats st;
    struct progress_state ps = {isatty(STDERR_FILENO), 0};
    const char *out = NULL;
    uint64_t v;
    char *end;
    int c, fit_given = 0;

    optind = 1;
    while ((c = getopt_long(argc, argv, "o:c:q:l:S:b:v:s:L:j:fh", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'c':
            if (!strcmp(optarg, "raw"))
                o.codec = RT_CODEC_RAW;
            else if (!strcmp(optarg, "jpeg"))
                o.codec = RT_CODEC_JPEG;
            else
                return cli_usage_error("pack", "--codec must be raw or jpeg, not '%s'", optarg);
            break;
        case 'q':
            if (cli_parse_u64("pack", "--quality", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 100)
                return cli_usage_error("pack", "--quality must be in 1..100");
            o.quality = (int)v;
            break;
        case 'l':
            if (cli_parse_u64("pack", "--level", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 22)
                return cli_usage_error("pack", "--level must be in 1..22");
            o.level = (int)v;
            break;
        case 'S':
            if (rt_parse_size(optarg, &o.shard_bytes) < 0 || o.shard_bytes == 0)
                return cli_usage_error("pack", "--shard-size: %s", o.shard_bytes ? rt_errmsg() : "must be > 0");
            break;
        case 'b':
            if (cli_parse_u64("pack", "--block-records", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 1u << 20)
                return cli_usage_error("pack", "--block-records must be in 1..1048576");
            o.block_records = (uint32_t)v;
            break;
        case 'v':
            o.val_split = strtod(optarg, &end);
            if (*end || end == optarg || !(o.val_split >= 0 && o.val_split < 1))
                return cli_usage_error("pack", "--val-split must be a fraction in [0, 1), got '%s'", optarg);
            break;
        case 's':
            if (cli_parse_u64("pack", "--split-seed", optarg, &o.split_seed))
                return RT_EXIT_USAGE;
            break;
        case 'L':
            if (!strcmp(optarg, "fine"))
                o.label = RT_LABEL_FINE;
            else if (!strcmp(optarg, "coarse"))
                o.label = RT_LABEL_COARSE;
            else
                return cli_usage_error("pack", "--label must be fine or coarse");
            break;
        case 'j':
            if (cli_parse_u64("pack", "--threads", optarg, &v))
                return RT_EXIT_USAGE;
            o.threads = (int)RT_MIN(v, 1024);
            break;
        case 'f': o.force = 1; break;
        case 1: {
            unsigned long hh, ww;
            int n = 0;
            if (sscanf(optarg, "%lux%lu%n", &hh, &ww, &n) == 2 && !optarg[n]) {
                /* H x W */
            } else if (sscanf(optarg, "%lu%n", &hh, &n) == 1 && !optarg[n]) {
                ww = hh;
            } else {
                return cli_usage_error("pack", "--size takes S or HxW (e.g. 64 or 96x128), not '%s'", optarg);
            }
            if (hh < 1 || ww < 1 || hh > 65535 || ww > 65535)
                return cli_usage_error("pack", "--size %s out of range", optarg);
            o.size_h = (uint32_t)hh;
            o.size_w = (uint32_t)ww;
            break;
        }
        case 2:
            if (!strcmp(optarg, "crop"))
                o.fit = 0;
            else if (!strcmp(optarg, "stretch"))
                o.fit = 1;
            else if (!strcmp(optarg, "pad"))
                o.fit = 2;
            else
                return cli_usage_error("pack", "--fit must be crop, stretch or pad, not '%s'", optarg);
            fit_given = 1;
            break;
        case 3:
            if (cli_parse_u64("pack", "--max-side", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 8 || v > 65535)
                return cli_usage_error("pack", "--max-side must be in 8..65535");
            o.max_side = (uint32_t)v;
            break;
        case 4:
            if (cli_parse_u64("pack", "--channels", optarg, &v))
                return RT_EXIT_USAGE;
            if (v != 1 && v != 3)
                return cli_usage_error("pack", "--channels must be 1 or 3");
            o.channels = (uint32_t)v;
            break;
        case 5: o.skip_bad = 1; break;
        case 6: o.exif_rotate = 1; break;
        case 'h': pack_help(); return RT_EXIT_OK;
        default: return cli_usage_error("pack", "unknown option");
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("pack", optind == argc ? "INPUT is required" : "exactly one INPUT, please");
    if (!out)
        return cli_usage_error("pack", "--out DIR is required");
    if (fit_given && !o.size_h)
        return cli_usage_error("pack", "--fit goes with --size");
    if (o.max_side && o.codec != RT_CODEC_JPEG)
        return cli_usage_error("pack", "--max-side keeps each image at its own size, which only the jpeg codec "
                                       "stores: add --codec jpeg");
    o.progress = on_progress;
    o.progress_ctx = &ps;
    int rc = rt_pack(argv[optind], out, &o, &st);
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
           st.source, out, st.shards, in_s, out_s, st.bytes_out ? (double)st.bytes_in / (double)st.bytes_out : 0.0,
           st.seconds, st.seconds > 0 ? (double)st.bytes_in / st.seconds / 1e6 : 0.0);
    if (st.files)
        print_folder_summary(&st, out);
    return RT_EXIT_OK;
}
