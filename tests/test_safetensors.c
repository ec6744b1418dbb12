/*
 * test_safetensors.c - the safetensors reader and writer (compute.h): a round
 * trip of every dtype and of the awkward shapes (scalar, zero-size, 4-D)
 * with metadata and dotted names; a file laid out by hand as another writer
 * would (padding spaces, header not in data order, unaligned data); every
 * kind of malformed file rejected with a message naming the file, the tensor
 * and the fault; bad writer arguments; and atomicity (a failed write leaves
 * nothing new and the old file intact). Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "common/common.h"
#include "compute/compute.h"
#include "test_util.h"

static char root[256];

static void path_of(char *buf, size_t len, const char *rel) { snprintf(buf, len, "%s/%s", root, rel); }

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static struct rt_st_tensor tensor(const char *name, enum rt_st_dtype d, int ndim, const int64_t *shape,
                                  const void *data)
{
    struct rt_st_tensor t = {.dtype = d, .ndim = ndim, .data = data};
    size_t n = rt_st_dtype_size(d);
    snprintf(t.name, sizeof(t.name), "%s", name);
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t.bytes = n;
    return t;
}

/* Reads an 8-byte little-endian value. */
static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = v << 8 | p[b];
    return v;
}

static void test_dtypes(void)
{
    CHECK(rt_st_dtype_size(RT_ST_F32) == 4 && rt_st_dtype_size(RT_ST_F16) == 2 && rt_st_dtype_size(RT_ST_BF16) == 2 &&
          rt_st_dtype_size(RT_ST_I64) == 8 && rt_st_dtype_size(RT_ST_I32) == 4 && rt_st_dtype_size(RT_ST_U8) == 1);
    CHECK(!strcmp(rt_st_dtype_name(RT_ST_F32), "F32") && !strcmp(rt_st_dtype_name(RT_ST_BF16), "BF16") &&
          !strcmp(rt_st_dtype_name(RT_ST_I64), "I64") && !strcmp(rt_st_dtype_name(RT_ST_U8), "U8"));
    CHECK(rt_st_dtype_name((enum rt_st_dtype)99) == NULL && rt_st_dtype_size((enum rt_st_dtype)99) == 0);
}

static void test_round_trip(void)
{
    static float w4[2 * 3 * 4 * 5], big[1 << 20];
    float scalar = 3.25f;
    uint16_t f16[7], bf16[3];
    int64_t i64[4] = {-1, 0, INT64_MAX, INT64_MIN};
    int32_t i32[5] = {1, -2, 3, -4, 5};
    uint8_t u8[3] = {0, 128, 255};
    char path[600];

    for (size_t i = 0; i < RT_ARRAY_LEN(w4); i++)
        w4[i] = (float)i * 0.5f - 7;
    for (size_t i = 0; i < RT_ARRAY_LEN(big); i++)
        big[i] = (float)(i % 1000) / 7.0f;
    for (int i = 0; i < 7; i++)
        f16[i] = (uint16_t)(0x3c00 + i);
    for (int i = 0; i < 3; i++)
        bf16[i] = (uint16_t)(0x3f80 + i);

    /* U8 of 3 bytes first: every tensor after it sits at an odd offset. */
    struct rt_st_tensor t[] = {
        tensor("bn1.num_batches_tracked.u8", RT_ST_U8, 1, (int64_t[]){3}, u8),
        tensor("layer1.0.conv1.weight", RT_ST_F32, 4, (int64_t[]){2, 3, 4, 5}, w4),
        tensor("scalar", RT_ST_F32, 0, NULL, &scalar),
        tensor("empty.bias", RT_ST_I64, 2, (int64_t[]){0, 3}, NULL),
        tensor("half", RT_ST_F16, 1, (int64_t[]){7}, f16),
        tensor("brain", RT_ST_BF16, 2, (int64_t[]){3, 1}, bf16),
        tensor("bn1.running_mean.i64", RT_ST_I64, 1, (int64_t[]){4}, i64),
        tensor("fc.weight.i32", RT_ST_I32, 1, (int64_t[]){5}, i32),
        tensor("\xc3\xbcnicode.w\xc3\xa9ight \"quoted\"", RT_ST_U8, 1, (int64_t[]){1}, u8),
        tensor("big", RT_ST_F32, 2, (int64_t[]){1024, 1024}, big),
    };
    const int n = (int)RT_ARRAY_LEN(t);
    const char *meta[] = {"format", "pt", "epoch", "12", "note", "d\xc3\xa9j\xc3\xa0 \"vu\"\n"};

    path_of(path, sizeof(path), "rt.safetensors");
    CHECK_OK(rt_st_write(path, t, n, meta, 3));

    /* The bytes: header length a multiple of 8, JSON from byte 8, data 8-byte aligned. */
    uint8_t *raw = NULL;
    size_t len = 0;
    CHECK_OK(rt_file_read(path, &raw, &len));
    if (raw && len >= 8) {
        uint64_t hlen = le64(raw);
        size_t data = 0;
        for (int i = 0; i < n; i++)
            data += t[i].bytes;
        CHECK(hlen % 8 == 0);
        CHECK(raw[8] == '{');
        CHECK(8 + hlen + data == len);
        CHECK(raw[8 + hlen - 1] == ' ' || raw[8 + hlen - 1] == '}');
    }
    free(raw);

    struct rt_st_file *f = NULL;
    CHECK_OK(rt_st_read(path, &f));
    if (!f)
        return;
    CHECK(rt_st_count(f) == n);
    for (int i = 0; i < n && i < rt_st_count(f); i++) {
        const struct rt_st_tensor *g = rt_st_get(f, i);
        /* Data-section order is the order written. */
        CHECKF(!strcmp(g->name, t[i].name), "tensor %d is '%s', wrote '%s'", i, g->name, t[i].name);
        CHECK(g->dtype == t[i].dtype && g->ndim == t[i].ndim && g->bytes == t[i].bytes);
        CHECK(memcmp(g->shape, t[i].shape, sizeof(int64_t) * (size_t)t[i].ndim) == 0);
        CHECK(t[i].bytes == 0 || memcmp(g->data, t[i].data, t[i].bytes) == 0);
        CHECK(rt_st_find(f, t[i].name) == g);
    }
    CHECK(rt_st_get(f, -1) == NULL && rt_st_get(f, n) == NULL);
    CHECK(rt_st_find(f, "layer1.0.conv1") == NULL && rt_st_find(f, "") == NULL);
    CHECK(rt_st_find(f, "__metadata__") == NULL);
    const struct rt_st_tensor *s = rt_st_find(f, "scalar");
    float sv = 0;
    if (s) {
        memcpy(&sv, s->data, sizeof(sv)); /* data may be unaligned */
        CHECK(s->ndim == 0 && s->bytes == 4 && sv == 3.25f);
    }
    CHECK(rt_st_meta(f, "format") && !strcmp(rt_st_meta(f, "format"), "pt"));
    CHECK(rt_st_meta(f, "epoch") && !strcmp(rt_st_meta(f, "epoch"), "12"));
    CHECK(rt_st_meta(f, "note") && !strcmp(rt_st_meta(f, "note"), meta[5]));
    CHECK(rt_st_meta(f, "missing") == NULL);
    rt_st_close(f);
    rt_st_close(NULL);

    /* No tensors and no metadata: "{}" padded to 8 bytes, and it reads back empty. */
    path_of(path, sizeof(path), "empty.safetensors");
    CHECK_OK(rt_st_write(path, NULL, 0, NULL, 0));
    CHECK_OK(rt_st_read(path, &f));
    CHECK(f && rt_st_count(f) == 0 && rt_st_meta(f, "format") == NULL);
    rt_st_close(f);
    CHECK_OK(rt_file_read(path, &raw, &len));
    CHECK(len == 16 && le64(raw) == 8 && !memcmp(raw + 8, "{}      ", 8));
    free(raw);

    /* Rewriting what was read gives the same bytes (metadata aside, which has no iterator). */
    path_of(path, sizeof(path), "rt.safetensors");
    CHECK_OK(rt_st_read(path, &f));
    if (f) {
        char again[600];
        path_of(again, sizeof(again), "rt2.safetensors");
        struct rt_st_tensor copy[RT_ARRAY_LEN(t)];
        for (int i = 0; i < n; i++)
            copy[i] = *rt_st_get(f, i);
        CHECK_OK(rt_st_write(again, copy, n, meta, 3));
        uint8_t *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        CHECK_OK(rt_file_read(path, &a, &la));
        CHECK_OK(rt_file_read(again, &b, &lb));
        CHECK(a && b && la == lb && !memcmp(a, b, la));
        free(a);
        free(b);
        rt_st_close(f);
    }
}

/* Writes u64 header length, the header bytes and the data as a file at `path`. */
static void write_file(const char *path, uint64_t hlen, const char *header, size_t header_bytes, const void *data,
                       size_t dlen)
{
    size_t len = 8 + header_bytes + dlen;
    uint8_t *buf = malloc(len);
    for (int b = 0; b < 8; b++)
        buf[b] = (uint8_t)(hlen >> (8 * b));
    memcpy(buf + 8, header, header_bytes);
    if (dlen)
        memcpy(buf + 8 + header_bytes, data, dlen);
    CHECK_OK(rt_file_write_atomic(path, buf, len));
    free(buf);
}

/* A file another writer made: padding that is not to 8, header keys not in data order, metadata between them. */
static void test_foreign(void)
{
    const char *h = "{\"b.weight\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[5,13]},"
                    " \"__metadata__\" : {\"k\": \"v\"},\n"
                    "\"a\":{\"shape\":[5],\"dtype\":\"U8\",\"data_offsets\":[0,5]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[13,13]}}   ";
    uint8_t data[13] = {1, 2, 3, 4, 5};
    int32_t b[2] = {-7, 123456789};
    char path[600];
    struct rt_st_file *f = NULL;

    memcpy(data + 5, b, sizeof(b));
    path_of(path, sizeof(path), "foreign.safetensors");
    write_file(path, strlen(h), h, strlen(h), data, sizeof(data));
    CHECK_OK(rt_st_read(path, &f));
    if (!f)
        return;
    CHECK(rt_st_count(f) == 3);
    const struct rt_st_tensor *a = rt_st_get(f, 0), *w = rt_st_get(f, 1), *z = rt_st_get(f, 2);
    CHECK(a && !strcmp(a->name, "a") && a->dtype == RT_ST_U8 && a->bytes == 5 && !memcmp(a->data, data, 5));
    CHECK(w && !strcmp(w->name, "b.weight") && w->dtype == RT_ST_I32 && w->ndim == 1 && w->shape[0] == 2);
    if (w) {
        int32_t got[2];
        memcpy(got, w->data, sizeof(got)); /* at data offset 5: unaligned */
        CHECK(got[0] == -7 && got[1] == 123456789);
    }
    CHECK(z && !strcmp(z->name, "z") && z->bytes == 0 && z->ndim == 1 && z->shape[0] == 0);
    CHECK(rt_st_find(f, "b.weight") == w && rt_st_find(f, "a") == a && rt_st_find(f, "z") == z);
    CHECK(rt_st_meta(f, "k") && !strcmp(rt_st_meta(f, "k"), "v"));
    rt_st_close(f);
}

/* The header `h` (length as written) over `dlen` bytes of data must be refused naming `needle`. */
static void expect_bad_len(int line, uint64_t hlen, const char *h, size_t dlen, const char *needle)
{
    static int no;
    char path[600], rel[64];
    uint8_t data[64] = {0};
    struct rt_st_file *f = (struct rt_st_file *)&no;

    snprintf(rel, sizeof(rel), "bad-%d.safetensors", ++no);
    path_of(path, sizeof(path), rel);
    write_file(path, hlen, h, strlen(h), data, dlen);
    int rc = rt_st_read(path, &f);
    CHECKF(rc == -EBADMSG, "line %d: rc %d (%s)", line, rc, rt_errmsg());
    CHECKF(f == NULL, "line %d: *out not cleared", line);
    CHECKF(strstr(rt_errmsg(), needle) != NULL, "line %d: message '%s' lacks '%s'", line, rt_errmsg(), needle);
    CHECKF(strstr(rt_errmsg(), path) != NULL, "line %d: message '%s' does not name the file", line, rt_errmsg());
}

#define expect_bad(h, dlen, needle) expect_bad_len(__LINE__, strlen(h), h, dlen, needle)

static void test_malformed(void)
{
    char path[600], h[512];
    struct rt_st_file *f = NULL;

    /* Too short for the length; a length past the file; a length over the cap. */
    path_of(path, sizeof(path), "short.safetensors");
    CHECK_OK(rt_file_write_atomic(path, "\x10\0\0\0", 4));
    CHECK_ERR(rt_st_read(path, &f), "too short");
    expect_bad_len(__LINE__, 100, "{}", 0, "runs past the end");
    expect_bad_len(__LINE__, (uint64_t)200 << 20, "{}", 0, "exceeds the 100000000-byte limit");
    expect_bad_len(__LINE__, UINT64_MAX, "{}", 0, "exceeds");
    path_of(path, sizeof(path), "missing.safetensors");
    CHECK_ERR(rt_st_read(path, &f), "missing.safetensors");

    /* Not JSON, not an object. */
    expect_bad("[1, 2]  ", 0, "does not begin with '{'");
    expect_bad("  {}", 0, "does not begin with '{'");
    expect_bad("{\"a\":", 0, "not valid JSON");
    expect_bad("{\"a\": 1} x", 0, "not valid JSON");
    expect_bad("{\"a\": \"\xff\"}", 0, "not valid JSON");
    expect_bad("{\"a\": 1}", 0, "tensor 'a': entry is not a JSON object");

    /* Entries. */
    expect_bad("{\"w\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor 'w': dtype 'C64'");
    expect_bad("{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'w': \"dtype\" missing");
    expect_bad("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"dtype\" missing");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "\"shape\" missing");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'w': \"data_offsets\" must be");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "\"data_offsets\" must be");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown key 'x'");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0] is not");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "shape[0] is not");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "9 dimensions");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}", 4,
               "overflows");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20,
               "tensor 'w': shape [2, 3] of F32 needs 24 bytes, data_offsets [0, 20] hold 20");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2, "run past the 2-byte data");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,0]}}", 4, "end before they begin");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]}}", 4, "non-negative");
    expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
               "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
               2, "duplicate");
    char longname[200];
    memset(longname, 'n', 150);
    longname[150] = '\0';
    snprintf(h, sizeof(h), "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", longname);
    expect_bad(h, 1, "name longer than 127 bytes");

    /* Layout: overlap, gap, bytes after the last tensor, data without tensors. */
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
               6, "tensor 'b' at [2, 6) overlaps tensor 'a'");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
               4, "overlaps");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
               "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}",
               10, "tensor 'b' starts at data offset 6: bytes [4, 6) belong to no tensor");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, "belong to no tensor");
    expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 6,
               "the data section holds 6 bytes but the tensors end at 4");
    expect_bad("{}", 3, "holds 3 bytes");

    /* Metadata. */
    expect_bad("{\"__metadata__\":{\"epoch\":3}}", 0, "__metadata__['epoch'] is not a string");
    expect_bad("{\"__metadata__\":[\"a\"]}", 0, "\"__metadata__\" is not a JSON object");
    expect_bad("{\"__metadata__\":{\"a\":\"b\"},\"__metadata__\":{}}", 0, "duplicate");
}

static void test_bad_args(void)
{
    float x[6] = {0};
    char path[600];
    struct rt_st_tensor t[2] = {tensor("a", RT_ST_F32, 2, (int64_t[]){2, 3}, x),
                                tensor("b", RT_ST_F32, 1, (int64_t[]){6}, x)};
    const char *meta[] = {"k", "v", "k", "w"};

    path_of(path, sizeof(path), "args.safetensors");
    t[0].bytes = 20;
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "tensor 'a': shape [2, 3] of F32 is 24 bytes, but bytes = 20");
    t[0].bytes = 24;
    strcpy(t[1].name, "a");
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "tensor 'a' given twice");
    strcpy(t[1].name, "__metadata__");
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "reserved");
    strcpy(t[1].name, "bad\xff");
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "not valid UTF-8");
    t[1].name[0] = '\0';
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "name empty");
    strcpy(t[1].name, "b");
    t[1].data = NULL;
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "no data");
    t[1].data = x;
    t[1].ndim = 9;
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "9 dimensions");
    t[1].ndim = 1;
    t[1].dtype = (enum rt_st_dtype)42;
    CHECK_ERR(rt_st_write(path, t, 2, NULL, 0), "unknown dtype");
    t[1].dtype = RT_ST_F32;
    CHECK_ERR(rt_st_write(path, t, 2, meta, 2), "metadata key 'k' given twice");
    CHECK_ERR(rt_st_write(path, t, -1, NULL, 0), "bad tensor");
    CHECK(!exists(path));
    CHECK_OK(rt_st_write(path, t, 2, meta, 1));
}

static void test_atomic(void)
{
    static float big[64 << 10];
    char path[600], tmp[620], dir[600];
    float x[4] = {1, 2, 3, 4};
    struct rt_st_tensor t = tensor("x", RT_ST_F32, 1, (int64_t[]){4}, x);
    struct rt_st_tensor tb = tensor("big", RT_ST_F32, 1, (int64_t[]){64 << 10}, big);

    /* Into a directory that does not exist: an error naming it, and nothing created. */
    path_of(path, sizeof(path), "no/such/dir/w.safetensors");
    CHECK_ERR(rt_st_write(path, &t, 1, NULL, 0), "no/such/dir/w.safetensors");
    path_of(dir, sizeof(dir), "no");
    CHECK(!exists(dir));

    /* A failing write leaves the previous file as it was, and no temporary file. */
    path_of(path, sizeof(path), "keep.safetensors");
    CHECK_OK(rt_st_write(path, &t, 1, NULL, 0));
    pid_t pid = fork();
    if (pid == 0) {
        /* A file size limit below the new file: the write itself fails part-way. */
        struct rlimit rl = {16384, 16384};
        signal(SIGXFSZ, SIG_IGN);
        setrlimit(RLIMIT_FSIZE, &rl);
        int rc = rt_st_write(path, &tb, 1, NULL, 0);
        fprintf(stderr, "write under a 16 KiB file size limit: rc %d: %s\n", rc, rt_errmsg());
        _exit(rc == -EFBIG ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    path_of(dir, sizeof(dir), "");
    CHECK(tu_count_prefixed(dir, "keep.safetensors.tmp") == 0);
    struct rt_st_file *f = NULL;
    CHECK_OK(rt_st_read(path, &f));
    CHECK(f && rt_st_count(f) == 1 && rt_st_find(f, "x") && !memcmp(rt_st_find(f, "x")->data, x, sizeof(x)));
    rt_st_close(f);

    /* A successful write replaces it. */
    CHECK_OK(rt_st_write(path, &tb, 1, NULL, 0));
    CHECK_OK(rt_st_read(path, &f));
    CHECK(f && rt_st_count(f) == 1 && rt_st_find(f, "big") && !rt_st_find(f, "x"));
    rt_st_close(f);
    CHECK(!exists(tmp));
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(root, sizeof(root), "%s/rt-st-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    printf("test_safetensors: files in %s\n", root);
    test_dtypes();
    test_round_trip();
    test_foreign();
    test_malformed();
    test_bad_args();
    test_atomic();
    int rc = check_result();
    if (rc == 0)
        rt_remove_tree(root);
    return rc;
}
