/*
 * trainer.h - the training driver behind `ringtrain train` and `ringtrain
 * eval`: it wires the stages together (loader -> ring -> compute model ->
 * optimizer), runs epochs, validation, checkpoints, metrics and signals.
 * It holds no stage logic of its own; the stages are the libraries.
 */
#ifndef RT_TOOLS_TRAINER_H
#define RT_TOOLS_TRAINER_H

#include <stdint.h>

#include "compute/compute.h"
#include "loader/loader.h"
#include "staging/ring.h"

/* --device: where compute runs. */
enum train_device { DEVICE_AUTO = 0, DEVICE_CPU, DEVICE_CUDA };

/* Parses "auto", "cpu" or "cuda"; 0 or -EINVAL. */
int train_device_parse(const char *s, enum train_device *out);

/*
 * Opens the compute backend --device asks for: cuda fails at once with the
 * reason when no usable GPU is there; auto takes a GPU when there is one,
 * else the CPU with `threads`. Which GPU: comm's rt_gpu_preflight() over the
 * GPUs this process sees and its node-local rank among `local_world`
 * (printing its note on Slurm's per-task GPU binding). 0 or -errno with
 * rt_errmsg() set.
 */
int train_open_backend(enum train_device dev, int local_rank, int local_world, int threads,
                       struct rt_backend **out);

/* --amp: activation precision. auto: bf16 on a GPU that has it, else fp16 on a GPU, fp32 on the CPU. */
enum train_amp { AMP_AUTO = 0, AMP_OFF, AMP_BF16, AMP_FP16 };

/* Parses "auto", "off", "bf16" or "fp16"; 0 or -EINVAL. */
int train_amp_parse(const char *s, enum train_amp *out);

/* The activation type --amp gives on backend `be`: 0, or -ENOTSUP with the reason. */
int train_amp_resolve(enum train_amp amp, struct rt_backend *be, enum rt_dtype *out);

struct train_cfg {
    const char *data;           /* dataset directory (NULL: synthetic data with the shape below) */
    const char *model;
    uint64_t epochs;
    uint32_t batch;             /* per rank */
    struct rt_optim_opts optim;
    float lr;
    enum rt_sched_kind sched;
    double warmup_epochs;       /* < 0: the schedule's default */
    double step_epochs;         /* STEP: decay every this many epochs */
    float gamma;                /* STEP: factor */
    float label_smoothing;
    uint32_t grad_accum;        /* micro-batches per optimizer step */
    float clip_grad_norm;       /* 0: no clipping */
    uint64_t seed;
    int workers;                /* loader threads (0: default) */
    int threads;                /* compute threads (0: the CPUs this process may use) */
    double target_accuracy;     /* 0..1; 0: none */
    uint32_t patience;          /* epochs in a row at the target before stopping */
    const char *checkpoint_dir; /* NULL: no checkpoints */
    int resume;
    const char *metrics;        /* JSON Lines file, NULL: none */
    int synthetic;              /* random batches made once on the device */
    uint32_t syn_c, syn_h, syn_w, syn_classes; /* synthetic shape without --data */
    uint64_t max_steps;         /* stop after this many optimizer steps (0: no limit) */
    int json;                   /* end with a JSON summary line */
    int progress;               /* 1: progress bar, 0: none, -1: when stderr is a tty */
    struct rt_aug aug;
    int aug_default;            /* aug not given: crop,flip for 3-channel data, none otherwise */
    enum rt_shuffle shuffle;
    enum rt_pin pin;
    enum train_device device;
    enum train_amp amp;
    int loss_scale;             /* -1: dynamic with fp16, off otherwise; 0: off; 1: dynamic */
    uint32_t max_skipped_steps; /* loss scaling: stop after this many overflowed steps in a row (0: 20) */
    /* several ranks */
    double bucket_cap_mb;       /* gradient bucket size */
    int no_overlap;             /* all-reduce after backward */
    double comm_timeout, peer_timeout; /* seconds; 0: the defaults */
    uint64_t check_replicas;    /* compare parameter digests every N steps (0: at the end only) */
    const char *stage_to;       /* stage --data under this node-local directory first */
};

/* Runs the training described by cfg; prints the banner, epoch lines and the
 * summary. Returns a process exit code (0: done, including a stop on
 * SIGTERM/SIGUSR1 after saving; 1: failure, with the message printed). */
int train_run(const struct train_cfg *cfg);

struct eval_cfg {
    const char *data;
    const char *checkpoint;     /* model.safetensors */
    const char *model;          /* NULL: from the checkpoint's metadata */
    uint32_t batch;
    int workers, threads;
    enum train_device device;
    int json;
};

/* Evaluates a checkpoint on the test split; prints loss and accuracy. */
int eval_run(const struct eval_cfg *cfg);

#endif
