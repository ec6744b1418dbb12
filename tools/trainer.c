/*
 * trainer.c - `ringtrain train` and `ringtrain eval`: the loop that takes
 * batches from the loader's ring, runs them through the model, steps the
 * optimizer on the schedule, validates each epoch, and writes metrics and
 * checkpoints. With several ranks (mpirun, srun) it is data-parallel: each
 * rank reads its share of every batch, backward hands finished gradients to
 * the comm stage's bucketer, which all-reduces them while backward goes on,
 * and the optimizer steps once they are all in. Metrics are global; rank 0
 * alone prints and writes checkpoints.
 *
 * Checkpoints (--checkpoint-dir): model.safetensors (PyTorch state_dict
 * names), optimizer.safetensors and state.json (position, loader state, RNG
 * seed, counters), each written atomically and tied together by one
 * checkpoint id, so a crash between two of the writes is detected on resume
 * instead of mixing two checkpoints.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "comm/comm.h"
#include "common/common.h"
#include "staging/local_copy.h"
#include "tools/cli.h"
#include "tools/trainer.h"

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

struct trainer {
    const struct train_cfg *cfg;
    struct rt_comm *comm;
    struct rt_bucketer *bucketer;
    struct rt_nccl *nccl;       /* GPUs across ranks: the gradient all-reduce; NULL otherwise */
    int rank, world, root;      /* root: this is rank 0, which prints and saves */
    char data_path[4096];       /* --data, or where --stage-to put it */
    struct rt_dataset *ds;
    const struct rt_dataset_info *info;
    struct rt_backend *be;
    struct rt_model *model;
    struct rt_optim *opt;
    struct rt_sched sched;
    enum rt_dtype act;          /* activations' type (--amp) */
    int scaling;                /* dynamic loss scaling on */
    struct rt_scaler scaler;
    float *found_inf;           /* device: the unscale op's overflow flag */
    uint64_t overflow_from, overflow_count; /* test hook RINGTRAIN_TEST_OVERFLOW=STEP:COUNT */
    struct rt_ring *ring;
    struct rt_loader *loader;
    uint32_t c, h, w, classes;
    float mean[4], std[4];
    int norm_from_data;
    int val_split;              /* -1: no validation */
    uint64_t steps_per_epoch;   /* micro-batches */
    uint32_t accum;
    int32_t *labels;            /* batch, padding as -1 */
    uint8_t *syn_images;
    int32_t *syn_labels;
    const uint8_t *syn_dev;     /* the synthetic batch on the device, uploaded once */
    uint64_t syn_ticket;
    struct rt_ring_allocator host_mem; /* the ring's slots in the backend's page-locked memory (CUDA) */
    /* The batch being computed and the one after it, already on its way to the device. */
    struct inflight {
        struct rt_batch *b;
        const uint8_t *dev;
        uint64_t ticket;
    } cur, next;

    /* position */
    uint64_t epoch, step;       /* next micro-batch */
    uint64_t micro, opt_steps;
    double best_acc;
    uint32_t streak;
    /* this epoch so far */
    struct rt_loss_stats ep;
    uint64_t ep_images, ep_train_ns, ep_wait_ns, ep_comm_ns;
    /* the whole run */
    uint64_t images, train_ns;
    uint64_t run_micro;         /* micro-batches run by this process (not restored on resume) */
    uint64_t steady_images, steady_ns; /* after the first 3 of them: caches, pools and pages warm */
    uint64_t comm_ns;           /* waiting for the gradient all-reduce after backward */
    double run_comm_frac;       /* exposed communication over the run, averaged over the ranks */
    uint32_t stop_flags;        /* the last step's control word: 4 SIGTERM, 8 SIGUSR1 on some rank */
    char nonfinite[400];        /* this rank's first non-finite loss of the step, for the message */
    double last_train_loss, last_train_acc, last_val_loss, last_val_acc;
    int have_val;
    uint64_t epochs_done;
    FILE *metrics;
    char ckpt_id[64];
};

/* ---- set-up ------------------------------------------------------------------ */

static int open_data(struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    if (c->data) {
        const char *path = T->data_path[0] ? T->data_path : c->data;
        if (rt_dataset_open(path, &T->ds) < 0)
            return -1;
        T->info = rt_dataset_info(T->ds);
        T->c = T->info->channels;
        T->h = T->info->height;
        T->w = T->info->width;
        T->classes = T->info->num_classes;
        if (T->info->have_norm) {
            for (uint32_t i = 0; i < T->c && i < 4; i++) {
                T->mean[i] = T->info->mean[i];
                T->std[i] = T->info->std[i];
            }
            T->norm_from_data = 1;
        }
        if (T->info->split[RT_SPLIT_VAL].records)
            T->val_split = RT_SPLIT_VAL;
        else if (T->info->split[RT_SPLIT_TEST].records)
            T->val_split = RT_SPLIT_TEST;
        if (!c->synthetic && !T->info->split[RT_SPLIT_TRAIN].records) {
            rt_errf(-EINVAL, "%s has no training split", c->data);
            return -1;
        }
    } else {
        T->c = c->syn_c;
        T->h = c->syn_h;
        T->w = c->syn_w;
        T->classes = c->syn_classes;
    }
    if (T->c > 4) {
        rt_errf(-EINVAL, "images with %u channels: at most 4 are supported", T->c);
        return -1;
    }
    if (!T->norm_from_data)
        for (uint32_t i = 0; i < T->c; i++) {
            T->mean[i] = 0.5f;
            T->std[i] = 0.25f;
        }
    if (c->synthetic)
        T->val_split = -1;
    return 0;
}

/* Bytes of one batch's images, as the ring's slots and the synthetic batch hold them. */
static size_t batch_bytes(const struct trainer *T)
{
    return (size_t)T->cfg->batch * T->c * T->h * T->w;
}

static void *ring_host_alloc(size_t bytes, void *ctx)
{
    return rt_backend_host_alloc(ctx, bytes);
}

static void ring_host_free(void *p, size_t bytes, void *ctx)
{
    (void)bytes;
    rt_backend_host_free(ctx, p);
}

static int start_loader(struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    struct rt_loader_opts lo = {
        .split = RT_SPLIT_TRAIN,
        .batch = c->batch,
        .world = (uint32_t)T->world,
        .rank = (uint32_t)T->rank,
        .seed = c->seed,
        .shuffle = c->shuffle,
        .last = RT_LAST_DROP,
        .aug = c->aug,
        .workers = c->workers > 0 ? c->workers : 1,
        .epochs = c->epochs,
        .start_epoch = T->epoch,
        .start_step = T->step,
    };
    struct rt_ring_opts ro = {.slots = (uint32_t)RT_MAX(lo.workers + 2, 4), .batch = c->batch, .channels = T->c,
                              .height = T->h, .width = T->w, .pin = c->pin};
    /* On a GPU the slots are cudaHostAlloc memory: each batch's copy to the device is a DMA on the copy
     * stream, overlapping the step before it. */
    if (rt_backend_kind_of(T->be) == RT_BACKEND_CUDA && c->pin == RT_PIN_ON) {
        T->host_mem = (struct rt_ring_allocator){.name = "cudaHostAlloc", .locks = 1, .alloc = ring_host_alloc,
                                                 .free = ring_host_free, .ctx = T->be};
        ro.allocator = &T->host_mem;
    }
    if (rt_ring_create(&ro, &T->ring) < 0 || rt_loader_create(T->ds, &lo, T->ring, &T->loader) < 0)
        return -1;
    T->steps_per_epoch = rt_loader_steps_per_epoch(T->loader);
    if (T->steps_per_epoch == 0) {
        rt_errf(-EINVAL, "the training split has %" PRIu64 " records: fewer than one batch of %u for each of %d ranks",
                T->info->split[RT_SPLIT_TRAIN].records, c->batch, T->world);
        return -1;
    }
    return 0;
}

static void make_synthetic(struct trainer *T)
{
    size_t n = batch_bytes(T);
    struct rt_rng r;
    rt_rng_init(&r, T->cfg->seed, 0x5e7u + (uint64_t)T->rank); /* each rank its own batch */
    for (size_t i = 0; i < n; i++)
        T->syn_images[i] = (uint8_t)rt_rng_u32(&r);
    for (uint32_t i = 0; i < T->cfg->batch; i++)
        T->syn_labels[i] = (int32_t)rt_rng_below(&r, T->classes);
    uint64_t records = T->info ? T->info->split[RT_SPLIT_TRAIN].records : 50000;
    T->steps_per_epoch = RT_MAX(records / ((uint64_t)T->cfg->batch * (uint64_t)T->world), 1);
}

static int make_schedule(struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    uint64_t per_epoch = RT_MAX(T->steps_per_epoch / T->accum, 1);
    T->sched = (struct rt_sched){.kind = c->sched, .base_lr = c->lr, .gamma = c->gamma};
    /* --steps stops the run early; it does not shorten the schedule, so a run
     * stopped by it and resumed is the run that was planned. */
    T->sched.total_steps = per_epoch * c->epochs;
    double warm = c->warmup_epochs;
    if (warm < 0)
        warm = 0; /* onecycle turns 0 into 30 % of the run */
    T->sched.warmup_steps = (uint64_t)llround(warm * (double)per_epoch);
    if (T->sched.warmup_steps > T->sched.total_steps)
        T->sched.warmup_steps = T->sched.total_steps;
    T->sched.step_size = (uint64_t)RT_MAX(llround(c->step_epochs * (double)per_epoch), 1);
    return 0;
}

/* ---- checkpoints --------------------------------------------------------------- */

static void json_floats(char *buf, size_t len, const float *v, uint32_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (uint32_t i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%.9g", i ? ", " : "", (double)v[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

static int ckpt_path(const struct trainer *T, const char *name, char *out, size_t len)
{
    return rt_path_join(out, len, T->cfg->checkpoint_dir, name);
}

static int save_checkpoint(struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    if (!c->checkpoint_dir)
        return 0;
    /* The partial epoch's sums, over all ranks: rank 0 alone restores them. */
    double ep[3] = {T->ep.loss_sum, T->ep.correct, T->ep.count};
    if (T->comm && T->step) /* at an epoch boundary they are zero on every rank */
        rt_comm_allreduce(T->comm, ep, 3, RT_COMM_F64, RT_RED_SUM, "the checkpoint's epoch sums");
    if (!T->root)
        return 0;
    rt_comm_set_phase(T->comm, T->opt_steps, RT_PHASE_CHECKPOINT);
    if (rt_mkdirs(c->checkpoint_dir, 0755) < 0)
        return -1;
    snprintf(T->ckpt_id, sizeof(T->ckpt_id), "%" PRIu64 "-%016" PRIx64, T->opt_steps,
             rt_now_ns() ^ ((uint64_t)getpid() << 40));
    char classes[16], shape[64], mean[128], std[128];
    snprintf(classes, sizeof(classes), "%u", T->classes);
    snprintf(shape, sizeof(shape), "[%u, %u, %u]", T->c, T->h, T->w);
    json_floats(mean, sizeof(mean), T->mean, T->c);
    json_floats(std, sizeof(std), T->std, T->c);
    const char *meta[] = {"format", "pt", "model", rt_model_name(T->model), "num_classes", classes,
                          "input_shape", shape, "mean", mean, "std", std, "checkpoint_id", T->ckpt_id};
    const char *ometa[] = {"checkpoint_id", T->ckpt_id, "optimizer", rt_optim_kind_name(c->optim.kind)};
    char p[4096];
    if (ckpt_path(T, "optimizer.safetensors", p, sizeof(p)) < 0 || rt_optim_save(T->opt, T->model, p, ometa, 2) < 0)
        return -1;
    if (ckpt_path(T, "model.safetensors", p, sizeof(p)) < 0 ||
        rt_model_save(T->model, p, meta, (int)RT_ARRAY_LEN(meta) / 2) < 0)
        return -1;

    struct rt_loader_state ls = {.epoch = T->epoch, .step = T->step, .seed = c->seed, .world = (uint32_t)T->world,
                                 .rank = 0,
                                 .batch = c->batch, .shuffle = c->shuffle};
    char lsbuf[512];
    rt_loader_state_format(&ls, lsbuf, sizeof(lsbuf));
    json_t *st = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:i, s:s, s:f, s:i, s:f, s:f, s:f, "
                           "s:I, s:I, s:i}",
                           "format", 1, "checkpoint_id", T->ckpt_id, "model", rt_model_name(T->model), "epoch",
                           (json_int_t)T->epoch, "step", (json_int_t)T->step, "micro", (json_int_t)T->micro,
                           "optimizer_steps", (json_int_t)T->opt_steps, "loader", lsbuf, "seed", (json_int_t)c->seed,
                           "batch_size", (int)c->batch, "grad_accum", (int)T->accum, "optimizer",
                           rt_optim_kind_name(c->optim.kind), "best_val_acc", T->best_acc, "target_streak",
                           (int)T->streak, "epoch_loss_sum", ep[0], "epoch_correct", ep[1], "epoch_count", ep[2], "images", (json_int_t)T->images,
                           "train_ns", (json_int_t)T->train_ns, "world_size", T->world);
    if (st && T->scaling) {
        json_object_set_new(st, "loss_scale", json_real(T->scaler.scale));
        json_object_set_new(st, "loss_scale_good_steps", json_integer(T->scaler.good));
        json_object_set_new(st, "skipped_steps", json_integer((json_int_t)T->scaler.skipped));
    }
    char *text = st ? json_dumps(st, JSON_INDENT(2)) : NULL;
    json_decref(st);
    if (!text) {
        rt_errf(-ENOMEM, "cannot format the checkpoint state");
        return -1;
    }
    int rc = ckpt_path(T, "state.json", p, sizeof(p));
    if (rc == 0)
        rc = rt_file_write_atomic(p, text, strlen(text));
    free(text);
    return rc < 0 ? -1 : 0;
}

static int same_id(const struct rt_st_file *f, const char *path, const char *id)
{
    const char *fid = rt_st_meta(f, "checkpoint_id");
    if (!fid || strcmp(fid, id) != 0) {
        rt_errf(-EINVAL, "%s belongs to checkpoint %s, state.json to %s: the checkpoint was interrupted while being "
                         "written; remove the directory or restore a complete copy",
                path, fid ? fid : "(none)", id);
        return -1;
    }
    return 0;
}

/* Returns 1 when a checkpoint was loaded, 0 when there is none, -1 on error. */
static int load_checkpoint(struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    char p[4096];
    if (ckpt_path(T, "state.json", p, sizeof(p)) < 0)
        return -1;
    if (access(p, F_OK) != 0)
        return 0;
    json_error_t je;
    json_t *st = json_load_file(p, 0, &je);
    if (!st) {
        rt_errf(-EINVAL, "%s: %s (line %d)", p, je.text, je.line);
        return -1;
    }
    const char *id = NULL, *model = NULL, *loader = NULL, *optname = NULL;
    json_int_t epoch, step, micro, osteps, seed, images, train_ns;
    int batch, accum, streak;
    double best, els, ec, en;
    if (json_unpack_ex(st, &je, 0,
                       "{s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:i, s:s, s:F, s:i, s:F, s:F, s:F, s:I, s:I}",
                       "checkpoint_id", &id, "model", &model, "epoch", &epoch, "step", &step, "micro", &micro,
                       "optimizer_steps", &osteps, "loader", &loader, "seed", &seed, "batch_size", &batch,
                       "grad_accum", &accum, "optimizer", &optname, "best_val_acc", &best, "target_streak", &streak,
                       "epoch_loss_sum", &els, "epoch_correct", &ec, "epoch_count", &en, "images", &images,
                       "train_ns", &train_ns) != 0) {
        rt_errf(-EINVAL, "%s: %s", p, je.text);
        json_decref(st);
        return -1;
    }
    int rc = -1;
    struct rt_loader_state ls;
    json_t *jw = json_object_get(st, "world_size");
    int world = jw && json_is_integer(jw) ? (int)json_integer_value(jw) : 1;
    if (world != T->world) {
        rt_errf(-EINVAL, "%s: the checkpoint was written by a run of %d ranks; resume it with %d (the data order "
                         "depends on the world size)",
                c->checkpoint_dir, world, world);
    } else if (strcmp(model, rt_model_name(T->model)) != 0) {
        rt_errf(-EINVAL, "%s: the checkpoint is of %s, not %s", c->checkpoint_dir, model, rt_model_name(T->model));
    } else if ((uint32_t)batch != c->batch || (uint32_t)accum != T->accum || (uint64_t)seed != c->seed ||
               strcmp(optname, rt_optim_kind_name(c->optim.kind)) != 0) {
        rt_errf(-EINVAL, "%s: the checkpoint was trained with --batch-size %d --grad-accum %d --seed %" PRId64
                         " --optimizer %s; resume with the same",
                c->checkpoint_dir, batch, accum, (int64_t)seed, optname);
    } else if (rt_loader_state_parse(loader, &ls) < 0) {
        rt_errf(-EINVAL, "%s: bad loader state", p);
    } else {
        rc = 0;
    }
    snprintf(T->ckpt_id, sizeof(T->ckpt_id), "%s", id);
    if (rc == 0) {
        T->epoch = (uint64_t)epoch;
        T->step = (uint64_t)step;
        T->micro = (uint64_t)micro;
        T->opt_steps = (uint64_t)osteps;
        T->best_acc = best;
        json_t *ls_ = json_object_get(st, "loss_scale");
        if (T->scaling && ls_ && json_is_number(ls_)) {
            T->scaler.scale = (float)json_number_value(ls_);
            T->scaler.good = (uint32_t)json_integer_value(json_object_get(st, "loss_scale_good_steps"));
            T->scaler.skipped = (uint64_t)json_integer_value(json_object_get(st, "skipped_steps"));
        }
        T->streak = (uint32_t)streak;
        /* Global sums: held by rank 0 alone, so that the epoch's all-reduce
         * counts them once. */
        if (T->root)
            T->ep = (struct rt_loss_stats){(float)els, (float)ec, (float)en};
        T->images = (uint64_t)images;
        T->train_ns = (uint64_t)train_ns;
    }
    json_decref(st);
    if (rc)
        return -1;

    struct rt_st_file *f = NULL;
    if (ckpt_path(T, "model.safetensors", p, sizeof(p)) < 0 || rt_st_read(p, &f) < 0 ||
        same_id(f, p, T->ckpt_id) < 0 || rt_model_load(T->model, f, p) < 0) {
        rt_st_close(f);
        return -1;
    }
    rt_st_close(f);
    f = NULL;
    if (ckpt_path(T, "optimizer.safetensors", p, sizeof(p)) < 0 || rt_st_read(p, &f) < 0 ||
        same_id(f, p, T->ckpt_id) < 0 || rt_optim_load(T->opt, T->model, f, p) < 0) {
        rt_st_close(f);
        return -1;
    }
    rt_st_close(f);
    return 1;
}

/* The batch's labels for the loss: padding samples get -1, which adds nothing. */
static void batch_labels(struct trainer *T, const struct rt_batch *b)
{
    for (uint32_t i = 0; i < b->batch; i++)
        T->labels[i] = b->ids[i] == RT_PAD_ID ? -1 : b->labels[i];
}

/* ---- validation ---------------------------------------------------------------- */

static int validate(struct trainer *T, struct rt_loss_stats *vs)
{
    const struct train_cfg *c = T->cfg;
    /* Every rank evaluates its exact share; padding is masked and the sums
     * are all-reduced, so the figures are those of the whole split. */
    struct rt_loader_opts lo = {.split = (enum rt_split)T->val_split, .batch = c->batch, .seed = c->seed,
                                .world = (uint32_t)T->world, .rank = (uint32_t)T->rank, .shuffle = RT_SHUFFLE_NONE, .last = RT_LAST_PAD, .workers = c->workers > 0 ? c->workers : 1,
                                .epochs = 1};
    struct rt_ring_opts ro = {.slots = 4, .batch = c->batch, .channels = T->c, .height = T->h, .width = T->w,
                              .pin = c->pin};
    struct rt_ring *ring = NULL;
    struct rt_loader *L = NULL;
    int rc = -1;
    memset(vs, 0, sizeof(*vs));
    if (rt_ring_create(&ro, &ring) < 0 || rt_loader_create(T->ds, &lo, ring, &L) < 0)
        goto out;
    struct rt_step_opts so = {.mode = RT_EVAL, .mean = T->mean, .std = T->std};
    struct rt_batch *b;
    int more;
    while ((more = rt_loader_next(L, &b)) > 0) {
        batch_labels(T, b);
        int r = rt_model_step(T->model, &so, (int)b->batch, b->images, T->labels, vs);
        rt_loader_release(L, b);
        if (r < 0)
            goto out;
    }
    rc = more < 0 ? -1 : 0;
out:
    rt_loader_destroy(L);
    rt_ring_destroy(ring);
    if (rc == 0 && T->comm) {
        double sums[3] = {vs->loss_sum, vs->correct, vs->count};
        rt_comm_allreduce(T->comm, sums, 3, RT_COMM_F64, RT_RED_SUM, "validation metrics");
        *vs = (struct rt_loss_stats){(float)sums[0], (float)sums[1], (float)sums[2]};
    }
    return rc;
}

/* ---- output -------------------------------------------------------------------- */

static void progress(const struct trainer *T, uint64_t t0)
{
    const int width = 24;
    uint64_t done = T->step, total = T->steps_per_epoch;
    int fill = total ? (int)((double)done / (double)total * width) : 0;
    char bar[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    double el = (double)(rt_now_ns() - t0) * 1e-9;
    double ips = el > 0 ? (double)T->ep_images / el : 0;
    double eta = done ? el / (double)done * (double)(total - done) : 0;
    double loss = T->ep.count ? T->ep.loss_sum / T->ep.count : 0;
    fprintf(stderr, "\r\033[Kepoch %" PRIu64 "/%" PRIu64 " [%s] %" PRIu64 "/%" PRIu64 " %.0f img/s loss %.4f eta %ds",
            T->epoch + 1, T->cfg->epochs, bar, done, total, ips, (double)loss, (int)eta);
    fflush(stderr);
}

static void write_metrics(struct trainer *T, double time_s, double ips, double wait, double comm)
{
    if (!T->metrics)
        return;
    json_t *o = json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i}", "epoch", (json_int_t)(T->epoch + 1),
                          "steps", (json_int_t)T->opt_steps, "train_loss", T->last_train_loss, "train_acc",
                          T->last_train_acc, "images_per_s", ips, "data_wait_frac", wait, "time_s", time_s, "lr",
                          (double)rt_sched_lr(&T->sched, rt_optim_steps(T->opt) ? (uint64_t)rt_optim_steps(T->opt) - 1 : 0), "exposed_comm_frac",
                          comm, "world_size", T->world);
    if (!o)
        return;
    if (T->have_val) {
        json_object_set_new(o, "val_loss", json_real(T->last_val_loss));
        json_object_set_new(o, "val_acc", json_real(T->last_val_acc));
    } else {
        json_object_set_new(o, "val_loss", json_null());
        json_object_set_new(o, "val_acc", json_null());
    }
    char *s = json_dumps(o, JSON_COMPACT);
    if (s) {
        fprintf(T->metrics, "%s\n", s);
        fflush(T->metrics);
        free(s);
    }
    json_decref(o);
}

/* Copies rank 0's parameters or buffers (the batchnorm running statistics)
 * to every rank, through host memory. */
static int sync_from_root(struct trainer *T, float *dev, size_t count, const char *what)
{
    if (T->world == 1 || count == 0)
        return 0;
    const struct rt_ops *op = rt_backend_ops(T->be);
    struct rt_stream *s = rt_backend_stream(T->be);
    float *host = rt_malloc(count * sizeof(float), what);
    if (!host)
        return -1;
    op->download(s, host, dev, count * sizeof(float));
    rt_comm_broadcast(T->comm, host, count * sizeof(float), 0, what);
    op->upload(s, dev, host, count * sizeof(float));
    free(host);
    return 0;
}

/* XXH64 of the parameters as this rank holds them. */
static uint64_t param_digest(struct trainer *T)
{
    size_t n = rt_model_param_count(T->model);
    float *host = rt_malloc(n * sizeof(float), "parameter digest");
    if (!host)
        return 0;
    rt_backend_ops(T->be)->download(rt_backend_stream(T->be), host, rt_model_params(T->model), n * sizeof(float));
    uint64_t h = XXH64(host, n * sizeof(float), 0);
    free(host);
    return h;
}

/* Compares every rank's parameter digest with rank 0's; an error names the
 * ranks that differ (every rank reaches the same verdict). */
static int check_replicas(struct trainer *T, uint64_t *digest)
{
    uint64_t mine = param_digest(T);
    if (digest)
        *digest = mine;
    if (T->world == 1)
        return 0;
    uint64_t *all = rt_calloc((size_t)T->world, sizeof(uint64_t), "digests");
    if (!all)
        return -1;
    rt_comm_allgather(T->comm, &mine, all, sizeof(mine), "the replica check");
    char bad[256] = "";
    size_t o = 0;
    int n = 0;
    for (int r = 1; r < T->world; r++)
        if (all[r] != all[0] && n++ < 8 && o < sizeof(bad))
            o += (size_t)snprintf(bad + o, sizeof(bad) - o, "%s%d (%016" PRIx64 ")", o ? ", " : "", r, all[r]);
    uint64_t first = all[0];
    free(all);
    if (n)
        return rt_errf(-EPROTO, "replica check at optimizer step %" PRIu64 ": the parameters of rank(s) %s%s differ "
                                "from rank 0's (%016" PRIx64 ")",
                       T->opt_steps, bad, n > 8 ? " and more" : "", first);
    return 0;
}

/* Closes the epoch: validation, the epoch line, metrics, checkpoint.
 * Returns 1 when the target accuracy has held for `patience` epochs. */
static int end_epoch(struct trainer *T, int partial)
{
    const struct train_cfg *c = T->cfg;
    /* Global figures: sums over the ranks; times are each rank's own, averaged. */
    double g[7] = {T->ep.loss_sum, T->ep.correct,      T->ep.count,       (double)T->ep_images,
                   (double)T->ep_train_ns, (double)T->ep_wait_ns, (double)T->ep_comm_ns};
    if (T->comm)
        rt_comm_allreduce(T->comm, g, 7, RT_COMM_F64, RT_RED_SUM, "epoch metrics");
    double time_s = g[4] / T->world * 1e-9;
    double ips = time_s > 0 ? g[3] / time_s : 0;
    double wait = g[4] > 0 ? g[5] / g[4] : 0;
    double comm = g[4] > 0 ? g[6] / g[4] : 0;
    T->last_train_loss = g[2] ? g[0] / g[2] : NAN;
    T->last_train_acc = g[2] ? g[1] / g[2] : NAN;
    T->have_val = 0;
    /* Rank 0's running statistics, as DDP's broadcast_buffers: validation and
     * checkpoints then see one model. */
    rt_comm_set_phase(T->comm, T->opt_steps, RT_PHASE_VALIDATE);
    if (sync_from_root(T, rt_model_buffers(T->model), rt_model_buffer_count(T->model), "batchnorm statistics") < 0)
        return -1;
    int hit = 0;
    char val[96] = "";
    if (!partial && T->val_split >= 0) {
        struct rt_loss_stats vs;
        uint64_t v0 = rt_now_ns();
        if (validate(T, &vs) < 0)
            return -1;
        T->have_val = 1;
        T->last_val_loss = vs.count ? vs.loss_sum / vs.count : NAN;
        T->last_val_acc = vs.count ? vs.correct / vs.count : NAN;
        if (T->last_val_acc > T->best_acc)
            T->best_acc = T->last_val_acc;
        snprintf(val, sizeof(val), "  val loss %.4f acc %5.2f%% (%.1fs)", T->last_val_loss, 100 * T->last_val_acc,
                 (double)(rt_now_ns() - v0) * 1e-9);
        if (c->target_accuracy > 0 && T->last_val_acc >= c->target_accuracy)
            T->streak++;
        else
            T->streak = 0;
        hit = c->target_accuracy > 0 && T->streak >= RT_MAX(c->patience, 1);
    }
    if (T->root) {
        if (c->progress)
            fprintf(stderr, "\r\033[K");
        char comm_s[32] = "";
        if (T->world > 1)
            snprintf(comm_s, sizeof(comm_s), "  comm %4.1f%%", 100 * comm);
        printf("epoch %3" PRIu64 "/%" PRIu64 "%s  %6.1fs  train loss %.4f acc %5.2f%%%s  %6.0f img/s  data wait "
               "%4.1f%%%s\n",
               T->epoch + 1, c->epochs, partial ? " (partial)" : "", time_s, T->last_train_loss,
               100 * T->last_train_acc, val, ips, 100 * wait, comm_s);
        fflush(stdout);
        write_metrics(T, time_s, ips, wait, comm);
    }
    T->epochs_done++;
    return hit;
}

static void banner(const struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    if (!T->root)
        return;
    size_t params = 0;
    int count;
    const struct rt_tensor_info *tab = rt_model_tensors(T->model, &count);
    for (int i = 0; i < count; i++)
        if (tab[i].kind == RT_PARAM)
            params += tab[i].count;
    char data[4700];
    if (c->synthetic)
        snprintf(data, sizeof(data), "synthetic batches (%ux%ux%u, %u classes), compute only", T->c, T->h, T->w,
                 T->classes);
    else
        snprintf(data, sizeof(data), "%s (%" PRIu64 " train, %s: %" PRIu64 ", %ux%ux%u, %u classes)",
                 T->data_path[0] ? T->data_path : c->data,
                 T->info->split[RT_SPLIT_TRAIN].records, T->val_split >= 0 ? rt_split_name(T->val_split) : "no val",
                 T->val_split >= 0 ? T->info->split[T->val_split].records : 0, T->c, T->h, T->w, T->classes);
    const struct rt_rank_info *ri = rt_comm_info(T->comm);
    printf("ringtrain train: world %d (%d node%s, %d rank%s per node), %s\n", T->world, ri->nodes,
           ri->nodes == 1 ? "" : "s", ri->local_world, ri->local_world == 1 ? "" : "s", rt_backend_describe(T->be));
    printf("  model     %s, %.2f M parameters, %s\n", rt_model_name(T->model), (double)params / 1e6,
           T->act == RT_F32 ? "fp32" : T->act == RT_BF16 ? "mixed precision bf16 (fp32 weights)"
                                                         : "mixed precision fp16 (fp32 weights)");
    if (T->scaling)
        printf("  scaling   dynamic loss scale from %g (x%g every %u good steps, x%g on overflow; stop after %u "
               "overflows in a row)\n",
               (double)T->scaler.scale, (double)T->scaler.growth, T->scaler.growth_interval,
               (double)T->scaler.backoff, T->scaler.max_skips);
    printf("  data      %s\n", data);
    char mean[128], std[128];
    json_floats(mean, sizeof(mean), T->mean, T->c);
    json_floats(std, sizeof(std), T->std, T->c);
    printf("  normalise mean %s std %s%s\n", mean, std, T->norm_from_data ? "" : " (defaults: no statistics in the manifest)");
    printf("  batch     %u per rank x %d ranks x %u accumulation = %u effective, %" PRIu64 " steps/epoch, %" PRIu64
           " epochs\n",
           c->batch, T->world, T->accum, c->batch * (uint32_t)T->world * T->accum, T->steps_per_epoch / T->accum,
           c->epochs);
    if (T->world > 1) {
        int nb = rt_bucketer_count(T->bucketer);
        size_t off, cnt;
        rt_bucketer_bucket(T->bucketer, 0, &off, &cnt, NULL, 0);
        double first = (double)cnt * 4e-6, big = 0;
        for (int i = 1; i < nb; i++) {
            rt_bucketer_bucket(T->bucketer, i, &off, &cnt, NULL, 0);
            big = RT_MAX(big, (double)cnt * 4e-6);
        }
        printf("  comm      %s (ranks from %s: %s), all-reduce in %d bucket%s (first %.2f MB, largest %.2f MB, "
               "cap %g MB)%s\n",
               rt_comm_backend(T->comm), rt_rank_source_name(ri->source), ri->vars, nb, nb == 1 ? "" : "s", first,
               nb > 1 ? big : first, c->bucket_cap_mb, c->no_overlap ? ", after backward (--no-overlap)"
                                                                         : ", overlapped with backward");
        if (T->nccl)
            printf("  gradients %s\n", rt_nccl_describe(T->nccl));
    }
    printf("  optimizer %s lr %g", rt_optim_kind_name(c->optim.kind), (double)c->lr);
    if (c->optim.kind == RT_OPT_SGD)
        printf(" momentum %g%s", (double)c->optim.momentum, c->optim.nesterov ? " nesterov" : "");
    printf(" weight decay %g, schedule %s (warm-up %" PRIu64 " steps of %" PRIu64 ")", (double)c->optim.weight_decay,
           rt_sched_kind_name(c->sched), T->sched.warmup_steps, T->sched.total_steps);
    if (c->label_smoothing > 0)
        printf(", label smoothing %g", (double)c->label_smoothing);
    if (c->clip_grad_norm > 0)
        printf(", clip %g", (double)c->clip_grad_norm);
    printf("\n");
    fflush(stdout);
}

/* ---- the loop ------------------------------------------------------------------ */

/* The loader's next batch, its copy to the device started. 1, 0 at the end of the data, -1 on error. */
static int fetch(struct trainer *T, struct inflight *f)
{
    int more = rt_loader_next(T->loader, &f->b);
    if (more <= 0)
        return more < 0 ? -1 : 0;
    f->dev = rt_backend_input_upload(T->be, f->b->images, batch_bytes(T), &f->ticket);
    return 1;
}

/* Gives a batch back to the ring once its copy has read it. */
static void give_back(struct trainer *T, struct inflight *f)
{
    if (!f->b)
        return;
    rt_backend_input_wait(T->be, f->ticket);
    rt_loader_release(T->loader, f->b);
    f->b = NULL;
}

/*
 * Loss scaling after the step's gradients are summed over the ranks (so
 * every rank sees the same overflow and takes the same decision): unscale,
 * check, and update the scale. Returns 0 to apply the update, 1 to skip
 * it, -1 to stop (the message names the first non-finite tensor).
 */
static int unscale_step(struct trainer *T)
{
    const struct rt_ops *ops = rt_backend_ops(T->be);
    struct rt_stream *s = rt_backend_stream(T->be);
    float *g = rt_model_grads(T->model);
    const size_t n = rt_model_param_count(T->model);
    if (T->opt_steps >= T->overflow_from && T->opt_steps - T->overflow_from < T->overflow_count) {
        const float inf = INFINITY; /* test hook: an overflow in the first gradient of the buffer */
        ops->upload(s, g, &inf, sizeof(inf));
    }
    const float used = T->scaler.scale;
    float found = 0.0f;
    ops->unscale_check(s, n, g, 1.0f / used, T->found_inf);
    ops->download(s, &found, T->found_inf, sizeof(found));
    const enum rt_scaler_verdict v = rt_scaler_update(&T->scaler, found != 0.0f);
    if (v == RT_SCALER_APPLY)
        return 0;
    if (v == RT_SCALER_SKIP) {
        if (T->root)
            rt_info("step %" PRIu64 ": gradients overflowed at loss scale %g: update skipped, scale now %g",
                    T->opt_steps, (double)used, (double)T->scaler.scale);
        return 1;
    }
    char where[160];
    rt_model_find_nonfinite(T->model, where, sizeof(where));
    if (v == RT_SCALER_STOP_SKIPS)
        rt_errf(-ERANGE, "%u optimizer steps in a row overflowed (step %" PRIu64 ", loss scale now %g); first "
                         "non-finite tensor: %s. The run diverged: lower --lr, set --clip-grad-norm, or use --amp bf16",
                T->scaler.skips_in_row, T->opt_steps, (double)T->scaler.scale, where[0] ? where : "(not found)");
    else
        rt_errf(-ERANGE, "the loss scale collapsed to %g at step %" PRIu64 " (gradients overflow even unscaled); "
                         "first non-finite tensor: %s. Lower --lr, set --clip-grad-norm, or use --amp bf16",
                (double)T->scaler.scale, T->opt_steps, where[0] ? where : "(not found)");
    return -1;
}

enum stop_reason { STOP_DONE, STOP_TARGET, STOP_STEPS, STOP_SIGNAL };

static int train_loop(struct trainer *T, enum stop_reason *why)
{
    const struct train_cfg *c = T->cfg;
    const uint32_t B = c->batch;
    uint64_t ep_t0 = rt_now_ns(), last_bar = 0;
    *why = STOP_DONE;
    /* RINGTRAIN_TEST_STALL=RANK:STEP makes that rank hang before that
     * optimizer step (the failure tests' stalled peer). */
    int stall_rank = -1;
    uint64_t stall_step = UINT64_MAX;
    const char *stall = getenv("RINGTRAIN_TEST_STALL");
    if (stall && sscanf(stall, "%d:%" SCNu64, &stall_rank, &stall_step) != 2)
        stall_rank = -1;
    while (T->epoch < c->epochs) {
        uint64_t t0 = rt_now_ns();
        struct rt_batch *b = NULL;
        const uint8_t *images;
        uint64_t ticket;
        uint32_t valid = B;
        if (c->synthetic) {
            images = T->syn_dev;
            ticket = T->syn_ticket;
            memcpy(T->labels, T->syn_labels, B * sizeof(int32_t));
        } else {
            rt_comm_set_phase(T->comm, T->opt_steps, RT_PHASE_DATA);
            if (!T->next.b) {
                int f = fetch(T, &T->next);
                if (f <= 0)
                    return f;
            }
            T->cur = T->next;
            T->next.b = NULL;
            b = T->cur.b;
            images = T->cur.dev;
            ticket = T->cur.ticket;
            valid = b->valid;
            batch_labels(T, b);
            /* The next batch's copy overlaps this step (none after the run's last batch). */
            if (fetch(T, &T->next) < 0)
                return -1;
        }
        uint64_t t1 = rt_now_ns();
        int last_micro = (T->micro + 1) % T->accum == 0;
        if (T->micro % T->accum == 0)
            rt_backend_ops(T->be)->zero(rt_backend_stream(T->be), rt_model_grads(T->model),
                                         rt_model_param_count(T->model) * sizeof(float));
        /* The gradient of the global mean loss: every rank's batch is full
         * (the sampler drops the last partial one), so the sum of the ranks'
         * gradients scaled this way is the mean over all of them. */
        struct rt_step_opts so = {.mode = RT_TRAIN, .label_smoothing = c->label_smoothing,
                                  .grad_scale = 1.0f / ((float)valid * (float)T->world * (float)T->accum) *
                                                (T->scaling ? T->scaler.scale : 1.0f),
                                  .dropout_offset = (T->micro * (uint64_t)T->world + (uint64_t)T->rank) << 32,
                                  .mean = T->mean, .std = T->std, .input_ticket = ticket};
        if (last_micro) {
            /* Accumulation micro-steps before the last reduce nothing. */
            rt_bucketer_begin(T->bucketer, T->opt_steps);
            so.grads_ready = rt_bucketer_ready;
            so.grads_ready_arg = T->bucketer;
        }
        rt_comm_set_phase(T->comm, T->opt_steps, RT_PHASE_COMPUTE);
        if (T->opt_steps == stall_step && T->rank == stall_rank)
            for (;;)
                pause(); /* test hook: a rank that hangs in compute */
        struct rt_loss_stats st = {0};
        int r = rt_model_step(T->model, &so, (int)B, images, T->labels, &st);
        if (b)
            give_back(T, &T->cur);
        if (r < 0)
            return -1;
        if (!isfinite(st.loss_sum) && !T->nonfinite[0]) {
            char where[160];
            rt_model_find_nonfinite(T->model, where, sizeof(where));
            snprintf(T->nonfinite, sizeof(T->nonfinite), "the loss became %s at epoch %" PRIu64 " step %" PRIu64
                     " (optimizer step %" PRIu64 ")%s; first non-finite tensor: %s",
                     isnan(st.loss_sum) ? "NaN" : "infinite", T->epoch + 1, T->step, T->opt_steps,
                     T->world > 1 ? " on this rank" : "", where[0] ? where : "the loss itself");
        }
        T->micro++;
        uint64_t tc = 0;
        int stop_all = 0;
        if (last_micro) {
            /* The control word travels with the step's last collective, so
             * every rank takes the same decision at the same step. */
            uint32_t flags = (stop_signal ? 1u : 0u) | (T->nonfinite[0] ? 2u : 0u) |
                             (stop_signal == SIGTERM ? 4u : 0u) | (stop_signal == SIGUSR1 ? 8u : 0u),
                     all = 0;
            rt_comm_set_phase(T->comm, T->opt_steps, RT_PHASE_GRAD_WAIT);
            if (rt_bucketer_finish(T->bucketer, flags, &all, &tc) < 0)
                return -1;
            if (all & 2u) {
                if (T->nonfinite[0])
                    rt_errf(-ERANGE, "%s. Lower --lr or set --clip-grad-norm", T->nonfinite);
                else
                    rt_errf(-ERANGE, "another rank's loss became non-finite at optimizer step %" PRIu64
                                     " (its message names the tensor)",
                            T->opt_steps);
                return -1;
            }
            stop_all = (all & 1u) != 0;
            T->stop_flags = all;
            rt_comm_set_phase(T->comm, T->opt_steps, RT_PHASE_OPTIM);
        }
        int apply = 1;
        if (last_micro && T->scaling) {
            int r2 = unscale_step(T);
            if (r2 < 0)
                return -1;
            apply = r2 == 0;
        }
        if (last_micro && apply) {
            if (c->clip_grad_norm > 0) {
                float norm = rt_clip_grad_norm(T->opt, rt_model_grads(T->model), rt_model_param_count(T->model),
                                               c->clip_grad_norm);
                if (!isfinite(norm)) {
                    char where[160];
                    rt_model_find_nonfinite(T->model, where, sizeof(where));
                    rt_errf(-ERANGE, "the gradient norm became non-finite at optimizer step %" PRIu64
                                     "; first non-finite tensor: %s",
                            T->opt_steps, where[0] ? where : "(not found)");
                    return -1;
                }
            }
            /* The schedule counts applied updates: a step skipped by loss scaling does not advance it. */
            rt_optim_step(T->opt, rt_model_params(T->model), rt_model_grads(T->model),
                          rt_sched_lr(&T->sched, (uint64_t)rt_optim_steps(T->opt)));
        }
        if (last_micro)
            T->opt_steps++;
        uint64_t t2 = rt_now_ns();
        T->ep.loss_sum += st.loss_sum;
        T->ep.correct += st.correct;
        T->ep.count += st.count;
        T->ep_images += valid;
        T->images += valid;
        T->ep_wait_ns += t1 - t0;
        T->ep_comm_ns += tc;
        T->comm_ns += tc;
        T->ep_train_ns += t2 - t0;
        T->train_ns += t2 - t0;
        if (++T->run_micro > 3) {
            T->steady_images += valid;
            T->steady_ns += t2 - t0;
        }
        T->step++;
        if (T->root && c->progress && t2 - last_bar > 200000000ull) {
            progress(T, ep_t0);
            last_bar = t2;
        }
        int boundary = last_micro;
        if (boundary && c->check_replicas && T->opt_steps % c->check_replicas == 0 && check_replicas(T, NULL) < 0)
            return -1;
        if (T->step == T->steps_per_epoch) {
            int hit = end_epoch(T, 0);
            if (hit < 0)
                return -1;
            T->epoch++;
            T->step = 0;
            memset(&T->ep, 0, sizeof(T->ep));
            T->ep_images = T->ep_train_ns = T->ep_wait_ns = T->ep_comm_ns = 0;
            ep_t0 = rt_now_ns();
            if (save_checkpoint(T) < 0)
                return -1;
            if (hit) {
                *why = STOP_TARGET;
                return 0;
            }
        }
        if (boundary && c->max_steps && T->opt_steps >= c->max_steps) {
            *why = STOP_STEPS;
            break;
        }
        if (boundary && stop_all) {
            *why = STOP_SIGNAL;
            break;
        }
    }
    if (T->step > 0 && end_epoch(T, 1) < 0)
        return -1;
    if ((*why == STOP_STEPS || *why == STOP_SIGNAL) && save_checkpoint(T) < 0)
        return -1;
    return 0;
}

static void summary(const struct trainer *T, enum stop_reason why, double wall_s)
{
    static const char *const reasons[] = {"completed", "target accuracy reached", "step limit", "signal"};
    /* Global: every rank trains the same number of full batches, so the
     * images are this rank's times the world; the time is rank 0's. */
    double train_s = (double)T->train_ns * 1e-9;
    double images = (double)T->images * T->world;
    double ips = train_s > 0 ? images / train_s : 0;
    if (!T->root)
        return;
    printf("done (%s): %" PRIu64 " steps, %.1fs (%.1fs training), %.0f img/s", reasons[why], T->opt_steps, wall_s,
           train_s, ips);
    if (T->best_acc > 0)
        printf(", best val acc %.2f%%", 100 * T->best_acc);
    printf("\n");
    if (T->cfg->checkpoint_dir)
        printf("checkpoint: %s/model.safetensors\n", T->cfg->checkpoint_dir);
    if (T->cfg->json) {
        json_t *o = json_pack("{s:s, s:f, s:I, s:f, s:f, s:f, s:I, s:I, s:i, s:i, s:s}", "model",
                              rt_model_name(T->model), "images_per_s", ips, "steps", (json_int_t)T->opt_steps,
                              "time_s", wall_s, "train_time_s", train_s, "train_loss", T->last_train_loss, "epochs",
                              (json_int_t)T->epochs_done, "images", (json_int_t)images, "batch_size",
                              (int)T->cfg->batch, "threads", T->cfg->threads, "stopped", reasons[why]);
        if (o) {
            json_object_set_new(o, "train_acc", json_real(T->last_train_acc));
            if (T->steady_ns)
                json_object_set_new(o, "steady_images_per_s",
                                    json_real((double)T->steady_images * T->world / ((double)T->steady_ns * 1e-9)));
            struct rt_comm_counts cc;
            rt_comm_counts(T->comm, &cc);
            json_object_set_new(o, "world_size", json_integer(T->world));
            json_object_set_new(o, "device", json_string(rt_backend_kind_of(T->be) == RT_BACKEND_CUDA ? "cuda" : "cpu"));
            json_object_set_new(o, "amp", json_string(T->act == RT_F32 ? "off" : rt_dtype_name(T->act)));
            json_object_set_new(o, "optimizer_updates", json_integer((json_int_t)rt_optim_steps(T->opt)));
            if (T->scaling) {
                json_object_set_new(o, "loss_scale", json_real(T->scaler.scale));
                json_object_set_new(o, "skipped_steps", json_integer((json_int_t)T->scaler.skipped));
            }
            json_object_set_new(o, "exposed_comm_frac", json_real(T->run_comm_frac));
            json_object_set_new(o, "buckets", json_integer(rt_bucketer_count(T->bucketer)));
            json_object_set_new(o, "bucket_cap_mb", json_real(T->cfg->bucket_cap_mb));
            json_object_set_new(o, "overlap", json_boolean(!T->cfg->no_overlap));
            json_object_set_new(o, "bucket_allreduces", json_integer((json_int_t)cc.bucket_allreduces));
            if (T->best_acc > 0 || T->have_val) {
                json_object_set_new(o, "val_loss", json_real(T->last_val_loss));
                json_object_set_new(o, "val_acc", json_real(T->last_val_acc));
                json_object_set_new(o, "best_val_acc", json_real(T->best_acc));
            }
            char *s = json_dumps(o, JSON_COMPACT);
            if (s)
                printf("%s\n", s);
            free(s);
            json_decref(o);
        }
    }
    fflush(stdout);
}

int train_device_parse(const char *s, enum train_device *out)
{
    static const char *const names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) {
            *out = (enum train_device)i;
            return 0;
        }
    return rt_errf(-EINVAL, "--device %s: expected auto, cpu or cuda", s);
}

static const char *const amp_names[] = {"auto", "off", "bf16", "fp16"}; /* enum train_amp order */

int train_amp_parse(const char *s, enum train_amp *out)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, amp_names[i])) {
            *out = (enum train_amp)i;
            return 0;
        }
    return rt_errf(-EINVAL, "--amp %s: expected auto, off, bf16 or fp16", s);
}

int train_amp_resolve(enum train_amp amp, struct rt_backend *be, enum rt_dtype *out)
{
    if (amp == AMP_AUTO) {
        *out = RT_F32;
        if (rt_backend_kind_of(be) == RT_BACKEND_CUDA)
            *out = rt_backend_ops_for(be, RT_BF16) ? RT_BF16 : RT_F16;
        rt_errclear();
        return 0;
    }
    const enum rt_dtype want = amp == AMP_BF16 ? RT_BF16 : amp == AMP_FP16 ? RT_F16 : RT_F32;
    if (!rt_backend_ops_for(be, want))
        return rt_errf(-ENOTSUP, "--amp %s: %s", amp_names[amp], rt_errmsg());
    *out = want;
    return 0;
}

static const char *env_get(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

int train_open_backend(enum train_device dev, int local_rank, int local_world, int threads,
                       struct rt_backend **out)
{
    struct rt_backend_opts bo = {.kind = RT_BACKEND_CPU, .threads = threads};
    struct rt_backend_probe p;
    int built = rt_backend_probe(RT_BACKEND_CUDA, &p) == 0;
    if (dev == DEVICE_AUTO && built && p.devices > 0)
        dev = DEVICE_CUDA;
    if (dev == DEVICE_CUDA) {
        if (!built)
            return rt_errf(-ENOTSUP, "--device cuda: %s", p.detail);
        bo.kind = RT_BACKEND_CUDA;
        if (p.devices > 0) {
            char note[1024];
            if (rt_gpu_preflight(p.devices, local_rank, RT_MAX(local_world, 1), env_get, NULL, &bo.device, note,
                                 sizeof(note)) < 0)
                return rt_errf(-ENODEV, "--device cuda: %s", rt_errmsg());
            if (note[0] && local_rank == 0)
                rt_info("%s", note);
        }
    }
    int rc = rt_backend_create(&bo, out);
    if (rc < 0 && dev == DEVICE_CUDA)
        return rt_errf(rc, "--device cuda: %s", rt_errmsg());
    return rc;
}

/* --stage-to: local rank 0 of each node copies the dataset while the other
 * ranks of the node wait (no deadline: a copy takes what it takes, but a
 * dead peer still ends the job); all then read the node-local copy. */
static int stage_data(struct trainer *T)
{
    const struct train_cfg *c = T->cfg;
    struct {
        int32_t rc;
        char path[4096];
        char msg[512];
    } r;
    memset(&r, 0, sizeof(r));
    rt_comm_set_phase(T->comm, 0, RT_PHASE_STAGE);
    if (rt_comm_info(T->comm)->local_rank == 0) {
        struct rt_local_copy_opts so = {.parent = c->stage_to};
        struct rt_local_copy_result res;
        r.rc = rt_local_copy_dataset(c->data, &so, &res);
        if (r.rc < 0) {
            snprintf(r.msg, sizeof(r.msg), "%s", rt_errmsg());
        } else {
            snprintf(r.path, sizeof(r.path), "%s", res.path);
            char mb[32];
            rt_format_bytes((double)res.bytes_copied, mb, sizeof(mb));
            rt_info("staged %s to %s: %u of %u files copied (%s), %.1fs", c->data, res.path, res.files_copied,
                    res.files, mb, res.seconds);
        }
    }
    rt_comm_node_barrier(T->comm, 0, "the wait for this node's local rank 0 to stage the dataset");
    rt_comm_node_broadcast(T->comm, &r, sizeof(r), "the staged dataset's path");
    if (r.rc < 0)
        return rt_errf(r.rc, "--stage-to %s: %s", c->stage_to, r.msg);
    snprintf(T->data_path, sizeof(T->data_path), "%s", r.path);
    return 0;
}

/* Plans the gradient buckets over the model's parameter table. */
static int make_bucketer(struct trainer *T)
{
    int count, np = 0;
    const struct rt_tensor_info *tab = rt_model_tensors(T->model, &count);
    struct rt_bucket_tensor *bt = rt_calloc((size_t)count, sizeof(*bt), "bucket plan");
    if (!bt)
        return -1;
    for (int i = 0; i < count; i++)
        if (tab[i].kind == RT_PARAM)
            bt[np++] = (struct rt_bucket_tensor){tab[i].name, tab[i].offset, tab[i].count};
    struct rt_bucket_opts bo = {.cap_bytes = (size_t)(T->cfg->bucket_cap_mb * 1048576.0),
                                .no_overlap = T->cfg->no_overlap, .nccl = T->nccl,
                                .stream = T->nccl ? rt_backend_native_stream(T->be) : NULL};
    int rc = rt_bucketer_create(T->comm, rt_model_grads(T->model), rt_model_param_count(T->model), bt, np, &bo,
                                &T->bucketer);
    free(bt);
    return rc < 0 ? -1 : 0;
}

int train_run(const struct train_cfg *cfg)
{
    struct trainer T = {.cfg = cfg, .val_split = -1, .accum = RT_MAX(cfg->grad_accum, 1), .best_acc = 0};
    struct train_cfg c = *cfg;
    if (c.progress < 0)
        c.progress = isatty(STDERR_FILENO);
    T.cfg = &c;
    int rc = RT_EXIT_FAIL;
    uint64_t t0 = rt_now_ns();
    enum stop_reason why = STOP_DONE;

    struct rt_comm_opts co = {.timeout_s = c.comm_timeout, .peer_timeout_s = c.peer_timeout};
    if (rt_comm_create(&co, &T.comm) < 0)
        goto out;
    T.rank = rt_comm_info(T.comm)->rank;
    T.world = rt_comm_info(T.comm)->world;
    T.root = T.rank == 0;
    if (!T.root)
        c.progress = 0;
    if (c.stage_to && stage_data(&T) < 0)
        goto out;
    if (open_data(&T) < 0)
        goto out;
    if (c.aug_default && T.c != 3)
        memset(&c.aug, 0, sizeof(c.aug)); /* crops and flips suit photos, not digits */
    if (c.threads <= 0)
        c.threads = rt_comm_default_threads(T.comm);
    if (train_open_backend(c.device, rt_comm_info(T.comm)->local_rank, rt_comm_info(T.comm)->local_world,
                           c.threads, &T.be) < 0)
        goto out;
    /* Device gradients are reduced by NCCL on its own stream; set up before the loader's threads start
     * (the transport probe sets NCCL's environment variables for a moment). */
    if (T.world > 1 && rt_backend_kind_of(T.be) == RT_BACKEND_CUDA &&
        rt_nccl_create(T.comm, rt_backend_device(T.be), &T.nccl) < 0)
        goto out;
    if (train_amp_resolve(c.amp, T.be, &T.act) < 0)
        goto out;
    struct rt_model_opts mo = {.name = c.model, .c = (int)T.c, .h = (int)T.h, .w = (int)T.w,
                               .classes = (int)T.classes, .batch = (int)c.batch, .seed = c.seed, .act = T.act};
    if (rt_model_create(T.be, &mo, &T.model) < 0 ||
        rt_optim_create(T.be, &c.optim, rt_model_param_count(T.model), &T.opt) < 0)
        goto out;
    T.scaling = c.loss_scale > 0 || (c.loss_scale < 0 && T.act == RT_F16);
    rt_scaler_init(&T.scaler);
    if (c.max_skipped_steps)
        T.scaler.max_skips = c.max_skipped_steps;
    T.overflow_from = UINT64_MAX;
    const char *ovf = getenv("RINGTRAIN_TEST_OVERFLOW");
    if (ovf && sscanf(ovf, "%" SCNu64 ":%" SCNu64, &T.overflow_from, &T.overflow_count) != 2)
        T.overflow_from = UINT64_MAX;
    if (T.scaling && !(T.found_inf = rt_backend_ops(T.be)->alloc(T.be, sizeof(float))))
        goto out;
    T.labels = rt_calloc(c.batch, sizeof(int32_t), "labels");
    if (!T.labels || make_bucketer(&T) < 0)
        goto out;
    if (c.resume && c.checkpoint_dir) {
        int r = load_checkpoint(&T);
        if (r < 0)
            goto out;
        /* Every rank reads the checkpoint rank 0 wrote: the directory must be
         * one they all see. */
        int64_t seen[2] = {r, -r};
        rt_comm_allreduce(T.comm, seen, 2, RT_COMM_I64, RT_RED_MAX, "the resume check");
        if (seen[0] != -seen[1]) {
            rt_errf(-EINVAL, "--resume: some ranks find a checkpoint in %s and others do not; put --checkpoint-dir "
                             "on a filesystem every rank sees",
                    c.checkpoint_dir);
            goto out;
        }
        if (T.root && r == 0)
            rt_info("--resume: no checkpoint in %s yet, starting from scratch", c.checkpoint_dir);
        else if (T.root)
            rt_info("resuming from %s at epoch %" PRIu64 " step %" PRIu64 " (optimizer step %" PRIu64 ")",
                    c.checkpoint_dir, T.epoch + 1, T.step, T.opt_steps);
    }
    /* One model on every rank from the start: rank 0's. */
    if (sync_from_root(&T, rt_model_params(T.model), rt_model_param_count(T.model), "initial parameters") < 0 ||
        sync_from_root(&T, rt_model_buffers(T.model), rt_model_buffer_count(T.model), "initial buffers") < 0)
        goto out;
    if (c.synthetic) {
        T.syn_images = rt_malloc(batch_bytes(&T), "synthetic batch");
        T.syn_labels = rt_malloc(c.batch * sizeof(int32_t), "synthetic labels");
        if (!T.syn_images || !T.syn_labels)
            goto out;
        make_synthetic(&T);
        T.syn_dev = rt_backend_input_upload(T.be, T.syn_images, batch_bytes(&T), &T.syn_ticket);
    } else if (start_loader(&T) < 0) {
        goto out;
    }
    make_schedule(&T);
    if (c.metrics && !(T.metrics = fopen(c.metrics, T.opt_steps ? "a" : "w"))) {
        rt_errf(-errno, "cannot open %s: %s", c.metrics, strerror(errno));
        goto out;
    }
    banner(&T);
    rt_comm_print_ranks(T.comm, stdout, c.threads, rt_backend_kind_of(T.be) == RT_BACKEND_CUDA ? "cuda" : "cpu");
    if (T.root)
        fflush(stdout);

    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    struct sigaction old_term, old_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGUSR1, &sa, &old_usr1);
    int lr = train_loop(&T, &why);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    if (lr < 0)
        goto out;
    uint64_t digest;
    if (check_replicas(&T, &digest) < 0)
        goto out;
    rt_info("param digest: %016" PRIx64, digest);
    if (why == STOP_SIGNAL && T.root) {
        /* The signal may have reached another rank only: the control word says which. */
        char sig[64] = "a signal";
        if (T.stop_flags & 4u)
            snprintf(sig, sizeof(sig), "signal %d (SIGTERM%s)", SIGTERM, T.stop_flags & 8u ? ", and SIGUSR1" : "");
        else if (T.stop_flags & 8u)
            snprintf(sig, sizeof(sig), "signal %d (SIGUSR1)", SIGUSR1);
        rt_info("stopped by %s: checkpoint saved at epoch %" PRIu64 " step %" PRIu64 "; run again with --resume", sig,
                T.epoch + 1, T.step);
    }
    /* The run's exposed-communication share, averaged over the ranks. */
    double ct[2] = {(double)T.comm_ns, (double)T.train_ns};
    rt_comm_allreduce(T.comm, ct, 2, RT_COMM_F64, RT_RED_SUM, "the run's communication share");
    T.run_comm_frac = ct[1] > 0 ? ct[0] / ct[1] : 0;
    summary(&T, why, (double)(rt_now_ns() - t0) * 1e-9);
    rt_comm_set_phase(T.comm, T.opt_steps, RT_PHASE_DONE);
    rc = RT_EXIT_OK;
out:
    if (rc != RT_EXIT_OK) {
        if (c.progress)
            fprintf(stderr, "\r\033[K");
        cli_fail();
        /* The other ranks are in collectives this rank will never join. */
        if (T.world > 1)
            rt_comm_abort(T.comm, RT_EXIT_FAIL, NULL);
    }
    if (T.metrics)
        fclose(T.metrics);
    if (T.loader)
        give_back(&T, &T.next); /* fetched for a step that did not run */
    rt_loader_destroy(T.loader);
    rt_ring_destroy(T.ring);
    free(T.labels);
    free(T.syn_images);
    free(T.syn_labels);
    /* NCCL's stream work is over before the memory it reduced goes. */
    rt_bucketer_destroy(T.bucketer);
    T.bucketer = NULL;
    rt_nccl_destroy(T.nccl);
    rt_optim_destroy(T.opt);
    if (T.found_inf)
        rt_backend_ops(T.be)->free(T.be, T.found_inf);
    rt_model_destroy(T.model);
    rt_backend_destroy(T.be);
    rt_dataset_close(T.ds);
    rt_bucketer_destroy(T.bucketer);
    rt_comm_destroy(T.comm);
    return rc;
}

/* ---- eval ---------------------------------------------------------------------- */

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

int eval_run(const struct eval_cfg *cfg)
{
    struct train_cfg tc = {.batch = cfg->batch, .workers = cfg->workers, .pin = RT_PIN_ON};
    struct trainer T = {.cfg = &tc, .val_split = RT_SPLIT_TEST, .world = 1, .root = 1};
    struct rt_st_file *f = NULL;
    int rc = RT_EXIT_FAIL;
    if (rt_st_read(cfg->checkpoint, &f) < 0)
        goto out;
    const char *model = rt_st_meta(f, "model"), *classes = rt_st_meta(f, "num_classes");
    uint32_t shape[3];
    float fs[3];
    if (!model || !classes) {
        rt_errf(-EINVAL, "%s: no \"model\"/\"num_classes\" metadata: not a ringtrain checkpoint", cfg->checkpoint);
        goto out;
    }
    if (cfg->model && strcmp(cfg->model, model) != 0) {
        rt_errf(-EINVAL, "%s is a checkpoint of %s, not %s", cfg->checkpoint, model, cfg->model);
        goto out;
    }
    if (meta_floats(f, cfg->checkpoint, "input_shape", fs, 3) < 0)
        goto out;
    for (int i = 0; i < 3; i++)
        shape[i] = (uint32_t)fs[i];
    tc.data = cfg->data;
    if (open_data(&T) < 0)
        goto out;
    if (T.c != shape[0] || T.h != shape[1] || T.w != shape[2] || T.classes != (uint32_t)atoi(classes)) {
        rt_errf(-EINVAL, "%s was trained on %ux%ux%u images with %s classes; %s has %ux%ux%u with %u", cfg->checkpoint,
                shape[0], shape[1], shape[2], classes, cfg->data, T.c, T.h, T.w, T.classes);
        goto out;
    }
    if (!T.info->split[RT_SPLIT_TEST].records) {
        rt_errf(-EINVAL, "%s has no test split", cfg->data);
        goto out;
    }
    if (meta_floats(f, cfg->checkpoint, "mean", T.mean, T.c) < 0 || meta_floats(f, cfg->checkpoint, "std", T.std, T.c) < 0)
        goto out;
    struct rt_model_opts mo = {.name = model, .c = (int)T.c, .h = (int)T.h, .w = (int)T.w, .classes = (int)T.classes,
                               .batch = (int)cfg->batch};
    if (train_open_backend(cfg->device, 0, 1, cfg->threads, &T.be) < 0 || rt_model_create(T.be, &mo, &T.model) < 0 ||
        rt_model_load(T.model, f, cfg->checkpoint) < 0)
        goto out;
    T.labels = rt_calloc(cfg->batch, sizeof(int32_t), "labels");
    if (!T.labels)
        goto out;
    uint64_t t0 = rt_now_ns();
    struct rt_loss_stats vs;
    if (validate(&T, &vs) < 0)
        goto out;
    double s = (double)(rt_now_ns() - t0) * 1e-9;
    double loss = vs.count ? vs.loss_sum / vs.count : NAN, acc = vs.count ? vs.correct / vs.count : NAN;
    printf("%s on %s test split: %.0f images, loss %.4f, accuracy %.2f%% (%.1fs, %.0f img/s)\n", model, cfg->data,
           (double)vs.count, loss, 100 * acc, s, s > 0 ? vs.count / s : 0);
    if (cfg->json)
        printf("{\"model\":\"%s\",\"images\":%.0f,\"loss\":%.6f,\"accuracy\":%.6f,\"time_s\":%.3f}\n", model,
               (double)vs.count, loss, acc, s);
    rc = RT_EXIT_OK;
out:
    if (rc != RT_EXIT_OK)
        cli_fail();
    free(T.labels);
    rt_model_destroy(T.model);
    rt_backend_destroy(T.be);
    rt_dataset_close(T.ds);
    rt_st_close(f);
    return rc;
}
