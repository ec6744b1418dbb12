/*
 * report.c - what the driver prints and writes for people: rank 0's banner
 * (its lines kept as the run's "facts"), the progress bar (stderr, when it is
 * a terminal), the epoch line and its JSON Lines record, the stop message,
 * the summary, and --report's HTML page (tools/report/) from the records and
 * the summary kept in memory. Figures come in already global; nothing here
 * calls a collective except the rank table.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include <jansson.h>

#include "common/common.h"
#include "tools/report/report.h"
#include "tools/train/driver.h"

static const char *precision(enum rt_dtype act)
{
    return act == RT_F32 ? "fp32" : act == RT_BF16 ? "mixed precision bf16 (fp32 weights)"
                                                   : "mixed precision fp16 (fp32 weights)";
}


/* A banner line kept as [key, text] in T->facts, the run's facts for the summary, state.json and --report. */
static void fact_keep(struct train *T, const char *key, const char *text)
{
    if (T->facts)
        json_array_append_new(T->facts, json_pack("[s, s]", key, text));
}

/* One banner line under the header: "  KEY       TEXT", kept as a fact. */
static void banner_line(struct train *T, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void banner_line(struct train *T, const char *key, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    printf("  %-9s %s\n", key, text);
    fact_keep(T, key, text);
}

static void banner_data(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    char mean[128], std[128];
    if (c->synthetic)
        banner_line(T, "data", "synthetic batches (%ux%ux%u, %u classes), compute only", T->c, T->h, T->w,
                    T->classes);
    else
        banner_line(T, "data", "%s (%" PRIu64 " train, %s: %" PRIu64 ", %ux%ux%u, %u classes)",
                    T->data_path[0] ? T->data_path : c->data, T->info->split[RT_SPLIT_TRAIN].records,
                    T->val_split >= 0 ? rt_split_name(T->val_split) : "no val",
                    T->val_split >= 0 ? T->info->split[T->val_split].records : 0, T->c, T->h, T->w, T->classes);
    if (!c->synthetic)
        banner_line(T, "augment", "%s", T->in.augment);
    checkpoint_json_floats(mean, sizeof(mean), T->mean, T->c);
    checkpoint_json_floats(std, sizeof(std), T->std, T->c);
    banner_line(T, "normalise", "mean %s std %s%s", mean, std,
                T->norm_from_data ? "" : " (defaults: no statistics in the manifest)");
    const uint64_t short_micro = T->in.batches_per_epoch % c->grad_accum;
    char tail[96] = "";
    if (short_micro)
        snprintf(tail, sizeof(tail), " (its last of %" PRIu64 " micro-batch%s)", short_micro,
                 short_micro == 1 ? "" : "es");
    /* Training batches are whole (the loader's DROP): what the epoch's micro-batches do not take is left out. */
    char left[128] = "";
    if (!c->synthetic) {
        const uint64_t n = T->info->split[RT_SPLIT_TRAIN].records;
        const uint64_t used = T->in.batches_per_epoch * c->batch * (uint64_t)T->world;
        if (n > used)
            snprintf(left, sizeof(left), "; %" PRIu64 " of the %" PRIu64 " records left out each epoch (drop_last)",
                     n - used, n);
    }
    banner_line(T, "batch",
                "%u per rank x %d ranks x %u accumulation = %u effective, %" PRIu64 " steps/epoch%s, %" PRIu64
                " epochs%s",
                c->batch, T->world, c->grad_accum, c->batch * (uint32_t)T->world * c->grad_accum,
                input_updates_per_epoch(T), tail, c->epochs, left);
    /* A checkpoint of another world size (checkpoint.c, move_world): what changed, what was kept. */
    const struct train_moved *m = &T->moved;
    const uint64_t G = (uint64_t)c->batch * (uint64_t)T->world * c->grad_accum;
    if (m->world && m->batch == c->batch)
        banner_line(T, "resumed", "a %d-rank run on %d rank%s: accumulation %u -> %u; micro-batch %u and global "
                    "batch %" PRIu64 " kept (the same micro-batches in every update, summed in another order)",
                    m->world, T->world, T->world == 1 ? "" : "s", m->accum, c->grad_accum, c->batch, G);
    else if (m->world)
        banner_line(T, "resumed", "a %d-rank run on %d ranks: micro-batch %u -> %u, accumulation %u -> %u; global "
                    "batch %" PRIu64 " kept (the same samples in every update, cut into other micro-batches: "
                    "batchnorm and dropout see other batches)",
                    m->world, T->world, m->batch, c->batch, m->accum, c->grad_accum, G);
    else if (c->batch != T->asked_batch || c->grad_accum != T->asked_accum)
        banner_line(T, "resumed", "on %d rank%s as the checkpoint ran: --batch-size %u --grad-accum %u as micro-batch "
                    "%u x accumulation %u (global batch %" PRIu64 ")",
                    T->world, T->world == 1 ? "" : "s", T->asked_batch, T->asked_accum, c->batch, c->grad_accum, G);
}

static void banner_comm(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    const struct rt_rank_info *ri = rt_comm_info(T->comm);
    int nb = rt_bucketer_count(T->bucketer);
    size_t off, cnt;
    rt_bucketer_bucket(T->bucketer, 0, &off, &cnt, NULL, 0);
    double first = (double)cnt * 4e-6, big = 0;
    for (int i = 1; i < nb; i++) {
        rt_bucketer_bucket(T->bucketer, i, &off, &cnt, NULL, 0);
        big = RT_MAX(big, (double)cnt * 4e-6);
    }
    uint64_t trainable, frozen;
    rt_model_param_split(T->model, &trainable, &frozen);
    char left[96] = "";
    if (frozen)
        snprintf(left, sizeof(left), "; %.2f MB of frozen layers left out", (double)frozen * 4e-6);
    banner_line(T, "comm",
                "%s (ranks from %s: %s), all-reduce of %.2f MB per step in %d bucket%s (first %.2f MB, largest "
                "%.2f MB, cap %g MB)%s%s",
                rt_comm_backend(T->comm), rt_rank_source_name(ri->source), ri->vars, (double)trainable * 4e-6, nb,
                nb == 1 ? "" : "s", first, nb > 1 ? big : first, c->bucket_cap_mb,
                c->no_overlap ? ", after backward (--no-overlap)" : ", overlapped with backward", left);
    if (T->nccl)
        banner_line(T, "gradients", "%s", rt_nccl_describe(T->nccl));
}

static void banner_optim(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    char t[512] = "";
    rt_appendf(t, sizeof(t), "%s lr %g", rt_optim_kind_name(c->optim.kind), (double)c->lr);
    if (c->lr_head > 0)
        rt_appendf(t, sizeof(t), " (%s %g)", rt_model_head_name(T->model), (double)c->lr_head);
    if (c->optim.kind == RT_OPT_SGD)
        rt_appendf(t, sizeof(t), " momentum %g%s", (double)c->optim.momentum, c->optim.nesterov ? " nesterov" : "");
    rt_appendf(t, sizeof(t), " weight decay %g, schedule %s (warm-up %" PRIu64 " steps of %" PRIu64 ")",
             (double)c->optim.weight_decay, rt_sched_kind_name(c->sched), T->sched.warmup_steps,
             T->sched.total_steps);
    if (c->label_smoothing > 0)
        rt_appendf(t, sizeof(t), ", label smoothing %g", (double)c->label_smoothing);
    if (c->clip_grad_norm > 0)
        rt_appendf(t, sizeof(t), ", clip %g", (double)c->clip_grad_norm);
    banner_line(T, "optimizer", "%s", t);
}

/* "fast", "reference" (the CUDA twins) or "cpu" */
static const char *kernels_name(const struct rt_backend *be)
{
    if (rt_backend_kind_of(be) != RT_BACKEND_CUDA)
        return "cpu";
    /* RINGTRAIN_CUDA_KERNELS=reference makes the simple twins the backend's own tables. */
    return rt_backend_ops(be) == rt_backend_ops_reference(be, RT_F32) ? "reference" : "fast";
}

/* The settings the GPU's numbers depend on (--tf32, --deterministic, RINGTRAIN_CUDA_KERNELS), for the summary and
 * its op profile: {"tf32": b, "deterministic": b, "kernels": kernels_name}. A new reference, NULL on no memory. */
static json_t *settings_json(const struct train *T)
{
    return json_pack("{s:b, s:b, s:s}", "tf32", T->cfg.tf32 != 0, "deterministic", !T->cfg.nondeterministic,
                     "kernels", kernels_name(T->be));
}

/* --tf32 and --deterministic: what they do here (nothing on the CPU, whose convolutions are strict fp32 and
 * deterministic), and --profile-ops. */
static void banner_numerics(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    const char *tf32 = c->tf32 ? "on" : "off", *det = c->nondeterministic ? "off" : "on";
    if (rt_backend_kind_of(T->be) != RT_BACKEND_CUDA) {
        banner_line(T, "fp32 conv", "n/a on the CPU (--tf32 %s has no effect: oneDNN's fp32 is strict)", tf32);
        banner_line(T, "cudnn", "n/a on the CPU (--deterministic %s has no effect: the CPU's results repeat)", det);
    } else {
        const char *act = T->act == RT_F32 ? "" : " (this run's convolutions are 16-bit: it applies where one falls "
                                                  "back to fp32)";
        if (c->tf32)
            banner_line(T, "fp32 conv", "TF32 (--tf32 on, as PyTorch's default: inputs rounded to a 10-bit mantissa, "
                                        "fp32 sums; linear layers strict fp32)%s", act);
        else
            banner_line(T, "fp32 conv", "strict fp32 (--tf32 off)%s", act);
        if (c->nondeterministic)
            banner_line(T, "cudnn", "any algorithm (--deterministic off: some sum with atomics, so runs differ in the "
                                    "last bits and a resume is not exact); %s kernels", kernels_name(T->be));
        else
            banner_line(T, "cudnn", "deterministic algorithms (--deterministic on: a run and its resume repeat bit "
                                    "for bit); %s kernels", kernels_name(T->be));
    }
    if (T->graph_on)
        banner_line(T, "graph", "each micro-batch's forward, loss and backward replayed as one %s after %d eager "
                                "updates (--cuda-graph)%s",
                    rt_backend_kind_of(T->be) == RT_BACKEND_CUDA ? "CUDA graph"
                                                                 : "recorded graph of the CPU stream's calls",
                    WARMUP_UPDATES,
                    T->world > 1 ? "; the gradients' all-reduce starts after backward, not overlapped" : "");
    else if (c->cuda_graph != 0 && (rt_backend_kind_of(T->be) == RT_BACKEND_CUDA || c->cuda_graph > 0))
        banner_line(T, "graph", "%s", T->graph_why);
    if (c->profile_ops)
        banner_line(T, "profile", "per op (--profile-ops): a mark before and after every op on the compute stream%s; "
                                  "the steps run slower than without",
                    rt_backend_kind_of(T->be) == RT_BACKEND_CUDA ? " (two CUDA events per op)" : "");
}

/* --init and --freeze: where the weights come from, and what trains. */
static void banner_finetune(struct train *T)
{
    const struct train_cfg *c = &T->cfg;
    if (c->init && T->init_loaded) {
        char head[160] = "";
        if (T->init_head_reset)
            snprintf(head, sizeof(head), "; %s starts afresh for %u classes (PyTorch's initialisation, --seed %" PRIu64
                                         ")",
                     rt_model_head_name(T->model), T->classes, c->seed);
        banner_line(T, "init", "%s: %d tensors loaded%s", c->init, T->init_loaded, head);
    } else if (c->init) {
        banner_line(T, "init", "%s not read: the run resumes from its checkpoint", c->init);
    }
    if (!c->freeze)
        return;
    int count, layers = 0;
    const struct rt_tensor_info *tab = rt_model_tensors(T->model, &count);
    for (int i = 0; i < count; i++) {
        const size_t n = strlen(tab[i].name);
        layers += tab[i].kind == RT_PARAM && tab[i].frozen && n > 7 && !strcmp(tab[i].name + n - 7, ".weight");
    }
    uint64_t trainable, frozen;
    rt_model_param_split(T->model, &trainable, &frozen);
    banner_line(T, "freeze",
                "%s: %d layers frozen (%.2f M parameters, no gradient or optimizer state; batchnorm in eval mode); "
                "%.2f M of %.2f M parameters train",
                c->freeze, layers, (double)frozen / 1e6, (double)trainable / 1e6, (double)(trainable + frozen) / 1e6);
}

void report_banner(struct train *T)
{
    if (T->root) {
        json_decref(T->facts);
        T->facts = json_array();
        size_t params = 0;
        int count;
        const struct rt_tensor_info *tab = rt_model_tensors(T->model, &count);
        for (int i = 0; i < count; i++)
            if (tab[i].kind == RT_PARAM)
                params += tab[i].count;
        const struct rt_rank_info *ri = rt_comm_info(T->comm);
        char world[512];
        snprintf(world, sizeof(world), "%d (%d node%s, %d rank%s per node), %s", T->world, ri->nodes,
                 ri->nodes == 1 ? "" : "s", ri->local_world, ri->local_world == 1 ? "" : "s",
                 rt_backend_describe(T->be));
        printf("ringtrain train: world %s\n", world);
        fact_keep(T, "world", world);
        banner_line(T, "model", "%s, %.2f M parameters, %s", rt_model_name(T->model), (double)params / 1e6,
                    precision(T->act));
        banner_numerics(T);
        banner_finetune(T);
        if (T->scaling)
            banner_line(T, "scaling",
                        "dynamic loss scale from %g (x%g every %u good steps, x%g on overflow; stop after %u "
                        "overflows in a row)",
                        (double)T->scaler.scale, (double)T->scaler.growth, T->scaler.growth_interval,
                        (double)T->scaler.backoff, T->scaler.max_skips);
        banner_data(T);
        if (T->world > 1 || T->nccl) /* one rank with --allreduce nccl still reduces through NCCL */
            banner_comm(T);
        banner_optim(T);
        fflush(stdout);
    }
    /* Above 16 ranks a summary by node: the table of every rank is `ringtrain ranks`. */
    rt_comm_print_rank_summary(T->comm, stdout, T->cfg.threads, train_device_name(T), 16);
    if (T->root)
        fflush(stdout);
}

void report_progress(struct train *T)
{
    struct train_meter *m = &T->meter;
    if (!T->root || !T->cfg.progress)
        return;
    const uint64_t now = rt_now_ns();
    if (now - m->last_bar <= 200000000ull)
        return;
    m->last_bar = now;
    const int width = 24;
    uint64_t done = T->pos.batch, total = T->in.batches_per_epoch;
    int fill = total ? (int)((double)done / (double)total * width) : 0;
    char bar[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    double el = (double)(now - m->epoch_t0) * 1e-9;
    double ips = el > 0 ? (double)m->epoch.images / el : 0;
    double eta = done ? el / (double)done * (double)(total - done) : 0;
    double loss = m->ep_loss.count ? m->ep_loss.loss_sum / m->ep_loss.count : 0;
    fprintf(stderr, "\r\033[Kepoch %" PRIu64 "/%" PRIu64 " [%s] %" PRIu64 "/%" PRIu64 " %.0f img/s loss %.4f eta %ds",
            T->pos.epoch + 1, T->cfg.epochs, bar, done, total, ips, (double)loss, (int)eta);
    fflush(stderr);
}

void report_clear_bar(const struct train *T)
{
    if (T && T->cfg.progress)
        fprintf(stderr, "\r\033[K");
}

/* The GPU counters' members of a metrics line, as nvml.c names and rounds them: those NVML gave. */
static void gpu_members(json_t *o, const struct rt_nvml_summary *g)
{
    char text[300] = "{";
    if (rt_nvml_summary_json(g, text + 1, sizeof(text) - 2) < 0 || !text[1])
        return;
    strcat(text, "}");
    json_t *m = json_loads(text, 0, NULL);
    if (m)
        json_object_update(o, m);
    json_decref(m);
}

/* The phases' p50 and p99 (ms) as members of o, named by profile_phase_key(). */
static void phase_members(json_t *o, const struct prof_stats *st)
{
    for (int k = 0; k < PROF_N; k++)
        json_object_set_new(o, profile_phase_key((enum prof_phase)k),
                            json_pack("{s:f, s:f}", "p50_ms", st->p50[k] * 1e-6, "p99_ms", st->p99[k] * 1e-6));
}

/* The epoch's step profile (rank 0's steps in this epoch), each rank's images/s and the loss scale. */
static void epoch_members(const struct train *T, json_t *o)
{
    struct prof_stats st;
    profile_epoch_stats(T, &st);
    if (st.steps) { /* shaped as the --json summary's "profile" */
        json_t *ph = json_object();
        phase_members(ph, &st);
        json_object_set_new(o, "profile", json_pack("{s:I, s:b, s:o}", "steps", (json_int_t)st.steps,
                                                    "warmup_included", st.warm, "phases", ph));
    }
    if (T->rank_ips) {
        json_t *a = json_array();
        for (int r = 0; r < T->world; r++)
            json_array_append_new(a, json_real(T->rank_ips[r]));
        json_object_set_new(o, "rank_images_per_s", a);
    }
    if (T->scaling)
        json_object_set_new(o, "loss_scale", json_real(T->scaler.scale));
}

/* Keeps the record for --report, in place of those of its epoch and later ones that an earlier process wrote
 * (a partial epoch's, or an epoch's whose checkpoint was not saved before the process ended). */
static void records_add(struct train *T, json_t *rec)
{
    const json_int_t epoch = json_integer_value(json_object_get(rec, "epoch"));
    size_t n = json_array_size(T->records);
    while (n > 0 && json_integer_value(json_object_get(json_array_get(T->records, n - 1), "epoch")) >= epoch)
        json_array_remove(T->records, --n);
    json_array_append(T->records, rec);
}

static void write_metrics(struct train *T, double time_s, double ips, double wait, double comm,
                          const struct rt_nvml_summary *gpu)
{
    const struct train_results *r = &T->res;
    const int64_t applied = rt_optim_steps(T->opt);
    json_t *o = json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:i}", "epoch", (json_int_t)(T->pos.epoch + 1),
                          "steps", (json_int_t)T->pos.update, "train_loss", r->train_loss, "train_acc", r->train_acc,
                          "images_per_s", ips, "data_wait_frac", wait, "time_s", time_s, "lr",
                          (double)rt_sched_lr(&T->sched, applied ? (uint64_t)applied - 1 : 0), "exposed_comm_frac",
                          comm, "world_size", T->world);
    if (!o)
        return;
    json_object_set_new(o, "val_loss", r->have_val ? json_real(r->val_loss) : json_null());
    json_object_set_new(o, "val_acc", r->have_val ? json_real(r->val_acc) : json_null());
    gpu_members(o, gpu);
    epoch_members(T, o);
    if (T->records)
        records_add(T, o);
    char *s = T->metrics ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s) {
        fprintf(T->metrics, "%s\n", s);
        fflush(T->metrics);
        free(s);
    }
    json_decref(o);
}

void report_epoch(struct train *T, int partial, double time_s, double ips, double wait, double comm, const char *val)
{
    /* The GPU's counters over the epoch (rank 0's GPU); none on the CPU or without NVML. */
    struct rt_nvml_summary gpu;
    rt_nvml_sampler_window(T->gpu, &gpu);
    if (!T->root)
        return;
    char gpu_s[96] = "";
    if (gpu.samples) {
        gpu_s[0] = gpu_s[1] = ' ';
        rt_nvml_summary_format(&gpu, gpu_s + 2, sizeof(gpu_s) - 2);
    }
    report_clear_bar(T);
    char comm_s[32] = "";
    if (T->world > 1)
        snprintf(comm_s, sizeof(comm_s), "  comm %4.1f%%", 100 * comm);
    printf("epoch %3" PRIu64 "/%" PRIu64 "%s  %6.1fs  train loss %.4f acc %5.2f%%%s  %6.0f img/s  data wait "
           "%4.1f%%%s%s\n",
           T->pos.epoch + 1, T->cfg.epochs, partial ? " (partial)" : "", time_s, T->res.train_loss,
           100 * T->res.train_acc, val, ips, 100 * wait, comm_s, gpu_s);
    fflush(stdout);
    if (T->metrics || T->records)
        write_metrics(T, time_s, ips, wait, comm, &gpu);
}

void report_stopped(const struct train *T)
{
    if (T->stop != STOP_SIGNAL || !T->root)
        return;
    /* The signal may have reached another rank only: the control word says which. */
    char sig[64] = "a signal";
    if (T->ctl & CTL_SIGTERM)
        snprintf(sig, sizeof(sig), "signal %d (SIGTERM%s)", SIGTERM, T->ctl & CTL_SIGUSR1 ? ", and SIGUSR1" : "");
    else if (T->ctl & CTL_SIGUSR1)
        snprintf(sig, sizeof(sig), "signal %d (SIGUSR1)", SIGUSR1);
    rt_info("stopped by %s: checkpoint saved at epoch %" PRIu64 " step %" PRIu64 "; run again with --resume", sig,
            T->pos.epoch + 1, T->pos.batch);
}

void report_profile(const struct train *T)
{
    const struct prof_stats *st = &T->verdict.st;
    if (!T->root || !T->verdict.have || !st->steps)
        return;
    report_clear_bar(T);
    const double step = st->p50[PROF_STEP] > 0 ? st->p50[PROF_STEP] : 1;
    printf("step profile (rank 0, %" PRIu64 " optimizer steps%s), ms:\n", st->steps,
           st->warm ? ", warm-up included: the run was short" : " after the first 3");
    printf("  %-13s %9s %9s %6s\n", "phase", "p50", "p99", "share");
    for (int k = 0; k < PROF_N; k++)
        printf("  %-13s %9.3f %9.3f %5.0f%%\n", profile_phase_name((enum prof_phase)k), st->p50[k] * 1e-6,
               st->p99[k] * 1e-6, k == PROF_STEP ? 100.0 : 100 * st->p50[k] / step);
    printf("verdict: %s-bound: %s\n  try: %s\n", T->verdict.limit, T->verdict.evidence, T->verdict.advice);
    fflush(stdout);
}

/* The step profile and its verdict as members of the --json summary. */
static void profile_members(const struct train *T, json_t *o)
{
    if (!T->verdict.have)
        return;
    const struct prof_stats *st = &T->verdict.st;
    json_t *ph = json_object();
    phase_members(ph, st);
    json_object_set_new(o, "profile", json_pack("{s:I, s:b, s:o}", "steps", (json_int_t)st->steps, "warmup_included",
                                                st->warm, "phases", ph));
    json_object_set_new(o, "verdict", json_pack("{s:s, s:s, s:s}", "limit", T->verdict.limit, "evidence",
                                                T->verdict.evidence, "try", T->verdict.advice));
}

static const char *const conv_dirs[] = {"fwd", "bwd_data", "bwd_filter"}; /* enum rt_conv_dir */

/* A convolution's shape as the op profile gives it: "N=64 C=3 32x32 -> K=64 3x3 s1 p1". */
static void conv_shape(const struct rt_conv_desc *d, char *buf, size_t len)
{
    snprintf(buf, len, "N=%d C=%d %dx%d -> K=%d %dx%d s%d p%d", d->in.n, d->in.c, d->in.h, d->in.w, d->cout, d->kh,
             d->kw, d->stride, d->pad);
}

/* cuDNN's choices for the convolutions run so far: *n of them (0 on the CPU), allocated (NULL when none). */
static struct rt_conv_choice *conv_choices(const struct train *T, int *n)
{
    const int want = rt_backend_conv_choices(T->be, NULL, 0);
    struct rt_conv_choice *cc = want > 0 ? rt_calloc((size_t)want, sizeof(*cc), "convolution choices") : NULL;
    *n = cc ? RT_MIN(rt_backend_conv_choices(T->be, cc, want), want) : 0;
    return cc;
}

void report_op_profile(const struct train *T)
{
    struct op_stats st;
    if (!T->root || profile_op_stats(T, &st) < 0 || !st.steps)
        return;
    report_clear_bar(T);
    const double step = st.step_ms > 0 ? st.step_ms : 1;
    printf("op profile (rank 0's compute stream, %" PRIu64 " optimizer steps%s), ms per step:\n", st.steps,
           st.warm ? ", warm-up included: the run was short" : " after the first 3");
    printf("  %-13s %9s %6s\n", "category", "ms", "share");
    for (int k = 0; k < OPC_N; k++)
        printf("  %-13s %9.3f %5.1f%%\n", profile_op_category_key((enum op_cat)k), st.cat_ms[k],
               100 * st.cat_ms[k] / step);
    printf("  %-13s %9.3f %5.1f%%\n", "step", st.step_ms, 100.0);
    printf("  %-20s %9s %8s  %s\n", "top ops", "ms", "calls", "category");
    for (int i = 0; i < st.nrow && i < 12; i++)
        printf("  %-20s %9.3f %8.4g  %s\n", st.row[i].name, st.row[i].ms, st.row[i].calls,
               profile_op_category_key(st.row[i].cat));
    if (T->prof.ops.unpaired)
        printf("  (%" PRIu64 " op marks without their pair: the timeline was too small for a step)\n",
               T->prof.ops.unpaired);
    int nc;
    struct rt_conv_choice *cc = conv_choices(T, &nc);
    if (nc > 0)
        printf("  convolutions (%d, as chosen; all in the --json summary):\n", nc);
    for (int i = 0; i < nc && i < 24; i++) {
        char shape[128];
        conv_shape(&cc[i].d, shape, sizeof(shape));
        printf("    %-10s %-4s %s: %s, %.3f ms, %s%s\n", conv_dirs[cc[i].dir % 3], rt_dtype_name(cc[i].dt), shape,
               cc[i].how, (double)cc[i].ms, cc[i].deterministic ? "deterministic" : "non-deterministic",
               cc[i].tensor_cores ? ", tensor cores" : "");
    }
    free(cc);
    printf("  (each op between two marks%s: the profiled steps are slower than a run without --profile-ops)\n",
           rt_backend_kind_of(T->be) == RT_BACKEND_CUDA ? ", two CUDA events per op" : "");
    fflush(stdout);
    profile_op_stats_free(&st);
}

/* cuDNN's choices for the convolutions run so far (none on the CPU), as the op profile lists them. */
static json_t *conv_choices_json(const struct train *T)
{
    json_t *a = json_array();
    int n;
    struct rt_conv_choice *cc = conv_choices(T, &n);
    for (int i = 0; a && i < n; i++) {
        char shape[128];
        conv_shape(&cc[i].d, shape, sizeof(shape));
        json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:f, s:I, s:b, s:b, s:i}", "dir",
                                           conv_dirs[cc[i].dir % 3], "dtype", rt_dtype_name(cc[i].dt), "shape", shape,
                                           "how", cc[i].how, "ms", (double)cc[i].ms, "workspace",
                                           (json_int_t)cc[i].workspace, "deterministic", cc[i].deterministic != 0,
                                           "tensor_cores", cc[i].tensor_cores != 0, "candidates", cc[i].candidates));
    }
    free(cc);
    return a;
}

/* --profile-ops as the summary's "op_profile" (docs/FORMAT.md), NULL without it or before a step. */
static json_t *op_profile_json(const struct train *T)
{
    struct op_stats st;
    if (profile_op_stats(T, &st) < 0 || !st.steps)
        return NULL;
    json_t *cats = json_object(), *ops = json_array();
    for (int k = 0; k < OPC_N; k++)
        json_object_set_new(cats, profile_op_category_key((enum op_cat)k), json_real(st.cat_ms[k]));
    for (int i = 0; i < st.nrow; i++)
        json_array_append_new(ops, json_pack("{s:s, s:s, s:f, s:f}", "op", st.row[i].name, "category",
                                             profile_op_category_key(st.row[i].cat), "ms", st.row[i].ms, "calls",
                                             st.row[i].calls));
    json_t *o = json_pack("{s:I, s:b, s:f, s:o, s:o, s:o, s:o}", "steps", (json_int_t)st.steps, "warmup_included",
                          st.warm, "step_ms", st.step_ms, "categories", cats, "ops", ops, "convolutions",
                          conv_choices_json(T), "settings", settings_json(T));
    profile_op_stats_free(&st);
    return o;
}

/* enum train_stop, as the summary says it */
static const char *const stop_reasons[] = {[STOP_NONE] = "running", [STOP_EPOCHS] = "completed",
                                           [STOP_TARGET] = "target accuracy reached", [STOP_STEPS] = "step limit",
                                           [STOP_SIGNAL] = "signal"};

/* A resumed run's summary members for this process alone: the run's counters include the processes before it
 * (time_s is this one's alone). */
static void summary_resumed(const struct train *T, json_t *o)
{
    const struct train_meter *m = &T->meter;
    if (!m->update_before && !m->before.train_ns)
        return;
    const double here_s = (double)(m->run.train_ns - m->before.train_ns) * 1e-9;
    json_object_set_new(o, "resumed_at_step", json_integer((json_int_t)m->update_before));
    json_object_set_new(o, "process_steps", json_integer((json_int_t)(T->pos.update - m->update_before)));
    json_object_set_new(o, "process_train_time_s", json_real(here_s));
    json_object_set_new(o, "process_images_per_s",
                        json_real(here_s > 0 ? (double)(m->run.images - m->before.images) * T->world / here_s : 0));
}

/* The summary's "startup" (its parts, by when the last rank was through each) and "per_rank" resources. */
static void summary_startup(const struct train *T, json_t *o)
{
    const struct train_startup *su = &T->startup;
    if (!su->have)
        return;
    json_t *parts = json_object();
    for (int k = BOOT_COMM_BEGIN; k < BOOT_N; k++)
        json_object_set_new(parts, startup_part_key((enum train_boot)k), json_real(su->part_s[k]));
    json_object_set_new(o, "startup", json_pack("{s:f, s:f, s:f, s:o}", "to_first_step_s", su->total_s,
                                                "exec_unix", su->exec_unix, "first_step_unix",
                                                su->first_step_unix, "parts_s", parts));
    json_object_set_new(o, "per_rank", json_pack("{s:f, s:f, s:i, s:i, s:i}", "rss_max_mb", su->rss_max_mb,
                                                 "rss_total_mb", su->rss_sum_mb, "fds_max", su->fds_max,
                                                 "lifeline_peers_max", su->peers_max, "threads_max",
                                                 su->threads_max));
}

/* --cuda-graph: graphs captured and replays on rank 0, or why the steps ran op by op. */
static void summary_graph(const struct train *T, json_t *o)
{
    int graphs = 0;
    uint64_t replays = 0;
    rt_model_graph_status(T->model, &graphs, &replays);
    /* graph_why: the run's reason, or the model's once it refused (graph_check copies it) */
    json_object_set_new(o, "cuda_graph", json_pack("{s:b, s:i, s:I, s:s?}", "on", T->graph_on || graphs > 0,
                                                   "graphs", graphs, "replays", (json_int_t)replays, "why_not",
                                                   T->graph_on ? NULL : T->graph_why));
}

/* The buckets, what trains and what the all-reduce moves per update (bytes of the gradients in the buckets), and
 * the bucket all-reduces made. */
static void summary_allreduce(const struct train *T, json_t *o)
{
    const struct train_cfg *c = &T->cfg;
    json_object_set_new(o, "buckets", json_integer(rt_bucketer_count(T->bucketer)));
    uint64_t trainable, frozen;
    rt_model_param_split(T->model, &trainable, &frozen);
    json_object_set_new(o, "params", json_pack("{s:I, s:I}", "trainable", (json_int_t)trainable, "frozen",
                                               (json_int_t)frozen));
    size_t boff, bcnt, bbytes = 0;
    for (int i = 0; i < rt_bucketer_count(T->bucketer); i++) {
        rt_bucketer_bucket(T->bucketer, i, &boff, &bcnt, NULL, 0);
        bbytes += bcnt * sizeof(float);
    }
    struct rt_comm_counts cc;
    rt_comm_counts(T->comm, &cc);
    json_object_set_new(o, "allreduce_bytes", json_integer((json_int_t)bbytes));
    json_object_set_new(o, "bucket_cap_mb", json_real(c->bucket_cap_mb));
    json_object_set_new(o, "overlap", json_boolean(!c->no_overlap));
    json_object_set_new(o, "bucket_allreduces", json_integer((json_int_t)cc.bucket_allreduces));
}

/* The --json summary: the first line's figures and the rest; NULL on no memory. */
static json_t *summary_json(const struct train *T, double wall_s, double train_s, double images, double ips)
{
    const struct train_cfg *c = &T->cfg;
    const struct train_results *r = &T->res;
    json_t *o = json_pack("{s:s, s:f, s:I, s:f, s:f, s:f, s:I, s:I, s:i, s:i, s:s}", "model", rt_model_name(T->model),
                          "images_per_s", ips, "steps", (json_int_t)T->pos.update, "time_s", wall_s, "train_time_s",
                          train_s, "train_loss", r->train_loss, "epochs", (json_int_t)r->epochs_done, "images",
                          (json_int_t)images, "batch_size", (int)c->batch, "threads", c->threads, "stopped",
                          stop_reasons[T->stop]);
    if (!o)
        return NULL;
    json_object_set_new(o, "train_acc", json_real(r->train_acc));
    summary_resumed(T, o);
    if (T->meter.steady_ns)
        json_object_set_new(o, "steady_images_per_s", json_real((double)T->meter.steady_images * T->world /
                                                                ((double)T->meter.steady_ns * 1e-9)));
    json_object_set_new(o, "world_size", json_integer(T->world));
    /* What the model saw: the slot's shape (synthetic batches' too, whose size --image-size sets). */
    json_object_set_new(o, "input_shape", json_pack("[i, i, i]", (int)T->c, (int)T->h, (int)T->w));
    json_object_set_new(o, "num_classes", json_integer(T->classes));
    json_object_set_new(o, "synthetic", json_boolean(T->cfg.synthetic));
    summary_startup(T, o);
    json_object_set_new(o, "device", json_string(train_device_name(T)));
    json_object_set_new(o, "amp", json_string(train_amp_name(T->act)));
    json_object_set_new(o, "settings", settings_json(T));
    json_object_set_new(o, "optimizer_updates", json_integer((json_int_t)rt_optim_steps(T->opt)));
    if (T->scaling) {
        json_object_set_new(o, "loss_scale", json_real(T->scaler.scale));
        json_object_set_new(o, "skipped_steps", json_integer((json_int_t)T->scaler.skipped));
    }
    json_object_set_new(o, "exposed_comm_frac", json_real(r->run_comm_frac));
    if (r->batch_digest[0]) /* --batch-digest: rank 0's, loadbench --digest's for the same options */
        json_object_set_new(o, "batch_digest", json_string(r->batch_digest));
    /* Blocking waits for the compute stream inside a steady step (rt_backend_host_waits), the most any rank
     * made on average: 0 when the host only queues work. */
    json_object_set_new(o, "host_waits_per_step",
                        isnan(r->host_waits_per_step) ? json_null() : json_real(r->host_waits_per_step));
    summary_graph(T, o);
    summary_allreduce(T, o);
    profile_members(T, o);
    json_t *ops = op_profile_json(T);
    if (ops)
        json_object_set_new(o, "op_profile", ops);
    if (c->trace) {
        /* split: the files as a pattern (`ringtrain trace merge -o FILE PATTERN` joins them into c->trace) */
        const int split = T->tr.pattern[0] != 0;
        json_object_set_new(o, "trace", json_pack("{s:s, s:I, s:i, s:b}", "file", split ? T->tr.pattern : c->trace,
                                                  "bytes", (json_int_t)T->tr.file_bytes, "files",
                                                  split ? T->tr.files : 1, "split", split));
    }
    if (r->best_acc > 0 || r->have_val) {
        json_object_set_new(o, "val_loss", json_real(r->val_loss));
        json_object_set_new(o, "val_acc", json_real(r->val_acc));
        json_object_set_new(o, "best_val_acc", json_real(r->best_acc));
    }
    json_t *cmd = checkpoint_command(T);
    if (cmd)
        json_object_set_new(o, "command", cmd);
    if (T->facts)
        json_object_set(o, "facts", T->facts);
    return o;
}

void report_startup(const struct train *T)
{
    const struct train_startup *su = &T->startup;
    if (!T->root || !su->have)
        return;
    printf("start-up  %.1f s from the first process to the last rank's first update, by when the last rank was "
           "through each part:",
           su->total_s);
    for (int k = BOOT_COMM_BEGIN; k < BOOT_N; k++)
        if (T->world > 1 || (k != BOOT_MPI_INIT && k != BOOT_RANK_TABLE && k != BOOT_MESH))
            printf("%s %s %.2f", k == BOOT_COMM_BEGIN ? "" : ",", startup_part_name((enum train_boot)k),
                   su->part_s[k]);
    printf("\n");
    printf("per rank  peak memory %.0f MB (max; %.0f MB over %d rank%s), %d open files, %d threads",
           su->rss_max_mb, su->rss_sum_mb, T->world, T->world == 1 ? "" : "s", su->fds_max, su->threads_max);
    if (T->world > 1)
        printf(", %d lifeline connections", su->peers_max);
    printf("\n");
}

/*
 * One line to stdout in one write(2) where it can: --json's line runs to several KB, and stdio would hand it over
 * in buffer-sized pieces, between which a Slurm step's log (which keeps no order between stdout and stderr) puts
 * stderr lines, cutting the JSON.
 */
static void print_line_whole(char *s)
{
    const size_t n = strlen(s);
    fflush(stdout);
    s[n] = '\n'; /* json_dumps's string: its terminator becomes the newline for the write */
    size_t off = 0;
    while (off <= n) {
        const ssize_t w = write(STDOUT_FILENO, s + off, n + 1 - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    s[n] = '\0';
}

void report_summary(struct train *T, double wall_s)
{
    /* Global: every rank trains the same number of full batches, so the
     * images are this rank's times the world; the time is rank 0's. */
    const double train_s = (double)T->meter.run.train_ns * 1e-9;
    const double images = (double)T->meter.run.images * T->world;
    const double ips = train_s > 0 ? images / train_s : 0;
    if (!T->root)
        return;
    const struct train_meter *m = &T->meter;
    if (m->update_before || m->before.train_ns) {
        /* Resumed: the run's counters span several processes, the wall time is this one's: say which is which. */
        const double here_s = (double)(m->run.train_ns - m->before.train_ns) * 1e-9;
        const double here_images = (double)(m->run.images - m->before.images) * T->world;
        printf("done (%s): %" PRIu64 " steps, resumed at step %" PRIu64 ": this process %" PRIu64
               " steps in %.1fs (%.1fs training, %.0f img/s); the whole run %.1fs training, %.0f img/s",
               stop_reasons[T->stop], T->pos.update, m->update_before, T->pos.update - m->update_before, wall_s,
               here_s, here_s > 0 ? here_images / here_s : 0, train_s, ips);
    } else {
        printf("done (%s): %" PRIu64 " steps, %.1fs (%.1fs training), %.0f img/s", stop_reasons[T->stop],
               T->pos.update, wall_s, train_s, ips);
    }
    if (T->res.best_acc > 0)
        printf(", best val acc %.2f%%", 100 * T->res.best_acc);
    printf("\n");
    if (T->cfg.checkpoint_dir)
        printf("checkpoint: %s/model.safetensors\n", T->cfg.checkpoint_dir);
    json_t *o = T->cfg.json || T->cfg.report ? summary_json(T, wall_s, train_s, images, ips) : NULL;
    char *s = o && T->cfg.json ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s)
        print_line_whole(s);
    free(s);
    if (T->cfg.report) {
        json_decref(T->summary);
        T->summary = json_incref(o);
    }
    json_decref(o);
    fflush(stdout);
}

/* ---- --report: the HTML page of the run (tools/report/) -------------------------------- */

/*
 * A resumed run's earlier epochs are in the --metrics file the earlier processes wrote (appended to by this one):
 * read back, they make the page cover the whole run. A line that is no JSON object (one cut short by a kill) is
 * left out. Without --metrics, or when the file cannot be read, the page holds this process's epochs, and its
 * line says so.
 */
int report_records_open(struct train *T)
{
    if (!T->root || !T->cfg.report)
        return 0;
    if (!(T->records = json_array()))
        return rt_errf(-ENOMEM, "--report: no memory for the epoch records");
    if (!T->meter.update_before || !T->cfg.metrics)
        return 0;
    FILE *f = fopen(T->cfg.metrics, "r");
    if (!f)
        return 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *rec = json_loads(line, 0, NULL);
        if (json_is_object(rec) && json_is_integer(json_object_get(rec, "epoch")))
            records_add(T, rec);
        json_decref(rec);
    }
    free(line);
    T->records_earlier = !ferror(f);
    fclose(f);
    return 0;
}

int report_page(struct train *T)
{
    if (!T->root || !T->cfg.report)
        return 0;
    struct rt_report *r = rt_report_new(NULL);
    int rc = r ? 0 : rt_errf(-ENOMEM, "no memory");
    if (rc == 0)
        rc = rt_report_add_train(r, NULL, T->records, T->summary, T->state);
    if (rc == 0)
        rc = rt_report_write(r, T->cfg.report);
    rt_report_free(r);
    if (rc < 0)
        return rt_errf(rc, "--report: %s%s", rt_errmsg(),
                       T->cfg.checkpoint_dir ? " (the training is done and its checkpoint saved)" : "");
    const size_t n = json_array_size(T->records);
    const char *whose = T->meter.update_before && !T->records_earlier
                            ? (T->cfg.metrics ? "; this process's only: the earlier ones could not be read from --metrics"
                                              : "; this process's only: the run was resumed without --metrics")
                            : "";
    printf("report: %s (%zu epoch%s%s)\n", T->cfg.report, n, n == 1 ? "" : "s", whose);
    fflush(stdout);
    return 0;
}
