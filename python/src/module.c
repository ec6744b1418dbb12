/*
 * module.c - the extension module ringtrain._ringtrain: its initialisation,
 * the Error class, what every file uses (errors, argument choices,
 * heap-type allocation), version() and dataset_info().
 *
 * The module is a thin layer: it converts arguments, calls the C libraries
 * with the GIL released while they block or work, and turns their -errno
 * returns into Error(errno, rt_errmsg()). The high-level package
 * (the .py files of python/ringtrain/) builds the public API on top of it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "loader/loader.h"
#include "python/src/ext.h"
#include "rt_buildinfo.h"

PyObject *ext_error;

/* ---- errors and arguments --------------------------------------------------------- */

PyObject *ext_raise(int rc)
{
    const int err = rc < 0 ? -rc : rc > 0 ? rc : EIO;
    const char *msg = rt_errmsg();
    PyObject *args = Py_BuildValue("(is)", err, *msg ? msg : strerror(err));
    if (args) {
        PyErr_SetObject(ext_error, args);
        Py_DECREF(args);
    }
    return NULL;
}

PyObject *ext_raisef(int err, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    PyObject *args = Py_BuildValue("(is)", err, msg);
    if (args) {
        PyErr_SetObject(ext_error, args);
        Py_DECREF(args);
    }
    return NULL;
}

int ext_choice(const char *what, const char *s, const char *const *names, int n)
{
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (!names[i])
            continue;
        if (!strcmp(s, names[i]))
            return i;
        int k = snprintf(list + used, sizeof(list) - used, "%s'%s'", used ? ", " : "", names[i]);
        if (k > 0 && (size_t)k < sizeof(list) - used)
            used += (size_t)k;
    }
    PyErr_Format(PyExc_ValueError, "%s must be one of %s, not '%s'", what, list, s);
    return -1;
}

int ext_split(const char *s, enum rt_split *out)
{
    const char *names[RT_SPLIT_COUNT];
    for (int i = 0; i < RT_SPLIT_COUNT; i++)
        names[i] = rt_split_name((enum rt_split)i);
    int i = ext_choice("split", s, names, RT_SPLIT_COUNT);
    if (i < 0)
        return -1;
    *out = (enum rt_split)i;
    return 0;
}

int ext_dict_put(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

PyObject *ext_alloc(PyTypeObject *tp)
{
    allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
    return alloc(tp, 0); /* PyType_GenericAlloc: zeroed */
}

void ext_free(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp); /* instances of heap types own a reference to their type */
}

/* ---- version and dataset_info --------------------------------------------------------- */

static PyObject *ext_version(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyUnicode_FromFormat("ringtrain %s (%s build, %s)", RT_VERSION, RT_BUILD_TYPE, RT_C_COMPILER);
}

static PyObject *float_list(const float *v, uint32_t n)
{
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) {
        PyObject *f = PyFloat_FromDouble(v[i]);
        if (!f || PyList_SetItem(l, i, f) < 0) {
            Py_DECREF(l);
            return NULL;
        }
    }
    return l;
}

static PyObject *norm_list(const struct rt_dataset_info *info, const float *v)
{
    if (!info->have_norm)
        Py_RETURN_NONE;
    return float_list(v, info->channels);
}

/* A variable-size dataset's record size (height, width) as a tuple; None for fixed-size ones. */
static PyObject *size_pair(const struct rt_dataset_info *info, const uint32_t hw[2])
{
    if (info->height != 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(kk)", (unsigned long)hw[0], (unsigned long)hw[1]);
}

int ext_dataset_open(const char *path, struct rt_dataset **out)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = rt_dataset_open(path, out);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        ext_raise(rc);
        return -1;
    }
    return 0;
}

PyTypeObject *ext_add_type(PyObject *m, PyType_Spec *spec, const char *name)
{
    PyTypeObject *tp = (PyTypeObject *)PyType_FromSpec(spec);
    if (!tp)
        return NULL;
    Py_INCREF((PyObject *)tp); /* one reference for the module (stolen on success), one kept by the caller */
    if (PyModule_AddObject(m, name, (PyObject *)tp) < 0) {
        Py_DECREF((PyObject *)tp);
        Py_DECREF((PyObject *)tp);
        return NULL;
    }
    return tp;
}

PyObject *ext_class_list(const struct rt_dataset_info *info)
{
    PyObject *l = PyList_New(info->num_classes);
    for (uint32_t i = 0; l && i < info->num_classes; i++) {
        const char *name = info->class_names[i];
        PyObject *s = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace");
        if (!s || PyList_SetItem(l, i, s) < 0) {
            Py_DECREF(l);
            return NULL;
        }
    }
    return l;
}

static PyObject *split_dict(const struct rt_dataset_info *info)
{
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < RT_SPLIT_COUNT; i++)
        if (ext_dict_put(d, rt_split_name((enum rt_split)i), PyLong_FromUnsignedLongLong(info->split[i].records)) <
            0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

PyObject *ext_dataset_info(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", NULL};
    const char *path;
    struct rt_dataset *ds = NULL;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s:dataset_info", kwlist, &path))
        return NULL;
    if (ext_dataset_open(path, &ds) < 0)
        return NULL;
    const struct rt_dataset_info *info = rt_dataset_info(ds);
    /* The normalisation the trainer applies: the manifest's, else its defaults (rt_loader_norm). */
    float nmean[4] = {0}, nstd[4] = {0};
    rt_loader_norm(info, RT_MIN(info->channels, 4u), nmean, nstd);
    PyObject *d = PyDict_New();
    if (!d || ext_dict_put(d, "dir", PyUnicode_DecodeFSDefault(info->dir)) < 0 ||
        ext_dict_put(d, "codec", PyUnicode_FromString(rt_codec_name(info->codec))) < 0 ||
        ext_dict_put(d, "source", PyUnicode_FromString(info->source ? info->source : "")) < 0 ||
        ext_dict_put(d, "channels", PyLong_FromUnsignedLong(info->channels)) < 0 ||
        ext_dict_put(d, "height", PyLong_FromUnsignedLong(info->height)) < 0 ||
        ext_dict_put(d, "width", PyLong_FromUnsignedLong(info->width)) < 0 ||
        ext_dict_put(d, "num_classes", PyLong_FromUnsignedLong(info->num_classes)) < 0 ||
        ext_dict_put(d, "classes", ext_class_list(info)) < 0 || ext_dict_put(d, "splits", split_dict(info)) < 0 ||
        ext_dict_put(d, "stored_bytes", PyLong_FromUnsignedLongLong(info->stored_bytes)) < 0 ||
        ext_dict_put(d, "mean", norm_list(info, info->mean)) < 0 ||
        ext_dict_put(d, "std", norm_list(info, info->std)) < 0 ||
        ext_dict_put(d, "input_mean", float_list(nmean, RT_MIN(info->channels, 4u))) < 0 ||
        ext_dict_put(d, "input_std", float_list(nstd, RT_MIN(info->channels, 4u))) < 0 ||
        /* height = width = 0: records of their own sizes (pack --max-side), cropped by the loader */
        ext_dict_put(d, "variable", PyBool_FromLong(info->height == 0)) < 0 ||
        ext_dict_put(d, "max_side", PyLong_FromUnsignedLong(info->max_side)) < 0 ||
        ext_dict_put(d, "size_min", size_pair(info, info->size_min)) < 0 ||
        ext_dict_put(d, "size_median", size_pair(info, info->size_median)) < 0 ||
        ext_dict_put(d, "size_max", size_pair(info, info->size_max)) < 0 ||
        ext_dict_put(d, "skipped_files", PyLong_FromUnsignedLongLong(info->skipped_files)) < 0 ||
        ext_dict_put(d, "ignored_files", PyLong_FromUnsignedLongLong(info->ignored_files)) < 0) {
        Py_XDECREF(d);
        d = NULL;
    }
    rt_dataset_close(ds);
    return d;
}

/* ---- the module ----------------------------------------------------------------------- */

/* The Error class: an OSError whose str() is the C message alone (args: errno, message). */
static const char error_source[] =
    "class Error(OSError):\n"
    "    \"\"\"A failure reported by ringtrain's C libraries: .errno is the error number, .strerror and\n"
    "    str() the message, which names the file, shard, block or record and what was expected.\"\"\"\n"
    "    def __str__(self):\n"
    "        return self.strerror if self.strerror is not None else OSError.__str__(self)\n";

static PyObject *make_error_class(void)
{
    PyObject *globals = PyDict_New(), *code = NULL, *res = NULL, *cls = NULL;
    if (!globals || PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) < 0 ||
        ext_dict_put(globals, "__name__", PyUnicode_FromString("ringtrain")) < 0)
        goto out;
    code = Py_CompileString(error_source, "<ringtrain._ringtrain>", Py_file_input);
    if (!code)
        goto out;
    res = PyEval_EvalCode(code, globals, globals);
    if (!res)
        goto out;
    cls = PyDict_GetItemString(globals, "Error");
    Py_XINCREF(cls);
out:
    Py_XDECREF(res);
    Py_XDECREF(code);
    Py_XDECREF(globals);
    return cls;
}

static PyMethodDef methods[] = {
    {"version", ext_version, METH_NOARGS, "version() -> str: ringtrain's version and build"},
    {"dataset_info", (PyCFunction)(void (*)(void))ext_dataset_info, METH_VARARGS | METH_KEYWORDS,
     "dataset_info(path) -> dict: the manifest of a packed dataset (codec, shape, classes, split sizes, mean/std; "
     "input_mean/input_std: the normalisation the trainer applies, the manifest's or its defaults; "
     "variable-size records: height = width = 0, variable True, max_side and size_min/median/max as (h, w); pack's "
     "skipped_files and ignored_files)"},
    {"ring_bytes", (PyCFunction)(void (*)(void))ext_ring_bytes, METH_VARARGS | METH_KEYWORDS,
     "ring_bytes(slots, batch, c, h, w) -> int: bytes of caller-given memory (open_loader's memory=) a ring of "
     "this shape needs, its int64 label buffers and alignment included"},
    {"image_shape", (PyCFunction)(void (*)(void))ext_image_shape, METH_VARARGS | METH_KEYWORDS,
     "image_shape(path, image_size=None) -> (c, h, w): the images' shape in the loader's batches -- the stored "
     "size, or image_size x image_size for variable-size records (required then); Error (EINVAL) otherwise"},
    {"aug_draw", (PyCFunction)(void (*)(void))ext_aug_draw, METH_VARARGS | METH_KEYWORDS,
     "aug_draw(augment, seed, epoch, id, height, width) -> dict: what a sample draws under the augmentation (dy, "
     "dx, flip, jitter [(name, factor), ...] in the order applied, erase and cutout (y, x, h, w) or None)"},
    {"open_loader", (PyCFunction)(void (*)(void))ext_open_loader, METH_VARARGS | METH_KEYWORDS,
     "open_loader(path, split='train', batch, shuffle='exact', last='drop', seed=0, augment='crop+flip', "
     "workers=0, rank=0, world=1, slots=0, start_epoch=0, start_step=0, epochs=0, memory=None, digest=False, "
     "image_size=None, crop_scale=None, crop_ratio=None, center_ratio=None, start_sample=0) -> CLoader; "
     "variable-size records need image_size and are cropped to it (RandomResizedCrop(image_size, crop_scale, "
     "crop_ratio) + flip for the training split with augment 'crop+flip', else Resize(image_size / center_ratio) "
     "+ CenterCrop); start_sample (shuffle exact/none, start_step 0): start epoch start_epoch at that position of "
     "its global sequence, as another world or batch size left it (epoch_steps() says where that epoch ends)"},
    {"stage", (PyCFunction)(void (*)(void))ext_stage, METH_VARARGS | METH_KEYWORDS,
     "stage(src, parent=None, verify='full') -> dict: copies a packed dataset to node-local disk once per node "
     "(as `ringtrain stage`); 'path' is the staged copy"},
    {"pack", (PyCFunction)(void (*)(void))ext_pack, METH_VARARGS | METH_KEYWORDS,
     "pack(input, outdir, codec='raw', quality=0, level=0, val_split=0.0, split_seed=0, label='fine', threads=0, "
     "force=False) -> dict: packs CIFAR/MNIST files or an image folder into shards (as `ringtrain pack`)"},
    {"synth", (PyCFunction)(void (*)(void))ext_synth, METH_VARARGS | METH_KEYWORDS,
     "synth(outdir, format='cifar10', train=None, test=10000, seed=0, threads=0): writes a synthetic dataset in "
     "the original distribution's layout (as `ringtrain synth`; train None = 50000, MNIST 60000)"},
    {"verify", (PyCFunction)(void (*)(void))ext_verify, METH_VARARGS | METH_KEYWORDS,
     "verify(path) -> list[str]: every problem found in the dataset's shards (as `ringtrain verify`); [] = all well"},
    {"wait_verdict", (PyCFunction)(void (*)(void))ext_wait_verdict, METH_VARARGS | METH_KEYWORDS,
     "wait_verdict(wait_ns, step_ns, images_per_step, workers, staged, no_work) -> dict: whether the input limits a "
     "consumer, from its per-step waits and whole steps (ns), in the C trainer's words and threshold"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT,
    "_ringtrain",
    "ringtrain's C libraries for Python: the loader and its batches (DLPack, buffer protocol), random access to a "
    "packed dataset, staging, pack, synth, verify and the input verdict. The package `ringtrain` is the API to use.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__ringtrain(void);

PyMODINIT_FUNC PyInit__ringtrain(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    if (!ext_error && !(ext_error = make_error_class()))
        goto fail;
    Py_INCREF(ext_error);
    if (PyModule_AddObject(m, "Error", ext_error) < 0) {
        Py_DECREF(ext_error);
        goto fail;
    }
    if (ext_cbatch_init(m) < 0 || ext_convert_init(m) < 0 || ext_cloader_init(m) < 0 || ext_cdataset_init(m) < 0)
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
