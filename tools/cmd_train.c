/*
 * cmd_train.c - `ringtrain train`: options named as PyTorch users know them,
 * parsed into struct train_cfg; the pipeline driver (tools/train/) runs the
 * training and prints as it goes.
 */
#include <inttypes.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "tools/cli.h"

/* What `train` reads its options into: the driver's config, the options train shares with eval, and the
 * ones settled after parsing (--aug parsed, --weight-decay's default by optimizer). */
struct train_args {
    struct train_cfg c;
    struct cli_run_opts run;
    const char *aug; /* NULL: the loader's default */
    double wd;       /* < 0: the optimizer's default */
};

static int parse_optim(const char *arg, void *field) { return rt_optim_kind_parse(arg, field); }
static int parse_sched(const char *arg, void *field) { return rt_sched_kind_parse(arg, field); }
static int parse_amp(const char *arg, void *field) { return train_amp_parse(arg, field); }
static int parse_allreduce(const char *arg, void *field) { return train_allreduce_parse(arg, field); }

/* --trace-steps A:B (steps A to B-1) or all. */
static int parse_trace_steps(const char *cmd, const char *arg, void *cfg)
{
    struct train_cfg *c = &((struct train_args *)cfg)->c;
    char tail;
    if (!strcmp(arg, "all"))
        c->trace_all = 1;
    else if (sscanf(arg, "%" SCNu64 ":%" SCNu64 "%c", &c->trace_first, &c->trace_last, &tail) != 2 ||
             c->trace_last <= c->trace_first)
        return cli_usage_error(cmd, "--trace-steps %s: expected A:B with A < B (steps A to B-1), or all", arg);
    return 0;
}

static const struct cli_choice loss_scales[] = {{"dynamic", 1, 0}, {"off", 0, 0}, {NULL, 0, 0}};
static const struct cli_choice trace_splits[] = {
    {"auto", TRACE_SPLIT_AUTO, 0}, {"merged", TRACE_SPLIT_MERGED, 0}, {"rank", TRACE_SPLIT_RANK, 0}, {NULL, 0, 0}};
static const struct cli_choice graphs[] = {{"on", 1, 0}, {"off", 0, 0}, {"auto", -1, 0}, {NULL, 0, 0}};

#define F(member) CLI_FIELD(struct train_args, member)
#define C(member) CLI_FIELD(struct train_args, c.member)
static const struct cli_opt train_opts[] = {
    {CLI_SHARED(CLI_O_DATA), .help = "packed dataset (omit with --synthetic-data for 3xSxS images, S of\n"
                                     "--image-size (default 32), --num-classes (default 10))"},
    {CLI_SHARED(CLI_O_MODEL), .help_fn = rt_model_names,
     .help = "\n(default mnist-net: the fastest on CPUs; the ResNets for real CIFAR)"},
    {.name = "epochs", .arg = "N", .kind = CLI_UINT, C(epochs), .lo = 1,
     .help = "passes over the training split (default 10)"},
    {.name = "init", .arg = "FILE", .kind = CLI_STR, C(init),
     .help = "start from these weights: a safetensors state_dict with PyTorch's names\n"
             "(a ringtrain checkpoint's model.safetensors, or torchvision's; a .pth:\n"
             "python3 -m ringtrain.convert FILE.pth FILE.safetensors first)"},
    {.name = "reset-head", .kind = CLI_FLAG, C(reset_head),
     .help = "--init: the classifier starts afresh (PyTorch's init) for this dataset's\n"
             "classes, whatever the file's"},
    {.name = "freeze", .arg = "GLOBS", .kind = CLI_STR, C(freeze),
     .help = "layers not trained, by parameter name: 'conv1.*,bn1.*,layer1.*' (no\n"
             "gradient, no optimizer state, not all-reduced; batchnorm in eval mode)"},
    {.name = "lr-head", .arg = "LR", .kind = CLI_REAL, C(lr_head), .dhi = 1e6,
     .help = "the classifier's peak learning rate (default --lr)"},
    {CLI_SHARED(CLI_O_BATCH), .help = "per rank (default 128)"},
    {.name = "lr", .arg = "LR", .kind = CLI_REAL, C(lr), .dhi = 1e6, .help = "peak learning rate (default 0.1)"},
    {.name = "optimizer", .arg = "NAME", .kind = CLI_PARSE, C(optim.kind), .parse = parse_optim,
     .help = "sgd (default), adam, adamw"},
    {.name = "momentum", .arg = "M", .kind = CLI_REAL, C(optim.momentum), .dhi = 1,
     .help = "SGD momentum (default 0.9)"},
    {.name = "nesterov", .kind = CLI_FLAG, C(optim.nesterov), .help = "Nesterov momentum"},
    {.name = "weight-decay", .arg = "WD", .kind = CLI_REAL, F(wd), .dhi = 1e3,
     .help = "L2 penalty; decoupled for adamw (default 5e-4 for sgd, 0 for adam, 1e-2 for adamw)"},
    {.name = "schedule", .arg = "NAME", .kind = CLI_PARSE, C(sched), .parse = parse_sched,
     .help = "constant, step, cosine (default), onecycle"},
    {.name = "warmup-epochs", .arg = "E", .kind = CLI_REAL, C(warmup_epochs), .dhi = 1e6,
     .help = "linear warm-up (default 0; onecycle: 30% of the run)"},
    {.name = "step-epochs", .arg = "E", .kind = CLI_REAL, C(step_epochs), .dlo = 1e-6, .dhi = 1e6,
     .help = "step schedule: decay every E epochs (default 30)"},
    {.name = "gamma", .arg = "G", .kind = CLI_REAL, C(gamma), .dhi = 1,
     .help = "step schedule: decay factor (default 0.1)"},
    {.name = "label-smoothing", .arg = "EPS", .kind = CLI_REAL, C(label_smoothing), .dhi = 1,
     .help = "as CrossEntropyLoss(label_smoothing=EPS) (default 0)"},
    {.name = "grad-accum", .arg = "K", .kind = CLI_UINT, C(grad_accum), .lo = 1, .hi = 1u << 20,
     .help = "micro-batches per optimizer step (default 1)"},
    {.name = "clip-grad-norm", .arg = "MAX", .kind = CLI_REAL, C(clip_grad_norm), .dhi = 1e30,
     .help = "clip the global gradient norm (default off)"},
    {.name = "seed", .arg = "S", .kind = CLI_UINT, C(seed),
     .help = "weights, data order, augmentation, dropout (default 0)"},
    {.name = "aug", .arg = "SPEC", .kind = CLI_STR, F(aug),
     .help = "none, or a comma list of crop[=PAD], reflect, flip, alternate-flip,\n"
             "brightness=V, contrast=V, saturation=V, jitter=V, erase[=P[:SMIN:SMAX\n"
             "[:RMIN:RMAX]]], cutout=SIZE (torchvision's RandomCrop, RandomHorizontalFlip,\n"
             "ColorJitter, RandomErasing; docs/TRAINING.md). Default crop,flip for\n"
             "3-channel data, none otherwise. Datasets packed with --max-side: crop\n"
             "is RandomResizedCrop(S) (crop-scale=SMIN:SMAX, crop-ratio=RMIN:RMAX set\n"
             "its ranges); without it, Resize + CenterCrop"},
    {.name = "image-size", .arg = "S", .kind = CLI_UINT, C(image_size), .lo = 1, .hi = 4096,
     .help = "datasets packed with --max-side (images of any size): train on S x S\n"
             "crops; validation uses Resize(S/0.875) + CenterCrop(S). --synthetic-data\n"
             "without --data: the images are 3 x S x S (default 32)"},
    {.name = "num-classes", .arg = "K", .kind = CLI_UINT, C(syn_classes), .lo = 2, .hi = 1u << 20,
     .help = "--synthetic-data without --data: the class count (default 10)"},
    {.name = "shuffle", .arg = "MODE", .kind = CLI_CHOICE, C(shuffle), .choices = cli_shuffle_choices,
     .help = "exact (default), window, none"},
    {CLI_SHARED(CLI_O_WORKERS), .help = "loader threads (default 1)"},
    {CLI_SHARED(CLI_O_THREADS), .help = "compute threads (default: the CPUs this process may use)"},
    {CLI_SHARED(CLI_O_DEVICE), .help = "auto (default: a GPU when there is one), cpu or cuda"},
    {.name = "amp", .arg = "P", .kind = CLI_PARSE, C(amp), .parse = parse_amp,
     .help = "auto (default: bf16 where the device has it -- GPUs from compute 8.0,\n"
             "CPUs with AVX512_BF16 or AMX --, else fp16 on a GPU, fp32 on a CPU),\n"
             "off (fp32), bf16 or fp16: activations in 16 bits, fp32 weights"},
    {CLI_SHARED(CLI_O_TF32),
     .help = "GPU: fp32 convolutions on TF32 tensor cores, inputs rounded to a 10-bit\n"
             "mantissa with fp32 sums, as PyTorch's default (cudnn.allow_tf32); linear\n"
             "layers stay strict fp32 as PyTorch's matmuls. TF32 is deterministic: a\n"
             "resume stays exact (default on; off: strict fp32; no effect on the CPU)"},
    {CLI_SHARED(CLI_O_DETERM),
     .help = "\nGPU: only cuDNN algorithms that repeat bit for bit (default on); off lets\n"
             "cuDNN take faster ones that sum with atomics: two runs differ in the last\n"
             "bits and a resume is no longer exact (no effect on the CPU)"},
    {.name = "loss-scale", .arg = "MODE", .kind = CLI_CHOICE, C(loss_scale), .choices = loss_scales,
     .help = "dynamic (default with fp16) or off (default otherwise)"},
    {.name = "max-skipped-steps", .arg = "K", .kind = CLI_UINT, C(max_skipped_steps), .lo = 1, .hi = 1000000,
     .help = "loss scaling: stop after K overflowed steps in a row (default 20)"},
    {.name = "target-accuracy", .arg = "A", .kind = CLI_REAL, C(target_accuracy), .dhi = 100,
     .help = "stop once val accuracy >= A (0..1 or a percentage) ..."},
    {.name = "patience", .arg = "N", .kind = CLI_UINT, C(patience), .lo = 1, .flags = CLI_CLAMP,
     .help = "... for N epochs in a row (default 1)"},
    {.name = "checkpoint-dir", .arg = "DIR", .kind = CLI_STR, C(checkpoint_dir),
     .help = "save model.safetensors, optimizer.safetensors, state.json each epoch\n"
             "and on SIGTERM/SIGUSR1 (finish the step, save, exit 0)"},
    {.name = "resume", .kind = CLI_FLAG, C(resume),
     .help = "continue from --checkpoint-dir (starts fresh if it holds none);\n"
             "on any world size that shares out its global batch"},
    {.name = "amp-change", .kind = CLI_FLAG, C(amp_change),
     .help = "--resume a checkpoint trained at another --amp precision"},
    {.name = "metrics", .arg = "FILE", .kind = CLI_STR, C(metrics), .help = "JSON Lines, one object per epoch"},
    {.name = "report", .arg = "FILE", .kind = CLI_STR, C(report),
     .help = "at the end, one HTML page of the run's charts (as `ringtrain report`)"},
    {.name = "synthetic-data", .kind = CLI_FLAG, C(synthetic),
     .help = "random batches made once on the device: measures compute alone"},
    {.name = "steps", .arg = "N", .kind = CLI_UINT, C(max_updates), .help = "stop after N optimizer steps"},
    {.name = "no-progress", .kind = CLI_SET, C(progress), .set = 0,
     .help = "no progress bar (shown when stderr is a terminal)"},
    {.name = "pin", .kind = CLI_SET, C(pin), .set = RT_PIN_ON,
     .help = "require page-locked batch slots: stop with the fix when `ulimit -l`\n"
             "is too low (default: locked where allowed, else pageable and said)"},
    {.name = "no-pin", .kind = CLI_SET, C(pin), .set = RT_PIN_OFF,
     .help = "pageable batch slots (on a GPU: no cudaHostAlloc, no copy overlap)"},
    {CLI_SHARED(CLI_O_JSON), .help = "end with one JSON line summing up the run"},
    {.name = "batch-digest", .kind = CLI_FLAG, C(batch_digest),
     .help = "print one digest over every batch the steps took (in --json too): the\n"
             "same as loadbench --digest and the Python Loader's for the same options"},
    {.name = "trace", .arg = "FILE", .kind = CLI_STR, C(trace),
     .help = "Chrome trace of the pipeline (Perfetto, chrome://tracing): every thread,\n"
             "the compute stream's layers, the buckets; one file, or one per rank (--trace-split)"},
    {.name = "trace-steps", .arg = "A:B|all", .kind = CLI_CUSTOM, .custom = parse_trace_steps,
     .help = "optimizer steps recorded (default 3:13: ten after the warm-up)"},
    {.name = "trace-mb", .arg = "MB", .kind = CLI_REAL, C(trace_mb), .dlo = 1, .dhi = 65536,
     .help = "memory for events per rank (default 64); past it events are dropped"},
    {.name = "trace-split", .arg = "MODE", .kind = CLI_CHOICE, C(trace_split), .choices = trace_splits,
     .help = "auto (default: merged up to 16 ranks and about 256 MB of trace, else rank),\n"
             "merged (rank 0 writes FILE) or rank (each rank writes FILE.rankNNNNN.json;\n"
             "`ringtrain trace merge` joins them)"},
    {.name = "profile-ops", .kind = CLI_FLAG, C(profile_ops),
     .help = "the per-op profile: each op's own time on the compute stream, by category\n"
             "(convolutions, gradients, batchnorm, element-wise, ..., idle), printed at\n"
             "the end and in --json's op_profile; op spans in --trace. Two marks per op\n"
             "(CUDA events on a GPU) slow every step: not for timing runs"},
    {.name = "cuda-graph", .arg = "on|off|auto", .kind = CLI_CHOICE, C(cuda_graph), .choices = graphs,
     .help = "\nreplay each micro-batch's forward, loss and backward as one CUDA graph,\n"
             "captured after 3 eager warm-up updates: one launch instead of hundreds\n"
             "(auto, the default: on one GPU). The banner says when a run cannot\n"
             "(--profile-ops, a failed capture) and it stays eager. on: also with\n"
             "several ranks, whose all-reduce then starts after backward instead of\n"
             "overlapping it, and on the CPU's asynchronous streams\n"
             "(RINGTRAIN_CPU_STREAMS=async), which replay their recorded calls: a test\n"
             "of the capture without a GPU"},
    CLI_HELP_ROW,
    {.kind = CLI_TEXT,
     .help = "\nSeveral ranks (mpirun -np N ringtrain train ..., or srun --mpi=pmix): data-parallel, one\n"
             "process per device, gradients all-reduced in buckets while backward runs."},
    {.name = "bucket-cap-mb", .arg = "MB", .kind = CLI_REAL, C(bucket_cap_mb), .dlo = 0.001, .dhi = 4096,
     .help = "gradient bucket size (default 25; the first bucket 1)"},
    {.name = "no-overlap", .kind = CLI_FLAG, C(no_overlap), .help = "all-reduce only after backward (for comparison)"},
    {.name = "allreduce", .arg = "E", .kind = CLI_PARSE, C(allreduce), .parse = parse_allreduce,
     .help = "auto (default: NCCL across GPU ranks, MPI across CPU ranks, none for one\n"
             "process) or nccl: through NCCL for one GPU too (needs --device cuda)"},
    {.name = "comm-timeout", .arg = "S", .kind = CLI_REAL, C(comm_timeout), .dlo = 0.1, .dhi = 1e6,
     .help = "a collective stalled this long ends the job (default 300)"},
    {.name = "peer-timeout", .arg = "S", .kind = CLI_REAL, C(peer_timeout), .dlo = 0.1, .dhi = 1e6,
     .help = "a rank silent this long is stopped, hung or unreachable: end the job (default 3)"},
    {.name = "check-replicas", .arg = "N", .kind = CLI_UINT, C(check_replicas),
     .help = "compare the ranks' parameter digests every N steps (default: at the end)"},
    {.name = "stage-to", .arg = "DIR", .kind = CLI_STR, C(stage_to),
     .help = "copy --data to node-local DIR first, once per node"},
};
#undef C
#undef F

static const struct cli_cmd train_cli = {
    .name = "train",
    .head = "Usage: ringtrain train --data DIR [options]\n\n"
            "Trains an image classifier on a packed dataset (ringtrain pack / synth), reading batches\n"
            "through the loader's ring, validating each epoch on the val split (the test split if there is none).\n\n"
            "Options:\n",
    .tail = "\nExamples:\n"
            "  $ ringtrain train --data data/cifar10 --model resnet9 --epochs 30\n"
            "  $ mpirun -np 4 ringtrain train --data data/cifar10 --checkpoint-dir ckpt\n",
    .opts = train_opts,
    .nopts = RT_ARRAY_LEN(train_opts),
    .col = 25,
    .run_off = offsetof(struct train_args, run),
    .help_on_error = 1,
};

/* The options shared with eval into the driver's config, the rules between options, and the defaults that
 * follow from them. 0, or RT_EXIT_USAGE after the message. */
static int train_check(struct train_args *a)
{
    struct train_cfg *c = &a->c;
    c->data = a->run.data;
    c->model = a->run.model;
    c->batch = a->run.batch;
    c->workers = a->run.workers;
    c->threads = a->run.threads;
    c->device = a->run.device;
    c->json = a->run.json;
    c->tf32 = !a->run.no_tf32;
    c->nondeterministic = a->run.nondeterministic;
    if (c->stage_to && !c->data)
        return cli_usage_error("train", "--stage-to needs --data");
    if (!c->data && !c->synthetic)
        return cli_usage_error("train", "--data DIR is required (or --synthetic-data to measure compute alone)");
    if (c->synthetic && c->batch_digest)
        return cli_usage_error("train", "--batch-digest digests the loader's batches: --synthetic-data has none");
    if (c->data && c->syn_classes)
        return cli_usage_error("train", "--num-classes is for --synthetic-data without --data (a dataset has its "
                                        "own classes)");
    if (!c->syn_classes)
        c->syn_classes = 10;
    /* Synthetic batches of the size asked for: the compute of a 224-pixel model without a dataset. */
    if (!c->data && c->image_size) {
        c->syn_h = c->syn_w = c->image_size;
        c->image_size = 0;
    }
    if (c->resume && !c->checkpoint_dir)
        return cli_usage_error("train", "--resume needs --checkpoint-dir");
    if (c->reset_head && !c->init)
        return cli_usage_error("train", "--reset-head needs --init FILE (a model of --seed's weights has a fresh "
                                        "classifier already)");
    if (c->optim.nesterov && c->optim.kind != RT_OPT_SGD)
        return cli_usage_error("train", "--nesterov applies to --optimizer sgd only");
    if (c->target_accuracy > 1)
        c->target_accuracy /= 100;
    if (a->wd < 0)
        a->wd = c->optim.kind == RT_OPT_SGD ? 5e-4 : c->optim.kind == RT_OPT_ADAMW ? 1e-2 : 0;
    c->optim.weight_decay = (float)a->wd;
    if (c->optim.kind != RT_OPT_SGD)
        c->optim.momentum = 0;
    if (a->aug && cli_parse_aug("train", a->aug, &c->aug))
        return RT_EXIT_USAGE;
    c->aug_default = a->aug == NULL; /* the loader's default (rt_loader_opts_for) */
    return 0;
}

int cmd_train(int argc, char **argv)
{
    struct train_args a = {
        .c = {
            .epochs = 10, .lr = 0.1f, .sched = RT_SCHED_COSINE,
            .warmup_epochs = -1, .step_epochs = 30, .gamma = 0.1f, .grad_accum = 1, .patience = 1,
            .syn_c = 3, .syn_h = 32, .syn_w = 32, .progress = -1, .pin = RT_PIN_AUTO,
            .shuffle = RT_SHUFFLE_EXACT, .bucket_cap_mb = 25, .loss_scale = -1, .trace_first = 3, .trace_last = 13,
            .cuda_graph = -1,
            .optim = {.kind = RT_OPT_SGD, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
        },
        .run = {.model = "mnist-net", .batch = 128},
        .wd = -1,
    };
    int rc = cli_opts_parse(&train_cli, argc, argv, &a);
    if (rc != CLI_PARSED)
        return rc;
    if (optind < argc)
        return cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
    /* The command line for the summary and state.json. main hands a command argv + 1, so the binary's name is just
     * before; getopt_long moves only non-options, and there are none past the check above: argv is as typed. */
    a.c.argv = (const char *const *)(argv - 1);
    a.c.argc = argc + 1;
    if (train_check(&a))
        return RT_EXIT_USAGE;
    struct train_faults faults;
    if (train_faults_from_env(&faults) < 0)
        return cli_fail();
    a.c.faults = &faults;
    return train_run(&a.c) < 0 ? RT_EXIT_FAIL : RT_EXIT_OK;
}
