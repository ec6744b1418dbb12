/*
 * test_format.c - the shard and manifest readers against hostile bytes:
 * every header field, the label and index sections, block checksums,
 * truncation at every section boundary, newer versions, and manifest
 * mutations. A valid shard to start from is made by packing a small
 * synthetic CIFAR-10 (seed 7).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "loader/format.h"
#include "loader/offline.h"
#include "test_util.h"

static char root[256], shard_path[512];

static void make_dataset(void)
{
    char src[300], out[300];
    struct rt_synth_opts so = {.format = RT_SYNTH_CIFAR10, .train = 200, .test = 50, .seed = 7, .threads = 1};
    struct rt_pack_opts po = {.block_records = 16, .threads = 2};

    tu_tempdir(root, sizeof(root), "format");
    snprintf(src, sizeof(src), "%s/src", root);
    snprintf(out, sizeof(out), "%s/ds", root);
    CHECK_OK(rt_synth_write(src, &so));
    CHECK_OK(rt_pack(src, out, &po, NULL));
    snprintf(shard_path, sizeof(shard_path), "%s/ds/train-00000.rts", root);
}

/* Parses header+labels+index+every block of an in-memory shard; 0 or -errno. */
static int parse_all(const uint8_t *buf, size_t len)
{
    struct rt_shard_header h;
    struct rt_decoder *dec;
    int rc = rt_shard_parse_header(buf, len, "mem", &h);
    if (rc < 0)
        return rc;
    if (h.file_size != len)
        return rt_errf(-EBADMSG, "mem: size");
    int32_t *labels = malloc(4 * h.record_count);
    struct rt_block_entry *bl = malloc(sizeof(*bl) * h.block_count);
    uint8_t *px = malloc(16 * 3072);
    rc = rt_shard_parse_labels(&h, buf + h.labels_offset, 4 * h.record_count, "mem", labels);
    if (rc == 0)
        rc = rt_shard_parse_index(&h, buf + h.index_offset, 32 * (size_t)h.block_count, "mem", bl);
    if (rc == 0 && (rc = rt_decoder_create(&dec)) == 0) {
        for (uint32_t b = 0; b < h.block_count && rc == 0; b++)
            rc = rt_block_decode(dec, &h, &bl[b], b, buf + bl[b].offset, px, "mem");
        rt_decoder_destroy(dec);
    }
    free(labels);
    free(bl);
    free(px);
    return rc;
}

/* Re-seals the header checksum so a test reaches the field checks behind it. */
static void reseal(uint8_t *buf) { rt_put64(buf + HDR_XXH64, XXH64(buf, HDR_XXH64, 0)); }

static void test_header_fields(const uint8_t *good, size_t len)
{
    uint8_t *buf = malloc(len);
    struct rt_shard_header h;

    CHECK_OK(parse_all(good, len));
    CHECK_OK(rt_shard_parse_header(good, len, "mem", &h));
    CHECK(h.version == 1 && h.codec == RT_CODEC_RAW && h.channels == 3 && h.height == 32 && h.width == 32);
    CHECK(h.record_count == 200 && h.block_count == 13 && h.split == RT_SPLIT_TRAIN && h.num_classes == 10);

    /* Any single flipped header byte is caught (magic, checksum, or a field check). */
    for (size_t i = 0; i < RT_SHARD_HEADER_SIZE; i++) {
        memcpy(buf, good, len);
        buf[i] ^= 0x5a;
        CHECKF(rt_shard_parse_header(buf, len, "mem", &h) < 0, "header byte %zu flipped", i);
    }

    struct {
        int off, width;
        uint64_t value;
        const char *needle;
    } cases[] = {
        {HDR_CODEC, 4, 7, "unknown codec"},
        {HDR_COMPRESSION, 4, 9, "block compression"},
        {HDR_SPLIT, 4, 3, "unknown split"},
        {HDR_CHANNELS, 4, 0, "channel count"},
        {HDR_HEIGHT, 4, 70000, "image size"},
        {HDR_NUM_CLASSES, 4, 0, "class count"},
        {HDR_RECORD_COUNT, 8, 0, "record count"},
        {HDR_BLOCK_COUNT, 4, 201, "block count"},
        {HDR_LABELS_OFFSET, 8, 64, "labels offset"},
        {HDR_INDEX_OFFSET, 8, 999, "index offset"},
        {HDR_DATA_OFFSET, 8, 5, "data offset"},
        {HDR_FILE_SIZE, 8, 10, "file size"},
        {HDR_RESERVED, 8, 1, "reserved"},
        {HDR_SIZE, 4, 64, "header size"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(cases); i++) {
        memcpy(buf, good, len);
        if (cases[i].width == 4)
            rt_put32(buf + cases[i].off, (uint32_t)cases[i].value);
        else
            rt_put64(buf + cases[i].off, cases[i].value);
        reseal(buf);
        CHECK_ERR(rt_shard_parse_header(buf, len, "mem", &h), cases[i].needle);
    }

    /* Newer version: a clear message, a distinct error code. */
    memcpy(buf, good, len);
    rt_put32(buf + HDR_VERSION, RT_SHARD_VERSION + 1);
    reseal(buf);
    int rc = rt_shard_parse_header(buf, len, "mem", &h);
    CHECK(rc == -EPROTONOSUPPORT);
    CHECK(strstr(rt_errmsg(), "newer ringtrain") != NULL);
    /* The same version field changed by a flipped byte, the header not resealed: corrupt, not newer. */
    memcpy(buf, good, len);
    buf[HDR_VERSION] ^= 0x40;
    rc = rt_shard_parse_header(buf, len, "mem", &h);
    CHECK(rc == -EBADMSG);
    CHECKF(strstr(rt_errmsg(), "header is corrupt") && !strstr(rt_errmsg(), "was written by a newer"), "%s",
           rt_errmsg());
    /* Version 2 is for variable-size JPEG records only. */
    memcpy(buf, good, len);
    rt_put32(buf + HDR_VERSION, RT_SHARD_VERSION_VARIABLE);
    reseal(buf);
    CHECK_ERR(rt_shard_parse_header(buf, len, "mem", &h), "variable-size JPEG records");
    memcpy(buf, good, len);
    memcpy(buf, "RTSHARX", 7);
    CHECK_ERR(rt_shard_parse_header(buf, len, "mem", &h), "bad magic");
    CHECK_ERR(rt_shard_parse_header(good, 100, "mem", &h), "truncated shard header");
    free(buf);
}

static void test_sections(const uint8_t *good, size_t len)
{
    uint8_t *buf = malloc(len);
    struct rt_shard_header h;
    CHECK_OK(rt_shard_parse_header(good, len, "mem", &h));

    /* A label out of range, with the label checksum made to match. */
    memcpy(buf, good, len);
    rt_put32(buf + h.labels_offset + 4 * 5, 10);
    rt_put64(buf + HDR_LABELS_XXH64, XXH64(buf + h.labels_offset, 4 * h.record_count, 0));
    reseal(buf);
    CHECK_ERR(parse_all(buf, len), "record 5");
    CHECK(strstr(rt_errmsg(), "out of range") != NULL);
    /* A flipped label without fixing the checksum. */
    memcpy(buf, good, len);
    buf[h.labels_offset + 9] ^= 1;
    CHECK_ERR(parse_all(buf, len), "label section checksum");

    /* Index: non-contiguous blocks, records that do not add up (checksum re-made). */
    struct {
        int field_off;
        uint32_t delta;
        const char *needle;
    } idx_cases[] = {{0, 4, "contiguous"}, {16, 1, "do not continue"}, {20, 1, "raw size"},
                     {12, 3, "raw size"}, {8, 100000000, "past the end"}};
    for (size_t i = 0; i < RT_ARRAY_LEN(idx_cases); i++) {
        memcpy(buf, good, len);
        uint8_t *e = buf + h.index_offset + 32 * 2 + idx_cases[i].field_off;
        rt_put32(e, rt_le32(e) + idx_cases[i].delta);
        rt_put64(buf + HDR_INDEX_XXH64, XXH64(buf + h.index_offset, 32 * (size_t)h.block_count, 0));
        reseal(buf);
        CHECK_ERR(parse_all(buf, len), idx_cases[i].needle);
        CHECK(strstr(rt_errmsg(), "block 2") != NULL || strstr(rt_errmsg(), "block 3") != NULL);
    }
    memcpy(buf, good, len);
    buf[h.index_offset + 40] ^= 0x10;
    CHECK_ERR(parse_all(buf, len), "block index checksum");

    /* A corrupt byte inside block 4's data: the checksum names the block. */
    struct rt_block_entry bl[13];
    CHECK_OK(rt_shard_parse_index(&h, good + h.index_offset, 32 * 13, "mem", bl));
    memcpy(buf, good, len);
    buf[bl[4].offset + bl[4].stored_size / 2] ^= 0xff;
    CHECK_ERR(parse_all(buf, len), "block 4");
    CHECK(strstr(rt_errmsg(), "checksum mismatch") != NULL);

    /* Corrupt zstd data with a matching checksum: zstd itself must refuse it. */
    memcpy(buf, good, len);
    memset(buf + bl[4].offset + 6, 0xee, 24);
    uint8_t *e = buf + h.index_offset + 32 * 4;
    rt_put64(e + 24, XXH64(buf + bl[4].offset, bl[4].stored_size, 0));
    rt_put64(buf + HDR_INDEX_XXH64, XXH64(buf + h.index_offset, 32 * 13, 0));
    reseal(buf);
    CHECK_ERR(parse_all(buf, len), "block 4");
    free(buf);
}

static void test_truncation(const uint8_t *good, size_t len)
{
    char path[600];
    struct rt_shard *sh;
    size_t cuts[] = {0, 1, 64, 127, 128, 200, 128 + 800, 1000, len / 2, len - 1};

    snprintf(path, sizeof(path), "%s/cut.rts", root);
    for (size_t i = 0; i < RT_ARRAY_LEN(cuts); i++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && write(fd, good, cuts[i]) == (ssize_t)cuts[i]);
        close(fd);
        int rc = rt_shard_open(path, &sh);
        CHECKF(rc < 0, "open of a shard cut at %zu succeeded", cuts[i]);
        CHECKF(strstr(rt_errmsg(), "cut.rts") && strstr(rt_errmsg(), "truncated"), "cut %zu: '%s'", cuts[i],
               rt_errmsg());
        if (rc == 0)
            rt_shard_close(sh);
    }
    CHECK_ERR(rt_shard_open("/nonexistent/x.rts", &sh), "/nonexistent/x.rts");
}

static void test_manifest(void)
{
    char path[600];
    uint8_t *text;
    size_t len;
    struct rt_dataset *ds;

    snprintf(path, sizeof(path), "%s/ds/manifest.json", root);
    CHECK_OK(rt_file_read(path, &text, &len));
    CHECK_OK(rt_dataset_parse_manifest("d", (char *)text, len, "m.json", &ds));
    if (ds) {
        const struct rt_dataset_info *info = rt_dataset_info(ds);
        CHECK(info->split[RT_SPLIT_TRAIN].records == 200 && info->split[RT_SPLIT_TEST].records == 50);
        CHECK(info->num_classes == 10 && info->codec == RT_CODEC_RAW && info->height == 32);
        rt_dataset_close(ds);
    }

    /* Each mutation replaces one substring of the good manifest. */
    struct {
        const char *from, *to, *needle;
    } muts[] = {
        {"\"ringtrain-dataset\"", "\"other\"", "not a ringtrain dataset"},
        {"\"version\": 1", "\"version\": 9", "newer ringtrain"},
        {"\"codec\": \"raw\"", "\"codec\": \"png\"", "codec"},
        {"\"num_classes\": 10", "\"num_classes\": 11", "classes"},
        {"\"file\": \"train-00000.rts\"", "\"file\": \"../train-00000.rts\"", "plain file name"},
        {"\"records\": 200", "\"records\": 201", "records"},
        {"\"test\": {", "\"bogus\": {", "unknown split"},
        {"\"shape\": [\n    3", "\"shape\": [\n    0", "shape"},
        {"\"xxh64\": \"", "\"xxh64\": \"Z", "hex"},
        {"{", "[", "not valid JSON"},
        {"\"format\"", "\"format\": 1, \"format\"", "line"},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(muts); i++) {
        const char *at = strstr((char *)text, muts[i].from);
        CHECKF(at != NULL, "mutation %zu: '%s' not in the manifest", i, muts[i].from);
        if (!at)
            continue;
        size_t pre = (size_t)(at - (char *)text), fl = strlen(muts[i].from), tl = strlen(muts[i].to);
        char *m = malloc(len + tl + 1);
        memcpy(m, text, pre);
        memcpy(m + pre, muts[i].to, tl);
        memcpy(m + pre + tl, at + fl, len - pre - fl + 1);
        CHECK_ERR(rt_dataset_parse_manifest("d", m, strlen(m), "m.json", &ds), muts[i].needle);
        CHECK(strstr(rt_errmsg(), "m.json") != NULL);
        free(m);
    }
    /* Every prefix of the manifest is rejected, never a crash. */
    for (size_t cut = 0; cut + 1 < len; cut += 7)
        CHECK(rt_dataset_parse_manifest("d", (char *)text, cut, "m.json", &ds) < 0);
    free(text);
    CHECK_ERR(rt_dataset_open(root, &ds), "not a packed dataset");
}

int main(void)
{
    uint8_t *good;
    size_t len;

    make_dataset();
    if (rt_file_read(shard_path, &good, &len) < 0) {
        fprintf(stderr, "no shard to test: %s\n", rt_errmsg());
        return 1;
    }
    test_header_fields(good, len);
    test_sections(good, len);
    test_truncation(good, len);
    test_manifest();
    free(good);
    rt_remove_tree(root);
    return check_result();
}
