/*
 * train.h - the pipeline driver behind `ringtrain train` and `eval`:
 * the only code that joins the stages. It takes batches from the loader's
 * ring (or makes one synthetic batch), runs them through the compute model,
 * hands finished gradients to the comm stage's bucketer, steps the optimizer
 * on the schedule, validates each epoch, and writes metrics and checkpoints.
 * What a stage does lives in that stage's library; this one only wires them.
 *
 * Read it from the top: the run (train_run) is set-up, the loop, the finish.
 * The loop (loop.c) runs updates until the last epoch, the target accuracy,
 * --steps or a stop signal; one update (train_step, step.c) is
 *
 *     for each of its train_step_size() micro-batches (train_step_micro):
 *         train_input_next             the batch on its way to the device
 *         train_step_forward_backward  gradients zeroed at the first; forward,
 *                                      loss, backward; at the last the
 *                                      buckets' all-reduce starts as
 *                                      gradients finish
 *         train_input_release          the ring slot back to the loader
 *     train_step_reduce    the update before's loss read back; the stream
 *                          made to wait for the all-reduce; the ranks'
 *                          control words
 *     train_step_apply     unscale and skip on overflow, clip, optimizer step
 *
 * The host only queues work: nothing in a steady update waits for the
 * compute stream (with loss scaling, the overflow check still does, once).
 * What the host must read -- the loss sums, clipping's norm, the step
 * profile's times, the other ranks' control words -- it reads one update
 * late (late.c), when the next update's work is queued behind it; an
 * epoch's end, a checkpoint and train_last_loss() read what is pending at
 * once. train --json reports the waits as host_waits_per_step.
 *
 * then, after an epoch's last update, the epoch's end (epoch.c: validation,
 * the epoch line, metrics, the checkpoint) and the stop checks.
 *
 * An update never spans two epochs. With --shuffle exact or none (the global
 * order, loader.h) each update takes the next G = batch x ranks x
 * accumulation samples of the epoch's sequence, and the last N mod G are
 * left out: an epoch has floor(N / G) whole updates on any world size. With
 * --shuffle window, where --grad-accum does not divide the epoch's
 * micro-batches, each epoch ends with a short update of the remainder (its
 * gradient the mean over its own samples), as a PyTorch loop that steps on
 * the epoch's last batch does. The schedule counts updates, and every
 * checkpoint -- an epoch's end, --steps, a stop signal -- falls between two
 * updates, where nothing half-accumulated needs saving.
 *
 * Positions. Three counters, three words, used the same way everywhere
 * (messages, state.json, the code):
 *   micro-batch  one batch of --batch-size samples per rank through forward
 *                and backward; `batch` counts them within the epoch;
 *   update       --grad-accum micro-batches (fewer at a window-shuffled epoch's end), then
 *                one gradient reduction and one optimizer step, attempted:
 *                an update skipped by loss scaling still counts. --steps N
 *                stops after N updates;
 *   applied      the updates the optimizer really made (rt_optim_steps()):
 *                what the learning-rate schedule advances on.
 *
 * Threads: one thread drives a struct train from create to destroy.
 */
#ifndef RT_TOOLS_TRAIN_H
#define RT_TOOLS_TRAIN_H

#include <stdint.h>

#include "compute/compute.h"
#include "loader/loader.h"
#include "staging/ring.h"

struct rt_comm;
struct rt_local_copy_progress;

/* ---- choices the command line makes ------------------------------------------ */

/* --device: where compute runs. */
enum train_device { DEVICE_AUTO = 0, DEVICE_CPU, DEVICE_CUDA };

/* Parses "auto", "cpu" or "cuda"; 0 or -EINVAL with the message set. */
int train_device_parse(const char *s, enum train_device *out);

/* --amp: activation precision. auto: bf16 on a GPU that has it, else fp16 on a GPU, fp32 on the CPU. */
enum train_amp { AMP_AUTO = 0, AMP_OFF, AMP_BF16, AMP_FP16 };

/* Parses "auto", "off", "bf16" or "fp16"; 0 or -EINVAL with the message set. */
int train_amp_parse(const char *s, enum train_amp *out);

/* The activation type --amp gives on backend `be`: 0, or -ENOTSUP with the reason. */
int train_amp_resolve(enum train_amp amp, struct rt_backend *be, enum rt_dtype *out);

/* --allreduce: what reduces the gradients. auto: NCCL across GPU ranks, MPI across CPU ranks, nothing for one
 * process; nccl: NCCL on the GPU, one process too (a world of one made in-process: rt_nccl_create_local). */
enum train_allreduce { ALLREDUCE_AUTO = 0, ALLREDUCE_NCCL };

/* Parses "auto" or "nccl"; 0 or -EINVAL with the message set. */
int train_allreduce_parse(const char *s, enum train_allreduce *out);

/* --trace-split: one trace file, or one per rank. auto: one file for a small job, one per rank past
 * tracefile.c's limits (more than 16 ranks, or about 256 MiB of trace in all); merged: rank 0 writes one
 * file whatever the size; rank: every rank writes FILE with ".rankNNNNN" before its extension, which
 * `ringtrain trace merge` joins into the file `merged` would have written. */
enum train_trace_split { TRACE_SPLIT_AUTO = 0, TRACE_SPLIT_MERGED, TRACE_SPLIT_RANK };

/*
 * Opens the compute backend --device asks for: cuda fails at once with the
 * reason when no usable GPU is there; auto takes a GPU when there is one,
 * else the CPU with `threads`. Which GPU: comm's rt_gpu_preflight() over the
 * GPUs this process sees and its node-local rank among `local_world`
 * (printing its note on Slurm's per-task GPU binding). How a GPU runs
 * convolutions (--tf32, --deterministic; both ignored on the CPU): tf32 1
 * lets fp32 convolutions round their inputs to TF32 (rt_backend_opts.tf32),
 * nondeterministic 1 lets cuDNN take algorithms that are not bitwise
 * reproducible (rt_backend_opts.nondeterministic); both 0 is strict fp32,
 * deterministic. 0 or -errno with rt_errmsg() set.
 */
int train_open_backend(enum train_device dev, int local_rank, int local_world, int threads, int tf32,
                       int nondeterministic, struct rt_backend **out);

/* ---- faults: injection points for the failure tests ----------------------------- */

/*
 * Faults are injected through this struct, filled once at start-up and
 * consulted at named points of the driver (faults.c); nothing else in the
 * step knows about them. The shell tests fill it from the environment
 * (train_faults_from_env), the C tests directly. Updates are numbered from
 * 0 as train_pos.update counts them.
 */
struct train_faults {
    int stall_rank;             /* this rank hangs in compute before update stall_update ... */
    uint64_t stall_update;      /* ... (-1 / UINT64_MAX: never): a stalled peer */
    uint64_t overflow_update;   /* updates [overflow_update, +overflow_count) find an Inf in the */
    uint64_t overflow_count;    /* first gradient before unscaling (loss scaling's overflow path) */
    uint32_t copy_delay_ms;     /* node-local copies sleep this long after each block (interrupt midway) */
    uint32_t allreduce_delay_ms; /* each bucket's all-reduce starts this much late (a slow link) */
    uint32_t loader_delay_ms;   /* each loader batch takes this much longer (slow storage) */
    int slow_rank;              /* this rank's backward takes slow_ms longer in every update (a straggler) */
    uint32_t slow_ms;
    int full_mesh;              /* the watchdog's all-to-all mesh only up to this many ranks (0: the default,
                                   rt_comm_opts.full_mesh): the sparse graph at a few dozen ranks */
    int host_wait;              /* every micro-batch first waits for the compute stream (the host-wait count's
                                   own check: host_waits_per_step must then say so) */
    uint64_t data_end_micro;    /* the input says the data ended at this micro-batch (train_pos.micro;
                                   UINT64_MAX: never): a loader that disagrees with the position */
    const char *sample_log;     /* each rank appends "update U micro M: id,id,..." per micro-batch to this path
                                   ".RANK" (M = the micro-batch's place in the update, as the sampler deals it) */
};

/* No fault anywhere. */
void train_faults_none(struct train_faults *f);

/*
 * Fills `f` from the environment, none where a variable is unset:
 *   RINGTRAIN_TEST_STALL=RANK:UPDATE, RINGTRAIN_TEST_OVERFLOW=UPDATE:COUNT,
 *   RINGTRAIN_TEST_SLOW_COPY=MS, RINGTRAIN_TEST_SLOW_ALLREDUCE=MS, RINGTRAIN_TEST_SLOW_LOADER=MS,
 *   RINGTRAIN_TEST_SLOW_RANK=RANK:MS, RINGTRAIN_TEST_FULL_MESH=RANKS, RINGTRAIN_TEST_HOST_WAIT=1,
 *   RINGTRAIN_TEST_SAMPLE_LOG=PATH.
 * Returns 0, or -EINVAL naming the variable that does not parse.
 */
int train_faults_from_env(struct train_faults *f);

/* The copy-delay fault as a node-local copy's progress callback (ctx: the struct train_faults). */
void train_faults_copy_progress(void *ctx, const struct rt_local_copy_progress *p);
/* The slow-loader fault as the loader's on_batch callback (ctx: the struct train_faults). */
void train_faults_loader_batch(void *ctx, const struct rt_batch *b);

/* ---- the configuration ------------------------------------------------------------ */

struct train_cfg {
    const char *data;           /* dataset directory (NULL: synthetic data with the shape below) */
    const char *model;
    /* fine-tuning */
    const char *init;           /* starting weights: a safetensors state_dict (train --init), NULL: --seed's */
    int reset_head;             /* the classifier keeps its fresh initialisation (a file of other classes) */
    const char *freeze;         /* globs of the layers to freeze (rt_model_opts.freeze), NULL: none */
    float lr_head;              /* the classifier's peak learning rate, 0: lr */
    uint64_t epochs;
    uint32_t batch;             /* samples per micro-batch, per rank */
    struct rt_optim_opts optim;
    float lr;
    enum rt_sched_kind sched;
    double warmup_epochs;       /* < 0: the schedule's default */
    double step_epochs;         /* STEP: decay every this many epochs */
    float gamma;                /* STEP: factor */
    float label_smoothing;
    uint32_t grad_accum;        /* micro-batches per update */
    float clip_grad_norm;       /* 0: no clipping */
    uint64_t seed;
    int workers;                /* loader threads (0: default) */
    int threads;                /* compute threads (0: the CPUs this process may use) */
    double target_accuracy;     /* 0..1; 0: none */
    uint32_t patience;          /* epochs in a row at the target before stopping */
    const char *checkpoint_dir; /* NULL: no checkpoints */
    int resume;
    int amp_change;             /* --amp-change: resume a checkpoint trained at another precision */
    const char *metrics;        /* JSON Lines file, NULL: none */
    const char *report;         /* HTML page of the run, written by rank 0 at its end (tools/report/), NULL: none */
    int synthetic;              /* one random batch made once on the device, used for every micro-batch */
    uint32_t syn_c, syn_h, syn_w, syn_classes; /* synthetic shape without --data */
    uint64_t max_updates;       /* --steps: stop after this many updates (0: no limit) */
    int json;                   /* end with a JSON summary line */
    int batch_digest;           /* a digest of every batch the steps took (loadbench --digest's), printed and in
                                   the JSON summary: the same options give loadbench's and Python's */
    int progress;               /* 1: progress bar, 0: none, -1: when stderr is a tty */
    struct rt_aug aug;
    int aug_default;            /* aug not given: the loader's default (rt_loader_opts_for) */
    uint32_t image_size;        /* variable-size datasets: S of the S x S crops (0 for fixed-size data) */
    enum rt_shuffle shuffle;
    enum rt_pin pin;
    enum train_device device;
    enum train_amp amp;
    /* How a GPU runs convolutions; no effect on the CPU. Zero is strict fp32 and deterministic, what a test
     * comparing with the CPU wants; the command's defaults are tf32 1 (PyTorch's) and nondeterministic 0. */
    int tf32;                   /* --tf32 on: fp32 convolutions on TF32 tensor cores */
    int nondeterministic;       /* --deterministic off: cuDNN may take algorithms that sum with atomics */
    int loss_scale;             /* -1: dynamic with fp16, off otherwise; 0: off; 1: dynamic */
    uint32_t max_skipped_steps; /* loss scaling: stop after this many overflowed updates in a row (0: 20) */
    /* several ranks */
    double bucket_cap_mb;       /* gradient bucket size */
    int no_overlap;             /* all-reduce after backward */
    enum train_allreduce allreduce; /* nccl: through NCCL even for one GPU (needs the CUDA backend) */
    double comm_timeout, peer_timeout; /* seconds; 0: the defaults */
    uint64_t check_replicas;    /* compare parameter digests every N updates (0: at the end only) */
    const char *stage_to;       /* copy --data under this node-local directory first */
    /* observing */
    const char *trace;          /* Chrome trace file (merged by rank 0, or one per rank), NULL: none */
    uint64_t trace_first, trace_last; /* optimizer steps [first, last) recorded ... */
    int trace_all;              /* ... or the whole run */
    int profile_ops;            /* --profile-ops: each op's time on the compute stream (slows the step) */
    int cuda_graph;             /* --cuda-graph: 1 on, 0 off, -1 auto (on a GPU); a zeroed config is off */
    double trace_mb;            /* memory for events per rank (0: 64 MiB) */
    enum train_trace_split trace_split; /* one file, or one per rank (auto: by the world and the size) */
    /* what the driver is plugged into (not options) */
    struct rt_comm *comm;       /* borrowed process group; NULL: the driver creates one from the launcher */
    const char *const *argv;    /* borrowed: the command line from the binary's name on (argc strings), for the */
    int argc;                   /* summary's and state.json's "command"; NULL: none */
    const struct train_faults *faults; /* borrowed, read at create; NULL: none */
};

/* ---- the run ------------------------------------------------------------------------ */

/*
 * Runs the training described by cfg: set-up, the banner, the loop, the
 * summary, --report's page. A stop on SIGTERM/SIGUSR1 saves a checkpoint and
 * counts as success; a signal stops only the train_run it reached. Returns 0,
 * or -errno after printing "error: <message>" (and, with several ranks,
 * ending the job so that no peer waits) -- but for a page that could not be
 * written: -EIO on rank 0 alone, after the run's end and its checkpoint.
 */
int train_run(const struct train_cfg *cfg);

/* ---- the driver, piece by piece (train_run's parts; the C tests drive them) ------- */

struct train;

/*
 * Builds everything train_run's loop needs, in this order: the process
 * group (or cfg->comm), the node-local copy (--stage-to), the dataset, the
 * backend, NCCL (GPUs across ranks; one GPU too with --allreduce nccl), the model, optimizer and loss scaler,
 * the bucket plan, the checkpoint (--resume), rank 0's parameters on every
 * rank, the input (loader and ring, or the synthetic batch), the schedule
 * and the metrics file. `cfg` is copied; its strings are borrowed for the
 * driver's lifetime. Collective: every rank calls it.
 * Returns 0, or -errno with rt_errmsg() set. Either way *out receives the
 * driver, half-built on failure (NULL only when it could not be allocated):
 * pass it to train_fail() and train_destroy().
 */
int train_create(const struct train_cfg *cfg, struct train **out);

/*
 * Tears down whatever train_create built, in reverse order, whether it was
 * finished or not. NULL is fine. Not collective: on the failure path the
 * other ranks may be gone.
 */
void train_destroy(struct train *T);

/* Prints "error: <rt_errmsg()>" and, with several ranks, ends the job (never returns then). */
void train_fail(struct train *T);

/* Why the loop stopped; one meaning each. */
enum train_stop {
    STOP_NONE = 0,              /* it has not: the loop goes on (and the state before the loop) */
    STOP_EPOCHS,                /* every epoch ran */
    STOP_TARGET,                /* the target accuracy held for --patience validations */
    STOP_STEPS,                 /* --steps updates ran (first, when the last epoch ends at the same update) */
    STOP_SIGNAL,                /* SIGTERM or SIGUSR1 on some rank */
};

/*
 * The loop, from the driver's position to the end of the last epoch, the
 * target accuracy, --steps, or a stop signal (SIGTERM or SIGUSR1 while
 * train_run runs). Saves a checkpoint at each epoch's end and when stopped
 * early. Returns 0 (train_stopped() says why) or -errno with rt_errmsg() set.
 */
int train_loop(struct train *T);
enum train_stop train_stopped(const struct train *T);
uint64_t train_checkpoints_saved(const struct train *T); /* checkpoints this driver wrote */

/*
 * After the loop: the replica check, the "param digest" line, the
 * exposed-communication share, the summary. Collective. 0 or -errno.
 */
int train_finish(struct train *T);

/* One batch on its way through the step. */
struct train_batch {
    const uint8_t *images;      /* the step's input: the device copy (host memory on the CPU backend) */
    const int32_t *labels;      /* host, batch entries; padding samples -1 */
    const int32_t *labels_dev;  /* the same on the device: copied with the images, in the same copy */
    uint32_t valid;             /* real samples */
    uint64_t ticket;            /* rt_backend_input_upload's ticket for `images` */
    struct rt_batch *slot;      /* the ring slot it came in, NULL for the synthetic batch */
    uint64_t t_start, t_ready;  /* asked for, in hand (rt_now_ns) */
    uint64_t copy_issue_ns;     /* inside that wait: issuing the next batch's copy to the device */
    uint64_t copy_wait_ns;      /* at release: waiting for this batch's copy to finish reading the slot */
};

/*
 * The next micro-batch, its copy to the device started, and the copy of the
 * one after it started too, so that it overlaps this step. Returns 1, 0 at
 * the end of the data, or -errno (holding nothing then).
 */
int train_input_next(struct train *T, struct train_batch *b);
/* Gives the batch's ring slot back once its copy has read it. */
void train_input_release(struct train *T, struct train_batch *b);

/*
 * One update at the driver's position: train_step_size() micro-batches
 * (train_step_micro), the reduction, the optimizer step, the position past
 * them. Returns 0, or -errno (-EIO when the data ended before the epoch
 * did: the loader and the position disagree).
 */
int train_step(struct train *T);

/* The micro-batches of the update at the driver's position: --grad-accum, or the epoch's remainder when fewer. */
uint32_t train_step_size(const struct train *T);

/*
 * Micro-batch i of an update of n: the next batch, train_step_forward_backward,
 * the slot back, the meters. Returns 0 or -errno (-EIO as train_step's).
 */
int train_step_micro(struct train *T, uint32_t i, uint32_t n);

/*
 * Forward, loss and backward of batch `b` as micro-batch i of an update of
 * n, adding into the gradient buffer (zeroed first when i is 0). At the last
 * (i = n - 1) the bucketer all-reduces the gradients as backward finishes
 * them. The gradient is that of the update's mean loss: scaled by
 * 1 / (valid x world x n), times the loss scale. Dropout draws its masks
 * from stream micro-batch x world + rank (rt_step_opts' dropout_stream). The
 * loss sums stay on the device (late.c reads them at the next update).
 * Moves the position past the micro-batch. Returns 0 or -errno.
 */
int train_step_forward_backward(struct train *T, const struct train_batch *b, uint32_t i, uint32_t n);

/*
 * After an update's last micro-batch: reads the update before's loss sums
 * and clipping norm (a non-finite loss is remembered, naming the first
 * non-finite tensor, for the control word); makes the compute stream wait
 * for this update's all-reduce (the host waits with several ranks only for
 * the update before's, see rt_bucketer_finish) and exchanges the control
 * word, so every rank takes the same decision at the same update: with
 * several ranks a rank's bits reach the others one update later, so a stop
 * signal acts after the update after it, a non-finite loss of update k
 * stops the run at update k + 2 (k + 1 on one rank). Returns -ERANGE when
 * some rank's loss (or the gradient norm) became non-finite (the message
 * names the tensor on the rank where it happened), else 0.
 */
int train_step_reduce(struct train *T);

/*
 * The update: with loss scaling, unscale and check (an overflow skips the
 * update and backs the scale off; too many in a row, or a collapsed scale,
 * is an error); clip the global norm (--clip-grad-norm); the optimizer step
 * at the schedule's learning rate for the applied updates so far. Counts
 * the update (applied or skipped). Returns 0 or -ERANGE.
 */
int train_step_apply(struct train *T);

/* Where the driver stands: the counters of the file comment. */
struct train_pos {
    uint64_t epoch;             /* 0-based */
    uint64_t batch;             /* next micro-batch within the epoch */
    uint64_t micro;             /* micro-batches since the start of training (resumes included) */
    uint64_t update;            /* updates attempted since the start of training */
};
struct train_pos train_position(const struct train *T);

/* The pieces, borrowed, for tests and tools that look inside. */
struct rt_model *train_model(struct train *T);
struct rt_optim *train_optim(struct train *T);
const struct rt_scaler *train_scaler(const struct train *T); /* NULL without loss scaling; a step late (train_sync) */
/* The last micro-batch's sums, this rank's, of the last update applied (read from the device now if still
 * there: a host wait). */
const struct rt_loss_stats *train_last_loss(struct train *T);
/*
 * Reads now what the device holds for the host after the last update -- its
 * loss sums, clipping's norm, loss scaling's verdict (train_scaler's state,
 * the optimizer's step count) -- as the next update or the epoch's end
 * would: a host wait. Returns 0, or -ERANGE as that update would have
 * (a non-finite loss is remembered for the next control word; too many
 * skipped updates or a non-finite norm is the error).
 */
int train_sync(struct train *T);

/*
 * XXH64 of the parameters as this rank holds them (the "param digest"), and
 * the check that every rank holds the same: -EPROTO naming the ranks that
 * differ from rank 0 (every rank reaches the same verdict). Collective.
 */
uint64_t train_replicas_digest(struct train *T);
int train_replicas_check(struct train *T, uint64_t *digest);

/* ---- evaluation ------------------------------------------------------------------------ */

struct eval_cfg {
    const char *data;
    const char *checkpoint;     /* model.safetensors */
    const char *model;          /* NULL: from the checkpoint's metadata */
    uint32_t batch;
    int workers, threads;
    enum train_device device;
    enum train_amp amp;         /* as train's --amp: auto = bf16 where the device computes it */
    int tf32, nondeterministic; /* as train_cfg's: zero is strict fp32, deterministic */
};

struct eval_result {
    char model[64];             /* the checkpoint's model */
    double images;              /* samples evaluated (padding excluded) */
    double loss, accuracy;      /* means over them */
    double seconds;
};

/*
 * Loss and accuracy of the checkpoint on the dataset's test split, on one
 * rank. The checkpoint's metadata must match the dataset (input shape,
 * classes) and carries the normalisation. 0 or -errno with the message set.
 */
int train_evaluate_checkpoint(const struct eval_cfg *cfg, struct eval_result *res);

#endif
