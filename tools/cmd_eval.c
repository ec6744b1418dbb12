/*
 * cmd_eval.c - `ringtrain eval`: loss and accuracy of a checkpoint on a
 * dataset's test split (the driver's train_evaluate_checkpoint), printed.
 */
#include <stddef.h>
#include <stdio.h>

#include "common/common.h"
#include "tools/cli.h"

/* What `eval` reads its options into: the options it shares with train, and its own. */
struct eval_args {
    struct cli_run_opts run;
    const char *checkpoint;
    enum train_amp amp;
};

static int parse_amp(const char *arg, void *field) { return train_amp_parse(arg, field); }

#define F(member) CLI_FIELD(struct eval_args, member)
static const struct cli_opt eval_opts[] = {
    {CLI_SHARED(CLI_O_DATA), .help = "packed dataset (its test split is scored)"},
    {.name = "checkpoint", .arg = "FILE", .kind = CLI_STR, F(checkpoint),
     .help = "the model.safetensors a `ringtrain train --checkpoint-dir` wrote, or a\n"
             "safetensors state_dict from PyTorch (python3 -m ringtrain.convert for a .pth)"},
    {CLI_SHARED(CLI_O_MODEL), .help = "check that the checkpoint holds this model (required for PyTorch's files)"},
    {CLI_SHARED(CLI_O_BATCH), .help = "images per batch (default 256)"},
    {CLI_SHARED(CLI_O_WORKERS), .help = "loader threads (default 1)"},
    {CLI_SHARED(CLI_O_THREADS), .help = "compute threads (default: the CPUs this process may use)"},
    {CLI_SHARED(CLI_O_DEVICE), .help = "auto (default: a GPU when there is one), cpu or cuda"},
    {.name = "amp", .arg = "P", .kind = CLI_PARSE, F(amp), .parse = parse_amp,
     .help = "auto (default: bf16 where the device computes it, as train's), off, bf16, fp16"},
    {CLI_SHARED(CLI_O_TF32), .help = "GPU: fp32 convolutions on TF32 tensor cores, as train's (default on;\n"
                                     "off: strict fp32; no effect on the CPU)"},
    {CLI_SHARED(CLI_O_DETERM), .help = "\nGPU: only cuDNN algorithms that repeat bit for bit (default on; no\n"
                                       "effect on the CPU)"},
    {CLI_SHARED(CLI_O_JSON), .help = "also print one JSON line"},
    CLI_HELP_ROW,
};
#undef F

static const struct cli_cmd eval_cli = {
    .name = "eval",
    .head = "Usage: ringtrain eval --data DIR --checkpoint FILE [options]\n\n"
            "Prints the loss and accuracy of a checkpoint (model.safetensors from `ringtrain train`)\n"
            "on the dataset's test split. A state_dict saved elsewhere (PyTorch's names, no ringtrain\n"
            "metadata) is scored too: --model names its architecture, the dataset gives its image size,\n"
            "classes and normalisation.\n\n"
            "Options:\n",
    .tail = "\nExamples:\n"
            "  $ ringtrain eval --data data/mnist --checkpoint ckpt/model.safetensors --amp off\n"
            "  $ ringtrain eval --data data/photos --checkpoint resnet18.safetensors --model resnet18\n",
    .opts = eval_opts,
    .nopts = RT_ARRAY_LEN(eval_opts),
    .col = 22,
    .run_off = offsetof(struct eval_args, run),
    .help_on_error = 1,
};

int cmd_eval(int argc, char **argv)
{
    struct eval_args a = {.run = {.batch = 256}, .amp = AMP_AUTO};
    const int rc = cli_opts_parse(&eval_cli, argc, argv, &a);
    if (rc != CLI_PARSED)
        return rc;
    if (optind < argc)
        return cli_usage_error("eval", "unexpected argument '%s'", argv[optind]);
    if (!a.run.data || !a.checkpoint)
        return cli_usage_error("eval", "--data DIR and --checkpoint FILE are required");
    const struct cli_run_opts *run = &a.run;
    struct eval_cfg c = {.data = run->data, .checkpoint = a.checkpoint, .model = run->model, .batch = run->batch,
                         .workers = run->workers, .threads = run->threads, .device = run->device, .amp = a.amp,
                         .tf32 = !run->no_tf32, .nondeterministic = run->nondeterministic};
    struct eval_result r;
    if (train_evaluate_checkpoint(&c, &r) < 0)
        return cli_fail();
    printf("%s on %s test split: %.0f images, loss %.4f, accuracy %.2f%% (%.1fs, %.0f img/s)\n", r.model, c.data,
           r.images, r.loss, 100 * r.accuracy, r.seconds, r.seconds > 0 ? r.images / r.seconds : 0);
    if (run->json)
        printf("{\"model\":\"%s\",\"images\":%.0f,\"loss\":%.6f,\"accuracy\":%.6f,\"time_s\":%.3f}\n", r.model,
               r.images, r.loss, r.accuracy, r.seconds);
    return RT_EXIT_OK;
}
