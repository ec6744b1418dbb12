/*
 * driver.c - building and tearing down the driver: the process group, the
 * dataset (copied node-local first with --stage-to), the backend, the model,
 * optimizer and loss scaler, the bucket plan, the schedule. The order of
 * train_create is the order every rank meets the collectives in.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "staging/local_copy.h"
#include "tools/train/driver.h"

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
        /* bf16 wherever the device computes it natively; else fp16 on a GPU (tensor cores), fp32 on a CPU */
        *out = rt_backend_ops_for(be, RT_BF16) ? RT_BF16 : rt_backend_kind_of(be) == RT_BACKEND_CUDA ? RT_F16 : RT_F32;
        rt_errclear();
        return 0;
    }
    const enum rt_dtype want = amp == AMP_BF16 ? RT_BF16 : amp == AMP_FP16 ? RT_F16 : RT_F32;
    if (!rt_backend_ops_for(be, want))
        return rt_errf(-ENOTSUP, "--amp %s: %s", amp_names[amp], rt_errmsg());
    *out = want;
    return 0;
}

int train_allreduce_parse(const char *s, enum train_allreduce *out)
{
    if (strcmp(s, "auto") && strcmp(s, "nccl"))
        return rt_errf(-EINVAL, "--allreduce %s: expected auto or nccl", s);
    *out = strcmp(s, "nccl") ? ALLREDUCE_AUTO : ALLREDUCE_NCCL;
    return 0;
}

static const char *env_get(void *ctx, const char *name)
{
    (void)ctx;
    return getenv(name);
}

int train_open_backend(enum train_device dev, int local_rank, int local_world, int threads, int tf32,
                       int nondeterministic, struct rt_backend **out)
{
    struct rt_backend_opts bo = {.kind = RT_BACKEND_CPU, .threads = threads, .tf32 = tf32 != 0,
                                 .nondeterministic = nondeterministic != 0};
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

/* ---- set-up, in train_create's order ------------------------------------------------- */

static int open_comm(struct train *T)
{
    if (!T->comm) {
        struct rt_comm_opts co = {.timeout_s = T->cfg.comm_timeout, .peer_timeout_s = T->cfg.peer_timeout,
                                  .full_mesh = T->faults.full_mesh};
        const int rc = rt_comm_create(&co, &T->comm);
        if (rc < 0)
            return rc;
        T->own_comm = 1;
    }
    T->rank = rt_comm_info(T->comm)->rank;
    T->world = rt_comm_info(T->comm)->world;
    T->root = T->rank == 0;
    if (!T->root)
        T->cfg.progress = 0;
    return 0;
}

/* --stage-to: local rank 0 of each node copies the dataset while the other
 * ranks of the node wait (no deadline: a copy takes what it takes, but a
 * dead peer still ends the job); all then read the node-local copy. */
static int copy_data_local(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    struct {
        int32_t rc;
        char path[4096];
        char msg[512];
    } r;
    memset(&r, 0, sizeof(r));
    rt_comm_set_phase(T->comm, 0, RT_PHASE_STAGE);
    if (rt_comm_info(T->comm)->local_rank == 0) {
        struct rt_local_copy_opts so = {.parent = c->stage_to};
        if (T->faults.copy_delay_ms) {
            so.progress = train_faults_copy_progress;
            so.progress_ctx = &T->faults;
        }
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

/* The dataset's shape, normalisation and validation split; or the synthetic shape. */
static int open_data(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    if (c->data) {
        const int rc = rt_dataset_open(T->data_path[0] ? T->data_path : c->data, &T->ds);
        if (rc < 0)
            return rc;
        T->info = rt_dataset_info(T->ds);
        T->c = T->info->channels;
        const int rc2 = rt_loader_image_shape(T->info, c->image_size, &T->h, &T->w);
        if (rc2 < 0)
            return rc2;
        T->classes = T->info->num_classes;
        T->norm_from_data = rt_loader_norm(T->info, T->c, T->mean, T->std);
        if (T->info->split[RT_SPLIT_VAL].records)
            T->val_split = RT_SPLIT_VAL;
        else if (T->info->split[RT_SPLIT_TEST].records)
            T->val_split = RT_SPLIT_TEST;
        if (!c->synthetic && !T->info->split[RT_SPLIT_TRAIN].records)
            return rt_errf(-EINVAL, "%s has no training split", c->data);
    } else {
        T->c = c->syn_c;
        T->h = c->syn_h;
        T->w = c->syn_w;
        T->classes = c->syn_classes;
        rt_loader_norm(NULL, T->c, T->mean, T->std);
    }
    if (T->c > 4)
        return rt_errf(-EINVAL, "images with %u channels: at most 4 are supported", T->c);
    if (c->synthetic)
        T->val_split = -1;
    T->ckpt_micro = UINT64_MAX;
    return 0;
}

/* --cuda-graph: whether the steps become graphs after the warm-up, or why not (the model may still refuse). */
static void graph_decide(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    const int gpu = rt_backend_kind_of(T->be) == RT_BACKEND_CUDA;
    T->graph_on = 0;
    if (c->cuda_graph == 0)
        T->graph_why = "off (--cuda-graph off)";
    else if (!gpu && c->cuda_graph < 0)
        T->graph_why = "off on the CPU (--cuda-graph auto: on a GPU)";
    else if (!gpu && !rt_backend_async(T->be))
        T->graph_why = "off: the CPU backend runs each op as it is issued, there is nothing to capture "
                       "(RINGTRAIN_CPU_STREAMS=async records and replays its calls)";
    else if (T->world > 1 && c->cuda_graph < 0)
        T->graph_why = "off: several ranks -- each gradient bucket's all-reduce starts from backward's progress, "
                       "reported on the host, which a graph does not replay (--cuda-graph on: graphs, and the "
                       "all-reduce after backward, not overlapped)";
    else if (c->profile_ops)
        T->graph_why = "off: --profile-ops marks every op on the stream";
    else
        T->graph_on = 1;
}

/* The backend, NCCL for GPUs across ranks (or one GPU, --allreduce nccl), and the activation precision. */
static int open_compute(struct train *T)
{
    struct train_cfg *c = &T->cfg;
    const struct rt_rank_info *ri = rt_comm_info(T->comm);
    if (c->threads <= 0)
        c->threads = rt_comm_default_threads(T->comm);
    int rc = train_open_backend(c->device, ri->local_rank, ri->local_world, c->threads, c->tf32, c->nondeterministic,
                                &T->be);
    if (rc < 0)
        return rc;
    /* Device gradients are reduced by NCCL on its own stream; set up before the loader's threads start
     * (the transport probe sets NCCL's environment variables for a moment). One process asked to use NCCL
     * makes a world of one of its own, without MPI. */
    const int gpu = rt_backend_kind_of(T->be) == RT_BACKEND_CUDA;
    if (c->allreduce == ALLREDUCE_NCCL && !gpu)
        return rt_errf(-EINVAL, "--allreduce nccl all-reduces gradients on GPUs, but this run computes on the CPU "
                                "(%s): use --device cuda, or leave --allreduce out",
                       c->device == DEVICE_CPU ? "--device cpu" : "--device auto found no usable GPU");
    if (gpu && T->world > 1 && (rc = rt_nccl_create(T->comm, rt_backend_device(T->be), &T->nccl)) < 0)
        return rc;
    if (gpu && T->world == 1 && c->allreduce == ALLREDUCE_NCCL &&
        (rc = rt_nccl_create_local(T->comm, rt_backend_device(T->be), &T->nccl)) < 0)
        return rc;
    graph_decide(T);
    return train_amp_resolve(c->amp, T->be, &T->act);
}

static int make_model(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    struct rt_model_opts mo = {.name = c->model, .c = (int)T->c, .h = (int)T->h, .w = (int)T->w,
                               .classes = (int)T->classes, .batch = (int)c->batch, .seed = c->seed, .act = T->act,
                               .freeze = c->freeze};
    int rc;
    /* The optimizer holds state for the trainable parameters only: a frozen layer has none. */
    if ((rc = rt_model_create(T->be, &mo, &T->model)) < 0 ||
        (rc = rt_optim_create(T->model, &c->optim, &T->opt)) < 0)
        return rc;
    if (c->lr_head > 0 && !rt_model_head_count(T->model))
        return rt_errf(-EINVAL, "--lr-head: the classifier (%s) is frozen", rt_model_head_name(T->model));
    T->scaling = c->loss_scale > 0 || (c->loss_scale < 0 && T->act == RT_F16);
    rt_scaler_init(&T->scaler);
    if (c->max_skipped_steps)
        T->scaler.max_skips = c->max_skipped_steps;
    return 0;
}

const char *train_device_name(const struct train *T)
{
    return rt_backend_kind_of(T->be) == RT_BACKEND_CUDA ? "cuda" : "cpu";
}

const char *train_amp_name(enum rt_dtype act)
{
    return act == RT_F32 ? "off" : rt_dtype_name(act);
}

/* Plans the gradient buckets over the model's parameter table. */
static int make_bucketer(struct train *T)
{
    int count, np = 0;
    const struct rt_tensor_info *tab = rt_model_tensors(T->model, &count);
    struct rt_bucket_tensor *bt = rt_calloc((size_t)count, sizeof(*bt), "bucket plan");
    if (!bt)
        return -ENOMEM;
    for (int i = 0; i < count; i++) /* frozen layers have no gradient to reduce */
        if (tab[i].kind == RT_PARAM && !tab[i].frozen)
            bt[np++] = (struct rt_bucket_tensor){tab[i].name, tab[i].offset, tab[i].count};
    /* NCCL mode orders its comm stream with events of its own; the MPI path's comm thread waits on ours. */
    struct rt_bucket_opts bo = {.cap_bytes = (size_t)(T->cfg.bucket_cap_mb * 1048576.0),
                                .no_overlap = T->cfg.no_overlap, .nccl = T->nccl,
                                .stream = T->nccl ? rt_backend_native_stream(T->be) : NULL,
                                .fence_mark = T->nccl ? NULL : fence_mark, .fence_wait = T->nccl ? NULL : fence_wait,
                                .fence_ctx = T, .stream_call = fence_stream_call, .stream_ctx = T};
    int rc = rt_bucketer_create(T->comm, rt_model_grads(T->model), rt_model_trainable_count(T->model), bt, np, &bo,
                                &T->bucketer);
    free(bt);
    /* One event per bucket; none is recorded before the first step. */
    if (rc == 0 && !T->nccl)
        rc = fence_create(T, rt_bucketer_count(T->bucketer));
    return rc < 0 ? rc : 0;
}

/* The learning-rate schedule over the whole run, in updates. */
static void make_schedule(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    /* Updates: a short one ends an epoch that --grad-accum does not divide (step.c). */
    const uint64_t per_epoch = RT_MAX(input_updates_per_epoch(T), 1);
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
    /* --lr-head: PyTorch's parameter groups under one scheduler, each from its own initial learning rate. */
    T->sched_head = T->sched;
    T->sched_head.base_lr = c->lr_head > 0 ? c->lr_head : c->lr;
}

/*
 * --init: the starting weights, on every rank (all read the file, as they read a checkpoint), after --resume
 * found none: a resumed run continues from its checkpoint instead. Rank 0 lists every difference between the
 * file and the model before the error.
 */
static int load_init(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    if (!c->init || T->ckpt_micro != UINT64_MAX) /* none asked for, or a checkpoint was resumed */
        return 0;
    struct rt_st_file *f = NULL;
    struct rt_init_result r;
    memset(&r, 0, sizeof(r));
    int rc = rt_st_read(c->init, &f); /* a torch.save file is recognised there, and the converter named */
    if (rc < 0)
        return rt_errf(rc, "--init: %s", rt_errmsg());
    rc = rt_model_load_init(T->model, f, c->reset_head, &r);
    if (rc < 0 && r.ndiff) {
        int head = 0;
        for (int i = 0; i < r.ndiff; i++)
            head += r.diff[i].head;
        if (T->root) {
            fprintf(stderr, "--init %s does not fit %s for %ux%ux%u images and %u classes:\n", c->init,
                    rt_model_name(T->model), T->c, T->h, T->w, T->classes);
            rt_init_print(&r, stderr);
        }
        char msg[300];
        snprintf(msg, sizeof(msg), "%s", rt_errmsg());
        if (head && head == r.ndiff)
            rc = rt_errf(rc, "--init %s: %s, all of the classifier (%s): add --reset-head to train a new one for "
                             "%u classes",
                         c->init, msg, rt_model_head_name(T->model), T->classes);
        else
            rc = rt_errf(rc, "--init %s: %s (listed above)%s", c->init, msg,
                         head ? "; --reset-head would settle the classifier's" : "");
    } else if (rc < 0) {
        rc = rt_errf(rc, "--init %s: %s", c->init, rt_errmsg());
    } else {
        T->init_loaded = r.loaded;
        T->init_head_reset = r.head_reset;
    }
    rt_init_result_free(&r);
    rt_st_close(f);
    return rc;
}

/* --metrics: appended to on a resumed run; never opened through a link, nor as another user's file. */
static int open_metrics(struct train *T)
{
    const char *path = T->cfg.metrics;
    int fd;
    if (!path || !T->root)
        return 0;
    const int rc = rt_file_open_write(path, T->pos.update > 0, "write metrics", &fd);
    if (rc < 0)
        return rc;
    if (!(T->metrics = fdopen(fd, T->pos.update ? "a" : "w"))) {
        const int e = errno;
        close(fd);
        return rt_errf(-e, "cannot open %s: %s", path, strerror(e));
    }
    return 0;
}

/* --metrics and --report: each rank's images/s gathered at each epoch's end (the same on every rank: the
 * gather is collective), the records kept for the page, the metrics file. */
static int open_records(struct train *T)
{
    int rc;
    if ((T->cfg.metrics || T->cfg.report) &&
        !(T->rank_ips = rt_calloc((size_t)T->world, sizeof(*T->rank_ips), "each rank's images/s")))
        return -ENOMEM;
    if ((rc = report_records_open(T)) < 0)
        return rc;
    return open_metrics(T);
}

/*
 * --checkpoint-dir: rank 0 writes there and every rank trusts what it reads
 * back on --resume, so it must be a directory only this user can write, not
 * reached through a link as its last component (a link someone planted would
 * send the checkpoints wherever it points). Rank 0 creates it, 0755 (other
 * users may read checkpoints, not write them), before anything is trained; the
 * other ranks check it where they see it.
 */
static int check_ckpt_dir(struct train *T)
{
    const struct rt_dir_rules r = {T->root ? RT_DIR_CREATE : 0, 0755, "write checkpoints into",
                                   "give --checkpoint-dir a directory only you can write"};
    const char *dir = T->cfg.checkpoint_dir;
    int fd;
    if (!dir)
        return 0;
    int rc = rt_dir_open_owned(AT_FDCWD, dir, dir, &r, &fd);
    if (rc == -ENOENT && !T->root)
        return 0; /* not there (yet) for this rank: --resume says so if it matters */
    if (rc < 0)
        return rt_errf(rc, "--checkpoint-dir: %s", rt_errmsg());
    close(fd);
    return 0;
}

int train_create(const struct train_cfg *cfg, struct train **out)
{
    struct train *T = rt_calloc(1, sizeof(*T), "the training driver");
    *out = T;
    if (!T)
        return -ENOMEM;
    T->t_created = rt_now_ns();
    T->cfg = *cfg;
    T->cfg.grad_accum = RT_MAX(cfg->grad_accum, 1);
    T->asked_batch = T->cfg.batch;
    T->asked_accum = T->cfg.grad_accum;
    if (T->cfg.progress < 0)
        T->cfg.progress = isatty(STDERR_FILENO);
    if (cfg->faults)
        T->faults = *cfg->faults;
    else
        train_faults_none(&T->faults);
    T->comm = cfg->comm;
    T->val_split = -1;
    T->ckpt_micro = UINT64_MAX;
    int rc;
    if ((rc = open_comm(T)) < 0 || (rc = check_ckpt_dir(T)) < 0 ||
        (T->cfg.stage_to && (rc = copy_data_local(T)) < 0) || (rc = open_data(T)) < 0)
        return rc;
    startup_mark(T, BOOT_DATA);
    if ((rc = open_compute(T)) < 0 ||
        (T->cfg.resume && T->cfg.checkpoint_dir && (rc = checkpoint_plan(T)) < 0))
        return rc;
    startup_mark(T, BOOT_COMPUTE);
    if ((rc = make_model(T)) < 0 || (rc = replicas_create(T)) < 0 || (rc = make_bucketer(T)) < 0 ||
        (T->cfg.resume && T->cfg.checkpoint_dir && (rc = checkpoint_resume(T)) < 0) || (rc = load_init(T)) < 0)
        return rc;
    startup_mark(T, BOOT_MODEL);
    /* One model on every rank from the start: rank 0's. */
    replicas_sync_from_root(T, RT_MODEL_PARAMS, "initial parameters");
    replicas_sync_from_root(T, RT_MODEL_BUFFERS, "initial buffers");
    startup_mark(T, BOOT_SYNC);
    if ((rc = tracefile_create(T)) < 0 || (rc = profile_create(T)) < 0 || (rc = late_create(T)) < 0 ||
        (rc = input_create(T)) < 0)
        return rc;
    tracefile_gpu_create(T);
    startup_mark(T, BOOT_LOADER);
    make_schedule(T);
    return open_records(T);
}

void train_destroy(struct train *T)
{
    if (!T)
        return;
    if (T->metrics)
        fclose(T->metrics);
    free(T->rank_ips);
    json_decref(T->facts);
    json_decref(T->records);
    json_decref(T->summary);
    json_decref(T->state);
    json_decref(T->ckpt_state);
    input_destroy(T);
    late_destroy(T);
    profile_destroy(T);
    tracefile_gpu_destroy(T);
    tracefile_destroy(T);
    /* NCCL's stream work is over before the memory it reduced goes. */
    rt_bucketer_destroy(T->bucketer);
    fence_destroy(T);
    rt_nccl_destroy(T->nccl);
    rt_optim_destroy(T->opt);
    replicas_destroy(T);
    rt_model_destroy(T->model);
    rt_backend_destroy(T->be);
    rt_dataset_close(T->ds);
    if (T->own_comm)
        rt_comm_destroy(T->comm);
    free(T);
}

void train_fail(struct train *T)
{
    report_clear_bar(T);
    fprintf(stderr, "error: %s\n", rt_errmsg());
    /* The other ranks are in collectives this rank will never join. */
    if (T && T->world > 1)
        rt_comm_abort(T->comm, 1, NULL);
}

struct train_pos train_position(const struct train *T)
{
    return T->pos;
}

struct rt_model *train_model(struct train *T)
{
    return T->model;
}

struct rt_optim *train_optim(struct train *T)
{
    return T->opt;
}

const struct rt_scaler *train_scaler(const struct train *T)
{
    return T->scaling ? &T->scaler : NULL;
}

int train_sync(struct train *T)
{
    return late_flush(T);
}

const struct rt_loss_stats *train_last_loss(struct train *T)
{
    late_flush(T); /* a caller between steps: read the last update now */
    return &T->step_loss;
}

enum train_stop train_stopped(const struct train *T)
{
    return T->stop;
}

uint64_t train_checkpoints_saved(const struct train *T)
{
    return T->ckpt_saves;
}
