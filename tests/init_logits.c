/*
 * init_logits.c - `rt_init_logits MODEL FILE.safetensors IMAGES.u8 N C H W CLASSES MEAN0,MEAN1,.. STD0,STD1,..
 * [--reset-head]`: builds MODEL for (N, C, H, W) inputs and CLASSES classes on the CPU backend in fp32, starts
 * it from FILE with rt_model_load_init (a PyTorch state_dict, as `ringtrain train --init` does), runs one
 * RT_EVAL step on the N uint8 images in IMAGES.u8 (N*C*H*W bytes, (N, C, H, W) order, labels 0, normalised
 * as (x/255 - mean)/std per channel) and writes the N x CLASSES float32 logits to stdout, raw, in host order.
 * FILE may be several files joined with commas: each is loaded into the one model in turn and its logits
 * follow the previous file's (a model is built once: building one is most of the time).
 * tests/test_init_torch.py compares them with PyTorch's.
 *
 * With `--freeze GLOBS --grads OUT.safetensors` (after the other arguments, one FILE) the model is built with
 * those layers frozen (rt_model_opts.freeze) and the step is one RT_TRAIN step instead, labels i % CLASSES,
 * no dropout, the gradient of the mean loss: OUT receives each trainable parameter's gradient as
 * "<name>.grad", every batchnorm buffer after the step ("<name>", num_batches_tracked as I64) and the logits
 * ("logits"); nothing is written to stdout. The frozen layers' gradients are absent: they have none.
 *
 * Exit 0 with the logits written (stderr: one line, the tensors loaded); 2 when FILE cannot be loaded into
 * the model (stderr: rt_errmsg() and rt_init_print()'s list of every difference, nothing on stdout); 1 on
 * any other failure (usage, the images, the model, writing).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "compute/compute.h"

#define MAX_CHANNELS 4

static const char usage[] = "usage: rt_init_logits MODEL FILE.safetensors IMAGES.u8 N C H W CLASSES "
                            "MEAN0,MEAN1,.. STD0,STD1,.. [--reset-head] [--freeze GLOBS --grads OUT]\n";

/* --grads: the trainable parameters' gradients, the buffers after the step and the logits, into `out`. */
static int write_grads(struct rt_model *m, const float *logits, int n, int classes, const char *out)
{
    int count, k = 0, rc = -ENOMEM;
    const struct rt_tensor_info *tab = rt_model_tensors(m, &count);
    const size_t ng = rt_model_trainable_count(m), nb = rt_model_buffer_count(m);
    struct rt_st_tensor *t = calloc((size_t)count + 1, sizeof(*t));
    float *g = malloc((ng + 1) * sizeof(float)), *b = malloc((nb + 1) * sizeof(float));
    int64_t *tracked = calloc((size_t)count + 1, sizeof(*tracked));
    if (t && g && b && tracked) {
        rt_model_read(m, RT_MODEL_GRADS, 0, ng, g);
        rt_model_read(m, RT_MODEL_BUFFERS, 0, nb, b);
        for (int i = 0; i < count; i++) {
            const struct rt_tensor_info *e = &tab[i];
            if (e->kind == RT_PARAM && e->frozen)
                continue;
            struct rt_st_tensor *o = &t[k++];
            snprintf(o->name, sizeof(o->name), "%s%s", e->name, e->kind == RT_PARAM ? ".grad" : "");
            o->ndim = e->ndim;
            for (int d = 0; d < e->ndim; d++)
                o->shape[d] = e->shape[d];
            if (e->kind == RT_BUFFER_I64) {
                tracked[i] = rt_model_tracked(m, i);
                o->dtype = RT_ST_I64;
                o->data = &tracked[i];
                o->bytes = sizeof(int64_t);
            } else {
                o->dtype = RT_ST_F32;
                o->data = (e->kind == RT_PARAM ? g : b) + e->offset;
                o->bytes = e->count * sizeof(float);
            }
        }
        struct rt_st_tensor *o = &t[k++];
        snprintf(o->name, sizeof(o->name), "logits");
        o->dtype = RT_ST_F32;
        o->ndim = 2;
        o->shape[0] = n;
        o->shape[1] = classes;
        o->data = logits;
        o->bytes = (size_t)n * classes * sizeof(float);
        rc = rt_st_write(out, t, k, NULL, 0);
    }
    free(t);
    free(g);
    free(b);
    free(tracked);
    return rc;
}

/* A positive int argument, or 0 when `s` is not one. */
static int parse_dim(const char *s)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v <= 0 || v > 1 << 20)
        return 0;
    return (int)v;
}

/* Exactly `c` comma-separated floats into v; returns 0 or -1. */
static int parse_floats(const char *s, float *v, int c)
{
    for (int i = 0; i < c; i++) {
        char *end;

        errno = 0;
        v[i] = strtof(s, &end);
        if (errno || end == s || *end != (i + 1 < c ? ',' : '\0'))
            return -1;
        s = end + 1;
    }
    return 0;
}

/* Prints why FILE does not fit the model: rt_errmsg(), then every difference. */
static void print_load_failure(const char *file, const struct rt_init_result *r)
{
    fprintf(stderr, "rt_init_logits: %s: %s\n", file, rt_errmsg());
    rt_init_print(r, stderr);
}

int main(int argc, char **argv)
{
    struct rt_backend_opts bo = {.kind = RT_BACKEND_CPU};
    struct rt_model_opts mo = {.seed = 1};
    struct rt_step_opts so = {.mode = RT_EVAL};
    struct rt_backend *be = NULL;
    struct rt_model *m = NULL;
    struct rt_st_file *f = NULL;
    struct rt_init_result r = {0};
    struct rt_loss_stats st = {0};
    float mean[MAX_CHANNELS], std[MAX_CHANNELS];
    uint8_t *images = NULL;
    int32_t *labels = NULL;
    float *logits = NULL;
    size_t len;
    int n, c, h, w, classes, reset_head = 0, rc = 1;

    const char *freeze = NULL, *grads = NULL;
    for (int i = 11; i < argc; i++) {
        if (!strcmp(argv[i], "--reset-head")) {
            reset_head = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "--freeze")) {
            freeze = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--grads")) {
            grads = argv[++i];
        } else {
            fputs(usage, stderr);
            return 1;
        }
    }
    if (argc < 11 || (freeze && !grads)) {
        fputs(usage, stderr);
        return 1;
    }
    n = parse_dim(argv[4]);
    c = parse_dim(argv[5]);
    h = parse_dim(argv[6]);
    w = parse_dim(argv[7]);
    classes = parse_dim(argv[8]);
    if (!n || !c || !h || !w || !classes || c > MAX_CHANNELS) {
        fprintf(stderr, "rt_init_logits: N, C, H, W and CLASSES must be positive integers (C at most %d)\n%s",
                MAX_CHANNELS, usage);
        return 1;
    }
    if (parse_floats(argv[9], mean, c) < 0 || parse_floats(argv[10], std, c) < 0) {
        fprintf(stderr, "rt_init_logits: MEAN and STD must be %d comma-separated numbers each\n", c);
        return 1;
    }
    if (rt_file_read(argv[3], &images, &len) < 0) {
        fprintf(stderr, "rt_init_logits: %s\n", rt_errmsg());
        return 1;
    }
    if (len != (size_t)n * c * h * w) {
        fprintf(stderr, "rt_init_logits: %s: %zu bytes, %d x %d x %d x %d images need %zu\n", argv[3], len, n, c, h, w,
                (size_t)n * c * h * w);
        goto out;
    }
    labels = calloc((size_t)n, sizeof(*labels));
    logits = malloc((size_t)n * classes * sizeof(*logits));
    if (!labels || !logits) {
        fprintf(stderr, "rt_init_logits: out of memory\n");
        goto out;
    }

    if (rt_backend_create(&bo, &be) < 0) {
        fprintf(stderr, "rt_init_logits: CPU backend: %s\n", rt_errmsg());
        goto out;
    }
    mo.name = argv[1];
    mo.c = c;
    mo.h = h;
    mo.w = w;
    mo.classes = classes;
    mo.batch = n;
    mo.freeze = freeze;
    if (rt_model_create(be, &mo, &m) < 0) {
        fprintf(stderr, "rt_init_logits: %s: %s\n", argv[1], rt_errmsg());
        goto out;
    }

    so.mean = mean;
    so.std = std;
    for (char *save = NULL, *file = strtok_r(argv[2], ",", &save); file; file = strtok_r(NULL, ",", &save)) {
        /* Both are load failures: the file itself unreadable, or a file that does not fit the model. */
        rt_init_result_free(&r);
        rt_st_close(f);
        f = NULL;
        if (rt_st_read(file, &f) < 0) {
            fprintf(stderr, "rt_init_logits: %s\n", rt_errmsg());
            rc = 2;
            goto out;
        }
        if (rt_model_load_init(m, f, reset_head, &r) < 0) {
            print_load_failure(file, &r);
            rc = 2;
            goto out;
        }
        fprintf(stderr, "rt_init_logits: %s: %d tensors loaded, %d of the classifier left at their initialisation\n",
                file, r.loaded, r.head_reset);
        memset(&st, 0, sizeof(st));
        if (grads) { /* one training step: the gradient of the mean loss */
            so.mode = RT_TRAIN;
            so.no_dropout = 1;
            so.grad_scale = 1.0f / (float)n;
            for (int i = 0; i < n; i++)
                labels[i] = i % classes;
            rt_model_zero_grads(m);
        }
        if (rt_model_step(m, &so, n, images, labels, &st) < 0) {
            fprintf(stderr, "rt_init_logits: step: %s\n", rt_errmsg());
            goto out;
        }
        rt_model_logits(m, logits, n);
        if (grads) {
            if (write_grads(m, logits, n, classes, grads) < 0) {
                fprintf(stderr, "rt_init_logits: %s: %s\n", grads, rt_errmsg());
                goto out;
            }
            break;
        }
        if (fwrite(logits, sizeof(*logits), (size_t)n * classes, stdout) != (size_t)n * classes || fflush(stdout)) {
            perror("rt_init_logits: stdout");
            goto out;
        }
    }
    rc = 0;
out:
    rt_init_result_free(&r);
    rt_st_close(f);
    rt_model_destroy(m);
    rt_backend_destroy(be);
    free(logits);
    free(labels);
    free(images);
    return rc;
}
