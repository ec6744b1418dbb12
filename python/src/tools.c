/*
 * tools.c - the offline tools for Python: stage() (node-local copies, as
 * `ringtrain stage`), pack(), synth(), verify(), and wait_verdict(), the
 * input side's verdict from a consumer's own timings (loader/verdict.h).
 * Each converts its arguments, runs the C function with the GIL released,
 * and returns its result as a dict or list.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/offline.h"
#include "loader/verdict.h"
#include "python/src/ext.h"
#include "staging/local_copy.h"

/* ---- stage ---------------------------------------------------------------------------- */

static const char *engine_name(enum rt_local_copy_engine e)
{
    return e == RT_LOCAL_COPY_ENGINE_URING ? "io_uring" : e == RT_LOCAL_COPY_ENGINE_PLAIN ? "plain" : "none";
}

PyObject *ext_stage(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"src", "parent", "verify", NULL};
    static const char *const verify_names[] = {"full", "size"};
    const char *src, *parent = NULL, *verify_s = "full";
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zs:stage", kwlist, &src, &parent, &verify_s))
        return NULL;
    const int verify = ext_choice("verify", verify_s, verify_names, 2);
    if (verify < 0)
        return NULL;
    struct rt_local_copy_opts o = {.parent = parent,
                                   .verify = verify ? RT_LOCAL_COPY_VERIFY_SIZE : RT_LOCAL_COPY_VERIFY_FULL};
    struct rt_local_copy_result *r = calloc(1, sizeof(*r));
    if (!r)
        return PyErr_NoMemory();
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rt_local_copy_dataset(src, &o, r);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        free(r);
        return ext_raise(rc);
    }
    PyObject *d = PyDict_New();
#define PUT_U(key, v) ext_dict_put(d, key, PyLong_FromUnsignedLongLong(v)) < 0
#define PUT_F(key, v) ext_dict_put(d, key, PyFloat_FromDouble(v)) < 0
    if (!d || ext_dict_put(d, "path", PyUnicode_DecodeFSDefault(r->path)) < 0 ||
        ext_dict_put(d, "manifest_xxh64", PyUnicode_FromString(r->manifest_xxh64)) < 0 ||
        ext_dict_put(d, "engine", PyUnicode_FromString(engine_name(r->engine))) < 0 ||
        PUT_U("queue_depth", r->queue_depth) || PUT_U("block_bytes", r->block_bytes) || PUT_U("files", r->files) ||
        PUT_U("files_copied", r->files_copied) || PUT_U("files_damaged", r->files_damaged) ||
        PUT_U("files_hashed", r->files_hashed) || PUT_U("partials_removed", r->partials_removed) ||
        PUT_U("retries", r->retries) || PUT_U("bytes_total", r->bytes_total) ||
        PUT_U("bytes_copied", r->bytes_copied) || PUT_U("bytes_hashed", r->bytes_hashed) ||
        ext_dict_put(d, "waited", PyBool_FromLong(r->waited)) < 0 || PUT_F("wait_seconds", r->wait_seconds) ||
        PUT_F("check_seconds", r->check_seconds) || PUT_F("copy_seconds", r->copy_seconds) ||
        PUT_F("seconds", r->seconds)) {
        Py_XDECREF(d);
        d = NULL;
    }
    free(r);
    return d;
}

/* ---- pack and synth ------------------------------------------------------------------- */

/* {split name: records} of a pack, or NULL with the exception set. */
static PyObject *split_records(const struct rt_pack_stats *st)
{
    PyObject *o = PyDict_New();
    for (int i = 0; o && i < RT_SPLIT_COUNT; i++)
        if (ext_dict_put(o, rt_split_name((enum rt_split)i), PyLong_FromUnsignedLongLong(st->split_records[i])) < 0)
            Py_CLEAR(o);
    return o;
}

/* {"1/2": n, "1/4": n, "1/8": n}: JPEGs decoded at a reduced scale (the manifest's files.scaled_decode names). */
static PyObject *scaled_decode(const struct rt_pack_stats *st)
{
    PyObject *o = PyDict_New();
    for (int k = 1; o && k < 4; k++) {
        char name[8];
        snprintf(name, sizeof name, "1/%d", 1 << k);
        if (ext_dict_put(o, name, PyLong_FromUnsignedLongLong(st->scaled[k])) < 0)
            Py_CLEAR(o);
    }
    return o;
}

PyObject *ext_pack(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"input", "outdir", "codec", "quality", "level", "val_split", "split_seed",
                             "label", "threads", "force", "size_h", "size_w", "fit", "max_side", "channels",
                             "skip_bad", "exif_rotate", NULL};
    static const char *const codec_names[] = {"raw", "jpeg"};
    static const char *const label_names[] = {"fine", "coarse"};
    static const char *const fit_names[] = {"crop", "stretch", "pad"};
    const char *input, *outdir, *codec_s = "raw", *label_s = "fine", *fit_s = "crop";
    int quality = 0, level = 0, threads = 0, force = 0, skip_bad = 0, exif_rotate = 0;
    unsigned int size_h = 0, size_w = 0, max_side = 0, channels = 0;
    double val_split = 0;
    unsigned long long split_seed = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|siidKsipIIsIIpp:pack", kwlist, &input, &outdir, &codec_s,
                                     &quality, &level, &val_split, &split_seed, &label_s, &threads, &force, &size_h,
                                     &size_w, &fit_s, &max_side, &channels, &skip_bad, &exif_rotate))
        return NULL;
    const int codec = ext_choice("codec", codec_s, codec_names, 2);
    const int label = codec < 0 ? -1 : ext_choice("label", label_s, label_names, 2);
    const int fit = label < 0 ? -1 : ext_choice("fit", fit_s, fit_names, 3);
    if (fit < 0)
        return NULL;
    if (quality < 0 || quality > 100 || level < 0 || level > 22 || threads < 0 || !(val_split >= 0 && val_split < 1)) {
        PyErr_SetString(PyExc_ValueError, "pack: quality must be 0..100 (0 = the default), level 0..22, threads >= 0 "
                                          "and val_split in [0, 1)");
        return NULL;
    }
    struct rt_pack_opts o = {.codec = (enum rt_codec)codec, .quality = quality, .level = level,
                             .val_split = val_split, .split_seed = split_seed, .label = (enum rt_label_kind)label,
                             .threads = threads, .force = force, .size_h = size_h, .size_w = size_w, .fit = fit,
                             .max_side = max_side, .channels = channels, .skip_bad = skip_bad,
                             .exif_rotate = exif_rotate};
    struct rt_pack_stats st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rt_pack(input, outdir, &o, &st);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc);
    PyObject *d = PyDict_New();
    if (!d || ext_dict_put(d, "split_records", split_records(&st)) < 0 ||
        ext_dict_put(d, "scaled_decode", scaled_decode(&st)) < 0 ||
        ext_dict_put(d, "source", PyUnicode_FromString(st.source)) < 0 ||
        ext_dict_put(d, "records", PyLong_FromUnsignedLongLong(st.records)) < 0 ||
        ext_dict_put(d, "bytes_in", PyLong_FromUnsignedLongLong(st.bytes_in)) < 0 ||
        ext_dict_put(d, "bytes_out", PyLong_FromUnsignedLongLong(st.bytes_out)) < 0 ||
        ext_dict_put(d, "shards", PyLong_FromUnsignedLong(st.shards)) < 0 ||
        ext_dict_put(d, "seconds", PyFloat_FromDouble(st.seconds)) < 0 ||
        ext_dict_put(d, "files", PyLong_FromUnsignedLongLong(st.files)) < 0 ||
        ext_dict_put(d, "ignored", PyLong_FromUnsignedLongLong(st.ignored)) < 0 ||
        ext_dict_put(d, "skipped", PyLong_FromUnsignedLongLong(st.skipped)) < 0 ||
        ext_dict_put(d, "skipped_summary", PyUnicode_FromString(st.skipped_summary)) < 0 ||
        ext_dict_put(d, "passthrough", PyLong_FromUnsignedLongLong(st.passthrough)) < 0 ||
        ext_dict_put(d, "warned", PyLong_FromUnsignedLongLong(st.warned)) < 0 ||
        /* A path, bytes as the file system has them (and maybe cut mid-character): decoded as os.fsdecode does. */
        ext_dict_put(d, "first_warning", PyUnicode_DecodeFSDefault(st.first_warning)) < 0)
        Py_CLEAR(d);
    return d;
}

PyObject *ext_synth(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"outdir", "format", "train", "test", "seed", "threads", NULL};
    static const char *const format_names[] = {"cifar10", "cifar100", "mnist"};
    const char *outdir, *format_s = "cifar10";
    PyObject *train_o = Py_None;
    unsigned long long test = 10000, seed = 0;
    int threads = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sOKKi:synth", kwlist, &outdir, &format_s, &train_o, &test, &seed,
                                     &threads))
        return NULL;
    const int format = ext_choice("format", format_s, format_names, 3);
    if (format < 0)
        return NULL;
    struct rt_synth_opts o = {.format = (enum rt_synth_format)format, .test = test, .seed = seed,
                              .threads = threads < 0 ? 0 : threads};
    if (train_o == Py_None) {
        o.train = o.format == RT_SYNTH_MNIST ? 60000 : 50000; /* as `ringtrain synth` */
    } else {
        o.train = PyLong_AsUnsignedLongLong(train_o);
        if (PyErr_Occurred())
            return NULL;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rt_synth_write(outdir, &o);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return ext_raise(rc);
    Py_RETURN_NONE;
}

/* ---- verify --------------------------------------------------------------------------- */

struct lines {
    char **v;
    size_t n, cap;
    int oom;
};

static void collect(void *ctx, const char *line)
{
    struct lines *l = ctx;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        char **v = realloc(l->v, cap * sizeof(*v));
        if (!v) {
            l->oom = 1;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(line)))
        l->oom = 1;
    else
        l->n++;
}

PyObject *ext_verify(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", NULL};
    const char *path;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s:verify", kwlist, &path))
        return NULL;
    struct rt_dataset *ds = NULL;
    struct lines l = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rt_dataset_open(path, &ds);
    if (rc == 0)
        rc = rt_dataset_verify(ds, collect, &l);
    Py_END_ALLOW_THREADS
    PyObject *res = NULL;
    if (rc < 0)
        ext_raise(rc);
    else if (l.oom)
        PyErr_NoMemory();
    else if ((res = PyList_New((Py_ssize_t)l.n)))
        for (size_t i = 0; i < l.n; i++) {
            PyObject *s = PyUnicode_DecodeUTF8(l.v[i], (Py_ssize_t)strlen(l.v[i]), "replace");
            if (!s || PyList_SetItem(res, (Py_ssize_t)i, s) < 0) {
                Py_CLEAR(res);
                break;
            }
        }
    for (size_t i = 0; i < l.n; i++)
        free(l.v[i]);
    free(l.v);
    rt_dataset_close(ds);
    return res;
}

/* ---- wait_verdict --------------------------------------------------------------------- */

/* A sequence of non-negative ints into a malloc'd array (*n entries), or NULL with an exception. */
static uint64_t *u64_array(PyObject *seq, const char *what, size_t *n)
{
    const Py_ssize_t len = PySequence_Size(seq);
    if (len < 0)
        return NULL;
    if (len == 0) {
        PyErr_Format(PyExc_ValueError, "%s is empty: no step was timed", what);
        return NULL;
    }
    uint64_t *v = malloc((size_t)len * sizeof(*v));
    if (!v)
        return (uint64_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        long long x = item ? PyLong_AsLongLong(item) : -1;
        Py_XDECREF(item);
        if (x == -1 && PyErr_Occurred()) {
            free(v);
            return NULL;
        }
        if (x < 0) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] is negative", what, i);
            free(v);
            return NULL;
        }
        v[i] = (uint64_t)x;
    }
    *n = (size_t)len;
    return v;
}

PyObject *ext_wait_verdict(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"wait_ns", "step_ns", "images_per_step", "workers", "staged", "no_work", NULL};
    PyObject *wait_o, *step_o;
    unsigned int images = 0;
    int workers = 0, staged = 0, no_work = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|Iipp:wait_verdict", kwlist, &wait_o, &step_o, &images, &workers,
                                     &staged, &no_work))
        return NULL;
    size_t nw = 0, ns = 0;
    uint64_t *w = u64_array(wait_o, "wait_ns", &nw), *s = w ? u64_array(step_o, "step_ns", &ns) : NULL;
    if (!s) {
        free(w);
        return NULL;
    }
    struct rt_input_verdict v;
    const int rc = no_work ? rt_loader_alone_verdict(w, nw, images, &v)
                           : rt_input_verdict(w, nw, s, ns, images, workers, staged, &v);
    free(w);
    free(s);
    if (rc < 0)
        return ext_raise(rc);
    PyObject *d = PyDict_New();
    if (!d || ext_dict_put(d, "limit", PyUnicode_FromString(v.limit)) < 0 ||
        ext_dict_put(d, "evidence", PyUnicode_FromString(v.evidence)) < 0 ||
        ext_dict_put(d, "advice", PyUnicode_FromString(v.advice)) < 0 ||
        ext_dict_put(d, "text", PyUnicode_FromString(v.text)) < 0 ||
        ext_dict_put(d, "wait_p50_ms", PyFloat_FromDouble(v.wait_p50_ns * 1e-6)) < 0 ||
        ext_dict_put(d, "step_p50_ms", PyFloat_FromDouble(v.step_p50_ns * 1e-6)) < 0 ||
        ext_dict_put(d, "share", PyFloat_FromDouble(v.share)) < 0 ||
        ext_dict_put(d, "input_bound", PyBool_FromLong(v.input_bound)) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    return d;
}
