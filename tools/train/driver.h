/*
 * driver.h (private to tools/train/) - the driver's state and the calls its
 * files make to each other. train.h is the public side.
 *
 * Names: a function carries the name of the file it lives in, `input_*` in
 * input.c, `epoch_*` in epoch.c, and so on; train.h's public calls add the
 * library's `train_` in front (`train_input_next` in input.c, `train_step_*`
 * in step.c), and the driver object's own (`train_create`, `train_loop`) live
 * in driver.c and loop.c. Errors: 0 or -errno with rt_errmsg() set; a call
 * that cannot fail returns void. Teardowns accept a half-built driver.
 */
#ifndef RT_TOOLS_TRAIN_DRIVER_H
#define RT_TOOLS_TRAIN_DRIVER_H

#include <signal.h>
#include <stdio.h>

#include <jansson.h>

#include "comm/comm.h"
#include "common/nvml.h"
#include "tools/train/train.h"

/* This process's first updates are the warm-up (cuDNN's searches, first allocations, the first late read):
 * --cuda-graph runs them op by op, host_waits_per_step leaves them out (steady_update). */
enum { WARMUP_UPDATES = 3 };

/*
 * The control word: each rank's bits for the update, OR-ed over the ranks
 * with the update's last collective (rt_bucketer_finish).
 */
enum train_ctl {
    CTL_STOP = 1u << 0,         /* a stop signal reached this rank: stop after this update */
    CTL_NONFINITE = 1u << 1,    /* this rank's loss became non-finite during the update */
    CTL_SIGTERM = 1u << 2,      /* the signal was SIGTERM ... */
    CTL_SIGUSR1 = 1u << 3,      /* ... or SIGUSR1 (the stop message names it) */
};

/*
 * Counters behind one meter. Sums are this rank's; the epoch's are
 * all-reduced at its end. Times in nanoseconds.
 */
struct train_span {
    uint64_t images;            /* real samples trained */
    uint64_t train_ns;          /* whole micro-batches: data wait, compute, reduction, update */
    uint64_t wait_ns;           /* waiting for the next batch */
    uint64_t comm_ns;           /* waiting for the gradient all-reduce after backward */
};

struct train_meter {
    struct rt_loss_stats ep_loss; /* this epoch's loss sums (global on rank 0 after a resume) */
    struct train_span epoch, run; /* this epoch so far; the whole run (resumes included) */
    struct train_span before;   /* the run's span when this process resumed it (zero on a fresh run) */
    uint64_t update_before;     /* the optimizer steps before this process */
    uint64_t run_micro;         /* micro-batches this process ran (not restored on resume) */
    uint64_t steady_images, steady_ns; /* after the first 3 of them: caches, pools and pages warm */
    uint64_t t_last;            /* the last micro-batch's end: an update's tail is timed from it */
    uint64_t epoch_t0, last_bar; /* the epoch's start and the progress bar's last draw */
};

/* late.c: an update's device results (loss sums, squared norm), read a step late. */
struct train_late_slot {
    void *host;                 /* struct late_host: the squared norm, then grad_accum loss sums */
    int pinned;                 /* host from rt_backend_host_alloc */
    struct rt_event *ready;     /* recorded after the copy into `host` */
    uint64_t update, epoch, batch0; /* where the update was, for the messages */
    uint32_t n;                 /* its micro-batches */
    int clipped;                /* the squared norm was copied */
    int scaled;                 /* loss scaling: the overflow flag and the scale were copied */
    int verdict_due;            /* read, the host's replay of the scaler's rule not yet taken */
    int pending;                /* committed, not yet read */
};
struct train_late {
    struct rt_loss_stats *dev;  /* device: 2 x grad_accum slots, update k's in half k % 2 */
    float *scale_dev;           /* loss scaling: the scale and its growth count, on the device */
    struct train_late_slot slot[2];
};

/* One batch in flight on the input side: its slot, device buffer (images, then labels) and copy. */
struct train_inflight {
    struct rt_batch *slot;
    const uint8_t *dev;
    const int32_t *labels_dev;
    uint64_t ticket;
};

struct train_input {
    struct rt_ring *ring;
    struct rt_loader *loader;
    struct rt_ring_allocator host_mem; /* the ring's slots in the backend's page-locked memory (CUDA) */
    struct train_inflight next; /* the batch after the current one, already on its way */
    uint8_t *syn_images;        /* the synthetic batch, host (its labels after the images) ... */
    int32_t *syn_labels;
    const uint8_t *syn_dev;     /* ... and on the device, uploaded once */
    uint64_t syn_ticket;
    uint64_t batches_per_epoch; /* micro-batches per epoch */
    char augment[192];          /* what the loader does to each image, for the banner */
    struct rt_batch_digest *digest; /* --batch-digest: every batch the step took, in order (loadbench --digest's) */
};

/*
 * The step profile (profile.c): each optimizer step's time split into the
 * phases below, kept as log-spaced histograms (2 % wide bins) so that p50 and
 * p99 cost no memory per step. Device phases (forward, backward, optimizer)
 * come from a timeline on the compute stream, the others from the host.
 */
enum prof_phase { PROF_DATA, PROF_COPY, PROF_FORWARD, PROF_BACKWARD, PROF_COMM, PROF_OPTIM, PROF_REST, PROF_STEP,
                  PROF_N };
enum { PROF_BINS = 1100, PROF_WARMUP = WARMUP_UPDATES }; /* the profile's warm-up is the run's */
/* The driver's own timeline marks (compute.h's rt_mark_kind are the model's). */
enum { MARK_MICRO = 100, MARK_OPTIM_START, MARK_OPTIM_END, MARK_GRAPH };

/* One set of the phases' histograms and the steps it counts. */
struct prof_hist {
    uint32_t (*bins)[PROF_BINS]; /* PROF_N rows */
    uint64_t steps;
};

/* The sets the steps go into: the run's and the epoch's (reset when an epoch starts), each as the steps after
 * the run's warm-up and as every step (for spans that hold none after it). */
enum prof_set { PROF_RUN, PROF_RUN_ALL, PROF_EPOCH, PROF_EPOCH_ALL, PROF_SETS };

/*
 * --profile-ops (profile.c): each op's own time on the compute stream, from the two marks the model puts around
 * every op it issues (rt_step_opts.per_op), summed per op name over the optimizer steps; the optimizer's span
 * (between step.c's marks) as one entry named "optimizer"; and each step's span on the stream, its first mark to
 * its last. Kept, as the step profile's histograms are, for every step and for the steps after the warm-up.
 */
enum { OPS_ALL, OPS_STEADY, OPS_SETS };
struct opprof_op {
    const char *name;           /* the op's member name in struct rt_ops (static), or "optimizer" */
    uint64_t ns[OPS_SETS];      /* its own time, summed */
    uint64_t calls[OPS_SETS];
};
struct train_opprof {
    struct opprof_op *op;       /* in the order first seen */
    int nop, cap;
    uint64_t span_ns[OPS_SETS]; /* the steps' spans on the stream, summed */
    uint64_t steps[OPS_SETS];
    uint64_t unpaired;          /* op marks without their pair (a timeline too small for the step) */
    const char **layer;         /* while tracing: the layer of each mark of the step (a scratch of the timeline's
                                 * capacity) */
};

/* The op profile's categories: the --json keys in this order (profile_op_category_key), idle last. */
enum op_cat { OPC_CONV_FWD, OPC_DATA_GRAD, OPC_WEIGHT_GRAD, OPC_BATCHNORM, OPC_ELEMENTWISE, OPC_POOLING, OPC_LOSS,
              OPC_OPTIMIZER, OPC_COPIES, OPC_OTHER, OPC_IDLE, OPC_N };

/* The op profile in ms per optimizer step: of the steps after the warm-up, or of every step where there are none
 * after it (warm). rows: the ops, the most time first (allocated; profile_op_stats_free). */
struct op_row {
    const char *name;
    enum op_cat cat;
    double ms, calls;           /* per step */
};
struct op_stats {
    uint64_t steps;
    int warm;
    double step_ms;             /* the mean span of a step on the stream */
    double cat_ms[OPC_N];       /* they add up to step_ms (idle: the span less the ops' own times) */
    struct op_row *row;
    int nrow;
};

/* One optimizer step's profile: its host-side phases as it runs, its device phases when its timeline is read. */
struct prof_step {
    uint64_t cur[PROF_N];       /* ns */
    uint64_t t_step0, t_end;    /* its start and end on the host */
    uint64_t update;            /* its number */
    uint32_t micro;             /* its micro-batches */
    int per_layer;              /* it marked every layer (tracing) */
    double scale;               /* the loss scale it ran at */
    uint64_t comm_dev;          /* the compute stream's wait for the all-reduce, from the timeline */
    struct rt_timeline *tl;     /* its marks */
    int pending;                /* ended, timeline not read yet */
};

struct train_profile {
    struct prof_step now;       /* the step in progress */
    struct prof_step late;      /* the step before it, read at the end of this one (no host wait) */
    uint64_t steps_seen;        /* the steps this process profiled: the first PROF_WARMUP are the warm-up */
    struct prof_hist set[PROF_SETS];
    struct rt_timeline *tls[2]; /* on the compute stream: the steps use them in turn */
    struct rt_timeline *tl;     /* the step in progress's */
    int per_layer;              /* this step marks every layer (tracing) */
    struct train_opprof ops;    /* --profile-ops */
};

/* One rank's p50s, ns, as the verdict compares the ranks (compute: forward + backward). */
struct prof_rank {
    double data, step, comm, compute;
};

/* The ranks the verdict names, with their p50s: the largest data-wait share, the most and the least
 * compute, the least exposed-comm share (the lowest rank among equals). */
enum { PICK_WORST_DATA, PICK_SLOW, PICK_FAST, PICK_LEAST_COMM, PICK_N };
struct prof_picks {
    int rank[PICK_N];
    struct prof_rank r[PICK_N];
};

/* Percentiles of each phase, ns, and the verdict drawn from them (profile_gather). */
struct prof_stats {
    double p50[PROF_N], p99[PROF_N];
    uint64_t steps;
    int warm;                   /* the warm-up steps are included (a short run) */
};
struct prof_verdict {
    int have;
    struct prof_stats st;
    char limit[16], evidence[320], advice[480];
};

/* --trace (tracefile.c): the recorder (its window is cfg.trace_first/last/all) and the file it made. */
struct train_trace {
    struct rt_trace *rec;       /* NULL: not tracing */
    uint64_t file_bytes;        /* the file's bytes, or all the ranks' files' */
    int files;                  /* files written: 1 merged, the world split (0: none yet) */
    char pattern[4200];         /* split: the files as a shell pattern, "trace.rank*.json" */
};

/* What the epoch's end and the summary report. */
struct train_results {
    double train_loss, train_acc, val_loss, val_acc; /* the last epoch's, global */
    int have_val;
    double best_acc;
    uint32_t streak;            /* epochs in a row at the target accuracy */
    uint64_t epochs_done;
    double run_comm_frac;       /* exposed communication over the run, averaged over the ranks */
    double host_waits_per_step; /* the most over the ranks; NaN: no steady step ran */
    char batch_digest[17];      /* --batch-digest: this rank's (rt_batch_digest_hex), else "" */
};

/* Start-up, in the order it happens: each stamp (rt_now_ns) ends the part named after it (startup.c). */
enum train_boot {
    BOOT_EXEC,          /* the process started (exec) */
    BOOT_COMM_BEGIN,    /* "process start": libraries loaded, options read, the process group begins */
    BOOT_MPI_INIT,      /* "MPI init": MPI_Init_thread */
    BOOT_RANK_TABLE,    /* "rank table": the node split, the ranks' hosts, pids and CPUs */
    BOOT_MESH,          /* "lifeline mesh": the watchdog's connections */
    BOOT_DATA,          /* "data open": the checkpoint directory, staging, the dataset's manifest */
    BOOT_COMPUTE,       /* "compute": the backend (and NCCL) */
    BOOT_MODEL,         /* "model": the model, its bucket plan, a resumed checkpoint */
    BOOT_SYNC,          /* "initial sync": rank 0's parameters broadcast */
    BOOT_LOADER,        /* "loader open": trace, profile, the loader and its ring */
    BOOT_BANNER,        /* "banner": the banner with its rank table */
    BOOT_FIRST_BATCH,   /* "first batch": the first batch in hand */
    BOOT_FIRST_STEP,    /* "first step": the first update done */
    BOOT_N
};

/* Start-up over the ranks (startup_gather, collective): per part, from when the last rank finished the
 * part before to when the last rank finished it (so the parts add up), the first exec to the last rank's
 * first update, and what each rank holds. */
struct train_startup {
    int have;
    double part_s[BOOT_N];      /* [i]: the last rank's stamp i - the last rank's stamp i-1; [0] unused */
    double total_s;             /* the first rank's exec to the last rank's first update */
    double exec_unix, first_step_unix; /* the first rank's exec, the last rank's first update (Unix s) */
    double rss_max_mb, rss_sum_mb; /* peak resident memory, per rank (max) and over the ranks */
    int fds_max, peers_max;     /* open file descriptors and lifeline connections per rank (max) */
    int threads_max;            /* threads per rank (max) */
};

struct train {
    struct train_cfg cfg;       /* a copy, defaults resolved */
    struct train_faults faults;
    /* process group */
    struct rt_comm *comm;
    int own_comm;               /* created here (else borrowed from cfg) */
    struct rt_bucketer *bucketer;
    struct rt_event **bucket_done; /* per bucket (fence.c), on the MPI path; NULL in NCCL mode */
    int nbucket_done;
    struct rt_nccl *nccl;       /* GPUs across ranks: the gradient all-reduce; NULL otherwise */
    int rank, world, root;      /* root: this is rank 0, which prints and saves */
    /* data */
    char data_path[4096];       /* --data, or where --stage-to put it */
    struct rt_dataset *ds;
    const struct rt_dataset_info *info;
    uint32_t c, h, w, classes;
    float mean[4], std[4];
    int norm_from_data;
    int val_split;              /* -1: no validation */
    /* compute */
    struct rt_backend *be;
    struct rt_model *model;
    float *host;                /* a host copy of the parameters (replicas.c), made with the model */
    struct rt_optim *opt;
    struct rt_sched sched;
    struct rt_sched sched_head; /* --lr-head: the classifier's, the same schedule from its own peak */
    int init_loaded;            /* --init: tensors loaded from the file (0: none, a resumed run) */
    int init_head_reset;        /* --init --reset-head: the classifier's tensors left at their initialisation */
    enum rt_dtype act;          /* activations' type (--amp) */
    int scaling;                /* dynamic loss scaling on */
    struct rt_scaler scaler;
    struct train_profile prof;
    struct prof_verdict verdict;
    struct train_trace tr;
    struct rt_nvml_sampler *gpu; /* the GPU's counters (NVML), NULL on the CPU or without NVML */
    /* the stages' meeting points */
    struct train_input in;
    struct train_pos pos;
    struct train_meter meter;
    /* the update in progress */
    struct rt_loss_stats step_loss; /* the last micro-batch read back (late.c): its loss sums */
    /* --cuda-graph: the micro-batches replayed as graphs after the warm-up (step.c); why not, when not (a
     * run-level reason here, a model-level one from rt_model_graph_status, said once). */
    int graph_on;
    const char *graph_why;
    struct train_late late;
    /* Host waits for the compute stream (rt_backend_host_waits) inside steady steps: the count when the
     * update began, the sum over the steady updates so far, and how many (train --json host_waits_per_step). */
    uint64_t waits_at_begin, waits_sum, waits_steps;
    uint64_t step_comm_ns;      /* the last update's wait for its all-reduce */
    uint32_t ctl;               /* the last update's control word, OR-ed over the ranks */
    char nonfinite[400];        /* this rank's first non-finite loss of the update, for the message */
    /* outcome */
    struct train_results res;
    enum train_stop stop;
    FILE *metrics;
    double *rank_ips;           /* --metrics or --report: each rank's images/s this epoch (world entries) */
    /* rank 0, for the summary, state.json and --report (NULL where not kept) */
    json_t *facts;              /* the banner's lines: [[key, text], ...] */
    json_t *records;            /* --report: the run's epoch records, the metrics file's earlier ones included */
    int records_earlier;        /* --report on a resumed run: 1 the earlier epochs were read back, 0 not */
    json_t *summary;            /* --report: the --json summary object */
    json_t *state;              /* --report: the last state.json written */
    char ckpt_id[64];
    json_t *ckpt_state;         /* --resume: the state.json read before the model is made (checkpoint_plan) */
    /* --resume of a checkpoint from another world size (checkpoint_plan): what it was; world 0 where the same */
    struct train_moved {
        int world;
        uint32_t batch, accum;
    } moved;
    /* The run's --batch-size and --grad-accum, which state.json keeps: cfg.batch and cfg.grad_accum are what this
     * world size runs them as (another after a move: checkpoint.c, move_world). */
    uint32_t asked_batch, asked_accum;
    uint64_t ckpt_micro;        /* the position (pos.micro) whose checkpoint is on disk; UINT64_MAX: none yet */
    uint64_t ckpt_saves;        /* checkpoints this process wrote */
    uint64_t t_created;
    uint64_t boot[BOOT_N];      /* start-up stamps (enum train_boot), 0 where not reached */
    struct train_startup startup;
};

/* Update `update` (a position's count) is past this process's warm-up. */
static inline int steady_update(const struct train *T, uint64_t update)
{
    return update >= WARMUP_UPDATES + T->meter.update_before;
}

/* loop.c: set by its SIGTERM/SIGUSR1 handler, read once per update (step_control_word) */
extern volatile sig_atomic_t loop_stop_signal;

/* startup.c */
void startup_mark(struct train *T, enum train_boot k); /* stamp k now, once */
void startup_gather(struct train *T);       /* collective: fills T->startup */
const char *startup_part_name(enum train_boot k);
const char *startup_part_key(enum train_boot k);

/* input.c */
int input_create(struct train *T);          /* the loader and its ring, or the synthetic batch; 0 or -errno */
/* Updates per epoch, a short last one counted (train_step_size: an update never spans two epochs). */
uint64_t input_updates_per_epoch(const struct train *T);
void input_destroy(struct train *T);        /* none made is fine; the batch fetched ahead goes back */
void input_labels(const struct rt_batch *slot, int32_t *labels); /* padding samples -> -1 */

/* step.c; train_advance: the one place the position moves -- past a micro-batch (batch, micro), past an update,
 * or from an epoch's end to the start of the next */
enum train_move { MOVE_MICRO, MOVE_UPDATE, MOVE_EPOCH };
void train_advance(struct train *T, enum train_move m);
uint32_t step_control_word(const struct train *T); /* this rank's enum train_ctl bits for the update */
/* -ERANGE naming this rank's non-finite loss (T->nonfinite), or another rank's, read a step late. */
int step_nonfinite_error(const struct train *T);

/* watch.c: the step's observation (meters, profile, progress, trace window), nothing trained */
void watch_run_begin(struct train *T);
void watch_update_begin(struct train *T);
void watch_micro_end(struct train *T, const struct train_batch *b);
void watch_update_end(struct train *T);
void watch_epoch_begin(struct train *T);    /* the epoch's meters and profile start over */

/* fence.c: the buckets' events, for rt_bucket_opts' fence_mark / fence_wait */
int fence_create(struct train *T, int n);   /* 0 or -errno */
void fence_destroy(struct train *T);        /* none made is fine */
void fence_mark(void *ctx, int bucket);
void fence_wait(void *ctx, int bucket);
void fence_stream_call(void *ctx, void (*fn)(void *arg), void *arg); /* rt_bucket_opts.stream_call */

/* epoch.c */
int epoch_done(const struct train *T);      /* 1 when the position is at the epoch's end */
int epoch_close(struct train *T, int partial); /* 1: the target accuracy held long enough; 0; -errno */
int epoch_next(struct train *T);            /* the full epoch's close, then position and checkpoint; 1: target */

/* evaluate.c: loss sums over a split, on one rank or (comm) summed over all. 0 or -errno. */
int evaluate_split(struct rt_model *m, struct rt_dataset *ds, enum rt_split split, uint32_t image_size,
                   uint32_t batch, int workers,
                   enum rt_pin pin, struct rt_comm *comm, const float *mean, const float *std,
                   struct rt_loss_stats *out);

/* checkpoint.c (0 or -errno unless said) */
int checkpoint_save(struct train *T);       /* once per position: again at the same one is a no-op */
int checkpoint_plan(struct train *T);       /* --resume, before the model: read and check; another world's batch */
int checkpoint_load(struct train *T);       /* 1 loaded, 0 none there, -errno */
int checkpoint_resume(struct train *T);     /* --resume: load, agree across ranks, say where */
/* DIR/finished, which a job script tests to tell a run that ended as planned (its epochs, or the
 * target accuracy) from one stopped by a signal with its checkpoint saved (requeue it): written by
 * rank 0 after the last checkpoint (finished = 1), removed when a run starts (0). */
int checkpoint_mark_finished(struct train *T, int finished);
void checkpoint_json_floats(char *buf, size_t len, const float *v, uint32_t n); /* "[a, b, c]" */
json_t *checkpoint_command(const struct train *T); /* cfg.argv as a JSON array (a new reference), NULL: none */

/* replicas.c */
int replicas_create(struct train *T);       /* the host copy, after the model; 0 or -ENOMEM */
void replicas_destroy(struct train *T);     /* none made is fine */
void replicas_sync_from_root(struct train *T, enum rt_model_buf which, const char *what); /* collective */
int replicas_due(const struct train *T);    /* --check-replicas: 1 after every Nth update */

/* report.c */
void report_banner(struct train *T);         /* prints the banner; keeps its lines in T->facts (rank 0) */
void report_progress(struct train *T);
void report_epoch(struct train *T, int partial, double time_s, double ips, double wait, double comm,
                  const char *val);
void report_stopped(const struct train *T);
void report_profile(const struct train *T); /* the step profile's table and verdict (rank 0) */
void report_summary(struct train *T, double wall_s); /* with --report keeps the summary in T->summary */
int report_records_open(struct train *T);   /* --report: the record list, a resumed run's earlier records
                                             * read back from --metrics; 0 or -errno */
int report_page(struct train *T);           /* --report: rank 0 writes the HTML page; 0 or -errno */
void report_startup(const struct train *T); /* start-up parts and per-rank resources (rank 0) */
void report_op_profile(const struct train *T); /* --profile-ops: the categories and the top ops (rank 0) */
void report_clear_bar(const struct train *T);

/* meter.c */
void meter_micro(struct train_meter *m, const struct train_batch *b); /* its times */
void meter_update(struct train_meter *m, uint64_t comm_ns); /* the update's tail: reduction and optimizer */
void meter_loss(struct train_meter *m, const struct rt_loss_stats *loss); /* a micro-batch's sums, read late */
void meter_comm(struct train_meter *m, uint64_t ns); /* exposed communication the stream saw, read late */

/* late.c: see there. 0 or -errno where an int. */
int late_create(struct train *T);
void late_destroy(struct train *T);         /* none made is fine */
void late_begin(struct train *T);           /* an update starts: its slot */
struct rt_loss_stats *late_stats_dev(struct train *T, uint32_t i); /* micro-batch i's device sums */
void late_micro_done(struct train *T);      /* a micro-batch's sums were written */
void late_norm(struct train *T, const float *norm_sq_dev); /* copy clipping's squared norm out */
void late_commit(struct train *T);          /* after the optimizer: copy the sums out, record the event */
const float *late_scale_dev(const struct train *T); /* loss scaling: the device's scale (NULL: none) */
void late_unscale(struct train *T);         /* loss scaling's unscale, scale update and skip, queued */
int late_scaler(struct train *T);           /* the host's replay of the scaler for what was read: -ERANGE */
int late_collect_previous(struct train *T); /* read the update before this one (no host wait): -ERANGE */
int late_flush(struct train *T);            /* read whatever is pending (a host wait): -ERANGE */
void meter_epoch_reset(struct train_meter *m);

/* profile.c */
int profile_create(struct train *T);        /* 0 or -errno */
void profile_destroy(struct train *T);      /* none made is fine */
void profile_update_begin(struct train *T);
void profile_micro(struct train *T, const struct train_batch *b); /* its data wait and copies */
void profile_model_opts(struct train *T, struct rt_step_opts *so); /* the timeline for rt_model_step */
void profile_update_end(struct train *T);   /* end the step; read the one before it, add it */
void profile_flush(struct train *T);        /* read the last step's timeline now (a host wait), add it */
void profile_stats(const struct train *T, struct prof_stats *out);       /* the run's steps */
void profile_epoch_stats(const struct train *T, struct prof_stats *out); /* this epoch's steps */
void profile_epoch_reset(struct train *T);
/* The picks from every rank's p50s (`world` entries). */
void profile_pick(const struct prof_rank *ranks, int world, struct prof_picks *out);
/* What limits the run (p->limit, evidence, advice) from this rank's percentiles and the picked ranks. */
void profile_verdict(const struct train *T, const struct prof_stats *st, const struct prof_picks *k,
                     struct prof_verdict *p);
void profile_gather(struct train *T);       /* the ranks' figures and the verdict into T->verdict; collective */
const char *profile_phase_name(enum prof_phase k); /* "data wait" ... */
const char *profile_phase_key(enum prof_phase k);  /* "data" ...: the --json keys */
/* --profile-ops: the category of an op ("conv2d_bwd_filter" -> OPC_WEIGHT_GRAD, "optimizer" -> OPC_OPTIMIZER,
 * an op of no category -> OPC_OTHER), the categories' --json keys ("weight_grad"), and the figures (0, or -ENOMEM
 * with nothing to free; none yet: steps 0). */
enum op_cat profile_op_category(const char *op);
const char *profile_op_category_key(enum op_cat k);
int profile_op_stats(const struct train *T, struct op_stats *out);
void profile_op_stats_free(struct op_stats *s); /* a zeroed struct is fine */

/* tracefile.c */
int tracefile_create(struct train *T);      /* --trace: the recorder, before the loader starts */
void tracefile_window(struct train *T, uint64_t update, int begin); /* recording on/off around the window */
int tracefile_finish(struct train *T, uint64_t t_end); /* t_end: just after the run's last collective; collective */
void tracefile_destroy(struct train *T);    /* none made is fine */
void tracefile_gpu_create(struct train *T); /* NVML where the backend is a GPU; silent without it */
void tracefile_gpu_destroy(struct train *T); /* none made is fine */

/* faults.c: the named points */
/* How the summary, state.json and the banner name the run's device ("cuda" or "cpu") and --amp precision ("off"
 * for fp32, else the activation type's name). */
const char *train_device_name(const struct train *T);
const char *train_amp_name(enum rt_dtype act);

void faults_before_compute(struct train *T);
void faults_sample_log(const struct train *T, const struct train_batch *b, uint32_t i); /* micro-batch i's ids */
void faults_step_opts(const struct train *T, struct rt_step_opts *so);
void faults_before_unscale(struct train *T);
int faults_data_ended(const struct train *T);         /* 1: the input's data ends before this micro-batch */
void faults_before_allreduce(const struct train *T); /* on the comm thread, before a bucket's all-reduce */

#endif
