/* cmd_inspect.c - `ringtrain inspect DIR [--record N [--split S] [--out FILE]]`. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"
#include "loader/offline.h"
#include "tools/cli.h"

static void inspect_help(void)
{
    printf("Usage: ringtrain inspect DIR [--record N [--split train|val|test] [--out FILE]]\n\n"
           "Without --record: the dataset summary (classes, counts per split and per class, shape, codec,\n"
           "the training split's per-channel mean and std, stored size). With --record N: that record's\n"
           "label, class name and location (shard, block); --out writes its image to look at.\n\n"
           "Options:\n"
           "  -r, --record N              show record N (counted from 0) of the split instead of the summary\n"
           "  -s, --split train|val|test  the split --record counts in (default train)\n"
           "  -o, --out FILE              write that record's image to FILE: .png, .ppm or .pgm (needs --record)\n"
           "  -h, --help                  print this help\n\n"
           "Examples:\n"
           "  $ ringtrain inspect data/cifar10\n"
           "  $ ringtrain inspect data/cifar10 --record 123 --split test --out r123.png\n");
}

static void print_summary(const struct rt_dataset_info *info)
{
    char stored[32], raw[32];
    uint64_t total = 0;
    uint32_t shards = 0;

    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++) {
        total += info->split[sp].records;
        shards += info->split[sp].nshards;
    }
    /* Variable sizes: the median record's pixels stand in for every record's. */
    const uint64_t px = info->height ? (uint64_t)info->height * info->width
                                     : (uint64_t)info->size_median[0] * info->size_median[1];
    uint64_t raw_bytes = total * info->channels * px;
    rt_format_bytes((double)info->stored_bytes, stored, sizeof(stored));
    rt_format_bytes((double)raw_bytes, raw, sizeof(raw));
    printf("dataset  %s\n", info->dir);
    printf("source   %s\n", info->source);
    if (info->height)
        printf("shape    %" PRIu32 "x%" PRIu32 "x%" PRIu32 " (CxHxW) uint8\n", info->channels, info->height, info->width);
    else
        printf("shape    %" PRIu32 " x own size (HxW: smallest %" PRIu32 "x%" PRIu32 ", median %" PRIu32 "x%" PRIu32
               ", largest %" PRIu32 "x%" PRIu32 "; longer side at most %" PRIu32 ")\n",
               info->channels, info->size_min[0], info->size_min[1], info->size_median[0], info->size_median[1],
               info->size_max[0], info->size_max[1], info->max_side);
    if (info->skipped_files || info->ignored_files)
        printf("files    %" PRIu64 " skipped as unusable (listed in the manifest), %" PRIu64 " ignored\n",
               info->skipped_files, info->ignored_files);
    printf("codec    %s\n", rt_codec_name(info->codec));
    printf("classes  %" PRIu32 "\n", info->num_classes);
    if (info->have_norm) {
        /* As torchvision's Normalize(mean, std) takes them: the training split, pixel / 255. */
        printf("mean    ");
        for (uint32_t c = 0; c < info->channels; c++)
            printf(" %.4f", (double)info->mean[c]);
        printf("  (training split, per channel, 0..1 units)\nstd     ");
        for (uint32_t c = 0; c < info->channels; c++)
            printf(" %.4f", (double)info->std[c]);
        printf("\n");
    } else {
        printf("mean     not recorded (packed by an older ringtrain or no training split)\n");
    }
    printf("stored   %s in %" PRIu32 " shards (%s%s of pixels, ratio %.2f)\n", stored, shards,
           info->height ? "" : "about ", raw,
           info->stored_bytes ? (double)raw_bytes / (double)info->stored_bytes : 0.0);
    printf("\n%-8s %10s %7s\n", "split", "records", "shards");
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        if (info->split[sp].records)
            printf("%-8s %10" PRIu64 " %7" PRIu32 "\n", rt_split_name((enum rt_split)sp), info->split[sp].records,
                   info->split[sp].nshards);
    printf("\n%5s  %-24s", "class", "name");
    for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
        if (info->split[sp].records)
            printf(" %8s", rt_split_name((enum rt_split)sp));
    printf("\n");
    for (uint32_t c = 0; c < info->num_classes; c++) {
        printf("%5" PRIu32 "  %-24.24s", c, info->class_names[c]);
        for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
            if (info->split[sp].records)
                printf(" %8" PRIu64, info->split[sp].class_counts[c]);
        printf("\n");
    }
}

static int show_record(const struct rt_dataset_info *info, enum rt_split sp, uint64_t n, const char *out)
{
    const struct rt_split_info *si = &info->split[sp];
    const struct rt_shard_ref *ref = NULL;
    struct rt_shard *sh = NULL;
    struct rt_decoder *dec = NULL;
    uint8_t *stored = NULL, *pixels = NULL;
    char path[4200];
    int rc;

    if (n >= si->records) {
        fprintf(stderr, "error: record %" PRIu64 " out of range: split %s has %" PRIu64 " records\n", n,
                rt_split_name(sp), si->records);
        return RT_EXIT_FAIL;
    }
    for (uint32_t i = 0; i < si->nshards && !ref; i++)
        if (n < si->shards[i].first_record + si->shards[i].records)
            ref = &si->shards[i];
    snprintf(path, sizeof(path), "%s/%s", info->dir, ref->file);
    if ((rc = rt_shard_open(path, &sh)) < 0 || (rc = rt_decoder_create(&dec)) < 0)
        goto out;
    const struct rt_shard_header *h = rt_shard_header(sh);
    const struct rt_block_entry *blocks = rt_shard_blocks(sh);
    uint64_t local = n - h->first_record;
    uint32_t b = 0;
    if (n < h->first_record || local >= h->record_count) {
        rc = rt_errf(-EBADMSG, "%s: holds records [%" PRIu64 ", +%" PRIu64 "), manifest disagrees (run verify)", path,
                     h->first_record, h->record_count);
        goto out;
    }
    while (local >= (uint64_t)blocks[b].first_record + blocks[b].record_count)
        b++;
    uint64_t rec = (uint64_t)h->channels * h->height * h->width;
    uint32_t rh = h->height, rw = h->width;
    const uint8_t *image;
    stored = rt_malloc(blocks[b].stored_size, "block");
    pixels = rt_malloc(rt_shard_variable(h) ? blocks[b].raw_size : rec * blocks[b].record_count, "pixels");
    if (!stored || !pixels) {
        rc = -1;
        goto out;
    }
    if ((rc = rt_shard_read_block(sh, b, stored)) < 0)
        goto out;
    if (rt_shard_variable(h)) {
        /* The block's JPEG payload, then the one record decoded whole at its own size. */
        struct rt_jpeg_record jr;
        if ((rc = rt_block_payload(dec, h, &blocks[b], b, stored, pixels, path)) < 0)
            goto out;
        rt_jpeg_block_record(h, &blocks[b], pixels, (uint32_t)(local - blocks[b].first_record), &jr);
        rh = jr.height;
        rw = jr.width;
        free(stored);
        stored = rt_malloc((size_t)h->channels * rh * rw, "pixels");
        if (!stored) {
            rc = -1;
            goto out;
        }
        if ((rc = rt_jpeg_record_decode(dec, h, &jr, stored, path)) < 0)
            goto out;
        image = stored;
    } else {
        if ((rc = rt_block_decode(dec, h, &blocks[b], b, stored, pixels, path)) < 0)
            goto out;
        image = pixels + rec * (local - blocks[b].first_record);
    }
    int32_t label = rt_shard_labels(sh)[local];
    printf("record %" PRIu64 " of %s: label %" PRId32 " (%s), shard %s, block %" PRIu32 ", record %" PRIu64
           " of the block\n",
           n, rt_split_name(sp), label, info->class_names[label], ref->file, b, local - blocks[b].first_record);
    if (out) {
        rc = rt_image_write(out, image, h->channels, rh, rw);
        if (rc == 0)
            printf("wrote %s (%" PRIu32 "x%" PRIu32 ", %" PRIu32 " channel%s)\n", out, rw, rh, h->channels,
                   h->channels == 1 ? "" : "s");
    }
out:
    free(stored);
    free(pixels);
    rt_decoder_destroy(dec);
    rt_shard_close(sh);
    return rc < 0 ? cli_fail() : RT_EXIT_OK;
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"record", required_argument, NULL, 'r'}, {"split", required_argument, NULL, 's'},
        {"out", required_argument, NULL, 'o'},    {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct rt_dataset *ds;
    const char *out = NULL;
    uint64_t record = 0;
    int have_record = 0, c, rc;
    enum rt_split split = RT_SPLIT_TRAIN;

    optind = 1;
    while ((c = getopt_long(argc, argv, "r:s:o:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if (cli_parse_u64("inspect", "--record", optarg, &record))
                return RT_EXIT_USAGE;
            have_record = 1;
            break;
        case 's': {
            int found = 0;
            for (int sp = 0; sp < RT_SPLIT_COUNT; sp++)
                if (!strcmp(optarg, rt_split_name((enum rt_split)sp))) {
                    split = (enum rt_split)sp;
                    found = 1;
                }
            if (!found)
                return cli_usage_error("inspect", "--split must be train, val or test");
            break;
        }
        case 'o': out = optarg; break;
        case 'h': inspect_help(); return RT_EXIT_OK;
        default: return cli_usage_error("inspect", "unknown option");
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("inspect", "exactly one dataset directory, please");
    if (out && !have_record)
        return cli_usage_error("inspect", "--out needs --record N");
    if (rt_dataset_open(argv[optind], &ds) < 0)
        return cli_fail();
    if (have_record) {
        rc = show_record(rt_dataset_info(ds), split, record, out);
    } else {
        print_summary(rt_dataset_info(ds));
        rc = RT_EXIT_OK;
    }
    rt_dataset_close(ds);
    return rc;
}
