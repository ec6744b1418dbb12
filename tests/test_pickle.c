/*
 * test_pickle.c - checks loader/pickle.c, the non-executing reader of the
 * CIFAR "python version" pickles.
 *
 * Good fixtures (written by tests/fixtures/make_pickle_fixtures.py with
 * Python 3 protocols 0-5, plus Python 2 cPickle streams assembled by hand)
 * must parse to exactly the values the script put in: every image byte,
 * every label, every name. Bad fixtures and small hand-built streams must be
 * refused with -EBADMSG and a message naming the file and the problem.
 * Hostile variants built in memory -- every prefix of every good fixture,
 * and byte flips from a fixed, printed seed -- must parse or be refused,
 * never crash, hang or leak (run under ASan/UBSan or valgrind).
 *
 * Needs RT_FIXTURES (the tests/fixtures directory); exits 77 without it.
 */
#include "loader/pickle.h"
#include "common/common.h"
#include "check.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLIP_SEED UINT64_C(0x5049434b4c45) /* "PICKLE" */
#define FLIPS_PER_FIXTURE 3000

static char fixdir[4096];

static const char *const c10_names[10] = {"airplane", "automobile", "bird", "cat", "deer",
                                          "dog", "frog", "horse", "ship", "truck"};

/* Reads fixtures/pickle/<name>; NULL (and a failed check) when missing. */
static uint8_t *load(const char *name, size_t *len)
{
    char path[4200];
    uint8_t *buf = NULL;

    snprintf(path, sizeof(path), "%s/%s", fixdir, name);
    int rc = rt_file_read(path, &buf, len);
    CHECKF(rc == 0, "%s", rt_errmsg());
    return rc == 0 ? buf : NULL;
}

static uint8_t pixel(uint64_t i, uint64_t j)
{
    return (uint8_t)((i * 31 + j * 7) % 256);
}

/* ---- good fixtures -------------------------------------------------------------- */

enum layout { C10, C100 };

static void check_batch_values(const char *name, const struct rt_cifar_py_batch *b, uint64_t n,
                               enum layout layout)
{
    uint64_t bad_pixels = 0, bad_labels = 0;

    CHECKF(b->n == n, "%s: n = %" PRIu64 ", want %" PRIu64, name, b->n, n);
    if (b->n != n || !b->data || !b->labels)
        return;
    for (uint64_t i = 0; i < n; i++)
        for (uint64_t j = 0; j < 3072; j++)
            bad_pixels += b->data[i * 3072 + j] != pixel(i, j);
    CHECKF(bad_pixels == 0, "%s: %" PRIu64 " image bytes differ", name, bad_pixels);
    for (uint64_t i = 0; i < n; i++) {
        int32_t fine = layout == C10 ? (int32_t)(i % 10) : (int32_t)((i * 37) % 100);
        bad_labels += b->labels[i] != fine;
        if (layout == C100)
            bad_labels += !b->coarse || b->coarse[i] != fine / 5;
    }
    CHECKF(bad_labels == 0, "%s: %" PRIu64 " labels differ", name, bad_labels);
    if (layout == C10)
        CHECKF(b->coarse == NULL, "%s: coarse labels in a CIFAR-10 batch", name);
}

static void test_good_batch(const char *name, uint64_t n, enum layout layout)
{
    struct rt_cifar_py_batch b;
    size_t len;
    uint8_t *buf = load(name, &len);

    if (!buf)
        return;
    int rc = rt_pickle_cifar_batch(buf, len, name, &b);
    CHECKF(rc == 0, "%s: %s", name, rt_errmsg());
    if (rc == 0)
        check_batch_values(name, &b, n, layout);
    rt_pickle_cifar_batch_free(&b);
    rt_pickle_cifar_batch_free(&b); /* freeing twice (a zeroed struct) is fine */

    /* A batch is not a meta file: refused, and the message says what is missing. */
    struct rt_cifar_py_meta m;
    CHECK_ERR(rt_pickle_cifar_meta(buf, len, name, &m), "label_names");
    CHECK(m.names == NULL && m.n == 0);
    free(buf);
}

static void test_good_meta(const char *name, enum layout layout)
{
    struct rt_cifar_py_meta m;
    size_t len;
    uint8_t *buf = load(name, &len);

    if (!buf)
        return;
    int rc = rt_pickle_cifar_meta(buf, len, name, &m);
    CHECKF(rc == 0, "%s: %s", name, rt_errmsg());
    if (rc == 0 && layout == C10) {
        CHECKF(m.n == 10, "%s: %zu names", name, m.n);
        for (size_t i = 0; i < m.n && i < 10; i++)
            CHECKF(strcmp(m.names[i], c10_names[i]) == 0, "%s: name %zu is '%s'", name, i,
                   m.names[i]);
        CHECK(m.coarse_names == NULL && m.ncoarse == 0);
    } else if (rc == 0) {
        char want[32];
        CHECKF(m.n == 100 && m.ncoarse == 20, "%s: %zu fine, %zu coarse", name, m.n, m.ncoarse);
        for (size_t i = 0; i < m.n && i < 100; i++) {
            if (i == 99)
                snprintf(want, sizeof(want), "z\xc3\xa9" "bre_99");
            else
                snprintf(want, sizeof(want), "fine_%02zu", i);
            CHECKF(strcmp(m.names[i], want) == 0, "%s: fine name %zu is '%s'", name, i,
                   m.names[i]);
        }
        for (size_t i = 0; i < m.ncoarse && i < 20; i++) {
            snprintf(want, sizeof(want), "coarse_%02zu", i);
            CHECKF(strcmp(m.coarse_names[i], want) == 0, "%s: coarse name %zu is '%s'", name, i,
                   m.coarse_names[i]);
        }
    }
    rt_pickle_cifar_meta_free(&m);
    rt_pickle_cifar_meta_free(&m);

    struct rt_cifar_py_batch b;
    CHECK_ERR(rt_pickle_cifar_batch(buf, len, name, &b), "'data'");
    CHECK(b.data == NULL && b.labels == NULL && b.n == 0);
    free(buf);
}

/* ---- bad fixtures ---------------------------------------------------------------- */

/* Both entry points must refuse the file; the message names it and contains `needle`. */
static void test_bad_fixture(const char *name, const char *needle)
{
    struct rt_cifar_py_batch b;
    struct rt_cifar_py_meta m;
    size_t len;
    uint8_t *buf = load(name, &len);

    if (!buf)
        return;
    CHECK_ERR(rt_pickle_cifar_batch(buf, len, name, &b), name);
    CHECK_ERR(rt_pickle_cifar_batch(buf, len, name, &b), needle);
    CHECK(rt_pickle_cifar_batch(buf, len, name, &b) == -EBADMSG);
    CHECK_ERR(rt_pickle_cifar_meta(buf, len, name, &m), name);
    CHECK_ERR(rt_pickle_cifar_meta(buf, len, name, &m), needle);
    free(buf);
}

/* ---- a small pickle writer for hand-built cases ------------------------------------ */

struct pb {
    uint8_t *p;
    size_t n, cap;
};

static void pb_raw(struct pb *b, const void *data, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = RT_MAX(b->cap * 2, b->n + n + 256);
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "test_pickle: out of memory\n");
            exit(1);
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_op(struct pb *b, uint8_t op)
{
    pb_raw(b, &op, 1);
}

static void pb_s(struct pb *b, const char *s)
{
    pb_raw(b, s, strlen(s));
}

/* A string literal, embedded NULs included. */
#define pb_lit(b, lit) pb_raw((b), (lit), sizeof(lit) - 1)

static void pb_le(struct pb *b, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        pb_op(b, (uint8_t)(v >> (8 * i)));
}

/* SHORT_BINUNICODE (str) or SHORT_BINBYTES (bytes). */
static void pb_text(struct pb *b, const char *s, int as_bytes)
{
    pb_op(b, as_bytes ? 'C' : 0x8c);
    pb_op(b, (uint8_t)strlen(s));
    pb_s(b, s);
}

enum int_style { INT_BIN, INT_LONG1, INT_TEXT, INT_LONG_TEXT };

static void pb_int(struct pb *b, int64_t v, enum int_style style)
{
    char tmp[32];

    switch (style) {
    case INT_BIN:
        if (v >= 0 && v < 256) {
            pb_op(b, 'K');
            pb_le(b, (uint64_t)v, 1);
        } else {
            pb_op(b, 'J');
            pb_le(b, (uint64_t)v, 4);
        }
        break;
    case INT_LONG1:
        pb_op(b, 0x8a);
        pb_op(b, 8);
        pb_le(b, (uint64_t)v, 8);
        break;
    case INT_TEXT:
        snprintf(tmp, sizeof(tmp), "I%" PRId64 "\n", v);
        pb_s(b, tmp);
        break;
    case INT_LONG_TEXT:
        snprintf(tmp, sizeof(tmp), "L%" PRId64 "L\n", v);
        pb_s(b, tmp);
        break;
    }
}

/* A numpy dtype: dtype(code, False, True) + BUILD (3, order, None, None, None, -1, -1, 0). */
static void pb_dtype(struct pb *b, const char *code, const char *order)
{
    /* Memoized under a LONG_BINPUT index past a gap, popped and fetched back, so
     * sparse memo keys, POP and LONG_BINGET are exercised too. */
    pb_lit(b, "cnumpy\ndtype\nr");
    pb_le(b, 3000, 4);
    pb_op(b, '0');
    pb_op(b, 'j');
    pb_le(b, 3000, 4);
    pb_text(b, code, 0);
    pb_lit(b, "\x89\x88\x87R(K\x03");
    pb_text(b, order, 0);
    pb_lit(b, "NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb");
}

struct spec {
    uint64_t n, cols;         /* data shape (n, cols) */
    const char *dtype, *order; /* of the data; default u1, | */
    int fortran;
    int fortran_as_text;      /* INT I00/I01 instead of NEWFALSE/NEWTRUE */
    int64_t data_delta;       /* bytes added to (or cut from) the raw data */
    int data_as_list;         /* an object array */
    int numpy2;               /* numpy._core spelling */
    int bytes_keys;
    int omit_data, omit_labels;
    uint64_t nlabels;         /* default n */
    int64_t label_override;   /* when >= -100000: label 1 takes this value */
    enum int_style int_style;
    const char *labels_dtype; /* NULL: a list; else a 1-D array of this dtype */
    const char *labels_order;
};

static void spec_defaults(struct spec *s, uint64_t n)
{
    memset(s, 0, sizeof(*s));
    s->n = n;
    s->cols = 3072;
    s->dtype = "u1";
    s->order = "|";
    s->nlabels = n;
    s->label_override = INT64_MIN;
}

static int64_t spec_label(const struct spec *s, uint64_t i)
{
    if (i == 1 && s->label_override != INT64_MIN)
        return s->label_override;
    return (int64_t)(i % 10);
}

/* _reconstruct(ndarray, (0,), b'b') + BUILD (1, shape, dtype, fortran, raw). */
static void pb_array(struct pb *b, const struct spec *s, const uint64_t *shape, size_t ndim,
                     const char *dtype, const char *order, int fortran, const void *raw,
                     size_t rawlen)
{
    pb_s(b, s->numpy2 ? "cnumpy._core.multiarray\n_reconstruct\n"
                      : "cnumpy.core.multiarray\n_reconstruct\n");
    pb_lit(b, "cnumpy\nndarray\nK\x00\x85" "C\x01" "b\x87R(K\x01(");
    for (size_t i = 0; i < ndim; i++)
        pb_int(b, (int64_t)shape[i], INT_BIN);
    pb_op(b, 't');
    pb_dtype(b, dtype, order);
    if (s->fortran_as_text)
        pb_s(b, fortran ? "I01\n" : "I00\n");
    else
        pb_op(b, fortran ? 0x88 : 0x89);
    if (s->data_as_list) {
        pb_lit(b, "]K\x01\x61"); /* [1] */
    } else {
        pb_op(b, 'B');
        pb_le(b, rawlen, 4);
        pb_raw(b, raw, rawlen);
    }
    pb_lit(b, "tb");
}

static void build_batch(struct pb *b, const struct spec *s)
{
    b->n = 0;
    pb_lit(b, "\x80\x03}q\x00(");
    if (!s->omit_data) {
        uint64_t shape[2] = {s->n, s->cols};
        size_t item = (size_t)(s->dtype[strlen(s->dtype) - 1] - '0');
        size_t rawlen = (size_t)((int64_t)(s->n * s->cols * item) + s->data_delta);
        uint8_t *raw = malloc(rawlen ? rawlen : 1);
        if (!raw)
            exit(1);
        for (size_t k = 0; k < rawlen; k++)
            raw[k] = pixel(k / 3072, k % 3072);
        pb_text(b, "data", s->bytes_keys);
        pb_array(b, s, shape, 2, s->dtype, s->order, s->fortran, raw, rawlen);
        free(raw);
    }
    if (!s->omit_labels) {
        pb_text(b, "labels", s->bytes_keys);
        if (s->labels_dtype) {
            size_t item = (size_t)(s->labels_dtype[1] - '0');
            int big = s->labels_order && s->labels_order[0] == '>';
            uint8_t raw[64 * 8];
            for (uint64_t i = 0; i < s->nlabels && i < 64; i++) {
                uint64_t v = (uint64_t)spec_label(s, i);
                for (size_t k = 0; k < item; k++)
                    raw[i * item + (big ? item - 1 - k : k)] = (uint8_t)(v >> (8 * k));
            }
            pb_array(b, s, &s->nlabels, 1, s->labels_dtype, s->labels_order, 1, raw,
                     (size_t)RT_MIN(s->nlabels, 64) * item);
        } else {
            pb_lit(b, "]q\x01(");
            for (uint64_t i = 0; i < s->nlabels; i++)
                pb_int(b, spec_label(s, i), s->int_style);
            pb_op(b, 'e');
        }
    }
    pb_lit(b, "u.");
}

static int parse_spec(const struct spec *s, struct rt_cifar_py_batch *out)
{
    struct pb b = {0};
    build_batch(&b, s);
    int rc = rt_pickle_cifar_batch(b.p, b.n, "built.pkl", out);
    free(b.p);
    return rc;
}

static void expect_spec_ok(const struct spec *s, const char *what)
{
    struct rt_cifar_py_batch out;
    int rc = parse_spec(s, &out);

    CHECKF(rc == 0, "%s: %s", what, rt_errmsg());
    if (rc == 0) {
        CHECKF(out.n == s->n, "%s: n = %" PRIu64, what, out.n);
        for (uint64_t i = 0; i < out.n && i < s->nlabels; i++)
            CHECKF(out.labels[i] == spec_label(s, i), "%s: label %" PRIu64 " = %d", what, i,
                   out.labels[i]);
        size_t bad = 0;
        for (uint64_t k = 0; k < out.n * 3072; k++)
            bad += out.data[k] != pixel(k / 3072, k % 3072);
        CHECKF(bad == 0, "%s: %zu image bytes differ", what, bad);
    }
    rt_pickle_cifar_batch_free(&out);
}

static void expect_spec_err(const struct spec *s, const char *needle)
{
    struct rt_cifar_py_batch out;
    CHECK_ERR(parse_spec(s, &out), needle);
    CHECK_ERR(parse_spec(s, &out), "built.pkl");
    CHECK(out.data == NULL && out.labels == NULL && out.coarse == NULL && out.n == 0);
}

static void test_built(void)
{
    struct spec s;

    spec_defaults(&s, 3);
    expect_spec_ok(&s, "plain");
    s.bytes_keys = 1;
    expect_spec_ok(&s, "bytes keys");
    spec_defaults(&s, 3);
    s.numpy2 = 1;
    expect_spec_ok(&s, "numpy 2 spelling");
    spec_defaults(&s, 3);
    s.fortran_as_text = 1;
    expect_spec_ok(&s, "INT I00 fortran flag");
    for (int st = INT_BIN; st <= INT_LONG_TEXT; st++) {
        spec_defaults(&s, 3);
        s.int_style = (enum int_style)st;
        expect_spec_ok(&s, "label int encodings");
    }
    static const char *const ok_label_types[][2] = {
        {"i1", "|"}, {"u1", "|"}, {"i2", "<"}, {"u2", "<"}, {"i4", "<"},
        {"u4", "<"}, {"i8", "<"}, {"u8", "<"}, {"i4", "="},
    };
    for (size_t i = 0; i < RT_ARRAY_LEN(ok_label_types); i++) {
        spec_defaults(&s, 12);
        s.labels_dtype = ok_label_types[i][0];
        s.labels_order = ok_label_types[i][1];
        expect_spec_ok(&s, ok_label_types[i][0]);
    }

    spec_defaults(&s, 3);
    s.labels_dtype = "i4";
    s.labels_order = ">";
    expect_spec_err(&s, "big-endian");
    spec_defaults(&s, 3);
    s.labels_dtype = "i8";
    s.labels_order = "<";
    s.label_override = -3;
    expect_spec_err(&s, "outside");
    spec_defaults(&s, 3);
    s.labels_dtype = "u8";
    s.labels_order = "<";
    s.label_override = -1; /* 2^64 - 1 as u8 */
    expect_spec_err(&s, "outside");
    spec_defaults(&s, 3);
    s.labels_dtype = "f4";
    s.labels_order = "<";
    expect_spec_err(&s, "dtype 'f4'");
    spec_defaults(&s, 3);
    s.labels_dtype = "i4";
    s.labels_order = "<";
    s.nlabels = 4;
    expect_spec_err(&s, "labels");

    spec_defaults(&s, 3);
    s.fortran = 1;
    expect_spec_err(&s, "fortran");
    spec_defaults(&s, 3);
    s.cols = 3071;
    expect_spec_err(&s, "shape");
    spec_defaults(&s, 0);
    expect_spec_err(&s, "shape");
    spec_defaults(&s, 3);
    s.data_delta = -1;
    expect_spec_err(&s, "array data is 9215 bytes");
    spec_defaults(&s, 3);
    s.data_delta = 1;
    expect_spec_err(&s, "array data is 9217 bytes");
    spec_defaults(&s, 3);
    s.dtype = "u2";
    s.order = "<";
    expect_spec_err(&s, "uint8");
    spec_defaults(&s, 3);
    s.data_as_list = 1;
    expect_spec_err(&s, "object arrays");
    spec_defaults(&s, 3);
    s.nlabels = 2;
    expect_spec_err(&s, "2 labels for 3 images");
    spec_defaults(&s, 3);
    s.label_override = -1;
    expect_spec_err(&s, "outside");
    spec_defaults(&s, 3);
    s.label_override = INT64_C(1) << 40;
    s.int_style = INT_LONG1;
    expect_spec_err(&s, "outside");
    spec_defaults(&s, 3);
    s.omit_labels = 1;
    expect_spec_err(&s, "no 'labels' or 'fine_labels' key");
    spec_defaults(&s, 3);
    s.omit_data = 1;
    expect_spec_err(&s, "no 'data' key");
}

/* ---- raw streams ------------------------------------------------------------------- */

static void expect_raw_err(const void *p, size_t n, const char *needle)
{
    struct rt_cifar_py_batch b;
    struct rt_cifar_py_meta m;
    CHECK_ERR(rt_pickle_cifar_batch(p, n, "raw.pkl", &b), needle);
    CHECK_ERR(rt_pickle_cifar_meta(p, n, "raw.pkl", &m), needle);
    CHECK_ERR(rt_pickle_cifar_meta(p, n, "raw.pkl", &m), "raw.pkl");
}

#define RAW_ERR(lit, needle) expect_raw_err(lit, sizeof(lit) - 1, needle)

static void test_raw(void)
{
    struct rt_cifar_py_meta m;
    struct pb b = {0};

    RAW_ERR("", "ends without STOP");
    expect_raw_err(NULL, 0, "ends without STOP");
    RAW_ERR("\x80\x02", "ends without STOP");
    RAW_ERR("\x80\x02.", "STOP: stack underflow");
    RAW_ERR("\x80\x02}q\x00h\x05.", "memo index 5 is missing");
    RAW_ERR("\x80\x02}g7\n.", "memo index 7 is missing");
    RAW_ERR("\x80\x02\xff.", "byte 2: opcode 0xff");
    RAW_ERR("\x80\x06}.", "protocol 6");
    RAW_ERR("P1\n.", "PERSID: persistent ids");
    RAW_ERR("NQ.", "BINPERSID: persistent ids");
    RAW_ERR("\x80\x02\x82\x01.", "EXT1: extension");
    RAW_ERR("\x80\x02\x83\x01\x00.", "EXT2: extension");
    RAW_ERR("\x80\x02\x84\x01\x00\x00\x00.", "EXT4: extension");
    RAW_ERR("\x80\x05\x97.", "NEXT_BUFFER: out-of-band");
    RAW_ERR("\x80\x05\x98.", "READONLY_BUFFER: out-of-band");
    RAW_ERR("(i__main__\nX\n.", "INST");
    RAW_ERR("\x80\x04\x8f.", "EMPTY_SET: sets");
    RAW_ERR("\x80\x02t.", "no MARK");
    RAW_ERR("\x80\x02(N\x86.", "TUPLE2: stack underflow");
    RAW_ERR("\x80\x02N(a.", "APPEND: stack underflow");
    RAW_ERR("\x80\x02}Na.", "target is a dict, not a list");
    RAW_ERR("\x80\x02(NNe.", "APPENDS: stack underflow");
    RAW_ERR("\x80\x02}(Nu.", "odd number");
    RAW_ERR("\x80\x02Nb.", "BUILD: stack underflow");
    RAW_ERR("\x80\x02]Nb.", "BUILD on a list");
    RAW_ERR("\x80\x02}.junk", "4 unexpected bytes after STOP");
    RAW_ERR("\x80\x02}X\x10\x00\x00\x00" "abc", "BINUNICODE: truncated: needs 16 bytes, 3 left");
    RAW_ERR("\x80\x02T\xff\xff\xff\xff.", "negative length");
    RAW_ERR("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.", "64 bits");
    RAW_ERR("\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00}.", "frame of 255 bytes");
    RAW_ERR("I99999999999999999999\n.", "64 bits");
    RAW_ERR("Ix\n.", "not a decimal");
    RAW_ERR("S'abc\n.", "not a quoted string");
    RAW_ERR("S'\\x4'\n.", "invalid \\x escape");
    RAW_ERR("V\\u12\n.", "truncated \\u escape");
    RAW_ERR("\x80\x02" "cos\nsystem", "no newline");
    /* Globals off the whitelist, by GLOBAL and by STACK_GLOBAL: refused, never called. */
    RAW_ERR("cbuiltins\neval\n.", "global 'builtins.eval' is not allowed");
    RAW_ERR("c__builtin__\neval\n.", "global '__builtin__.eval' is not allowed");
    RAW_ERR("\x80\x04\x8c\x02os\x8c\x06system\x93.", "STACK_GLOBAL: global 'os.system'");
    RAW_ERR("\x80\x04\x8c\x05numpy\x8c\x04load\x93.", "global 'numpy.load'");
    RAW_ERR("\x80\x04" "C\x02os\x8c\x06system\x93.", "not str");
    RAW_ERR("\x80\x02" "cnumpy\nndarray\n)R.", "numpy.ndarray directly");
    RAW_ERR("\x80\x02" "c_codecs\nencode\nX\x02\x00\x00\x00\xc4\x80X\x06\x00\x00\x00latin1\x86R.",
            "not a Latin-1 character");
    RAW_ERR("\x80\x02" "c_codecs\nencode\nX\x01\x00\x00\x00" "aX\x05\x00\x00\x00" "ascii\x86R.",
            "not (str, 'latin1')");
    RAW_ERR("\x80\x02NN\x85R.", "callable is a None");
    RAW_ERR("\x80\x02" "cnumpy\ndtype\nNR.", "arguments are a None");
    RAW_ERR("\x80\x02" "c_codecs\nencode\n)\x81.", "NEWOBJ");
    /* Cycles: a list holding itself, a dict whose 'data' is itself. */
    RAW_ERR("\x80\x02]q\x00(h\x00h\x00" "e.", "is a list, not a dict");
    RAW_ERR("\x80\x02}q\x00(X\x04\x00\x00\x00" "datah\x00X\x06\x00\x00\x00labelsh\x00"
            "X\x0b\x00\x00\x00label_namesh\x00u.",
            "is a dict");
    /* Memo keys far ahead of the entries so far are refused, not allocated for. */
    RAW_ERR("\x80\x02Nr\xff\xff\xff\xff" "0j\xff\xff\xff\xff.",
            "LONG_BINPUT: memo index 4294967295 is out of order (0 entries so far)");
    RAW_ERR("\x80\x02Nr\x01\x10\x00\x00.", "memo index 4097 is out of order");
    RAW_ERR("\x80\x02Nr\x00\x10\x00\x00.", "is a None, not a dict");

    /* Protocol 0 text forms, Python 2 style: STRING escapes, UNICODE \u escapes, PUT/GET. */
    static const char p0_meta[] =
        "(dp0\nS'label_names'\np1\n(lp2\nS'a\\x41\\'b\\101'\np3\naS\"c\\n\\\\\"\np4\n"
        "aV\\u00e9t\\u00e9 \xe9\np5\nag3\nas.";
    int rc = rt_pickle_cifar_meta(p0_meta, sizeof(p0_meta) - 1, "p0_meta", &m);
    CHECKF(rc == 0, "%s", rt_errmsg());
    if (rc == 0) {
        CHECK(m.n == 4);
        CHECK(m.n == 4 && strcmp(m.names[0], "aA'bA") == 0);
        CHECK(m.n == 4 && strcmp(m.names[1], "c\n\\") == 0);
        CHECK(m.n == 4 && strcmp(m.names[2], "\xc3\xa9t\xc3\xa9 \xc3\xa9") == 0);
        CHECK(m.n == 4 && strcmp(m.names[3], "aA'bA") == 0);
    }
    rt_pickle_cifar_meta_free(&m);

    /* Limits: each refused by its cap, not by running out of memory. */
    pb_lit(&b, "\x80\x02");
    for (int i = 0; i < 2000; i++)
        pb_op(&b, '(');
    pb_op(&b, '.');
    expect_raw_err(b.p, b.n, "marks nested deeper than 1024");
    b.n = 0;
    pb_lit(&b, "\x80\x02");
    for (int i = 0; i < (1 << 20) + 1; i++)
        pb_op(&b, 'N');
    pb_op(&b, '.');
    expect_raw_err(b.p, b.n, "stack deeper than 1048576");
    b.n = 0;
    pb_lit(&b, "\x80\x02");
    for (int i = 0; i < (1 << 21) + 1; i++)
        pb_lit(&b, "N0");
    pb_op(&b, '.');
    expect_raw_err(b.p, b.n, "more than 2097152 values");
    b.n = 0;
    pb_lit(&b, "\x80\x02]q\x00Nq\x01" "0"); /* [list]; None memoized and popped */
    for (int k = 0; k < 9; k++) {
        pb_op(&b, '(');
        for (int i = 0; i < 1000000; i++)
            pb_lit(&b, "h\x01");
        pb_op(&b, 'e');
    }
    pb_op(&b, '.');
    expect_raw_err(b.p, b.n, "more than 8388608 container items");
    free(b.p);
}

/* ---- hostile variants of good fixtures ------------------------------------------------ */

/* After a successful parse every byte the struct claims must be readable. */
static void touch_results(int is_meta, const struct rt_cifar_py_batch *b,
                          const struct rt_cifar_py_meta *m, unsigned *sink)
{
    if (is_meta) {
        for (size_t i = 0; i < m->n; i++)
            *sink += (unsigned)strlen(m->names[i]);
        for (size_t i = 0; i < m->ncoarse; i++)
            *sink += (unsigned)strlen(m->coarse_names[i]);
        return;
    }
    for (uint64_t i = 0; i < b->n * 3072; i++)
        *sink += b->data[i];
    for (uint64_t i = 0; i < b->n; i++)
        *sink += (unsigned)b->labels[i] + (b->coarse ? (unsigned)b->coarse[i] : 0);
}

/* Parses `len` bytes from an allocation of exactly that size, so ASan sees any overread. */
static int parse_exact(const uint8_t *src, size_t len, const char *name, int is_meta,
                       unsigned *sink)
{
    struct rt_cifar_py_batch b;
    struct rt_cifar_py_meta m;
    uint8_t *copy = malloc(len ? len : 1);
    int rc;

    if (!copy)
        exit(1);
    memcpy(copy, src, len);
    if (is_meta)
        rc = rt_pickle_cifar_meta(copy, len, name, &m);
    else
        rc = rt_pickle_cifar_batch(copy, len, name, &b);
    if (rc == 0) {
        touch_results(is_meta, &b, &m, sink);
        rt_pickle_cifar_batch_free(is_meta ? NULL : &b);
        rt_pickle_cifar_meta_free(is_meta ? &m : NULL);
    }
    free(copy);
    return rc;
}

static void test_prefixes(const char *name, int is_meta)
{
    size_t len, accepted = 0, unnamed = 0;
    unsigned sink = 0;
    uint8_t *buf = load(name, &len);

    if (!buf)
        return;
    for (size_t k = 0; k < len; k++) {
        int rc = parse_exact(buf, k, name, is_meta, &sink);
        accepted += rc == 0;
        unnamed += rc != 0 && (rc != -EBADMSG || !strstr(rt_errmsg(), name));
    }
    CHECKF(accepted == 0, "%s: %zu proper prefixes accepted", name, accepted);
    CHECKF(unnamed == 0, "%s: %zu prefixes refused without -EBADMSG naming the file", name,
           unnamed);
    free(buf);
}

static void test_flips(const char *name, int is_meta, uint64_t stream)
{
    struct rt_rng rng;
    size_t len, accepted = 0, unnamed = 0;
    unsigned sink = 0;
    uint8_t *buf = load(name, &len);
    uint8_t *mut;

    if (!buf)
        return;
    mut = malloc(len);
    if (!mut)
        exit(1);
    rt_rng_init(&rng, FLIP_SEED, stream);
    for (int t = 0; t < FLIPS_PER_FIXTURE; t++) {
        unsigned nflips = 1 + rt_rng_below(&rng, 4);
        memcpy(mut, buf, len);
        for (unsigned f = 0; f < nflips; f++) {
            /* Half the flips land in the opcode-dense head or tail, not the pixel bytes. */
            uint32_t edge = (uint32_t)RT_MIN(len, (size_t)600);
            uint32_t where = rt_rng_below(&rng, 3);
            size_t pos = where == 0   ? rt_rng_below(&rng, (uint32_t)len)
                         : where == 1 ? rt_rng_below(&rng, edge)
                                      : len - 1 - rt_rng_below(&rng, edge);
            mut[pos] = rt_rng_below(&rng, 2) ? (uint8_t)rt_rng_u32(&rng)
                                             : (uint8_t)(mut[pos] ^ (1u << rt_rng_below(&rng, 8)));
        }
        int rc = parse_exact(mut, len, name, is_meta, &sink);
        accepted += rc == 0;
        unnamed += rc != 0 && (rc != -EBADMSG || !strstr(rt_errmsg(), name));
    }
    fprintf(stderr, "test_pickle: %s: %d mutants, %zu parsed, %zu refused\n", name,
            FLIPS_PER_FIXTURE, accepted, (size_t)FLIPS_PER_FIXTURE - accepted);
    CHECKF(unnamed == 0, "%s: %zu mutants refused without -EBADMSG naming the file", name,
           unnamed);
    free(mut);
    free(buf);
}

/* ---- main ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    uint64_t n;
    enum layout layout;
} good_batches[] = {
    {"c10_batch_p0.pkl", 2, C10},          {"c10_batch_p1.pkl", 2, C10},
    {"c10_batch_p2.pkl", 5, C10},          {"c10_batch_p3.pkl", 5, C10},
    {"c10_batch_p4.pkl", 12, C10},         {"c10_batch_p5.pkl", 5, C10},
    {"c10_batch_bytes_keys.pkl", 5, C10},  {"c10_batch_py2.pkl", 12, C10},
    {"c100_train_p4.pkl", 6, C100},
};

static const struct {
    const char *name;
    enum layout layout;
} good_metas[] = {
    {"c10_meta_p2.pkl", C10},
    {"c10_meta_py2.pkl", C10},
    {"c100_meta_p4.pkl", C100},
};

int main(void)
{
    const char *root = getenv("RT_FIXTURES");

    if (!root || !*root) {
        fprintf(stderr, "test_pickle: RT_FIXTURES is not set; skipping\n");
        return 77;
    }
    snprintf(fixdir, sizeof(fixdir), "%s/pickle", root);
    fprintf(stderr, "test_pickle: byte-flip seed 0x%" PRIx64 "\n", FLIP_SEED);

    for (size_t i = 0; i < RT_ARRAY_LEN(good_batches); i++)
        test_good_batch(good_batches[i].name, good_batches[i].n, good_batches[i].layout);
    for (size_t i = 0; i < RT_ARRAY_LEN(good_metas); i++)
        test_good_meta(good_metas[i].name, good_metas[i].layout);

    test_bad_fixture("bad_os_system.pkl", "GLOBAL: global 'os.system' is not allowed");
    test_bad_fixture("bad_truncated.pkl", "BINBYTES: truncated");
    test_bad_fixture("bad_binbytes8_huge.pkl", "BINBYTES8: truncated: needs 4611686018427387904");

    test_built();
    test_raw();

    for (size_t i = 0; i < RT_ARRAY_LEN(good_batches); i++) {
        test_prefixes(good_batches[i].name, 0);
        test_flips(good_batches[i].name, 0, i);
    }
    for (size_t i = 0; i < RT_ARRAY_LEN(good_metas); i++) {
        test_prefixes(good_metas[i].name, 1);
        test_flips(good_metas[i].name, 1, 100 + i);
    }
    return check_result();
}
