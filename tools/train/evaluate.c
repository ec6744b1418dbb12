/*
 * evaluate.c - loss and accuracy of a model on a whole split: the epoch's
 * validation (every rank its exact share, sums all-reduced) and
 * `ringtrain eval` (a checkpoint on the test split, one rank).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "comm/comm.h"
#include "common/common.h"
#include "tools/train/driver.h"

int evaluate_split(struct rt_model *m, struct rt_dataset *ds, enum rt_split split, uint32_t image_size,
                   uint32_t batch, int workers,
                   enum rt_pin pin, struct rt_comm *comm, const float *mean, const float *std,
                   struct rt_loss_stats *out)
{
    const struct rt_rank_info *ri = comm ? rt_comm_info(comm) : NULL;
    /* Every rank evaluates its exact share; padding is masked and the sums
     * are all-reduced, so the figures are those of the whole split. */
    struct rt_loader_opts lo = {.batch = batch, .world = ri ? (uint32_t)ri->world : 1,
                                .rank = ri ? (uint32_t)ri->rank : 0, .shuffle = RT_SHUFFLE_NONE,
                                .last = RT_LAST_PAD, .workers = workers > 0 ? workers : 1, .epochs = 1};
    struct rt_ring_opts ro = {.slots = 4, .batch = batch, .channels = rt_dataset_info(ds)->channels, .pin = pin};
    struct rt_ring *ring = NULL;
    struct rt_loader *L = NULL;
    int32_t *labels = rt_calloc(batch, sizeof(int32_t), "labels");
    struct rt_step_opts so = {.mode = RT_EVAL, .mean = mean, .std = std};
    struct rt_batch *b;
    int rc = -ENOMEM;
    memset(out, 0, sizeof(*out));
    /* The split as it is, whichever: no augmentation, the centre crop for images of their own sizes. */
    if (labels && (rc = rt_loader_opts_for(rt_dataset_info(ds), split, &(struct rt_aug){0}, image_size, &lo)) == 0 &&
        (rc = rt_loader_image_shape(rt_dataset_info(ds), image_size, &ro.height, &ro.width)) == 0 &&
        (rc = rt_ring_create(&ro, &ring)) == 0 && (rc = rt_loader_create(ds, &lo, ring, &L)) == 0)
        while ((rc = rt_loader_next(L, &b)) > 0) {
            input_labels(b, labels);
            rc = rt_model_step(m, &so, (int)b->batch, b->images, labels, out);
            rt_loader_release(L, b);
            if (rc < 0)
                break;
        }
    rt_loader_destroy(L);
    rt_ring_destroy(ring);
    free(labels);
    if (rc == 0 && comm) {
        double sums[3] = {out->loss_sum, out->correct, out->count};
        rt_comm_allreduce(comm, sums, 3, RT_COMM_F64, RT_RED_SUM, "validation metrics");
        *out = (struct rt_loss_stats){(float)sums[0], (float)sums[1], (float)sums[2]};
    }
    return rc < 0 ? rc : 0;
}

/* Parses a JSON array of n numbers from checkpoint metadata. */
static int meta_floats(const struct rt_st_file *f, const char *path, const char *key, float *out, uint32_t n)
{
    const char *s = rt_st_meta(f, key);
    json_error_t je;
    json_t *a = s ? json_loads(s, 0, &je) : NULL;
    int ok = a && json_is_array(a) && json_array_size(a) == n;
    for (uint32_t i = 0; ok && i < n; i++) {
        json_t *v = json_array_get(a, i);
        ok = json_is_number(v);
        if (ok)
            out[i] = (float)json_number_value(v);
    }
    json_decref(a);
    if (!ok)
        return rt_errf(-EINVAL, "%s: metadata \"%s\" is %s, expected a JSON array of %u numbers", path, key,
                       s ? s : "missing", n);
    return 0;
}

/* What a checkpoint says it is: its model, classes and input shape; *foreign = 1 for a state_dict saved
 * elsewhere (PyTorch), which says none of it: --model names the architecture, and the dataset the rest. */
static int checkpoint_identity(const struct eval_cfg *cfg, const struct rt_st_file *f, const char **model,
                               const char **classes, uint32_t shape[3], int *foreign)
{
    float fs[3];
    *model = rt_st_meta(f, "model");
    *classes = rt_st_meta(f, "num_classes");
    *foreign = !*model && !*classes;
    if (*foreign) {
        if (!cfg->model)
            return rt_errf(-EINVAL, "%s has no ringtrain metadata (a state_dict saved by PyTorch?): name its "
                                    "architecture with --model",
                           cfg->checkpoint);
        *model = cfg->model;
        return 0;
    }
    if (!*model || !*classes)
        return rt_errf(-EINVAL, "%s: no \"model\"/\"num_classes\" metadata: not a ringtrain checkpoint",
                       cfg->checkpoint);
    if (cfg->model && strcmp(cfg->model, *model) != 0)
        return rt_errf(-EINVAL, "%s is a checkpoint of %s, not %s", cfg->checkpoint, *model, cfg->model);
    if (meta_floats(f, cfg->checkpoint, "input_shape", fs, 3) < 0)
        return -EINVAL;
    for (int i = 0; i < 3; i++)
        shape[i] = (uint32_t)fs[i];
    return 0;
}

/* The dataset has the images and classes the checkpoint was trained on, and a test split. */
static int check_fits(const struct eval_cfg *cfg, const char *classes, const uint32_t shape[3],
                      const struct rt_dataset_info *di)
{
    if (di->channels > 4)
        return rt_errf(-EINVAL, "images with %u channels: at most 4 are supported", di->channels);
    /* Images of their own sizes are evaluated at the size the checkpoint was trained on. */
    const int variable = di->height == 0;
    if (di->channels != shape[0] || (variable ? shape[1] != shape[2] : (di->height != shape[1] || di->width != shape[2])) ||
        di->num_classes != (uint32_t)atoi(classes))
        return rt_errf(-EINVAL, "%s was trained on %ux%ux%u images with %s classes; %s has %ux%ux%u with %u",
                       cfg->checkpoint, shape[0], shape[1], shape[2], classes, cfg->data, di->channels, di->height,
                       di->width, di->num_classes);
    if (!di->split[RT_SPLIT_TEST].records)
        return rt_errf(-EINVAL, "%s has no test split", cfg->data);
    return 0;
}

/* A foreign file is scored at the dataset's image size with the dataset's normalisation, as train --init
 * would fine-tune it. */
static int foreign_fits(const struct eval_cfg *cfg, const struct rt_dataset_info *di, uint32_t shape[3], float *mean,
                        float *std)
{
    if (di->channels > 4)
        return rt_errf(-EINVAL, "images with %u channels: at most 4 are supported", di->channels);
    if (!di->height)
        return rt_errf(-EINVAL, "%s holds images of their own sizes, and %s (no ringtrain metadata) does not say "
                                "which size it was trained at: train --init from it instead",
                       cfg->data, cfg->checkpoint);
    if (!di->split[RT_SPLIT_TEST].records)
        return rt_errf(-EINVAL, "%s has no test split", cfg->data);
    shape[0] = di->channels;
    shape[1] = di->height;
    shape[2] = di->width;
    rt_loader_norm(di, di->channels, mean, std);
    return 0;
}

/* Loads a foreign file into m strictly, printing every difference before the error. */
static int load_foreign(struct rt_model *m, const struct rt_st_file *f, const char *path, uint32_t classes)
{
    struct rt_init_result r;
    int rc = rt_model_load_init(m, f, 0, &r);
    if (rc < 0 && r.ndiff) {
        fprintf(stderr, "%s does not fit %s for %u classes:\n", path, rt_model_name(m), classes);
        rt_init_print(&r, stderr);
        rc = rt_errf(rc, "%s: %s (listed above)", path, rt_errmsg());
    }
    rt_init_result_free(&r);
    return rc;
}

/* Builds the checkpoint's model on the backend --device picks, and evaluates the test split. */
static int evaluate_model(const struct eval_cfg *cfg, const struct rt_st_file *f, struct rt_dataset *ds,
                          const char *model, const uint32_t shape_in[3], int foreign, struct eval_result *res)
{
    const struct rt_dataset_info *di = rt_dataset_info(ds);
    float mean[4], std[4];
    uint32_t shape[3] = {shape_in[0], shape_in[1], shape_in[2]};
    int rc;
    if (foreign) {
        if ((rc = foreign_fits(cfg, di, shape, mean, std)) < 0)
            return rc;
    } else if ((rc = meta_floats(f, cfg->checkpoint, "mean", mean, di->channels)) < 0 ||
               (rc = meta_floats(f, cfg->checkpoint, "std", std, di->channels)) < 0) {
        return rc;
    }
    const uint32_t image_size = di->height ? 0 : shape[1];
    struct rt_model_opts mo = {.name = model, .c = (int)di->channels, .h = (int)shape[1], .w = (int)shape[2],
                               .classes = (int)di->num_classes, .batch = (int)cfg->batch};
    struct rt_backend *be = NULL;
    struct rt_model *m = NULL;
    struct rt_loss_stats vs;
    uint64_t t0 = 0;
    if ((rc = train_open_backend(cfg->device, 0, 1, cfg->threads, cfg->tf32, cfg->nondeterministic, &be)) == 0 &&
        (rc = train_amp_resolve(cfg->amp, be, &mo.act)) == 0 && (rc = rt_model_create(be, &mo, &m)) == 0 &&
        (rc = foreign ? load_foreign(m, f, cfg->checkpoint, di->num_classes)
                      : rt_model_load(m, f, cfg->checkpoint)) == 0) {
        t0 = rt_now_ns();
        rc = evaluate_split(m, ds, RT_SPLIT_TEST, image_size, cfg->batch, cfg->workers, RT_PIN_AUTO, NULL, mean,
                            std, &vs);
    }
    if (rc == 0) {
        res->seconds = (double)(rt_now_ns() - t0) * 1e-9;
        res->images = vs.count;
        res->loss = vs.count ? vs.loss_sum / vs.count : NAN;
        res->accuracy = vs.count ? vs.correct / vs.count : NAN;
    }
    rt_model_destroy(m);
    rt_backend_destroy(be);
    return rc;
}

int train_evaluate_checkpoint(const struct eval_cfg *cfg, struct eval_result *res)
{
    struct rt_st_file *f = NULL;
    struct rt_dataset *ds = NULL;
    const char *model = NULL, *classes = NULL;
    uint32_t shape[3] = {0};
    int foreign = 0;
    int rc = rt_st_read(cfg->checkpoint, &f);
    if (rc == 0)
        rc = checkpoint_identity(cfg, f, &model, &classes, shape, &foreign);
    if (rc == 0)
        rc = rt_dataset_open(cfg->data, &ds);
    if (rc == 0 && !foreign)
        rc = check_fits(cfg, classes, shape, rt_dataset_info(ds));
    if (rc == 0) {
        snprintf(res->model, sizeof(res->model), "%s", model);
        rc = evaluate_model(cfg, f, ds, model, shape, foreign, res);
    }
    rt_dataset_close(ds);
    rt_st_close(f);
    return rc < 0 ? rc : 0;
}
