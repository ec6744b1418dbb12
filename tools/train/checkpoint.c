/*
 * checkpoint.c - --checkpoint-dir: model.safetensors (PyTorch state_dict
 * names), optimizer.safetensors and state.json (position, loader state,
 * seed, loss scale, the epoch's partial sums), each written atomically and
 * tied together by one checkpoint id, so that a crash between two of the
 * writes is detected on resume instead of mixing two checkpoints.
 * docs/FORMAT.md documents state.json. Rank 0 writes; every rank reads.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "common/trace.h"
#include "tools/train/driver.h"

void checkpoint_json_floats(char *buf, size_t len, const float *v, uint32_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (uint32_t i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%.9g", i ? ", " : "", (double)v[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
}

json_t *checkpoint_command(const struct train *T)
{
    if (!T->cfg.argv)
        return NULL;
    json_t *a = json_array();
    for (int i = 0; i < T->cfg.argc; i++)
        json_array_append_new(a, json_string(T->cfg.argv[i]));
    return a;
}

static int path_of(const struct train *T, const char *name, char *out, size_t len)
{
    return rt_path_join(out, len, T->cfg.checkpoint_dir, name);
}

/* model.safetensors, with what `ringtrain eval` and PyTorch users need to know in its metadata. */
static int save_model(struct train *T)
{
    char classes[16], shape[64], mean[128], std[128], p[4096];
    snprintf(classes, sizeof(classes), "%u", T->classes);
    snprintf(shape, sizeof(shape), "[%u, %u, %u]", T->c, T->h, T->w);
    checkpoint_json_floats(mean, sizeof(mean), T->mean, T->c);
    checkpoint_json_floats(std, sizeof(std), T->std, T->c);
    const char *meta[] = {"format", "pt", "model", rt_model_name(T->model), "num_classes", classes,
                          "input_shape", shape, "mean", mean, "std", std, "checkpoint_id", T->ckpt_id};
    const char *ometa[] = {"checkpoint_id", T->ckpt_id, "optimizer", rt_optim_kind_name(T->cfg.optim.kind)};
    int rc;
    if ((rc = path_of(T, "optimizer.safetensors", p, sizeof(p))) < 0 ||
        (rc = rt_optim_save(T->opt, p, ometa, 2)) < 0)
        return rc;
    if ((rc = path_of(T, "model.safetensors", p, sizeof(p))) < 0 ||
        (rc = rt_model_save(T->model, p, meta, (int)RT_ARRAY_LEN(meta) / 2)) < 0)
        return rc;
    return 0;
}

/* state.json: `ep` holds the partial epoch's global sums (loss, correct, count). */
static int save_state(struct train *T, const double ep[3])
{
    const struct train_cfg *c = &T->cfg;
    /* Saved between updates: the position in the epoch's global sequence is whole updates of G (window: none). */
    const uint64_t G = (uint64_t)c->batch * (uint64_t)T->world * c->grad_accum;
    struct rt_loader_state ls = {.epoch = T->pos.epoch, .step = T->pos.batch, .seed = c->seed,
                                 .sample = c->shuffle == RT_SHUFFLE_WINDOW ? 0 : T->pos.batch / c->grad_accum * G,
                                 .micro = (uint32_t)(T->pos.batch % c->grad_accum), .world = (uint32_t)T->world,
                                 .rank = 0, .batch = c->batch, .accum = c->grad_accum, .shuffle = c->shuffle};
    char lsbuf[512], p[4096];
    rt_loader_state_format(&ls, lsbuf, sizeof(lsbuf));
    json_t *st = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:i, s:s, s:f, s:i, s:f, s:f, s:f, "
                           "s:I, s:I, s:i}",
                           "format", 2, "checkpoint_id", T->ckpt_id, "model", rt_model_name(T->model), "epoch",
                           (json_int_t)T->pos.epoch, "step", (json_int_t)T->pos.batch, "micro",
                           (json_int_t)T->pos.micro, "optimizer_steps", (json_int_t)T->pos.update, "loader", lsbuf,
                           "seed", (json_int_t)c->seed, "batch_size", (int)T->asked_batch, "grad_accum",
                           (int)T->asked_accum, "optimizer", rt_optim_kind_name(c->optim.kind), "best_val_acc",
                           T->res.best_acc, "target_streak", (int)T->res.streak, "epoch_loss_sum", ep[0],
                           "epoch_correct", ep[1], "epoch_count", ep[2], "images", (json_int_t)T->meter.run.images,
                           "train_ns", (json_int_t)T->meter.run.train_ns, "world_size", T->world);
    /* How this world size ran --batch-size and --grad-accum (the same but after a move to another world size). */
    if (st) {
        json_object_set_new(st, "run_batch", json_integer(c->batch));
        json_object_set_new(st, "run_accum", json_integer(c->grad_accum));
    }
    /* Fine-tuning: the frozen layers shape the optimizer's state, so a resume must freeze the same. */
    if (st && c->freeze)
        json_object_set_new(st, "freeze", json_string(c->freeze));
    if (st && c->init) {
        json_object_set_new(st, "init", json_string(c->init));
        json_object_set_new(st, "reset_head", json_boolean(c->reset_head));
    }
    if (st && c->lr_head > 0)
        json_object_set_new(st, "lr_head", json_real(c->lr_head));
    /* How the GPU ran convolutions: a resume with other settings continues, but not bit for bit (checkpoint_load
     * says so). */
    if (st) {
        json_object_set_new(st, "tf32", json_boolean(c->tf32));
        json_object_set_new(st, "deterministic", json_boolean(!c->nondeterministic));
        /* Where and at which precision it trained: a resume elsewhere is said, at another precision refused
         * without --amp-change (checkpoint_plan). */
        json_object_set_new(st, "device", json_string(train_device_name(T)));
        json_object_set_new(st, "amp", json_string(train_amp_name(T->act)));
    }
    if (st && T->scaling) {
        json_object_set_new(st, "loss_scale", json_real(T->scaler.scale));
        json_object_set_new(st, "loss_scale_good_steps", json_integer(T->scaler.good));
        json_object_set_new(st, "skipped_steps", json_integer((json_int_t)T->scaler.skipped));
    }
    /* What ran, for people and `ringtrain report`; a resume reads none of it. */
    json_t *cmd = st ? checkpoint_command(T) : NULL;
    if (cmd)
        json_object_set_new(st, "command", cmd);
    if (st && T->facts)
        json_object_set(st, "facts", T->facts);
    char *text = st ? json_dumps(st, JSON_INDENT(2)) : NULL;
    if (text && T->cfg.report) {
        json_decref(T->state);
        T->state = json_incref(st);
    }
    json_decref(st);
    if (!text)
        return rt_errf(-ENOMEM, "cannot format the checkpoint state");
    int rc = path_of(T, "state.json", p, sizeof(p));
    if (rc == 0)
        rc = rt_file_write_atomic(p, text, strlen(text));
    free(text);
    return rc < 0 ? rc : 0;
}

/* The checkpoint's three files, written by rank 0 (every rank takes part in the epoch sums). */
static int save(struct train *T)
{
    /* The partial epoch's sums, over all ranks: rank 0 alone restores them. */
    const struct rt_loss_stats *e = &T->meter.ep_loss;
    double ep[3] = {e->loss_sum, e->correct, e->count};
    if (T->pos.batch) /* at an epoch boundary they are zero on every rank */
        rt_comm_allreduce(T->comm, ep, 3, RT_COMM_F64, RT_RED_SUM, "the checkpoint's epoch sums");
    if (!T->root)
        return 0;
    rt_comm_set_phase(T->comm, T->pos.update, RT_PHASE_CHECKPOINT);
    /* The directory was made and checked at start-up (driver.c, check_ckpt_dir): not again by path here. */
    snprintf(T->ckpt_id, sizeof(T->ckpt_id), "%" PRIu64 "-%016" PRIx64, T->pos.update,
             rt_now_ns() ^ ((uint64_t)getpid() << 40));
    const int rc = save_model(T);
    return rc < 0 ? rc : save_state(T, ep);
}

int checkpoint_save(struct train *T)
{
    /* Once per position: a stop on an epoch's last update finds the epoch's checkpoint already written, a stop
     * before the first update of a resumed run the checkpoint it resumed from. */
    if (!T->cfg.checkpoint_dir || T->ckpt_micro == T->pos.micro)
        return 0;
    const uint64_t t0 = rt_trace_begin();
    const int rc = save(T);
    rt_trace_end(t0, RT_TRACE_CKPT, "checkpoint", NULL);
    if (rc == 0) {
        T->ckpt_micro = T->pos.micro;
        T->ckpt_saves++;
    }
    return rc;
}

/* Opens the safetensors file `name` of the checkpoint into *out if it carries the checkpoint's id. 0 or -errno. */
static int open_part(struct train *T, const char *name, char *p, size_t len, struct rt_st_file **out)
{
    struct rt_st_file *f = NULL;
    int rc;
    *out = NULL;
    if ((rc = path_of(T, name, p, len)) < 0 || (rc = rt_st_read(p, &f)) < 0)
        return rc;
    const char *fid = rt_st_meta(f, "checkpoint_id");
    if (!fid || strcmp(fid, T->ckpt_id) != 0) {
        rc = rt_errf(-EINVAL, "%s belongs to checkpoint %s, state.json to %s: the checkpoint was interrupted while "
                              "being written; remove the directory or restore a complete copy",
                     p, fid ? fid : "(none)", T->ckpt_id);
        rt_st_close(f);
        return rc;
    }
    *out = f;
    return 0;
}

static int load_weights(struct train *T)
{
    char p[4096];
    struct rt_st_file *f;
    int rc = open_part(T, "model.safetensors", p, sizeof(p), &f);
    if (rc == 0)
        rc = rt_model_load(T->model, f, p);
    rt_st_close(f);
    if (rc < 0)
        return rc;
    if ((rc = open_part(T, "optimizer.safetensors", p, sizeof(p), &f)) == 0)
        rc = rt_optim_load(T->opt, f, p);
    rt_st_close(f);
    return rc < 0 ? rc : 0;
}

/* What state.json holds, as read. */
struct saved_state {
    const char *id, *model, *loader, *optname;
    json_int_t epoch, batch, micro, update, seed, images, train_ns;
    int batch_size, accum, streak, world, format;
    int run_batch, run_accum;   /* how its world size ran them (batch_size, accum where not recorded) */
    double best, ep_loss, ep_correct, ep_count;
    struct rt_loader_state ls;
};

static int read_state(json_t *st, const char *p, struct saved_state *s)
{
    json_error_t je;
    if (json_unpack_ex(st, &je, 0,
                       "{s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I, s:i, s:i, s:s, s:F, s:i, s:F, s:F, s:F, s:I, s:I}",
                       "checkpoint_id", &s->id, "model", &s->model, "epoch", &s->epoch, "step", &s->batch, "micro",
                       &s->micro, "optimizer_steps", &s->update, "loader", &s->loader, "seed", &s->seed,
                       "batch_size", &s->batch_size, "grad_accum", &s->accum, "optimizer", &s->optname,
                       "best_val_acc", &s->best, "target_streak", &s->streak, "epoch_loss_sum", &s->ep_loss,
                       "epoch_correct", &s->ep_correct, "epoch_count", &s->ep_count, "images", &s->images,
                       "train_ns", &s->train_ns) != 0)
        return rt_errf(-EINVAL, "%s: %s", p, je.text);
    json_t *jw = json_object_get(st, "world_size"), *jf = json_object_get(st, "format");
    s->world = jw && json_is_integer(jw) ? (int)json_integer_value(jw) : 1;
    s->format = jf && json_is_integer(jf) ? (int)json_integer_value(jf) : 1;
    json_t *jb = json_object_get(st, "run_batch"), *ja = json_object_get(st, "run_accum");
    s->run_batch = json_is_integer(jb) ? (int)json_integer_value(jb) : s->batch_size;
    s->run_accum = json_is_integer(ja) ? (int)json_integer_value(ja) : s->accum;
    if (s->world < 1 || s->batch_size < 1 || s->accum < 1 || s->batch < 0 || s->micro < 0 || s->update < 0 ||
        s->run_batch < 1 || s->run_accum < 1)
        return rt_errf(-EINVAL, "%s: out-of-range values", p);
    /* Format 1 wrote the loader state of the order before the global one: its one-rank runs read as today's. */
    if (s->format == 1 && s->world == 1) {
        memset(&s->ls, 0, sizeof(s->ls));
        return 0;
    }
    return rt_loader_state_parse(s->loader, &s->ls) < 0 ? rt_errf(-EINVAL, "%s: bad loader state: %s", p,
                                                                   rt_errmsg())
                                                        : 0;
}

/*
 * How W ranks share out updates of G samples given micro-batches of `batch`: where W divides G / batch, in those
 * micro-batches, the accumulation re-derived; else, with more ranks than that and W dividing G, in one smaller
 * micro-batch per rank. 0 with *b and *A set, or -1 where neither holds.
 */
static int layout_for(uint64_t G, uint32_t batch, uint64_t W, uint32_t *b, uint32_t *A)
{
    const uint64_t micro = G / batch;
    if (G % batch == 0 && micro % W == 0) {
        *b = batch;
        *A = (uint32_t)(micro / W);
    } else if (W > micro && G % W == 0) {
        *b = (uint32_t)(G / W);
        *A = 1;
    } else {
        return -1;
    }
    return 0;
}

/* The world sizes layout_for() accepts for G and `batch`, into buf (the first 24). */
static void world_choices(uint64_t G, uint32_t batch, char *buf, size_t len)
{
    size_t o = 0;
    int listed = 0;
    uint32_t b, A;
    buf[0] = '\0';
    for (uint64_t w = 1; w <= G && o < len; w++) {
        if (layout_for(G, batch, w, &b, &A) < 0)
            continue;
        if (listed == 24) {
            snprintf(buf + o, len - o, ", ...");
            break;
        }
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, listed++ ? ", " : "", w);
    }
}

/*
 * The run's layout on this world size: updates of the checkpoint's G samples (G = batch x ranks x accumulation as
 * it ran) shared out as layout_for() says, from --batch-size. On the checkpoint's own world size this gives the
 * checkpoint's layout back; a move sets T->moved for the banner. Refuses, naming the sizes that can, where the
 * world size cannot share G out.
 */
static int move_world(struct train *T, const struct saved_state *s)
{
    struct train_cfg *c = &T->cfg;
    const uint64_t G = (uint64_t)s->run_batch * (uint64_t)s->world * (uint64_t)s->run_accum;
    if (s->world == T->world && (uint32_t)s->run_batch == c->batch && (uint32_t)s->run_accum == c->grad_accum)
        return 0;
    if (c->shuffle == RT_SHUFFLE_WINDOW)
        return rt_errf(-EINVAL, "%s: the checkpoint was written by a run of %d ranks with --shuffle window, whose "
                                "order depends on the world size (each rank reads its own blocks of the data); "
                                "resume it on %d ranks, or train with --shuffle exact, whose order is the same on "
                                "any number of ranks",
                       c->checkpoint_dir, s->world, s->world);
    if (layout_for(G, c->batch, (uint64_t)T->world, &c->batch, &c->grad_accum) < 0) {
        char can[256];
        world_choices(G, c->batch, can, sizeof(can));
        return rt_errf(-EINVAL, "%s: the checkpoint's updates take %" PRIu64 " samples (%d ranks x --grad-accum %d "
                                "x --batch-size %d), which %d ranks cannot share out in whole micro-batches; it "
                                "resumes on %s ranks",
                       c->checkpoint_dir, G, s->world, s->run_accum, s->run_batch, T->world, can);
    }
    if (s->world != T->world)
        T->moved = (struct train_moved){.world = s->world, .batch = (uint32_t)s->run_batch,
                                        .accum = (uint32_t)s->run_accum};
    return 0;
}

/* --amp against the checkpoint's precision: another one only with --amp-change; another device is said. */
static int check_precision(const struct train *T, json_t *st)
{
    const json_t *ja = json_object_get(st, "amp"), *jd = json_object_get(st, "device");
    const char *now = train_amp_name(T->act), *dev = train_device_name(T);
    if (json_is_string(ja) && strcmp(json_string_value(ja), now) != 0 && !T->cfg.amp_change)
        return rt_errf(-EINVAL, "%s: the checkpoint was trained with --amp %s, this run would train with --amp %s "
                                "(the precision changes what every step computes%s); resume with --amp %s, or pass "
                                "--amp-change to go on at %s",
                       T->cfg.checkpoint_dir, json_string_value(ja), now,
                       !strcmp(json_string_value(ja), "fp16") || !strcmp(now, "fp16")
                           ? ", and fp16's loss scale starts afresh or is dropped"
                           : "",
                       json_string_value(ja), now);
    if (T->root && json_is_string(jd) && strcmp(json_string_value(jd), dev) != 0)
        rt_info("note: the checkpoint was written on the %s, this run is on the %s: it goes on from the same weights "
                "and optimizer state, not bit-identical to a run that stayed (other kernels round differently)",
                !strcmp(json_string_value(jd), "cuda") ? "GPU" : "CPU", !strcmp(dev, "cuda") ? "GPU" : "CPU");
    return 0;
}

/*
 * A checkpoint resumes the run that wrote it: the same model, batch, accumulation, seed, optimizer, shuffle --
 * on the same world size bit for bit, on another one with the same updates (move_world).
 */
static int check_same_run(struct train *T, const struct saved_state *s, json_t *st)
{
    const struct train_cfg *c = &T->cfg;
    if (s->format == 1 && s->world > 1 && c->shuffle != RT_SHUFFLE_WINDOW)
        return rt_errf(-EINVAL, "%s: the checkpoint was written with the data order of before (each of its %d ranks "
                                "read its own part of every epoch); today one global order serves any world size, "
                                "and the checkpoint's position has no place in it. Start a new run from its weights: "
                                "--init %s/model.safetensors",
                       c->checkpoint_dir, s->world, c->checkpoint_dir);
    /* The model is made after this: its name is the one --model gives (rt_model_name). */
    if (strcmp(s->model, c->model ? c->model : "") != 0)
        return rt_errf(-EINVAL, "%s: the checkpoint is of %s, not %s", c->checkpoint_dir, s->model, c->model);
    if ((uint32_t)s->batch_size != c->batch || (uint32_t)s->accum != c->grad_accum || (uint64_t)s->seed != c->seed ||
        strcmp(s->optname, rt_optim_kind_name(c->optim.kind)) != 0)
        return rt_errf(-EINVAL, "%s: the checkpoint was trained with --batch-size %d --grad-accum %d --seed %" PRId64
                                " --optimizer %s on %d rank%s; resume with the same (on another number of ranks "
                                "the accumulation, or the batch, follows from them)",
                       c->checkpoint_dir, s->batch_size, s->accum, (int64_t)s->seed, s->optname, s->world,
                       s->world == 1 ? "" : "s");
    json_t *jf = json_object_get(st, "freeze");
    const char *was = jf && json_is_string(jf) ? json_string_value(jf) : "";
    if (strcmp(was, c->freeze ? c->freeze : "") != 0)
        return rt_errf(-EINVAL, "%s: the checkpoint was trained with %s%s%s; resume with the same (the frozen layers "
                                "have no optimizer state)",
                       c->checkpoint_dir, *was ? "--freeze '" : "no --freeze", was, *was ? "'" : "");
    if (s->batch % s->run_accum != 0)
        return rt_errf(-EINVAL, "%s: the checkpoint was written after micro-batch %" PRId64 " of epoch %" PRId64
                                ", inside an update of --grad-accum %d (versions before updates ended with their "
                                "epoch carried them across); it cannot be resumed exactly: start the run again",
                       c->checkpoint_dir, (int64_t)s->batch, (int64_t)s->epoch + 1, s->run_accum);
    if (s->format > 1 && s->ls.shuffle != c->shuffle)
        return rt_errf(-EINVAL, "%s: the checkpoint was trained with --shuffle %s; resume with the same (another "
                                "shuffle is another order)",
                       c->checkpoint_dir, rt_shuffle_name(s->ls.shuffle));
    int rc = check_precision(T, st);
    return rc < 0 ? rc : move_world(T, s);
}

/*
 * --tf32 and --deterministic against the checkpoint's (rank 0 says it; neither stops the run): other settings
 * give other rounding on a GPU from here on, so the resumed run is not bit-identical to one that ran through;
 * --deterministic off is not bit-identical to anything. A checkpoint from before the settings were recorded
 * says nothing.
 */
static void settings_note(const struct train *T, json_t *st)
{
    const json_t *jt = json_object_get(st, "tf32"), *jd = json_object_get(st, "deterministic");
    const int gpu = rt_backend_kind_of(T->be) == RT_BACKEND_CUDA;
    if (!T->root)
        return;
    if (json_is_boolean(jt) && json_is_boolean(jd) &&
        (json_is_true(jt) != (T->cfg.tf32 != 0) || json_is_true(jd) != !T->cfg.nondeterministic))
        rt_info("note: the checkpoint was written with --tf32 %s --deterministic %s, this run has --tf32 %s "
                "--deterministic %s: %s",
                json_is_true(jt) ? "on" : "off", json_is_true(jd) ? "on" : "off", T->cfg.tf32 ? "on" : "off",
                T->cfg.nondeterministic ? "off" : "on",
                gpu ? "the resumed run is not bit-identical to an uninterrupted one (the convolutions round "
                      "differently from here on)"
                    : "no effect on the CPU, the resumed run stays exact");
    else if (gpu && T->cfg.nondeterministic)
        rt_info("note: --deterministic off: the resumed run is not bit-identical to an uninterrupted one");
}

/* Puts the driver where the checkpoint left off. */
static void restore(struct train *T, const struct saved_state *s, json_t *st)
{
    /* Between two updates: the same update of the epoch, in this run's micro-batches (another world's
     * accumulation). */
    const uint64_t A = T->cfg.grad_accum, As = (uint64_t)s->run_accum;
    T->pos = (struct train_pos){.epoch = (uint64_t)s->epoch, .batch = (uint64_t)s->batch / As * A,
                                .micro = A == As ? (uint64_t)s->micro : (uint64_t)s->update * A,
                                .update = (uint64_t)s->update};
    T->res.best_acc = s->best;
    json_t *scale = json_object_get(st, "loss_scale");
    if (T->scaling && scale && json_is_number(scale)) {
        T->scaler.scale = (float)json_number_value(scale);
        T->scaler.good = (uint32_t)json_integer_value(json_object_get(st, "loss_scale_good_steps"));
        T->scaler.skipped = (uint64_t)json_integer_value(json_object_get(st, "skipped_steps"));
    }
    T->res.streak = (uint32_t)s->streak;
    /* Global sums: held by rank 0 alone, so that the epoch's all-reduce counts them once. */
    if (T->root)
        T->meter.ep_loss = (struct rt_loss_stats){(float)s->ep_loss, (float)s->ep_correct, (float)s->ep_count};
    /* This rank's share of the samples so far: the same whole updates over this world size (which divides G). */
    T->meter.run.images = (uint64_t)s->images * (uint64_t)s->world / (uint64_t)T->world;
    T->meter.run.train_ns = (uint64_t)s->train_ns;
    T->meter.before = T->meter.run;
    T->meter.update_before = T->pos.update;
    T->ckpt_micro = T->pos.micro; /* this position's checkpoint is the one just read */
}

/* state.json, read and checked before the model is made: another world size sets the run's batch and
 * accumulation (move_world), which the model and the loader are then made with. */
int checkpoint_plan(struct train *T)
{
    char p[4096];
    int rc = path_of(T, "state.json", p, sizeof(p));
    if (rc < 0 || access(p, F_OK) != 0)
        return rc < 0 ? rc : 0;
    json_error_t je;
    json_t *st = json_load_file(p, 0, &je);
    if (!st)
        return rt_errf(-EINVAL, "%s: %s (line %d)", p, je.text, je.line);
    struct saved_state s;
    if ((rc = read_state(st, p, &s)) == 0)
        rc = check_same_run(T, &s, st);
    if (rc < 0) {
        json_decref(st);
        return rc;
    }
    T->ckpt_state = st;
    return 0;
}

int checkpoint_load(struct train *T)
{
    char p[4096];
    json_t *st = T->ckpt_state;
    int rc = path_of(T, "state.json", p, sizeof(p));
    if (rc < 0 || !st)
        return rc < 0 ? rc : 0;
    T->ckpt_state = NULL;
    struct saved_state s;
    rc = read_state(st, p, &s);
    if (rc == 0) {
        snprintf(T->ckpt_id, sizeof(T->ckpt_id), "%s", s.id);
        restore(T, &s, st);
        settings_note(T, st);
    }
    json_decref(st);
    if (rc < 0 || (rc = load_weights(T)) < 0)
        return rc;
    return 1;
}

int checkpoint_mark_finished(struct train *T, int finished)
{
    char p[4096];
    if (!T->root || !T->cfg.checkpoint_dir)
        return 0;
    const int rc = path_of(T, "finished", p, sizeof(p));
    if (rc < 0)
        return rc;
    if (!finished) {
        if (unlink(p) < 0 && errno != ENOENT)
            return rt_errf(-errno, "%s: cannot remove: %s", p, strerror(errno));
        return 0;
    }
    char text[160];
    int n = snprintf(text, sizeof(text), "epoch %" PRIu64 " of %" PRIu64 ", optimizer step %" PRIu64 "\n",
                     T->pos.epoch, T->cfg.epochs, T->pos.update);
    return rt_file_write_atomic(p, text, (size_t)n);
}

int checkpoint_resume(struct train *T)
{
    const char *dir = T->cfg.checkpoint_dir;
    const int r = checkpoint_load(T);
    if (r < 0)
        return r;
    /* Every rank reads the checkpoint rank 0 wrote: the directory must be one they all see. */
    int64_t seen[2] = {r, -r};
    rt_comm_allreduce(T->comm, seen, 2, RT_COMM_I64, RT_RED_MAX, "the resume check");
    if (seen[0] != -seen[1])
        return rt_errf(-EINVAL, "--resume: some ranks find a checkpoint in %s and others do not; put "
                                "--checkpoint-dir on a filesystem every rank sees",
                       dir);
    if (T->root && r == 0)
        rt_info("--resume: no checkpoint in %s yet, starting from scratch", dir);
    else if (T->root)
        rt_info("resuming from %s at epoch %" PRIu64 " step %" PRIu64 " (optimizer step %" PRIu64 ")", dir,
                T->pos.epoch + 1, T->pos.batch, T->pos.update);
    return 0;
}
