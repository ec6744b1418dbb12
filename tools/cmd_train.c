/*
 * cmd_train.c - `ringtrain train`: options named as PyTorch users know them,
 * parsed into struct train_cfg; the pipeline driver (tools/train/) runs the
 * training and prints as it goes.
 */
#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tools/cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: ringtrain train --data DIR [options]\n\n"
            "Trains an image classifier on a packed dataset (ringtrain pack / synth), reading batches\n"
            "through the loader's ring, validating each epoch on the val split (the test split if there is none).\n\n"
            "Options:\n"
            "  --data DIR             packed dataset (omit with --synthetic-data for 3x32x32, 10 classes)\n"
            "  --model NAME           %s\n"
            "                         (default mnist-net: the fastest on CPUs; the ResNets for real CIFAR)\n"
            "  --epochs N             passes over the training split (default 10)\n"
            "  --init FILE            start from these weights: a safetensors state_dict with PyTorch's names\n"
            "                         (a ringtrain checkpoint's model.safetensors, or torchvision's; a .pth:\n"
            "                         python3 -m ringtrain.convert FILE.pth FILE.safetensors first)\n"
            "  --reset-head           --init: the classifier starts afresh (PyTorch's init) for this dataset's\n"
            "                         classes, whatever the file's\n"
            "  --freeze GLOBS         layers not trained, by parameter name: 'conv1.*,bn1.*,layer1.*' (no\n"
            "                         gradient, no optimizer state, not all-reduced; batchnorm in eval mode)\n"
            "  --lr-head LR           the classifier's peak learning rate (default --lr)\n"
            "  --batch-size N         per rank (default 128)\n"
            "  --lr LR                peak learning rate (default 0.1)\n"
            "  --optimizer NAME       sgd (default), adam, adamw\n"
            "  --momentum M           SGD momentum (default 0.9)\n"
            "  --nesterov             Nesterov momentum\n"
            "  --weight-decay WD      L2 penalty; decoupled for adamw (default 5e-4 for sgd, 0 for adam, 1e-2 for adamw)\n"
            "  --schedule NAME        constant, step, cosine (default), onecycle\n"
            "  --warmup-epochs E      linear warm-up (default 0; onecycle: 30%% of the run)\n"
            "  --step-epochs E        step schedule: decay every E epochs (default 30)\n"
            "  --gamma G              step schedule: decay factor (default 0.1)\n"
            "  --label-smoothing EPS  as CrossEntropyLoss(label_smoothing=EPS) (default 0)\n"
            "  --grad-accum K         micro-batches per optimizer step (default 1)\n"
            "  --clip-grad-norm MAX   clip the global gradient norm (default off)\n"
            "  --seed S               weights, data order, augmentation, dropout (default 0)\n"
            "  --aug SPEC             crop[=PAD],reflect,flip,alternate-flip or none (default crop,flip for\n"
            "                         3-channel data, none otherwise). Datasets packed with --max-side: crop\n"
            "                         is RandomResizedCrop(S); without it, Resize + CenterCrop\n"
            "  --image-size S         datasets packed with --max-side (images of any size): train on S x S\n"
            "                         crops; validation uses Resize(S/0.875) + CenterCrop(S)\n"
            "  --shuffle MODE         exact (default), window, none\n"
            "  --workers N            loader threads (default 1)\n"
            "  --threads N            compute threads (default: the CPUs this process may use)\n"
            "  --device D             auto (default: a GPU when there is one), cpu or cuda\n"
            "  --amp P                auto (default: bf16 where the device has it -- GPUs from compute 8.0,\n"
            "                         CPUs with AVX512_BF16 or AMX --, else fp16 on a GPU, fp32 on a CPU),\n"
            "                         off (fp32), bf16 or fp16: activations in 16 bits, fp32 weights\n"
            "  --tf32 on|off          GPU: fp32 convolutions on TF32 tensor cores, inputs rounded to a 10-bit\n"
            "                         mantissa with fp32 sums, as PyTorch's default (cudnn.allow_tf32); linear\n"
            "                         layers stay strict fp32 as PyTorch's matmuls. TF32 is deterministic: a\n"
            "                         resume stays exact (default on; off: strict fp32; no effect on the CPU)\n"
            "  --deterministic on|off\n"
            "                         GPU: only cuDNN algorithms that repeat bit for bit (default on); off lets\n"
            "                         cuDNN take faster ones that sum with atomics: two runs differ in the last\n"
            "                         bits and a resume is no longer exact (no effect on the CPU)\n"
            "  --loss-scale MODE      dynamic (default with fp16) or off (default otherwise)\n"
            "  --max-skipped-steps K  loss scaling: stop after K overflowed steps in a row (default 20)\n"
            "  --target-accuracy A    stop once val accuracy >= A (0..1 or a percentage) ...\n"
            "  --patience N           ... for N epochs in a row (default 1)\n"
            "  --checkpoint-dir DIR   save model.safetensors, optimizer.safetensors, state.json each epoch\n"
            "                         and on SIGTERM/SIGUSR1 (finish the step, save, exit 0)\n"
            "  --resume               continue from --checkpoint-dir (starts fresh if it holds none)\n"
            "  --metrics FILE         JSON Lines, one object per epoch\n"
            "  --report FILE          at the end, one HTML page of the run's charts (as `ringtrain report`)\n"
            "  --synthetic-data       random batches made once on the device: measures compute alone\n"
            "  --steps N              stop after N optimizer steps\n"
            "  --no-progress          no progress bar (shown when stderr is a terminal)\n"
            "  --pin                  require page-locked batch slots: stop with the fix when `ulimit -l`\n"
            "                         is too low (default: locked where allowed, else pageable and said)\n"
            "  --no-pin               pageable batch slots (on a GPU: no cudaHostAlloc, no copy overlap)\n"
            "  --json                 end with one JSON line summing up the run\n"
            "  --batch-digest         print one digest over every batch the steps took (in --json too): the\n"
            "                         same as loadbench --digest and the Python Loader's for the same options\n"
            "  --trace FILE           Chrome trace of the pipeline (Perfetto, chrome://tracing): every thread,\n"
            "                         the compute stream's layers, the buckets; one file, or one per rank (--trace-split)\n"
            "  --trace-steps A:B|all  optimizer steps recorded (default 3:13: ten after the warm-up)\n"
            "  --trace-mb MB          memory for events per rank (default 64); past it events are dropped\n"
            "  --trace-split MODE     auto (default: merged up to 16 ranks and about 256 MB of trace, else rank),\n"
            "                         merged (rank 0 writes FILE) or rank (each rank writes FILE.rankNNNNN.json;\n"
            "                         `ringtrain trace merge` joins them)\n"
            "  --profile-ops          the per-op profile: each op's own time on the compute stream, by category\n"
            "                         (convolutions, gradients, batchnorm, element-wise, ..., idle), printed at\n"
            "                         the end and in --json's op_profile; op spans in --trace. Two marks per op\n"
            "                         (CUDA events on a GPU) slow every step: not for timing runs\n"
            "  --cuda-graph on|off|auto\n"
            "                         replay each micro-batch's forward, loss and backward as one CUDA graph,\n"
            "                         captured after 3 eager warm-up updates: one launch instead of hundreds\n"
            "                         (auto, the default: on one GPU). The banner says when a run cannot\n"
            "                         (--profile-ops, a failed capture) and it stays eager. on: also with\n"
            "                         several ranks, whose all-reduce then starts after backward instead of\n"
            "                         overlapping it, and on the CPU's asynchronous streams\n"
            "                         (RINGTRAIN_CPU_STREAMS=async), which replay their recorded calls: a test\n"
            "                         of the capture without a GPU\n"
            "  -h, --help             print this help\n\n"
            "Several ranks (mpirun -np N ringtrain train ..., or srun --mpi=pmix): data-parallel, one\n"
            "process per device, gradients all-reduced in buckets while backward runs.\n"
            "  --bucket-cap-mb MB     gradient bucket size (default 25; the first bucket 1)\n"
            "  --no-overlap           all-reduce only after backward (for comparison)\n"
            "  --allreduce E          auto (default: NCCL across GPU ranks, MPI across CPU ranks, none for one\n"
            "                         process) or nccl: through NCCL for one GPU too (needs --device cuda)\n"
            "  --comm-timeout S       a collective stalled this long ends the job (default 300)\n"
            "  --peer-timeout S       a rank silent this long is stopped, hung or unreachable: end the job (default 3)\n"
            "  --check-replicas N     compare the ranks' parameter digests every N steps (default: at the end)\n"
            "  --stage-to DIR         copy --data to node-local DIR first, once per node\n\n"
            "Examples:\n"
            "  $ ringtrain train --data data/cifar10 --model resnet9 --epochs 30\n"
            "  $ mpirun -np 4 ringtrain train --data data/cifar10 --checkpoint-dir ckpt\n",
            rt_model_names());
}

static int parse_float(const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi)
        return cli_usage_error("train", "%s needs a number in [%g, %g], got '%s'", opt, lo, hi, s);
    *out = v;
    return 0;
}

int cmd_train(int argc, char **argv)
{
    enum {
        O_EPOCHS = 256, O_LR, O_OPT, O_MOM, O_NEST, O_WD, O_SCHED, O_WARM, O_STEPEP, O_GAMMA, O_LS, O_ACCUM, O_CLIP,
        O_SEED, O_AUG, O_IMGSZ, O_SHUF, O_TARGET, O_PAT, O_CKPT, O_RESUME, O_METRICS, O_REPORT, O_SYN, O_STEPS, O_NOPROG, O_BDIGEST, O_NOPIN, O_PIN,
        O_BUCKET, O_NOOVL, O_CTO, O_PTO, O_REPL, O_STAGE, O_AMP, O_LSCALE, O_MAXSKIP, O_ALLRED, O_TRACE, O_TRSTEPS,
        O_TRMB, O_TRSPLIT, O_INIT, O_RESETHEAD, O_FREEZE, O_LRHEAD, O_PROFOPS, O_GRAPH, O_HELP
    };
    static const struct option opts[] = {
        CLI_RUN_OPTIONS,
        {"epochs", required_argument, NULL, O_EPOCHS},
        {"init", required_argument, NULL, O_INIT},
        {"reset-head", no_argument, NULL, O_RESETHEAD},
        {"freeze", required_argument, NULL, O_FREEZE},
        {"lr-head", required_argument, NULL, O_LRHEAD},
        {"lr", required_argument, NULL, O_LR},
        {"optimizer", required_argument, NULL, O_OPT},
        {"momentum", required_argument, NULL, O_MOM},
        {"nesterov", no_argument, NULL, O_NEST},
        {"weight-decay", required_argument, NULL, O_WD},
        {"schedule", required_argument, NULL, O_SCHED},
        {"warmup-epochs", required_argument, NULL, O_WARM},
        {"step-epochs", required_argument, NULL, O_STEPEP},
        {"gamma", required_argument, NULL, O_GAMMA},
        {"label-smoothing", required_argument, NULL, O_LS},
        {"grad-accum", required_argument, NULL, O_ACCUM},
        {"clip-grad-norm", required_argument, NULL, O_CLIP},
        {"seed", required_argument, NULL, O_SEED},
        {"image-size", required_argument, NULL, O_IMGSZ},
        {"aug", required_argument, NULL, O_AUG},
        {"shuffle", required_argument, NULL, O_SHUF},
        {"target-accuracy", required_argument, NULL, O_TARGET},
        {"patience", required_argument, NULL, O_PAT},
        {"checkpoint-dir", required_argument, NULL, O_CKPT},
        {"resume", no_argument, NULL, O_RESUME},
        {"metrics", required_argument, NULL, O_METRICS},
        {"report", required_argument, NULL, O_REPORT},
        {"synthetic-data", no_argument, NULL, O_SYN},
        {"steps", required_argument, NULL, O_STEPS},
        {"no-progress", no_argument, NULL, O_NOPROG},
        {"batch-digest", no_argument, NULL, O_BDIGEST},
        {"no-pin", no_argument, NULL, O_NOPIN},
        {"pin", no_argument, NULL, O_PIN},
        {"bucket-cap-mb", required_argument, NULL, O_BUCKET},
        {"no-overlap", no_argument, NULL, O_NOOVL},
        {"comm-timeout", required_argument, NULL, O_CTO},
        {"peer-timeout", required_argument, NULL, O_PTO},
        {"check-replicas", required_argument, NULL, O_REPL},
        {"stage-to", required_argument, NULL, O_STAGE},
        {"amp", required_argument, NULL, O_AMP},
        {"loss-scale", required_argument, NULL, O_LSCALE},
        {"max-skipped-steps", required_argument, NULL, O_MAXSKIP},
        {"allreduce", required_argument, NULL, O_ALLRED},
        {"trace", required_argument, NULL, O_TRACE},
        {"trace-steps", required_argument, NULL, O_TRSTEPS},
        {"trace-mb", required_argument, NULL, O_TRMB},
        {"trace-split", required_argument, NULL, O_TRSPLIT},
        {"profile-ops", no_argument, NULL, O_PROFOPS},
        {"cuda-graph", required_argument, NULL, O_GRAPH},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0}};
    struct cli_run_opts run = {.model = "mnist-net", .batch = 128};
    struct train_cfg c = {
        .epochs = 10, .lr = 0.1f, .sched = RT_SCHED_COSINE,
        .warmup_epochs = -1, .step_epochs = 30, .gamma = 0.1f, .grad_accum = 1, .patience = 1,
        .syn_c = 3, .syn_h = 32, .syn_w = 32, .syn_classes = 10, .progress = -1, .pin = RT_PIN_AUTO,
        .shuffle = RT_SHUFFLE_EXACT, .bucket_cap_mb = 25, .loss_scale = -1, .trace_first = 3, .trace_last = 13,
        .cuda_graph = -1,
        .optim = {.kind = RT_OPT_SGD, .momentum = 0.9f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
    };
    const char *aug = NULL;
    double d = 0, wd = -1;
    uint64_t v;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case O_EPOCHS:
            if (cli_parse_u64("train", "--epochs", optarg, &c.epochs))
                return RT_EXIT_USAGE;
            break;
        case O_LR:
            if (parse_float("--lr", optarg, 0, 1e6, &d))
                return RT_EXIT_USAGE;
            c.lr = (float)d;
            break;
        case O_INIT: c.init = optarg; break;
        case O_RESETHEAD: c.reset_head = 1; break;
        case O_FREEZE: c.freeze = optarg; break;
        case O_LRHEAD:
            if (parse_float("--lr-head", optarg, 0, 1e6, &d))
                return RT_EXIT_USAGE;
            c.lr_head = (float)d;
            break;
        case O_OPT:
            if (rt_optim_kind_parse(optarg, &c.optim.kind) < 0)
                return cli_usage_error("train", "%s", rt_errmsg());
            break;
        case O_MOM:
            if (parse_float("--momentum", optarg, 0, 1, &d))
                return RT_EXIT_USAGE;
            c.optim.momentum = (float)d;
            break;
        case O_NEST: c.optim.nesterov = 1; break;
        case O_WD:
            if (parse_float("--weight-decay", optarg, 0, 1e3, &wd))
                return RT_EXIT_USAGE;
            break;
        case O_SCHED:
            if (rt_sched_kind_parse(optarg, &c.sched) < 0)
                return cli_usage_error("train", "%s", rt_errmsg());
            break;
        case O_WARM:
            if (parse_float("--warmup-epochs", optarg, 0, 1e6, &c.warmup_epochs))
                return RT_EXIT_USAGE;
            break;
        case O_STEPEP:
            if (parse_float("--step-epochs", optarg, 1e-6, 1e6, &c.step_epochs))
                return RT_EXIT_USAGE;
            break;
        case O_GAMMA:
            if (parse_float("--gamma", optarg, 0, 1, &d))
                return RT_EXIT_USAGE;
            c.gamma = (float)d;
            break;
        case O_LS:
            if (parse_float("--label-smoothing", optarg, 0, 1, &d))
                return RT_EXIT_USAGE;
            c.label_smoothing = (float)d;
            break;
        case O_ACCUM:
            if (cli_parse_u64("train", "--grad-accum", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 1u << 20)
                return cli_usage_error("train", "--grad-accum must be at least 1");
            c.grad_accum = (uint32_t)v;
            break;
        case O_CLIP:
            if (parse_float("--clip-grad-norm", optarg, 0, 1e30, &d))
                return RT_EXIT_USAGE;
            c.clip_grad_norm = (float)d;
            break;
        case O_SEED:
            if (cli_parse_u64("train", "--seed", optarg, &c.seed))
                return RT_EXIT_USAGE;
            break;
        case O_AUG: aug = optarg; break;
        case O_IMGSZ:
            if (cli_parse_u64("train", "--image-size", optarg, &v))
                return RT_EXIT_USAGE;
            if (v < 1 || v > 4096)
                return cli_usage_error("train", "--image-size must be in 1..4096");
            c.image_size = (uint32_t)v;
            break;
        case O_SHUF:
            if (rt_shuffle_parse(optarg, &c.shuffle) < 0)
                return cli_usage_error("train", "%s", rt_errmsg());
            break;
        case O_TARGET:
            if (parse_float("--target-accuracy", optarg, 0, 100, &c.target_accuracy))
                return RT_EXIT_USAGE;
            if (c.target_accuracy > 1)
                c.target_accuracy /= 100;
            break;
        case O_PAT:
            if (cli_parse_u64("train", "--patience", optarg, &v))
                return RT_EXIT_USAGE;
            c.patience = (uint32_t)RT_MAX(v, 1);
            break;
        case O_CKPT: c.checkpoint_dir = optarg; break;
        case O_RESUME: c.resume = 1; break;
        case O_METRICS: c.metrics = optarg; break;
        case O_REPORT: c.report = optarg; break;
        case O_SYN: c.synthetic = 1; break;
        case O_STEPS:
            if (cli_parse_u64("train", "--steps", optarg, &c.max_updates))
                return RT_EXIT_USAGE;
            break;
        case O_NOPROG: c.progress = 0; break;
        case O_BDIGEST: c.batch_digest = 1; break;
        case O_NOPIN: c.pin = RT_PIN_OFF; break;
        case O_PIN: c.pin = RT_PIN_ON; break;
        case O_BUCKET:
            if (parse_float("--bucket-cap-mb", optarg, 0.001, 4096, &c.bucket_cap_mb))
                return RT_EXIT_USAGE;
            break;
        case O_NOOVL: c.no_overlap = 1; break;
        case O_ALLRED:
            if (train_allreduce_parse(optarg, &c.allreduce) < 0)
                return cli_usage_error("train", "%s", rt_errmsg());
            break;
        case O_CTO:
            if (parse_float("--comm-timeout", optarg, 0.1, 1e6, &c.comm_timeout))
                return RT_EXIT_USAGE;
            break;
        case O_PTO:
            if (parse_float("--peer-timeout", optarg, 0.1, 1e6, &c.peer_timeout))
                return RT_EXIT_USAGE;
            break;
        case O_REPL:
            if (cli_parse_u64("train", "--check-replicas", optarg, &c.check_replicas))
                return RT_EXIT_USAGE;
            break;
        case O_STAGE: c.stage_to = optarg; break;
        case O_TRACE: c.trace = optarg; break;
        case O_TRSTEPS: {
            char tail;
            if (!strcmp(optarg, "all"))
                c.trace_all = 1;
            else if (sscanf(optarg, "%" SCNu64 ":%" SCNu64 "%c", &c.trace_first, &c.trace_last, &tail) != 2 ||
                     c.trace_last <= c.trace_first)
                return cli_usage_error("train", "--trace-steps %s: expected A:B with A < B (steps A to B-1), or all",
                                       optarg);
            break;
        }
        case O_TRMB:
            if (parse_float("--trace-mb", optarg, 1, 65536, &c.trace_mb))
                return RT_EXIT_USAGE;
            break;
        case O_TRSPLIT:
            if (!strcmp(optarg, "auto"))
                c.trace_split = TRACE_SPLIT_AUTO;
            else if (!strcmp(optarg, "merged"))
                c.trace_split = TRACE_SPLIT_MERGED;
            else if (!strcmp(optarg, "rank"))
                c.trace_split = TRACE_SPLIT_RANK;
            else
                return cli_usage_error("train", "--trace-split %s: expected auto, merged or rank", optarg);
            break;
        case O_AMP:
            if (train_amp_parse(optarg, &c.amp) < 0)
                return cli_usage_error("train", "%s", rt_errmsg());
            break;
        case O_PROFOPS: c.profile_ops = 1; break;
        case O_GRAPH:
            if (strcmp(optarg, "on") && strcmp(optarg, "off") && strcmp(optarg, "auto"))
                return cli_usage_error("train", "--cuda-graph %s: expected on, off or auto", optarg);
            c.cuda_graph = !strcmp(optarg, "on") ? 1 : !strcmp(optarg, "off") ? 0 : -1;
            break;
        case O_LSCALE:
            if (strcmp(optarg, "dynamic") && strcmp(optarg, "off"))
                return cli_usage_error("train", "--loss-scale %s: expected dynamic or off", optarg);
            c.loss_scale = !strcmp(optarg, "dynamic");
            break;
        case O_MAXSKIP: {
            uint64_t k;
            if (cli_parse_u64("train", "--max-skipped-steps", optarg, &k))
                return RT_EXIT_USAGE;
            if (k < 1 || k > 1000000)
                return cli_usage_error("train", "--max-skipped-steps needs 1..1000000, got %s", optarg);
            c.max_skipped_steps = (uint32_t)k;
            break;
        }
        case 'h':
        case O_HELP: usage(stdout); return RT_EXIT_OK;
        default: {
            int r = cli_run_option("train", ch, optarg, &run);
            if (r == 1)
                break;
            if (r == 0)
                usage(stderr);
            return RT_EXIT_USAGE;
        }
        }
    }
    c.data = run.data;
    c.model = run.model;
    c.batch = run.batch;
    c.workers = run.workers;
    c.threads = run.threads;
    c.device = run.device;
    c.json = run.json;
    c.tf32 = !run.no_tf32;
    c.nondeterministic = run.nondeterministic;
    if (optind < argc)
        return cli_usage_error("train", "unexpected argument '%s'", argv[optind]);
    /* The command line for the summary and state.json. main hands a command argv + 1, so the binary's name is just
     * before; getopt_long moves only non-options, and there are none past the check above: argv is as typed. */
    c.argv = (const char *const *)(argv - 1);
    c.argc = argc + 1;
    if (c.stage_to && !c.data)
        return cli_usage_error("train", "--stage-to needs --data");
    if (!c.data && !c.synthetic)
        return cli_usage_error("train", "--data DIR is required (or --synthetic-data to measure compute alone)");
    if (c.synthetic && c.batch_digest)
        return cli_usage_error("train", "--batch-digest digests the loader's batches: --synthetic-data has none");
    if (c.resume && !c.checkpoint_dir)
        return cli_usage_error("train", "--resume needs --checkpoint-dir");
    if (c.reset_head && !c.init)
        return cli_usage_error("train", "--reset-head needs --init FILE (a model of --seed's weights has a fresh "
                                        "classifier already)");
    if (c.epochs < 1)
        return cli_usage_error("train", "--epochs must be at least 1");
    if (c.optim.nesterov && c.optim.kind != RT_OPT_SGD)
        return cli_usage_error("train", "--nesterov applies to --optimizer sgd only");
    if (wd < 0)
        wd = c.optim.kind == RT_OPT_SGD ? 5e-4 : c.optim.kind == RT_OPT_ADAMW ? 1e-2 : 0;
    c.optim.weight_decay = (float)wd;
    if (c.optim.kind != RT_OPT_SGD)
        c.optim.momentum = 0;
    if (aug && cli_parse_aug("train", aug, &c.aug))
        return RT_EXIT_USAGE;
    c.aug_default = aug == NULL; /* the loader's default (rt_loader_opts_for) */
    struct train_faults faults;
    if (train_faults_from_env(&faults) < 0)
        return cli_fail();
    c.faults = &faults;
    return train_run(&c) < 0 ? RT_EXIT_FAIL : RT_EXIT_OK;
}
